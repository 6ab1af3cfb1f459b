#!/usr/bin/env bash
# kizuna-bench end to end on 4 emulated devices: a tiny sweep (8 B .. 64 KiB, -n 2 -w 1) of every
# collective with nccl-tests' header, columns and footer and no wrong element; --algo all (several
# rows per size); every type and op; the --json and --csv files parse; bad flags fail with a clear
# message and exit status 2; a failing device fails the run (exit 1, no hang); the opaque emulated
# memory (KIZUNA_EMU_OPAQUE=1: the CPU cannot read device memory, so fills and checks go through
# AllocateHost and stream copies; --buffers host is refused); one rank per process under kizuna-run.
set -uo pipefail
bench="$1"
run="$2"
fail() { echo "FAIL: $*"; exit 1; }
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export KIZUNA_EMULATED_DEVICES=4
unset KIZUNA_ALGO KIZUNA_EMU_OPAQUE KIZUNA_UNIQUE_ID RANK WORLD_SIZE
sweep=(--ranks 4 -b 8 -e 64K -n 2 -w 1)  # with -f 2: 14 sizes

# The rows of a table: lines that start with a size.
rows() { grep -E '^ +[0-9]+ +[0-9]+ ' <<<"$1"; }

# Checks one table: header, N rows, 0 wrong everywhere, the footer.
check_table() {
  local what="$1" out="$2" want_rows="$3"
  grep -Eq '^# +size +count +type +redop +root +time +algbw +busbw +#wrong +time +algbw +busbw +#wrong +algo +pred$' \
    <<<"$out" || fail "$what: no column header"
  grep -Eq '^# +\(B\) +\(elements\) +\(us\) +\(GB/s\) +\(GB/s\) +\(us\) +\(GB/s\) +\(GB/s\) +\(us\)$' <<<"$out" ||
    fail "$what: no units line"
  grep -q '^# Using devices$' <<<"$out" || fail "$what: no device list"
  [ "$(rows "$out" | wc -l)" -eq "$want_rows" ] || fail "$what: expected $want_rows rows"
  # 15 columns; #wrong (9th and 13th) is 0, or N/A for a placement the collective does not have.
  rows "$out" | awk -v what="$what" '
    NF != 15 { print "FAIL: " what ": a row has " NF " columns: " $0; bad = 1 }
    $9 != "0" || ($13 != "0" && $13 != "N/A") { print "FAIL: " what ": wrong values: " $0; bad = 1 }
    END { exit bad }' || exit 1
  grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "$what: footer: out of bounds values not 0 OK"
  grep -Eq '^# Avg bus bandwidth +: [0-9.e+-]+$' <<<"$out" || fail "$what: footer: no average bus bandwidth"
}

# ---- allreduce, with every file format ----
out="$("$bench" "${sweep[@]}" -f 2 --coll allreduce --json "$tmp/ar.json" --csv "$tmp/ar.csv" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "allreduce: exit $rc"
check_table allreduce "$out" 14
grep -q '^# nThread 1 nGpus 4 minBytes 8 maxBytes 65536 step: 2(factor) warmup iters: 1 iters: 2 ' <<<"$out" ||
  fail "allreduce: no nccl-tests parameter line"
[ "$(grep -Ec '^#  Rank  [0-3] Group  0 Pid +[0-9]+ on .* device  [0-3] \[host_emulated:[0-3]\] ' <<<"$out")" -eq 4 ] ||
  fail "allreduce: expected a device line per rank"
rows "$out" | awk '$3 != "float" || $4 != "sum" || $5 != "-1" || $14 == "-" || $15 == "-" { exit 1 }' ||
  fail "allreduce: type, redop, root, algo or prediction columns"
