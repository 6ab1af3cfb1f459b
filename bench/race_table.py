#!/usr/bin/env python3
"""The race's table (bench/race.sh): reads the RESULT / FAIL / NOTE lines of a run and prints the
Markdown tables of docs/RACE.md (kizuna, each peer, the ceiling, the fractions and ratios), also
to OUT if given; with PLOT, draws the busbw of every library in each case into an SVG picture.

    race_table.py RESULTS [OUT] [PLOT]

Lines with shape=<hosts>x<ranks per host> are the cluster cases (bench/race_cluster.sh): they go to
their own table, never into the single-host ones of the same rank count. A case measured in several
rounds (race.sh --rounds) counts with its median round.
"""
import re, sys

results = sys.argv[1]
out_path = sys.argv[2] if len(sys.argv) > 2 else ""
plot_path = sys.argv[3] if len(sys.argv) > 3 else ""
res, fails, notes, copies = {}, {}, {}, {}
cl_res, cl_fails = {}, {}  # the cluster cases: (lib, shape, coll, bytes)
for line in open(results):
    kind, _, rest = line.strip().partition(" ")
    if kind == "NOTE":
        for m in re.finditer(r"(\w+)=(.*?)(?= \w+=|$)", rest):
            notes[m.group(1)] = m.group(2)
        continue
    why = None
    if kind == "FAIL":
        rest, _, why = rest.partition(" why=")
    f = dict(kv.split("=", 1) for kv in rest.split() if "=" in kv)
    if kind not in ("RESULT", "FAIL") or "lib" not in f:
        continue
    key = (f["lib"], f.get("coll"), int(f.get("n", 0)), int(f.get("bytes", 0)))
    if "shape" in f:
        ck = (f["lib"], f["shape"], f.get("coll"), int(f.get("bytes", 0)))
        if kind == "RESULT":
            cl_res.setdefault(ck, []).append(f)
        else:
            cl_fails[ck] = why
        continue
    if kind == "RESULT" and f.get("coll") == "copy":
        copies.setdefault(key[2], {})[int(f["threads"])] = float(f["gbps"])
    elif kind == "RESULT":
        res.setdefault(key, []).append(f)
    else:
        fails[key] = why

