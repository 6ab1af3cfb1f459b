#!/usr/bin/env bash
# Cables between hosts: namespace hosts wired port to port (tools/netns, --cables: a veth pair per
# cable, no switch), with a management network for the bootstrap only, one rank per host. The tcp
# fabric's devices are then the ranks' cabled ports (fabric/tcp/README.md, "Cables"), and nothing
# else carries data (KIZUNA_FABRIC=tcp). On a ring of 4 hosts and on a 2 x 2 torus (where ranks 1
# and 2 share no cable, and the ring goes 0, 1, 3, 2; neighbours share two cables, one device each
# pair, a bundle), a ring of 6 and a 2 x 4 torus, every collective the ring serves, and AllToAll
# (forwarded by the ranks in between, the torus algorithm), must give checked results; so must
# Send/Recv to the next rank, which on the tori crosses ranks in between where the pair shares no
# cable (the transport's forwarding, the tcp fabric's relays: those ranks' logs name what they
# relayed), and, on the tori, a pairwise AllReduce (every pair, up to three cables apart) and on the
# 2 x 4 the cycles algorithm's (rings round two cycles that share no cable); a large
# AllReduce must go along the torus's lines (the torus algorithm, both directions at once); every
# rank's log must name its cables; every cable must have carried data, and the management network
# next to nothing.
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

pfx=""
trap '[[ -z $pfx ]] || "$netns" down --name "$pfx" >/dev/null 2>&1' EXIT

# Bytes an interface of host h has sent (tx) or received (rx).
bytes() { "$netns" exec "$pfx" "$1" -- cat "/sys/class/net/$2/statistics/$3_bytes"; }

