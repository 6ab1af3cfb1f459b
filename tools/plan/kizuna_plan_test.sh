#!/usr/bin/env bash
# kizuna-plan end to end: the table has a column per algorithm and the choice; the regimes show
# (rd for a tiny allreduce, something else for a large one); forcing, fallback and heterogeneity
# change what they should; --json parses; --dump prints a plan; bad flags fail with a clear
# message and exit status 2 (CLI11's parse errors included). The INA mode: the SWoPP 2024 talk's
# thresholds and slide-20 figures, the layout and topology files, the sweep's CSV and SVG, the table
# of NTT's 2024 talk,
# its bad flags.
set -uo pipefail
plan="$1"
fail() { echo "FAIL: $*"; exit 1; }

# The default sweep: allreduce over 8 ranks, 8 bytes to 512 MiB.
out="$("$plan" --coll allreduce --ranks 8 2>&1)" || fail "default sweep: exit $?: $out"
echo "$out"
# (an ina column where the engine has the INA algorithm)
grep -Eq '^ +bytes +count +ring +tree +rhd +rd +pairwise +p2p +fused( +ina)? +hier:pairwise/ring +hier:pairwise/rd +hier:fused/ring +hier:fused/rd +file +torus +cycles +choice +by$' <<<"$out" ||
  fail "no header row"
grep -q 'fused: fused needs ranks that address each other' <<<"$out" || fail "fused not explained as unsupported"

[ "$(grep -Ec '^ *[0-9]+ +[0-9]+ ' <<<"$out")" -eq 14 ] || fail "expected 14 size rows (8 B to 512 MiB by 4)"

# Ranks of one process on one device: fused is predicted and chosen for a large allreduce.
direct="$("$plan" --coll allreduce --ranks 4 --direct --shared-device --min-bytes 256M --max-bytes 256M 2>&1)" ||
  fail "direct sweep: exit $?: $direct"
echo "$direct"
grep -Eq '^ *268435456 .* fused +model *$' <<<"$direct" || fail "fused not chosen for 256 MiB with --direct"
grep -Eq '^ *8 +2 +.* rd +model$' <<<"$out" || fail "8 bytes: rd not chosen by the model"
grep -Eq '^ *536870912 +134217728 .* (ring|rhd|tree|pairwise) +model$' <<<"$out" || fail "512 MiB: rd chosen"
grep -Eq 'n/s \[1\]' <<<"$out" || fail "p2p not marked as not supported"
grep -q '^\[1\] p2p: p2p does not implement allreduce$' <<<"$out" || fail "no reason for p2p"

# Two hosts of four ranks behind a slow network: the hierarchy for a large allreduce, and the
# plan's dump names each rank's peers; --hosts out of range is refused.
hosts="$("$plan" --ranks 8 --hosts 2 --link-gbps 20 --net-gbps 1 --net-latency-us 50 -b 64M -e 64M 2>&1)" ||
  fail "--hosts 2: exit $?: $hosts"
echo "$hosts"
grep -Eq '^ *67108864 .* hier:pairwise/(ring|rd) +model *$' <<<"$hosts" || fail "64 MiB over 2 hosts: no hierarchy"
out="$("$plan" --ranks 8 --hosts 9 2>&1)"; [ $? -eq 2 ] || fail "--hosts 9 accepted"
grep -q -- '--hosts 9' <<<"$out" || fail "--hosts 9 not named: $out"
# The ranks of each host sharing their buffers: hier:fused, at 8 B (the leader form) and 64 MiB.
fused="$(for b in 8 64M; do
  "$plan" --ranks 8 --hosts 2 --host-direct --link-gbps 20 --net-gbps 1 --net-latency-us 50 -b $b -e $b || exit
