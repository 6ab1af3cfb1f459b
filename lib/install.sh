#!/usr/bin/env bash
# Installs libkizuna into a prefix (README.md in this folder; `./kz install --prefix DIR` runs it):
#
#   install.sh --prefix DIR --lib LIBKIZUNA [--header PATH]... [--tool FILE]...
#
# PATH: a header's path in the repository, relative to the current directory (runtime/kizuna.h).
# Writes lib/libkizuna.so.X.Y.Z with its soname and development links, the headers under
# include/kizuna/ (their includes rewritten to <kizuna/...>), lib/pkgconfig/kizuna.pc, the CMake
# package lib/cmake/kizuna/ (imported target kizuna::kizuna), and the tools into bin/.
set -euo pipefail

die() {
  echo "install: $*" >&2
  exit 1
}

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
prefix="" lib=""
headers=() tools=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    --prefix | --lib | --header | --tool)
      [[ $# -ge 2 ]] || die "$1 needs a value"
      case "$1" in
        --prefix) prefix="$2" ;;
        --lib) lib="$2" ;;
        --header) headers+=("$2") ;;
        --tool) tools+=("$2") ;;
      esac
      shift 2
      ;;
    *) die "unknown argument '$1' (usage: install.sh --prefix DIR --lib FILE [--header PATH]... [--tool FILE]...)" ;;
  esac
done
[[ -n "$prefix" ]] || die "--prefix is required"
[[ -f "$lib" ]] || die "--lib: no library at '$lib'"
mkdir -p "$prefix" || die "cannot create the prefix '$prefix'"
prefix="$(cd "$prefix" && pwd)"

# The version, from the C API's header (runtime/c_api.cc checks it against the library's own).
c_header=""
for h in "${headers[@]}"; do [[ "$h" == */kizuna.h || "$h" == kizuna.h ]] && c_header="$h"; done
[[ -n "$c_header" ]] || die "no --header for kizuna.h (the C API), which holds the version"
version_part() { sed -n "s/^#define KZ_$1 \([0-9][0-9]*\)$/\1/p" "$c_header"; }
major="$(version_part MAJOR)" minor="$(version_part MINOR)" patch="$(version_part PATCH)"
[[ -n "$major" && -n "$minor" && -n "$patch" ]] || die "$c_header: no KZ_MAJOR / KZ_MINOR / KZ_PATCH"
version="$major.$minor.$patch"

# ---- the library --------------------------------------------------------------------------------
mkdir -p "$prefix/lib"
real="libkizuna.so.$version"
install -m 0755 "$lib" "$prefix/lib/$real"
ln -sfn "$real" "$prefix/lib/libkizuna.so.$major"
ln -sfn "libkizuna.so.$major" "$prefix/lib/libkizuna.so"

# ---- headers: include/kizuna/<their path>, the two APIs at the top -----------------------------
# Where each header lands, relative to include/kizuna.
dest_of() {
  case "$1" in
    runtime/kizuna.h) echo kizuna.h ;;
    runtime/communicator.h) echo communicator.h ;;
    */kizuna_device_plugin.h) echo kizuna_device_plugin.h ;;
    */kizuna_fabric_plugin.h) echo kizuna_fabric_plugin.h ;;
    */kizuna_tuner_plugin.h) echo kizuna_tuner_plugin.h ;;
    *) echo "$1" ;;
  esac
}
sed_script=""
for h in "${headers[@]}"; do
  [[ -f "$h" ]] || die "--header: no file at '$h'"
  # Each project include of an installed header becomes <kizuna/...>; dots are literal.
  sed_script+="s|#include \"${h//./\\.}\"|#include <kizuna/$(dest_of "$h")>|;"
done
rm -rf "$prefix/include/kizuna"
for h in "${headers[@]}"; do
  d="$prefix/include/kizuna/$(dest_of "$h")"
  mkdir -p "$(dirname "$d")"
  sed "$sed_script" "$h" >"$d"
  chmod 0644 "$d"
  # An include of the project's that is not installed would fail in the consumer's build: say so now.
  if grep -n '^#include "' "$d" >&2; then die "$h includes a project header that is not installed (above)"; fi
done

# ---- pkg-config and CMake ----------------------------------------------------------------------
fill() { # template output
  sed -e "s|@PREFIX@|$prefix|g" -e "s|@VERSION@|$version|g" -e "s|@MAJOR@|$major|g" "$1" >"$2"
  chmod 0644 "$2"
}
mkdir -p "$prefix/lib/pkgconfig" "$prefix/lib/cmake/kizuna"
fill "$HERE/kizuna.pc.in" "$prefix/lib/pkgconfig/kizuna.pc"
fill "$HERE/kizunaConfig.cmake.in" "$prefix/lib/cmake/kizuna/kizunaConfig.cmake"
fill "$HERE/kizunaConfigVersion.cmake.in" "$prefix/lib/cmake/kizuna/kizunaConfigVersion.cmake"

# ---- tools -------------------------------------------------------------------------------------
if [[ ${#tools[@]} -gt 0 ]]; then
  mkdir -p "$prefix/bin"
  for t in "${tools[@]}"; do
    [[ -f "$t" ]] || die "--tool: no file at '$t'"
    install -m 0755 "$t" "$prefix/bin/$(basename "$t")"
  done
fi
echo "install: kizuna $version in $prefix (lib/$real, include/kizuna/, lib/pkgconfig/kizuna.pc, lib/cmake/kizuna/${tools[*]:+, bin/})"
