"""What a "maco" process group answers when torch.distributed asks for its backend on a device
(``ProcessGroup._get_backend``), and how it shrinks: ``torch.distributed.distributed_c10d.
shrink_group(ranks_to_exclude, group, shrink_flags)`` (torch 2.11+), the fault-tolerance step of
a torchft-style loop (catch the error, shrink, go on), runs on :meth:`maco.Communicator.shrink`:
the survivors agree on who is gone (dead ranks are found, so ``ranks_to_exclude`` needs only the
ranks the application wants out), and ``SHRINK_ABORT`` revokes the old group first, ending its
waits here and on the peers.

torch makes the shrunk group itself (a ``ProcessGroup`` with the backend ``shrink`` returns
registered for the group's device type); that backend is a C++ ``Backend`` subclass whose
collectives are the ones of a new ``ProcessGroupMaco`` over the shrunk communicator. CPU tensors
on a shrunk group raise TypeError: the Gloo group beside the old one is not rebuilt (its ranks
changed; its store may have been the dead rank's).
"""

from __future__ import annotations

from typing import Any

import torch
from torch._C._distributed_c10d import Backend as _CBackend

BACKEND_NAME = "maco"  # the name torch.distributed knows the backend by

# torch.distributed.distributed_c10d.SHRINK_ABORT (ncclCommShrink's NCCL_SHRINK_ABORT).
_SHRINK_ABORT = 1


def _shrink(pg: Any, ranks_to_exclude: Any, shrink_flags: int) -> "_ShrunkBackend":
    """The backend of the group of ``pg``'s survivors not in ``ranks_to_exclude``."""
    if pg._comm is None:
        raise RuntimeError(
            f"maco process group, rank {pg.rank()}: it has no MACO communicator yet (no CUDA "
            "call, and pg.comm never read), so there is nothing to shrink; a group that never "
            "ran MACO work can be made anew")
    small = pg._comm.shrink(list(ranks_to_exclude), abort=bool(shrink_flags & _SHRINK_ABORT))
    if small is None:
        raise RuntimeError(f"maco process group: rank {pg.rank()} is excluded from the shrunk "
                           "group (excluded ranks do not call shrink_group)")
    return _ShrunkBackend(type(pg)(small.rank, small.size, small))


class _BoundBackend:
    """The answer of a "maco" group to ``_get_backend``: it cannot split or coalesce (torch
    then takes its other paths instead of failing on a Python group that registered no C++
    backend), and it can shrink."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = True

    def __init__(self, pg: Any):
        self._pg = pg

    def name(self) -> str:
        return BACKEND_NAME

    def shrink(self, ranks_to_exclude: Any, shrink_flags: int = 0, pg_options: Any = None) -> Any:
        return _shrink(self._pg, ranks_to_exclude, shrink_flags)


class _ShrunkBackend(_CBackend):
    """A shrunk "maco" group's backend as torch registers it: every call goes to the
    ``ProcessGroupMaco`` ``pg`` (its collectives, send and receive, barrier, abort); it can
    shrink again."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False
    supports_shrinking = True

    def __init__(self, pg: Any):
        super().__init__(pg.rank(), pg.size())
        self.pg = pg

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def shrink(self, ranks_to_exclude: Any, shrink_flags: int = 0, pg_options: Any = None) -> Any:
        return _shrink(self.pg, ranks_to_exclude, shrink_flags)


def _delegate(name: str) -> Any:
    def call(self: _ShrunkBackend, *args: Any, **kwargs: Any) -> Any:
        return getattr(self.pg, name)(*args, **kwargs)

    call.__name__ = name
    call.__doc__ = f"ProcessGroupMaco.{name} of the shrunk group."
    return call


for _name in ("allreduce", "allreduce_coalesced", "broadcast", "reduce", "allgather",
              "_allgather_base", "allgather_into_tensor_coalesced", "reduce_scatter",
              "_reduce_scatter_base", "reduce_scatter_tensor_coalesced", "alltoall_base",
              "alltoall", "send", "recv", "gather", "scatter", "barrier", "shutdown", "abort"):
    setattr(_ShrunkBackend, _name, _delegate(_name))


def backend_for(pg: Any, device: Any) -> Any:
    """``ProcessGroupMaco._get_backend``: the group answers for every device (CPU tensors go to
    its Gloo group, CUDA ones to MACO); a device torch cannot name stays torch's error."""
    torch.device(device)  # ValueError/RuntimeError for a bad one, as torch's
    return _BoundBackend(pg)


__all__ = ["backend_for"]
