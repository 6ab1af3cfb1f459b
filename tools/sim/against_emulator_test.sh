#!/usr/bin/env bash
# kizuna-sim against the emulator, both reading one direct-connect topology file: 8 and 16 emulated
# devices on a full mesh of shaped cables (0.5 Gb/s, 20 us: the fabric paces each port's transfers
# in turn, hence --sharing fifo), AllReduce of 4 MiB, every algorithm: the simulated time must be
# within 15 % of the measured median. The emulated devices and every rank's executor share this
# machine's CPUs, so the simulation shares them too (--host-cpus), each message taking 10 us of
# CPU at each end and the sender's copy of it at 1 GB/s: fitted on 8 ranks, held at 16
# (docs/SIMULATOR.md, "Against the emulator"). Pairwise is looser: one build measured 71-83 ms
# (16 ranks) and 44-46 ms (8) on one 2-core VM of this kind and 108-147 / 53-57 ms on another, where
# the other algorithms differed by 0-10 % (memory-bound at 16 ranks, which the model takes at a fixed
# rate; at 8 the shaped run overlaps copies and wire less than simulated). The simulation may be up
# to 45 % faster than the emulator there, and no more than 15 % slower.
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
low = -0.45 if sys.argv[4] == "pairwise" else -0.15
sys.exit(0 if low <= error <= 0.15 else 1)
PY
    done
    fail "$n ranks $algo: the simulation is further from the emulator than the test allows, twice"
  done
done
echo PASS
