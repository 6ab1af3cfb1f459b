#!/usr/bin/env bash
# kizuna-tune: a short run at 2 ranks writes a cost file with a [ranks=2] section (measured links,
# devices, fitted constants); --append at 3 ranks adds [ranks=3] and keeps [ranks=2]; a job that
# loads the file says so and runs; ranks given different files refuse each other, naming both.
set -uo pipefail
tune="$1"
run="$2"
example="$3"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/tune"
mkdir -p "$tmp"
export KIZUNA_EMULATED_DEVICES=4 KIZUNA_TIMEOUT=60
cost="$tmp/cost.txt"

out="$("$run" -n 2 --timeout 120 -- "$tune" -o "$cost" --max-bytes 256K --iters 2 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "kizuna-tune at 2 ranks: exit status $rc"
grep -q "kizuna-tune: 2 ranks, .* s: $cost (host memory .* GB/s" <<<"$out" || fail "no summary line"
cat "$cost"
grep -q '^\[ranks=2\]$' "$cost" || fail "no [ranks=2] section"
grep -Eq '^link\.directconnect\.latency_us = [0-9.e+-]+$' "$cost" || fail "no measured directconnect latency"
grep -Eq '^unknown_copy_gbps = [0-9.e+-]+$' "$cost" || fail "no measured device copy rate"

out="$("$run" -n 3 --timeout 120 -- "$tune" -o "$cost" --append --max-bytes 64K --iters 2 2>&1)"
[ $? -eq 0 ] || { echo "$out"; fail "kizuna-tune --append at 3 ranks"; }
cat "$cost"
grep -q '^\[ranks=2\]$' "$cost" && grep -q '^\[ranks=3\]$' "$cost" || fail "--append did not keep both sections"

# A job that loads it: rank 0 logs the section it took; the results stay exact.
out="$(KIZUNA_COST_FILE="$cost" KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT "$run" -n 3 -- "$example" 1000 2>&1)"
[ $? -eq 0 ] || { echo "$out"; fail "a job with the cost file"; }
grep -q "the cost model's constants: .*($cost, \[ranks=3\])" <<<"$out" || { echo "$out"; fail "the job did not say it took [ranks=3]"; }
grep -q "all 6: ok" <<<"$out" || fail "wrong results with the cost file"

# Rank 1 with another file (the defaults): every rank refuses, naming both.
out="$("$run" -n 2 --timeout 60 -- sh -c '[ "$RANK" = 0 ] && export KIZUNA_COST_FILE='"$cost"'; exec "$0" 1000' "$example" 2>&1)"
[ $? -ne 0 ] || fail "ranks with different cost files formed a communicator"
grep -q "must load the same KIZUNA_COST_FILE" <<<"$out" || { echo "$out"; fail "the mismatch was not named"; }
# A malformed file fails creation, naming the line.
echo "oneshot_us = fast" >"$tmp/bad.txt"
out="$(KIZUNA_COST_FILE="$tmp/bad.txt" "$run" -n 2 --timeout 60 -- "$example" 1000 2>&1)"
[ $? -ne 0 ] && grep -q "bad.txt line 1: 'fast' is not a finite, non-negative number" <<<"$out" || { echo "$out"; fail "a malformed file"; }
echo "PASS"
