#!/usr/bin/env bash
# The Soft-RoCE harness (./kz test-roce; tests/roce/README.md): builds the test binaries, makes sure
# the cached Debian guest image exists (build_image.sh), boots it under qemu (TCG: no KVM needed)
# with the binaries on a 9p share, lets the guest create rdma_rxe devices and run guest_tests.sh,
# then prints each step's verdict and the time of each phase. Exits non-zero when any step failed or
# was missing, or when the VM did not finish.
#
#   tests/roce/test_roce.sh [--conformance-only] [--steps LIST] [--out DIR] [--timeout S]
#                           [--step-timeout S] [--no-build] [--rebuild-image]
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
HERE="$ROOT/tests/roce"
OUT="${TMPDIR:-/tmp}/kizuna-roce"
ALL_STEPS="smoke conformance collectives p2p gid"
STEPS="$ALL_STEPS"
VM_TIMEOUT=2700
STEP_TIMEOUT=900
BUILD=1
REBUILD_IMAGE=0

usage() {
  cat <<EOF
usage: tests/roce/test_roce.sh [options]      (./kz test-roce [options])
  --conformance-only  only the fabric conformance suite over roce (the cheap CI mode)
  --steps LIST        the guest steps to run, comma- or space-separated, from: ${ALL_STEPS// /, }
  --out DIR           results folder, also the VM's 9p share (default \$TMPDIR/kizuna-roce; emptied first)
  --timeout S         deadline of the whole VM run, seconds (default $VM_TIMEOUT)
  --step-timeout S    deadline of one guest step, seconds (default $STEP_TIMEOUT)
  --no-build          use the binaries already in bazel-bin
  --rebuild-image     rebuild the cached guest image even when it is current
The guest image is cached in \${KIZUNA_CACHE:-\$HOME/.cache/kizuna}/roce-vm/ (build_image.sh).
EOF
}

while [[ $# -gt 0 ]]; do
  case "$1" in
    --conformance-only) STEPS="conformance" ;;
    --steps) [[ $# -ge 2 ]] || { echo "test-roce: --steps needs a list" >&2; exit 2; }; STEPS="${2//,/ }"; shift ;;
    --out) [[ $# -ge 2 ]] || { echo "test-roce: --out needs a folder" >&2; exit 2; }; OUT="$2"; shift ;;
    --timeout) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "test-roce: --timeout needs seconds" >&2; exit 2; }; VM_TIMEOUT="$2"; shift ;;
    --step-timeout) [[ $# -ge 2 && "$2" =~ ^[0-9]+$ ]] || { echo "test-roce: --step-timeout needs seconds" >&2; exit 2; }; STEP_TIMEOUT="$2"; shift ;;
    --no-build) BUILD=0 ;;
    --rebuild-image) REBUILD_IMAGE=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "test-roce: unknown argument '$1'" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
for s in $STEPS; do
  [[ " $ALL_STEPS " == *" $s "* ]] || { echo "test-roce: unknown step '$s' (steps: $ALL_STEPS)" >&2; exit 2; }
done
[[ -n "${STEPS// /}" ]] || { echo "test-roce: no steps to run" >&2; exit 2; }
[[ "$OUT" == /* ]] || OUT="$PWD/$OUT"

START=$SECONDS
log() { printf 'test-roce [%4ds] %s\n' "$((SECONDS - START))" "$*" >&2; }
die() { echo "test-roce: $*" >&2; exit 1; }

PHASES=()
phase_done() { # name start
  PHASES+=("$(printf '%-8s %5ds' "$1" "$((SECONDS - $2))")")
}
print_phases() {
  echo "phase times:"
  local p
  for p in "${PHASES[@]}"; do echo "  $p"; done
  echo "  total    $(printf '%5ds' "$((SECONDS - START))")"
}

# ---- host packages ------------------------------------------------------------------------------

if ! dpkg-query -W -f='${Status}' qemu-system-x86 2>/dev/null | grep -q 'install ok installed'; then
  sudo=()
  if [[ "$(id -u)" -ne 0 ]]; then
    command -v sudo >/dev/null || die "not root and no sudo: install as root: apt-get install qemu-system-x86"
    sudo=(sudo)
  fi
  log "installing: qemu-system-x86"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q >&2 || die "apt-get update failed"
  "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends qemu-system-x86 >&2 ||
    die "apt-get install qemu-system-x86 failed"
fi

# ---- phase 1: build exactly the binaries the chosen steps need ------------------------------------

# bazel target -> the file copied into the share's bin/.
declare -A FILES=()
for s in $STEPS; do
  case "$s" in
    conformance)
      FILES[//tests/conformance/fabric:fabric_conformance_test]=tests/conformance/fabric/fabric_conformance_test
      # The suite's BUILD passes the example fabric plugin (--plugin=...); the guest does too.
      FILES[//fabric/example_plugin:libkz_example_fabric.so]=fabric/example_plugin/libkz_example_fabric.so
      ;;
    collectives)
      FILES[//tools/run:kizuna-run]=tools/run/kizuna-run
      FILES[//tools/bench:kizuna-bench]=tools/bench/kizuna-bench
      ;;
    p2p)
      FILES[//tools/run:kizuna-run]=tools/run/kizuna-run
      FILES[//tools/p2p:kizuna-p2p]=tools/p2p/kizuna-p2p
      ;;
    gid)
      FILES[//tools/run:kizuna-run]=tools/run/kizuna-run
      FILES[//tools/p2p:kizuna-p2p]=tools/p2p/kizuna-p2p
      FILES[//tools/bench:kizuna-bench]=tools/bench/kizuna-bench
      ;;
  esac
done

t=$SECONDS
if [[ ${#FILES[@]} -gt 0 && $BUILD -eq 1 ]]; then
  mkdir -p "$OUT.logs"
  log "bazel build --jobs=2 ${!FILES[*]}"
  (cd "$ROOT" && bazel build --jobs=2 "${!FILES[@]}") >"$OUT.logs/bazel.log" 2>&1 || {
    tail -n 30 "$OUT.logs/bazel.log" >&2
    die "bazel build failed: see $OUT.logs/bazel.log"
  }
fi
phase_done build "$t"

# ---- phase 2: the guest image ----------------------------------------------------------------------

t=$SECONDS
image_args=()
[[ $REBUILD_IMAGE -eq 1 ]] && image_args+=(--force)
"$HERE/build_image.sh" "${image_args[@]}" || die "the guest image could not be built (see above)"
CACHE="$("$HERE/build_image.sh" --print-dir)"
phase_done image "$t"

# ---- phase 3: the share, then boot -----------------------------------------------------------------

# The share is the results folder: scripts and binaries in, results and logs out.
case "$OUT" in / | "$HOME" | "$ROOT") die "refusing to use $OUT as the results folder (it is emptied)" ;; esac
rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/results" || die "cannot create $OUT"
cp "$HERE/guest_init.sh" "$HERE/guest_tests.sh" "$OUT/"
chmod 755 "$OUT/guest_init.sh" "$OUT/guest_tests.sh"
echo "$STEPS" >"$OUT/steps"
echo "$STEP_TIMEOUT" >"$OUT/step_timeout"
for target in "${!FILES[@]}"; do
  src="$ROOT/bazel-bin/${FILES[$target]}"
  if [[ -f "$src" ]]; then
    cp -L "$src" "$OUT/bin/"
    chmod u+w "$OUT/bin/${src##*/}"
  else
    # The guest reports the step as MISSING, naming the binary.
    log "warning: $src does not exist (built with --no-build?); the steps that need it will fail"
  fi
done
[[ -f "$OUT.logs/bazel.log" ]] && mv "$OUT.logs/bazel.log" "$OUT/bazel.log" && rmdir "$OUT.logs" 2>/dev/null

t=$SECONDS
log "booting the guest (qemu TCG, 2 vCPUs, 2 GiB; deadline ${VM_TIMEOUT}s; console: $OUT/console.log); steps: $STEPS"
qemu_rc=0
timeout --kill-after=15 "$VM_TIMEOUT" qemu-system-x86_64 \
  -machine q35,accel=tcg -cpu max -smp 2 -m 2048 -snapshot -nographic -no-reboot \
  -kernel "$CACHE/vmlinuz" -initrd "$CACHE/initrd.img" \
  -append "console=ttyS0 root=/dev/vda rw init=/sbin/kizuna-init panic=-1 loglevel=4" \
  -drive "file=$CACHE/image.qcow2,if=virtio,format=qcow2" \
  -virtfs "local,path=$OUT,mount_tag=kizuna,security_model=none,id=kizuna" \
  -nic none </dev/null >"$OUT/console.log" 2>&1 || qemu_rc=$?
phase_done vm "$t"

# ---- phase 4: results ---------------------------------------------------------------------------------

RESULTS="$OUT/results/results.txt"
failed=0
why_vm=""
if [[ $qemu_rc -eq 124 || $qemu_rc -eq 137 ]]; then
  why_vm="the VM did not finish within ${VM_TIMEOUT}s (qemu killed)"
elif [[ $qemu_rc -ne 0 ]]; then
  why_vm="qemu exited with status $qemu_rc"
elif ! grep -qx DONE "$RESULTS" 2>/dev/null; then
  why_vm="the guest powered off without finishing its test list"
fi

echo
echo "Soft-RoCE VM results ($OUT):"
declare -A seen=()
if [[ -f "$RESULTS" ]]; then
  while read -r name status rest; do
    [[ "$name" == DONE || -z "$name" ]] && continue
    seen[$name]=1
    printf '  %-12s %-8s %s\n' "$name" "$status" "$rest"
    [[ "$status" == PASS ]] || failed=$((failed + 1))
  done <"$RESULTS"
fi
for s in $STEPS; do
  if [[ -z "${seen[$s]:-}" ]]; then
    printf '  %-12s %-8s %s\n' "$s" "NOT RUN" "(no result from the guest)"
    failed=$((failed + 1))
  fi
done
if [[ -n "$why_vm" ]]; then
  failed=$((failed + 1))
  echo "  VM: $why_vm"
fi
if [[ $failed -gt 0 ]]; then
  echo
  echo "---- guest console (last 60 lines of $OUT/console.log)"
  # Without the firmware's and the kernel's terminal escape sequences.
  tail -n 60 "$OUT/console.log" | sed 's/\x1b\[[0-9;?]*[a-zA-Z]//g; s/\x1bc//g' | tr -d '\r'
  echo "---- step logs: $OUT/results/<step>.log"
fi
echo
print_phases
if [[ $failed -gt 0 ]]; then
  echo "test-roce: FAILED ($failed problem(s)); results and logs in $OUT"
  exit 1
fi
echo "test-roce: all steps passed ($STEPS); results and logs in $OUT"
