#!/usr/bin/env bash
# The fabric conformance suite's verdicts: unavailable -> every test skipped with the reason, exit 0;
# failed to start -> every test failed naming the status, exit non-zero.
set -uo pipefail
suite="$1"
fail() { echo "FAIL: $*"; exit 1; }
unset KIZUNA_TOPOLOGY
# The suite runs here as a child: keep its GoogleTest verdicts (expected failures included) out of
# this test's own result file, which Bazel names in XML_OUTPUT_FILE.
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE

# Only directconnect's tests: the other fabrics linked in (ofi) are available and would run.
out="$("$suite" --no-topology --gtest_filter='*/directconnect' 2>&1)"
rc=$?
echo "$out" | tail -20
[ "$rc" -eq 0 ] || fail "an unavailable fabric made the run fail (exit $rc)"
grep -q "directconnect (built-in): unavailable: KIZUNA_TOPOLOGY is not set" <<<"$out" || fail "no unavailable line in the listing"
grep -q "its tests skip" <<<"$out" || fail "the listing does not say the tests skip"
grep -q "\[  SKIPPED \] Fabrics/FabricConformance.DevicesDescribeThemselves/directconnect" <<<"$out" || fail "tests not skipped"
grep -q "\[  PASSED  \] 0 tests" <<<"$out" || fail "tests of an unavailable fabric ran"
grep -q "Fabrics/WriteConformance" <<<"$out" && fail "a capability group was instantiated for an unavailable fabric"

out="$("$suite" --topology=/nonexistent/kizuna-topology.json --gtest_filter='*/directconnect' 2>&1)"
rc=$?
echo "$out" | tail -20
[ "$rc" -ne 0 ] || fail "a fabric that failed to start let the run pass"
grep -q "BROKEN: its tests fail" <<<"$out" || fail "the listing does not flag the broken fabric"
grep -q "KIZUNA_TOPOLOGY file /nonexistent/kizuna-topology.json: cannot open" <<<"$out" || fail "the reason is not shown"
echo "PASS"