done 2>&1)" || fail "--host-direct: exit $?: $fused"
echo "$fused"
grep -Eq '^ *8 +2 .* hier:fused/(ring|rd) +model *$' <<<"$fused" || fail "8 B with --host-direct: not hier:fused"
grep -Eq '^ *67108864 .* hier:fused/(ring|rd) +model *$' <<<"$fused" || fail "64 MiB with --host-direct: not hier:fused"
out="$("$plan" --ranks 8 --host-direct 2>&1)"; [ $? -eq 2 ] || fail "--host-direct on one host accepted"
grep -q -- '--host-direct needs --hosts' <<<"$out" || fail "--host-direct on one host not explained: $out"

# Other collectives; a rooted one with a root; unaligned sizes.
for coll in reducescatter allgather broadcast reduce alltoall; do
  out="$("$plan" --coll "$coll" -n 5 --root 3 -b 1000 -e 1M -f 10 2>&1)" || fail "$coll: exit $?: $out"
  [ "$(grep -Ec '^ *[0-9]+ +[0-9]+ .* (ring|tree|rhd|rd|pairwise|p2p) +model$' <<<"$out")" -eq 4 ] ||
    fail "$coll: expected 4 rows chosen by the model: $out"
done
out="$("$plan" --coll sendrecv -n 2 -b 1M -e 1M 2>&1)" || fail "send: exit $?"
grep -Eq ' p2p +model$' <<<"$out" || fail "send: p2p not chosen: $out"
out="$("$plan" --coll barrier -n 6 2>&1)" || fail "barrier: exit $?"
grep -Eq '^ *0 +0 .* (rd|pairwise) +model$' <<<"$out" || fail "barrier: $out"

# Forcing and fallback.
out="$("$plan" -n 8 -b 8 -e 8 --algo ring 2>&1)" || fail "--algo ring: exit $?"
grep -Eq ' ring +forced$' <<<"$out" || fail "--algo ring not forced: $out"
out="$("$plan" --coll reducescatter -n 8 -b 1M -e 1M --algo 'allreduce:rd;reducescatter:tree' 2>&1)" || fail "fallback: exit $?"
grep -Eq ' fallback \[[0-9]+\]$' <<<"$out" || fail "no fallback: $out"
grep -q 'KIZUNA_ALGO=reducescatter:tree cannot serve reducescatter: tree does not implement reducescatter; using ' <<<"$out" ||
  fail "fallback reason missing: $out"
out="$("$plan" -n 4 -b 8 -e 8 --algo ina 2>&1)" || fail "--algo ina: exit $?"
# Without the INA algorithm a warning; with it, a fallback: this shape has no aggregation devices.
grep -Eq "warning: KIZUNA_ALGO: 'ina' is not available yet|KIZUNA_ALGO=ina cannot serve allreduce: " <<<"$out" ||
  fail "no warning or fallback for ina: $out"
grep -Eq ' (model|fallback \[[0-9]+\])$' <<<"$out" || fail "ina: the model did not choose: $out"

# Heterogeneity: a 4x slower link between ranks 4 and 5 moves a 64 MiB allreduce off the ring.
out="$("$plan" -n 6 -b 64M -e 64M 2>&1)" || fail "uniform: exit $?"
grep -Eq ' ring +model$' <<<"$out" || fail "uniform 6 ranks, 64 MiB: ring expected: $out"
out="$("$plan" -n 6 -b 64M -e 64M --slow-rank 4 --slow-peer 5 --slow link --slow-factor 4 2>&1)" || fail "slow: exit $?"
echo "$out"
grep -q '^# rank 4: links to and from rank 5 4x slower$' <<<"$out" || fail "slow link not described"
grep -Eq ' (tree|rhd|rd|pairwise) +model$' <<<"$out" || fail "a slow ring link did not change the choice: $out"
# Neighbour-only links: only the ring can run an allreduce.
out="$("$plan" -n 8 -b 8 -e 8 --links ring 2>&1)" || fail "ring links: exit $?"
grep -Eq ' ring +model$' <<<"$out" || fail "ring links: ring expected: $out"
grep -q 'cannot reach' <<<"$out" || fail "ring links: no reachability reason: $out"

