#!/usr/bin/env bash
# The torch backend's tests (run_cases.py), after installing kizuna and building kizuna.torch the
# way a user does. Usage (Bazel passes these): torch_test.sh LIBKIZUNA HEADER...
set -euo pipefail

lib="$1"
shift
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
xml="${XML_OUTPUT_FILE:-}"
python="${KZ_TORCH_PYTHON:-}"

# A skipped case, with the reason, where there is no Python with torch.
skip() {
  echo "SKIPPED: $1"
  [[ -n "$xml" ]] || exit 0
  cat >"$xml" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" errors="0" name="torch_test">
<testsuite name="Torch" tests="1" failures="0" skipped="1" errors="0">
  <testcase name="torch backend" classname="Torch" time="0"><skipped message="$1" /></testcase>
</testsuite>
</testsuites>
XML
  exit 0
}

[[ -n "$python" ]] || skip "KZ_TORCH_PYTHON is not set (./kz test sets it to the Python with torch it installs)"
[[ -x "$python" ]] || skip "KZ_TORCH_PYTHON=$python is not an executable"
"$python" -c "import torch" 2>/dev/null || skip "KZ_TORCH_PYTHON=$python cannot import torch"

header_args=()
for h in "$@"; do header_args+=(--header "$h"); done
lib/install.sh --prefix "$tmp/prefix" --lib "$lib" "${header_args[@]}"
start=$SECONDS
TMPDIR="$tmp" frameworks/torch/build.sh "$python" "$tmp/prefix" "$tmp/python" >"$tmp/build.log" 2>&1 ||
  { cat "$tmp/build.log" >&2; echo "FAIL: building kizuna.torch" >&2; exit 1; }
echo "kizuna.torch built in $((SECONDS - start)) s"
unset XML_OUTPUT_FILE
PYTHONPATH="$tmp/python" TMPDIR="$tmp" exec "$python" tests/torch/run_cases.py "$xml"
