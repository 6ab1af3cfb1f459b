#!/usr/bin/env bash
# Fails when a dependency list names a backend package (//devices/..., //fabric/<x>/...); with
# --allow-engine, the engine (//collectives) may appear (the public API is built on it).
set -euo pipefail
deps_file="$1"
allow_engine="${2:-}"
[ -s "$deps_file" ] || { echo "dependency list $deps_file is empty: the query did not run"; exit 1; }
grep -q '^//runtime/core:core$' "$deps_file" || { echo "the query result does not list //runtime/core"; exit 1; }
pattern='^//(devices|fabric/[^:]+|collectives)[/:]'
[ "$allow_engine" = "--allow-engine" ] && pattern='^//(devices|fabric/[^:]+)[/:]'
bad=$(grep -E "$pattern" "$deps_file" || true)
if [ -n "$bad" ]; then
  echo "the dependency closure names backend (or engine) targets (backends must register themselves):"
  echo "$bad"
  exit 1
fi
echo "dependency closure: $(wc -l < "$deps_file") targets, no backend among them"
