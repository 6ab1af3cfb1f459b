#!/usr/bin/env bash
# race_table.py over the result lines of real runs: testdata/race_results.txt (the race of
# 2026-11-23 22:43 UTC, before the cluster cases) and testdata/race_results_cluster.txt (the cluster
# cases alone, `race.sh --only-cluster` of 2026-11-28 17:12 UTC on a machine busy with other builds:
# its figures are noisy, which does not matter here). The tables carry their figures and ratios, the
# picture has a bar for every library in every case it has a figure for, the cluster lines stay out
# of the single-host tables, and a run with both takes the two-host case as the cluster's 2 x 1
# AllReduce and shows a missing peer as missing, and a run of several rounds takes each case's median.
set -uo pipefail
table_py="$1"
results="$2"
cluster="$3"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
has() { grep -qF -- "$1" "$2" || fail "$3: no line with '$1' in $2:"$'\n'"$(cat "$2")"; }

python3 "$table_py" "$results" "$tmp/race.md" "$tmp/race.svg" >"$tmp/stdout" || fail "race_table.py exited with $?"
cmp -s "$tmp/stdout" <(cat "$tmp/race.md") || fail "the printed table and the --out file differ"
# AllReduce at 2 ranks, 64 MiB: kizuna 20.8 GB/s, the ceiling 25.3, so 0.824 of it; best peer MPICH 3.89.
grep -q '^| 2 | 64 MiB | 20.8 | 8.58 | 3.28 | 3.89 | 0.97 | 25.3 | 0.824 | 5.35 |' "$tmp/race.md" ||
  fail "the 2-rank 64 MiB AllReduce row is not as the run measured it"
grep -q '^| 8 | 49.7 |' "$tmp/race.md" || fail "the 8-rank latency row is missing"
grep -q 'ReduceScatter, AllGather, Broadcast busbw' "$tmp/race.md" || fail "the other collectives' table is missing"
! grep -q '^Cluster' "$tmp/race.md" || fail "a cluster table from a run without cluster cases"
python3 - "$tmp/race.svg" <<'PY' || fail "the picture is not one bar per library and case"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
bars = {}
for e in root.iter():
    if e.tag.endswith("rect") and e.get("class"):
        bars[e.get("class")] = bars.get(e.get("class"), 0) + 1
# 9 AllReduce cases (n = 2, 4, 8 x 1, 64, 256 MiB) and 6 others (3 collectives x n = 2, 8).
assert bars.get("kizuna") == 15, bars
assert bars.get("ceiling") == 9, bars
for lib in ("openmpi", "mpich", "gloo"):
    assert bars.get(lib) == 15, bars
PY

# ---- the cluster cases alone ----
python3 "$table_py" "$cluster" "$tmp/cluster.md" >/dev/null || fail "race_table.py exited with $? on $cluster"
c="$tmp/cluster.md"
! grep -q '^AllReduce busbw\|^AllReduce latency' "$c" || fail "a single-host table from the cluster lines"
has '2 x 4: between hosts ofi tcp;ofi_rxm:eth0; within a host directconnect' "$c" "kizuna's fabrics"
has '| hosts x ranks | collective | size | kizuna | kizuna-hier | Open MPI | MPICH | Gloo | TCP bound |' "$c" \
  "the cluster busbw table's columns"
# 2 x 4, AllReduce 64 MiB: kizuna 0.498 GB/s, the best peer Open MPI 0.288 (1.73 x); the TCP bound is
# the four-connection floor 2.08 x 1.75 (8 ranks, 2 hosts) = 3.63, of which kizuna reached 0.137.
has '| 2 x 4 | AllReduce | 64 MiB | 0.498 | 0.509 | 0.288 | 0.0509 | 0.174 | 3.63 | 1.73 | 1.77 | 0.137 |' "$c" \
  "the 2 x 4 AllReduce 64 MiB busbw row"
# 4 x 2, ReduceScatter: the bound is 2.08 x (7/8) / (3/4) = 2.42.
has '| 4 x 2 | ReduceScatter | 64 MiB | 0.202 | 0.271 | 0.252 | 0.0793 | 0.185 | 2.42 | 0.802 | 1.08 | 0.0834 |' "$c" \
  "the 4 x 2 ReduceScatter busbw row"
# One rank per host: no kizuna-hier run; below 64 MiB no ratio to the TCP bound.
has '| 2 x 1 | AllReduce | 1 MiB | 0.6 | — | 2.92 | 2.38 | 1.2 | 2.08 | 0.205 | — | — |' "$c" "the 2 x 1 1 MiB row"
# The time table: 8 B included, the speed-up over the best peer (Gloo, 2981 µs), each row's algorithm.
has '| 2 x 4 | AllReduce | 8 B | 2098 | 3805 | 4069 | 60019 | 2981 | 1.42 | 0.784 | rd | hier:pairwise/rd |' "$c" \
  "the 2 x 4 8 B time row"
