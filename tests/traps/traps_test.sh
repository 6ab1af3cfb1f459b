#!/usr/bin/env bash
# The environment traps of docs/TROUBLESHOOTING.md ("Known traps"), end to end with kizuna-run and
# trap_rank.cc: each job must work where kizuna does not need what is missing, and otherwise fail
# on every rank, within its deadline, with an error that names the cause and what to do.
#
#   traps_test.sh KIZUNA_RUN TRAP_RANK
#
# Every trap is one case in the test's XML (passed, failed, or skipped saying why), so that
# `./kz test` counts them; the script exits non-zero when any case failed. /dev/shm is replaced
# only inside a private mount namespace (unshare -m), which ends with the case: nothing outlives
# the test, and the host's /dev/shm is checked to be as it was.
set -uo pipefail

# Inside the private mount namespace (shm_job below): a 64 KiB tmpfs on /dev/shm, filled or not,
# then the job.
if [[ "${1:-}" == "--in-namespace" ]]; then
  mount -t tmpfs -o size=64k,mode=1777 tmpfs /dev/shm || { echo "traps: cannot mount a tmpfs on /dev/shm"; exit 99; }
  if [[ "$2" == full ]]; then
    head -c 65536 /dev/zero >/dev/shm/filler 2>/dev/null
    [[ "$(df --output=avail /dev/shm | tail -n 1 | tr -d ' ')" == 0 ]] || { echo "traps: /dev/shm not full"; exit 98; }
  fi
  shift 2
  exec "$@"
fi

run="$1"
prog="$2"
export KIZUNA_EMULATED_DEVICES=4
# No rank may wait for the 600 s default: every job here ends within seconds.
export KIZUNA_TIMEOUT=10
# The jobs' status sockets (runtime/job_status.h) in a folder of the test's, removed at the end.
KIZUNA_RUN_DIR="$(mktemp -d /tmp/kz-traps.XXXXXX)"
trap 'rm -rf "$KIZUNA_RUN_DIR"' EXIT
export KIZUNA_RUN_DIR
tmp="${TEST_TMPDIR:-$(mktemp -d)}/traps"
mkdir -p "$tmp"
xml="${XML_OUTPUT_FILE:-}"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE

names=()
results=()  # pass | fail:MESSAGE | skip:WHY
times=()
fails=0
case_start=0
begin() {
  names+=("$1")
  case_start=$(date +%s.%N)
  echo "=== $1"
}
finish() {
  results+=("$1")
  times+=("$(awk -v a="$case_start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.2f", b - a }')")
  case "$1" in
    pass) echo "--- PASS ${names[-1]}" ;;
    skip:*) echo "--- SKIP ${names[-1]}: ${1#skip:}" ;;
    *) echo "--- FAIL ${names[-1]}: ${1#fail:}" && fails=$((fails + 1)) ;;
  esac
}