# JSON.
out="$("$plan" --json -n 4 -b 8 -e 1M -f 16 2>&1)" || fail "--json: exit $?"
python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
rows = d["rows"]
assert len(rows) == 5, len(rows)
for r in rows:
    names = [a["name"] for a in r["algorithms"]]
    assert names[:7] == ["ring", "tree", "rhd", "rd", "pairwise", "p2p", "fused"], names
    assert r["chosen"] in names
    p2p = r["algorithms"][5]
    assert p2p["supported"] is False and "does not implement" in p2p["reason"], p2p
    ring = r["algorithms"][0]
    assert ring["seconds"] > 0 and abs(ring["alpha_s"] + ring["beta_s"] + ring["gamma_s"] - ring["seconds"]) < 1e-12
assert d["constants"]["unknown_link_gbps"] == 25
' <<<"$out" || fail "--json: malformed: $out"

# --dump: the chosen algorithm's plan.
out="$("$plan" -n 4 --dump --count 10 --rank 1 2>&1)" || fail "--dump: exit $?: $out"
echo "$out"
grep -q '^# allreduce count=10 float32 sum nranks=4: rd (predicted ' <<<"$out" || fail "--dump: no selection line"
grep -q '^plan: allreduce count=10 float32 sum nranks=4 algorithm=rd ' <<<"$out" || fail "--dump: no plan header"
grep -q '^rank 1: ' <<<"$out" || fail "--dump: rank 1's steps missing"
out="$("$plan" -n 4 --dump --count 100 --algo ring --chunk-bytes 64 2>&1)" || fail "--dump ring: exit $?"
[ "$(grep -c '^rank [0-3]: ' <<<"$out")" -eq 4 ] || fail "--dump without --rank: expected 4 ranks: $out"

# --constants and --cost.
out="$("$plan" --constants --cost 'unknown_link_gbps=12.5' 2>&1)" || fail "--constants: exit $?"
grep -Eq '^unknown_link_gbps +12.5 GB/s +set by --cost \(default 25\)$' <<<"$out" || fail "--cost not applied: $out"

# Bad input: a clear message naming the flag, exit status 2.
expect_bad() {  # message-part args...
  local want="$1"; shift
  out="$("$plan" "$@" 2>&1)"; rc=$?
  [ "$rc" -eq 2 ] || fail "$*: expected exit 2, got $rc: $out"
  grep -q -- "$want" <<<"$out" || fail "$*: message lacks '$want': $out"
}
expect_bad "--coll 'allreduse': unknown collective" --coll allreduse
expect_bad "--ranks 0: expected" --ranks 0
expect_bad "--min-bytes '1X': unknown suffix" --min-bytes 1X
expect_bad "need min <= max" --min-bytes 1M --max-bytes 1K
expect_bad "--factor 1: expected" --factor 1
expect_bad "--algo: KIZUNA_ALGO='ring;tree'" --algo 'ring;tree'
expect_bad "unknown algorithm 'nope'" --algo 'allreduce:nope'
expect_bad "--cost: cost constants: unknown constant 'nope'" --cost nope=1
expect_bad "--root 9: expected 0..7" --coll broadcast --root 9
expect_bad "--slow-rank 8" --slow-rank 8
expect_bad "--dump needs --count" --dump
expect_bad "--worker-speeds: 2 worker speeds for 6 workers" --workers 6 --aggregators 1 --worker-ports 3 --agg-ports 4 --worker-speeds 1,2
expect_bad "--links 'torus'" --links torus
expect_bad "--dtype 'float33'" --dtype float33
expect_bad "The following argument was not expected: --bogus" --bogus   # CLI11's parse error
expect_bad "Could not convert: --ranks = x" --ranks x   # CLI11's conversion error
"$plan" --help >/dev/null || fail "--help: exit $?"

