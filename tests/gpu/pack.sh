#!/usr/bin/env bash
# Packs kizuna's GPU checks for a machine with an NVIDIA GPU but no Bazel (the project's GPU
# machine, or an operator's node): builds the test and benchmark binaries here, with the CUDA
# backend and its kernels, and copies them, the shared libraries they need beyond the C and C++
# runtimes, and run.sh into one folder. There, `FOLDER/run.sh [RESULTS]` runs the checks.
#
#   tests/gpu/pack.sh [FOLDER]     default: .gpu in the repository root (ignored by git)
#
# Extra Bazel arguments go in KIZUNA_GPU_BAZEL_ARGS (e.g. --//devices/cuda:archs=all for GPUs older
# than sm_80). The folder stays small (stripped binaries; under 64 MiB) so it can be copied to a
# machine with a size limit.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="${1:-$ROOT/.gpu}"
cd "$ROOT"

if [ ! -x "${KIZUNA_CUDA_PATH:-/usr/local/cuda}/bin/nvcc" ]; then
  echo "pack.sh: no CUDA toolkit (nvcc) here: the CUDA backend would not be built" >&2
  exit 1
fi

TARGETS=(
  //tests/conformance/device:device_conformance_test
  //tests/collectives:matrix_test
  //tests/collectives:test_backend_test
  //tools/device_bench:kizuna-device-bench
  //tools/bench:kizuna-bench
  //tools/run:kizuna-run
  //examples/allreduce
)
# shellcheck disable=SC2086
bazel build --//bazel:cuda=on ${KIZUNA_GPU_BAZEL_ARGS:-} "${TARGETS[@]}"

rm -rf "$DEST"
mkdir -p "$DEST/bin" "$DEST/lib"
for t in "${TARGETS[@]}"; do
  path="${t#//}"
  pkg="${path%%:*}"
  name="${path##*:}"
  [ "$name" = "$path" ] && name="${pkg##*/}"
  bin="bazel-bin/$pkg/$name"
  [ -x "$bin" ] || { echo "pack.sh: $bin was not built" >&2; exit 1; }
  strip --strip-debug -o "$DEST/bin/$name" "$bin"
  # Every shared library beyond glibc, libstdc++ and libgcc: the GPU machine may lack it (run.sh
  # uses only those it lacks). The driver (libcuda) is never linked: it is opened at run time.
  ldd "$bin" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' | while read -r lib; do
    case "$(basename "$lib")" in
      libc.so.*|libm.so.*|libstdc++.so.*|libgcc_s.so.*|libpthread.so.*|libdl.so.*|librt.so.*|ld-linux*) ;;
      *) [ -e "$DEST/lib/$(basename "$lib")" ] || cp -L "$lib" "$DEST/lib/" ;;
    esac
  done
done
cp tests/gpu/run.sh "$DEST/run.sh"
chmod +x "$DEST/run.sh"
git rev-parse HEAD > "$DEST/COMMIT" 2>/dev/null || true
bytes=$(du -sb "$DEST" | cut -f1)
echo "pack.sh: $DEST ($((bytes / 1048576)) MiB): $(ls "$DEST/bin" | tr '\n' ' ')"
echo "pack.sh: libraries: $(ls "$DEST/lib" | tr '\n' ' ')"
if [ "$bytes" -gt $((64 << 20)) ]; then
  echo "pack.sh: warning: over 64 MiB" >&2
fi
