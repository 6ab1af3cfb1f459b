#!/usr/bin/env bash
# Cables between hosts: namespace hosts wired port to port (tools/netns, --cables: a veth pair per
# cable, no switch), with a management network for the bootstrap only, one rank per host. The tcp
# fabric's devices are then the ranks' cabled ports (fabric/tcp/README.md, "Cables"), and nothing
# else carries data (KIZUNA_FABRIC=tcp). On a ring of 4 hosts every collective the ring serves must
# give checked results; every rank's log must name its two cables; the cables must have carried
# the data, and the management network next to nothing.
#
#   cables_test.sh KIZUNA_BENCH KIZUNA_NETNS KIZUNA_TOPO
#
# Needs root and 'ip netns': skipped otherwise. The namespaces are removed on every exit path.
set -uo pipefail

[[ $# -eq 3 ]] || { echo "usage: cables_test.sh KIZUNA_BENCH KIZUNA_NETNS KIZUNA_TOPO" >&2; exit 2; }
bench="$(realpath "$1")" netns="$(realpath "$2")" topo="$(realpath "$3")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }

"$netns" check >/dev/null 2>&1
case $? in
  0) ;;
  3) echo "SKIPPED: network namespaces are not available here (root and 'ip netns' are needed)"; exit 0 ;;
  *) fail "kizuna-netns check failed" ;;
esac

n=4
pfx="kzcab$$"
trap '"$netns" down --name "$pfx" >/dev/null 2>&1' EXIT
"$topo" --generate ring "$n" >"$tmp/ring.json" || fail "kizuna-topo --generate ring $n"
out=$("$netns" up --name "$pfx" --cables "$tmp/ring.json" --mgmt 2>&1) || fail "kizuna-netns up: $out"

# Bytes an interface of host h has sent (tx) or received (rx).
bytes() { "$netns" exec "$pfx" "$1" -- cat "/sys/class/net/$2/statistics/$3_bytes"; }
declare -A before
for ((h = 0; h < n; h++)); do
  for itf in p0 p1 eth0; do before[$h.$itf]=$(bytes "$h" "$itf" tx) || fail "host $h has no $itf"; done
  before[$h.p1.rx]=$(bytes "$h" p1 rx)
done

port=$((20000 + $$ % 20000))
for coll in allreduce reducescatter allgather broadcast reduce; do
  rm -f "$tmp/unique_id"
  pids=()
  for ((r = 0; r < n; r++)); do
    env KIZUNA_TIMEOUT=60 KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT,FABRIC KIZUNA_FABRIC=tcp \
      "KIZUNA_TOPOLOGY=$tmp/ring.json" "KIZUNA_UNIQUE_ID_FILE=$tmp/unique_id" "KIZUNA_ROOT=10.77.0.1:$port" \
      WORLD_SIZE=$n RANK=$r LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
      "$netns" exec "$pfx" "$r" -- timeout -k 5 120 "$bench" --coll "$coll" -b 8 -e 4M -f 64 -n 2 -w 1 -c 1 \
      >"$tmp/$coll.$r.log" 2>&1 &
    pids+=($!)
  done
  for ((r = 0; r < n; r++)); do
    wait "${pids[r]}" || fail "$coll: rank $r exited with $?: $(grep . "$tmp/$coll.$r.log" | tail -n 3)"
  done
  grep -q '^# Out of bounds values : 0 OK' "$tmp/$coll.0.log" ||
    fail "$coll: rank 0's results: $(grep '^# Out of bounds' "$tmp/$coll.0.log")"
  echo "$coll: 4 hosts on a ring of cables, results checked"
done

# Rank r's ports: port 0 to the next host's port 1, port 1 to the previous host's port 0.
for ((r = 0; r < n; r++)); do
  log="$tmp/allreduce.$r.log"
  next=$(((r + 1) % n)) prev=$(((r + n - 1) % n))
  grep -q "tcp: device 0: w$r:port0:p0 .*cabled to w$next:1 (rank $next)" "$log" ||
    fail "rank $r: no INFO line for its cable to rank $next: $(grep 'tcp: device' "$log")"
  grep -q "tcp: device 1: w$r:port1:p1 .*cabled to w$prev:0 (rank $prev)" "$log" ||
    fail "rank $r: no INFO line for its cable to rank $prev: $(grep 'tcp: device' "$log")"
done

# Every cable carried the data: the ring sends to the next host, over port 0, and receives from
# the previous one, over port 1 (4 MiB AllReduce alone is 6 MiB a rank); the management network
# only the bootstrap's messages.
for ((h = 0; h < n; h++)); do
  out0=$(($(bytes "$h" p0 tx) - before[$h.p0])) in1=$(($(bytes "$h" p1 rx) - before[$h.p1.rx]))
  mgmt=$(($(bytes "$h" eth0 tx) - before[$h.eth0]))
  echo "host $h: p0 sent $out0 B, p1 received $in1 B, eth0 sent $mgmt B"
  [[ $out0 -gt 4000000 && $in1 -gt 4000000 ]] || fail "host $h: its cables carried too little"
  [[ $mgmt -lt 2000000 ]] || fail "host $h's management interface sent $mgmt bytes"
done
echo PASS
