#!/usr/bin/env python3
"""Writes the example plan files of this folder (docs/PLAN_FILES.md). Run it here; the files are
committed. Each is an AllReduce schedule in kizuna's plan file format:

  torus2d_4x2.json   8 ranks on a 4 x 2 torus (rank = y * 4 + x): a ring reduce-scatter along x,
                     then along y on the part each rank kept, then the all-gathers back, y then x;
                     every transfer between torus neighbours
  ocs_pairs_8.json   8 ranks whose optical circuit switch pairs rank i with i xor 1, then i xor 2,
                     then i xor 4: reduce-scatter by halving over the three circuit sets, then
                     all-gather by doubling back over them
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
        f.write(json.dumps(doc, indent=1) + "\n")


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
ocs_pairs(8)
