#!/bin/bash
# INA jobs as processes: workers (ina_worker) and aggregation devices (kizuna-aggd) on direct
# links, with layouts from kizuna-plan and written by hand:
#   1. a full aggregation tree on one device; a partial-INA layout from the planner (partial
#      trees, chains and rings at once); a two-level tree; one device over libfabric (a switched
#      network): every result checked (ina_worker check)
#   2. an aggregation device killed mid-job: every worker fails with an error, promptly, no hang
#   3. a kizuna-aggd serving job after job: a job whose worker dies mid-stream ends with an error
#      logged, the daemon frees it and serves the next job
#   4. the daemon given a job's address with the wrong secret is refused, and then joins the job
#      with the right one (every connection proves the job's secret: the bootstrap's handshake)
# usage: ina_process_test.sh KIZUNA_RUN KIZUNA_AGGD INA_WORKER KIZUNA_PLAN
set -u
run=$1 aggd=$2 worker=$3 plan=$4
tmp=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$tmp"
}
trap cleanup EXIT
# Children run GoogleTest-free programs, but keep Bazel's test outputs away from them anyway.
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
export KIZUNA_EMULATED_DEVICES=4 KIZUNA_TIMEOUT=60 KIZUNA_FABRIC=directconnect
fail() { echo "FAIL: $*"; exit 1; }

# --- 1. results through three layouts ---
cat > "$tmp/tree.json" <<'JSON'
{"workers": 4, "aggregators": 1, "worker_ports": 1, "aggregator_ports": 4,
 "parts": [{"kind": "full-tree", "bandwidth": 1, "aggregators": 1, "worker_ports": 4, "root": "a0",
   "edges": [{"child": "w0:0", "parent": "a0:0"}, {"child": "w1:0", "parent": "a0:1"},
             {"child": "w2:0", "parent": "a0:2"}, {"child": "w3:0", "parent": "a0:3"}]}]}
JSON
"$plan" --workers 6 --aggregators 1 --worker-ports 3 --agg-ports 4 --layout "$tmp/pina.json" > "$tmp/plan.txt" \
  || { cat "$tmp/plan.txt"; fail "kizuna-plan could not write a layout"; }
"$plan" --workers 10 --aggregators 2 --worker-ports 1 --agg-ports 6 --layout "$tmp/tree2.json" > "$tmp/plan2.txt" \
  || { cat "$tmp/plan2.txt"; fail "kizuna-plan could not write the two-level layout"; }
grep -q '"partial-tree"' "$tmp/pina.json" || { cat "$tmp/plan.txt"; fail "the planner chose no partial tree for N=6 M=1"; }
grep -q '"full-tree"' "$tmp/tree2.json" || { cat "$tmp/plan2.txt"; fail "the planner chose no full tree for N=10 M=2 E=6"; }
for case in "tree 4 1" "pina 6 1" "tree2 10 2"; do
  set -- $case
  out=$(KIZUNA_INA_LAYOUT="$tmp/$1.json" timeout 120 "$run" -n "$2" -- "$worker" check : -n "$3" "$aggd" 2>&1)
  rc=$?
  [ $rc -eq 0 ] || { echo "$out" | tail -20; fail "layout $1: exit $rc"; }
  n=$(echo "$out" | grep -c 'checks ok')
  [ "$n" -eq "$2" ] || { echo "$out" | tail -20; fail "layout $1: $n of $2 workers checked ok"; }
  served=$(echo "$out" | grep -c 'operations served; ended')
  [ "$served" -eq "$3" ] || { echo "$out" | tail -20; fail "layout $1: $served of $3 devices ended normally"; }
  echo "ok: layout $1 ($2 workers, $3 aggregation devices): every worker checked ok"
done

# A switched network (libfabric over TCP on loopback): one device with a port per worker.
out=$(KIZUNA_FABRIC=ofi FI_TCP_IFACE=lo KIZUNA_INA_LAYOUT="$tmp/tree.json" timeout 120 "$run" -n 4 -- "$worker" check \
  : -n 1 "$aggd" 2>&1)
rc=$?
[ $rc -eq 0 ] && [ "$(echo "$out" | grep -c 'checks ok')" -eq 4 ] || { echo "$out" | tail -20; fail "over ofi: exit $rc"; }
echo "ok: one device over libfabric (a switched network): every worker checked ok"

# --- 2. an aggregation device killed mid-job ---
# The device's launcher rank stays up (a shell) while the daemon it started is killed, so the
# workers, not kizuna-run, must notice.
# The daemon is killed once the job's first operation is done (kizuna-run's output, watched as it
# is written; a fixed sleep raced a slow start on a loaded machine), or after 60 s regardless.
cat > "$tmp/doomed.sh" <<SH
#!/bin/bash
"$aggd" & p=\$!
for _ in \$(seq 1 600); do grep -q 'first operation done' "$tmp/doomed.out" 2>/dev/null && break; sleep 0.1; done
kill -9 \$p
sleep 100
SH
chmod +x "$tmp/doomed.sh"
start=$(date +%s)
KIZUNA_INA_LAYOUT="$tmp/tree.json" timeout 120 "$run" -n 4 -- "$worker" loop 100000 1000000 : -n 1 "$tmp/doomed.sh" \
  > "$tmp/doomed.out" 2>&1
