#!/usr/bin/env bash
# Builds (once) the Debian guest the Soft-RoCE harness boots: a bookworm minbase root file system
# from Debian packages, made into an ext4 image without a loop mount (mkfs.ext4 -d), compressed to
# qcow2, with the guest kernel and its initrd extracted beside it (README.md).
#
#   tests/roce/build_image.sh [--force] [--print-dir]
#
# The image lives outside the clone, in ${KIZUNA_CACHE:-$HOME/.cache/kizuna}/roce-vm/. A stamp file
# holds a hash of everything that decides the image's content (the package list, the mirror, the
# in-image init below, this format's version); a different hash rebuilds it. Needs root (or sudo)
# for debootstrap and chroot; installs debootstrap and qemu-utils on demand.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
CACHE="${KIZUNA_CACHE:-$HOME/.cache/kizuna}/roce-vm"
SUITE=bookworm
FORMAT=3 # bump when the way the image is made changes
FORCE=0
PRINT_DIR=0

# The guest's packages: the Soft-RoCE stack and tools, plus the shared libraries kizuna's binaries
# load at run time (ldd on bazel-bin's kizuna-run, kizuna-bench, kizuna-p2p and the conformance
# binary; libibverbs1, librdmacm1, libfabric1 and libze1 are dlopen'ed or linked by fabrics).
GUEST_PACKAGES=(
  linux-image-amd64 initramfs-tools kmod udev iproute2 procps
  rdma-core ibverbs-providers ibverbs-utils rdmacm-utils perftest
  libibverbs1 librdmacm1 libfabric1 libhwloc15 libtbb12 libfmt9 libssl3 libze1 libstdc++6
)

# The initrd holds only what reaches the root disk (MODULES=list: these and their dependencies), so
# it is small, quick to make and quick to unpack under TCG; 9p and rdma_rxe load later from the
# root file system.
INITRD_MODULES=(virtio_pci virtio_blk ext4 crc32c_generic)

# The image's init (the kernel's init=): mounts the 9p share the host passes and hands over to the
# guest_init.sh found there, so the test scripts change without rebuilding the image. Any failure
# before that prints why and powers off, so the host never waits for its deadline.
read -r -d '' IMAGE_INIT <<'EOF' || true
#!/bin/sh
# kizuna Soft-RoCE guest: mount the host's share and run its guest_init.sh (tests/roce/).
PATH=/usr/sbin:/usr/bin:/sbin:/bin
export PATH
mount -t proc proc /proc 2>/dev/null
mount -t sysfs sysfs /sys 2>/dev/null
mount -t devtmpfs devtmpfs /dev 2>/dev/null
mkdir -p /mnt/kizuna
if ! modprobe -a 9p 9pnet_virtio; then
  echo "kizuna-init: modprobe 9p 9pnet_virtio failed"
elif ! mount -t 9p -o trans=virtio,version=9p2000.L,msize=1048576 kizuna /mnt/kizuna; then
  echo "kizuna-init: mounting the 9p share 'kizuna' failed"
elif [ ! -x /mnt/kizuna/guest_init.sh ]; then
  echo "kizuna-init: /mnt/kizuna/guest_init.sh is missing or not executable"
else
  exec /mnt/kizuna/guest_init.sh
fi
sync
echo o >/proc/sysrq-trigger
sleep 60
EOF

usage() {
  cat <<EOF
usage: tests/roce/build_image.sh [--force] [--print-dir]
  --force      rebuild even when the cached image is current
  --print-dir  print the cache folder and exit ($CACHE)
Environment: KIZUNA_CACHE (cache root, default \$HOME/.cache/kizuna), KIZUNA_DEBIAN_MIRROR (default:
the Debian URI in /etc/apt/sources.list*, else http://deb.debian.org/debian).
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --force) FORCE=1 ;;
    --print-dir) PRINT_DIR=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "build_image: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
if [[ $PRINT_DIR -eq 1 ]]; then echo "$CACHE"; exit 0; fi

