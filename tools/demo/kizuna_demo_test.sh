#!/usr/bin/env bash
# Runs kizuna-demo the way `./kz demo` does, with small buffers, and checks what it prints.
set -uo pipefail
demo="$1"
plugin="$2"
fail() { echo "FAIL: $*"; exit 1; }

out="$("$demo" --bytes 1M --iters 2 --plugin "$plugin" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "demo exited with $rc"
grep -q 'host_emulated  *built-in  *ok, 8 devices' <<<"$out" || fail "host_emulated not listed with 8 devices"
grep -q 'host_emulated:0 .*copy .* ok$' <<<"$out" || fail "no checked copy on host_emulated:0"
grep -q 'host_emulated:1 .*reduce sum x8 .* ok$' <<<"$out" || fail "no checked 8-input reduce on host_emulated:1"
grep -Eq '^  example[a-z_]*:0 .*reduce sum x2 .* ok$' <<<"$out" || fail "the example plugin's device was not self-tested"
grep -q '^all checks passed' <<<"$out" || fail "no 'all checks passed' line"

# Configuration warnings reach the user, naming the variable.
out="$(KIZUNA_EMULATED_DEVICES=two KIZUNA_TIMOUT=3 "$demo" --bytes 64K --iters 1 --max-devices 1 2>&1)"
echo "$out"
grep -q "KIZUNA_EMULATED_DEVICES='two' is malformed" <<<"$out" || fail "malformed value not reported"
grep -q "did you mean KIZUNA_TIMEOUT" <<<"$out" || fail "misspelt variable not reported"

# No devices at all: a clear message and a non-zero exit, not a crash.
out="$(KIZUNA_EMULATED_DEVICES=0 "$demo" --bytes 64K --iters 1 2>&1)"
rc=$?
echo "$out"
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "no devices: expected a clean non-zero exit, got $rc"
grep -q 'unavailable' <<<"$out" || fail "no devices: the reason is not printed"

# A bad option is refused by the command line parser.
"$demo" --bytes 3 >/dev/null 2>&1
rc=$?
[ "$rc" -ne 0 ] && [ "$rc" -lt 128 ] || fail "--bytes 3: expected a clean non-zero exit, got $rc"
echo "PASS"