grep -Eq '^ +8 +2 +float +sum +-1 ' <<<"$out" || fail "allreduce: 8 bytes are not 2 floats"
python3 - "$tmp/ar.json" "$tmp/ar.csv" <<'EOF' || fail "allreduce: --json / --csv do not parse as expected"
import csv, json, sys
j = json.load(open(sys.argv[1]))
assert j["collective"] == "allreduce" and j["ranks"] == 4 and j["error"] is None, j
rows = j["rows"]
assert len(rows) == 14, len(rows)
assert [r["size"] for r in rows] == [8 << k for k in range(14)], rows
for r in rows:
    for p in ("out_of_place", "in_place"):
        m = r[p]
        assert m["wrong"] == 0 and m["time_us"] > 0 and m["busbw_gbps"] >= 0, r
        assert abs(m["busbw_gbps"] - m["algbw_gbps"] * 1.5) <= 1e-9 * max(1, m["busbw_gbps"]), r
    assert r["algo"] in ("ring", "tree", "rhd", "rd", "pairwise", "fused"), r
    assert r["predicted_us"] is None or r["predicted_us"] > 0, r
assert j["out_of_bounds"] == 0
c = list(csv.DictReader(open(sys.argv[2])))
assert len(c) == 14, len(c)
assert c[0]["size"] == "8" and c[0]["type"] == "float" and c[0]["oop_wrong"] == "0" and c[0]["ip_wrong"] == "0", c[0]
EOF

# ---- the other collectives (reduce over fewer sizes: it shares broadcast's and allreduce's paths) ----
for coll in reducescatter allgather broadcast reduce alltoall sendrecv; do
  sizes=14
  [ "$coll" = reduce ] && sizes=5
  out="$("$bench" "${sweep[@]}" -f $((sizes == 14 ? 2 : 8)) --coll "$coll" -r 2 2>&1)"
  rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || fail "$coll: exit $rc"
  check_table "$coll" "$out" "$sizes"
  case "$coll" in
    broadcast | reduce) root=2 ;;
    *) root=-1 ;;
  esac
  rows "$out" | awk -v root="$root" '$5 != root { exit 1 }' || fail "$coll: root column is not $root"
  case "$coll" in
    alltoall | sendrecv) rows "$out" | awk '$10 != "N/A" { exit 1 }' || fail "$coll: in place should be N/A" ;;
    *) rows "$out" | awk '$13 != "0" { exit 1 }' || fail "$coll: in place not checked" ;;
  esac
done
# The collective given to -o, as nccl-tests scripts do.
out="$("$bench" --ranks 4 -b 1K -e 1K -n 1 -w 0 -o allgather 2>&1)" || fail "-o allgather: exit $?: $out"
grep -Eq '^ +1024 +64 +float +none +-1 ' <<<"$out" || fail "-o allgather: expected a 1 KiB allgather row: $out"

# ---- every algorithm, every type and op ----
out="$("$bench" --ranks 4 -b 1K -e 4K -f 2 -n 2 -w 1 --algo all --plot "$tmp/all.svg" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--algo all: exit $rc"
# The plot: an SVG with one measured line per algorithm of the table, and its prediction where the
# model has one (not the torus's on a fully connected shape).
algos="$(rows "$out" | awk '{ print $14 }' | sort -u | wc -l)"
predicted="$(rows "$out" | awk '$15 != "-" { print $14 }' | sort -u | wc -l)"
python3 - "$tmp/all.svg" "$algos" "$predicted" <<'EOF' || fail "--plot: the SVG is not one line per algorithm"
import sys, xml.etree.ElementTree as ET
root = ET.parse(sys.argv[1]).getroot()
lines = [e for e in root.iter() if e.tag.endswith("polyline")]
measured = [e for e in lines if e.get("class") == "measured"]
predicted = [e for e in lines if e.get("class") == "predicted"]
assert len(measured) == int(sys.argv[2]), (len(measured), sys.argv[2])
assert len(predicted) == int(sys.argv[3]), (len(predicted), sys.argv[3])
for e in measured:
    assert len(e.get("points").split()) == 3, e.get("points")  # 1, 2 and 4 KiB
EOF
grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "--algo all: wrong values"
for size in 1024 2048 4096; do
  n="$(rows "$out" | awk -v s="$size" '$1 == s' | wc -l)"
  [ "$n" -ge 3 ] || fail "--algo all: $n rows for $size bytes, expected one per algorithm (3 or more)"
  [ "$(rows "$out" | awk -v s="$size" '$1 == s { print $14 }' | sort -u | wc -l)" -eq "$n" ] ||
    fail "--algo all: the rows for $size bytes do not name distinct algorithms"
