#!/usr/bin/env bash
# Installs kizuna into a temporary prefix, builds this folder's programs against the install the
# way an outside project does (CMake's find_package; pkg-config for the C one), and runs them as 2
# and 3 ranks under kizuna-run, and as 3 ranks under MPICH's and Open MPI's mpirun (nothing set but
# what the launcher sets): each rank checks its result and prints one line.
#
# Usage (Bazel passes these): cmake_consumer_test.sh KIZUNA_RUN LIBKIZUNA HEADER...
set -euo pipefail

run="$1" lib="$2"
shift 2
here="examples/cmake_consumer"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
prefix="$tmp/prefix" build="$tmp/build"

fail() {
  echo "FAIL: $*" >&2
  exit 1
}

for tool in cmake pkg-config cc c++; do
  command -v "$tool" >/dev/null || fail "$tool is not installed (./kz setup installs it)"
done

header_args=()
for h in "$@"; do header_args+=(--header "$h"); done
lib/install.sh --prefix "$prefix" --lib "$lib" "${header_args[@]}" --tool "$run" || fail "install.sh failed"
for f in lib/libkizuna.so.1 lib/libkizuna.so include/kizuna/kizuna.h include/kizuna/communicator.h \
  lib/pkgconfig/kizuna.pc lib/cmake/kizuna/kizunaConfig.cmake lib/cmake/kizuna/kizunaConfigVersion.cmake \
  bin/kizuna-run; do
  [[ -e "$prefix/$f" ]] || fail "the install has no $f"
done

# CMake: find_package(kizuna 1.0) and the imported target.
cmake -S "$here" -B "$build" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release >"$tmp/cmake.log" 2>&1 ||
  { cat "$tmp/cmake.log" >&2; fail "cmake could not configure the consumer"; }
cmake --build "$build" >>"$tmp/cmake.log" 2>&1 || { cat "$tmp/cmake.log" >&2; fail "the consumer did not build"; }
# A version of another major is not found (kizunaConfigVersion.cmake).
mkdir -p "$tmp/major"
printf 'cmake_minimum_required(VERSION 3.16)\nproject(p NONE)\nfind_package(kizuna 99 REQUIRED)\n' \
  >"$tmp/major/CMakeLists.txt"
if cmake -S "$tmp/major" -B "$tmp/major/build" -DCMAKE_PREFIX_PATH="$prefix" >"$tmp/major.log" 2>&1; then
  fail "find_package(kizuna 99) succeeded against kizuna 1"
fi
grep -q "not compatible\|version: 1" "$tmp/major.log" || { cat "$tmp/major.log" >&2; fail "no version message"; }

# pkg-config: the C program, built by hand.
export PKG_CONFIG_PATH="$prefix/lib/pkgconfig"
[[ "$(pkg-config --modversion kizuna)" == 1.* ]] || fail "pkg-config --modversion kizuna: $(pkg-config --modversion kizuna)"
# shellcheck disable=SC2046  # one word per flag
cc -std=c11 -O2 -o "$tmp/allreduce_pc" "$here/allreduce.c" $(pkg-config --cflags --libs kizuna) \
  -Wl,-rpath,"$prefix/lib" || fail "the C program did not build with pkg-config's flags"

# Each program resolves libkizuna.so.1 from the prefix, not from anywhere else.
# (Both sides resolved: the test's temporary folder may be reached through a symbolic link.)
loaded="$(ldd "$build/allreduce_cxx" | sed -n 's/.*libkizuna\.so\.1 => \(.*\) (0x.*/\1/p')"
[[ -n "$loaded" && "$(readlink -f "$loaded")" == "$(readlink -f "$prefix/lib/libkizuna.so.1")" ]] ||
  fail "allreduce_cxx does not load the installed library: $(ldd "$build/allreduce_cxx" | grep kizuna)"

export KIZUNA_EMULATED_DEVICES=4 KIZUNA_TIMEOUT=60
for n in 2 3; do
  for prog in "$build/allreduce_c" "$build/allreduce_cxx" "$tmp/allreduce_pc"; do
    out="$("$prefix/bin/kizuna-run" -n "$n" --timeout 120 -- "$prog" 2>&1)" || { echo "$out" >&2; fail "$prog, $n ranks"; }
    ok="$(grep -c "AllReduce.* ok (kizuna 1\." <<<"$out" || true)"
    [[ "$ok" -eq "$n" ]] || { echo "$out" >&2; fail "$prog, $n ranks: $ok ranks reported ok"; }
    echo "ok: $(basename "$prog"), $n ranks"
  done
done

# Under Debian's mpirun, the rendezvous needs nothing but the launcher's environment: the unique id
# goes through MPICH's PMI-1 store (PMI_FD) and Open MPI's PMIx store (PMIX_RANK).
for launcher in mpich openmpi; do
  command -v "mpirun.$launcher" >/dev/null || fail "mpirun.$launcher is not installed (./kz setup installs it)"
  extra=()
  [[ "$launcher" == openmpi ]] && extra=(--allow-run-as-root --oversubscribe -x KIZUNA_EMULATED_DEVICES -x KIZUNA_TIMEOUT)
  for prog in "$build/allreduce_c" "$build/allreduce_cxx"; do
    out="$(env -u KIZUNA_UNIQUE_ID -u KIZUNA_UNIQUE_ID_FILE -u KIZUNA_ROOT \
      timeout 120 "mpirun.$launcher" "${extra[@]}" -np 3 "$prog" 2>&1)" ||
      { echo "$out" >&2; fail "$prog under mpirun.$launcher"; }
    ok="$(grep -c "AllReduce.* ok (kizuna 1\." <<<"$out" || true)"
    [[ "$ok" -eq 3 ]] || { echo "$out" >&2; fail "$prog under mpirun.$launcher: $ok of 3 ranks reported ok"; }
    echo "ok: $(basename "$prog"), 3 ranks under mpirun.$launcher"
  done
done
echo "PASS"
