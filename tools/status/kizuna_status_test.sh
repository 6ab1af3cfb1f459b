#!/usr/bin/env bash
# kizuna-status against a running job: 4 ranks in a loop of AllReduces, rank 2 stopped (SIGSTOP)
# at round 5 while the others wait for it. The table must show every rank, rank 2 stopped and the
# slowest, the others running; --json the same; a wrong secret gets nothing. Then rank 2 is
# continued and the job completes, leaving no socket behind.
set -uo pipefail
status="$1"
run="$2"
prog="$3"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; kill -CONT "${victim:-0}" 2>/dev/null; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/status"
mkdir -p "$tmp"
# Short: a Unix socket's path has at most 107 bytes, and the test's own folder is deep.
KIZUNA_RUN_DIR="$(mktemp -d /tmp/kz-status.XXXXXX)"
trap 'rm -rf "$KIZUNA_RUN_DIR"' EXIT
export KIZUNA_RUN_DIR KIZUNA_EMULATED_DEVICES=4 KIZUNA_TIMEOUT=60
# What killed jobs leave: the folder of a job whose processes are all gone goes when another job
# starts; one with a live process stays.
true &
dead=$!
wait "$dead"
mkdir -p "$KIZUNA_RUN_DIR/ended" "$KIZUNA_RUN_DIR/live"
touch "$KIZUNA_RUN_DIR/ended/r0-p$dead.sock" "$KIZUNA_RUN_DIR/ended/r1-p$dead.sock" "$KIZUNA_RUN_DIR/live/r0-p$$.sock"

"$run" -n 4 --timeout 90 -- "$prog" pause 2 >"$tmp/job.out" 2>&1 &
job=$!
# Until rank 2 has stopped itself and the others have finished round 4.
for _ in $(seq 1 300); do
  [ "$(grep -c 'round 4 done' "$tmp/job.out")" -ge 3 ] && grep -q 'rank 2: stopping' "$tmp/job.out" && break
  sleep 0.1
done
grep -q 'rank 2: stopping' "$tmp/job.out" || { cat "$tmp/job.out"; fail "rank 2 never stopped"; }
sleep 1.5  # the others stall on it: their records say what they wait on
[ ! -e "$KIZUNA_RUN_DIR/ended" ] || fail "the folder of a job whose processes are gone stayed"
[ -e "$KIZUNA_RUN_DIR/live/r0-p$$.sock" ] || fail "the socket of a live process was removed"
rm -r "$KIZUNA_RUN_DIR/live"
victim="$(ls "$KIZUNA_RUN_DIR"/*/ | sed -n 's/^r2-p\([0-9]*\)\.sock$/\1/p')"
[ -n "$victim" ] || fail "no status socket of rank 2 in $KIZUNA_RUN_DIR"
any="$(ls "$KIZUNA_RUN_DIR"/*/ | sed -n 's/^r0-p\([0-9]*\)\.sock$/\1/p')"

out="$("$status" --pid "$any" --wait 1 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 3 ] || fail "expected exit status 3 (a rank not answering), got $rc"
grep -Eq "^world +2 +$victim .*stopped \(SIGSTOP\)" <<<"$out" || fail "rank 2 not shown stopped"
for r in 0 1 3; do
  grep -Eq "^world +$r +[0-9]+ +[^ ]+ +running +#[0-9]+ +#[0-9]+ allreduce" <<<"$out" || fail "rank $r not shown running"
done
# The fused path's waits say what they wait on, as the plans' do.
grep -Eq "^world +0 .*waiting on rank 2 \(to arrive at the fused collective\)" <<<"$out" ||
  fail "rank 0 does not say it waits on rank 2"
grep -q "^slowest: rank 2 (stopped (SIGSTOP), pid $victim) does not answer; the others are at operation" <<<"$out" ||
  fail "the slowest rank is not named"

json="$("$status" --pid "$any" --wait 1 --json)"
python3 - <<PY || fail "--json"
import json
j = json.loads('''$json''')
ranks = {r["rank"]: r for r in j["ranks"] if r["comm"] == "world"}
assert sorted(ranks) == [0, 1, 2, 3], ranks.keys()
assert ranks[2]["state"].startswith("stopped"), ranks[2]
assert all(ranks[r]["state"] == "running" for r in (0, 1, 3)), ranks
assert j["slowest"].startswith("rank 2 "), j["slowest"]
PY

# Another job's secret: the folder is another one, nothing answers for it.
id="$(tr '\0' '\n' </proc/"$any"/environ | sed -n 's/^KIZUNA_UNIQUE_ID=//p')"
wrong="${id%????}$([ "${id: -4}" = 0000 ] && echo 1111 || echo 0000)"
out="$("$status" --id "$wrong" --wait 1 2>&1)"
[ $? -eq 1 ] && grep -q "no process of this job serves status here" <<<"$out" || fail "a wrong id: $out"
# ... and where its folder leads to the job's sockets, the processes refuse it (the handshake).
right="$(ls -d "$KIZUNA_RUN_DIR"/*/)"
wrong_dir="$(KIZUNA_RUN_DIR="$tmp/probe" "$status" --id "$wrong" 2>&1 | sed -n 's/.*: \(\/[^ ]*\) (the job.s folder.*/\1/p')"
[ -n "$wrong_dir" ] || fail "the wrong id's folder is not named"
ln -s "$right" "$KIZUNA_RUN_DIR/$(basename "$wrong_dir")"
out="$("$status" --id "$wrong" --wait 1 2>&1)"
echo "$out"
[ "$(grep -c ' refused ' <<<"$out")" -eq 3 ] || fail "the processes did not refuse another job's secret"
grep -q "stopped (SIGSTOP)" <<<"$out" || fail "the stopped rank, asked with another secret"
rm "$KIZUNA_RUN_DIR/$(basename "$wrong_dir")"

kill -CONT "$victim"
wait "$job"
rc=$?
cat "$tmp/job.out"
[ "$rc" -eq 0 ] || fail "the job after SIGCONT: exit status $rc"
for r in 0 1 2 3; do grep -q "^\[$r\] rank $r: 10 AllReduces ok" "$tmp/job.out" || fail "rank $r did not finish"; done
left="$(find "$KIZUNA_RUN_DIR" -mindepth 1)"
[ -z "$left" ] || fail "left behind in the run directory: $left"
echo "PASS"
