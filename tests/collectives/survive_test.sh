#!/usr/bin/env bash
# Surviving a lost rank between processes (survive.cc under kizuna-run --keep-going): 4 ranks in a
# loop of AllReduces, one killed (SIGKILL) or frozen (SIGSTOP); the others name it, shrink it away
# and go on with exact results. On one host (the fused path between processes, and the staged
# ring), and between pretend hosts over tcp (the network path; rank 0, the bootstrap's root, lost).
set -uo pipefail
run="$1"
prog="$2"
export KIZUNA_EMULATED_DEVICES=4
# The jobs' status sockets (runtime/job_status.h) in a folder of the test's: a killed rank's stays.
KIZUNA_RUN_DIR="$(mktemp -d /tmp/kz-survive.XXXXXX)"
trap 'rm -rf "$KIZUNA_RUN_DIR"' EXIT
export KIZUNA_RUN_DIR
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }

# $1 kill|stop, $2 the victim, $3 the longest detection allowed (s), $4 ranks per pretend host
# (0: one host); the rest: NAME=VALUE environment.
survive() {
  local how=$1 victim=$2 within=$3 per_host=$4 out rc r t
  shift 4
  out="$(env "$@" "$run" -n 4 --keep-going --timeout 120 -- "$prog" "$how" "$victim" "$per_host" 2>&1)"
  rc=$?
  echo "$out"
  local what="$how $victim (per host $per_host${*:+, $*})"
  # The victim ends by SIGKILL: its own, or the survivors' once they are done with a frozen one.
  [ "$rc" -eq 137 ] || fail "$what: exit status $rc (expected 137, the victim's SIGKILL)"
  grep -q "kizuna-run: rank $victim was killed by SIGKILL" <<<"$out" || fail "$what: the victim's end not reported"
  for r in 0 1 2 3; do
    [ "$r" -eq "$victim" ] && continue
    t="$(sed -n "s/^\[$r\] rank $r: lost rank $victim named after \([0-9.]*\) s: .*/\1/p" <<<"$out")"
    [ -n "$t" ] || fail "$what: rank $r did not name rank $victim"
    awk -v t="$t" -v w="$within" 'BEGIN { exit !(t < w) }' || fail "$what: rank $r took $t s to name it (limit $within)"
    grep -q "^\[$r\] rank $r: shrank to 3 ranks in" <<<"$out" || fail "$what: rank $r did not shrink"
    grep -q "^\[$r\] rank $r: 20 AllReduces ok after the loss" <<<"$out" || fail "$what: rank $r did not go on"
  done
}

# One host, the fused path between processes: a killed rank is named at once.
survive kill 2 5 0
# The staged ring over direct links between processes.
survive kill 1 5 0 KIZUNA_ALGO=ring
# A frozen rank is named at the timeout (KIZUNA_TIMEOUT=4).
survive stop 3 15 0 KIZUNA_TIMEOUT=4
# Pretend hosts of two ranks over tcp (hier:fused between them): rank 0, the bootstrap's root, is
# killed; then a frozen rank.
survive kill 0 5 2 KIZUNA_FABRIC=tcp:lo
survive stop 1 15 2 KIZUNA_FABRIC=tcp:lo KIZUNA_TIMEOUT=4
echo "PASS"
