"""A rank lost mid-training: the others must raise within the process group's timeout, naming it.

Started without torchrun (whose agent would stop the others when one dies): RANK, WORLD_SIZE,
MASTER_ADDR and MASTER_PORT come from the caller. The last rank exits abruptly at step 5; every
other rank prints "RAISED <seconds after the loss> <message>" or "NO ERROR".
"""
import os
import time
from datetime import timedelta

import torch
import torch.distributed as dist

import kizuna.torch  # noqa: F401

dist.init_process_group("kizuna", timeout=timedelta(seconds=float(os.environ.get("TIMEOUT_S", "10"))))
rank, size = dist.get_rank(), dist.get_world_size()
lost = size - 1
t = torch.ones(1 << 16)
lost_at = None
try:
    for step in range(1000):
        if step == 5:
            if rank == lost:
                os._exit(3)  # no goodbye: as a crashed or killed process
            lost_at = time.monotonic()
        dist.all_reduce(t)
        t.fill_(1.0)
    print("NO ERROR", flush=True)
except Exception as e:  # noqa: BLE001: what the test looks at
    waited = time.monotonic() - (lost_at or time.monotonic())
    print(f"RAISED {waited:.1f} {type(e).__name__}: {e}".replace("\n", " ")[:2000], flush=True)
os._exit(0)
