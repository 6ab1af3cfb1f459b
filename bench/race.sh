#!/usr/bin/env bash
# The race (issue 10): builds the peer programs (Open MPI, MPICH, Gloo) and the ceiling probe with the
# system compilers, builds kizuna-bench and kizuna-run with Bazel, then runs every case on every
# library in one run and prints one table of ratios (bench/README.md explains it).
#
#   bench/race.sh [--quick] [--only-cluster] [--skip-cluster] [--skip-netns] [--rounds N] [--plain-malloc]
#                 [--out FILE] [--plot FILE.svg] [--build-dir DIR]
#
# Nothing leaves this machine: the peers talk over shared memory and 127.0.0.1, and the
# two-host case and the cluster cases (race_cluster.sh) run between hosts made of network namespaces
# (tools/netns/kizuna-netns), which this script creates and always removes, with addresses that exist
# only inside them.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
BUILD="${TMPDIR:-/tmp}/kizuna-race"
OUT=""
PLOT=""
QUICK=0
SKIP_NETNS=0
ONLY_CLUSTER=0
SKIP_CLUSTER=0
PLAIN_MALLOC=0
ROUNDS=1
START=$SECONDS

usage() {
  cat <<EOF
usage: bench/race.sh [--quick] [--only-cluster] [--skip-cluster] [--skip-netns] [--rounds N] [--plain-malloc]
                     [--out FILE] [--plot FILE.svg] [--build-dir DIR]
  --quick        a smoke run: n = 2, AllReduce at 8 B and 1 MiB, kizuna and Open MPI only (cluster: 2 x 1
                 and 2 x 4 hosts x ranks)
  --only-cluster only the cluster cases (hosts made of network namespaces) and the TCP floor
  --skip-cluster leave out the cluster cases
  --skip-netns   leave out everything between network namespaces: the two-host case and the cluster
                 cases (they need root and 'ip netns')
  --rounds N     run everything between network namespaces N times over, each library once per round, and
                 take each case's median round (one run on a shared machine can land in a slow spell)
  --plain-malloc run every program with glibc's default malloc settings (see MALLOC below)
  --out FILE     also write the table as Markdown to FILE
  --plot FILE    draw every library's busbw in each case into FILE (SVG)
  --build-dir D  where the peers are built and the logs go (default \$TMPDIR/kizuna-race)
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --quick) QUICK=1 ;;
    --skip-netns) SKIP_NETNS=1 ;;
    --only-cluster) ONLY_CLUSTER=1 ;;
    --skip-cluster) SKIP_CLUSTER=1 ;;
    --plain-malloc) PLAIN_MALLOC=1 ;;
    --rounds)
      [[ $# -ge 2 && $2 =~ ^[1-9][0-9]*$ ]] || { echo "race: --rounds needs a count of 1 or more" >&2; exit 2; }
      ROUNDS="$2"; shift ;;
    --out) [[ $# -ge 2 ]] || { echo "race: --out needs a file name" >&2; exit 2; }; OUT="$2"; shift ;;
    --plot) [[ $# -ge 2 ]] || { echo "race: --plot needs a file name" >&2; exit 2; }; PLOT="$2"; shift ;;
    --build-dir) [[ $# -ge 2 ]] || { echo "race: --build-dir needs a directory" >&2; exit 2; }; BUILD="$2"; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "race: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
[[ $ONLY_CLUSTER -eq 1 && ($SKIP_CLUSTER -eq 1 || $SKIP_NETNS -eq 1) ]] &&
  { echo "race: --only-cluster cannot go with --skip-cluster or --skip-netns" >&2; exit 2; }
[[ -n "$OUT" && "$OUT" != /* ]] && OUT="$PWD/$OUT"
[[ -n "$PLOT" && "$PLOT" != /* ]] && PLOT="$PWD/$PLOT"

log() { printf 'race [%3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { echo "race: $*" >&2; exit 1; }

# ---- packages ----------------------------------------------------------------------------------

# Debian's names: the MPI compiler wrappers and launchers come as mpicc.openmpi / mpirun.openmpi and
# mpicc.mpich / mpirun.mpich; libgloo-dev installs /usr/include/gloo and /usr/lib/libgloo.so.
# What every part needs (a failure to install it stops the race), then each peer's own packages: a
# peer whose packages fail to install, or whose program fails to build, is recorded as missing with
# the reason (MISSING), its cases say so in the table, and the race goes on without it.
BASE_PACKAGES=(gcc g++ python3 iproute2 util-linux)
declare -A PEER_PACKAGES=([openmpi]="openmpi-bin libopenmpi-dev" [mpich]="mpich libmpich-dev" [gloo]="libgloo-dev")
declare -A MISSING=()
not_installed() { # packages... -> those dpkg does not have installed
  local p
  for p in "$@"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || echo "$p"
  done
}
APT_UPDATED=0
apt_install() { # packages... -> 0, or 1 with apt-get's first error on stdout
  local sudo=() out
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || { echo "not root and no sudo (as root: apt-get install $*)"; return 1; }
    sudo=(sudo)
  fi
  log "installing: $*"
  # Another apt-get on this machine holds the lock for a while: wait for it rather than fail.
  local apt=("${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -q -o DPkg::Lock::Timeout=600)
  if [[ $APT_UPDATED -eq 0 ]]; then
    out=$("${apt[@]}" update 2>&1) || { echo "apt-get update failed: $(grep -m1 '^E:' <<<"$out")"; return 1; }
    APT_UPDATED=1
  fi
  out=$("${apt[@]}" install -y --no-install-recommends "$@" 2>&1) ||
    { echo "apt-get install $* failed: $(grep -m1 '^E:' <<<"$out" || tail -n 1 <<<"$out")"; return 1; }
}
mapfile -t missing < <(not_installed "${BASE_PACKAGES[@]}")
if [[ ${#missing[@]} -gt 0 ]]; then
  why=$(apt_install "${missing[@]}") || die "$why"
fi
for peer in openmpi mpich gloo; do
  # shellcheck disable=SC2086 # the package lists are words
  mapfile -t missing < <(not_installed ${PEER_PACKAGES[$peer]})
  [[ ${#missing[@]} -eq 0 ]] && continue
  why=$(apt_install "${missing[@]}") || { MISSING[$peer]="not installed: $why"; log "$peer missing: $why"; }
done

# ---- build -------------------------------------------------------------------------------------

mkdir -p "$BUILD/logs" || die "cannot create $BUILD"
rm -f "$BUILD"/logs/* "$BUILD/results.txt"
RESULTS="$BUILD/results.txt"
: >"$RESULTS"

log "building the peers and the ceiling in $BUILD"
CFLAGS=(-O2 -std=c11 -D_GNU_SOURCE -Wall -Wextra)
# A peer program that does not build makes its peer missing (the compiler's first error says why).
build_peer() { # peer command...
  local peer=$1; shift
  [[ -n ${MISSING[$peer]:-} ]] && return
  local out
  out=$("$@" 2>&1) && return
  MISSING[$peer]="build failed: $1: $(grep -m1 -i 'error' <<<"$out" || head -n 1 <<<"$out")"
  log "$peer missing: ${MISSING[$peer]}"
}
build_peer openmpi mpicc.openmpi "${CFLAGS[@]}" -o "$BUILD/mpi_bench_openmpi" "$ROOT/bench/mpi_bench.c"
build_peer mpich mpicc.mpich "${CFLAGS[@]}" -o "$BUILD/mpi_bench_mpich" "$ROOT/bench/mpi_bench.c"
build_peer gloo g++ -std=c++17 -O2 -Wall -Wextra -o "$BUILD/gloo_bench" "$ROOT/bench/gloo_bench.cc" -lgloo -pthread
gcc -std=c11 -O3 -march=native -Wall -Wextra -o "$BUILD/ceiling" "$ROOT/bench/ceiling.c" -pthread ||
  die "building ceiling failed"
# The floors: one cache line between two processes (8 B), one TCP connection both ways (TCP),
# handing a CPU from one process to another (n processes on fewer CPUs, as many as the case).
for probe in line_probe tcp_probe switch_probe; do
  gcc -std=c11 -O3 -Wall -Wextra -o "$BUILD/$probe" "$ROOT/bench/$probe.c" -pthread || die "building $probe failed"
done

log "building kizuna-bench and kizuna-run with bazel"
# Without an NVIDIA driver the race runs on emulated devices only: the CUDA backend's kernels
# (nvcc for every architecture) are left out, about 40 s of a 2-core cold build (205 s, not 244).
# No debug line tables either (-g0 after the project's -g1: the code is the same): host_reduce.cc
# compiles in 7.6 s instead of 10.8, kizuna_bench.cc in 16.0 instead of 17.0.
BAZEL_CONFIG=(--copt=-g0)
[[ -e /dev/nvidiactl ]] || BAZEL_CONFIG+=(--config=nocuda)
(cd "$ROOT" && bazel build "${BAZEL_CONFIG[@]}" //tools/bench:kizuna-bench //tools/run:kizuna-run) >"$BUILD/logs/bazel.log" 2>&1 ||
  die "bazel build failed: see $BUILD/logs/bazel.log"
KZ_BIN="$(cd "$ROOT" && bazel info "${BAZEL_CONFIG[@]}" bazel-bin 2>/dev/null)"
KZ_BENCH="$KZ_BIN/tools/bench/kizuna-bench"
KZ_RUN="$KZ_BIN/tools/run/kizuna-run"
[[ -x "$KZ_BENCH" && -x "$KZ_RUN" ]] || die "kizuna-bench or kizuna-run missing under $KZ_BIN"

# ---- cases -------------------------------------------------------------------------------------

if [[ $QUICK -eq 1 ]]; then
  ALLREDUCE_RANKS=(2); ALLREDUCE_SIZES=(8 1M); OTHER_RANKS=(); OTHER_COLLS=(); PEERS=(openmpi)
  NETNS_SIZES=(8 1M)
else
  ALLREDUCE_RANKS=(2 4 8); ALLREDUCE_SIZES=(8 1M 64M 256M); OTHER_RANKS=(2 8)
  OTHER_COLLS=(reducescatter allgather broadcast); PEERS=(openmpi mpich gloo)
  NETNS_SIZES=(8 1M 64M 256M)
fi
OTHER_SIZE=64M
join() { local IFS=,; echo "$*"; }

bytes_of() {
  case "$1" in *K) echo $(( ${1%K} << 10 ));; *M) echo $(( ${1%M} << 20 ));; *G) echo $(( ${1%G} << 30 ));; *) echo "$1";; esac
}

# kizuna-bench runs with --timing median: each call after a barrier, the slowest rank's time, the
# median (the peers' method). The peers' rule, clamp(1 s / estimate, 5, 1000), gives 1000
# iterations at 8 B and at 1 MiB (every case here takes under 1 ms there); so does this. At 1 MiB
# it matters across hosts: a TCP connection's first hundred or so 1 MiB messages run at half
# speed (the kernel grows its buffers as they are used), which a median over 200 calls after 5
# warm-ups still showed (2 x 1: 1.3 ms over 200 calls, 0.54-0.62 ms over 1000). 64 MiB: the
# rule's 15-20.
kizuna_iters() {
  case "$1" in 8) echo 1000;; 1M) echo 1000;; 64M) echo 20;; *) echo 5;; esac
}

# The cluster cases (race_cluster.sh) set SHAPE (hosts x ranks per host, "2x4") while they run: every
# RESULT and FAIL line then says shape=2x4 after the library's name, which keeps them apart from the
# single-host cases of the same rank count in the table.
SHAPE=""
shape_field() { [[ -z $SHAPE ]] || echo " shape=$SHAPE"; }

# Records a case that produced no RESULT line, so the table says "error" and why.
fail() { # lib coll n bytes reason...
  local lib=$1 coll=$2 n=$3 bytes=$4; shift 4
  echo "FAIL lib=$lib$(shape_field) coll=$coll n=$n bytes=$bytes why=$(echo "$*" | tr -s ' \n\t' ' ' | cut -c1-200)" \
    >>"$RESULTS"
}

# A peer that could not be installed or built: each of its cases is recorded as missing, with why.
missing_peer() { # peer lib coll-list n size-list -> 0 when the peer is missing (its cases recorded)
  local peer=$1 lib=$2 colls=$3 n=$4 sizes=$5 c s
  [[ -n ${MISSING[$peer]:-} ]] || return 1
  for c in ${colls//,/ }; do
    for s in ${sizes//,/ }; do fail "$lib" "$c" "$n" "$(bytes_of "$s")" "missing: ${MISSING[$peer]}"; done
  done
}

# One kizuna measurement: kizuna-bench's JSON turned into the peers' RESULT form.
# kizuna_case LIB(kizuna|kizuna-host) COLL N SIZE LOGNAME RUNNER...
kizuna_case() {
  local lib=$1 coll=$2 n=$3 size=$4 name=$5; shift 5
  local json="$BUILD/logs/$name.json" logf="$BUILD/logs/$name.log" buffers=device
  [[ $lib == kizuna-host ]] && buffers=host
  rm -f "$json"
  "$@" "$KZ_BENCH" --coll "$coll" -b "$size" -e "$size" -n "$(kizuna_iters "$size")" -w 5 -c 1 --timing median --placement out \
    --buffers "$buffers" --json "$json" >"$logf" 2>&1
  local rc=$?
  python3 - "$json" "$lib$(shape_field)" "$coll" "$n" "$(bytes_of "$size")" "$rc" "$logf" >>"$RESULTS" <<'EOF'
import json, re, sys
path, lib, coll, n, nbytes, rc, logf = sys.argv[1:]
def why():
    lines = [l for l in open(logf, errors="replace").read().splitlines() if l.strip()]
    keep = [l for l in lines if re.search(r"kizuna-bench:|error|Error|failed", l)]
    text = re.sub(r"^\[\d+\] ", "", (keep or lines or ["exit status " + rc])[0])
    text = re.sub(r"host_emulated:\d+", "host_emulated", text)  # one message, whichever rank said it
    return " ".join(text.split())[:200]
try:
    d = json.load(open(path))
except Exception:
    print(f"FAIL lib={lib} coll={coll} n={n} bytes={nbytes} why=exit status {rc}: {why()}")
    sys.exit(0)
rows = d.get("rows") or []
if d.get("error") or not rows:
    print(f"FAIL lib={lib} coll={coll} n={n} bytes={nbytes} why={' '.join(str(d.get('error') or why()).split())[:200]}")
    sys.exit(0)
r = rows[0]["out_of_place"]
print(f"RESULT lib={lib} coll={coll} n={n} bytes={rows[0]['size']} iters={d['iters']} time_us={r['time_us']:.2f} "
      f"busbw={r['busbw_gbps']:.4f} wrong={r['wrong']} algo={rows[0]['algo']}")
EOF
}

# Set when kizuna-bench refuses --buffers host for the backend: every later host-buffer case would be
# refused the same way, so it is recorded with that reason instead of being run again.
KZ_HOST_REFUSED=""

kizuna_local() { # coll n sizes...
  local coll=$1 n=$2; shift 2
  for size in "$@"; do
    for lib in kizuna kizuna-host; do
      if [[ $lib == kizuna-host && -n $KZ_HOST_REFUSED ]]; then
        fail "$lib" "$coll" "$n" "$(bytes_of "$size")" "$KZ_HOST_REFUSED"
        continue
      fi
      log "$lib $coll n=$n $size"
      kizuna_case "$lib" "$coll" "$n" "$size" "$lib-$coll-$n-$size" \
        env KIZUNA_TIMEOUT=120 "$KZ_RUN" -n "$n" --timeout 300 --
      local last; last=$(tail -n 1 "$RESULTS")
      if [[ $lib == kizuna-host && $last == "FAIL lib=kizuna-host "*"--buffers host:"* ]]; then
        KZ_HOST_REFUSED=${last#* why=}
      fi
    done
  done
}

# A peer's run: its RESULT lines go to the results (with SHAPE's field); a case it did not print is
# recorded as failed.
collect() { # lib coll-list n size-list logfile
  local lib=$1 colls=$2 n=$3 sizes=$4 logf=$5 c s why
  grep "^RESULT lib=$lib " "$logf" | sed "s/^RESULT lib=$lib /RESULT lib=$lib$(shape_field) /" >>"$RESULTS"
  for c in ${colls//,/ }; do
    for s in ${sizes//,/ }; do
      if ! grep "^RESULT lib=$lib coll=$c n=$n " "$logf" | grep -q " bytes=$(rounded_bytes "$c" "$n" "$s") "; then
        why=$(grep -v '^RESULT' "$logf" | grep -i -m1 'error\|abort\|fail\|timed out' || true)
        fail "$lib" "$c" "$n" "$(bytes_of "$s")" "${why:-no result line (see $logf)}"
      fi
    done
  done
}

# The byte count a peer reports: reducescatter and allgather round to a multiple of n floats.
rounded_bytes() { # coll n size
  local b; b=$(bytes_of "$3")
  case "$1" in reducescatter|allgather) local c=$((b / 4 / $2 * $2)); [[ $c -eq 0 ]] && c=$2; echo $((c * 4));;
    *) [[ $b -lt 4 ]] && b=4; echo $((b / 4 * 4));; esac
}

openmpi_local() { # colls n sizes
  local bind=(--bind-to core)
  [[ $2 -gt 2 ]] && bind=(--oversubscribe --bind-to none)
  log "openmpi $1 n=$2 $3"
  local logf="$BUILD/logs/openmpi-$1-$2.log"
  local envx=()
  [[ -n "${GLIBC_TUNABLES:-}" ]] && envx=(-x GLIBC_TUNABLES)
  timeout 600 mpirun.openmpi --allow-run-as-root -np "$2" "${bind[@]}" "${envx[@]}" "$BUILD/mpi_bench_openmpi" \
    --coll "$1" --sizes "$3" --lib openmpi >"$logf" 2>&1
  collect openmpi "$1" "$2" "$3" "$logf"
}

mpich_local() {
  log "mpich $1 n=$2 $3"
  local logf="$BUILD/logs/mpich-$1-$2.log"
  timeout 600 mpirun.mpich -np "$2" "$BUILD/mpi_bench_mpich" --coll "$1" --sizes "$3" --lib mpich >"$logf" 2>&1
  collect mpich "$1" "$2" "$3" "$logf"
}

# Gloo: n processes, a FileStore in a fresh directory (every host sees it, as a shared file system).
# "local": every rank on 127.0.0.1; a number PPN: ranks fill the hosts of tools/netns/kizuna-netns in
# order, PPN per host (rank r on host r / PPN), each on its host's eth0 address.
gloo_run() { # colls n sizes logname local|PPN
  local colls=$1 n=$2 sizes=$3 name=$4 where=$5
  local store="$BUILD/gloo-store-$name" logf="$BUILD/logs/gloo-$name.log" pids=() r
  rm -rf "$store"; mkdir -p "$store"
  for ((r = 0; r < n; r++)); do
    local prefix=() addr=127.0.0.1
    if [[ $where != local ]]; then
      prefix=("$NETNS" exec "$NS_PFX" "$((r / where))" --)
      addr=${HOST_ADDR[r / where]}
    fi
    timeout 600 "${prefix[@]}" "$BUILD/gloo_bench" --rank "$r" --size "$n" --store "$store" --addr "$addr" \
      --coll "$colls" --sizes "$sizes" >"$BUILD/logs/gloo-$name.rank$r.log" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
  cp "$BUILD/logs/gloo-$name.rank0.log" "$logf"
  for ((r = 1; r < n; r++)); do grep -v '^RESULT' "$BUILD/logs/gloo-$name.rank$r.log" >>"$logf"; done
  rm -rf "$store"
}

gloo_local() {
  log "gloo $1 n=$2 $3"
  gloo_run "$1" "$2" "$3" "$1-$2" local
  collect gloo "$1" "$2" "$3" "$BUILD/logs/gloo-$1-$2.log"
}

peer_local() { # peer colls n sizes
  missing_peer "$1" "$1" "$2" "$3" "$4" && return
  case "$1" in openmpi) openmpi_local "$2" "$3" "$4";; mpich) mpich_local "$2" "$3" "$4";; gloo) gloo_local "$2" "$3" "$4";; esac
}

# ---- hosts made of network namespaces --------------------------------------------------------------

# Hosts from tools/netns/kizuna-netns: namespaces $NS_PFX-h0, $NS_PFX-h1, ..., each with eth0 on one
# bridge (in $NS_PFX-br), 10.77.0.1, 10.77.0.2, ... (HOST_ADDR), and its own host name: kizuna and the
# MPI launchers tell hosts apart by name, so ranks in two namespaces are treated as two hosts, not
# two processes of one. The two-host case uses hosts 0 and 1 (A and B); the cluster cases as many
# as their shapes have.
NETNS="$ROOT/tools/netns/kizuna-netns"
NS_PFX="kzrace$$"
HOST_ADDR=()
NETNS_UP=0
netns_down() {
  [[ $NETNS_UP -eq 1 ]] || return 0
  # Only processes this script started live in these namespaces; 'down' stops them.
  "$NETNS" down --name "$NS_PFX"
  NETNS_UP=0
  log "removed the network namespaces of $NS_PFX"
}
trap 'netns_down' EXIT
trap 'netns_down; exit 130' INT TERM

netns_up() { # hosts
  NETNS_UP=1
  "$NETNS" up --name "$NS_PFX" --hosts "$1" --env-file "$BUILD/netns.env" >/dev/null 2>"$BUILD/logs/netns.log" ||
    return 1
  # shellcheck source=/dev/null
  source "$BUILD/netns.env"
  local i var
  for ((i = 0; i < $1; i++)); do var="KZNS_HOST_${i}_ADDR"; HOST_ADDR[i]=${!var}; done
}

in_ns() { # A|B|host-index command... (a string run by sh)
  local host=$1
  [[ $host == A ]] && host=0
  [[ $host == B ]] && host=1
  shift
  "$NETNS" exec "$NS_PFX" "$host" -- sh -c "$*"
}

# An rsh-style agent for mpirun: the "remote host" is a namespace's address, reached with
# 'kizuna-netns exec' instead of ssh.
write_agent() {
  local i cases=""
  for i in "${!HOST_ADDR[@]}"; do cases+="  ${HOST_ADDR[i]}) index=$i ;;"$'\n'; done
  cat >"$BUILD/netns-agent.sh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do case "\$1" in -*) shift ;; *) break ;; esac; done
host=\$1; shift
case "\$host" in
$cases  *) echo "netns-agent: unknown host \$host" >&2; exit 1 ;;
esac
exec "$NETNS" exec "$NS_PFX" "\$index" -- sh -c "\$*"
EOF
  chmod +x "$BUILD/netns-agent.sh"
}

# The TCP floor: 64 MiB each way at once between hosts 0 and 1 over one connection, then four; then
# the same with each end reducing half of what arrives, as a 2-rank AllReduce must (--reduce).
tcp_floor() {
  local conns coll probe_pid reduce
  for reduce in "" --reduce; do
    for conns in 1 4; do
      log "floor: $conns TCP connection(s) both ways between the namespaces, 64 MiB ${reduce:+(reducing)}"
      coll=tcp-duplex${reduce:+-reduce}
      [[ $conns -gt 1 ]] && coll=$coll-$conns
      in_ns A "timeout 60 $BUILD/tcp_probe --listen 29519 --bytes $((64 << 20)) --connections $conns $reduce" \
        >"$BUILD/logs/$coll.log" 2>&1 &
      probe_pid=$!
      in_ns B "timeout 60 $BUILD/tcp_probe --connect ${HOST_ADDR[0]} 29519 --bytes $((64 << 20))" \
        "--connections $conns $reduce" >>"$BUILD/logs/$coll.client.log" 2>&1 ||
        fail floor "$coll" 2 $((64 << 20)) \
          "tcp_probe (connecting end) failed: $(head -c 200 "$BUILD/logs/$coll.client.log")"
      wait "$probe_pid"
      grep '^RESULT' "$BUILD/logs/$coll.log" >>"$RESULTS"
    done
  done
  # Receives that block in the kernel, then receives that poll (as the MPIs' progress loops do), then
  # polling with each direction on a connection of its own (as NCCL's net API has them).
  local poll name
  for poll in "" --poll "--poll --one-way"; do
    name=tcp-exchange${poll:+-poll}
    [[ $poll == *one-way* ]] && name=tcp-exchange-one-way-poll
    log "floor: 8 bytes each way between the namespaces, sent and received on one thread ${poll:+($poll)}"
    in_ns A "timeout 60 $BUILD/tcp_probe --listen 29519 --bytes 8 --exchanges 2000 $poll" \
      >"$BUILD/logs/tcp_probe-8${poll// /}.log" 2>&1 &
    probe_pid=$!
    in_ns B "timeout 60 $BUILD/tcp_probe --connect ${HOST_ADDR[0]} 29519 --bytes 8 --exchanges 2000 $poll" \
      >>"$BUILD/logs/tcp_probe-8${poll// /}.client.log" 2>&1 ||
      fail floor "$name" 2 8 "tcp_probe (connecting end) failed: $(head -c 200 "$BUILD/logs/tcp_probe-8${poll// /}.client.log")"
    wait "$probe_pid"
    grep '^RESULT' "$BUILD/logs/tcp_probe-8${poll// /}.log" >>"$RESULTS"
  done
}

# Hydra (MPICH's launcher) often hangs at exit after the program printed every result (10 minutes
# once; 110 s of a 120 s bound at 07:15 on 2026-11-23), so once every result is in, it gets 5 s to
# finish and is then stopped with everything else in the namespaces.
wait_hydra() { # pid logfile results-expected
  local launcher=$1 logf=$2 want=$3 grace=0
  while kill -0 "$launcher" 2>/dev/null; do
    if [[ $(grep -c '^RESULT' "$logf" 2>/dev/null) -ge $want ]]; then
      if (( grace++ >= 5 )); then
        log "mpich's launcher still running 5 s after its last result: stopped"
        "$NETNS" kill --name "$NS_PFX"
        break
      fi
    fi
    sleep 1
  done
  wait "$launcher" 2>/dev/null
}

netns_kizuna() {
  local size
  for size in "${NETNS_SIZES[@]}"; do
    log "kizuna allreduce n=2 $size, two namespaces"
    local name="kizuna-netns-$size" uid="$BUILD/netns-uid-$size"
    rm -f "$uid"
    local envs="KIZUNA_TIMEOUT=120 KIZUNA_DEBUG=INFO KIZUNA_DEBUG_SUBSYS=INIT KIZUNA_UNIQUE_ID_FILE=$uid WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1"
    local args
    args="--coll allreduce -b $size -e $size -n $(kizuna_iters "$size") -w 5 -c 1 --timing median --placement out"
    in_ns B "$envs RANK=1 timeout 300 $KZ_BENCH $args" >"$BUILD/logs/$name.rank1.log" 2>&1 &
    local other=$!
    kizuna_case kizuna-tcp allreduce 2 "$size" "$name" in_ns_a_kizuna \
      "$envs KIZUNA_ROOT=${HOST_ADDR[0]}:29517 RANK=0 timeout 300"
    wait "$other"
  done
  # Which fabric kizuna chose between the two "hosts", from rank 0's INFO line.
  local fabric
  fabric=$(grep -h -o 'communicator rank 0 of 2 .*' "$BUILD"/logs/kizuna-netns-*.log 2>/dev/null | head -1)
  echo "NOTE netns_fabric=${fabric:-unknown}" >>"$RESULTS"
}
# kizuna_case calls: RUNNER... KZ_BENCH ARGS...; this runner wraps it into namespace A.
in_ns_a_kizuna() {
  local envs=$1; shift
  local cmd="" a
  for a in "$@"; do cmd+=" '${a//\'/\'\\\'\'}'"; done
  in_ns A "$envs $cmd"
}

netns_mpi() {
  local sizes; sizes=$(join "${NETNS_SIZES[@]}")
  local hosts="${HOST_ADDR[0]},${HOST_ADDR[1]}"
  log "openmpi allreduce n=2 $sizes, two namespaces over TCP"
  local logf="$BUILD/logs/openmpi-netns.log"
  if ! missing_peer openmpi openmpi-tcp allreduce 2 "$sizes"; then
    # Both "hosts" are this machine: binding would put both ranks on core 0, so nothing is bound.
    local xenv=""
    [[ -n "${GLIBC_TUNABLES:-}" ]] && xenv="-x GLIBC_TUNABLES"
    in_ns A "timeout 600 mpirun.openmpi --allow-run-as-root -np 2 --bind-to none $xenv --host ${hosts//,/:1,}:1 \
      --mca plm_rsh_agent $BUILD/netns-agent.sh --mca btl tcp,self --mca btl_tcp_if_include 10.77.0.0/24 \
      --mca oob_tcp_if_include 10.77.0.0/24 $BUILD/mpi_bench_openmpi --coll allreduce --sizes $sizes \
      --lib openmpi-tcp" \
      >"$logf" 2>&1
    collect openmpi-tcp allreduce 2 "$sizes" "$logf"
  fi
  [[ $QUICK -eq 1 ]] && return
  log "mpich allreduce n=2 $sizes, two namespaces over TCP"
  logf="$BUILD/logs/mpich-netns.log"
  if ! missing_peer mpich mpich-tcp allreduce 2 "$sizes"; then
    # Debian's MPICH is ch4:ucx; UCX would otherwise use shared memory, which crosses namespaces.
    in_ns A "timeout 120 mpirun.mpich -launcher rsh -launcher-exec $BUILD/netns-agent.sh -hosts $hosts -np 2 -ppn 1 \
      -genv UCX_TLS tcp,self -genv UCX_NET_DEVICES eth0 -genv UCX_LOG_LEVEL error \
      $BUILD/mpi_bench_mpich --coll allreduce --sizes $sizes --lib mpich-tcp" >"$logf" 2>&1 &
    wait_hydra $! "$logf" ${#NETNS_SIZES[@]}
    collect mpich-tcp allreduce 2 "$sizes" "$logf"
  fi
  log "gloo allreduce n=2 $sizes, two namespaces over TCP"
  missing_peer gloo gloo-tcp allreduce 2 "$sizes" && return
  gloo_run allreduce 2 "$sizes" netns 1
  sed 's/lib=gloo /lib=gloo-tcp /' "$BUILD/logs/gloo-netns.log" >"$BUILD/logs/gloo-tcp-netns.log"
  collect gloo-tcp allreduce 2 "$sizes" "$BUILD/logs/gloo-tcp-netns.log"
}

# ---- the cluster cases ------------------------------------------------------------------------------

# shellcheck source=bench/race_cluster.sh
source "$ROOT/bench/race_cluster.sh"

# ---- the table ---------------------------------------------------------------------------------

# Reads the RESULT / FAIL / NOTE lines and prints the Markdown table (and writes it to FILE if
# given, and the picture to PLOT).
print_table() { # results [file [plot]]
  python3 "$ROOT/bench/race_table.py" "$@"
}

# ---- run -------------------------------------------------------------------------------------

# MALLOC: glibc serves allocations above 32 MiB with a fresh mmap and unmaps them on free, so a
# library that allocates a temporary buffer per call (Open MPI's and MPICH's AllReduce at 64 MiB and
# up) faults every page of it in on every call. A page fault costs ~13 us in this VM, which made both
# MPIs 10-20x slower at 64 MiB than at 16 MiB. Every program of the race (kizuna included) runs with
# mmap off and no trimming, so freed memory is reused: the race measures the collectives, not the
# VM's page faults. --plain-malloc runs them as shipped.
if [[ $PLAIN_MALLOC -eq 0 ]]; then
  export GLIBC_TUNABLES="glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=68719476736"
fi

echo "NOTE host=$(hostname) cpus=$(nproc) mem_gib=$(awk '/MemTotal/ {printf "%.0f", $2/1048576}' /proc/meminfo)" \
  "date=$(date -u +%Y-%m-%dT%H:%MZ) quick=$QUICK plain_malloc=$PLAIN_MALLOC" >>"$RESULTS"

# The single-host cases: every rank count on this host, the ceiling and the floors beside them.
local_cases() {
  local n peer coll ceiling_sizes
  for n in "${ALLREDUCE_RANKS[@]}"; do
    # The ceiling right before the runs it is compared with: the host's bandwidth drifts by minutes.
    log "ceiling n=$n"
    ceiling_sizes=$(join "${ALLREDUCE_SIZES[@]}" | sed 's/^8,//; s/,8,/,/')
    "$BUILD/ceiling" --ranks "$n" --sizes "$ceiling_sizes" >"$BUILD/logs/ceiling-$n.log" 2>&1 ||
      fail ceiling allreduce "$n" 0 "ceiling exited with $?"
    sed "s/^RESULT lib=ceiling coll=copy /RESULT lib=ceiling coll=copy n=$n /" "$BUILD/logs/ceiling-$n.log" |
      grep '^RESULT' >>"$RESULTS"
    if [[ $n -eq 2 ]]; then
      log "floor: one cache line between two processes"
      "$BUILD/line_probe" >"$BUILD/logs/line_probe.log" 2>&1 || fail floor line 2 0 "line_probe exited with $?"
      grep '^RESULT' "$BUILD/logs/line_probe.log" >>"$RESULTS"
    fi
    if [[ $n -ge $((2 * $(nproc))) ]]; then
      # n processes on the CPUs, as the runs below: a hand-over costs more as processes per CPU grow.
      log "floor: handing a CPU from one process to another, $n processes on $(nproc) CPUs"
      "$BUILD/switch_probe" --procs "$n" --cpus "$(nproc)" --exchanges 5000 >"$BUILD/logs/switch_probe-$n.log" 2>&1 ||
        fail floor switch-yield "$n" 0 "switch_probe exited with $?"
      grep '^RESULT' "$BUILD/logs/switch_probe-$n.log" >>"$RESULTS"
    fi
    kizuna_local allreduce "$n" "${ALLREDUCE_SIZES[@]}"
    for peer in "${PEERS[@]}"; do peer_local "$peer" allreduce "$n" "$(join "${ALLREDUCE_SIZES[@]}")"; done
  done

  for n in "${OTHER_RANKS[@]}"; do
    for coll in "${OTHER_COLLS[@]}"; do kizuna_local "$coll" "$n" "$OTHER_SIZE"; done
    for peer in "${PEERS[@]}"; do peer_local "$peer" "$(join "${OTHER_COLLS[@]}")" "$n" "$OTHER_SIZE"; done
  done
}

if [[ $ONLY_CLUSTER -eq 0 ]]; then local_cases; fi

# Everything between hosts made of network namespaces: the TCP floor, the two-host case (hosts 0
# and 1), the cluster cases (race_cluster.sh; as many hosts as their largest shape).
RUN_TWO_HOST=$((1 - ONLY_CLUSTER))
RUN_CLUSTER=$((1 - SKIP_CLUSTER))
hosts=2
[[ $RUN_CLUSTER -eq 1 ]] && hosts=$(cluster_hosts)
if [[ $SKIP_NETNS -eq 1 ]]; then
  echo "NOTE netns=skipped (--skip-netns)" >>"$RESULTS"
elif ! netns_up "$hosts"; then
  msg="kizuna-netns up failed (needs root, iproute2 and util-linux):"
  msg+=" $(head -c 200 "$BUILD/logs/netns.log" 2>/dev/null | tr '\n' ' ')"
  log "the cases between namespaces skipped: $msg"
  echo "NOTE netns=skipped ($msg)" >>"$RESULTS"
  netns_down
else
  log "hosts $NS_PFX-h0..h$((hosts - 1)) (${HOST_ADDR[*]}) on one bridge (tools/netns/kizuna-netns)"
  write_agent
  echo "NOTE rounds=$ROUNDS" >>"$RESULTS"
  for ((round = 1; round <= ROUNDS; round++)); do
    [[ $ROUNDS -gt 1 ]] && log "round $round of $ROUNDS"
    tcp_floor
    if [[ $RUN_TWO_HOST -eq 1 ]]; then
      netns_kizuna
      netns_mpi
    fi
    [[ $RUN_CLUSTER -eq 1 ]] && cluster_cases
  done
  netns_down
fi

echo "NOTE elapsed_s=$((SECONDS - START))" >>"$RESULTS"
log "done in $((SECONDS - START)) s; raw results in $RESULTS, logs in $BUILD/logs"
print_table "$RESULTS" "$OUT" "$PLOT"
