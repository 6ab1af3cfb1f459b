#!/usr/bin/env bash
# The collective subset of process_collectives.cc with one rank per process under kizuna-run:
# 4 ranks over direct links on one host (KIZUNA_TOPOLOGY=full), 3 ranks over libfabric's tcp
# provider, the fused AllReduce between processes (and ranks leaving it), and the README's
# example over 8 processes.
set -uo pipefail
run="$1"
prog="$2"
example="$3"
export KIZUNA_TIMEOUT=60
export KIZUNA_EMULATED_DEVICES=4
# The jobs' status sockets (runtime/job_status.h) in a folder of the test's: a rank that is made
# to exit or is killed leaves its socket behind.
KIZUNA_RUN_DIR="$(mktemp -d /tmp/kz-process.XXXXXX)"
trap 'rm -rf "$KIZUNA_RUN_DIR"' EXIT
export KIZUNA_RUN_DIR
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }
# Runs process_collectives' mode $1 on 3 ranks (the rest: NAME=VALUE environment), whose ranks
# call AllReduces of different sizes: every rank must name the mismatch, all within 30 s.
expect_mismatch() {
  local mode=$1 start out rc elapsed r
  shift
  start=$(date +%s)
  out="$(env "$@" "$run" -n 3 --timeout 120 -- "$prog" "$mode" 2>&1)"
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  echo "$out"
  [ "$rc" -eq 0 ] || fail "$mode: exit status $rc"
  [ "$elapsed" -lt 30 ] || fail "$mode: took ${elapsed}s (a rank waited for its deadline)"
  for r in 0 1 2; do grep -q "^\[$r\] rank $r: mismatch named after" <<<"$out" || fail "$mode rank $r"; done
}

out="$(KIZUNA_FABRIC=directconnect KIZUNA_TOPOLOGY=full "$run" -n 4 --timeout 240 -- "$prog" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "4 ranks over directconnect: exit status $rc"
for r in 0 1 2 3; do grep -q "^\[$r\] rank $r of 4: [0-9]* cases ok" <<<"$out" || fail "rank $r did not finish"; done

out="$(KIZUNA_FABRIC=ofi FI_PROVIDER=tcp FI_TCP_IFACE=lo "$run" -n 3 --timeout 240 -- "$prog" 2>&1)"
rc=$?
echo "$out"
if grep -q "none of the fabrics named in KIZUNA_FABRIC is usable" <<<"$out"; then
  echo "ofi unavailable here: skipped the ofi run"
else
  [ "$rc" -eq 0 ] || fail "3 ranks over ofi: exit status $rc"
  for r in 0 1 2; do grep -q "^\[$r\] rank $r of 3: [0-9]* cases ok" <<<"$out" || fail "rank $r did not finish (ofi)"; done
fi