done
out="$("$bench" --ranks 3 -b 96 -e 96 -n 1 -w 0 -d all -o all 2>&1)"
rc=$?
[ "$rc" -eq 0 ] || fail "-d all -o all: exit $rc: $out"
[ "$(rows "$out" | wc -l)" -eq 50 ] || fail "-d all -o all: expected 10 types x 5 ops: $out"
grep -q '^# Out of bounds values : 0 OK$' <<<"$out" || fail "-d all -o all: wrong values: $out"
for t in half bfloat16 float double int8 uint8 int32 uint32 int64 uint64; do
  for op in sum prod min max avg; do
    grep -Eq "^ +96 +[0-9]+ +$t +$op " <<<"$out" || fail "-d all -o all: no $t $op row"
  done
done

# ---- bad flags: a clear message, exit status 2 ----
expect_usage_error() {
  local pattern="$1"
  shift
  local out rc
  out="$("$bench" "$@" 2>&1)"
  rc=$?
  [ "$rc" -eq 2 ] || fail "'$*': expected exit status 2, got $rc: $out"
  grep -q -- "$pattern" <<<"$out" || fail "'$*': the message does not say '$pattern': $out"
}
expect_usage_error "--coll 'nosuch': unknown collective" --coll nosuch
expect_usage_error "-o 'sumx': unknown reduction" -o sumx
expect_usage_error "-d 'float17': unknown type" -d float17
expect_usage_error "-b 65536 is larger than -e 8" -b 64K -e 8
expect_usage_error "-e '12X': unknown suffix" -e 12X
expect_usage_error "-f 2 and -i 4: give one of them" -f 2 -i 4
expect_usage_error "-n 0: expected" -n 0
expect_usage_error "--algo 'nosuch': unknown algorithm" --algo nosuch
expect_usage_error "--buffers 'nowhere': expected device or host" --buffers nowhere
expect_usage_error "--mode 'fast': expected auto, threads or procs" --mode fast
expect_usage_error "--mode procs: no launcher found" --mode procs
expect_usage_error "--backend nosuch: not available" --backend nosuch
expect_usage_error "--devices 9: backend host_emulated has 4 device(s)" --devices 9
expect_usage_error "--coll allreduce and -o allgather name different collectives" --coll allreduce -o allgather
expect_usage_error "-r 7: expected a rank, 0..3" --ranks 4 --coll broadcast -r 7 -b 8 -e 8
expect_usage_error "sendrecv needs 2 ranks or more" --ranks 1 --coll sendrecv -b 8 -e 8
expect_usage_error "--json $tmp/no/such/dir/x.json: cannot open" --ranks 2 -b 8 -e 8 --json "$tmp/no/such/dir/x.json"
expect_usage_error "--plot $tmp/no/such/dir/x.svg: cannot open" --ranks 2 -b 8 -e 8 --plot "$tmp/no/such/dir/x.svg"
expect_usage_error "bogus" --bogus

# ---- a device that fails: exit 1 with the error, promptly ----
# Operations are numbered as they are enqueued on any stream. With memory the CPU reaches, how many
# a call enqueues depends on timing (an idle stream needs no callback, and the CPU does the copies),
# so the run uses opaque memory: the fills are 8 copies (2 buffers of 4 ranks), and every call
# enqueues its copies and reduces on the streams, so operation 12 falls in the first call.
out="$(KIZUNA_EMU_OPAQUE=1 KIZUNA_TIMEOUT=20 KIZUNA_EMU_FAIL_STREAM_OP=12 timeout 60 "$bench" --ranks 4 -b 1K -e 1K -n 5 -w 1 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 1 ] || fail "injected device fault: expected exit status 1, got $rc"
grep -q '^kizuna-bench: .*allreduce.*injected fault' <<<"$out" || fail "injected device fault: the cause is not reported"

# ---- opaque device memory: fills and checks through AllocateHost ----
for coll in allreduce reducescatter allgather; do
  out="$(KIZUNA_EMU_OPAQUE=1 "$bench" --ranks 4 -b 8 -e 64K -f 8 -n 2 -w 1 --coll "$coll" 2>&1)"
  rc=$?
  echo "$out"
  [ "$rc" -eq 0 ] || fail "opaque $coll: exit $rc"
  check_table "opaque $coll" "$out" 5
  grep -q 'staged through AllocateHost' <<<"$out" || fail "opaque $coll: the header does not say how data is staged"