# ---- The INA mode: the partial in-network-aggregation planner (collectives/ina/planner.h) ----
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
ratio() {  # label output: the "= R x" figure of a summary line
  sed -nE "s/^$1 +[0-9.]+ b = ([0-9.]+) x .*/\1/p" <<<"$2"
}
# The SWoPP 2024 talk's threshold (docs/ALGORITHMS.md): N=16, D=8, E=8: the baseline (aggregation trees)
# equals the eight one-port rings up to 14 devices and first gains at 15.
out="$("$plan" --workers 16 --aggregators 14 --worker-ports 8 --agg-ports 8 2>&1)" || fail "ina M=14: exit $?: $out"
echo "$out"
[ "$(ratio baseline "$out")" = "1.0000" ] || fail "ina M=14: baseline ratio not 1: $out"
grep -q '^baseline .* 8 ring(s), one port per worker each' <<<"$out" || fail "ina M=14: baseline not the rings: $out"
grep -q '^ports per worker  max 8, min 7 (of 8)$' <<<"$out" || fail "ina M=14: ports not balanced: $out"
out="$("$plan" --workers 16 --aggregators 15 --worker-ports 8 --agg-ports 8 2>&1)" || fail "ina M=15: exit $?"
[ "$(ratio baseline "$out")" = "1.1719" ] || fail "ina M=15: baseline ratio not 5/(8*16/30): $out"
grep -q '5 full tree(s) of 3 devices, used alone' <<<"$out" || fail "ina M=15: baseline not 5 trees: $out"
# Partial INA: one device cannot beat the 8 rings that fill the 128 ports (a partial tree and six
# rings: 1 + 6*16/30 = 4.2 < 4.267); two devices gain (two partial trees and five rings: 1.0938),
# three more (a full tree and seven rings: 1.1094), four 1.1875: long before the baseline.
for mr in 0:1.0000 1:1.0000 2:1.0938 3:1.1094 4:1.1875; do
  m="${mr%%:*}"
  out="$("$plan" --workers 16 --aggregators "$m" 2>&1)" || fail "ina M=$m: exit $?"
  [ "$(ratio bandwidth "$out")" = "${mr#*:}" ] || fail "ina M=$m: ratio not ${mr#*:}: $out"
done
out="$("$plan" --workers 16 --aggregators 1 2>&1)" || fail "ina M=1: exit $?"
grep -Eq '^upper bound +[0-9.]+ b = 1\.0469' <<<"$out" || fail "ina M=1: upper bound: $out"
out="$("$plan" --workers 16 --aggregators 2 2>&1)" || fail "ina M=2: exit $?"
grep -Eq '^partial-tree +2 +1 +24 +1\.0000 ' <<<"$out" || fail "ina M=2: two one-device partial trees: $out"
grep -Eq '^ring +5 +0 +16 +0\.5333 ' <<<"$out" || fail "ina M=2: five rings: $out"
out="$("$plan" --workers 16 --aggregators 4 2>&1)" || fail "ina M=4: exit $?"
grep -Eq '^partial-tree +4 +1 +24 +1\.0000 ' <<<"$out" || fail "ina M=4: four one-device partial trees: $out"
grep -Eq '^ring +2 +0 +16 +0\.5333 ' <<<"$out" || fail "ina M=4: two rings: $out"
# Slide 20 of the SWoPP 2024 talk (6 workers, 3 ports, 4-port devices): 3 rings 1.8; one device a partial tree
# and a line (2: the talk's 0.90 of the time), two a full tree and two rings (2.2: 0.82), six three
# full trees (3: 0.60).
for mr in 0:1.0000:ring 1:1.1111:line 2:1.2222:full-tree 6:1.6667:full-tree; do
  IFS=: read -r m want kind <<<"$mr"
  out="$("$plan" --workers 6 --aggregators "$m" --worker-ports 3 --agg-ports 4 2>&1)" || fail "slide 20 M=$m: exit $?"
  [ "$(ratio bandwidth "$out")" = "$want" ] || fail "slide 20 M=$m: ratio not $want: $out"
  grep -Eq "^$kind " <<<"$out" || fail "slide 20 M=$m: no $kind: $out"
