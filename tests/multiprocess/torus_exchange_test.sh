#!/usr/bin/env bash
# 8 ranks under kizuna-run exchange data with their neighbours over the direct links of a 4x2
# torus (each rank: 4 links, two of them to the same neighbour), from host memory and from
# fd-registered emulated device memory; then the error path of a topology too small for the job.
set -uo pipefail
run="$1"
topo="$2"
exchange="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export KIZUNA_TIMEOUT=60
export KIZUNA_EMULATED_DEVICES=8
fail() { echo "FAIL: $*"; exit 1; }

"$topo" --generate torus2d 4x2 --bandwidth-gbps 100 --latency-us 1 >"$tmp/torus.json" || fail "kizuna-topo: $?"
out="$(KIZUNA_TOPOLOGY="$tmp/torus.json" "$run" -n 8 --timeout 120 -- "$exchange" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "8 ranks on a 4x2 torus: exit status $rc"
for r in 0 1 2 3 4 5 6 7; do
  grep -q "^\[$r\] rank $r: host round ok over 4 links" <<<"$out" || fail "rank $r: no host round line"
  grep -q "^\[$r\] rank $r: device round ok over 4 links, single copy" <<<"$out" || fail "rank $r: no device round line"
  grep -qx "\[$r\] rank $r: ok" <<<"$out" || fail "rank $r: did not finish"
done

# A 4-worker ring for 8 ranks: ranks 4..7 have no node; the job fails with that reason.
"$topo" --generate ring 4 >"$tmp/ring.json" || fail "kizuna-topo: $?"
out="$(KIZUNA_TOPOLOGY="$tmp/ring.json" KIZUNA_TIMEOUT=10 "$run" -n 8 --timeout 60 --grace 1 -- "$exchange" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "8 ranks on a 4-worker ring succeeded"
grep -q "has 4 workers: rank [4-7] has no node" <<<"$out" || fail "no message naming the missing node"
echo "PASS"