# Runs a job and keeps its output in $out, its status in $rc and its seconds in $elapsed:
#   job [VAR=VALUE...] -- kizuna-run arguments...
# (kizuna-run itself is started through the command in $wrap, when there is one).
wrap=()
job() {
  local -a envs=()
  while [[ $# -gt 0 && "$1" != "--" ]]; do
    envs+=("$1")
    shift
  done
  shift
  local start
  start=$(date +%s.%N)
  # kizuna-run's own --timeout ends a job whose ranks hang; `timeout` backs it up.
  out="$(env "${envs[@]}" timeout -k 5 90 "${wrap[@]}" "$run" --timeout 60 "$@" 2>&1)"
  rc=$?
  elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  echo "$out" | cut -c1-1000
  echo "(exit status $rc after $elapsed s)"
}

# The failure lines of ranks 0..N-1 ("[r] rank r: FAILED: ..."): "" when all N have one that
# matches every pattern given; else what is wrong.
every_rank_fails_with() {
  local n=$1 r p line
  shift
  for ((r = 0; r < n; ++r)); do
    line="$(grep -m 1 "^\[$r\] rank $r: FAILED: " <<<"$out")"
    [[ -n "$line" ]] || { echo "rank $r did not report a failure"; return; }
    for p in "$@"; do
      grep -qF -- "$p" <<<"$line" || { echo "rank $r's error does not say '$p': ${line:0:400}"; return; }
    done
  done
}
every_rank_ok() {
  local n=$1 r
  for ((r = 0; r < n; ++r)); do
    grep -q "^\[$r\] rank $r of $n: allreduce ok" <<<"$out" || { echo "rank $r did not finish its AllReduces"; return; }
  done
}
# Keeps the first of the problems found in $m.
first() { [[ -n "$m" ]] || m="$1"; }
# "" when $elapsed < $1 seconds.
within() {
  awk -v e="$elapsed" -v l="$1" \
    'BEGIN { if (e >= l) printf "took %s s (limit %s s): a rank waited for its deadline", e, l }'
}
# The first of its arguments that is not empty, as a result: pass, or fail:FIRST.
verdict() {
  local m
  for m in "$@"; do [[ -n "$m" ]] && { finish "fail:$m"; return; }; done
  finish pass
}

# ---- 1. /dev/shm too small or full ----

shm_before="$(df --output=size,fstype /dev/shm 2>/dev/null | tail -n 1)"
ns_why=""
if ! command -v unshare >/dev/null; then
  ns_why="unshare(1) is not installed"
elif ! probe="$(unshare -m --propagation private sh -c 'mount -t tmpfs -o size=64k tmpfs /dev/shm' 2>&1)"; then
  ns_why="this test may not mount a tmpfs in a mount namespace of its own (needs root or CAP_SYS_ADMIN): $probe"
fi
# job's, with the job in a private mount namespace whose /dev/shm is a 64 KiB tmpfs, full or empty:
#   shm_job full|empty [VAR=VALUE...] -- kizuna-run arguments...
shm_job() {
  wrap=(unshare -m --propagation private bash "$0" --in-namespace "$1")
  shift
  job "$@"
  wrap=()
}

begin dev_shm_full_is_not_needed
if [[ -n "$ns_why" ]]; then
  finish "skip:$ns_why"
else
  # One host (the fused path between processes, direct links), then pretend hosts over tcp.
  shm_job full -- -n 4 -- "$prog" allreduce
  m1="$([[ $rc -eq 0 ]] || echo "one host: exit status $rc")$(every_rank_ok 4)"
  shm_job full KIZUNA_FABRIC=tcp:lo -- -n 4 -- "$prog" allreduce 2
  verdict "$m1" "$([[ $rc -eq 0 ]] || echo "pretend hosts: exit status $rc")" "$(every_rank_ok 4)" \
    "$(grep -q "/dev/shm" <<<"$out" && echo "a job that does not use /dev/shm mentions it")"
fi

begin dev_shm_full_throttle_says_so
if [[ -n "$ns_why" ]]; then
  finish "skip:$ns_why"
else
  # The throttle's timeline is the one thing of the emulated device in /dev/shm: the job still
  # works, and each rank warns, naming /dev/shm, its size and what to do.
  shm_job full KIZUNA_EMU_COPY_GBPS=50 -- -n 4 -- "$prog" allreduce
  m=""
  for r in 0 1 2 3; do
    line="$(grep -m 1 "^\[$r\] .*WARN DEVICE host_emulated: device $r: " <<<"$out")"
    for p in "/dev/shm/kizuna-emu-" "No space left on device" \
      "/dev/shm is full or too small (/dev/shm has 64.0 KiB, 0 bytes free)" "--shm-size" \
      "unset KIZUNA_EMU_COPY_GBPS" "throttles are per process"; do
      grep -qF -- "$p" <<<"$line" || first "rank $r's warning does not say '$p': ${line:0:400}"
    done
  done
  verdict "$([[ $rc -eq 0 ]] || echo "exit status $rc")" "$(every_rank_ok 4)" "$m"
fi

begin dev_shm_small_ofi_shm_says_so
if [[ -n "$ns_why" ]]; then
  finish "skip:$ns_why"
else
  # libfabric's shm provider needs tens of MiB of /dev/shm and leaves itself out silently.
  shm_job empty KIZUNA_FABRIC=ofi:shm -- -n 2 --keep-going -- "$prog" allreduce 1
  if grep -q "libfabric.* not found\|libfabric cannot be used" <<<"$out"; then
    finish "skip:libfabric is not installed here"
  else
    verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" \
      "$(every_rank_fails_with 2 "shm" "/dev/shm has 64.0 KiB, 64.0 KiB free" "--shm-size" "KIZUNA_FABRIC=tcp")" \
      "$(within 20)"
  fi
fi
shm_after="$(df --output=size,fstype /dev/shm 2>/dev/null | tail -n 1)"
begin dev_shm_of_the_host_untouched
verdict "$([[ "$shm_before" == "$shm_after" ]] || echo "/dev/shm was '$shm_before', is '$shm_after'")"

# ---- 2. Too few file descriptors ----

begin descriptors_too_few_every_rank_names_ulimit
# 8 ranks on one host, each under ulimit -n 18: enough to start, not to connect to every peer
# and map their buffers. Every rank fails (--keep-going: none is stopped first), and nearly always
# each names the limit itself. A rank whose connection attempt meets a peer that has already
# failed (a loaded machine) may instead name that peer, whose own error must then name the limit.
job -- -n 8 --keep-going -- bash -c "ulimit -n 18 && exec '$prog' allreduce"
limit_text="Too many open files (errno 24) (this process may hold 18 descriptors, ulimit -n: raise it"
# The rank a failure line blames: the peer it was connecting or sending to, or the rank that failed first.
blamed() { grep -o "\(to\|from\) rank [0-9]*\|rank [0-9]* failed" <<<"$1" | grep -o "[0-9]*" | head -n 1; }
m=""
named=0
for r in 0 1 2 3 4 5 6 7; do
  line="$(grep -m 1 "^\[$r\] rank $r: FAILED: " <<<"$out")"
  [[ -n "$line" ]] || { first "rank $r did not report a failure"; continue; }
  if grep -qF "$limit_text" <<<"$line"; then
    named=$((named + 1))
    continue
  fi
  # Follow the blame (at most 8 ranks) to a rank that names the limit.
  cur=$r
  for ((hop = 0; hop < 8; ++hop)); do
    cur="$(blamed "$(grep -m 1 "^\[$cur\] rank $cur: FAILED: " <<<"$out")")"
    [[ -z "$cur" ]] && break
    grep -m 1 "^\[$cur\] rank $cur: FAILED: " <<<"$out" | grep -qF "$limit_text" && break
  done
  if [[ -n "$cur" ]] && grep -m 1 "^\[$cur\] rank $cur: FAILED: " <<<"$out" | grep -qF "$limit_text"; then
    echo "(rank $r names rank $cur, or a rank that names it, and rank $cur names the limit)"
  else
    first "rank $r's error names neither the limit nor a peer that ran out: ${line:0:400}"
  fi
done
verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" "$m" "$([[ $named -gt 0 ]] || echo "no rank named the limit")" \
  "$(within 20)"

begin descriptors_enough_same_job_passes
job -- -n 8 -- bash -c "ulimit -n 1024 && exec '$prog' allreduce"
verdict "$([[ $rc -eq 0 ]] || echo "exit status $rc")" "$(every_rank_ok 8)"

begin descriptors_too_few_at_the_root
# The bootstrap's root holds a connection per rank: under ulimit -n 10 it cannot accept them all.
# Its rendezvous timeout names the limit, and every rank that joined reports it; a rank still
# queued when the root gives up is told it could not reach the root.
job KIZUNA_TIMEOUT=4 -- -n 8 --keep-going -- bash -c "ulimit -n 10 && exec '$prog' allreduce"
m=""
for r in 0 1 2 3 4 5 6 7; do
  line="$(grep -m 1 "^\[$r\] rank $r: FAILED: " <<<"$out")"
  if grep -qF "the root could not take their connections: accept failed: Too many open files" <<<"$line" &&
    grep -qF "ulimit -n" <<<"$line"; then
    continue
  fi
  [[ $r -ne 0 ]] && grep -qF "could not reach the root" <<<"$line" && continue
  first "rank $r's error names neither the root's descriptor limit nor the root: ${line:0:400}"
done
verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" "$m" "$(within 15)"

# ---- 3. A named interface or NIC that does not exist ----

begin interface_named_in_kizuna_fabric_missing
job KIZUNA_FABRIC=tcp:nosuchif0 -- -n 2 --keep-going -- "$prog" allreduce 1
verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" \
  "$(every_rank_fails_with 2 "KIZUNA_FABRIC names interface(s) nosuchif0, which this host does not have" \
    "(it has: " "name one it has")" "$(within 20)"

begin nic_named_in_kizuna_nics_missing
# KIZUNA_NICS chooses NICs between hosts: pretend hosts of two ranks over tcp on lo.
job KIZUNA_FABRIC=tcp:lo KIZUNA_NICS=nosuchif0 -- -n 4 --keep-going -- "$prog" allreduce 2
verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" \
  "$(every_rank_fails_with 4 "KIZUNA_NICS names nosuchif0, which tcp does not have (its devices: lo)" \
    "unset KIZUNA_NICS")" "$(within 20)"

begin interface_named_in_fi_tcp_iface_missing
job KIZUNA_FABRIC=ofi FI_TCP_IFACE=nosuchif0 -- -n 2 --keep-going -- "$prog" allreduce 1
if grep -q "libfabric.* not found\|libfabric cannot be used" <<<"$out"; then
  finish "skip:libfabric is not installed here"
else
  verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" \
    "$(every_rank_fails_with 2 "FI_TCP_IFACE names nosuchif0, which this host does not have (it has: " \
      "unset FI_TCP_IFACE")" "$(within 20)"
fi

begin hca_named_in_kizuna_ib_hca_missing
# Where there is no RDMA device at all the error says so and names the setting; where there are
# some, it lists them.
job KIZUNA_FABRIC=roce KIZUNA_IB_HCA=nosuchhca0 -- -n 2 --keep-going -- "$prog" allreduce 1
if grep -q "libibverbs.* not found\|libibverbs cannot be used" <<<"$out"; then
  finish "skip:libibverbs is not installed here"
else
  verdict "$([[ $rc -ne 0 ]] || echo "the job passed")" "$(every_rank_fails_with 2 "KIZUNA_IB_HCA names")" \
    "$(grep -q "^\[0\] rank 0: FAILED: .*KIZUNA_IB_HCA names '\?nosuchhca0" <<<"$out" || echo "nosuchhca0 unnamed")" \
    "$(within 20)"
fi

# ---- 4. A unique id from another job ----

begin unique_id_of_another_job_refused_root_undisturbed
# Job A's rank 1 waits (trap_rank hold) while a stranger with A's root address and another secret
# knocks, once through KIZUNA_UNIQUE_ID and once through KIZUNA_UNIQUE_ID_FILE; then A completes.
hold="$tmp/hold"
rm -rf "$hold" && mkdir -p "$hold"
(job -- -n 2 -- "$prog" hold "$hold" >"$hold/job-a.log" 2>&1; echo "$rc" >"$hold/job-a.rc") &
job_a=$!
for ((i = 0; i < 300; ++i)); do
  [[ -s "$hold/id" ]] && break
  sleep 0.1
done
m=""
if [[ ! -s "$hold/id" ]]; then
  m="job A's rank 0 did not publish its unique id"
else
  id="$(cat "$hold/id")"
  other="${id%:*}:00000000000000000000000000000000"
  root="${id%:*}"
  root="${root#kz1:}"
  echo "$other" >"$hold/stale-id"
  for how in KIZUNA_UNIQUE_ID="$other" KIZUNA_UNIQUE_ID_FILE="$hold/stale-id"; do
    start=$(date +%s.%N)
    line="$(env RANK=1 WORLD_SIZE=2 LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 KIZUNA_TIMEOUT=10 "$how" \
      timeout -k 5 30 "$prog" allreduce 2>&1 | grep -m 1 "FAILED")"
    elapsed=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    echo "stranger (${how%%=*}), $elapsed s: $line"
    for p in "the root at $root refused this rank" "secret of this rank's unique id does not match" \
      "KIZUNA_UNIQUE_ID / KIZUNA_UNIQUE_ID_FILE"; do
      grep -qF -- "$p" <<<"$line" || first "the stranger (${how%%=*}) was not told '$p': ${line:0:400}"
    done
    first "$(within 5)"
  done
fi
touch "$hold/go"
wait "$job_a"
cat "$hold/job-a.log"
out="$(cat "$hold/job-a.log")"
verdict "$m" "$([[ "$(cat "$hold/job-a.rc" 2>/dev/null)" == 0 ]] || echo "job A failed")" "$(every_rank_ok 2)"

# ---- 5. A different library version on another rank: communicator_test's
# RanksOfAnotherMajorVersionAreRefused (it needs two builds of the library, which one job here
# cannot have). ----

echo
for ((i = 0; i < ${#names[@]}; ++i)); do echo "${results[i]%%:*} ${names[i]} (${times[i]} s)"; done
if [[ -n "$xml" ]]; then
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites tests=\"${#names[@]}\" failures=\"$fails\" name=\"traps\">"
    echo "<testsuite name=\"Traps\" tests=\"${#names[@]}\" failures=\"$fails\">"
    for ((i = 0; i < ${#names[@]}; ++i)); do
      r="${results[i]}"
      text="$(sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g' <<<"${r#*:}")"
      case "$r" in
        pass) echo "<testcase name=\"${names[i]}\" classname=\"Traps\" time=\"${times[i]}\"/>" ;;
        skip:*) echo "<testcase name=\"${names[i]}\" classname=\"Traps\" time=\"${times[i]}\" result=\"skipped\">" \
          "<skipped message=\"$text\"/></testcase>" ;;
        *) echo "<testcase name=\"${names[i]}\" classname=\"Traps\" time=\"${times[i]}\">" \
          "<failure message=\"$text\"/></testcase>" ;;
      esac
    done
    echo "</testsuite></testsuites>"
  } >"$xml"
fi
[[ $fails -eq 0 ]] && echo PASS || { echo "FAIL: $fails case(s)"; exit 1; }
