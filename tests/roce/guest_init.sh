#!/bin/bash
# The Soft-RoCE guest's PID 1 (tests/roce/README.md). The image's /sbin/kizuna-init mounted the
# host's 9p share on /mnt/kizuna and exec'ed this script from it. It prepares the guest, creates the
# Soft-RoCE devices, runs guest_tests.sh, and always powers the VM off, so the host never waits for
# its deadline unless the guest hangs.
#
# Soft-RoCE devices (rdma_rxe), all in the one network namespace:
#   rxe_dummy   on dummy0  10.90.0.1/24 and 10.90.0.2/24 (two IPv4-mapped RoCE v2 GIDs; any number
#               of processes share it with no tricks)
#   rxe_veth0   on veth0   10.91.0.1/24 } the two ends of a veth pair: two "hosts". Both addresses
#   rxe_veth1   on veth1   10.91.0.2/24 } are local, so without policy routing the kernel would send
#               their traffic through lo and the QPs would fail to reach RTR (README.md).
# Results go to /mnt/kizuna/results (the host's results folder): results.txt (one line per step,
# then DONE), one log per step, and setup.log.

export PATH=/usr/sbin:/usr/bin:/sbin:/bin
SHARE=/mnt/kizuna
RESULTS=$SHARE/results
export SHARE RESULTS
mkdir -p "$RESULTS"

poweroff_now() {
  sync
  umount "$SHARE" 2>/dev/null
  echo o >/proc/sysrq-trigger
  sleep 30
}

# A setup failure is a step of its own; the tests then do not run (they would only time out).
setup_failed() {
  echo "kizuna-guest: setup failed: $*" | tee -a "$RESULTS/setup.log"
  echo "setup FAIL rc=1 $((SECONDS - t0))s $*" >>"$RESULTS/results.txt"
  echo "DONE" >>"$RESULTS/results.txt"
  poweroff_now
}

setup() {
  local t0=$SECONDS
  set -x # the log shows each command, so a failure names it
  mount -t tmpfs -o mode=1777 tmpfs /tmp || return 1
  mount -t tmpfs tmpfs /run || return 1
  mkdir -p /dev/shm /dev/pts && mount -t tmpfs -o mode=1777 tmpfs /dev/shm || return 1
  hostname kizuna-roce
  echo 1 >/proc/sys/kernel/sysrq

  echo "== kernel $(uname -r), $(nproc) cpus, $(awk '/MemTotal/ {print $2 " kB"}' /proc/meminfo)"
  modprobe -a dummy veth ib_uverbs rdma_rxe || { echo "modprobe dummy veth ib_uverbs rdma_rxe failed"; return 1; }
  ip link set lo up || return 1

  # The forwarding-free "loop" between the veth ends: accept packets from a local source address,
  # no reverse-path filter.
  local f
  for f in /proc/sys/net/ipv4/conf/{all,default}/rp_filter; do echo 0 >"$f"; done
  for f in /proc/sys/net/ipv4/conf/{all,default}/accept_local; do echo 1 >"$f"; done

  echo "== dummy0"
  # modprobe dummy may have made dummy0 already (numdummies defaults to 1).
  ip link show dummy0 >/dev/null 2>&1 || ip link add dummy0 type dummy || return 1
  ip addr add 10.90.0.1/24 dev dummy0 || return 1
  ip addr add 10.90.0.2/24 dev dummy0 || return 1
  ip link set dummy0 up || return 1
  rdma link add rxe_dummy type rxe netdev dummy0 || { echo "rdma link add rxe_dummy failed"; return 1; }

  echo "== veth0 <-> veth1"
  ip link add veth0 type veth peer name veth1 || return 1
  ip addr add 10.91.0.1/24 dev veth0 || return 1
  ip addr add 10.91.0.2/24 dev veth1 || return 1
  ip link set veth0 up || return 1
  ip link set veth1 up || return 1
  for f in veth0 veth1; do
    echo 0 >/proc/sys/net/ipv4/conf/$f/rp_filter
    echo 1 >/proc/sys/net/ipv4/conf/$f/accept_local
  done
  # Policy routing: locally generated traffic between the two addresses leaves through the veth
  # end that owns the source address (tables 91 and 92, consulted before 'local'); what arrives on
  # a veth end is delivered locally as usual. The 'local' rule moves from priority 0 to 1000.
  ip route add 10.91.0.2/32 dev veth0 src 10.91.0.1 table 91 || return 1
  ip route add 10.91.0.1/32 dev veth1 src 10.91.0.2 table 92 || return 1
  ip rule add pref 100 iif lo from 10.91.0.1 to 10.91.0.2 lookup 91 || return 1
  ip rule add pref 101 iif lo from 10.91.0.2 to 10.91.0.1 lookup 92 || return 1
  ip rule add pref 1000 lookup local || return 1
  ip rule del pref 0 lookup local || return 1
  # Static neighbours: ARP between two local addresses is not answered reliably.
  ip neigh replace 10.91.0.2 lladdr "$(cat /sys/class/net/veth1/address)" dev veth0 nud permanent || return 1
  ip neigh replace 10.91.0.1 lladdr "$(cat /sys/class/net/veth0/address)" dev veth1 nud permanent || return 1
  rdma link add rxe_veth0 type rxe netdev veth0 || { echo "rdma link add rxe_veth0 failed"; return 1; }
  rdma link add rxe_veth1 type rxe netdev veth1 || { echo "rdma link add rxe_veth1 failed"; return 1; }

  echo "== state"
  ip -br addr
  ip rule
  ip route get 10.91.0.2 from 10.91.0.1
  rdma link
  set +x
  echo "setup took $((SECONDS - t0)) s"
}

mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
up=$(cut -d' ' -f1 /proc/uptime)
: >"$RESULTS/results.txt"
echo "boot PASS rc=0 ${up%.*}s kernel $(uname -r) up until this script ran" >>"$RESULTS/results.txt"
echo "kizuna-guest: setting up Soft-RoCE (log: results/setup.log)"
t0=$SECONDS
setup >"$RESULTS/setup.log" 2>&1 || setup_failed "see setup.log: $(tail -n 1 "$RESULTS/setup.log")"
echo "setup PASS rc=0 $((SECONDS - t0))s rxe_dummy (dummy0), rxe_veth0/rxe_veth1 (veth pair, policy routing)" >>"$RESULTS/results.txt"

echo "kizuna-guest: running guest_tests.sh"
bash "$SHARE/guest_tests.sh"
echo "kizuna-guest: tests finished (exit $?); powering off"
echo "DONE" >>"$RESULTS/results.txt"
poweroff_now
