#!/bin/bash
# The Soft-RoCE guest's test list (tests/roce/README.md), run by guest_init.sh after the rxe devices
# exist. Each step runs with its own deadline, logs to results/<step>.log and appends one line to
# results/results.txt:
#   <step> PASS|FAIL|MISSING rc=<exit status> <seconds>s [why]
# MISSING (a failure) means the binary or the roce fabric it needs is not there yet. The steps to run
# are listed in the share's 'steps' file (the host writes it); the binaries are in the share's bin/.

SHARE=${SHARE:-/mnt/kizuna}
RESULTS=${RESULTS:-$SHARE/results}
BIN=$SHARE/bin
STEP_TIMEOUT=$(cat "$SHARE/step_timeout" 2>/dev/null || echo 900)
export PATH=/usr/sbin:/usr/bin:/sbin:/bin
export TEST_TMPDIR=/tmp/kizuna-tests
export KIZUNA_TIMEOUT=${KIZUNA_TIMEOUT:-300}
mkdir -p "$TEST_TMPDIR"

# The single-device setups use rxe_dummy (its first address); the two-"host" ones the veth pair.
DUMMY_DEV=rxe_dummy
DUMMY_IP=10.90.0.1
VETH_DEV0=rxe_veth0
VETH_DEV1=rxe_veth1
VETH_IP1=10.91.0.2

# ---- helpers -----------------------------------------------------------------------------------

# why: a step function sets WHY to say why it failed (or what it checked), for the results line.
WHY=""
fail() { WHY="$*"; echo "CHECK FAILED: $*"; return 1; }
missing() { WHY="$*"; echo "MISSING: $*"; return 3; }

need_bin() { # name...
  local b
  for b in "$@"; do [[ -x "$BIN/$b" ]] || { missing "$b is not in the share (not built?)"; return 3; }; done
}

# The non-zero GIDs of an rxe device's port 1, one "index gid type netdev" line each, by index.
# (The table has 1024 entries: one grep reads them all; a process per entry is slow under TCG.)
gid_table() { # device
  local dir=/sys/class/infiniband/$1/ports/1 path gid i type ndev
  grep -H . "$dir"/gids/* 2>/dev/null | grep -v ':0000:0000:0000:0000:0000:0000:0000:0000$' |
    while IFS= read -r line; do
      path=${line%%:*}
      gid=${line#*:}
      i=${path##*/}
      type=""
      ndev=""
      read -r type <"$dir/gid_attrs/types/$i" 2>/dev/null
      read -r ndev <"$dir/gid_attrs/ndevs/$i" 2>/dev/null
      echo "$i $gid ${type// /_} ${ndev:--}"
    done | sort -n
}

# The first GID index of an rxe device's port 1 with type RoCE v2 and an IPv4-mapped address
# (::ffff:a.b.c.d); with a second argument, the first such index after it.
v2_ipv4_gid_index() { # device [after]
  local after=${2:--1}
  gid_table "$1" | awk -v after="$after" '$1 > after && $3 == "RoCE_v2" && $2 ~ /^0000:0000:0000:0000:0000:ffff:/ { print $1; exit }'
}

show_gids() { # device
  gid_table "$1" | awk -v dev="$1" '{ printf "  %s gid[%s] %s %s %s\n", dev, $1, $2, $3, $4 }'
}

# Waits (up to 60 s) until a TCP port listens: perftest's client fails at once without its server.
wait_listen() { # port
  local i
  for i in $(seq 1 120); do
    ss -ltn 2>/dev/null | grep -q ":$1 " && return 0
    sleep 0.5
  done
  echo "nothing listens on port $1 after 60 s"
  return 1
}

# A perftest pair: server in the background, client, both exit statuses checked.
perftest_pair() { # tool port server_dev client_dev server_ip extra_args...
  local tool=$1 port=$2 sdev=$3 cdev=$4 ip=$5
  shift 5
  local sgid cgid
  sgid=$(v2_ipv4_gid_index "$sdev")
  cgid=$(v2_ipv4_gid_index "$cdev")
  [[ -n "$sgid" && -n "$cgid" ]] || { fail "no RoCE v2 IPv4 GID on $sdev or $cdev"; return; }
  echo "[${SECONDS}s] \$ $tool -d $sdev -x $sgid -p $port $* &   (server)"
  timeout 180 "$tool" -d "$sdev" -x "$sgid" -p "$port" "$@" >"$TEST_TMPDIR/server.out" 2>&1 &
  local server=$!
  wait_listen "$port" || { kill "$server" 2>/dev/null; cat "$TEST_TMPDIR/server.out"; fail "$tool server did not start"; return; }
  echo "[${SECONDS}s] \$ $tool -d $cdev -x $cgid -p $port $* $ip   (client)"
  local crc=0 src=0
  timeout 180 "$tool" -d "$cdev" -x "$cgid" -p "$port" "$@" "$ip" || crc=$?
  wait "$server" || src=$?
  echo "[${SECONDS}s] --- server output"
  cat "$TEST_TMPDIR/server.out"
  [[ $crc -eq 0 && $src -eq 0 ]] || fail "$tool $sdev<-$cdev: client exit $crc, server exit $src"
}

