#!/usr/bin/env bash
# KIZUNA_TRACE_FILE and kizuna-trace: 4 ranks (one per process) run the README's example through
# the staged ring with a trace each; every file holds the collectives and their steps and a
# measured clock offset; merge puts the four on one timeline; svg draws it; bad input is refused.
set -uo pipefail
trace="$1"
run="$2"
example="$3"
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
fail() { echo "FAIL: $*"; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}/trace"
mkdir -p "$tmp"

out="$(KIZUNA_EMULATED_DEVICES=4 KIZUNA_TIMEOUT=60 KIZUNA_ALGO=ring KIZUNA_TRACE_FILE="$tmp/rank%r.json" \
  "$run" -n 4 --timeout 120 -- "$example" 100003 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "the traced job: exit status $rc"
for r in 0 1 2 3; do
  f="$tmp/rank$r.json"
  [ -s "$f" ] || fail "rank $r wrote no trace"
  python3 - "$f" "$r" <<'PY' || fail "rank $r's trace"
import json, sys
t = json.load(open(sys.argv[1]))
rank = int(sys.argv[2])
other = t["otherData"]
assert other["rank"] == rank and other["clock_offset_measured"], other
cats = {e.get("cat") for e in t["traceEvents"] if e["ph"] == "X"}
for c in ("collective", "send", "recv", "reduce"):
    assert c in cats, f"no {c} events: {sorted(c for c in cats if c)}"
assert all(e["pid"] == rank for e in t["traceEvents"]), "events of another rank"
assert any("allreduce" in e["name"] and "ring" in e["name"] for e in t["traceEvents"]), "no ring AllReduce"
PY
done

out="$("$trace" merge -o "$tmp/merged.json" "$tmp"/rank{0,1,2,3}.json 2>&1)" || fail "merge: $out"
echo "$out"
grep -q "4 ranks merged" <<<"$out" || fail "merge did not say so"
python3 - "$tmp/merged.json" <<'PY' || fail "the merged trace"
import json, sys
t = json.load(open(sys.argv[1]))
xs = [e for e in t["traceEvents"] if e["ph"] == "X"]
assert {e["pid"] for e in xs} == {0, 1, 2, 3}, "not every rank"
assert min(e["ts"] for e in xs) == 0, "the timeline does not start at 0"
# The AllReduce's (operation 1) events on the four ranks overlap on the merged timeline.
ops = [e for e in xs if e["cat"] == "collective" and e["args"]["seq"] == 1]
assert len(ops) == 4, f"operation 1 on {len(ops)} ranks"
assert max(e["ts"] for e in ops) < min(e["ts"] + e["dur"] for e in ops), "operation 1 does not overlap across ranks"
PY
out="$("$trace" svg -o "$tmp/trace.svg" "$tmp/merged.json" --seq 1 2>&1)" || fail "svg: $out"
echo "$out"
grep -q "<svg" "$tmp/trace.svg" && grep -q "rank 3 ch 0" "$tmp/trace.svg" || fail "the picture has no rows for rank 3"

# Bad input: not a trace, a rank twice, a missing file.
echo '{"a": 1}' >"$tmp/bad.json"
out="$("$trace" merge -o "$tmp/x.json" "$tmp/bad.json" 2>&1)"
[ $? -eq 1 ] && grep -q "no traceEvents array" <<<"$out" || fail "a file that is not a trace: $out"
out="$("$trace" merge -o "$tmp/x.json" "$tmp/rank1.json" "$tmp/rank1.json" 2>&1)"
[ $? -eq 1 ] && grep -q "rank 1 given twice" <<<"$out" || fail "a rank twice: $out"
"$trace" merge -o "$tmp/x.json" "$tmp/nothere.json" >/dev/null 2>&1
[ $? -eq 2 ] || fail "a missing file: expected exit status 2"
echo "PASS"
