#!/usr/bin/env bash
# ./kz demo-ina: in-network aggregation on one machine. Six workers and up to six aggregation
# devices (kizuna-aggd processes, standing in for switches or SmartNICs) on a direct-connect
# network of 3 ports per worker and 4 per device (the example of NTT's SWoPP 2024 talk), every port shaped to the
# same bandwidth so that this machine shows the modelled network. For M = 0 (three rings), 1, 2
# and 6 devices: the planner's layout, an AllReduce checked then timed, and the measured
# bandwidth against the rings' next to the planner's, the cost model's and the simulator's
# predictions.
#
# --hosts: the same across hosts. Every worker and device is a host of its own (a network
# namespace, tools/netns), each port a network interface wired by a veth pair to the port at the
# other end of its cable (no switch), shaped by tc; the ranks meet through a management network
# and move their data over the cables (the tcp fabric, fabric/tcp/README.md "Cables"). Needs root.
#
# usage: ina_demo.sh BIN_DIR [--mib S] [--gbps G] [--iters K] [--hosts]
#   BIN_DIR   bazel-bin (with tools/plan, tools/aggd, tools/run, tools/sim, examples/ina built; tools/netns
#             for --hosts)
#   --mib     AllReduce size in MiB (16)     --gbps   port bandwidth, Gb/s per direction (0.1)
#   --iters   timed operations per layout (2)
set -euo pipefail
bin=$1
shift
mib=16 gbps=0.1 iters=2 hosts=0
while [[ $# -gt 0 ]]; do
  case "$1" in
    --mib) mib=$2; shift 2 ;;
    --gbps) gbps=$2; shift 2 ;;
    --iters) iters=$2; shift 2 ;;
    --hosts) hosts=1; shift ;;
    *) echo "ina_demo: unknown argument '$1' (--mib S, --gbps G, --iters K, --hosts)" >&2; exit 2 ;;
  esac
done
plan=$bin/tools/plan/kizuna-plan sim=$bin/tools/sim/kizuna-sim aggd=$bin/tools/aggd/kizuna-aggd run=$bin/tools/run/kizuna-run
worker=$bin/examples/ina/ina_worker netns=$bin/tools/netns/kizuna_netns
tmp=$(mktemp -d)
# The namespaces of each layout's job (--hosts), made and removed inside run_hosts's subshell;
# removed here too in case the demo stops in between.
cleanup() {
  if [[ $hosts -eq 1 ]]; then for M in 0 1 2 6; do "$netns" down --name "kzdemo$$-$M" >/dev/null 2>&1; done; fi
  rm -rf "$tmp"
}
trap cleanup EXIT
N=6 D=3 E=4
count=$((mib * 1024 * 1024 / 4))
unset KIZUNA_ALGO KIZUNA_TOPOLOGY
if [[ $hosts -eq 1 ]]; then
  "$netns" check >/dev/null 2>&1 || { echo "ina_demo: --hosts needs root and 'ip netns' (kizuna-netns check)" >&2; exit 1; }
  export KIZUNA_FABRIC=tcp KIZUNA_TIMEOUT=120
  unset KIZUNA_EMULATED_DEVICES
  where="namespace hosts, one per worker and device, wired port to port"
else
  export KIZUNA_EMULATED_DEVICES=$N KIZUNA_FABRIC=directconnect KIZUNA_TIMEOUT=120
  where="processes of this machine"
fi

# One layout's job (M devices) across namespace hosts: rank 0's output.
run_hosts() {
  local M=$1 W=$(($N + $1)) r port=$((20000 + $$ % 20000)) pids=() pfx="kzdemo$$-$1"
  "$netns" up --name "$pfx" --cables "$tmp/t$M.json" --mgmt --shape >"$tmp/up$M.txt" 2>&1 || { cat "$tmp/up$M.txt"; return 1; }
  for ((r = 0; r < W; r++)); do
    local cmd=("$worker" bench "$count" "$iters" ina)
    [[ $r -ge $N ]] && cmd=("$aggd")
    env KIZUNA_INA_LAYOUT="$tmp/l$M.json" KIZUNA_TOPOLOGY="$tmp/t$M.json" KIZUNA_UNIQUE_ID_FILE="$tmp/id$M" \
      KIZUNA_ROOT="10.77.0.1:$port" WORLD_SIZE=$W RANK=$r LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      "$netns" exec "$pfx" "$r" -- timeout 300 "${cmd[@]}" >"$tmp/rank$M.$r.log" 2>&1 &
    pids+=($!)
  done
  local ok=0
  for ((r = 0; r < W; r++)); do wait "${pids[r]}" || ok=1; done
  "$netns" down --name "$pfx" >/dev/null 2>&1
  cat "$tmp/rank$M.0.log"
  [[ $ok -eq 0 ]] || { for ((r = 1; r < W; r++)); do tail -n 2 "$tmp/rank$M.$r.log"; done; return 1; }
}

echo "# In-network aggregation: $N workers x $D ports, aggregation devices x $E ports, every port $gbps Gb/s"
echo "# per direction (shaped), $where; AllReduce of $mib MiB float32, checked, then $iters timed."
printf "%-3s %-40s %9s %9s %9s %9s %11s %9s %9s\n" M parts pred_x meas_x algbw_GB time_ms model_ms sim_ms devices
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
  # The simulator: the engine's INA plan on the layout's cables at the ports' speed (GB/s).
  simulated=$("$sim" --network direct --layout "$tmp/l$M.json" --link-gbps "$(awk -v g="$gbps" 'BEGIN { print g / 8 }')" \
    --latency-us 0 --algo ina -b "${mib}M" -e "${mib}M" --json "$tmp/sim$M.json" >/dev/null 2>&1 &&
    python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["rows"][0]["seconds"])' "$tmp/sim$M.json" ||
    echo nan)
  # The job's ranks: the workers, then every device of the layout (one the plan leaves unused
  # has no cable and leaves at once).
  cmd=(timeout 300 "$run" -n $N -- "$worker" bench "$count" "$iters" ina)
  [[ $M -gt 0 ]] && cmd+=(: -n "$M" "$aggd")
  [[ $hosts -eq 1 ]] && cmd=(run_hosts "$M")
  if ! out=$(KIZUNA_INA_LAYOUT="$tmp/l$M.json" KIZUNA_TOPOLOGY="$tmp/t$M.json" "${cmd[@]}" 2>&1); then
    echo "$out" | tail -15
    echo "ina_demo: M=$M failed" >&2
    status=1
    continue
  fi
  line=$(echo "$out" | grep -m1 -E '(^| )bench ina ' || true)
  [[ -n "$line" ]] || { echo "$out" | tail; echo "ina_demo: M=$M printed no result" >&2; status=1; continue; }
  read -r bytes secs model <<<"${line#*bench ina }"
  [[ -z "$ring_time" ]] && ring_time=$secs
  awk -v M="$M" -v parts="$parts" -v pred="$pred" -v b="$bytes" -v t="$secs" -v m="$model" -v r="$ring_time" \
    -v u="$used" -v s="$simulated" \
    'BEGIN { printf "%-3s %-40s %9.3f %9.3f %9.3f %9.2f %11.2f %9.2f %9s\n", M, parts, pred, r / t, b / t / 1e9, t * 1e3, m * 1e3, s * 1e3, u }'
done
echo "# pred_x: the planner's bandwidth relative to $D parallel rings; meas_x: measured, relative to the M=0 run"
echo "# (the rings); model_ms: the cost model's prediction for the same layout; sim_ms: kizuna-sim's, the plan on the"
echo "# layout's cables alone (no CPU time). Every result was checked."
exit $status
