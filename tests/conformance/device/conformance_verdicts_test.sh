#!/usr/bin/env bash
# Runs the conformance binary against backends that cannot run and checks its verdicts.
set -uo pipefail
suite="$1"
unavailable_plugin="$2"
broken_plugin="$3"
fail() { echo "FAIL: $*"; exit 1; }
# The suite runs here as a child: keep its GoogleTest verdicts (expected failures included) out of
# this test's own result file, which Bazel names in XML_OUTPUT_FILE.
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
export KIZUNA_TIMEOUT=30
unset KIZUNA_DEVICE_PLUGINS

# No hardware anywhere: the emulated devices are switched off and the plugin reports
# "unavailable". Every test skips, saying why, and the run passes.
out="$(KIZUNA_EMULATED_DEVICES=0 "$suite" --plugin="$unavailable_plugin" --gtest_filter='*DeviceConformance*' 2>&1)"
rc=$?
echo "$out" | tail -n 30
[ "$rc" -eq 0 ] || fail "unavailable backends: the run should pass (skipped), exit $rc"
grep -q '\[  SKIPPED \]' <<<"$out" || fail "unavailable backends: nothing was skipped"
grep -q 'KIZUNA_EMULATED_DEVICES=0' <<<"$out" || fail "host_emulated's reason is not printed"
grep -q 'no broken_test hardware on this machine' <<<"$out" || fail "the plugin's own reason is not printed"
if grep -q '\[       OK \]' <<<"$out"; then fail "a test passed although no backend is available"; fi

# A plugin that cannot be loaded (api major 99) must fail the run, naming the versions.
out="$("$suite" --plugin="$broken_plugin" --gtest_filter='*DeviceConformance*' 2>&1)"
rc=$?
echo "$out" | tail -n 20
[ "$rc" -ne 0 ] || fail "a broken plugin passed the suite"
grep -q "plugin api version 99.0 is incompatible with kizuna's device plugin api 1." <<<"$out" || fail "the version mismatch (99 against 1) is not named"
echo PASS