START=$SECONDS
log() { printf 'build_image [%3ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { echo "build_image: $*" >&2; exit 1; }

SUDO=()
if [[ "$(id -u)" -ne 0 ]]; then
  command -v sudo >/dev/null 2>&1 || die "debootstrap and chroot need root: run as root or install sudo"
  SUDO=(sudo)
fi

# The mirror apt already uses (deb822 'URIs:' or one-line 'deb URL bookworm ...').
mirror() {
  if [[ -n "${KIZUNA_DEBIAN_MIRROR:-}" ]]; then echo "$KIZUNA_DEBIAN_MIRROR"; return; fi
  local uri
  uri="$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null |
    awk '/^URIs:/ { for (i = 2; i <= NF; i++) if ($i ~ /\/debian\/?$/) { print $i; exit } }')"
  if [[ -z "$uri" ]]; then
    uri="$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\/.*\/debian\/?$/) { print $i; exit } }')"
  fi
  echo "${uri:-http://deb.debian.org/debian}"
}
MIRROR="$(mirror)"

STAMP_TEXT="format=$FORMAT suite=$SUITE mirror=$MIRROR packages=${GUEST_PACKAGES[*]} initrd=${INITRD_MODULES[*]}
$IMAGE_INIT"
STAMP="$(printf '%s' "$STAMP_TEXT" | sha256sum | cut -c1-16)"

# One build at a time per cache: a second harness run waits for the first one's image instead of
# building its own beside it.
mkdir -p "$CACHE" || die "cannot create $CACHE"
exec 9>"$CACHE/.lock"
if ! flock -n 9; then
  log "another build_image.sh is building in $CACHE; waiting for it (up to 30 min)"
  flock -w 1800 9 || die "$CACHE/.lock still held after 30 min; is a build stuck? (fuser $CACHE/.lock)"
fi

if [[ $FORCE -eq 0 && -f "$CACHE/stamp" && "$(cat "$CACHE/stamp")" == "$STAMP" &&
  -f "$CACHE/image.qcow2" && -f "$CACHE/vmlinuz" && -f "$CACHE/initrd.img" ]]; then
  log "image is current: $CACHE (stamp $STAMP)"
  exit 0
fi

# ---- host packages ------------------------------------------------------------------------------

HOST_PACKAGES=(debootstrap qemu-utils e2fsprogs)
missing=()
for p in "${HOST_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
  log "installing: ${missing[*]}"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
  "${SUDO[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}" >&2 ||
    die "apt-get install ${missing[*]} failed"
fi

# ---- build in a work folder beside the cache; swap in only when complete -------------------------

WORK="$(mktemp -d "$CACHE/build.XXXXXX")"
ROOTFS="$WORK/rootfs"
LOG="$WORK/build.log"
cleanup() {
  local rc=$?
  # Never leave a half-made root file system (or anything mounted in it) behind.
  "${SUDO[@]}" umount -l "$ROOTFS/proc" 2>/dev/null || true
  if [[ $rc -ne 0 ]]; then
    echo "build_image: FAILED (exit $rc); last lines of the build log:" >&2
    tail -n 30 "$LOG" >&2 2>/dev/null || true
    cp -f "$LOG" "$CACHE/last-failed-build.log" 2>/dev/null && echo "build_image: whole log: $CACHE/last-failed-build.log" >&2
  fi
  "${SUDO[@]}" rm -rf "$WORK"
}
trap cleanup EXIT

include="$(IFS=,; echo "${GUEST_PACKAGES[*]}")"
log "debootstrap --variant=minbase $SUITE from $MIRROR (a few minutes; log: $LOG)"
# INITRD=No: the kernel package's hook makes no initrd now (with MODULES=most that takes minutes);
# the small one is made below, once the initramfs configuration is in place.
"${SUDO[@]}" env INITRD=No debootstrap --variant=minbase --include="$include" "$SUITE" "$ROOTFS" "$MIRROR" >"$LOG" 2>&1 ||
  die "debootstrap failed (mirror $MIRROR; set KIZUNA_DEBIAN_MIRROR to use another)"

