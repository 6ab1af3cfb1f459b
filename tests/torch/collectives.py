"""Every collective of torch.distributed through the "kizuna" backend, against Gloo in the same run.

Run under torchrun (any number of processes). The default process group is kizuna's; a Gloo group
of the same ranks computes the same calls on the same inputs. Integers must match exactly, floats
within the tolerance of a changed summation order; where Gloo does not take a call (AVG, some
types) the expected result is computed here from every rank's inputs, which each rank can make.
Rank 0 prints one line per case, "CASE <name> ok" or "CASE <name> FAIL <why>", then "DONE".
"""
import sys
import traceback
from datetime import timedelta

import torch
import torch.distributed as dist

import kizuna.torch as kt

dist.init_process_group("kizuna", timeout=timedelta(seconds=60))
rank, size = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
failures = []

FLOATS = [torch.float32, torch.float64, torch.float16, torch.bfloat16]
INTS = [torch.int32, torch.int64, torch.int8, torch.uint8]
SIZES = [1, 1000, 65537]


def make(r, n, dtype, salt=0):
    """Rank r's input: small values, so that sums and products of every rank stay exact in int8."""
    g = torch.Generator().manual_seed(1000 * r + 17 * n + salt)
    if dtype == torch.bool:
        return torch.randint(0, 2, (n,), generator=g).bool()
    if dtype in INTS:
        return torch.randint(1, 3, (n,), generator=g).to(dtype)
    return (torch.rand(n, generator=g, dtype=torch.float64) + 0.5).to(dtype)


def close(got, want):
    if got.dtype in (torch.float16, torch.bfloat16):
        return torch.allclose(got.double(), want.double(), rtol=2e-2, atol=1e-2)
    if got.dtype.is_floating_point:
        return torch.allclose(got, want, rtol=1e-5, atol=1e-6)
    return torch.equal(got, want)


def case(name, fn):
    try:
        ok, why = fn()
    except Exception as e:  # noqa: BLE001: a case's failure is reported, the others still run
        ok, why = False, f"{type(e).__name__}: {e}".replace("\n", " ")[:400]
        traceback.print_exc(file=sys.stderr)
    # Every rank's verdict: the case passes only where all of them passed.
    verdict = torch.tensor([0 if ok else 1], dtype=torch.int32)
    dist.all_reduce(verdict, group=gloo)
    if rank == 0:
        print(f"CASE {name} {'ok' if verdict.item() == 0 else 'FAIL ' + (why or 'on another rank')}", flush=True)


def reference(op, inputs):
    out = inputs[0].clone().double() if inputs[0].dtype.is_floating_point else inputs[0].clone().long()
    for x in inputs[1:]:
        x = x.double() if x.dtype.is_floating_point else x.long()
        if op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
            out = out + x
        elif op == dist.ReduceOp.PRODUCT:
            out = out * x
        elif op == dist.ReduceOp.MIN:
            out = torch.minimum(out, x)
        else:
            out = torch.maximum(out, x)
    if op == dist.ReduceOp.AVG:
        out = out / len(inputs) if inputs[0].dtype.is_floating_point else out // len(inputs)
    return out.to(inputs[0].dtype)


def with_gloo(call, want_fn):
    """Gloo's answer to `call`, or the local reference where Gloo refuses the call."""
    try:
        return call()
    except (RuntimeError, ValueError):
        return want_fn()


OPS = [dist.ReduceOp.SUM, dist.ReduceOp.PRODUCT, dist.ReduceOp.MIN, dist.ReduceOp.MAX, dist.ReduceOp.AVG]

for dtype in FLOATS + INTS:
    for op in OPS:
        if op == dist.ReduceOp.PRODUCT and dtype in (torch.float16, torch.bfloat16) and size > 2:
            continue  # products of 4 half-precision values round differently in every order

        def all_reduce(dtype=dtype, op=op):
            for n in SIZES:
                t = make(rank, n, dtype)
                dist.all_reduce(t, op=op)

                def by_gloo():
                    g = make(rank, n, dtype)
                    dist.all_reduce(g, op=op, group=gloo)
                    return g

                want = with_gloo(by_gloo, lambda: reference(op, [make(r, n, dtype) for r in range(size)]))
                if not close(t, want):
                    return False, f"{n} elements: {t[:4].tolist()} vs {want[:4].tolist()}"
            return True, ""

        case(f"all_reduce {str(dtype)[6:]} {op}", all_reduce)


def broadcast():
    root = size - 1
    for dtype in FLOATS + INTS + [torch.bool]:
        t = make(rank, 1001, dtype)
        dist.broadcast(t, src=root)
        if not torch.equal(t, make(root, 1001, dtype)):
            return False, f"{dtype}"
    return True, ""


case("broadcast every dtype", broadcast)


def reduce():
    root = size // 2
    for dtype in [torch.float32, torch.int64]:
        for op in [dist.ReduceOp.SUM, dist.ReduceOp.MAX]:
            t = make(rank, 999, dtype)
            dist.reduce(t, dst=root, op=op)
            want = reference(op, [make(r, 999, dtype) for r in range(size)]) if rank == root else make(rank, 999, dtype)
            if rank == root and not close(t, want):
                return False, f"{dtype} {op}"
    return True, ""


case("reduce", reduce)


def all_gather():
    for dtype in FLOATS + INTS + [torch.bool]:
        x = make(rank, 777, dtype)
        outs = [torch.empty_like(x) for _ in range(size)]
        dist.all_gather(outs, x)
        flat = torch.empty(777 * size, dtype=dtype)
        dist.all_gather_into_tensor(flat, x)
        for r in range(size):
            if not torch.equal(outs[r], make(r, 777, dtype)) or not torch.equal(flat[777 * r: 777 * (r + 1)],
                                                                                 make(r, 777, dtype)):
                return False, f"{dtype} part {r}"
    return True, ""


