#!/usr/bin/env bash
# Builds a fuzz target (tests/fuzz/<name>_fuzz.cc) with clang's libFuzzer, AddressSanitizer and
# UndefinedBehaviorSanitizer, for long runs guided by coverage (README.md). Not part of the build:
# Bazel and `./kz test` need only g++ and use the in-tree driver (driver.cc) instead.
#
#   tests/fuzz/libfuzzer.sh NAME [OUT_DIR]      from the repository root; prints the binary's path
#
# NAME: topology, ina_layout, unique_id or config. Needs clang 15 or later (std::source_location):
# CXX=clang++-16 by default when it is installed (`apt-get install clang-16 libclang-rt-16-dev`).
set -euo pipefail

name="${1:?usage: $0 topology|ina_layout|unique_id|config [OUT_DIR]}"
out="${2:-${TMPDIR:-/tmp}/kizuna-libfuzzer}"
if [[ -z "${CXX:-}" ]]; then
  CXX=clang++
  for v in 19 18 17 16 15; do
    if command -v "clang++-$v" > /dev/null; then CXX="clang++-$v"; break; fi
  done
fi
[[ -f tests/fuzz/driver.cc ]] || { echo "$0: run it from the repository root" >&2; exit 2; }

# What each target links beyond the ground (runtime/core).
case "$name" in
  config) srcs=() libs=() ;;
  topology) srcs=(fabric/directconnect/topology.cc fabric/directconnect/topology_generators.cc) libs=() ;;
  ina_layout)
    srcs=(collectives/ina/layout.cc fabric/directconnect/topology.cc fabric/directconnect/topology_generators.cc)
    libs=() ;;
  unique_id)
    mapfile -t srcs < <(ls runtime/bootstrap/*.cc | grep -v '_test\.cc$')
    libs=(-lcrypto) ;;
  *) echo "$0: unknown target '$name' (topology, ina_layout, unique_id, config)" >&2; exit 2 ;;
esac
mapfile -t core < <(ls runtime/core/*.cc | grep -v '_test\.cc$')

mkdir -p "$out"
"$CXX" -std=c++20 -O1 -g -fno-omit-frame-pointer -fsanitize=fuzzer,address,undefined \
  -I. "tests/fuzz/${name}_fuzz.cc" "${srcs[@]}" "${core[@]}" -lfmt "${libs[@]}" -lpthread \
  -o "$out/${name}_fuzz"
echo "$out/${name}_fuzz"