# GoogleTest's summary of one run: fails unless tests ran, none failed and none skipped.
check_gtest_summary() { # log
  local ran skipped
  ran=$(sed -n 's/^\[==========\] \([0-9]*\) tests\? from .* ran\..*/\1/p' "$1" | tail -n 1)
  skipped=$(sed -n 's/^\[  SKIPPED \] \([0-9]*\) tests\?.*/\1/p' "$1" | tail -n 1)
  [[ -n "$ran" ]] || { fail "no GoogleTest summary in the output"; return; }
  [[ "$ran" -gt 0 ]] || { missing "--gtest_filter='*/roce' matched no test: the roce fabric is not in fabric_conformance_test yet"; return; }
  [[ -z "$skipped" || "$skipped" -eq 0 ]] || { fail "$skipped of $ran roce tests skipped (the roce fabric did not find the rxe device?)"; return; }
  if grep -q '^\[  FAILED  \]' "$1"; then
    local nfailed names
    nfailed=$(sed -n 's/^\[  FAILED  \] \([0-9]*\) tests\?, listed below.*/\1/p' "$1" | tail -n 1)
    names=$(sed -n '/listed below/,$ s/^\[  FAILED  \] \([^ ,]*\).*/\1/p' "$1" | grep -v '^[0-9]' | head -n 3 | tr '\n' ' ')
    fail "${nfailed:-some} of $ran roce conformance tests failed: $names"
    return
  fi
  WHY="$ran tests passed"
}

