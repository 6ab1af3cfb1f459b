#!/usr/bin/env bash
# kizuna-plan end to end: the table has a column per algorithm and the choice; the regimes show
# (rd for a tiny allreduce, something else for a large one); forcing, fallback and heterogeneity
# change what they should; --json parses; --dump prints a plan; bad flags fail with a clear
# message and exit status 2 (CLI11's parse errors included).
set -uo pipefail
plan="$1"
fail() { echo "FAIL: $*"; exit 1; }

# The default sweep: allreduce over 8 ranks, 8 bytes to 512 MiB.
out="$("$plan" --coll allreduce --ranks 8 2>&1)" || fail "default sweep: exit $?: $out"
echo "$out"
grep -Eq '^ +bytes +count +ring +tree +rhd +rd +pairwise +p2p +fused +choice +by$' <<<"$out" || fail "no header row"
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
grep -q "warning: KIZUNA_ALGO: 'ina' is not available yet" <<<"$out" || fail "no warning for ina: $out"
grep -Eq ' model$' <<<"$out" || fail "ina: the model did not choose: $out"

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
    assert names == ["ring", "tree", "rhd", "rd", "pairwise", "p2p", "fused"], names
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
expect_bad "--links 'torus'" --links torus
expect_bad "--dtype 'float33'" --dtype float33
expect_bad "The following argument was not expected: --bogus" --bogus   # CLI11's parse error
expect_bad "Could not convert: --ranks = x" --ranks x   # CLI11's conversion error
"$plan" --help >/dev/null || fail "--help: exit $?"
echo "PASS"