done
grep -Eq '^ring +2 +0 +6 +0\.6000 ' <<<"$("$plan" --workers 6 --aggregators 2 --worker-ports 3 --agg-ports 4)" ||
  fail "slide 20 M=2: not two rings"
# Issue 7's timing shapes plan (their time: docs/INA_PLANNER.md).
for m in 64 512; do
  out="$("$plan" --workers 2048 --aggregators $m --worker-ports 8 --agg-ports 8 2>&1)" || fail "2048/$m: exit $?"
  grep -q '^planning time ' <<<"$out" || fail "2048/$m: no planning time: $out"
done
# The layout and its topology file.
out="$("$plan" --workers 16 --aggregators 4 --layout "$tmp/l.json" --topology "$tmp/t.json" --bandwidth-gbps 100 \
  --latency-us 2 --shaping 2>&1)" || fail "--layout/--topology: exit $?: $out"
grep -q "^# layout written to $tmp/l.json$" <<<"$out" || fail "--layout not reported: $out"
python3 - "$tmp/l.json" "$tmp/t.json" <<'PY' || fail "--layout/--topology: malformed"
import json, sys
layout = json.load(open(sys.argv[1]))
topo = json.load(open(sys.argv[2]))
kinds = [p["kind"] for p in layout["parts"]]
assert kinds == ["partial-tree"] * 4 + ["ring"] * 2, kinds
assert layout["workers"] == 16 and layout["aggregators"] == 4, layout
assert len(topo["nodes"]) == 20 and len(topo["links"]) == 4 * 16 + 2 * 16, (len(topo["nodes"]), len(topo["links"]))
assert topo["shaping"] is True and topo["defaults"] == {"bandwidth_gbps": 100, "latency_us": 2}, topo["defaults"]
# Worker port p is topology ports 2p (cable, ring transmit) and 2p+1 (ring receive).
ports = {n["name"]: n["ports"] for n in topo["nodes"]}
assert ports["w0"] == 16 and ports["a0"] == 8, ports
links = {tuple(l[k] for k in ("a", "b")) for l in topo["links"]}
for ring in (p for p in layout["parts"] if p["kind"] == "ring"):
    order, rp = ring["ring"], ring["ring_ports"]
    for i in range(len(order)):
        j = (i + 1) % len(order)
        want = ("w%d:%d" % (order[i], 2 * rp[i]), "w%d:%d" % (order[j], 2 * rp[j] + 1))
        assert want in links, want
PY
out="$("$plan" --workers 16 --aggregators 4 --json 2>&1)" || fail "ina --json: exit $?"
python3 -c '
import json, sys
d = json.loads(sys.stdin.read())
assert abs(d["ratio"] - 1.1875) < 1e-12, d["ratio"]
assert d["baseline"]["rings"] == 8 and d["aggregators_used"] == 4 and d["solver"] == "dp", d
assert abs(sum(p["count"] * p["data_share"] for p in d["parts"]) - 1) < 1e-12
' <<<"$out" || fail "ina --json: malformed: $out"
out="$("$plan" --workers 16 --aggregators 4 --solver closed-form 2>&1)" || fail "--solver closed-form: exit $?"
[ "$(ratio bandwidth "$out")" = "1.1875" ] && grep -q '^solver  *closed-form' <<<"$out" || fail "closed form: $out"
# The sweep: CSV and SVG over the talk's grid.
out="$("$plan" --sweep --csv "$tmp/s.csv" --plot "$tmp/s.svg" 2>&1)" || fail "--sweep: exit $?: $out"
echo "$out"
grep -q '^N=16 D=8 E=8 .*partial INA M=2 (1.0938), baseline M=15 (1.1719)' <<<"$out" || fail "--sweep summary: $out"
[ "$(head -1 "$tmp/s.csv")" = "N,D,E,M,ring,baseline,partial_ina,upper_bound" ] || fail "--sweep: CSV header"
grep -q '^16,8,8,14,1.000000,1.000000,' "$tmp/s.csv" && grep -q '^16,8,8,15,1.000000,1.171875,' "$tmp/s.csv" ||
  fail "--sweep: the threshold rows"