def median_round(rounds):
    """One case's rounds as one record: the round with the median time (of an even count, the slower
    of the middle two), or a round with wrong results if there is one (it must show)."""
    wrong = [r for r in rounds if int(r.get("wrong", 0)) != 0]
    if wrong or len(rounds) == 1:
        return (wrong or rounds)[0]
    return sorted(rounds, key=lambda r: float(r.get("time_us", 0)))[len(rounds) // 2]

for d, failed in ((res, fails), (cl_res, cl_fails)):
    for k in d:
        d[k] = median_round(d[k])
        failed.pop(k, None)  # a round that failed beside rounds that did not: the others count

MIB = 1 << 20
def size_name(b):
    return f"{b // MIB} MiB" if b >= MIB else f"{b} B"

def busbw(lib, coll, n, b):
    r = res.get((lib, coll, n, b))
    return float(r["busbw"]) if r and int(r.get("wrong", 0)) == 0 else None

def time_us(lib, coll, n, b):
    r = res.get((lib, coll, n, b))
    return float(r["time_us"]) if r and int(r.get("wrong", 0)) == 0 else None

def fmt_cell(r, failed, value):
    """A table cell: the figure, or wrong (N), missing (the peer is not installed), error or —."""
    if r is not None and int(r.get("wrong", 0)) != 0:
        return f"wrong ({r['wrong']})"
    if value is not None:
        return f"{value:.3g}" if value < 100 else f"{value:.0f}"
    if failed is not None:
        return "missing" if failed.startswith("missing:") else "error"
    return "—"

def cell(lib, coll, n, b, value):
    return fmt_cell(res.get((lib, coll, n, b)), fails.get((lib, coll, n, b)), value)

def ratio(a, b):
    return f"{a / b:.3g}" if a is not None and b else "—"

lines = []
emit = lines.append
emit(f"Host {notes.get('host', '?')}, {notes.get('cpus', '?')} CPUs, {notes.get('mem_gib', '?')} GiB, "
     f"{notes.get('date', '?')}, {notes.get('elapsed_s', '?')} s for the whole run"
     + (" (--quick)" if notes.get("quick") == "1" else "") + ". Every program ran with "
     + ("glibc's default malloc settings (--plain-malloc)." if notes.get("plain_malloc") == "1"
        else "GLIBC_TUNABLES=glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=64G (bench/README.md, \"Page faults\")."))
emit("")
if copies:
    parts = []
    for n in sorted(copies):
        c = copies[n]
        parts.append(f"before n = {n}: " + ", ".join(f"{c[t]:.1f} GB/s with {t} thread(s)" for t in sorted(c)))
    emit("STREAM-style copy (the ceiling program, 1 GiB arrays): " + "; ".join(parts) + ".")
    emit("")

peers = [("openmpi", "Open MPI"), ("mpich", "MPICH"), ("gloo", "Gloo")]
present = [(l, t) for l, t in peers if any(k[0] == l for k in list(res) + list(fails))]
MIB64 = 64 * MIB

def md_row(cells):
    emit("| " + " | ".join(cells) + " |")

def md_head(cells):
    md_row(cells)
    emit("|" + "---|" * len(cells))

def best_peer(coll, n, b, libs, fn):
    vals = [fn(l, coll, n, b) for l, _ in libs]
    vals = [v for v in vals if v is not None]
    return vals

ar_keys = sorted({(k[2], k[3]) for k in list(res) + list(fails)
                  if k[1] == "allreduce" and k[0] in ("kizuna", "kizuna-host") + tuple(l for l, _ in peers)})
if any(b >= MIB for _, b in ar_keys):
    emit("AllReduce busbw, GB/s (float32 sum, out of place; kizuna over device buffers and over host buffers):")
    emit("")
    head = ["n", "size", "kizuna", "kizuna host"] + [t for _, t in present] + [
        "ceiling", "kizuna / ceiling", "kizuna / best peer", "kizuna host / best peer", "host bound / best peer"]
    emit("| " + " | ".join(head) + " |")
    emit("|" + "---|" * len(head))
    for n, b in ar_keys:
        if b < MIB:
            continue
        kd, kh = busbw("kizuna", "allreduce", n, b), busbw("kizuna-host", "allreduce", n, b)
        pv = best_peer("allreduce", n, b, present, busbw)
        best = max(pv) if pv else None
        ceil = busbw("ceiling", "allreduce", n, b)
        row = [str(n), size_name(b), cell("kizuna", "allreduce", n, b, kd), cell("kizuna-host", "allreduce", n, b, kh)]
        row += [cell(l, "allreduce", n, b, busbw(l, "allreduce", n, b)) for l, _ in present]
        row += [cell("ceiling", "allreduce", n, b, ceil), ratio(kd, ceil), ratio(kd, best), ratio(kh, best),
                ratio(ceil / 2 if ceil is not None else None, best)]
        emit("| " + " | ".join(row) + " |")
    emit("")
    emit("Host bound: buffers from malloc cannot be mapped by the other processes, so every byte that crosses "
         "ranks is written to shared memory and read back, besides the input read and the output written: 4 "
         "bytes of traffic per byte per rank, where the ceiling's fused pass over mapped buffers moves 2. Where "
         "that staging traffic costs what memory traffic costs (on the build machines it does: staging in rounds "
         "of 128 KiB-2 MiB, small enough to stay in a cache, ran within 10 % of staging whole messages), "
         "host-buffer busbw cannot exceed half the ceiling; the last column is that bound over the best peer.")
    emit("")

lat = [(n, b) for n, b in ar_keys if b < MIB]
if lat:
    emit(f"AllReduce latency at {size_name(lat[0][1])}, µs (lower is better; speed-up = best peer's time / kizuna's time):")
    emit("")
    head = ["n", "kizuna", "kizuna host"] + [t for _, t in present] + ["kizuna speed-up vs best peer", "kizuna host speed-up"]
    emit("| " + " | ".join(head) + " |")
    emit("|" + "---|" * len(head))
    for n, b in lat:
        kd, kh = time_us("kizuna", "allreduce", n, b), time_us("kizuna-host", "allreduce", n, b)
        pv = best_peer("allreduce", n, b, present, time_us)
        best = min(pv) if pv else None
        row = [str(n), cell("kizuna", "allreduce", n, b, kd), cell("kizuna-host", "allreduce", n, b, kh)]
        row += [cell(l, "allreduce", n, b, time_us(l, "allreduce", n, b)) for l, _ in present]
        row += [ratio(best, kd), ratio(best, kh)]
        emit("| " + " | ".join(row) + " |")
    emit("")
    fl = time_us("floor", "line", 2, 0)
    if fl is not None:
        emit(f"Floor (bench/line_probe.c): two processes exchanging an operation number through one cache line "
             f"take {fl:.3g} µs per exchange; no shared-memory AllReduce of 2 ranks is faster.")
        emit("")
    try:
        ncpu = int(notes.get("cpus", "0"))
    except ValueError:
        ncpu = 0
    over = sorted({k[2] for k in res if k[1] == "allreduce" and k[0] == "kizuna" and ncpu and k[2] >= 2 * ncpu})
    floors = []
    for n in over:
        sw = [v for v in (time_us("floor", "switch-futex", n, 0), time_us("floor", "switch-yield", n, 0)) if v is not None]
        if not sw:
            continue
        t, k = min(sw), -(-n // ncpu)
        floors.append(f"n = {n}: {t:.3g} µs a hand-over, at least {k * t:.3g} µs for one rendezvous (8 B), "
                      f"{2 * k * t:.3g} µs for two (the fused pass at 1 MiB and up)")
    if floors:
        emit(f"Floor (bench/switch_probe.c, n processes on the {ncpu} CPUs, each CPU's handing it round, the lesser "
             f"of sched_yield and a futex wake-up): with k = n / {ncpu} processes per CPU, the one that leaves the "
             f"barrier before a timed call first on its CPU returns only after the other k - 1 have run and it has "
             f"run again: k hand-overs per rendezvous in the slowest rank's time, however the call is made. "
             + "; ".join(floors) + ".")
        emit("")

other = sorted({(k[1], k[2], k[3]) for k in list(res) + list(fails)
                if k[1] in ("reducescatter", "allgather", "broadcast") and not k[0].endswith("-tcp")})
if other:
    emit("ReduceScatter, AllGather, Broadcast busbw, GB/s (no ceiling program for these):")
    emit("")
    head = ["collective", "n", "size", "kizuna", "kizuna host"] + [t for _, t in present] + ["kizuna / best peer"]
    emit("| " + " | ".join(head) + " |")
    emit("|" + "---|" * len(head))
    for coll, n, b in other:
        kd = busbw("kizuna", coll, n, b)
        pv = best_peer(coll, n, b, present, busbw)
        row = [coll, str(n), size_name(b), cell("kizuna", coll, n, b, kd),
               cell("kizuna-host", coll, n, b, busbw("kizuna-host", coll, n, b))]
        row += [cell(l, coll, n, b, busbw(l, coll, n, b)) for l, _ in present]
        row += [ratio(kd, max(pv) if pv else None)]
        emit("| " + " | ".join(row) + " |")
    emit("")

tcp_libs = [("openmpi-tcp", "Open MPI"), ("mpich-tcp", "MPICH"), ("gloo-tcp", "Gloo")]
tcp_keys = sorted({k[3] for k in list(res) + list(fails) if k[0].endswith("-tcp")})
if tcp_keys:
    fabric = notes.get("netns_fabric", "unknown")
    m = re.search(r"(\w+): rank 1 \(device ([^)]*)\)", fabric)
    emit("AllReduce, 2 ranks on two hosts made of network namespaces, each a veth pair into one bridge (TCP): "
         "busbw in GB/s, the smallest size as latency in µs. kizuna's fabric: "
         + (f"{m.group(1)} {m.group(2)}" if m else fabric) + ".")
    emit("")
    tl = [(l, t) for l, t in tcp_libs if any(k[0] == l for k in list(res) + list(fails))]
    head = ["size", "kizuna"] + [t for _, t in tl] + ["kizuna / best peer"]
    emit("| " + " | ".join(head) + " |")
    emit("|" + "---|" * len(head))
    for b in tcp_keys:
        fn = busbw if b >= MIB else time_us
        kd = fn("kizuna-tcp", "allreduce", 2, b)
        pv = [v for v in (fn(l, "allreduce", 2, b) for l, _ in tl) if v is not None]
        r = ratio(kd, max(pv)) if b >= MIB else ratio(min(pv) if pv else None, kd)
        row = [size_name(b) + ("" if b >= MIB else " (µs)"), cell("kizuna-tcp", "allreduce", 2, b, kd)]
        row += [cell(l, "allreduce", 2, b, fn(l, "allreduce", 2, b)) for l, _ in tl] + [r]
        emit("| " + " | ".join(row) + " |")
    emit("")
    for b in sorted(k[3] for k in res if k[0] == "floor" and k[1] == "tcp-exchange"):
        polled = ""
        if ("floor", "tcp-exchange-poll", 2, b) in res:
            polled = (f"; with receives that poll instead of blocking (--poll, as the MPIs' progress loops do), "
                      f"{time_us('floor', 'tcp-exchange-poll', 2, b):.3g} µs")
        if ("floor", "tcp-exchange-one-way-poll", 2, b) in res:
            polled += (f"; polling with each direction on a connection of its own (--one-way, as kizuna's tcp fabric "
                       f"has them), {time_us('floor', 'tcp-exchange-one-way-poll', 2, b):.3g} µs")
        emit(f"Floor (bench/tcp_probe.c --exchanges): each end sending {size_name(b)} and receiving the other's on one "
             f"thread takes {time_us('floor', 'tcp-exchange', 2, b):.3g} µs per exchange (the median){polled}: what a "
             "2-rank AllReduce of that size over TCP cannot beat here.")
        emit("")
    for b in sorted(k[3] for k in res if k[0] == "floor" and k[1] == "tcp-duplex"):
        more = ""
        if ("floor", "tcp-duplex-4", 2, b) in res:
            more = (f"; four connections, a quarter each, {busbw('floor', 'tcp-duplex-4', 2, b):.3g} GB/s: about the "
                    "most any 2-rank AllReduce over TCP can reach here, since it must carry S bytes each way")
        red = [v for v in (busbw("floor", "tcp-duplex-reduce", 2, b), busbw("floor", "tcp-duplex-reduce-4", 2, b)) if v]
        if red:
            more += (f". Each end also adding half of what arrives into a buffer of its own as it comes (--reduce: "
                     f"the reduction a 2-rank AllReduce must do, on the CPUs that carry both hosts' network stacks), "
                     f"{max(red):.3g} GB/s at best of one and four connections")
        emit(f"Floor (bench/tcp_probe.c): one TCP connection between the namespaces carrying {size_name(b)} each way "
             f"at once moves {busbw('floor', 'tcp-duplex', 2, b):.3g} GB/s per direction{more}.")
        emit("")
elif "netns" in notes:
    emit("The cases between namespaces (two hosts, cluster): " + notes["netns"] + ".")
    emit("")

# ---- the cluster cases ---------------------------------------------------------------------------

# The two-host case is the cluster's 2 x 1 AllReduce when both ran (race_cluster.sh then does not run
# it twice): its lines fill those rows, at the sizes the other shapes' AllReduce rows have.
if notes.get("cluster_2x1_allreduce") == "two-host":
    ar_sizes = {k[3] for k in list(cl_res) + list(cl_fails) if k[2] == "allreduce"}
    for lib in ("kizuna", "openmpi", "mpich", "gloo"):
        for src, dst in ((res, cl_res), (fails, cl_fails)):
            for (l, coll, n, b), v in list(src.items()):
                if l == lib + "-tcp" and coll == "allreduce" and n == 2 and b in ar_sizes:
                    dst.setdefault((lib, "2x1", "allreduce", b), v)
    if "cluster_fabric_2x1" not in notes and "netns_fabric" in notes:
        notes["cluster_fabric_2x1"] = notes["netns_fabric"]

def shape_of(shape):
    h, _, p = shape.partition("x")
    return int(h), int(p)

def bus_factor(coll, k):
    """busbw / algbw for k parties: 2(k-1)/k for AllReduce, (k-1)/k for ReduceScatter and AllGather."""
    return (2 if coll == "allreduce" else 1) * (k - 1) / k

def cl_value(lib, shape, coll, b, field):
    r = cl_res.get((lib, shape, coll, b))
    return float(r[field]) if r and int(r.get("wrong", 0)) == 0 else None

def cl_cell(lib, shape, coll, b, value):
    return fmt_cell(cl_res.get((lib, shape, coll, b)), cl_fails.get((lib, shape, coll, b)), value)

COLL_ORDER = {"allreduce": 0, "reducescatter": 1, "allgather": 2}
COLL_NAME = {"allreduce": "AllReduce", "reducescatter": "ReduceScatter", "allgather": "AllGather"}
cl_keys = sorted({(k[1], k[2], k[3]) for k in list(cl_res) + list(cl_fails)},
                 key=lambda k: (shape_of(k[0]), COLL_ORDER.get(k[1], 9), k[2]))
if cl_keys:
    cl_peers = [(l, t) for l, t in peers if any(k[0] == l for k in list(cl_res) + list(cl_fails))]
    kz = [("kizuna", "kizuna")] + ([("kizuna-hier", "kizuna-hier")]
                                   if any(k[0] == "kizuna-hier" for k in list(cl_res) + list(cl_fails)) else [])
    tcp = [v for v in (busbw("floor", "tcp-duplex-4", 2, MIB64), busbw("floor", "tcp-duplex", 2, MIB64)) if v]
    floor = max(tcp) if tcp else None
    # The same with the reduction a 2-rank AllReduce must do besides (tcp_probe --reduce).
    tcp_red = [v for v in (busbw("floor", "tcp-duplex-reduce-4", 2, MIB64),
                           busbw("floor", "tcp-duplex-reduce", 2, MIB64)) if v]
    floor_red = max(tcp_red) if tcp_red else None

    def shape_name(shape):
        h, p = shape_of(shape)
        return f"{h} x {p}"

    def fabrics(line):
        """'ofi tcp;ofi_rxm:eth0' between hosts and the fabric within a host, from rank 0's INFO line."""
        parts = re.findall(r"(\w+): ranks? [0-9, ]+ \(devices? ([^)]*)\)", line)
        between = sorted({f"{f} {d}" for f, d in parts if f != "directconnect"})
        within = sorted({f for f, _ in parts if f == "directconnect"})
        return ("between hosts " + (", ".join(between) or "none found")
                + ("; within a host " + ", ".join(within) if within else ""))

    shapes = sorted({k[0] for k in cl_keys}, key=shape_of)
    emit("Cluster: hosts made of network namespaces on this machine (one bridge, TCP between hosts; "
         "each rank a process; every host shares this machine's CPUs). Hosts x ranks per host; "
         "kizuna is the cost model's choice, kizuna-hier runs with KIZUNA_ALGO=hier. kizuna's fabrics (rank 0's "
         "INFO line): "
         + "; ".join(f"{shape_name(s)}: " + fabrics(notes.get(f"cluster_fabric_{s}", "")) for s in shapes)
         + "."
         + (f" Every figure here (and the TCP floor) is the median of {notes['rounds']} rounds, each library once "
            "per round (race.sh --rounds)." if int(notes.get("rounds", "1") or 1) > 1 else ""))
    emit("")
    big = [k for k in cl_keys if k[2] >= MIB]
    if big:
        emit("Cluster busbw, GB/s. TCP bound: the busbw the collective would reach if the bytes each host must "
             "send to the others moved at the TCP floor's rate (bench/tcp_probe.c between two hosts"
             + (f", {floor:.3g} GB/s per direction" if floor else ", not measured")
             + "); kizuna / TCP bound at 64 MiB and up; for the 2 x 1 AllReduce also kizuna / the TCP bound with "
             "its reduction (tcp_probe --reduce"
             + (f", {floor_red:.3g} GB/s" if floor_red else ", not measured") + "):")
        emit("")
        md_head(["hosts x ranks", "collective", "size"] + [t for _, t in kz] + [t for _, t in cl_peers]
                + ["TCP bound"] + [f"{t} / best peer" for _, t in kz] + ["kizuna / TCP bound",
                                                                           "kizuna / bound with reduction"])
        for shape, coll, b in big:
            h, p = shape_of(shape)
            bound = floor * bus_factor(coll, h * p) / bus_factor(coll, h) if floor else None
            pv = [v for v in (cl_value(l, shape, coll, b, "busbw") for l, _ in cl_peers) if v is not None]
            best = max(pv) if pv else None
            kv = [cl_value(l, shape, coll, b, "busbw") for l, _ in kz]
            row = [shape_name(shape), COLL_NAME.get(coll, coll), size_name(b)]
            row += [cl_cell(l, shape, coll, b, v) for (l, _), v in zip(kz, kv)]
            row += [cl_cell(l, shape, coll, b, cl_value(l, shape, coll, b, "busbw")) for l, _ in cl_peers]
            row += [f"{bound:.3g}" if bound else "—"] + [ratio(v, best) for v in kv]
            row += [ratio(kv[0], bound) if b >= MIB64 else "—"]
            row += [ratio(kv[0], floor_red) if b >= MIB64 and h * p == 2 and coll == "allreduce" and floor_red
                    else "—"]
            md_row(row)
        emit("")
    emit("Cluster time per call, µs (the slowest rank's, median); speed-up = best peer's time / kizuna's; "
         "the algorithm kizuna-bench reports each kizuna row ran:")
    emit("")
    md_head(["hosts x ranks", "collective", "size"] + [t for _, t in kz] + [t for _, t in cl_peers]
            + [f"{t} speed-up" for _, t in kz] + [f"{t} algorithm" for _, t in kz])
    for shape, coll, b in cl_keys:
        pv = [v for v in (cl_value(l, shape, coll, b, "time_us") for l, _ in cl_peers) if v is not None]
        best = min(pv) if pv else None
        kv = [cl_value(l, shape, coll, b, "time_us") for l, _ in kz]
        row = [shape_name(shape), COLL_NAME.get(coll, coll), size_name(b)]
        row += [cl_cell(l, shape, coll, b, v) for (l, _), v in zip(kz, kv)]
        row += [cl_cell(l, shape, coll, b, cl_value(l, shape, coll, b, "time_us")) for l, _ in cl_peers]
        row += [ratio(best, v) for v in kv]
        row += [cl_res.get((l, shape, coll, b), {}).get("algo", "—") for l, _ in kz]
        md_row(row)
    emit("")
    # The small-message floors between two hosts, beside the 8-byte rows (once: the two-host
    # section above gives them when it ran).
    for b in sorted(k[3] for k in res if k[0] == "floor" and k[1] == "tcp-exchange" and not tcp_keys):
        polled = ""
        if ("floor", "tcp-exchange-poll", 2, b) in res:
            polled = f"; {time_us('floor', 'tcp-exchange-poll', 2, b):.3g} µs with receives that poll (--poll)"
        if ("floor", "tcp-exchange-one-way-poll", 2, b) in res:
            polled += (f"; {time_us('floor', 'tcp-exchange-one-way-poll', 2, b):.3g} µs polling with each direction "
                       "on a connection of its own (--one-way, as NCCL's net API has them)")
        emit(f"Floor between two hosts (bench/tcp_probe.c --exchanges): {size_name(b)} each way, sent and received on "
             f"one thread, {time_us('floor', 'tcp-exchange', 2, b):.3g} µs with receives that block{polled}.")
        emit("")

if fails or cl_fails:
    emit("Errors (the cells marked error or missing):")
    emit("")
    seen = {}
    for (lib, coll, n, b), why in sorted(fails.items()):
        seen.setdefault((lib, why), []).append(f"{coll} n={n} {size_name(b)}")
    for (lib, shape, coll, b), why in sorted(cl_fails.items()):
        seen.setdefault((lib, why), []).append(f"{coll} {shape.replace('x', ' x ')} {size_name(b)}")
    for (lib, why), cases in seen.items():
        emit(f"- {lib}: {why} ({len(cases)} case(s): {', '.join(cases[:4])}{', ...' if len(cases) > 4 else ''})")
    emit("")

text = "\n".join(lines)
print(text)
if out_path:
    with open(out_path, "w") as f:
        f.write(text + "\n")

# ---- the picture -------------------------------------------------------------------------------

def plot(path):
    """busbw of every library in each bandwidth case (AllReduce at 1 MiB and up per n, then the other
    collectives), grouped bars on a log scale, the ceiling beside the AllReduce cases."""
    series = [("kizuna", "kizuna"), ("kizuna-host", "kizuna, host buffers")] + present + [("ceiling", "ceiling")]
    colours = ["#0072B2", "#56B4E9", "#D55E00", "#E69F00", "#CC79A7", "#000000"]
    groups = [("allreduce", n, b) for n, b in ar_keys if b >= MIB] + list(other)
    vals = [busbw(l, c, n, b) for c, n, b in groups for l, _ in series]
    pos = [v for v in vals if v]
    if not groups or not pos:
        return
    import math
    lo, hi = math.floor(math.log10(min(pos))), math.ceil(math.log10(max(pos)))
    hi = max(hi, lo + 1)
    bar, gap, left, top, height = 12, 20, 70, 50, 330
    gw = bar * len(series) + gap
    width = left + gw * len(groups) + 20
    legend_y = top + height + 80
    total_h = legend_y + 20 * ((len(series) + 2) // 3) + 10
    def y(v):
        return top + height - (math.log10(v) - lo) / (hi - lo) * height
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{total_h}" '
           f'viewBox="0 0 {width} {total_h}" font-family="sans-serif" font-size="11">',
           '<rect width="100%" height="100%" fill="white"/>',
           f'<text x="{width / 2:.0f}" y="24" font-size="14" text-anchor="middle">The race: busbw (GB/s, log scale), '
           f'{notes.get("date", "?")}, {notes.get("cpus", "?")} CPUs</text>']
    for e in range(lo, hi + 1):
        yy = top + height - (e - lo) / (hi - lo) * height
        label = f"{10.0 ** e:g}"
        out.append(f'<line x1="{left}" y1="{yy:.1f}" x2="{width - 20}" y2="{yy:.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{yy + 4:.1f}" text-anchor="end">{label}</text>')
    for g, (c, n, b) in enumerate(groups):
        x0 = left + g * gw + gap / 2
        for s, (lib, _) in enumerate(series):
            v = busbw(lib, c, n, b)
            if not v:
                continue
            yy = max(top, y(v))
            out.append(f'<rect class="{lib}" x="{x0 + s * bar:.1f}" y="{yy:.1f}" width="{bar - 1}" '
                       f'height="{top + height - yy:.1f}" fill="{colours[s % len(colours)]}">'
                       f'<title>{lib} {c} n={n} {size_name(b)}: {v:.3g} GB/s</title></rect>')
        cx = x0 + bar * len(series) / 2
        out.append(f'<text x="{cx:.1f}" y="{top + height + 16}" text-anchor="middle">{c}</text>')
        out.append(f'<text x="{cx:.1f}" y="{top + height + 30}" text-anchor="middle">n={n}, {size_name(b)}</text>')
    out.append(f'<rect x="{left}" y="{top}" width="{width - 20 - left}" height="{height}" fill="none" stroke="black"/>')
    for s, (lib, title) in enumerate(series):
        lx, ly = left + (s % 3) * 220, legend_y + (s // 3) * 20
        out.append(f'<rect x="{lx}" y="{ly - 9}" width="12" height="12" fill="{colours[s % len(colours)]}"/>')
        out.append(f'<text x="{lx + 18}" y="{ly + 1}">{title}</text>')
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")

if plot_path:
    plot(plot_path)
