#!/usr/bin/env bash
# race_table.py over the result lines of a real run (testdata/race_results.txt: the race of
# 2026-11-23 22:43 UTC): the tables carry its figures and ratios, and the picture has a bar for
# every library in every case it has a figure for.
set -uo pipefail
table_py="$1"
results="$2"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

python3 "$table_py" "$results" "$tmp/race.md" "$tmp/race.svg" >"$tmp/stdout" || fail "race_table.py exited with $?"
cmp -s "$tmp/stdout" <(cat "$tmp/race.md") || fail "the printed table and the --out file differ"
# AllReduce at 2 ranks, 64 MiB: kizuna 20.8 GB/s, the ceiling 25.3, so 0.824 of it; best peer MPICH 3.89.
grep -q '^| 2 | 64 MiB | 20.8 | 8.58 | 3.28 | 3.89 | 0.97 | 25.3 | 0.824 | 5.35 |' "$tmp/race.md" ||
  fail "the 2-rank 64 MiB AllReduce row is not as the run measured it"
grep -q '^| 8 | 49.7 |' "$tmp/race.md" || fail "the 8-rank latency row is missing"
grep -q 'ReduceScatter, AllGather, Broadcast busbw' "$tmp/race.md" || fail "the other collectives' table is missing"
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
echo "PASS"