grep -q '^16,8,8,1,1.000000,1.000000,1.000000,1.046875$' "$tmp/s.csv" &&
  grep -q '^16,8,8,2,1.000000,1.000000,1.093750,1.093750$' "$tmp/s.csv" || fail "--sweep: the first gain rows"
python3 - "$tmp/s.csv" <<'PY' || fail "--sweep: CSV values"
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
assert len(rows) == 25 + 41 + 89 + 9 + 25 + 41, len(rows)
for r in rows:
    b, p, u = float(r["baseline"]), float(r["partial_ina"]), float(r["upper_bound"])
    assert b - 1e-6 <= p <= u + 1e-6, r
PY
[ "$(grep -c 'N=[0-9]*, D=8, E=' "$tmp/s.svg")" -eq 6 ] && head -1 "$tmp/s.svg" | grep -q '^<svg ' ||
  fail "--sweep: the SVG has not 6 panels"
out="$("$plan" --sweep --workers 8 --agg-ports 4 --aggregators 5 2>&1)" || fail "--sweep one shape: exit $?"
[ "$(wc -l <<<"$out")" -eq 7 ] || fail "--sweep one shape to stdout: $out"
# The table of NTT's 2024 talk (--seed002).
out="$("$plan" --seed002 2>&1)" || fail "--seed002: exit $?"
echo "$out"
grep -Eq '^ring +ring allreduce +14  0\.4375 L\*b$' <<<"$out" || fail "--seed002 ring row: $out"
grep -Eq '^ring +ring \+ streaming aggregation in the NIC +7  0\.4375 L\*b$' <<<"$out" || fail "--seed002 row 2"
grep -Eq '^hypercube +optimized topology \+ streaming +3  0\.4375 L\*b$' <<<"$out" || fail "--seed002 row 3"
# One port per worker and fewer devices than a full tree: still a ring (every shape has a plan).
out="$("$plan" --workers 16 --aggregators 2 --worker-ports 1 2>&1)" || fail "one port: exit $?: $out"
grep -Eq '^ring +1 +0 +16 +0\.5333 ' <<<"$out" && [ "$(ratio bandwidth "$out")" = "1.0000" ] || fail "one port: $out"
out="$("$plan" --workers 16 --layout /nonexistent/dir/l.json 2>&1)"; rc=$?
[ "$rc" -eq 1 ] && grep -q -- '--layout /nonexistent/dir/l.json: cannot open for writing' <<<"$out" || fail "unwritable: $out"
expect_bad "--workers 1: expected 2..65536" --workers 1
expect_bad "--agg-ports 2: expected 3..1024" --workers 8 --agg-ports 2
expect_bad "--worker-ports 0: expected 1..64" --workers 8 --worker-ports 0
expect_bad "--aggregators -1: expected 0.." --workers 8 --aggregators -1
expect_bad "--solver 'best': expected auto, dp or closed-form" --workers 8 --solver best
expect_bad "--ranks belongs to the cost model's table" --workers 8 --ranks 4
expect_bad "--coll belongs to the cost model's table" --sweep --coll allreduce
expect_bad "the INA planner needs --workers N" --aggregators 4
expect_bad "--csv does not go with a single plan" --workers 8 --csv x.csv
expect_bad "--bandwidth-gbps does not go with no --topology FILE" --workers 8 --bandwidth-gbps 100
expect_bad "--aggregators does not go with --seed002" --seed002 --aggregators 3
expect_bad "--layout does not go with --sweep" --sweep --layout x.json
expect_bad "Could not convert: --workers = many" --workers many
echo "PASS"
