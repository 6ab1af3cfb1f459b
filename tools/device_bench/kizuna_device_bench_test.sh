#!/bin/bash
# kizuna-device-bench works end to end on an emulated device and rejects bad input clearly.
set -u
bench="$1"
fail() { echo "FAIL: $*"; exit 1; }

out=$(KIZUNA_EMULATED_DEVICES=1 "$bench" --bytes 1M --inputs 2,3 --iters 2 --warmup 1 2>&1) || fail "run: $out"
echo "$out"
grep -q "^copy " <<<"$out" || fail "no copy row"
grep -q "^reduce x2 " <<<"$out" || fail "no reduce x2 row"
grep -q "^reduce x3 " <<<"$out" || fail "no reduce x3 row"

out=$(KIZUNA_EMULATED_DEVICES=1 KIZUNA_EMU_OPAQUE=1 "$bench" --bytes 64K --inputs 2 --iters 2 2>&1) ||
  fail "opaque memory: $out"
grep -q "^reduce x2 " <<<"$out" || fail "opaque memory: no reduce row"

out=$("$bench" --backend nosuch 2>&1); rc=$?
[ "$rc" = 1 ] || fail "unknown backend: exit $rc"
grep -q "backend 'nosuch' is not available" <<<"$out" || fail "unknown backend message: $out"

out=$("$bench" --bytes 12Q 2>&1); rc=$?
[ "$rc" = 2 ] || fail "bad size: exit $rc"
grep -q "not a positive size" <<<"$out" || fail "bad size message: $out"

out=$(KIZUNA_EMULATED_DEVICES=1 "$bench" --device 5 2>&1); rc=$?
[ "$rc" = 1 ] || fail "bad device: exit $rc"
grep -q "has 1 devices" <<<"$out" || fail "bad device message: $out"
echo PASS
