"""torch.distributed.all_reduce on CPU tensors: kizuna against Gloo in the same run.

    torchrun --nproc-per-node N bench/torch_allreduce.py [--iters K]

(with PYTHONPATH reaching kizuna.torch: ./kz build puts it in build/python). The default group is
kizuna's, a Gloo group of the same ranks runs the same calls; each size alternates between them.
Time per call: the median over K calls of the slowest rank's time (a barrier before each call);
busbw as nccl-tests computes it, 2 (n - 1) / n x bytes / time.
"""
import argparse
import statistics
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import kizuna.torch  # noqa: F401

parser = argparse.ArgumentParser()
parser.add_argument("--iters", type=int, default=0, help="calls per size (0: by size)")
parser.add_argument("--sizes", default="8,64,512,4K,32K,256K,1M,4M,16M,64M", help="bytes per call, K/M suffixes")
parser.add_argument("--only", choices=["kizuna", "gloo"], help="time one backend (for a profile)")
args = parser.parse_args()

dist.init_process_group("kizuna", timeout=timedelta(seconds=300))
rank, n = dist.get_rank(), dist.get_world_size()
gloo = dist.new_group(backend="gloo")
groups = {"kizuna": None, "gloo": gloo}
if args.only:
    groups = {args.only: groups[args.only]}


def timed(group, t, iters):
    times = []
    for _ in range(iters + 2):
        dist.barrier(group=gloo)
        start = time.perf_counter()
        dist.all_reduce(t, group=group)
        times.append(time.perf_counter() - start)
    slowest = torch.tensor(times[2:], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=gloo)
    return statistics.median(slowest.tolist())


if rank == 0:
    print(f"torch {torch.__version__}, {n} processes, float32 sum; time per call in us, busbw in GB/s")
    print(f"{'bytes':>10} {'kizuna us':>10} {'gloo us':>10} {'kizuna GB/s':>12} {'gloo GB/s':>10} {'speed-up':>9}")
sizes = [int(x[:-1]) << (10 if x[-1] == "K" else 20) if x[-1] in "KM" else int(x) for x in args.sizes.split(",")]
for size in sizes:
    iters = args.iters or (200 if size <= 64 << 10 else 50 if size <= 4 << 20 else 10)
    t = torch.ones(size // 4)
    result = {name: timed(group, t, iters) for name, group in groups.items()}
    if rank == 0 and args.only:
        print(f"{size:>10} {args.only} {result[args.only] * 1e6:.1f} us", flush=True)
    elif rank == 0:
        bw = {k: 2 * (n - 1) / n * size / v / 1e9 for k, v in result.items()}
        print(f"{size:>10} {result['kizuna'] * 1e6:>10.1f} {result['gloo'] * 1e6:>10.1f} {bw['kizuna']:>12.3f} "
              f"{bw['gloo']:>10.3f} {result['gloo'] / result['kizuna']:>8.2f}x", flush=True)
dist.destroy_process_group()