has '| 4 x 2 | AllGather | 64 MiB | 193669 | 159155 | 304748 | 695921 | 140342 | 0.725 | 0.882 | hier:pairwise/ring |' \
  "$c" "the 4 x 2 AllGather time row"
[[ $(grep -c '^| [24] x [124] |' "$c") -eq 27 ]] || fail "not 12 busbw rows and 15 time rows: $(cat "$c")"

# ---- both in one run: the two-host case is the cluster's 2 x 1 AllReduce; a missing peer ----
{
  cat "$results"
  grep -E 'shape=2x4|cluster_fabric_2x4' "$cluster" | grep -v 'lib=gloo '
  echo "NOTE cluster_2x1_allreduce=two-host"
  echo "RESULT lib=floor coll=tcp-duplex-reduce-4 n=2 bytes=67108864 time_us=53687.1 busbw=1.2500"
  for b in 8 1048576 67108864; do
    echo "FAIL lib=gloo shape=2x4 coll=allreduce n=8 bytes=$b why=missing: not installed: apt-get install" \
      "libgloo-dev failed: E: Unable to locate package libgloo-dev"
  done
} >"$tmp/both.txt"
python3 "$table_py" "$tmp/both.txt" "$tmp/both.md" >/dev/null || fail "race_table.py exited with $? on both"
b="$tmp/both.md"
grep -q '^| 2 | 64 MiB | 20.8 | 8.58 | 3.28 | 3.89 | 0.97 | 25.3 | 0.824 | 5.35 |' "$b" ||
  fail "the single-host table changed when cluster lines came with it"
# The two-host case's 64 MiB figures (kizuna-tcp 1.0023, Open MPI 1.17, ...) against its own floor, 1.55,
# and against the floor with the reduction (tcp_probe --reduce), 1.25: 0.802.
has '| 2 x 1 | AllReduce | 64 MiB | 1 | — | 1.17 | 1.12 | 0.776 | 1.55 | 0.856 | — | 0.646 | 0.802 |' "$b" \
  "the 2 x 1 row taken from the two-host case"
has 'its reduction (tcp_probe --reduce, 1.25 GB/s)' "$b" "the floor with the reduction named above the table"
has '| 2 x 4 | AllReduce | 64 MiB | 0.498 | 0.509 | 0.288 | 0.0509 | 0.174 | 3.63 | 1.73 | 1.77 | 0.137 | — |' "$c" \
  "no ratio to the floor with the reduction but for the 2 x 1 AllReduce"
! grep -q '^| 2 x 1 | AllReduce | 256 MiB' "$b" || fail "a 2 x 1 row at a size no other shape ran"
has '| 2 x 4 | AllReduce | 8 B | 2098 | 3805 | 4069 | 60019 | missing | 1.94 | 1.07 | rd | hier:pairwise/rd |' "$b" \
  "a missing peer's cell"
has '- gloo: missing: not installed: apt-get install libgloo-dev failed' "$b" "the reason a peer is missing"

# ---- rounds (race.sh --rounds 3): each case counts with its median round ----
{
  grep -v '^NOTE rounds=' "$cluster"
  echo "NOTE rounds=3"
  # Two more rounds of kizuna's 2 x 1 AllReduce at 1 MiB (the first: 1748 us, 0.6 GB/s): 874 and 1166 us.
  echo "RESULT lib=kizuna shape=2x1 coll=allreduce n=2 bytes=1048576 iters=200 time_us=874.2 busbw=1.1995 wrong=0 algo=rd"
  echo "RESULT lib=kizuna shape=2x1 coll=allreduce n=2 bytes=1048576 iters=200 time_us=1165.6 busbw=0.8996 wrong=0 algo=rd"
  # A round that failed beside two that did not; a round with wrong results.
  echo "FAIL lib=kizuna shape=2x4 coll=allreduce n=8 bytes=67108864 why=timed out"
  echo "RESULT lib=kizuna shape=4x2 coll=reducescatter n=8 bytes=67108864 iters=20 time_us=9.0 busbw=9.9 wrong=3 algo=ring"
} >"$tmp/rounds.txt"
python3 "$table_py" "$tmp/rounds.txt" "$tmp/rounds.md" >/dev/null || fail "race_table.py exited with $? on rounds"
r="$tmp/rounds.md"
has 'is the median of 3 rounds' "$r" "the rounds named above the tables"
has '| 2 x 1 | AllReduce | 1 MiB | 0.9 | — | 2.92 | 2.38 | 1.2 | 2.08 | 0.308 | — | — |' "$r" "the median round of three"
has '| 2 x 4 | AllReduce | 64 MiB | 0.498 | 0.509 | 0.288 |' "$r" "a round that failed beside one that did not"
has '| 4 x 2 | ReduceScatter | 64 MiB | wrong (3) |' "$r" "a round with wrong results"
echo "PASS"
