#!/usr/bin/env bash
# The library's ABI: the symbols libkizuna.so exports equal abi_symbols.txt, and its soname carries
# the version's major. An export added or lost fails here, naming it; after a deliberate change:
#
#   lib/abi_check.sh --update bazel-bin/lib/libkizuna.so.1     (from the repository root)
#
# Usage: abi_check.sh [--update] LIBRARY [SYMBOL_LIST] [KIZUNA_H]
set -euo pipefail
export LC_ALL=C  # one sort order for sort and comm

update=0
if [[ "${1:-}" == "--update" ]]; then update=1; shift; fi
lib="${1:?usage: abi_check.sh [--update] LIBRARY [SYMBOL_LIST] [KIZUNA_H]}"
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
list="${2:-$HERE/abi_symbols.txt}"
header="${3:-$HERE/../runtime/kizuna.h}"

# Defined dynamic symbols that are not local: kizuna's own (the C API's kz*, the C++ API's
# kizuna::), and any other.
# (The version node, KIZUNA_1, is an absolute symbol of its own: not counted.)
exports="$(readelf -W --dyn-syms "$lib" |
  awk '$1 ~ /^[0-9]+:$/ && $5 != "LOCAL" && $7 != "UND" && $7 != "ABS" && $8 != "" { sub(/@.*/, "", $8); print $8 }' |
  sort -u)"
ours="$(grep -E '^kz|^_Z[A-Z]*N[A-Z]*6kizuna' <<<"$exports" || true)"
if [[ "$update" -eq 1 ]]; then
  { echo "# The symbols libkizuna.so exports (lib/abi_check.sh writes and checks this list), mangled."
    echo "$ours"; } >"$list"
  echo "abi: $(wc -l <<<"$ours") symbols written to $list"
  exit 0
fi

status=0
# The standard library's template instances that libstdc++ exports as weak symbols too are
# allowed; anything else foreign is an accidental export.
foreign="$(grep -vE '^kz|^_Z[A-Z]*N[A-Z]*6kizuna|^_ZN[K]?St|^_ZNKSt|^_ZSt' <<<"$exports" || true)"
if [[ -n "$foreign" ]]; then
  echo "abi: $lib exports symbols that are neither kizuna's API nor the standard library's:" >&2
  c++filt <<<"$foreign" | sed 's/^/  /' >&2
  status=1
fi
want="$(grep -v '^#' "$list" | sort -u)"
added="$(comm -13 <(echo "$want") <(echo "$ours"))"
lost="$(comm -23 <(echo "$want") <(echo "$ours"))"
if [[ -n "$added" ]]; then
  echo "abi: exported but not in $(basename "$list") (an accidental export, or a new API: then --update):" >&2
  c++filt <<<"$added" | sed 's/^/  + /' >&2
  status=1
fi
if [[ -n "$lost" ]]; then
  echo "abi: in $(basename "$list") but no longer exported (an ABI break: programs built against it fail to load):" >&2
  c++filt <<<"$lost" | sed 's/^/  - /' >&2
  status=1
fi
major="$(sed -n 's/^#define KZ_MAJOR \([0-9][0-9]*\)$/\1/p' "$header")"
soname="$(readelf -d "$lib" | sed -n 's/.*Library soname: \[\(.*\)\]/\1/p')"
if [[ "$soname" != "libkizuna.so.$major" ]]; then
  echo "abi: soname is '$soname', expected libkizuna.so.$major (KZ_MAJOR in kizuna.h)" >&2
  status=1
fi
[[ "$status" -eq 0 ]] && echo "abi: $(wc -l <<<"$ours") symbols as listed, soname $soname"
exit "$status"
