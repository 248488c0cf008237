"""MACO as a torch.distributed backend.

``import maco.torch`` registers the backend ``"maco"``::

    import torch.distributed as dist
    import maco.torch  # noqa: F401
    dist.init_process_group("maco")      # or "cuda:maco"; torchrun's variables as usual
    dist.all_reduce(x)                   # x on CUDA: MACO; on CPU: Gloo

Device binding, as NCCL's process group: the group's MACO communicator uses one GPU, chosen

1. by ``init_process_group("maco", device_id=torch.device("cuda", i))``: bound to cuda:i and
   created during init_process_group (every rank passes device_id, or none does);
2. else lazily, by the device of the first tensor of the group's first CUDA operation
   (collective, send or receive): the communicator is created then, by every rank at its own
   first CUDA call on the group (creation is collective: each rank must make one). So
   ``torch.cuda.set_device(local_rank)`` may come before or after init_process_group;
3. else, where a device is needed without a tensor (``pg.comm`` read before any CUDA call, or
   a barrier with ``device_ids``), LOCAL_RANK modulo the visible GPUs (MACO's own choice, its
   local rank, when LOCAL_RANK is unset). A barrier before any CUDA call binds nothing: it runs
   on the Gloo group.

A tensor on another GPU than the bound one raises ValueError naming both devices and the rank,
before anything is enqueued.

The process group runs CUDA tensors' all_reduce, all_gather(_into_tensor), reduce_scatter
(_tensor), broadcast, reduce, all_to_all(_single), gather, scatter, send/recv (isend/irecv,
batch_isend_irecv) and barrier on MACO, and hands
CPU tensors to a Gloo process group it creates beside it. Work runs on one internal CUDA
stream per group, ordered after the caller's current stream; ``work.wait()`` makes the
caller's current stream wait for it (as NCCL's process group does), so ``async_op=True``
overlaps communication with later compute.

Sends and receives (``send``/``recv``, ``isend``/``irecv``, ``batch_isend_irecv``) are
queued and issued together, as one MACO group, when the program first waits on (or polls) one
of their works, or makes any other call on the group. So rings of ``isend``/``irecv`` and
``batch_isend_irecv`` do not deadlock, though torch.distributed gives a Python backend no
coalescing calls. The difference from NCCL's process group: a send that is never waited on
and followed by no other call on its group is not issued; wait on every work (as the
torch.distributed documentation requires anyway). ``gather`` and ``scatter`` run as such
groups of sends and receives.

:func:`patch_torch_distributed` instead keeps an existing process group (e.g. NCCL) and
routes the ``torch.distributed`` functions' CUDA calls through MACO, with no other change to
the program.
"""

from __future__ import annotations

import datetime
import sys
from typing import Any, Optional

import torch
import torch.distributed as dist

from ._process_group import BACKEND_NAME, MacoWork, ProcessGroupMaco
from ._routes import patch_torch_distributed, unpatch_torch_distributed

__all__ = ["ProcessGroupMaco", "MacoWork", "patch_torch_distributed",
           "unpatch_torch_distributed", "BACKEND_NAME"]


def _requested_device_id() -> Optional[torch.device]:
    """The ``device_id=`` of the init_process_group (or new_group) call that is creating the
    group: torch sets it as ``bound_device_id`` on a ProcessGroup that a Python backend's group
    replaces, and hands a backend's constructor only (store, rank, size, timeout); so it is
    read from torch's helper frame (its parameter ``device_id`` in every release since 2.3).
    None when there is none, or it is not a CUDA device."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_new_process_group_helper":
            d = f.f_locals.get("device_id")
            if isinstance(d, int) and not isinstance(d, bool):
                d = torch.device("cuda", d)
            if isinstance(d, torch.device) and d.type == "cuda" and d.index is not None:
                return d
            return None
        f = f.f_back
    return None


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupMaco:
    """init_process_group's constructor for "maco": the communicator is made at once on
    ``device_id`` when init_process_group was given one, else at the group's first CUDA call
    (the module's binding rules); its unique id travels through the group's store. A Gloo
    group beside it takes CPU tensors."""
    fallback = None
    if dist.is_gloo_available():
        fallback = dist.ProcessGroupGloo(dist.PrefixStore("maco_gloo/", store), rank, size,
                                         timeout)
    device = _requested_device_id()
    pg = ProcessGroupMaco(rank, size, None, fallback, store=store, timeout=timeout,
                          device=device)
    if device is not None:
        pg.bound_device_id = device  # what torch set on the group this one replaces
    return pg


def _register() -> None:
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


_register()
