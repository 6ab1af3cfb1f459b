"""A small DDP training run: an MLP, 50 steps, fixed seed, on the backend named by argv[1].

Run under torchrun. Each rank trains on its own batches; DDP averages the gradients. Rank 0 prints
"LOSSES <json list of rank 0's losses>"; every rank prints "PARAMS <rank> <sha256 of its
parameters>", which must be equal on every rank.
"""
import hashlib
import json
import sys
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

backend = sys.argv[1]
if backend == "kizuna":
    import kizuna.torch  # noqa: F401  (registers the backend)

dist.init_process_group(backend, timeout=timedelta(seconds=60))
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 64), torch.nn.ReLU(),
                            torch.nn.Linear(64, 10))
ddp = DDP(model, bucket_cap_mb=0.01)  # several buckets: several all_reduce calls per step
opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
data = torch.Generator().manual_seed(100 + rank)
losses = []
for step in range(50):
    x = torch.randn(64, 32, generator=data)
    y = torch.randint(0, 10, (64,), generator=data)
    opt.zero_grad()
    loss = torch.nn.functional.cross_entropy(ddp(x), y)
    loss.backward()
    opt.step()
    losses.append(loss.item())
params = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
print(f"PARAMS {rank} {hashlib.sha256(params.numpy().tobytes()).hexdigest()}", flush=True)
if rank == 0:
    print("LOSSES " + json.dumps(losses), flush=True)
dist.destroy_process_group()
