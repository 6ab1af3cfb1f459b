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
  local why
  why="$(printf '%s' "$1" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g')"
  [[ -n "$xml" ]] || exit 0
  cat >"$xml" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" errors="0" name="torch_test">
<testsuite name="Torch" tests="1" failures="0" skipped="1" errors="0">
  <testcase name="torch backend" classname="Torch" time="0"><skipped message="$why" /></testcase>
</testsuite>
</testsuites>
XML
  exit 0
}

[[ -n "$python" ]] || skip "KZ_TORCH_PYTHON is not set (./kz test sets it to the Python with torch it installs)"
# ./kz test installs torch while Bazel builds: KZ_TORCH_STATUS appears when that is over.
if [[ -n "${KZ_TORCH_STATUS:-}" ]]; then
  waited=0
  while [[ ! -f "$KZ_TORCH_STATUS" && $waited -lt 600 ]]; do
    sleep 2
    waited=$((waited + 2))
  done
  [[ -f "$KZ_TORCH_STATUS" ]] || skip "torch was still being installed after 10 minutes (the test's own limit is 15)"
  [[ "$(cat "$KZ_TORCH_STATUS")" == ok ]] || skip "$(cat "$KZ_TORCH_STATUS")"
fi
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
