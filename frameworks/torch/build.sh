#!/usr/bin/env bash
# Builds the Python package kizuna (kizuna.torch and its extension) into OUT, against the kizuna
# installed in PREFIX, with PYTHON (a Python with torch). Then PYTHONPATH=OUT imports it.
#
#   frameworks/torch/build.sh PYTHON PREFIX OUT
set -euo pipefail
python="$1" prefix="$2" out="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work="$(mktemp -d "${TMPDIR:-/tmp}/kizuna-torch-build.XXXXXX")"
trap 'rm -rf "$work"' EXIT
# setuptools writes beside its sources: build from a copy.
cp -rL "$here/setup.py" "$here/csrc" "$here/kizuna" "$work/"
mkdir -p "$out"
(cd "$work" && KIZUNA_PREFIX="$prefix" "$python" setup.py -q build_ext --build-lib "$out" --build-temp "$work/tmp") ||
  { echo "build.sh: building kizuna.torch failed" >&2; exit 1; }
cp -r "$work/kizuna/__init__.py" "$out/kizuna/__init__.py"
cp -r "$work/kizuna/torch/__init__.py" "$out/kizuna/torch/__init__.py"
echo "build.sh: kizuna.torch built in $out"