# One layout: KIND SHAPE RANKS PORTS NEIGHBOURS, e.g. "ring 4 4 2 2".
run_layout() {
  local kind=$1 shape=$2 n=$3 ports=$4 neighbours=$5 name="$1-$2"
  pfx="kzcab$$-$kind"
  "$topo" --generate "$kind" "$shape" >"$tmp/$name.json" || fail "kizuna-topo --generate $kind $shape"
  local out
  out=$("$netns" up --name "$pfx" --cables "$tmp/$name.json" --mgmt 2>&1) || fail "kizuna-netns up: $out"
  declare -A before
  local h k r
  for ((h = 0; h < n; h++)); do
    for ((k = 0; k < ports; k++)); do before[$h.p$k]=$(bytes "$h" "p$k" tx) || fail "$name: host $h has no p$k"; done
    before[$h.eth0]=$(bytes "$h" eth0 tx)
  done
  local port=$((20000 + $$ % 20000)) coll pids
  local colls="allreduce reducescatter allgather broadcast reduce alltoall sendrecv" algo
  [[ $kind == torus2d ]] && colls+=" pairwise"
  [[ $name == torus2d-2x4 ]] && colls+=" cycles"
  for coll in $colls; do
    rm -f "$tmp/unique_id"
    pids=()
    algo=""
    [[ $coll == pairwise || $coll == cycles ]] && algo=$coll
    for ((r = 0; r < n; r++)); do
      env KIZUNA_TIMEOUT=60 KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT,FABRIC,COLL KIZUNA_FABRIC=tcp \
        ${algo:+KIZUNA_ALGO=$algo} \
        "KIZUNA_TOPOLOGY=$tmp/$name.json" "KIZUNA_UNIQUE_ID_FILE=$tmp/unique_id" "KIZUNA_ROOT=10.77.0.1:$port" \
        WORLD_SIZE=$n RANK=$r LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 \
        "$netns" exec "$pfx" "$r" -- timeout -k 5 120 "$bench" --coll "$(sed 's/^pairwise$\|^cycles$/allreduce/' <<<"$coll")" -b 8 -e 4M -f 64 \
        -n 2 -w 1 -c 1 \
        >"$tmp/$name.$coll.$r.log" 2>&1 &
      pids+=($!)
    done
    for ((r = 0; r < n; r++)); do
      wait "${pids[r]}" || fail "$name $coll: rank $r exited with $?: $(grep . "$tmp/$name.$coll.$r.log" | tail -n 3)"
    done
    grep -q '^# Out of bounds values : 0 OK' "$tmp/$name.$coll.0.log" ||
      fail "$name $coll: rank 0's results: $(grep '^# Out of bounds' "$tmp/$name.$coll.0.log")"
    if [[ $kind == torus2d && ($coll == sendrecv || $coll == pairwise) ]]; then
      # Some pairs share no cable: their connections went through the ranks in between.
      local forwarded relayed
      forwarded=$(cat "$tmp/$name.$coll."*.log | grep -c "forwarded: rank [0-9]* (via [0-9]")
      relayed=$(cat "$tmp/$name.$coll."*.log | grep -c "tcp: relaying ")
      [[ $forwarded -gt 0 && $relayed -gt 0 ]] ||
        fail "$name $coll: $forwarded ranks forward, $relayed sockets relayed (pairs that share no cable)"
      [[ $coll == pairwise ]] && { grep -q "plan: allreduce count=524288 float32 sum nranks=$n via pairwise" \
        "$tmp/$name.$coll.0.log" || fail "$name $coll: the AllReduce did not run pairwise"; }
      echo "$name $coll: results checked, $relayed sockets relayed by the ranks in between"
      continue
    fi
    if [[ $coll == cycles ]]; then
      grep -q "plan: allreduce count=524288 float32 sum nranks=$n via cycles" "$tmp/$name.$coll.0.log" ||
        fail "$name $coll: the AllReduce did not go round the two cycles"
    fi
    echo "$name $coll: results checked"
  done
  # Every neighbour is a device (its cables bundled) named in the log, and the large AllReduce goes
  # along the torus's lines.
  for ((r = 0; r < n; r++)); do
    local devices cables
    devices=$(grep -c "tcp: device [0-9]*: w$r:port[0-9]*:p[0-9]*\(+port[0-9]*:p[0-9]*\)* .*cabled to w[0-9]*:[0-9]* (rank [0-9]*)" \
      "$tmp/$name.allreduce.$r.log")
    [[ $devices -eq $neighbours ]] || fail "$name: rank $r names $devices cabled devices, not $neighbours"
    cables=$(grep "tcp: device [0-9]*: w$r:" "$tmp/$name.allreduce.$r.log" | grep -o ":p[0-9]*[+ ]" | sort -u | wc -l)
    [[ $cables -eq $ports ]] || fail "$name: rank $r's devices name $cables ports, not $ports"
    grep -q "plan: allreduce count=524288 float32 sum nranks=$n via torus" "$tmp/$name.allreduce.$r.log" ||
      fail "$name: rank $r's 2 MiB AllReduce did not go along the torus's lines: $(grep 'count=524288' "$tmp/$name.allreduce.$r.log")"
  done
  # The cables carried the data (a 2 MiB AllReduce alone sends 3 MiB a rank), every cable its share,
  # the management network only the bootstrap's messages.
  for ((h = 0; h < n; h++)); do
    local cabled=0 mgmt sent
    for ((k = 0; k < ports; k++)); do
      sent=$(($(bytes "$h" "p$k" tx) - before[$h.p$k]))
      [[ $sent -gt 1000000 ]] || fail "$name: host $h's cable p$k carried $sent bytes"
      cabled=$((cabled + sent))
    done
    mgmt=$(($(bytes "$h" eth0 tx) - before[$h.eth0]))
    echo "$name host $h: its cables sent $cabled B, its management interface $mgmt B"
    [[ $cabled -gt 4000000 ]] || fail "$name: host $h's cables carried $cabled bytes"
    [[ $mgmt -lt 2000000 ]] || fail "$name: host $h's management interface sent $mgmt bytes"
  done
  "$netns" down --name "$pfx" >/dev/null 2>&1
  pfx=""
}

run_layout ring 4 4 2 2
run_layout torus2d 2x2 4 4 2
run_layout ring 6 6 2 2
run_layout torus2d 2x4 8 4 3
echo PASS
