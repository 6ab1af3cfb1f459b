#!/usr/bin/env bash
# Fails when a layer's dependency closure names a package the layer may not use.
#   check_layer_deps.sh DEPS_FILE LAYER ALLOWED
# DEPS_FILE: a genquery's result (one label per line); LAYER: the layer's name, for the messages;
# ALLOWED: an extended regular expression over package paths (without the leading //) that the
# layer may depend on: itself and the layers below it (docs/ARCHITECTURE.md, "The layers").
# Labels of other repositories (@system//..., @bazel_tools//...) are not kizuna's and are ignored,
# and so is //bazel: the build's own settings and the layers' package groups (visibility names
# them, so every closure does).
set -euo pipefail
deps_file="$1"
layer="$2"
allowed="$3"
[ -s "$deps_file" ] || { echo "$layer: dependency list $deps_file is empty: the query did not run"; exit 1; }
packages=$(grep '^//' "$deps_file" | sed -E 's#^//([^:]*):.*#\1#' | grep -vx 'bazel' | sort -u)
[ -n "$packages" ] || { echo "$layer: the query result names no package of kizuna"; exit 1; }
bad=$(echo "$packages" | grep -Ev "^(${allowed})$" || true)
if [ -n "$bad" ]; then
  echo "$layer reaches packages it may not use (a lower layer or the engine names a higher layer or a backend;"
  echo "backends register themselves, docs/ARCHITECTURE.md):"
  echo "$bad" | sed 's#^#  //#'
  echo "the targets that name them:"
  grep -E "^//($(echo "$bad" | paste -sd'|')):" "$deps_file" | sed 's#^#  #' | head -20
  exit 1
fi
echo "$layer: $(echo "$packages" | wc -l) packages in the closure, every one allowed"
