#!/usr/bin/env bash
# In-network aggregation between hosts: the layout of NTT's SWoPP 2024 talk (6 workers of 3 ports,
# 2 aggregation devices of 4 ports, wired as the partial-INA planner's circuit switch would) as 8
# namespace hosts, each port a cable of its own (tools/netns --cables: a veth pair per cable, no
# switch), a management network for the bootstrap only. Workers and kizuna-aggd processes are the
# job's ranks, one per host, over the tcp fabric's cables. The INA AllReduce must give checked
# results for every size, dtype and op the worker checks; each device must have served the job to
# its end; the cables must have carried the data.
#
#   ina_cables_test.sh KIZUNA_PLAN KIZUNA_NETNS INA_WORKER KIZUNA_AGGD
#
# Needs root and 'ip netns': skipped otherwise. The namespaces are removed on every exit path.
set -uo pipefail

[[ $# -eq 4 ]] || { echo "usage: ina_cables_test.sh KIZUNA_PLAN KIZUNA_NETNS INA_WORKER KIZUNA_AGGD" >&2; exit 2; }
plan="$(realpath "$1")" netns="$(realpath "$2")" worker="$(realpath "$3")" aggd="$(realpath "$4")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }

"$netns" check >/dev/null 2>&1
case $? in
  0) ;;
  3) echo "SKIPPED: network namespaces are not available here (root and 'ip netns' are needed)"; exit 0 ;;
  *) fail "kizuna-netns check failed" ;;
esac

N=6 M=2 D=3 E=4
W=$((N + M))
pfx="kzina$$"
trap '"$netns" down --name "$pfx" >/dev/null 2>&1' EXIT

"$plan" --workers $N --aggregators $M --worker-ports $D --agg-ports $E --layout "$tmp/layout.json" \
  --topology "$tmp/topology.json" >"$tmp/plan.txt" || fail "kizuna-plan: $(tail -n 3 "$tmp/plan.txt")"
out=$("$netns" up --name "$pfx" --cables "$tmp/topology.json" --mgmt 2>&1) || fail "kizuna-netns up: $out"

# Bytes host h's cable p<k> has sent and received (a ring's circuit carries data one way).
moved() {
  "$netns" exec "$pfx" "$1" -- cat "/sys/class/net/p$2/statistics/tx_bytes" "/sys/class/net/p$2/statistics/rx_bytes" |
    awk '{ s += $1 } END { print s }'
}
# A worker's port p is the topology's ports 2p and 2p + 1 (the two directions of a ring's circuit).
ports() { [[ $1 -lt $N ]] && echo $((2 * D)) || echo $E; }
declare -A before
for ((h = 0; h < W; h++)); do
  for ((k = 0; k < $(ports $h); k++)); do
    before[$h.$k]=$(moved $h $k 2>/dev/null) || before[$h.$k]=none
  done
done

port=$((20000 + $$ % 20000))
pids=()
for ((r = 0; r < W; r++)); do
  if [[ $r -lt $N ]]; then cmd=("$worker" check); else cmd=("$aggd"); fi
  env KIZUNA_TIMEOUT=60 KIZUNA_FABRIC=tcp "KIZUNA_TOPOLOGY=$tmp/topology.json" "KIZUNA_INA_LAYOUT=$tmp/layout.json" \
    "KIZUNA_UNIQUE_ID_FILE=$tmp/unique_id" "KIZUNA_ROOT=10.77.0.1:$port" WORLD_SIZE=$W RANK=$r LOCAL_RANK=0 \
    LOCAL_WORLD_SIZE=1 "$netns" exec "$pfx" "$r" -- timeout -k 5 150 "${cmd[@]}" >"$tmp/rank$r.log" 2>&1 &
  pids+=($!)
done
for ((r = 0; r < W; r++)); do
  wait "${pids[r]}" || fail "rank $r exited with $?: $(grep . "$tmp/rank$r.log" | tail -n 3)"
done
for ((r = 0; r < N; r++)); do
  grep -q "ina_worker rank $r of $N: [0-9]* checks ok" "$tmp/rank$r.log" ||
    fail "worker $r: $(tail -n 3 "$tmp/rank$r.log")"
done
echo "$N workers: every INA AllReduce checked ($(grep -o '[0-9]* checks ok' "$tmp/rank0.log"))"
for ((r = N; r < W; r++)); do
  grep -q "kizuna-aggd: job 1: rank $r, [1-9][0-9]* operations served; ended: the job ended" "$tmp/rank$r.log" ||
    fail "aggregation device $r: $(tail -n 3 "$tmp/rank$r.log")"
  echo "aggregation device $r: $(grep -o '[0-9]* operations served' "$tmp/rank$r.log")"
done
# The cables carried the data: every cable of an aggregation device (its tree's), and each host's
# cables together. (A worker's parallel circuits to a ring neighbour are one bundle, whose small
# messages all take its first cable.)
cables=0
for ((h = 0; h < W; h++)); do
  total=0
  for ((k = 0; k < $(ports $h); k++)); do
    [[ ${before[$h.$k]} == none ]] && continue
    bytes=$(($(moved $h $k) - before[$h.$k]))
    [[ $h -lt $N || $bytes -gt 100000 ]] || fail "aggregation device $h's cable p$k carried $bytes bytes"
    total=$((total + bytes))
    cables=$((cables + 1))
  done
  [[ $total -gt 1000000 ]] || fail "host $h's cables carried $total bytes"
done
links=$(grep -c '"a"' "$tmp/topology.json")
[[ $cables -eq $((2 * links)) ]] || fail "$cables cabled ports, not the 2 x $links ends of the layout's cables"
echo "$cables cabled ports carried the data"
echo PASS
