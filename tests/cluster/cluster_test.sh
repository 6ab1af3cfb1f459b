#!/usr/bin/env bash
# Cross-host collectives: "hosts" made of network namespaces (tools/netns/kizuna-netns), one rank per
# process with torchrun's environment, every collective checked by kizuna-bench (tests/cluster/README.md).
#
#   cluster_test.sh KIZUNA_BENCH KIZUNA_NETNS [CASE...]
#
# Each case of CASES below puts ranks on hosts (e.g. "2 3 1": 2 ranks on host 0, 3 on host 1, 1 on
# host 2) and runs every collective of COLLS over them: each rank must exit 0, rank 0's table must
# report no wrong element, and every rank's INFO line must count the hosts and ranks per host of the
# case, reach the ranks of its own host over directconnect and every other rank over a network
# fabric (whose name the log shows). Needs root and 'ip netns': skipped otherwise (exit 0, every
# case written as skipped to the test's XML). Every namespace is removed on every exit path.
set -uo pipefail

# ---- the cases: the one place to add one ---------------------------------------------------------
# name | ranks per host, host 0 first | extra environment for every rank ("-": none), e.g.
# KIZUNA_ALGO=ring to force an algorithm (README.md, KIZUNA_ALGO) | NICs per host (default 1; with
# more, every NIC of every host must have carried traffic: rails) | collectives (default: COLLS) |
# launcher (default: the ranks started one by one with torchrun's environment and a unique id file;
# "openmpi": mpirun.openmpi on host 0 starting every rank through an agent that enters the hosts'
# namespaces, nothing set by hand: the unique id goes through Open MPI's PMIx store; "survive": the
# collectives field lists modes of tests/collectives/survive.cc, "kill:R" or "stop:R", each a job of
# AllReduces in which rank R is killed or frozen and the others shrink it away and go on) | what
# each rank's log must say: patterns separated by ';', the i-th for local rank i (grep -E).
# @TOPOLOGY@ in the environment is runtime/topology/testdata/two_nic_host.xml: the machine
# topology gives each host's first accelerator eth1 and its second eth0 (against the names' order).
CASES=(
  "2x2|2 2|-"
  "3-uneven|2 3 1|-"
  "3-uneven-hier|2 3 1|KIZUNA_ALGO=hier"
  "2x4-hier|4 4|KIZUNA_ALGO=hier"
  "2x2-rails|2 2|KIZUNA_ALGO=hier|2|allreduce alltoall"
  "2x2-topology|2 2|KIZUNA_ALGO=hier KIZUNA_DEBUG_SUBSYS=INIT,COLL KIZUNA_MACHINE_TOPOLOGY=@TOPOLOGY@ KIZUNA_EMU_PCI_BUS_IDS=0000:04:00.0,0000:84:00.0|2|allreduce|env|local rank 0 uses eth1 between hosts .*machine topology's NIC for its accelerator 0000:04:00.0;local rank 1 uses eth0 between hosts .*machine topology's NIC for its accelerator 0000:84:00.0"
  "2x2-mpirun|2 2|-|1|allreduce broadcast alltoall|openmpi"
  "2x1-straight|1 1|KIZUNA_DEBUG_SUBSYS=INIT,COLL|1|allreduce allgather|env|in an operation header run straight"
  "2x2-survive|2 2|-|1|kill:3 stop:1 kill:0|survive"
)
COLLS=(allreduce reducescatter allgather broadcast reduce alltoall sendrecv)
# A run that fails because of a known kizuna bug: "CASE/COLL|what fails". It is reported as skipped
# with that text while it fails, and as a failure once it passes (then remove it from here).
KNOWN_FAILURES=(
)
# kizuna-bench per run: small sizes (8 B to 256 KiB, the last on two channels), one checked call.
BENCH_ARGS=(-b 8 -e 1M -f 32 -n 2 -w 1 -c 1 --placement both)
# The ranks' own deadline (bootstrap, every collective) and the bound on one rank's process.
RANK_TIMEOUT_S=60
RUN_TIMEOUT_S=120
# Runs of one case at once, each its own job on the same hosts (CLUSTER_TEST_PARALLEL). One at a
# time by default: 4 at once saved little on a quiet 2-core machine (22 s instead of 26), and 7 at
# once on a loaded one (load average 15-30) starved the ranks until every 6-rank run's ofi
# connections missed a 30 s deadline.
PARALLEL="${CLUSTER_TEST_PARALLEL:-1}"
# ---------------------------------------------------------------------------------------------------

