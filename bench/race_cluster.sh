# shellcheck shell=bash
# The race's cluster cases, sourced by bench/race.sh (it is not run on its own): kizuna, Open MPI,
# MPICH and Gloo across hosts made of network namespaces (tools/netns/kizuna-netns), several ranks
# per host, one rank per process. bench/README.md ("The cluster cases") says what runs and how to
# read the table.
#
# It uses race.sh's variables and functions: QUICK, BUILD, RESULTS, KZ_BENCH, NETNS, NS_PFX,
# HOST_ADDR, SHAPE, RUN_TWO_HOST; log, fail, collect, missing_peer, kizuna_case, gloo_run, in_ns,
# wait_hydra, join, bytes_of. Every RESULT and FAIL line written while a shape runs carries
# shape=<hosts>x<ranks per host>.

# ---- the cases ---------------------------------------------------------------------------------

# A shape is "<hosts>x<ranks per host>"; ranks fill the hosts in order (rank r on host r / ranks per
# host), as torchrun's would.
if [[ $QUICK -eq 1 ]]; then
  CLUSTER_SHAPES=(2x1 2x4); CLUSTER_AR_SIZES=(8 1M); CLUSTER_OTHER_COLLS=(); CLUSTER_PEERS=(openmpi)
else
  CLUSTER_SHAPES=(2x1 2x4 4x2); CLUSTER_AR_SIZES=(8 1M 64M); CLUSTER_OTHER_COLLS=(reducescatter allgather)
  CLUSTER_PEERS=(openmpi mpich gloo)
fi
CLUSTER_OTHER_SIZE=64M
# kizuna's bootstrap port on host 0: a fresh one per run, so that no run waits for the last one's
# socket to close.
CLUSTER_PORT=29530

# How many hosts the largest shape has (race.sh makes that many before the cluster cases run).
cluster_hosts() {
  local s most=2
  for s in "${CLUSTER_SHAPES[@]}"; do [[ ${s%x*} -gt $most ]] && most=${s%x*}; done
  echo "$most"
}

# ---- kizuna -------------------------------------------------------------------------------------

# kizuna_case's runner: every rank of the shape started in its host with torchrun's environment
# (tests/cluster/cluster_test.sh does the same), rank 0 in the foreground (its output is kizuna_case's
# log), the others in the background with logs of their own. Returns rank 0's exit status.
cluster_launch() { # hosts ranks-per-host name extra-environment(NAME=VALUE or "") command...
  local hosts=$1 ppn=$2 name=$3 extra=$4; shift 4
  local n=$((hosts * ppn)) uid="$BUILD/cluster-uid-$name" pids=() r rc
  rm -f "$uid"
  CLUSTER_PORT=$((CLUSTER_PORT + 1))
  local envs=(KIZUNA_TIMEOUT=120 KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT "KIZUNA_UNIQUE_ID_FILE=$uid"
    "KIZUNA_ROOT=${HOST_ADDR[0]}:$CLUSTER_PORT" "WORLD_SIZE=$n" "LOCAL_WORLD_SIZE=$ppn")
  [[ -n $extra ]] && envs+=("$extra")
  for ((r = 1; r < n; r++)); do
    env "${envs[@]}" RANK=$r LOCAL_RANK=$((r % ppn)) "$NETNS" exec "$NS_PFX" $((r / ppn)) -- \
      timeout -k 5 300 "$@" >"$BUILD/logs/$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  env "${envs[@]}" RANK=0 LOCAL_RANK=0 "$NETNS" exec "$NS_PFX" 0 -- timeout -k 5 300 "$@"
  rc=$?
  # A rank 0 that failed leaves the others waiting for it until their own deadline: give them 10 s
  # to notice, then stop what is left (only this script's processes live in the namespaces).
  if [[ $rc -ne 0 ]]; then
    local waited alive p
    for ((waited = 0; waited < 10; waited++)); do
      alive=0
      for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
      [[ $alive -eq 0 ]] && break
      sleep 1
    done
    "$NETNS" kill --name "$NS_PFX"
  fi
  for r in "${pids[@]}"; do wait "$r"; done
  return "$rc"
}

