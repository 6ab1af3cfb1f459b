#!/usr/bin/env bash
# kizuna-sim against the emulator, both reading one direct-connect topology file: 8 and 16 emulated
# devices on a full mesh of shaped cables (0.5 Gb/s, 20 us: the fabric paces each port's transfers
# in turn, hence --sharing fifo), AllReduce of 4 MiB, every algorithm: the simulated time must be
# no more than 15 % above the measured median, and no more than 35 % below it (pairwise: no lower
# bound). The emulated devices and every rank's executor share this machine's CPUs, so the
# simulation shares them too (--host-cpus), each message taking 10 us of CPU at each end and the
# sender's copy of it at 1 GB/s: fitted on 8 ranks of one 2-core VM, where every cell but pairwise
# came within 15 % (docs/SIMULATOR.md, "Against the emulator"). Those are that machine's speeds: on
# a 2-core VM of the same kind with a slower memory the same build ran the emulator 0-23 % slower
# (rhd at 16 ranks 10-23 % in the runs seen, ring, tree and rd up to 10 %), and pairwise, bound by
# the machine's memory, 20-52 % slower and varying from run to run (16 ranks: 71-83 ms there,
# 108-157 ms here). The lower bound catches a model gone wrong, not that machine's speed. Where the
# simulation is slower than the emulator, the machine cannot explain it: that bound stays at 15 %.
set -uo pipefail
topo="$1" bench="$2" sim="$3"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail() { echo "FAIL: $*"; exit 1; }
cpus=$(nproc)

for n in 8 16; do
  "$topo" --generate full "$n" --bandwidth-gbps 0.5 --latency-us 20 --shaping >"$tmp/full$n.json" ||
    fail "kizuna-topo --generate full $n"
  for algo in ring tree rhd rd pairwise; do
    "$sim" --network direct --topology "$tmp/full$n.json" --sharing fifo --algo "$algo" -b 4M -e 4M \
      --host-cpus "$cpus" --message-cpu-us 10 --copy-gbps 1 \
      --json "$tmp/sim.json" >"$tmp/sim.txt" 2>&1 || fail "kizuna-sim $n ranks $algo: $(cat "$tmp/sim.txt")"
    # Measured twice at most: one slow run on a shared 2-core machine is the machine's, two are ours.
    for try in 1 2; do
      KIZUNA_EMULATED_DEVICES="$n" "$bench" --mode threads --ranks "$n" --topology "$tmp/full$n.json" \
        --algo "$algo" -b 4M -e 4M -n 3 -w 1 --timing median --json "$tmp/emu.json" >"$tmp/emu.txt" 2>&1 ||
        fail "kizuna-bench $n ranks $algo: $(tail -5 "$tmp/emu.txt")"
      python3 - "$tmp/emu.json" "$tmp/sim.json" "$n" "$algo" <<'PY' && continue 2
import json, sys
emu = json.load(open(sys.argv[1]))["rows"][0]["out_of_place"]["time_us"] * 1e-6
sim = json.load(open(sys.argv[2]))["rows"][0]["seconds"]
error = (sim - emu) / emu
print(f"{sys.argv[3]} ranks, {sys.argv[4]}: emulated {emu * 1e3:.1f} ms, simulated {sim * 1e3:.1f} ms ({error:+.0%})")
low = -1.0 if sys.argv[4] == "pairwise" else -0.35
sys.exit(0 if low <= error <= 0.15 else 1)
PY
    done
    fail "$n ranks $algo: the simulation is further from the emulator than the test allows, twice"
  done
done
echo PASS
