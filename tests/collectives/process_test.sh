#!/usr/bin/env bash
# The collective subset of process_collectives.cc with one rank per process under kizuna-run:
# 4 ranks over direct links on one host (KIZUNA_TOPOLOGY=full), 3 ranks over libfabric's tcp
# provider, and the README's example over 8 processes.
set -uo pipefail
run="$1"
prog="$2"
example="$3"
export KIZUNA_TIMEOUT=60
export KIZUNA_EMULATED_DEVICES=4
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }

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

out="$(KIZUNA_EMULATED_DEVICES=8 KIZUNA_TOPOLOGY=full "$run" -n 8 --timeout 240 -- "$example" 100003 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "the example over 8 processes: exit status $rc"
for r in 0 1 2 3 4 5 6 7; do grep -q "^\[$r\] rank $r of 8: 100003 floats summed in .* all 36: ok" <<<"$out" || fail "example rank $r"; done
echo "PASS"
