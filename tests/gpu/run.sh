#!/usr/bin/env bash
# kizuna's GPU checks, run from a folder made by tests/gpu/pack.sh on a machine with an NVIDIA GPU
# (no Bazel needed). Each check runs under a time limit, writes its log under RESULTS, and adds a
# line to RESULTS/summary.txt: name, exit status, seconds. Every wait inside kizuna has a deadline
# (KIZUNA_TIMEOUT, 60 s here), so a hang ends as an error that names what was waited for.
#
#   run.sh [RESULTS] [CHECK ...]     RESULTS default ./gpu-results; CHECKs default: all, in order
#
# Checks: backend (the cuda world: skip reason or one AllReduce), conformance (the device suite on
# cuda), shape (4 ranks on one GPU, 16 MiB per collective, with an INFO log), matrix (the whole
# collective matrix on cuda), reduce (kernel bandwidth against a device-to-device copy), allreduce
# (4 ranks on one GPU, 1 MiB - 256 MiB), processes (4 processes on one GPU).
set -uo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${1:-$PWD/gpu-results}"
shift || true
CHECKS=("$@")
[ ${#CHECKS[@]} -gt 0 ] || CHECKS=(backend conformance shape matrix reduce allreduce processes)
mkdir -p "$OUT/lib"
BIN="$HERE/bin"

# The packed libraries this machine lacks, and only those: a newer system copy wins.
for lib in "$HERE"/lib/*; do
  [ -e "$lib" ] || continue
  name="$(basename "$lib")"
  ldconfig -p 2>/dev/null | grep -q " $name " || ln -sf "$lib" "$OUT/lib/$name"
done
export LD_LIBRARY_PATH="$OUT/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export KIZUNA_TIMEOUT="${KIZUNA_TIMEOUT:-60}"

{
  echo "commit: $(cat "$HERE/COMMIT" 2>/dev/null || echo unknown)"
  echo "date: $(date -u +%FT%TZ)"
  echo "host: $(uname -srm)"
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total,compute_mode --format=csv,noheader 2>&1
  else
    echo "no nvidia-smi here"
  fi
  echo "libraries used from the pack: $(ls "$OUT/lib" | tr '\n' ' ')"
} > "$OUT/machine.txt"
cat "$OUT/machine.txt"

# check NAME LIMIT_S COMMAND...: runs it, logs to NAME.log, one summary line.
check() {
  local name="$1" limit="$2"
  shift 2
  local start rc
  start=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" > "$OUT/$name.log" 2>&1
  rc=$?
  local secs
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  local note=""
  [ "$rc" -eq 124 ] && note=" (time limit ${limit} s)"
  echo "$name: exit $rc, ${secs} s$note" | tee -a "$OUT/summary.txt"
  tail -n 3 "$OUT/$name.log" | sed 's/^/    /'
}

for c in "${CHECKS[@]}"; do
  case "$c" in
    backend)
      check backend 120 "$BIN/test_backend_test" --gtest_output="xml:$OUT/backend.xml" ;;
    conformance)
      check conformance 300 env KIZUNA_EMULATED_DEVICES=0 "$BIN/device_conformance_test" \
        --gtest_filter='*/cuda' --gtest_output="xml:$OUT/conformance.xml" ;;
    shape)
      check shape 240 env KIZUNA_TEST_BACKEND=cuda KIZUNA_DEBUG=INFO KIZUNA_DEBUG_FILE="$OUT/shape.%p.debug" \
        "$BIN/matrix_test" --gtest_filter='MatrixSixteenMiB.*:MatrixGpuShape.*' --gtest_output="xml:$OUT/shape.xml" ;;
    matrix)
      check matrix 540 env KIZUNA_TEST_BACKEND=cuda "$BIN/matrix_test" --gtest_output="xml:$OUT/matrix.xml" ;;
    reduce)
      check reduce 240 "$BIN/kizuna-device-bench" --backend cuda --bytes 256M --inputs 1,2,4,8 --dtype float32 \
        --iters 20 ;;
    allreduce)
      check allreduce 240 "$BIN/kizuna-bench" --backend cuda --devices 1 --ranks 4 -b 1M -e 256M -f 16 -n 10 -w 3 ;;
    processes)
      check processes 180 env KIZUNA_EMULATED_DEVICES=0 "$BIN/kizuna-run" -n 4 --timeout 150 -- \
        "$BIN/allreduce" 1048576 3 ;;
    *)
      echo "run.sh: unknown check '$c' (backend conformance shape matrix reduce allreduce processes)" >&2
      exit 2 ;;
  esac
done
echo "results: $OUT (summary.txt, one log per check)"