# Lines of a KIZUNA_DEBUG=INFO log the roce fabric must write (fabric/roce/README.md): the GID
# chosen, the MTU, the traffic class, and the registration path (dmabuf / host / staged).
check_roce_info_lines() { # log
  local log=$1 missing_lines=()
  grep -iq 'gid' "$log" || missing_lines+=("GID")
  grep -iq 'mtu' "$log" || missing_lines+=("MTU")
  grep -iqE '(traffic.class|[^a-z]tc[ =:])' "$log" || missing_lines+=("traffic class")
  grep -iE 'regist' "$log" | grep -iqE 'dma.?buf|host|staged' || missing_lines+=("registration path")
  if [[ ${#missing_lines[@]} -gt 0 ]]; then
    fail "KIZUNA_DEBUG=INFO log lacks the roce lines: ${missing_lines[*]}"
    return
  fi
  echo "--- roce INFO lines (first of each kind)"
  grep -iE 'gid' "$log" | head -n 3
  grep -iE 'mtu' "$log" | head -n 2
  grep -iE 'regist' "$log" | head -n 3
}

# A binary without the roce fabric says so when asked for it (fabric/registry.cc, kizuna-p2p):
# MISSING, not a cryptic failure.
roce_missing() { # log binary
  grep -qE "no fabric named 'roce'|roce: not linked in|--fabric roce: no such fabric in this build" "$1" || return 1
  missing "$2 has no roce fabric linked in (fabric/roce is not built into it yet)"
  return 0
}

# ---- steps ---------------------------------------------------------------------------------------

# a. The VM works: the devices, and perftest over rxe between two processes.
step_smoke() {
  echo "[${SECONDS}s] \$ ibv_devices"; ibv_devices || { fail "ibv_devices failed"; return; }
  echo "\$ ibv_devinfo"; ibv_devinfo || { fail "ibv_devinfo failed"; return; }
  echo "\$ rdma link"; rdma link || { fail "rdma link failed"; return; }
  local dev
  for dev in $DUMMY_DEV $VETH_DEV0 $VETH_DEV1; do
    ibv_devinfo -d "$dev" | grep -q 'PORT_ACTIVE' || { fail "$dev is missing or its port is not active"; return; }
    show_gids "$dev"
  done
  echo "[${SECONDS}s] == ib_write_bw on one rxe device ($DUMMY_DEV), two processes"
  perftest_pair ib_write_bw 18515 "$DUMMY_DEV" "$DUMMY_DEV" "$DUMMY_IP" -s 65536 -n 200 -F || return
  echo "== ib_send_lat across the veth pair ($VETH_DEV1 <- $VETH_DEV0)"
  perftest_pair ib_send_lat 18516 "$VETH_DEV1" "$VETH_DEV0" "$VETH_IP1" -s 8 -n 200 -F || return
  WHY="3 rxe devices; ib_write_bw and ib_send_lat ran"
}

# b. The fabric conformance suite, roce instances only, messages up to 64 MiB
# (tests/conformance/fabric/README.md: the guest has 2 GiB).
step_conformance() {
  need_bin fabric_conformance_test libkz_example_fabric.so || return
  local log=$TEST_TMPDIR/conformance.out rc=0
  echo "\$ KIZUNA_IB_HCA=$DUMMY_DEV fabric_conformance_test --plugin=.../libkz_example_fabric.so --max-bytes=64M --gtest_filter='*/roce'"
  KIZUNA_IB_HCA=$DUMMY_DEV timeout "$STEP_TIMEOUT" "$BIN/fabric_conformance_test" \
    --plugin="$BIN/libkz_example_fabric.so" --max-bytes=64M --gtest_filter='*/roce' \
    --gtest_output="xml:$RESULTS/conformance.xml" >"$log" 2>&1 || rc=$?
  cat "$log"
  check_gtest_summary "$log" || return
  [[ $rc -eq 0 ]] || fail "fabric_conformance_test exited $rc"
}

# c. 4-rank AllReduce and AllGather over roce, every result checked by kizuna-bench. The four ranks
# share one host, where the cost model would pick the direct algorithms (fused, one-shot: peers'
# memory mapped, no fabric) for most sizes; --algo ring makes every size cross the roce fabric.
bench_coll() { # coll
  local coll=$1 log=$TEST_TMPDIR/bench-$1.out rc=0
  echo "== $coll: KIZUNA_FABRIC=roce KIZUNA_IB_HCA=$DUMMY_DEV KIZUNA_DEBUG=INFO kizuna-run -n 4 -- kizuna-bench --coll $coll -b 8 -e 4M -f 4 -c 1 -n 5 -w 1 --fabric roce --algo ring"
  KIZUNA_FABRIC=roce KIZUNA_IB_HCA=$DUMMY_DEV KIZUNA_DEBUG=INFO \
    timeout "$STEP_TIMEOUT" "$BIN/kizuna-run" -n 4 --timeout $((STEP_TIMEOUT - 30)) -- \
    "$BIN/kizuna-bench" --coll "$coll" -b 8 -e 4M -f 4 -c 1 -n 5 -w 1 --fabric roce --algo ring >"$log" 2>&1 || rc=$?
  cp "$log" "$RESULTS/bench-$coll.log"
  grep -v ' kizuna TRACE ' "$log" | grep -vE ' kizuna INFO ' | tail -n 40
  roce_missing "$log" kizuna-bench && return 3
  [[ $rc -eq 0 ]] || { fail "$coll: kizuna-run exited $rc (log: bench-$coll.log)"; return; }
  grep -q 'Out of bounds values : 0 OK' "$log" || { fail "$coll: results not checked OK"; return; }
  # Every row ran the ring (the column before the prediction), i.e. went through the fabric.
  local rows others
  rows=$(grep -cE '^\[0\] +[0-9]+ +[0-9]+ ' "$log")
  others=$(grep -E '^\[0\] +[0-9]+ +[0-9]+ ' "$log" | awk '$(NF-1) != "ring"' | wc -l)
  [[ $rows -gt 0 ]] || { fail "$coll: kizuna-bench printed no result rows"; return; }
  [[ $others -eq 0 ]] || { fail "$coll: $others of $rows sizes did not run the ring over roce"; return; }
  grep -q "FABRIC connected roce:" "$log" || { fail "$coll: no 'connected roce:' line: the ranks did not connect over roce"; return; }
  check_roce_info_lines "$log"
}
step_collectives() {
  need_bin kizuna-run kizuna-bench || return
  bench_coll allreduce || return
  bench_coll allgather || return
  WHY="allreduce and allgather, 4 ranks, 8 B..4 MiB, checked"
}

# d. kizuna-p2p over roce between two processes, one on each end of the veth pair.
step_p2p() {
  need_bin kizuna-run kizuna-p2p || return
  local log=$TEST_TMPDIR/p2p.out rc=0
  echo "\$ KIZUNA_DEBUG=INFO kizuna-run -n 2 -- env KIZUNA_IB_HCA=<rank 0: $VETH_DEV0, rank 1: $VETH_DEV1> kizuna-p2p --processes --fabric roce --max-bytes 4M --bw-bytes 8M --iters 200 --warmup 20"
  KIZUNA_DEBUG=INFO timeout "$STEP_TIMEOUT" "$BIN/kizuna-run" -n 2 --timeout $((STEP_TIMEOUT - 30)) -- \
    bash -c 'KIZUNA_IB_HCA=$([[ $RANK -eq 0 ]] && echo '$VETH_DEV0' || echo '$VETH_DEV1') exec "$0" "$@"' \
    "$BIN/kizuna-p2p" --processes --fabric roce --max-bytes 4M --bw-bytes 8M --iters 200 --warmup 20 >"$log" 2>&1 || rc=$?
  cp "$log" "$RESULTS/p2p.log"
  grep -v ' kizuna \(INFO\|TRACE\) ' "$log"
  roce_missing "$log" kizuna-p2p && return 3
  [[ $rc -eq 0 ]] || { fail "kizuna-p2p exited $rc (log: p2p.log)"; return; }
  # kizuna-p2p exits 0 with a row naming the reason when a fabric is unavailable: that is a failure here.
  grep -v ' kizuna ' "$log" | grep -iqE 'unavailable|not available|no rdma device' &&
    { fail "kizuna-p2p reports roce unavailable"; return; }
  grep -v ' kizuna ' "$log" | grep -iq 'roce' || { fail "kizuna-p2p printed no roce row"; return; }
  local lat bw
  lat=$(awk '$2 == "roce" && $3 == "host" && $4 == "latency" { print $7; exit }' "$log")
  bw=$(awk '$2 == "roce" && $3 == "host" && $4 == "bandwidth" { v = $9 } END { print v }' "$log")
  [[ -n "$lat" && -n "$bw" ]] || { fail "no roce host latency or bandwidth row in the output"; return; }
  WHY="$VETH_DEV0 -> $VETH_DEV1: 8 B latency ${lat} us median, 4 MiB ${bw} GB/s (host memory; TCG)"
}

# e. GID selection: auto picks the IPv4-mapped RoCE v2 GID; KIZUNA_IB_GID_INDEX picks another valid
# one; an index with no GID is a clear error.
gid_run() { # log env...
  local log=$1
  shift
  env KIZUNA_IB_HCA=$DUMMY_DEV KIZUNA_DEBUG=INFO "$@" timeout 300 "$BIN/kizuna-p2p" --fabric roce \
    --memory host --max-bytes 64K --iters 20 --warmup 5 --no-reference >"$log" 2>&1
}
# The GID index the roce fabric logged as chosen ("GID index N", "gid_index=N", "gid[N]" ...).
logged_gid_index() { # log
  grep -iE 'gid' "$1" | grep -ioE 'gid[ _-]*(index|idx)?[ =:#[]*[0-9]+' | head -n 1 | grep -oE '[0-9]+$'
}
step_gid() {
  need_bin kizuna-p2p kizuna-run kizuna-bench || return
  show_gids $DUMMY_DEV
  local want other got rc=0
  want=$(v2_ipv4_gid_index $DUMMY_DEV)
  other=$(v2_ipv4_gid_index $DUMMY_DEV "$want")
  [[ -n "$want" && -n "$other" ]] || { fail "sysfs shows fewer than two IPv4-mapped RoCE v2 GIDs on $DUMMY_DEV"; return; }
  echo "sysfs: first IPv4-mapped RoCE v2 GID index $want, next $other"

  echo "== auto selection"
  gid_run "$TEST_TMPDIR/gid-auto.out" || rc=$?
  cp "$TEST_TMPDIR/gid-auto.out" "$RESULTS/gid-auto.log"
  grep -iE 'gid' "$TEST_TMPDIR/gid-auto.out" | head -n 5
  roce_missing "$TEST_TMPDIR/gid-auto.out" kizuna-p2p && return 3
  [[ $rc -eq 0 ]] || { fail "auto: kizuna-p2p exited $rc (gid-auto.log)"; return; }
  grep -v ' kizuna ' "$TEST_TMPDIR/gid-auto.out" | grep -q 'unavailable' && { fail "auto: roce unavailable (gid-auto.log)"; return; }
  got=$(logged_gid_index "$TEST_TMPDIR/gid-auto.out")
  [[ "$got" == "$want" ]] || { fail "auto: logged GID index '${got:-none}', sysfs says $want"; return; }

  echo "== KIZUNA_IB_GID_INDEX=$other"
  rc=0
  gid_run "$TEST_TMPDIR/gid-other.out" KIZUNA_IB_GID_INDEX="$other" || rc=$?
  cp "$TEST_TMPDIR/gid-other.out" "$RESULTS/gid-other.log"
  grep -iE 'gid' "$TEST_TMPDIR/gid-other.out" | head -n 5
  [[ $rc -eq 0 ]] || { fail "KIZUNA_IB_GID_INDEX=$other: kizuna-p2p exited $rc (gid-other.log)"; return; }
  grep -v ' kizuna ' "$TEST_TMPDIR/gid-other.out" | grep -q 'unavailable' &&
    { fail "KIZUNA_IB_GID_INDEX=$other: roce unavailable (gid-other.log)"; return; }
  got=$(logged_gid_index "$TEST_TMPDIR/gid-other.out")
  [[ "$got" == "$other" ]] || { fail "KIZUNA_IB_GID_INDEX=$other: logged GID index '${got:-none}'"; return; }

  # kizuna-p2p reports an unavailable fabric as a row and exits 0, so the bad index is checked where
  # a user meets it: a job with KIZUNA_FABRIC=roce, which must fail, naming the variable.
  echo "== KIZUNA_IB_GID_INDEX=99 (no GID there): KIZUNA_FABRIC=roce kizuna-run -n 2 -- kizuna-bench -b 8 -e 8"
  rc=0
  KIZUNA_FABRIC=roce KIZUNA_IB_HCA=$DUMMY_DEV KIZUNA_IB_GID_INDEX=99 timeout 300 "$BIN/kizuna-run" -n 2 --timeout 240 -- \
    "$BIN/kizuna-bench" -b 8 -e 8 -n 1 -w 0 --fabric roce >"$TEST_TMPDIR/gid-bad.out" 2>&1 || rc=$?
  cp "$TEST_TMPDIR/gid-bad.out" "$RESULTS/gid-bad.log"
  grep -v ' kizuna \(INFO\|TRACE\) ' "$TEST_TMPDIR/gid-bad.out" | tail -n 8
  [[ $rc -ne 0 ]] || { fail "KIZUNA_IB_GID_INDEX=99: the job exited 0"; return; }
  grep -qiE 'gid_index=99([^0-9]|$)|gid index 99([^0-9]|$)|gid at index 99([^0-9]|$)' "$TEST_TMPDIR/gid-bad.out" ||
    { fail "KIZUNA_IB_GID_INDEX=99: the job failed (exit $rc) without a message naming GID index 99"; return; }
  WHY="auto $want, override $other, 99 rejected (exit $rc)"
}

# ---- runner --------------------------------------------------------------------------------------

run_step() { # name
  local name=$1 t0=$SECONDS rc=0 status why
  echo "kizuna-guest: step $name"
  # Each step in a process of its own under timeout, which kills the step's whole process group
  # when the deadline passes; the step's WHY comes back through a file.
  timeout --kill-after=20 "$STEP_TIMEOUT" bash "$0" --step "$name" >"$RESULTS/$name.log" 2>&1 || rc=$?
  why=$(cat "$TEST_TMPDIR/why.$name" 2>/dev/null)
  case $rc in
    0) status=PASS ;;
    3) status=MISSING ;;
    *) status=FAIL ;;
  esac
  [[ $rc -eq 124 || $rc -eq 137 ]] && why="timed out after ${STEP_TIMEOUT}s ${why}"
  echo "$name $status rc=$rc $((SECONDS - t0))s $why" | tee -a "$RESULTS/results.txt"
}

if [[ "${1:-}" == "--step" ]]; then
  declare -F "step_$2" >/dev/null || { echo "no such step: $2" >"$TEST_TMPDIR/why.$2"; exit 2; }
  rc=0
  "step_$2" || rc=$?
  echo "$WHY" >"$TEST_TMPDIR/why.$2"
  exit $rc
fi

STEPS=$(cat "$SHARE/steps" 2>/dev/null)
[[ -n "$STEPS" ]] || STEPS="smoke conformance collectives p2p gid"
for s in $STEPS; do run_step "$s"; done
