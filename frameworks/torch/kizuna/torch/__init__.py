"""kizuna as a torch.distributed backend.

    import kizuna.torch
    torch.distributed.init_process_group("kizuna")   # under torchrun: nothing else is needed

Registers the backend "kizuna" for CPU tensors. Rank 0 creates kizuna's unique id and passes it
through the process group's store; the process group's timeout becomes kizuna's deadlines.
"""
import torch  # noqa: F401  (loads libtorch before the extension)
import torch.distributed as dist

from . import _C

version = _C.version


def _create(store, rank, size, timeout):
    return _C.create_backend(store, rank, size, timeout)


def set_deterministic(on=True):
    """Process groups created afterwards reduce in a fixed order: bitwise the same results on every
    run and rank (KIZUNA_DETERMINISTIC=1 does the same for the whole process)."""
    _C.set_deterministic(bool(on))


def zero_copy(group=None):
    """Whether `group`'s calls use the tensors' own memory (ranks that are processes of one host)
    rather than copies through kizuna's staging memory."""
    pg = group if group is not None else dist.group.WORLD
    return _C.zero_copy(pg._get_backend(torch.device("cpu")))


def flight_record(group=None):
    """`group`'s last operations on this rank (kizuna's flight recorder), as a dict: {"rank",
    "records": [{"seq", "call", "algorithm", "members", "path", "start_s", "end_s", "state",
    "error"}]}. What a stuck or failed job was doing; KIZUNA_DUMP_ON_TIMEOUT writes the same to a
    file when an operation times out."""
    import json

    pg = group if group is not None else dist.group.WORLD
    return json.loads(_C.flight_record(pg._get_backend(torch.device("cpu"))))


if "kizuna" not in dist.Backend.backend_list:
    dist.Backend.register_backend("kizuna", _create, devices=["cpu"])