# Every rank on a host of its own (as it claims): the matrix over the network fabric, small
# collectives on the calling thread with their first transfers inside the operation headers, large
# transfers straight between the caller's buffers and the sockets.
logs="${TEST_TMPDIR:-$(mktemp -d)}/hosts-logs"
mkdir -p "$logs"
out="$(KIZUNA_FABRIC=tcp:lo KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=COLL KIZUNA_DEBUG_FILE="$logs/%p.log" "$run" -n 3 --timeout 240 -- "$prog" hosts 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "3 ranks on pretend hosts over tcp: exit status $rc"
for r in 0 1 2; do grep -q "^\[$r\] rank $r of 3: [0-9]* cases ok" <<<"$out" || fail "rank $r did not finish (hosts)"; done
grep -qs "collectives up to [0-9]* KiB run on the calling thread" "$logs"/*.log ||
  fail "hosts: no collective ran on the calling thread"
# 40009 floats take transfers over 16 KiB: tcp sends them from the caller's buffers and receives
# them into them, no staging copy (the matrix checks the results).
grep -qs "transfers of 16 KiB and more go from and into the caller's buffers over tcp" "$logs"/*.log ||
  fail "hosts: no transfer went from or into the caller's buffers"
# AllReduces of different sizes between pretend hosts (8 B in the operation header, 16 KiB and
# 1 MiB on the calling thread): every rank names the mismatch at once.
expect_mismatch hosts-mismatch KIZUNA_FABRIC=tcp:lo
# Hosts of two ranks (2 + 1, then 2 + 2): hier:fused among the algorithms the matrix runs, its host
# level through each host's group.
for n in 3 4; do
  rm -f "$logs"/*.log
  out="$(KIZUNA_FABRIC=tcp:lo KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT KIZUNA_DEBUG_FILE="$logs/%p.log" "$run" -n $n --timeout 240 -- "$prog" hosts 2 2>&1)"
  rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || fail "$n ranks on pretend hosts of 2 over tcp: exit status $rc"
  grep -qs "hier:fused available" "$logs"/*.log || fail "hosts of 2 ($n ranks): hier:fused not available"
  for ((r = 0; r < n; r++)); do
    grep -q "^\[$r\] rank $r of $n: [0-9]* cases ok" <<<"$out" || fail "rank $r did not finish (hosts of 2, $n ranks)"
  done
done

# The fused AllReduce between processes (collectives/direct/same_host_group.h): 3 ranks, every shape; the same
# with opaque device memory (the CPU cannot touch it: the streams translate imported addresses).
# Frees wait for the device's streams, as cudaFree does (KIZUNA_EMU_SYNC_FREE): a mapping the
# group drops during an operation, while the caller's stream is held, would fail the run.
for opaque in 0 1; do
  out="$(KIZUNA_EMU_OPAQUE=$opaque KIZUNA_EMU_SYNC_FREE=1 "$run" -n 3 --timeout 240 -- "$prog" fused 2>&1)"
  rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || fail "fused between 3 processes (opaque=$opaque): exit status $rc"
  for r in 0 1 2; do grep -q "^\[$r\] rank $r of 3: [0-9]* fused cases ok" <<<"$out" || fail "fused rank $r (opaque=$opaque)"; done
done

# Plain host memory (malloc), as MPI users pass it: 3 processes, fused on the calling thread.
out="$("$run" -n 3 --timeout 240 -- "$prog" host 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "host memory between 3 processes: exit status $rc"
for r in 0 1 2; do grep -q "^\[$r\] rank $r of 3: [0-9]* host-memory cases ok" <<<"$out" || fail "host memory rank $r"; done
# One rank with device memory, the others with host memory: refused on every rank, naming it.
out="$("$run" -n 3 --timeout 120 -- "$prog" host-mixed 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "mixed host and device memory: exit status $rc"
for r in 0 1 2; do grep -q "^\[$r\] rank $r: mixed memory refused as expected" <<<"$out" || fail "mixed memory rank $r"; done

# AllReduces of different sizes on different ranks (one-line, one-shot slot, mapped): every rank
# names the mismatch at once.
expect_mismatch mismatch

# A rank that aborts, and one whose process ends, before a fused call: the others fail at once
# (well before KIZUNA_TIMEOUT) naming it.
for how in abort exit; do
  start=$(date +%s)
  out="$("$run" -n 3 --timeout 120 -- "$prog" "fused-$how" 1 2>&1)"
  rc=$?
  elapsed=$(( $(date +%s) - start ))
  echo "$out"
  [ "$rc" -eq 0 ] || fail "fused-$how: exit status $rc"
  [ "$elapsed" -lt 30 ] || fail "fused-$how: took ${elapsed}s (the others waited for their timeout)"
  for r in 0 2; do grep -q "^\[$r\] rank $r: fused failed after .* as expected: .*rank 1" <<<"$out" || fail "fused-$how: rank $r"; done
done

# A rank frozen (SIGSTOP) before a collective on the staged path: the others fail at their
# deadline naming it as the rank that does not answer (kizuna-run then kills it at its timeout).
out="$(KIZUNA_ALGO=ring KIZUNA_TIMEOUT=3 "$run" -n 3 --timeout 8 -- "$prog" frozen 1 2>&1)"
echo "$out"
for r in 0 2; do grep -q "^\[$r\] rank $r: frozen rank 1 named after" <<<"$out" || fail "frozen: rank $r did not name rank 1"; done

out="$(KIZUNA_EMULATED_DEVICES=8 KIZUNA_TOPOLOGY=full "$run" -n 8 --timeout 240 -- "$example" 100003 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "the example over 8 processes: exit status $rc"
for r in 0 1 2 3 4 5 6 7; do grep -q "^\[$r\] rank $r of 8: 100003 floats summed in .* all 36: ok" <<<"$out" || fail "example rank $r"; done
echo "PASS"