log "configuring the guest (init, initramfs modules, hostname)"
printf '%s\n' "$IMAGE_INIT" | "${SUDO[@]}" tee "$ROOTFS/sbin/kizuna-init" >/dev/null
"${SUDO[@]}" chmod 755 "$ROOTFS/sbin/kizuna-init"
echo kizuna-roce | "${SUDO[@]}" tee "$ROOTFS/etc/hostname" >/dev/null
printf '%s\n' "${INITRD_MODULES[@]}" | "${SUDO[@]}" tee -a "$ROOTFS/etc/initramfs-tools/modules" >/dev/null
# MODULES=dep would size the initrd for this (build) machine; the guest has other hardware.
"${SUDO[@]}" sed -i 's/^MODULES=.*/MODULES=list/' "$ROOTFS/etc/initramfs-tools/initramfs.conf"
"${SUDO[@]}" mount -t proc proc "$ROOTFS/proc"
kernel="$(ls "$ROOTFS"/boot/vmlinuz-* 2>/dev/null | sort -V | tail -n 1)"
[[ -n "$kernel" ]] || die "no kernel in $ROOTFS/boot (did linux-image-amd64 install?)"
kver="${kernel##*/vmlinuz-}"
"${SUDO[@]}" rm -f "$ROOTFS/boot/initrd.img-$kver"
"${SUDO[@]}" chroot "$ROOTFS" update-initramfs -c -k "$kver" >>"$LOG" 2>&1 || die "update-initramfs in the guest failed"
"${SUDO[@]}" umount "$ROOTFS/proc"
initrd="$ROOTFS/boot/initrd.img-$kver"
[[ -f "$initrd" ]] || die "no initrd $initrd beside $kernel"
"${SUDO[@]}" cp "$kernel" "$WORK/vmlinuz"
"${SUDO[@]}" cp "$initrd" "$WORK/initrd.img"
"${SUDO[@]}" chmod 644 "$WORK/vmlinuz" "$WORK/initrd.img"

# What the image does not need: package caches, documentation, locales.
"${SUDO[@]}" rm -rf "$ROOTFS"/var/cache/apt/archives/*.deb "$ROOTFS"/var/lib/apt/lists/* \
  "$ROOTFS"/usr/share/doc "$ROOTFS"/usr/share/man "$ROOTFS"/usr/share/locale "$ROOTFS"/usr/share/info

log "making the ext4 image (mkfs.ext4 -d) and compressing it to qcow2"
used_mib="$("${SUDO[@]}" du -sm "$ROOTFS" | cut -f1)"
size_mib=$((used_mib + used_mib / 2 + 256))
truncate -s "${size_mib}M" "$WORK/image.raw"
"${SUDO[@]}" mkfs.ext4 -q -F -L kizuna-roce -d "$ROOTFS" "$WORK/image.raw" >>"$LOG" 2>&1 ||
  die "mkfs.ext4 -d failed (e2fsprogs >= 1.43 needed)"
qemu-img convert -c -f raw -O qcow2 "$WORK/image.raw" "$WORK/image.qcow2" >>"$LOG" 2>&1 || die "qemu-img convert failed"

# Swap the new files in; the stamp goes last, so an interrupted swap rebuilds next time.
rm -f "$CACHE/stamp"
mv -f "$WORK/image.qcow2" "$CACHE/image.qcow2"
mv -f "$WORK/vmlinuz" "$CACHE/vmlinuz"
mv -f "$WORK/initrd.img" "$CACHE/initrd.img"
printf '%s\n' "${GUEST_PACKAGES[@]}" >"$CACHE/packages.txt"
echo "$STAMP" >"$CACHE/stamp"
log "image ready: $CACHE/image.qcow2 ($(du -h "$CACHE/image.qcow2" | cut -f1), root file system ${used_mib} MiB, kernel $kver, stamp $STAMP)"
