#!/usr/bin/env bash
# kizuna-run end to end: N ranks of bootstrap_check bootstrap over TCP from the environment
# kizuna-run sets and check an allgather, a ring of send/recv and a barrier; a failing rank's status
# becomes kizuna-run's and the other ranks are stopped (their processes are gone afterwards);
# every output line carries its rank; --timeout; bad input.
set -uo pipefail
run="$1"
check="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
# The ranks' own bootstrap deadline: generous, but far below the test's.
export KIZUNA_TIMEOUT=60
fail() { echo "FAIL: $*"; exit 1; }

# 1. Four ranks, all checks pass.
out="$("$run" -n 4 -- "$check" 2>"$tmp/err1")"
rc=$?
err="$(cat "$tmp/err1")"
echo "$out"; echo "$err"
[ "$rc" -eq 0 ] || fail "4 ranks: exit status $rc"
for r in 0 1 2 3; do
  grep -qx "\[$r\] rank $r of 4: allgather of 4 blobs ok" <<<"$out" || fail "rank $r: no allgather line"
  grep -qx "\[$r\] rank $r of 4: ring send/recv ok" <<<"$out" || fail "rank $r: no send/recv line"
  grep -qx "\[$r\] rank $r of 4: barrier ok" <<<"$out" || fail "rank $r: no barrier line"
  grep -qx "\[$r\] rank $r of 4: this line went to stderr" <<<"$err" || fail "rank $r: stderr line missing or not prefixed"
done
[ "$(grep -c . <<<"$out")" -eq 12 ] || fail "expected 12 lines on stdout"
grep -qv '^\[[0-3]\] ' <<<"$out" && fail "a stdout line without a rank prefix"

# 2. One rank, and more ranks than cores.
"$run" -n 1 -- "$check" >"$tmp/out2" 2>&1 || fail "1 rank: exit status $?"
grep -q '^\[0\] rank 0 of 1: barrier ok' "$tmp/out2" || fail "1 rank: no barrier line"
"$run" -n 8 -- "$check" >"$tmp/out3" 2>&1 || { cat "$tmp/out3"; fail "8 ranks: exit status $?"; }
[ "$(grep -c 'barrier ok' "$tmp/out3")" -eq 8 ] || fail "8 ranks: not every rank passed the barrier"

# 3. Rank 2 fails with status 7 while the others linger: kizuna-run exits 7 soon, and the other
#    ranks' processes are gone.
mkdir -p "$tmp/pids"
start=$(date +%s)
out="$("$run" -n 4 --grace 2 -- "$check" --pid-dir "$tmp/pids" --fail-rank 2 --exit-code 7 --linger 60 2>&1)"
rc=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
[ "$rc" -eq 7 ] || fail "failing rank: expected exit status 7, got $rc"
[ "$elapsed" -lt 30 ] || fail "failing rank: kizuna-run took ${elapsed}s (the others were not stopped)"
grep -q '^\[2\] rank 2: failing on purpose with status 7' <<<"$out" || fail "the failing rank's output is missing"
grep -q 'kizuna-run: rank 2 exited with status 7; stopping the other ranks' <<<"$out" || fail "no failure message"
for r in 0 1 3; do
  # A rank still talking to a peer may see that peer go first and exit on its own error before
  # the signal lands; either way kizuna-run must report it as stopped by kizuna-run.
  grep -Eq "kizuna-run: rank $r (was killed by SIGTERM|exited with status [0-9]+) \(stopped by kizuna-run\)" <<<"$out" \
    || fail "rank $r not reported stopped"
  pid="$(cat "$tmp/pids/rank.$r.pid")" || fail "rank $r wrote no pid"
  kill -0 "$pid" 2>/dev/null && fail "rank $r (pid $pid) is still running"
done

# 3b. With --keep-going the others go on after rank 1 fails, and the exit status is still rank 1's.
out="$("$run" -n 3 --keep-going -- sh -c '[ "$RANK" = 1 ] && exit 7; sleep 1; echo "rank $RANK went on"' 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 7 ] || fail "--keep-going: expected exit status 7, got $rc"
grep -q 'kizuna-run: rank 1 exited with status 7; the others go on' <<<"$out" || fail "--keep-going: no message"
for r in 0 2; do grep -qx "\[$r\] rank $r went on" <<<"$out" || fail "--keep-going: rank $r was stopped"; done

