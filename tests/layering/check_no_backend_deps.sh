#!/usr/bin/env bash
# Fails when the dependency list of the core names a backend package (//devices/..., //fabric/<x>/...).
set -euo pipefail
deps_file="$1"
[ -s "$deps_file" ] || { echo "dependency list $deps_file is empty: the query did not run"; exit 1; }
grep -q '^//runtime:core$' "$deps_file" || { echo "the query result does not list //runtime:core"; exit 1; }
bad=$(grep -E '^//(devices|fabric/[^:]+|collectives)[/:]' "$deps_file" || true)
if [ -n "$bad" ]; then
  echo "the core depends on backend or engine targets (backends must register themselves):"
  echo "$bad"
  exit 1
fi
echo "core dependency closure: $(wc -l < "$deps_file") targets, no backend among them"