cluster_kizuna() { # lib(kizuna|kizuna-hier) shape coll size
  local lib=$1 shape=$2 coll=$3 size=$4 extra=""
  local hosts=${shape%x*} ppn=${shape#*x}
  # kizuna-hier: the hierarchical algorithms forced, beside the cost model's own choice (kizuna).
  [[ $lib == kizuna-hier ]] && extra=KIZUNA_ALGO=hier
  log "$lib $coll $hosts hosts x $ppn ranks $size"
  kizuna_case "$lib" "$coll" $((hosts * ppn)) "$size" "cluster-$lib-$shape-$coll-$size" \
    cluster_launch "$hosts" "$ppn" "cluster-$lib-$shape-$coll-$size" "$extra"
}

# Which fabrics kizuna used between the hosts, from rank 0's INFO line (the first run that has it).
cluster_fabric_note() { # shape
  local n=$((${1%x*} * ${1#*x})) line
  line=$(grep -h -o "communicator rank 0 of $n .*" "$BUILD"/logs/cluster-kizuna-"$1"-*.log 2>/dev/null | head -n 1)
  echo "NOTE cluster_fabric_$1=${line:-unknown}" >>"$RESULTS"
}

# ---- the peers ------------------------------------------------------------------------------------

# Open MPI: mpirun on host 0, the other hosts' orteds started through the agent (one from mpirun
# each: no tree spawn, so no orted has to start another); slots per host as the shape says. Its
# defaults otherwise: the TCP BTL between hosts, shared memory (vader) between the ranks of a host,
# which Open MPI only uses between ranks of one orted, so never across namespaces. Nothing is bound:
# every "host" is this machine's CPUs. Where the ranks outnumber those CPUs, they wait by yielding
# the CPU (mpi_yield_when_idle), as Open MPI does by itself in the single-host cases run with
# --oversubscribe: given slots per host, it cannot tell that the hosts share two CPUs, and its ranks
# would spin (an 8-byte AllReduce at 2 x 4 took 70-160 ms so, on a busy machine; 0.12 ms yielding).
cluster_openmpi() { # shape colls sizes
  local shape=$1 colls=$2 sizes=$3 hosts=${1%x*} ppn=${1#*x} list="" h xenv=""
  local n=$((hosts * ppn)) logf="$BUILD/logs/openmpi-cluster-$shape-${2//,/-}.log"
  missing_peer openmpi openmpi "$colls" "$n" "$sizes" && return
  for ((h = 0; h < hosts; h++)); do list+="${list:+,}${HOST_ADDR[h]}:$ppn"; done
  [[ -n "${GLIBC_TUNABLES:-}" ]] && xenv="-x GLIBC_TUNABLES"
  [[ $n -gt $(nproc) ]] && xenv+=" --mca mpi_yield_when_idle 1"
  log "openmpi $colls $hosts hosts x $ppn ranks $sizes"
  in_ns 0 "timeout 900 mpirun.openmpi --allow-run-as-root -np $n --bind-to none $xenv --host $list \
    --mca plm_rsh_agent $BUILD/netns-agent.sh --mca plm_rsh_no_tree_spawn 1 --mca btl tcp,vader,self \
    --mca btl_tcp_if_include 10.77.0.0/24 --mca oob_tcp_if_include 10.77.0.0/24 \
    $BUILD/mpi_bench_openmpi --coll $colls --sizes $sizes --lib openmpi" >"$logf" 2>&1
  collect openmpi "$colls" "$n" "$sizes" "$logf"
}

# MPICH: Hydra on host 0 with -hosts and -ppn, its proxies started through the agent. Between the
# ranks of a host MPICH uses its own shared memory (ch4's posix module: Hydra tells it which ranks
# share a host); UCX, its network module, is kept to TCP (UCX_TLS): its own shared-memory transports
# would reach across the namespaces.
cluster_mpich() { # shape colls sizes
  local shape=$1 colls=$2 sizes=$3 hosts=${1%x*} ppn=${1#*x} list="" h
  local n=$((hosts * ppn)) logf="$BUILD/logs/mpich-cluster-$shape-${2//,/-}.log"
  missing_peer mpich mpich "$colls" "$n" "$sizes" && return
  for ((h = 0; h < hosts; h++)); do list+="${list:+,}${HOST_ADDR[h]}"; done
  log "mpich $colls $hosts hosts x $ppn ranks $sizes"
  local ncolls ncases
  ncolls=$(tr ',' '\n' <<<"$colls" | wc -l)
  ncases=$((ncolls * $(tr ',' '\n' <<<"$sizes" | wc -l)))
  in_ns 0 "timeout 900 mpirun.mpich -launcher rsh -launcher-exec $BUILD/netns-agent.sh -hosts $list -np $n -ppn $ppn \
    -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0 -genv UCX_LOG_LEVEL error \
    $BUILD/mpi_bench_mpich --coll $colls --sizes $sizes --lib mpich" >"$logf" 2>&1 &
  wait_hydra $! "$logf" "$ncases"
  collect mpich "$colls" "$n" "$sizes" "$logf"
}

# Gloo: race.sh's gloo_run, ranks-per-host ranks in each host on its eth0 address, TCP between every
# pair (Gloo has no shared-memory transport).
cluster_gloo() { # shape colls sizes
  local shape=$1 colls=$2 sizes=$3 hosts=${1%x*} ppn=${1#*x}
  local n=$((hosts * ppn)) name="cluster-$shape-${2//,/-}"
  missing_peer gloo gloo "$colls" "$n" "$sizes" && return
  log "gloo $colls $hosts hosts x $ppn ranks $sizes"
  gloo_run "$colls" "$n" "$sizes" "$name" "$ppn"
  collect gloo "$colls" "$n" "$sizes" "$BUILD/logs/gloo-$name.log"
}

# ---- run ------------------------------------------------------------------------------------------

cluster_cases() {
  local shape lib size coll peer ppn ar_sizes
  for shape in "${CLUSTER_SHAPES[@]}"; do
    SHAPE=$shape
    ppn=${shape#*x}
    ar_sizes=("${CLUSTER_AR_SIZES[@]}")
    if [[ $shape == 2x1 && $RUN_TWO_HOST -eq 1 ]]; then
      # The two-host case that just ran is this shape's AllReduce (the same hosts, launchers and
      # peers, at every size here and 256 MiB): the table takes its figures instead of a second run.
      ar_sizes=()
      for size in "${CLUSTER_AR_SIZES[@]}"; do
        [[ " ${NETNS_SIZES[*]} " == *" $size "* ]] || ar_sizes+=("$size")
      done
      echo "NOTE cluster_2x1_allreduce=two-host" >>"$RESULTS"
    fi
    for lib in kizuna kizuna-hier; do
      # The hierarchy needs several ranks on a host; with one it is the flat algorithm.
      [[ $lib == kizuna-hier && $ppn -eq 1 ]] && continue
      for size in "${ar_sizes[@]}"; do cluster_kizuna "$lib" "$shape" allreduce "$size"; done
      for coll in "${CLUSTER_OTHER_COLLS[@]}"; do cluster_kizuna "$lib" "$shape" "$coll" "$CLUSTER_OTHER_SIZE"; done
    done
    [[ -n $(compgen -G "$BUILD/logs/cluster-kizuna-$shape-*.log") ]] && cluster_fabric_note "$shape"
    for peer in "${CLUSTER_PEERS[@]}"; do
      [[ ${#ar_sizes[@]} -gt 0 ]] && "cluster_$peer" "$shape" allreduce "$(join "${ar_sizes[@]}")"
      [[ ${#CLUSTER_OTHER_COLLS[@]} -gt 0 ]] &&
        "cluster_$peer" "$shape" "$(join "${CLUSTER_OTHER_COLLS[@]}")" "$CLUSTER_OTHER_SIZE"
    done
  done
  # shellcheck disable=SC2034 # race.sh's fail, collect and kizuna_case read it
  SHAPE=""
}