case("all_gather and all_gather_into_tensor every dtype", all_gather)


def reduce_scatter():
    for dtype in [torch.float32, torch.float64, torch.bfloat16, torch.int32, torch.int64]:
        for op in [dist.ReduceOp.SUM, dist.ReduceOp.MIN]:
            n = 513
            x = make(rank, n * size, dtype)
            out = torch.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, x, op=op)
            g = torch.empty(n, dtype=dtype)
            want = with_gloo(lambda: (dist.reduce_scatter_tensor(g, x.clone(), op=op, group=gloo), g)[1],
                             lambda: reference(op, [make(r, n * size, dtype) for r in range(size)])[
                                 n * rank: n * (rank + 1)])
            if not close(out, want):
                return False, f"tensor {dtype} {op}"
            outl = torch.empty(n, dtype=dtype)
            dist.reduce_scatter(outl, list(x.chunk(size)), op=op)
            if not close(outl, want):
                return False, f"list {dtype} {op}"
    return True, ""


case("reduce_scatter_tensor and reduce_scatter", reduce_scatter)


def all_to_all():
    # Even parts.
    x = torch.arange(size * 6, dtype=torch.float32) + 1000 * rank
    out = torch.empty_like(x)
    dist.all_to_all_single(out, x)
    want = torch.cat([torch.arange(6 * rank, 6 * rank + 6, dtype=torch.float32) + 1000 * r for r in range(size)])
    if not torch.equal(out, want):
        return False, f"even: {out.tolist()[:8]}"
    # Uneven: rank r sends (r + p + 1) rows of 3 to rank p.
    send_splits = [rank + p + 1 for p in range(size)]
    recv_splits = [r + rank + 1 for r in range(size)]
    x = torch.cat([torch.full((s, 3), float(100 * rank + p)) for p, s in enumerate(send_splits)])
    out = torch.empty(sum(recv_splits), 3)
    dist.all_to_all_single(out, x, output_split_sizes=recv_splits, input_split_sizes=send_splits)
    want = torch.cat([torch.full((s, 3), float(100 * r + rank)) for r, s in enumerate(recv_splits)])
    if not torch.equal(out, want):
        return False, "uneven"
    g = torch.empty_like(out)
    dist.all_to_all_single(g, x, output_split_sizes=recv_splits, input_split_sizes=send_splits, group=gloo)
    return torch.equal(g, out), "uneven differs from gloo"


case("all_to_all_single even and uneven", all_to_all)


def send_recv():
    # A ring: even ranks send first, odd ranks receive first.
    nxt, prv = (rank + 1) % size, (rank - 1) % size
    x = make(rank, 4099, torch.float64)
    got = torch.empty_like(x)
    if size == 1:
        return True, ""
    if rank % 2 == 0:
        dist.send(x, nxt)
        dist.recv(got, prv)
    else:
        dist.recv(got, prv)
        dist.send(x, nxt)
    return torch.equal(got, make(prv, 4099, torch.float64)), "ring exchange"


case("send and recv", send_recv)


def barrier_and_work():
    dist.barrier()
    t = torch.ones(100)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    if not work.is_completed() or not torch.equal(t, torch.full((100,), float(size))):
        return False, "async all_reduce"
    fut = dist.all_reduce(torch.ones(8), async_op=True).get_future()
    return bool(torch.equal(fut.wait()[0], torch.full((8,), float(size)))), "future"


case("barrier, Work.wait, is_completed and the future", barrier_and_work)


def sub_group():
    members = list(range(0, size, 2)) or [0]
    g = dist.new_group(ranks=members, backend="kizuna")
    if rank in members:
        t = torch.full((10,), float(rank))
        dist.all_reduce(t, group=g)
        if not torch.equal(t, torch.full((10,), float(sum(members)))):
            return False, f"{t.tolist()[:2]}"
    return True, ""


case("new_group of the even ranks", sub_group)


def non_contiguous():
    t = (torch.arange(40, dtype=torch.float32).view(8, 5) + rank).t()  # a transposed view
    dist.all_reduce(t)
    want = (torch.arange(40, dtype=torch.float32).view(8, 5) * size + sum(range(size))).t()
    return torch.equal(t, want), "transposed"


case("non-contiguous tensors", non_contiguous)


def complex_sum():
    # torch.distributed passes complex tensors as their real view: a SUM is exact.
    t = torch.full((6,), complex(rank, 1), dtype=torch.complex64)
    dist.all_reduce(t)
    return torch.equal(t, torch.full((6,), complex(sum(range(size)), size), dtype=torch.complex64)), "complex sum"


case("complex tensors (summed as their real view)", complex_sum)


def bad_input():
    try:
        dist.all_reduce(torch.ones(4, dtype=torch.int32), op=dist.ReduceOp.BAND)
    except (RuntimeError, ValueError) as e:
        return "kizuna" in str(e) and "not supported" in str(e), f"message: {e}"
    return False, "BAND accepted"


case("an unsupported op is refused, naming it", bad_input)

def flight_record():
    rec = kt.flight_record()
    calls = [r["call"] for r in rec["records"]]
    ok = rec["rank"] == rank and any(c.startswith("allreduce") for c in calls)
    ok = ok and all(r["state"] in ("ok", "failed") for r in rec["records"])
    return ok, f"{rec['rank']} {calls[-3:]}"


case("the flight recorder lists the calls", flight_record)

if rank == 0:
    print(f"ZERO_COPY {kt.zero_copy()}", flush=True)
    print("DONE", flush=True)
dist.destroy_process_group()