done
out="$(KIZUNA_EMU_OPAQUE=1 "$bench" --ranks 4 -b 8 -e 8 --buffers host 2>&1)"
rc=$?
[ "$rc" -eq 2 ] || fail "opaque --buffers host: expected exit status 2, got $rc: $out"
grep -q 'not host accessible' <<<"$out" || fail "opaque --buffers host: unclear message: $out"

# ---- host buffers on host-accessible devices: measured, or refused with the reason ----
out="$("$bench" --ranks 4 -b 8 -e 4K -f 8 -n 2 -w 1 --buffers host 2>&1)"
rc=$?
echo "$out"
if [ "$rc" -eq 0 ]; then
  check_table "--buffers host" "$out" 4
else
  [ "$rc" -eq 2 ] || fail "--buffers host: expected success or exit status 2, got $rc"
  grep -q 'does not take host memory from the C allocator' <<<"$out" || fail "--buffers host: unclear refusal"
fi

# ---- one rank per process, under kizuna-run ----
out="$("$run" -n 2 --timeout 60 -- "$bench" -b 8 -e 4K -f 8 -n 2 -w 1 --coll allreduce 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "kizuna-run -n 2: exit $rc"
grep -q '^\[0\] # kizuna-bench: allreduce over 2 rank(s), procs mode' <<<"$out" || fail "procs: no header from rank 0"
[ "$(grep -cE '^\[0\] +[0-9]+ +[0-9]+ +float +sum ' <<<"$out")" -eq 4 ] || fail "procs: expected 4 rows from rank 0"
grep -qE '^\[1\] +[0-9]+ ' <<<"$out" && fail "procs: rank 1 printed rows"
grep -q '^\[0\] # Out of bounds values : 0 OK$' <<<"$out" || fail "procs: wrong values"
[ "$(grep -c '^\[0\] #  Rank  [01] ' <<<"$out")" -eq 2 ] || fail "procs: expected both ranks' device lines"

# ---- a device that fails between processes (fused, the default there): the fault is met on the
# device's stream and reported, not skipped by the CPU doing the part ----
out="$(KIZUNA_TIMEOUT=20 KIZUNA_EMU_FAIL_STREAM_OP=10 "$run" -n 2 --timeout 60 -- "$bench" -b 64K -e 64K -n 5 -w 1 \
  --coll allreduce 2>&1)"
rc=$?
echo "$out"
[ "$rc" -ne 0 ] || fail "injected device fault between processes: expected a failure, got exit 0"
grep -q 'kizuna-bench: .*allreduce.*injected fault' <<<"$out" || fail "injected fault between processes: cause not reported"

# ---- --timing median (each call after a barrier, the median of the slowest rank's times) ----
out="$("$run" -n 2 --timeout 60 -- "$bench" -b 8 -e 64K -f 8 -n 5 -w 1 --timing median --json "$tmp/median.json" 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--timing median: exit $rc"
[ "$(grep -cE '^\[0\] +[0-9]+ +[0-9]+ +float +sum ' <<<"$out")" -eq 5 ] || fail "--timing median: expected 5 rows"
grep -q '"timing": *"median"' "$tmp/median.json" || fail "--timing median: the JSON does not say so"
"$bench" --timing mean >"$tmp/timing" 2>&1; rc=$?
[ "$rc" -eq 2 ] && grep -q 'timing' "$tmp/timing" || fail "--timing mean: expected a refusal naming the flag, got $rc"

# ---- --placement out: the out-of-place columns only, the in-place ones N/A ----
out="$("$bench" --ranks 2 -b 1K -e 1K -n 2 -w 1 --placement out 2>&1)"
rc=$?
echo "$out"
[ "$rc" -eq 0 ] || fail "--placement out: exit $rc"
[ "$(rows "$out" | wc -l)" -eq 1 ] || fail "--placement out: expected one row"
rows "$out" | awk 'NF < 15 || $6 == "N/A" || $10 != "N/A" || $13 != "N/A" { exit 1 }' ||
  fail "--placement out: expected out-of-place figures and N/A in place"
echo "PASS"