[[ $# -ge 3 ]] || { echo "usage: cluster_test.sh KIZUNA_BENCH KIZUNA_NETNS SURVIVE [CASE...]" >&2; exit 2; }
bench="$(realpath "$1")"
netns="$(realpath "$2")"
survive="$(realpath "$3")"
shift 3
only=("$@")
# The machine topology of the 2x2-topology case: in the runfiles under Bazel, else beside the tree.
topology_xml="${TEST_SRCDIR:-}/${TEST_WORKSPACE:-}/runtime/topology/testdata/two_nic_host.xml"
[[ -f $topology_xml ]] || topology_xml="$(cd "$(dirname "$0")/../.." && pwd)/runtime/topology/testdata/two_nic_host.xml"
own_tmp=0
if [[ -n "${TEST_TMPDIR:-}" ]]; then
  tmp=$TEST_TMPDIR
else
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/cluster_test.XXXXXX")
  own_tmp=1
fi
xml="${XML_OUTPUT_FILE:-}"
# The ranks are not GoogleTest programs, but keep them off this test's own result file anyway.
unset XML_OUTPUT_FILE GTEST_OUTPUT TEST_PREMATURE_EXIT_FILE
start=$SECONDS
failures=0

# ---- results, as the test's XML (./kz test counts its cases) --------------------------------------
results=()  # "name|passed|failed|skipped|seconds|message"
record() { results+=("$1|$2|$3"); }
xml_escape() { printf '%s' "$1" | sed 's/&/\&amp;/g; s/</\&lt;/g; s/>/\&gt;/g; s/"/\&quot;/g' | tr '\n' ' '; }
write_xml() {
  [[ -n "$xml" ]] || return 0
  local r name verdict secs msg total=${#results[@]} failures=0 skips=0
  for r in "${results[@]}"; do
    IFS='|' read -r name verdict secs msg <<<"$r"
    [[ $verdict == failed ]] && failures=$((failures + 1))
    [[ $verdict == skipped ]] && skips=$((skips + 1))
  done
  {
    echo '<?xml version="1.0" encoding="UTF-8"?>'
    echo "<testsuites tests=\"$total\" failures=\"$failures\" disabled=\"0\" errors=\"0\" name=\"cluster_test\">"
    echo "<testsuite name=\"Cluster\" tests=\"$total\" failures=\"$failures\" skipped=\"$skips\"" \
      "disabled=\"0\" errors=\"0\">"
    for r in "${results[@]}"; do
      IFS='|' read -r name verdict secs msg <<<"$r"
      local attrs
      attrs="name=\"$(xml_escape "$name")\" classname=\"Cluster\" time=\"$secs\""
      local why
      why=$(xml_escape "$msg")
      case $verdict in
        passed) echo "<testcase $attrs status=\"run\" result=\"completed\"/>" ;;
        skipped) echo "<testcase $attrs status=\"run\" result=\"skipped\"><skipped message=\"$why\"/></testcase>" ;;
        failed) echo "<testcase $attrs status=\"run\" result=\"completed\"><failure message=\"$why\"/></testcase>" ;;
      esac
    done
    echo "</testsuite>"
    echo "</testsuites>"
  } >"$xml"
}

