#!/usr/bin/env python3
"""Writes the example plan files of this folder (docs/PLAN_FILES.md). Run it here; the files are
committed. Each is an AllReduce schedule in kizuna's plan file format:

  torus2d_4x2.json   8 ranks on a 4 x 2 torus (rank = y * 4 + x): a ring reduce-scatter along x,
                     then along y on the part each rank kept, then the all-gathers back, y then x;
                     every transfer between torus neighbours
  ocs_pairs_8.json   8 ranks whose optical circuit switch pairs rank i with i xor 1, then i xor 2,
                     then i xor 4: reduce-scatter by halving over the three circuit sets, then
                     all-gather by doubling back over them
  hamilton_2x4.json  8 ranks on a 2 x 4 torus (rank = y * 2 + x) whose x neighbours share two
                     cables: ring AllReduces both ways round two cycles through every rank that
                     share no cable (0 1 3 2 4 5 7 6 and 0 2 3 5 4 6 7 1), a quarter of the vector
                     each, so that every port carries the same bytes each way
  ring_stream_8.json 8 ranks on a bidirectional ring, aggregation as data streams through it (the
                     second row of NTT's 2024 talk on collectives): the vector in 8 pieces, one
                     channel each; piece j's two halves of the ring reduce towards the cable
                     between ranks j and j + 1, chunk by chunk (4 a piece) as the data streams
                     in, exchange over it and broadcast back: N - 1 = 7 transfers deep, each
                     cable but one carrying the piece once each way, the unused one rotating with
                     j (tools/sim/seeds_test.cc runs it)
"""
import json


def step(kind, peer=None, dst=None, src=None):
    s = {"step": kind}
    if peer is not None:
        s["peer"] = peer
    if dst is not None:
        s["dst"] = dst
    if src is not None:
        s["src"] = src
    return s


def sl(buf, first, n):
    return f"{buf}[{first}+{n}]"


def ring_reduce_scatter(ring, pos, parts, base, size, src_buf):
    """Ring reduce-scatter among `ring` (ranks in ring order) of the units [base, base + parts * size):
    part p is [base + p * size, +size). Returns the steps of ring[pos] and the part it keeps."""
    n = len(ring)
    nxt, prv = ring[(pos + 1) % n], ring[(pos - 1) % n]
    part = lambda p: (base + (p % n) * size, size)
    out = [step("send", nxt, src=sl(src_buf, *part(pos)))]
    for s in range(1, n):
        p = (pos - s) % n
        out.append(step("recv-reduce", prv, dst=sl("out", *part(p)), src=sl(src_buf, *part(p))))
        if s < n - 1:
            out.append(step("send", nxt, src=sl("out", *part(p))))
    return out, (pos + 1) % n


def ring_all_gather(ring, pos, own, base, size):
    n = len(ring)
    nxt, prv = ring[(pos + 1) % n], ring[(pos - 1) % n]
    part = lambda p: (base + (p % n) * size, size)
    out = [step("send", nxt, src=sl("out", *part(own)))]
    for s in range(1, n):
        p = (own - s) % n
        out.append(step("recv", prv, dst=sl("out", *part(p))))
        if s < n - 1:
            out.append(step("send", nxt, src=sl("out", *part(p))))
    return out


def write(name, nranks, units, ranks):
    doc = {"format": "kizuna-plan 1", "name": name, "collective": "allreduce", "nranks": nranks, "units": units,
           "placement": "both", "ranks": [{"rank": r, "scratch": 0, "channels": [ranks[r]]} for r in range(nranks)]}
    with open(name + ".json", "w") as f:
        f.write(json.dumps(doc, indent=2) + "\n")


def write_channels(name, nranks, units, ranks, scratch, placement="both"):
    """Like write, each rank with several channels and scratch, one step per line (the streaming
    files hold thousands of steps)."""
    lines = ["{", f' "format": "kizuna-plan 1", "name": "{name}", "collective": "allreduce",',
             f' "nranks": {nranks}, "units": {units}, "placement": "{placement}",', ' "ranks": [']
    for r in range(nranks):
        lines.append(f'  {{"rank": {r}, "scratch": {scratch[r]}, "channels": [')
        for c, steps in enumerate(ranks[r]):
            lines.append("   [")
            lines += ["    " + json.dumps(st) + ("," if i + 1 < len(steps) else "") for i, st in enumerate(steps)]
            lines.append("   ]" + ("," if c + 1 < len(ranks[r]) else ""))
        lines.append("  ]}" + ("," if r + 1 < nranks else ""))
    lines += [" ]", "}"]
    with open(name + ".json", "w") as f:
        f.write("\n".join(lines) + "\n")


