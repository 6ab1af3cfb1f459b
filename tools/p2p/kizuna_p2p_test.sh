#!/usr/bin/env bash
# kizuna-p2p end to end, tiny sizes: two threads, then two processes under kizuna-run; every
# expected row is present, no error, exit 0; --json is well formed; bad options fail clearly.
set -uo pipefail
p2p="$1"
run="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"
unset KIZUNA_TOPOLOGY
export KIZUNA_TIMEOUT=60
fail() { echo "FAIL: $*"; exit 1; }

check_rows() {  # output
  for mem in host device-fd; do
    grep -Eq "^directconnect +$mem +latency +8 +10 " <<<"$1" || fail "no $mem latency row"
    for b in 8 1024 65536; do
      grep -Eq "^directconnect +$mem +bandwidth +$b +" <<<"$1" || fail "no $mem bandwidth row for $b bytes"
    done
  done
  grep -Eq "^directconnect +device-fd +bandwidth +65536 .* 1$" <<<"$1" || fail "device-fd transfers were staged"
  grep -Eq "^memcpy +host +bandwidth +65536 " <<<"$1" || fail "no memcpy reference row"
  # Fabrics that cannot run here are rows saying why; anything else mentioning an error is one.
  grep -v "unavailable:" <<<"$1" | grep -qi "error" && fail "an error in the output"
  return 0
}

out="$(timeout 60 "$p2p" --max-bytes 64K --iters 10 --warmup 2 2>&1)" || fail "threads: exit $?: $out"
echo "$out"
check_rows "$out"
grep -q "generated 2-worker ring" <<<"$out" || fail "the generated topology is not mentioned"

out="$(timeout 60 "$run" -n 2 --timeout 50 -- "$p2p" --processes --max-bytes 64K --iters 10 --warmup 2 2>&1)" ||
  fail "processes: exit $?: $out"
echo "$out"
out="$(sed -E 's/^\[[^]]*\] ?//' <<<"$out")"  # kizuna-run's rank prefixes, if any
check_rows "$out"
grep -q "2 processes under kizuna-run" <<<"$out" || fail "process mode not reported"

out="$(timeout 60 "$p2p" --max-bytes 4K --iters 5 --warmup 1 --memory host --json 2>&1)" || fail "json: exit $?: $out"
python3 -c 'import json,sys; d=json.loads(sys.stdin.read()); r=d["rows"]; assert any(x["test"]=="latency" and x["median_us"]>0 for x in r), r' <<<"$out" ||
  fail "bad JSON: $out"

# Bad input.
out="$("$p2p" --max-bytes 2G 2>&1)"; [ $? -eq 2 ] || fail "--max-bytes 2G accepted"
grep -q "at most 1G" <<<"$out" || fail "--max-bytes 2G: unclear message: $out"
out="$("$p2p" --max-bytes 12Q 2>&1)"; [ $? -eq 2 ] || fail "--max-bytes 12Q accepted"
grep -q "unknown suffix" <<<"$out" || fail "--max-bytes 12Q: unclear message: $out"
out="$("$p2p" --fabric nosuch --iters 2 2>&1)"; [ $? -eq 1 ] || fail "--fabric nosuch accepted"
grep -q "no such fabric" <<<"$out" || fail "--fabric nosuch: unclear message: $out"
out="$("$p2p" --processes 2>&1)"; [ $? -eq 1 ] || fail "--processes outside kizuna-run accepted"
grep -q "2 ranks" <<<"$out" || fail "--processes alone: unclear message: $out"
echo PASS