# ---- namespaces: every prefix made here is removed on every exit --------------------------------
prefixes=()
cleanup() {
  local p
  for p in "${prefixes[@]}"; do
    "$netns" down --name "$p" || echo "cleanup: 'kizuna-netns down --name $p' failed" >&2
  done
  prefixes=()
}
# Outside Bazel, the logs stay only when something failed.
finish() {
  cleanup
  write_xml
  if [[ $own_tmp -eq 1 ]]; then
    if [[ ${failures:-0} -eq 0 ]]; then rm -rf "$tmp"; else echo "logs kept in $tmp"; fi
  fi
}
trap finish EXIT
trap 'echo "cluster_test: stopped by a signal" >&2; exit 143' TERM INT HUP

all_case_names() {
  local c coll name layout extra nics colls launcher
  for c in "${CASES[@]}"; do
    IFS='|' read -r name layout extra nics colls launcher expect <<<"$c"
    for coll in ${colls:-${COLLS[*]}}; do echo "$name.$coll"; done
    [[ ${nics:-1} -gt 1 ]] && echo "$name.rails"
  done
}

# ---- skip where namespaces cannot be made ---------------------------------------------------------
check_out="$("$netns" check 2>&1)"
check_rc=$?
if [[ $check_rc -eq 3 ]]; then
  echo "SKIPPED: every case of tests/cluster: $check_out"
  while IFS= read -r n; do record "$n" skipped "0|$check_out"; done < <(all_case_names)
  exit 0
elif [[ $check_rc -ne 0 ]]; then
  echo "FAIL: kizuna-netns check exited with $check_rc: $check_out"
  record setup failed "0|kizuna-netns check: $check_out"
  failures=1
  exit 1
fi

# ---- one run: one collective over one case's hosts --------------------------------------------

# Checks one rank's INFO line: host count, ranks on its host, directconnect to exactly the ranks of
# its host, a network fabric to exactly the others. Prints the network fabric's description.
check_info() { # log rank nranks nhosts same_host_ranks(space-separated, without rank)
  local log=$1 rank=$2 n=$3 hosts=$4 same=$5 line
  line="$(grep -o "communicator rank $rank of $n .*" "$log" | head -n 1)"
  [[ -n "$line" ]] || { echo "rank $rank: no 'communicator rank $rank of $n' INFO line"; return 1; }
  grep -q "; $hosts host(s), " <<<"$line" || { echo "rank $rank sees not $hosts hosts: $line"; return 1; }
  local on_host=$(($(wc -w <<<"$same") + 1))
  grep -q "host(s), $on_host rank(s) on this host" <<<"$line" ||
    { echo "rank $rank: not $on_host rank(s) on its host: $line"; return 1; }
  # "directconnect: rank 1 (device ...); ofi: ranks 2, 3 (device tcp;ofi_rxm:eth0); ..."
  local entry fabric ranks direct="" network="" network_fabrics=""
  while IFS= read -r entry; do
    fabric=${entry%%:*}
    ranks=$(sed -E 's/^[a-z_]+: ranks? //; s/,//g' <<<"$entry")
    if [[ $fabric == directconnect ]]; then
      direct+=" $ranks"
    else
      network+=" $ranks"
      network_fabrics+="${network_fabrics:+, }"
      network_fabrics+=$(grep -oE "$fabric: ranks? [0-9, ]+ \(device [^)]*\)" <<<"$line" | head -n 1)
    fi
  done < <(grep -oE '[a-z_]+: ranks? [0-9]+(, [0-9]+)*' <<<"$line")
  local want_direct want_network=() r
  want_direct=$(tr ' ' '\n' <<<"$same" | grep . | sort -n | tr '\n' ' ')
  for ((r = 0; r < n; r++)); do
    [[ $r -eq $rank || " $same " == *" $r "* ]] || want_network+=("$r")
  done
  [[ "$(tr ' ' '\n' <<<"$direct" | grep . | sort -n | tr '\n' ' ')" == "$want_direct" ]] ||
    { echo "rank $rank: directconnect reaches [$direct ] not its host's ranks [ $want_direct]: $line"; return 1; }
  [[ "$(tr ' ' '\n' <<<"$network" | grep . | sort -n | tr '\n' ' ')" == "$(printf '%s ' "${want_network[@]}")" ]] ||
    { echo "rank $rank: a network fabric reaches [$network ] not the other hosts' ranks [ ${want_network[*]} ]:" \
      "$line"; return 1; }
  echo "$network_fabrics"
}