def ring_stream(n, chunks):
    """Aggregation as data streams through a bidirectional ring of n (even) ranks. Piece j (channel
    j, `chunks` units) is reduced along the line j+1-n/2, ..., j-1, j | j+1, ..., j+n/2: each half
    towards its root (j on the left, j+1 on the right), the roots exchange their halves' sums over
    the cable between them, and the sum comes back down. Each rank lists its steps for the piece in
    the order of the time each can happen in a steady pipeline, counted in transfers of one unit,
    as the engine's INA trees do (collectives/algorithms/ina.cc, TreeSchedule): chunk k leaves a
    rank of height h (hops above its half's leaf) at k + h + 1, crosses between the roots at
    k + n/2, and reaches a rank of depth d (hops below its root) at k + n/2 + d; receives before
    sends at equal times. Both ends of a transfer give it the same time, so the ranks list
    their transfers in one order and two started steps per channel suffice. A chunk thus crosses
    n/2 - 1 cables up, 1 between the roots and n/2 - 1 down: n - 1 transfers deep."""
    half = n // 2
    top = half - 1  # a root's height
    units = n * chunks
    ranks = [[] for _ in range(n)]
    scratch = [0] * n
    for j in range(n):
        for r in range(n):
            left = (j - r) % n < half
            d = (j - r) % n if left else (r - j - 1) % n  # depth below its half's root
            h = top - d
            child = (r - 1) % n if left else (r + 1) % n  # away from the root
            parent = (r + 1) % n if left else (r - 1) % n
            partner = (j + 1) % n if left else j
            events = []  # (time, receive 0 / send 1, chunk, step)
            for k in range(chunks):
                u = j * chunks + k
                mine, src = sl("out", u, 1), sl("in", u, 1)
                if d < top:
                    events.append((k + h, 0, k, step("recv-reduce", child, dst=mine, src=src)))
                if d > 0:
                    events.append((k + h + 1, 1, k, step("send", parent, src=mine if d < top else src)))
                    events.append((k + top + 1 + d, 0, k, step("recv", parent, dst=mine)))
                else:  # a root: swap the halves' sums with the other root, add them
                    slot = sl("scratch", scratch[r] + k, 1)
                    events.append((k + top + 1, 1, k, step("send", partner, src=mine)))
                    events.append((k + top + 1, 0, k, step("recv", partner, dst=slot)))
                    events.append((k + top + 1.5, 0, k, {"step": "reduce", "dst": mine, "srcs": [mine, slot]}))
                if d < top:
                    events.append((k + top + 2 + d, 1, k, step("send", child, src=mine)))
            events.sort(key=lambda e: (e[0], e[1], e[2]))
            ranks[r].append([e[3] for e in events])
            if d == 0:
                scratch[r] += chunks
    write_channels(f"ring_stream_{n}", n, units, ranks, scratch)


def torus(nx, ny):
    units = nx * ny
    ranks = []
    for r in range(nx * ny):
        x, y = r % nx, r // nx
        row = [y * nx + i for i in range(nx)]
        col = [j * nx + x for j in range(ny)]
        a, kx = ring_reduce_scatter(row, x, nx, 0, ny, "in")                 # x: parts of ny units
        b, ky = ring_reduce_scatter(col, y, ny, kx * ny, 1, "out")            # y: within the kept part
        c = ring_all_gather(col, y, ky, kx * ny, 1)
        d = ring_all_gather(row, x, kx, 0, ny)
        ranks.append(a + b + c + d)
    write(f"torus2d_{nx}x{ny}", nx * ny, units, ranks)


def hamilton_rings(name, cycles):
    """Ring AllReduces round each cycle, both ways: channel 2i goes round cycles[i], channel 2i + 1
    the other way, each on its own n units of the vector."""
    n = len(cycles[0])
    orders = [order for cycle in cycles for order in (cycle, cycle[::-1])]
    ranks = [[] for _ in range(n)]
    for c, ring in enumerate(orders):
        for r in range(n):
            pos = ring.index(r)
            rs, own = ring_reduce_scatter(ring, pos, n, c * n, 1, "in")
            ranks[r].append(rs + ring_all_gather(ring, pos, own, c * n, 1))
    write_channels(name, n, len(orders) * n, ranks, [0] * n)


def ocs_pairs(n):
    units = n
    ranks = []
    for r in range(n):
        steps = []
        lo, size = 0, n  # the units this rank still reduces: [lo, lo + size)
        src = "in"
        bit = 1
        while bit < n:
            peer = r ^ bit
            half = size // 2
            keep_low = (r & bit) == 0
            mine, theirs = (lo, lo + half) if keep_low else (lo + half, lo)
            steps.append(step("send", peer, src=sl(src, theirs, half)))
            steps.append(step("recv-reduce", peer, dst=sl("out", mine, half), src=sl(src, mine, half)))
            lo, size, src = mine, half, "out"
            bit *= 2
        bit //= 2
        while bit >= 1:
            peer = r ^ bit
            keep_low = (r & bit) == 0
            other = lo + size if keep_low else lo - size
            steps.append(step("send", peer, src=sl("out", lo, size)))
            steps.append(step("recv", peer, dst=sl("out", other, size)))
            lo, size = min(lo, other), size * 2
            bit //= 2
        ranks.append(steps)
    write(f"ocs_pairs_{n}", n, units, ranks)


torus(4, 2)
hamilton_rings("hamilton_2x4", [[0, 1, 3, 2, 4, 5, 7, 6], [0, 2, 3, 5, 4, 6, 7, 1]])
ocs_pairs(8)
ring_stream(8, 4)
