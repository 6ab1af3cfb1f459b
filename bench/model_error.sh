#!/usr/bin/env bash
# The cost model against measurement. kizuna-bench's AllReduce sweep on emulated devices, one rank
# per process under kizuna-run, at 2, 4 and 8 processes: its "pred" column is the cost model's time
# for the algorithm the engine ran, so each row gives measured / predicted. Prints a Markdown table
# (out-of-place and in-place medians) and, per rank count, how far the model is off: the median and
# the largest factor max(r, 1/r) and how many rows are within 2x.
#
#   bench/model_error.sh [--ranks "2 4 8"] [-b 8] [-e 64M] [-f 8] [--algo NAME] [--cost-file F] [--bind]
#                        [--out FILE] [--bin DIR]
#
# --algo NAME: run that algorithm (kizuna-bench --algo: ring, tree, rhd, ...) instead of the
# model's choice, to see its error too. --cost-file F: the ranks load F (KIZUNA_COST_FILE,
# kizuna-tune's), so the predictions are the tuned model's. --bind: kizuna-run --bind-to
# core:overload-allowed (rank r on CPU r mod C: two processes never share a CPU while another idles,
# which makes some cells bimodal otherwise). --bin DIR: kizuna-bench and kizuna-run
# from DIR (another build, to compare) instead of Bazel's.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
RANKS="2 4 8"
MIN=8 MAX=64M FACTOR=8 OUT="" BIN="" ALGO=auto COST="" BIND=none
while [ $# -gt 0 ]; do
  case "$1" in
    --ranks) RANKS="$2"; shift 2 ;;
    -b) MIN="$2"; shift 2 ;;
    -e) MAX="$2"; shift 2 ;;
    -f) FACTOR="$2"; shift 2 ;;
    --out) OUT="$2"; shift 2 ;;
    --bin) BIN="$2"; shift 2 ;;
    --algo) ALGO="$2"; shift 2 ;;
    --cost-file) COST="$(realpath "$2")"; shift 2 ;;
    --bind) BIND=core:overload-allowed; shift ;;
    -h|--help) sed -n 2,18p "$0"; exit 0 ;;
    *) echo "model_error.sh: unknown argument '$1' (--help lists them)" >&2; exit 2 ;;
  esac
done

if [ -n "$BIN" ]; then
  BENCH="$BIN/kizuna-bench" RUN="$BIN/kizuna-run"
  [ -x "$BENCH" ] && [ -x "$RUN" ] || { echo "model_error.sh: --bin $BIN has no kizuna-bench and kizuna-run" >&2; exit 2; }
else
  (cd "$ROOT" && bazel build //tools/bench:kizuna-bench //tools/run:kizuna-run >/dev/null 2>&1) ||
    { echo "model_error.sh: bazel build of kizuna-bench and kizuna-run failed" >&2; exit 1; }
  BENCH="$ROOT/bazel-bin/tools/bench/kizuna-bench" RUN="$ROOT/bazel-bin/tools/run/kizuna-run"
fi
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

report() {
  echo "Cost model against measurement: $(nproc) CPUs, $(date -u +%Y-%m-%dT%H:%MZ), AllReduce float32 sum,"
  echo "kizuna-bench -b $MIN -e $MAX -f $FACTOR -c 1 -n 20 -w 3 --timing median --algo $ALGO, one rank per process,"
  echo "cost model: ${COST:-the defaults}; kizuna-run --bind-to $BIND."
  echo
  echo "| ranks | size (B) | algo | predicted (µs) | out-of-place (µs) | ratio | in-place (µs) | ratio |"
  echo "|---|---|---|---|---|---|---|---|"
  for n in $RANKS; do
    if ! KIZUNA_COST_FILE="$COST" KIZUNA_EMULATED_DEVICES="$n" "$RUN" -n "$n" --timeout 600 --bind-to "$BIND" -- \
      "$BENCH" -b "$MIN" -e "$MAX" -f "$FACTOR" \
      -c 1 -n 20 -w 3 --timing median --algo "$ALGO" --csv "$TMP/n$n.csv" >"$TMP/n$n.log" 2>&1; then
      tail -20 "$TMP/n$n.log" >&2
      echo "model_error.sh: kizuna-bench at $n ranks failed (log above)" >&2
      exit 1
    fi
    # size,count,type,redop,root,algo,requested_algo,predicted_us,oop_time_us,...,ip_time_us (13th)
    awk -F, -v n="$n" 'NR > 1 {
      printf "| %d | %s | %s | %.3g | %.3g | %.2f | %.3g | %.2f |\n", n, $1, $6, $8, $9, $9 / $8, $13, $13 / $8
    }' "$TMP/n$n.csv"
  done
  echo
  echo "| ranks | rows | median factor | largest factor | within 2x |"
  echo "|---|---|---|---|---|"
  for n in $RANKS; do
    # The factor of a row: max(r, 1/r) for out-of-place and in-place alike.
    awk -F, 'NR > 1 { for (i = 9; i <= 13; i += 4) { r = $i / $8; print (r >= 1 ? r : 1 / r) } }' "$TMP/n$n.csv" |
      sort -g | awk -v n="$n" '{ f[NR] = $1; if ($1 <= 2) w++ }
        END { printf "| %d | %d | %.2f | %.2f | %d of %d |\n", n, NR, (NR % 2 ? f[(NR + 1) / 2] : (f[NR / 2] + f[NR / 2 + 1]) / 2), f[NR], w, NR }'
  done
}

if [ -n "$OUT" ]; then
  report | tee "$OUT"
else
  report
fi