run_one() { # case_name prefix "ranks per host" extra_env coll port -> 0 ok, else 1; prints why
  local name=$1 pfx=$2 layout=$3 extra=$4 coll=$5 port=$6
  local -a per_host extra_env=()
  read -ra per_host <<<"$layout"
  local nhosts=${#per_host[@]} n=0 h
  for h in "${per_host[@]}"; do n=$((n + h)); done
  local dir="$tmp/$name.$coll" uid
  rm -rf "$dir"; mkdir -p "$dir"
  uid="$dir/unique_id"
  local -a envs=("KIZUNA_TIMEOUT=$RANK_TIMEOUT_S" KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT
    "KIZUNA_UNIQUE_ID_FILE=$uid" "KIZUNA_ROOT=10.77.0.1:$port" "WORLD_SIZE=$n")
  # The case's extra environment: words of NAME=VALUE, after the defaults so that they win.
  [[ $extra == - ]] || { read -ra extra_env <<<"${extra//@TOPOLOGY@/$topology_xml}"; envs+=("${extra_env[@]}"); }
  local -a pids=() same_of=() local_of=()
  local rank=0 l first
  for ((h = 0; h < nhosts; h++)); do
    first=$rank
    for ((l = 0; l < per_host[h]; l++)); do
      local same="" s
      for ((s = first; s < first + per_host[h]; s++)); do [[ $s -eq $rank ]] || same+="$s "; done
      same_of+=("$same")
      local_of+=("$l")
      env "${envs[@]}" RANK=$rank LOCAL_RANK=$l LOCAL_WORLD_SIZE=${per_host[h]} \
        "$netns" exec "$pfx" "$h" -- timeout -k 5 "$RUN_TIMEOUT_S" "$bench" --coll "$coll" "${BENCH_ARGS[@]}" \
        >"$dir/rank$rank.log" 2>&1 &
      pids+=($!)
      rank=$((rank + 1))
    done
  done
  local bad="" rc
  for ((rank = 0; rank < n; rank++)); do
    wait "${pids[rank]}"
    rc=$?
    # The last line a failed rank wrote is its error (kizuna-bench's, or its killer's).
    [[ $rc -eq 0 ]] ||
      bad+="${bad:+; }rank $rank exited with $rc ($(grep . "$dir/rank$rank.log" | tail -n 1 | cut -c 1-400))"
  done
  if [[ -n "$bad" ]]; then
    echo "$bad"
    return 1
  fi
  grep -q '^# Out of bounds values : 0 OK' "$dir/rank0.log" ||
    { echo "rank 0's table does not end in '0 OK': $(grep '^# Out of bounds' "$dir/rank0.log")"; return 1; }
  # KIZUNA_ALGO=hier: every row of a collective the hierarchical algorithms serve ran one of them.
  if [[ " $extra " == *" KIZUNA_ALGO=hier "* && $coll != sendrecv ]]; then
    local rows hier_rows
    rows=$(grep -cE '^ +[0-9]+ +[0-9]+ ' "$dir/rank0.log")
    hier_rows=$(grep -cE '^ +[0-9]+ +[0-9]+ .* hier:(pairwise|fused)/(ring|rd)' "$dir/rank0.log")
    [[ $rows -gt 0 && $rows -eq $hier_rows ]] ||
      { echo "KIZUNA_ALGO=hier: $hier_rows of $rows rows ran a hierarchical algorithm"; return 1; }
  fi
  local fabrics="" f
  for ((rank = 0; rank < n; rank++)); do
    f=$(check_info "$dir/rank$rank.log" "$rank" "$n" "$nhosts" "${same_of[rank]}") || { echo "$f"; return 1; }
    [[ $rank -eq 0 ]] && fabrics=$f
    if [[ -n $expect ]]; then
      local -a want
      IFS=';' read -ra want <<<"$expect"
      grep -qE -- "${want[${local_of[rank]}]}" "$dir/rank$rank.log" ||
        { echo "rank $rank's log does not say '${want[${local_of[rank]}]}'"; return 1; }
    fi
  done
  # The hierarchical algorithms rank 0's rows ran, for the log.
  local hier
  hier=$(grep -oE 'hier:(pairwise|fused)/(ring|rd)' "$dir/rank0.log" | sort -u | paste -sd, -)
  echo "$nhosts hosts; between hosts, rank 0: $fabrics${hier:+; $hier}"
}

# One job of survive.cc (mode "kill:R" or "stop:R"): rank R is lost, every other rank names it,
# shrinks it away and runs 20 more AllReduces; a frozen rank is named at the ranks' deadline (4 s
# here) and killed afterwards by the survivors.
run_one_survive() { # case_name prefix "ranks per host" extra_env mode port -> 0 ok, else 1; prints why
  local name=$1 pfx=$2 layout=$3 extra=$4 mode=$5 port=$6
  local how=${mode%%:*} victim=${mode#*:}
  local -a per_host extra_env=()
  read -ra per_host <<<"$layout"
  local nhosts=${#per_host[@]} n=0 h
  for h in "${per_host[@]}"; do n=$((n + h)); done
  local dir="$tmp/$name.$mode"
  rm -rf "$dir"; mkdir -p "$dir"
  # The status sockets in a short folder of the run's (a killed rank's stays; paths under 108 bytes).
  local run_dir
  run_dir="$(mktemp -d /tmp/kz-cl.XXXXXX)"
  local -a envs=("KIZUNA_TIMEOUT=4" "KIZUNA_UNIQUE_ID_FILE=$dir/unique_id" "KIZUNA_ROOT=10.77.0.1:$port" "WORLD_SIZE=$n"
    "KIZUNA_RUN_DIR=$run_dir")
  [[ $extra == - ]] || { read -ra extra_env <<<"$extra"; envs+=("${extra_env[@]}"); }
  local -a pids=()
  local rank=0 l
  for ((h = 0; h < nhosts; h++)); do
    for ((l = 0; l < per_host[h]; l++)); do
      env "${envs[@]}" RANK=$rank LOCAL_RANK=$l LOCAL_WORLD_SIZE=${per_host[h]} \
        "$netns" exec "$pfx" "$h" -- timeout -k 5 "$RUN_TIMEOUT_S" "$survive" "$how" "$victim" >"$dir/rank$rank.log" 2>&1 &
      pids+=($!)
      rank=$((rank + 1))
    done
  done
  local bad="" rc took
  for ((rank = 0; rank < n; rank++)); do
    wait "${pids[rank]}" 2>/dev/null  # not the shell's "Killed" for the victim
    rc=$?
    if [[ $rank -eq $victim ]]; then
      [[ $rc -eq 137 ]] || bad+="${bad:+; }the victim, rank $rank, exited with $rc (expected 137: SIGKILL)"
      continue
    fi
    [[ $rc -eq 0 ]] || { bad+="${bad:+; }rank $rank exited with $rc ($(grep . "$dir/rank$rank.log" | tail -n 1 | cut -c 1-400))"; continue; }
    took=$(sed -n "s/^rank $rank: lost rank $victim named after \([0-9.]*\) s: .*/\1/p" "$dir/rank$rank.log")
    [[ -n $took ]] || { bad+="${bad:+; }rank $rank did not name rank $victim"; continue; }
    grep -q "^rank $rank: 20 AllReduces ok after the loss" "$dir/rank$rank.log" || bad+="${bad:+; }rank $rank did not go on"
    awk -v t="$took" -v w="$([[ $how == kill ]] && echo 5 || echo 15)" 'BEGIN { exit !(t < w) }' ||
      bad+="${bad:+; }rank $rank took $took s to name rank $victim"
  done
  rm -rf "$run_dir"
  if [[ -n "$bad" ]]; then
    echo "$bad"
    return 1
  fi
  local what=killed
  [[ $how == stop ]] && what=frozen
  echo "$nhosts hosts; rank $victim $what; the others named it and went on as $((n - 1)) ranks"
}

# One run under Open MPI's mpirun, started in host 0's namespace: its daemons on the other hosts come
# through an agent that enters their namespaces (as ssh would log in), ranks placed by slot (the
# case's ranks per host). No KIZUNA_UNIQUE_ID(_FILE) or KIZUNA_ROOT: the id goes through PMIx. The
# ranks' output is one stream: the same checks as run_one, over it.
run_one_mpirun() { # case_name prefix "ranks per host" extra_env coll -> 0 ok, else 1; prints why
  local name=$1 pfx=$2 layout=$3 extra=$4 coll=$5
  local -a per_host extra_env=()
  read -ra per_host <<<"$layout"
  local nhosts=${#per_host[@]} n=0 h hosts="" cases=""
  for ((h = 0; h < nhosts; h++)); do
    n=$((n + per_host[h]))
    hosts+="${hosts:+,}10.77.0.$((h + 1)):${per_host[h]}"
    cases+="10.77.0.$((h + 1))) i=$h ;; "
  done
  command -v mpirun.openmpi >/dev/null || { echo "mpirun.openmpi is not installed (./kz setup installs it)"; return 1; }
  local dir="$tmp/$name.$coll" agent="$tmp/$pfx-agent.sh"
  rm -rf "$dir"; mkdir -p "$dir"
  printf '#!/bin/sh\nwhile [ $# -gt 0 ]; do case "$1" in -*) shift ;; *) break ;; esac; done\nhost=$1; shift\n%s\n%s\n' \
    "case \"\$host\" in $cases *) echo \"agent: unknown host \$host\" >&2; exit 1 ;; esac" \
    "exec \"$netns\" exec \"$pfx\" \"\$i\" -- sh -c \"\$*\"" >"$agent"
  chmod +x "$agent"
  local -a xenv=(-x KIZUNA_TIMEOUT=$RANK_TIMEOUT_S -x KIZUNA_DEBUG=INFO -x KIZUNA_DEBUG_SUBSYS=INIT,BOOTSTRAP)
  [[ $extra == - ]] || { read -ra extra_env <<<"$extra"; for e in "${extra_env[@]}"; do xenv+=(-x "$e"); done; }
  env -u KIZUNA_UNIQUE_ID -u KIZUNA_UNIQUE_ID_FILE -u KIZUNA_ROOT -u RANK -u WORLD_SIZE \
    "$netns" exec "$pfx" 0 -- timeout -k 5 "$RUN_TIMEOUT_S" mpirun.openmpi --allow-run-as-root --oversubscribe \
    -np "$n" --host "$hosts" --bind-to none --mca plm_rsh_agent "$agent" --mca plm_rsh_no_tree_spawn 1 \
    --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    "${xenv[@]}" "$bench" --coll "$coll" "${BENCH_ARGS[@]}" >"$dir/rank0.log" 2>&1
  local rc=$?
  if [[ $rc -ne 0 ]]; then
    echo "mpirun.openmpi exited with $rc ($(grep . "$dir/rank0.log" | tail -n 1 | cut -c 1-400))"
    return 1
  fi
  grep -q '^# Out of bounds values : 0 OK' "$dir/rank0.log" ||
    { echo "rank 0's table does not end in '0 OK': $(grep '^# Out of bounds' "$dir/rank0.log")"; return 1; }
  grep -q "unique id .* through the launcher's store, PMIx" "$dir/rank0.log" ||
    { echo "no rank says its unique id came through PMIx: $(grep -m1 'unique id' "$dir/rank0.log")"; return 1; }
  local rank=0 l first fabrics="" f same s
  for ((h = 0; h < nhosts; h++)); do
    first=$rank
    for ((l = 0; l < per_host[h]; l++)); do
      same=""
      for ((s = first; s < first + per_host[h]; s++)); do [[ $s -eq $rank ]] || same+="$s "; done
      f=$(check_info "$dir/rank0.log" "$rank" "$n" "$nhosts" "$same") || { echo "$f"; return 1; }
      [[ $rank -eq 0 ]] && fabrics=$f
      rank=$((rank + 1))
    done
  done
  echo "$nhosts hosts under mpirun.openmpi (unique id through PMIx); between hosts, rank 0: $fabrics"
}

# ---- rails -------------------------------------------------------------------------------------
# Bytes each NIC of each host has sent: lines "h<host>/eth<k> <bytes>".
nic_bytes() { # prefix hosts nics
  local h k
  for ((h = 0; h < $2; h++)); do
    for ((k = 0; k < $3; k++)); do
      echo "h$h/eth$k $("$netns" exec "$1" "$h" -- cat "/sys/class/net/eth$k/statistics/tx_bytes" 2>/dev/null || echo -1)"
    done
  done
}
# Every NIC sent at least RAIL_MIN_BYTES more (the case moves megabytes over each rail; control
# traffic alone is kilobytes); prints what each sent.
RAIL_MIN_BYTES=$((256 << 10))
check_rails() { # before after
  local nic b a out="" bad=0
  while read -r nic b && read -r _ a <&3; do
    out+="${out:+, }$nic $((a - b)) B"
    [[ $b -ge 0 && $a -ge 0 && $((a - b)) -ge $RAIL_MIN_BYTES ]] || bad=1
  done <"$1" 3<"$2"
  echo "sent: $out"
  [[ $bad -eq 0 ]]
}

# ---- the cases ----------------------------------------------------------------------------------
known_failure() { # CASE/COLL: prints the recorded reason, or fails
  local k
  for k in "${KNOWN_FAILURES[@]}"; do [[ ${k%%|*} == "$1" ]] && { echo "${k#*|}"; return 0; }; done
  return 1
}

index=0
for c in "${CASES[@]}"; do
  IFS='|' read -r name layout extra nics colls launcher expect <<<"$c"
  nics=${nics:-1}
  launcher=${launcher:-env}
  index=$((index + 1))
  if [[ ${#only[@]} -gt 0 && " ${only[*]} " != *" $name "* ]]; then continue; fi
  read -ra per_host <<<"$layout"
  # Unique per process and case: concurrent runs of this test never share a namespace.
  pfx="kzcl$$-$index"
  prefixes+=("$pfx")
  case_colls=("${COLLS[@]}")
  [[ -z "${colls:-}" ]] || read -ra case_colls <<<"$colls"
  up_out="$("$netns" up --name "$pfx" --hosts ${#per_host[@]} --nics "$nics" --env-file "$tmp/$pfx.env" 2>&1)" || {
    echo "FAIL: $name: kizuna-netns up: $up_out"
    for coll in "${case_colls[@]}"; do record "$name.$coll" failed "0|kizuna-netns up failed: $up_out"; done
    failures=$((failures + ${#case_colls[@]}))
    continue
  }
  [[ $nics -gt 1 ]] && nic_bytes "$pfx" ${#per_host[@]} "$nics" >"$tmp/$pfx.before"
  echo "case $name: ranks per host [$layout], extra environment: $extra, namespaces $pfx-h0.. (${#per_host[@]} hosts)"
  # Each run in the background, at most PARALLEL at once; its verdict, message and time in files.
  port=29600
  for coll in "${case_colls[@]}"; do
    while [[ $(jobs -rp | wc -l) -ge $PARALLEL ]]; do wait -n; done
    port=$((port + 1))
    (
      t0=$SECONDS
      if [[ $launcher == openmpi ]]; then
        run_one_mpirun "$name" "$pfx" "$layout" "$extra" "$coll" >"$tmp/$name.$coll.msg" 2>&1
      elif [[ $launcher == survive ]]; then
        run_one_survive "$name" "$pfx" "$layout" "$extra" "$coll" "$port" >"$tmp/$name.$coll.msg" 2>&1
      else
        run_one "$name" "$pfx" "$layout" "$extra" "$coll" "$port" >"$tmp/$name.$coll.msg" 2>&1
      fi
      echo "$? $((SECONDS - t0))" >"$tmp/$name.$coll.rc"
    ) &
  done
  wait
  for coll in "${case_colls[@]}"; do
    read -r rc secs <"$tmp/$name.$coll.rc" 2>/dev/null || { rc=1; secs=0; }
    msg=$(tr '|' '/' <"$tmp/$name.$coll.msg" | tr '\n' ' ' | sed 's/ *$//')
    if known="$(known_failure "$name/$coll")"; then
      if [[ $rc -eq 0 ]]; then
        echo "  FAIL $name $coll: passes, but is listed as a known failure ($known): remove it from KNOWN_FAILURES"
        record "$name.$coll" failed "$secs|listed as a known failure but passed"
        failures=$((failures + 1))
      else
        echo "  KNOWN FAILURE $name $coll (${secs} s): $msg"
        record "$name.$coll" skipped "$secs|known failure: $known"
      fi
    elif [[ $rc -eq 0 ]]; then
      echo "  ok   $name $coll (${secs} s): $msg"
      record "$name.$coll" passed "$secs|"
    else
      echo "  FAIL $name $coll (${secs} s): $msg"
      echo "       logs: $tmp/$name.$coll/"
      sed 's/^/       | /' "$tmp/$name.$coll/rank0.log" | tail -n 20
      # Under Bazel, the failed run's logs outlive the test: bazel-testlogs/.../test.outputs.
      [[ -z "${TEST_UNDECLARED_OUTPUTS_DIR:-}" ]] || cp -r "$tmp/$name.$coll" "$TEST_UNDECLARED_OUTPUTS_DIR/"
      record "$name.$coll" failed "$secs|$msg"
      failures=$((failures + 1))
    fi
  done
  if [[ $nics -gt 1 ]]; then
    # Rails: every NIC of every host carried the case's traffic (its transmitted bytes grew).
    nic_bytes "$pfx" ${#per_host[@]} "$nics" >"$tmp/$pfx.after"
    if verdict=$(check_rails "$tmp/$pfx.before" "$tmp/$pfx.after"); then
      echo "  ok   $name rails: $verdict"
      record "$name.rails" passed "0|"
    else
      echo "  FAIL $name rails: $verdict"
      record "$name.rails" failed "0|$verdict"
      failures=$((failures + 1))
    fi
  fi
  "$netns" down --name "$pfx" || { echo "FAIL: kizuna-netns down --name $pfx failed"; failures=$((failures + 1)); }
done
cleanup

left="$(ip netns list 2>/dev/null | grep "^kzcl$$-" || true)"
if [[ -n "$left" ]]; then
  echo "FAIL: namespaces left behind: $left"
  record cleanup failed "0|namespaces left: $left"
  failures=$((failures + 1))
fi
echo "cluster_test: ${#results[@]} runs, $failures failed, $((SECONDS - start)) s"
[[ $failures -eq 0 ]]