rc=$?
out=$(cat "$tmp/doomed.out")
took=$(( $(date +%s) - start ))
[ $rc -ne 0 ] || fail "the workers finished although their aggregation device was killed"
[ $rc -ne 124 ] || fail "the job hung after its aggregation device was killed"
echo "$out" | grep -q 'first operation done' || { echo "$out" | tail; fail "the job never started"; }
errors=$(echo "$out" | grep -c 'ina_worker rank .: error after')
[ "$errors" -ge 1 ] || { echo "$out" | tail -20; fail "no worker reported an error"; }
echo "$out" | grep 'error after' | head -1 | grep -qi 'rank 4\|remote\|closed\|failed' \
  || { echo "$out" | grep 'error after'; fail "the error does not name the lost peer"; }
[ "$took" -lt 40 ] || fail "the workers took $took s to notice (KIZUNA_TIMEOUT is 60)"
echo "ok: aggregation device killed mid-job: $errors worker(s) failed with an error in $took s"
echo "$out" | grep 'error after' | head -1

# --- 3. one daemon, two jobs; the first dies mid-stream ---
idfile="$tmp/job.id"
KIZUNA_INA_LAYOUT="$tmp/tree.json" "$aggd" --rank 4 --size 5 --unique-id-file "$idfile" --jobs 3 > "$tmp/aggd.log" 2>&1 &
daemon=$!
pids+=("$daemon")
start_workers() {  # $1: mode args; $2: where rank 0 writes the id (default: the daemon's file)
  wp=()
  for r in 0 1 2 3; do
    RANK=$r WORLD_SIZE=5 LOCAL_RANK=$r LOCAL_WORLD_SIZE=5 KIZUNA_UNIQUE_ID_FILE="${2:-$idfile}" \
      KIZUNA_INA_LAYOUT="$tmp/tree.json" "$worker" $1 > "$tmp/w$r.log" 2>&1 &
    wp+=($!)
    pids+=($!)
  done
}
rm -f "$idfile"
start_workers "loop 100000 1000000"
for _ in $(seq 1 200); do grep -q 'first operation done' "$tmp/w0.log" && break; sleep 0.1; done
grep -q 'first operation done' "$tmp/w0.log" || { cat "$tmp"/w*.log "$tmp/aggd.log"; fail "job 1 never started"; }
kill -9 "${wp[2]}"
for r in 0 1 3; do
  wait "${wp[$r]}"
  code=$?
  [ $code -ne 0 ] || fail "job 1: worker $r finished although worker 2 died"
done
grep -q 'job 1: rank 4, .* failed' "$tmp/aggd.log" || { cat "$tmp/aggd.log"; fail "the daemon did not log job 1's failure"; }
kill -0 "$daemon" 2>/dev/null || { cat "$tmp/aggd.log"; fail "the daemon exited with job 1"; }
echo "ok: job 1 died mid-stream; the daemon logged: $(grep 'job 1:' "$tmp/aggd.log" | head -1 | cut -c1-160)"
# Job 2's id goes first to a file of its own; the daemon is shown it with one secret digit changed.
rm -f "$idfile" "$tmp/real.id"
start_workers check "$tmp/real.id"
for _ in $(seq 1 200); do [ -s "$tmp/real.id" ] && break; sleep 0.05; done
real=$(cat "$tmp/real.id")
last=${real: -1}
[ "$last" = 0 ] && wrong=${real%?}1 || wrong=${real%?}0
echo "$wrong" > "$idfile"
for _ in $(seq 1 200); do grep -q 'job 2: joining' "$tmp/aggd.log" && break; sleep 0.1; done
grep -q 'job 2: joining' "$tmp/aggd.log" || { cat "$tmp/aggd.log"; fail "the daemon joined with a wrong secret"; }
echo "ok: with a wrong secret the daemon was refused: $(grep 'job 2: joining' "$tmp/aggd.log" | cut -c1-150)"
echo "$real" > "$idfile"
for r in 0 1 2 3; do
  wait "${wp[$r]}" || { cat "$tmp/w$r.log" "$tmp/aggd.log"; fail "job 3: worker $r failed"; }
  grep -q 'checks ok' "$tmp/w$r.log" || fail "job 3: worker $r did not check"
done
wait "$daemon"
code=$?
grep -q 'job 3: rank 4, .* ended' "$tmp/aggd.log" || { cat "$tmp/aggd.log"; fail "the daemon did not serve job 3"; }
[ $code -eq 1 ] || fail "the daemon exited $code after a failed job (expected 1: the failure is reported)"
echo "ok: the same daemon then served the job: $(grep 'job 3:' "$tmp/aggd.log" | cut -c1-120)"
echo "PASS"