# 4. --timeout stops everything and exits 124, saying so.
out="$("$run" -n 2 --timeout 1 --grace 1 -- sleep 60 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 124 ] || fail "timeout: expected 124, got $rc"
grep -q 'timeout' <<<"$out" || fail "timeout: not reported"

# 5. Bad input: clear messages, no crash.
"$run" -- "$check" >"$tmp/bad1" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "no -n: expected 2, got $rc"
"$run" -n 0 -- true >"$tmp/bad2" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "-n 0: expected 2, got $rc"
"$run" -n 2 >"$tmp/bad3" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q 'no program' "$tmp/bad3" || fail "no program: expected 2 and a message, got $rc"
"$run" -n 2 -- no-such-program-kz >"$tmp/bad4" 2>&1; rc=$?
cat "$tmp/bad4"
[ "$rc" -eq 127 ] && grep -q "not found" "$tmp/bad4" || fail "missing program: expected 127 and a message, got $rc"
"$run" -n 2 --frobnicate -- true >"$tmp/bad5" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "unknown option: expected 2, got $rc"
"$run" -n 2 -- true : true >"$tmp/bad6" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "after ':'" "$tmp/bad6" || fail "':' without -n: expected 2 and a message, got $rc"
"$run" -n 2 -- true : -n x true >"$tmp/bad7" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q "not a number" "$tmp/bad7" || fail "':' -n x: expected 2 and a message, got $rc"

# 5b. Several programs (MPMD): ranks after ':' run the second one, in one world.
out=$("$run" -n 2 -- sh -c 'echo "a $RANK/$WORLD_SIZE"' : -n 1 sh -c 'echo "b $RANK/$WORLD_SIZE"' 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 0 ] && grep -q '^\[2\] b 2/3' <<<"$out" && grep -q '^\[1\] a 1/3' <<<"$out" \
  || fail "MPMD: expected rank 2 to run the second program in a world of 3"

# 5c. --bind-to core: each rank on a CPU of its own; more ranks than CPUs is refused, naming both.
cpus=$(nproc)
n=$(( cpus < 4 ? cpus : 4 ))
out=$("$run" -n "$n" --bind-to core -- sh -c 'grep Cpus_allowed_list /proc/self/status' 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--bind-to core: exit $rc"
[ "$(grep -c 'Cpus_allowed_list:[[:space:]]*[0-9]*$' <<<"$out")" -eq "$n" ] || fail "--bind-to core: a rank not on one CPU"
[ "$(grep -o 'Cpus_allowed_list:.*' <<<"$out" | sort -u | wc -l)" -eq "$n" ] || fail "--bind-to core: two ranks share a CPU"
"$run" -n $((cpus + 1)) --bind-to core -- true >"$tmp/bind" 2>&1; rc=$?
cat "$tmp/bind"
[ "$rc" -ne 0 ] && grep -q "$((cpus + 1)) ranks but $cpus CPUs" "$tmp/bind" || fail "--bind-to core oversubscribed: expected a refusal, got $rc"
# core:overload-allowed: twice as many ranks as CPUs, each on one CPU, two on each.
out=$("$run" -n $((2 * cpus)) --bind-to core:overload-allowed -- sh -c 'grep Cpus_allowed_list /proc/self/status' 2>&1); rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--bind-to core:overload-allowed: exit $rc"
[ "$(grep -c 'Cpus_allowed_list:[[:space:]]*[0-9]*$' <<<"$out")" -eq $((2 * cpus)) ] ||
  fail "--bind-to core:overload-allowed: a rank not on one CPU"
[ "$(grep -o 'Cpus_allowed_list:.*' <<<"$out" | sort | uniq -c | awk '$1 != 2' | wc -l)" -eq 0 ] ||
  fail "--bind-to core:overload-allowed: expected two ranks on each CPU"

# 6. The ranks' own exit status passes through, also for a program that is not a kizuna rank.
"$run" -n 3 -- sh -c 'exit $((RANK == 1 ? 9 : 0))' >/dev/null 2>&1; rc=$?
[ "$rc" -eq 9 ] || fail "plain program: expected 9, got $rc"
echo "PASS"
