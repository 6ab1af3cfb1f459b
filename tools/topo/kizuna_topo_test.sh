#!/usr/bin/env bash
# kizuna-topo end to end: each generator's output passes --check with the expected counts; bad
# shapes, bad port maps and broken files give a clear message and a non-zero status.
set -uo pipefail
topo="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }

expect_summary() {  # kind shape workers links
  "$topo" --generate "$1" "$2" --bandwidth-gbps 200 --latency-us 0.5 >"$tmp/t.json" || fail "$1 $2: exit $?"
  out="$("$topo" --check "$tmp/t.json")" || fail "$1 $2: --check failed: $out"
  echo "$out"
  grep -q "$3 worker(s), 0 aggregator(s)" <<<"$out" || fail "$1 $2: expected $3 workers"
  grep -q ", $4 link(s)" <<<"$out" || fail "$1 $2: expected $4 links"
}
expect_summary ring 8 8 8
expect_summary torus2d 4x4 16 32
expect_summary torus3d 2x2x2 8 24
expect_summary torus1d 5 5 5
expect_summary full 4 4 6
grep -q '"bandwidth_gbps":200' "$tmp/t.json" || fail "link bandwidth not written"

"$topo" --generate ocs --workers 3 --worker-ports 2 --aggregators 1 --aggregator-ports 3 \
  --map 'w0:0=a0:0,w1:0=a0:1,w2:0=a0:2,w0:1=w1:1' >"$tmp/ocs.json" || fail "ocs: exit $?"
out="$("$topo" --check "$tmp/ocs.json")" || fail "ocs: --check failed"
grep -q "3 worker(s), 1 aggregator(s), 9 port(s) (1 unconnected), 4 link(s)" <<<"$out" || fail "ocs summary: $out"

# Bad input.
out="$("$topo" --generate torus2d 4 2>&1)"; [ $? -eq 2 ] || fail "torus2d 4 accepted"
grep -q "2 dimensions" <<<"$out" || fail "torus2d 4: unclear message: $out"
out="$("$topo" --generate hypercube 4 2>&1)"; [ $? -eq 2 ] || fail "unknown generator accepted"
grep -q "unknown topology generator" <<<"$out" || fail "unknown generator: unclear message: $out"
out="$("$topo" --generate ocs --workers 2 --worker-ports 1 --map 'w0:0=w1:0,w1:0=w0:0' 2>&1)"
[ $? -eq 2 ] || fail "a port used twice accepted"
grep -q "already used" <<<"$out" || fail "port used twice: unclear message: $out"
printf '{\n  "nodes": [\n    {"name": "w0", "ports": 1},\n    {"name": "w1", "ports": 1}\n  ],\n  "links": [\n    {"a": "w0:0", "b": "w1:3"}\n  ]\n}\n' >"$tmp/bad.json"
out="$("$topo" --check "$tmp/bad.json" 2>&1)"; [ $? -eq 1 ] || fail "a port beyond the node's accepted"
grep -q "bad.json:7: " <<<"$out" || fail "port beyond: no line number: $out"
printf '{\n  "nodes": [\n    {"name": "w0" "ports": 1}\n  ]\n}\n' >"$tmp/syntax.json"
out="$("$topo" --check "$tmp/syntax.json" 2>&1)"; [ $? -eq 1 ] || fail "a syntax error accepted"
grep -q "syntax.json:3:" <<<"$out" || fail "syntax error: no line number: $out"
out="$("$topo" --check "$tmp/missing.json" 2>&1)"; [ $? -eq 1 ] || fail "a missing file accepted"
out="$("$topo" 2>&1)"; [ $? -eq 2 ] || fail "no arguments accepted"

# detect: the server shapes of runtime/topology/testdata, this machine, a file hwloc cannot read.
servers="$(dirname "$2")"
out="$("$topo" detect --xml "$servers/server_8x8.xml" --check --expect 4 --json "$tmp/server.json")" ||
  fail "server_8x8: findings or failure: $out"
grep -q "^cuda7 .* eth8 *same PCIe switch" <<<"$out" || fail "server_8x8: cuda7 not on eth8: $out"
grep -q "PCIe switch 3 (upstream port 0000:a2:00.0)" <<<"$out" || fail "server_8x8: no tree: $out"
grep -q '"nic_name": "eth8"' "$tmp/server.json" || fail "server_8x8: JSON without the assignment"
out="$("$topo" detect --xml "$servers/server_8x8_split.xml" --check --expect 4)"; [ $? -eq 1 ] ||
  fail "split server: findings not reported by the exit status"
grep -q "^shared-nearest-nic: cuda6 and cuda7" <<<"$out" || fail "split server: no crowded NIC: $out"
grep -q "^unexpected-switches: 5 PCIe switch(es) where 4 are expected" <<<"$out" || fail "split: no count: $out"
out="$("$topo" detect --xml "$servers/remote_nic.xml" --check)"; [ $? -eq 1 ] || fail "remote NIC: no findings"
grep -q "^nic-on-other-socket: eth1 is on socket 1" <<<"$out" || fail "remote NIC: not reported: $out"
out="$("$topo" detect)" || fail "detect on this machine: $out"
grep -q "this machine" <<<"$out" || fail "detect on this machine: no summary: $out"
out="$("$topo" detect --xml "$tmp/bad.json" 2>&1)"; [ $? -eq 1 ] || fail "a file hwloc cannot read accepted"
grep -q "hwloc cannot .*bad.json" <<<"$out" || fail "bad XML: unclear message: $out"
echo "PASS"
