#!/usr/bin/env bash
# The layering check itself: it must fail on a closure that reaches up or names a backend, and
# pass on one that stays in its layers (so a green layering test means something).
set -euo pipefail
check="$1"
dir="${TEST_TMPDIR:-$(mktemp -d)}"
printf '//runtime/core:core\n//runtime/device:device\n@system//:fmt\n//bazel:programs\n' > "$dir/good"
printf '//runtime/core:core\n//runtime/device:device\n//devices/cuda:cuda\n' > "$dir/backend"
printf '//runtime/core:core\n//collectives/executor:executor\n' > "$dir/up"
"$check" "$dir/good" device_layer 'runtime/core|runtime/device' > "$dir/out" || { cat "$dir/out"; echo "a closure within its layers failed"; exit 1; }
for bad in backend up; do
  if "$check" "$dir/$bad" device_layer 'runtime/core|runtime/device' > "$dir/out"; then
    cat "$dir/out"
    echo "a closure that reaches $bad passed"
    exit 1
  fi
  grep -q "may not use" "$dir/out" || { cat "$dir/out"; echo "no explanation for $bad"; exit 1; }
done
grep -q "//collectives/executor" "$dir/out" || { cat "$dir/out"; echo "the offending package is not named"; exit 1; }
echo "the layering check fails on a backend and on a higher layer, and passes a closure within its layers"
