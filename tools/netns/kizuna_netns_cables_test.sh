#!/usr/bin/env bash
# kizuna-netns up --cables: a 2 x 2 torus from kizuna-topo's file becomes four hosts wired port to
# port. Each host has an interface per port, p<k>; a cable carries TCP between its two ends; a
# host two hops away is unreachable (no bridge, no routing); down removes everything. Skipped
# (exit 0, saying why) where network namespaces cannot be made (not root).
set -uo pipefail
netns="$(realpath "$1")"
topo="$(realpath "$2")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

if ! why=$("$netns" check 2>&1); then
  echo "SKIP: $why"
  exit 0
fi
pfx="kzcab$$"
trap '"$netns" down --name "$pfx" >/dev/null 2>&1' EXIT
"$topo" --generate torus2d 2x2 >"$tmp/torus.json" || fail "kizuna-topo"
out=$("$netns" up --name "$pfx" --cables "$tmp/torus.json" --env-file "$tmp/env" 2>&1) || fail "up: $out"
# shellcheck disable=SC1091
source "$tmp/env"
[[ $KZNS_HOSTS -eq 4 && $KZNS_CABLES -eq 8 ]] || fail "4 hosts and 8 cables expected: $out"
[[ $KZNS_HOST_3_NODE == w3 ]] || fail "host 3 is not node w3"
ifs=$("$netns" exec "$pfx" 0 -- ip -br link | awk '{print $1}' | sed 's/@.*//' | sort | tr '\n' ' ')
[[ $ifs == "lo p0 p1 p2 p3 " ]] || fail "host 0's interfaces: $ifs"

# TCP over every cable of host 0: a listener at the far end's port address, a connection from here.
serve='import socket,sys; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind((sys.argv[1],29700)); s.listen(1); s.settimeout(10); c,_=s.accept(); c.sendall(b"kizuna")'
dial='import socket,sys; s=socket.create_connection((sys.argv[1],29700),timeout=5); print(s.recv(16).decode())'
for port in 0 1 2 3; do
  addr_var="KZNS_HOST_0_PORT_${port}_PEER"
  peer=${!addr_var}
  far=""
  for ((h = 1; h < 4; h++)); do
    addrs_var="KZNS_HOST_${h}_ADDRS"
    [[ " ${!addrs_var} " == *" $peer "* ]] && far=$h
  done
  [[ -n $far ]] || fail "no host owns $peer"
  "$netns" exec "$pfx" "$far" -- python3 -c "$serve" "$peer" &
  sleep 0.3
  got=$("$netns" exec "$pfx" 0 -- python3 -c "$dial" "$peer" 2>&1)
  wait
  [[ $got == kizuna ]] || fail "port $port: TCP to $peer (host $far) got '$got'"
  echo "port $port: cable to host $far ($peer) carries TCP"
done
# Host 3 shares no cable with host 0.
got=$("$netns" exec "$pfx" 0 -- python3 -c "$dial" "$KZNS_HOST_3_ADDR" 2>&1)
grep -q "unreachable" <<<"$got" || fail "host 3 ($KZNS_HOST_3_ADDR) reached from host 0 without a cable: $got"

# Bad files are named before anything is made.
echo '{"nodes": [{"name": "w0", "ports": 1}], "links": [{"a": "w0:0", "b": "w9:0"}]}' >"$tmp/bad.json"
out=$("$netns" up --name "${pfx}b" --cables "$tmp/bad.json" 2>&1); [[ $? -eq 2 ]] || fail "a bad file accepted: $out"
grep -q 'link 0: "b" must be node:port' <<<"$out" || fail "bad file: unclear message: $out"

"$netns" down --name "$pfx" || fail "down"
left=$(ip netns list 2>/dev/null | grep -c "^$pfx-" || true)
[[ $left -eq 0 ]] || fail "$left namespaces left after down"

# --shape: a ring of 2 whose cables carry 0.1 Gb/s; 4 MB takes at least 0.3 s (0.32 at the rate).
"$topo" --generate ring 2 --bandwidth-gbps 0.1 >"$tmp/ring.json" || fail "kizuna-topo ring"
out=$("$netns" up --name "$pfx" --cables "$tmp/ring.json" --shape --env-file "$tmp/env2" 2>&1) || fail "up --shape: $out"
source "$tmp/env2"
sink='import socket,sys,time; s=socket.socket(); s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1); s.bind((sys.argv[1],29701)); s.listen(1); s.settimeout(20); c,_=s.accept(); t=None; n=0
while True:
    b=c.recv(1<<16)
    if not b: break
    t=t or time.monotonic(); n+=len(b)
print(n, time.monotonic()-t)'
source_='import socket,sys; s=socket.create_connection((sys.argv[1],29701),timeout=5); s.sendall(bytes(4000000)); s.close()'
peer=$KZNS_HOST_0_PORT_0_PEER
"$netns" exec "$pfx" 1 -- python3 -c "$sink" "$peer" >"$tmp/sink.out" &
sleep 0.3
"$netns" exec "$pfx" 0 -- python3 -c "$source_" "$peer" || fail "--shape: the send failed"
wait
read -r bytes seconds <"$tmp/sink.out"
echo "shaped cable: $bytes bytes in $seconds s"
[[ $bytes -eq 4000000 ]] || fail "--shape: $bytes bytes arrived"
awk -v s="$seconds" 'BEGIN { exit !(s >= 0.25) }' || fail "--shape: 4 MB in $seconds s over a 0.1 Gb/s cable"
echo "PASS"
