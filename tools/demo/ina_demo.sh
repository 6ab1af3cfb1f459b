#!/usr/bin/env bash
# ./kz demo-ina: in-network aggregation on one machine. Six workers and up to six aggregation
# devices (kizuna-aggd processes, standing in for switches or SmartNICs) on a direct-connect
# network of 3 ports per worker and 4 per device (the example of NTT's SWoPP 2024 talk), every port shaped to the
# same bandwidth so that this machine shows the modelled network. For M = 0 (three rings), 1, 2
# and 6 devices: the planner's layout, an AllReduce checked then timed, and the measured
# bandwidth against the rings' next to the planner's and the cost model's predictions.
#
# usage: ina_demo.sh BIN_DIR [--mib S] [--gbps G] [--iters K]
#   BIN_DIR   bazel-bin (with tools/plan, tools/aggd, tools/run, examples/ina built)
#   --mib     AllReduce size in MiB (16)     --gbps   port bandwidth, Gb/s per direction (0.1)
#   --iters   timed operations per layout (2)
set -euo pipefail
bin=$1
shift
mib=16 gbps=0.1 iters=2
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mib) mib=$2; shift 2 ;;
    --gbps) gbps=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    *) echo "ina_demo: unknown argument '$1' (--mib S, --gbps G, --iters K)" >&2; exit 2 ;;
  esac
done
plan=$bin/tools/plan/kizuna-plan aggd=$bin/tools/aggd/kizuna-aggd run=$bin/tools/run/kizuna-run
worker=$bin/examples/ina/ina_worker
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
N=6 D=3 E=4
count=$((mib * 1024 * 1024 / 4))
export KIZUNA_EMULATED_DEVICES=$N KIZUNA_FABRIC=directconnect KIZUNA_TIMEOUT=120
unset KIZUNA_ALGO KIZUNA_TOPOLOGY

echo "# In-network aggregation: $N workers x $D ports, aggregation devices x $E ports, every port $gbps Gb/s"
echo "# per direction (shaped); AllReduce of $mib MiB float32, checked, then $iters timed."
printf "%-3s %-40s %9s %9s %9s %9s %11s %9s\n" M parts pred_x meas_x algbw_GB time_ms model_ms devices
ring_time=""
status=0
for M in 0 1 2 6; do
  "$plan" --workers $N --aggregators $M --worker-ports $D --agg-ports $E --layout "$tmp/l$M.json" \
    --topology "$tmp/t$M.json" --bandwidth-gbps "$gbps" --shaping > "$tmp/plan$M.txt"
  parts=$(awk '/^part /{on=1; next} on && NF>=5 && $1 !~ /^#/ {printf "%s%sx%s", sep, $2, $1; sep="+"} /^#/{if(on) on=0}' \
    "$tmp/plan$M.txt")
  pred=$(awk '/^bandwidth /{for(i=1;i<=NF;i++) if($i=="x"){print $(i-1); exit}}' "$tmp/plan$M.txt")
  used=$(awk '/^devices used/{print $3}' "$tmp/plan$M.txt")
  used=${used:-0}
  # The job's ranks: the workers, then every device of the layout (one the plan leaves unused
  # has no cable and leaves at once).
  cmd=("$run" -n $N -- "$worker" bench "$count" "$iters" ina)
  [[ $M -gt 0 ]] && cmd+=(: -n "$M" "$aggd")
  if ! out=$(KIZUNA_INA_LAYOUT="$tmp/l$M.json" KIZUNA_TOPOLOGY="$tmp/t$M.json" timeout 300 "${cmd[@]}" 2>&1); then
    echo "$out" | tail -15
    echo "ina_demo: M=$M failed" >&2
    status=1
    continue
  fi
  line=$(echo "$out" | grep -m1 ' bench ina ' || true)
  [[ -n "$line" ]] || { echo "$out" | tail; echo "ina_demo: M=$M printed no result" >&2; status=1; continue; }
  read -r _ _ _ bytes secs model <<<"$line"
  [[ -z "$ring_time" ]] && ring_time=$secs
  awk -v M="$M" -v parts="$parts" -v pred="$pred" -v b="$bytes" -v t="$secs" -v m="$model" -v r="$ring_time" \
    -v u="$used" 'BEGIN { printf "%-3s %-40s %9.3f %9.3f %9.3f %9.2f %11.2f %9s\n", M, parts, pred, r / t, b / t / 1e9, t * 1e3, m * 1e3, u }'
done
echo "# pred_x: the planner's bandwidth relative to $D parallel rings; meas_x: measured, relative to the M=0 run"
echo "# (the rings); model_ms: the cost model's prediction for the same layout. Every result was checked."
exit $status
