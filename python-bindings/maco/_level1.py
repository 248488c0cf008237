"""Level 1: one default communicator per process and module-level collectives on it."""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional, Sequence

from ._comm import Communicator
from ._errors import InvalidUsageError
from ._types import ReduceOp

__all__ = [
    "init",
    "finalize",
    "is_initialized",
    "get_default_communicator",
    "get_rank",
    "get_world_size",
    "get_local_rank",
    "allreduce",
    "allgather",
    "reduce_scatter",
    "broadcast",
    "reduce",
    "all_to_all",
    "send",
    "recv",
    "barrier",
]

_default: Optional[Communicator] = None
_lock = threading.Lock()


def init(backend: Optional[str] = None, *, group: Any = None, device: Any = None,
         timeout: Optional[float] = None) -> Communicator:
    """Creates the process's default communicator, used by ``maco.allreduce`` and the other
    module-level calls, and returns it.

    Where the job comes from: ``group`` (a torch.distributed process group) when given, else
    torch.distributed's world when it is initialized, else the environment (maco-run's or
    torchrun's variables). Collective over the job's ranks; blocking.

    Args:
        backend: None or "maco" (MACO has one backend; accepted for the seed API's shape).
        group, device, timeout: as :meth:`Communicator.from_process_group` and
            :class:`Communicator`.

    Raises:
        InvalidUsageError: already initialized (call :func:`finalize` first).
        ValueError: another backend name.
        and the errors of the Communicator constructors.
    """
    global _default
    if backend not in (None, "maco"):
        raise ValueError(f"backend: {backend!r}; MACO has one backend, 'maco'")
    with _lock:
        if _default is not None and not _default.closed:
            raise InvalidUsageError("maco.init: already initialized (maco.finalize() first)")
        dist = sys.modules.get("torch.distributed")
        if group is not None or (dist is not None and dist.is_available() and dist.is_initialized()):
            comm = Communicator.from_process_group(group, device=device, timeout=timeout)
        else:
            comm = Communicator(device=device, timeout=timeout)
        _default = comm
        return comm


def finalize() -> None:
    """Closes the default communicator (if any). Not collective. Idempotent."""
    global _default
    with _lock:
        if _default is not None:
            _default.close()
        _default = None


def is_initialized() -> bool:
    """Whether :func:`init` made a default communicator that is still open."""
    return _default is not None and not _default.closed


def get_default_communicator() -> Communicator:
    """The communicator of :func:`init`.

    Raises:
        InvalidUsageError: :func:`init` was not called (or :func:`finalize` was).
    """
    c = _default
    if c is None or c.closed:
        raise InvalidUsageError("maco: no default communicator; call maco.init() first")
    return c


def get_rank() -> int:
    """This process's rank in the default communicator."""
    return get_default_communicator().rank


def get_world_size() -> int:
    """The number of ranks of the default communicator."""
    return get_default_communicator().size


def get_local_rank() -> int:
    """This process's rank among the ranks of its node."""
    return get_default_communicator().local_rank


def allreduce(x: Any, op: Any = ReduceOp.SUM, out: Any = None, *, stream: Any = None) -> Any:
    """:meth:`Communicator.allreduce` on the default communicator (in place unless ``out``)."""
    return get_default_communicator().allreduce(x, out, op=op, stream=stream)


def allgather(x: Any, out: Any = None, *, stream: Any = None) -> Any:
    """:meth:`Communicator.allgather` on the default communicator: shape (size, *x.shape)."""
    return get_default_communicator().allgather(x, out, stream=stream)


def reduce_scatter(x: Any, op: Any = ReduceOp.SUM, out: Any = None, *, stream: Any = None) -> Any:
    """:meth:`Communicator.reduce_scatter` on the default communicator."""
    return get_default_communicator().reduce_scatter(x, out, op=op, stream=stream)


def broadcast(x: Any, root: int = 0, out: Any = None, *, stream: Any = None) -> Any:
    """:meth:`Communicator.broadcast` on the default communicator (in place unless ``out``)."""
    return get_default_communicator().broadcast(x, root, out, stream=stream)


def reduce(x: Any, root: int = 0, op: Any = ReduceOp.SUM, out: Any = None, *,
           stream: Any = None) -> Any:
    """:meth:`Communicator.reduce` on the default communicator."""
    return get_default_communicator().reduce(x, root, out, op=op, stream=stream)


def all_to_all(x: Any, out: Any = None, *, in_splits: Optional[Sequence[int]] = None,
               out_splits: Optional[Sequence[int]] = None, stream: Any = None) -> Any:
    """:meth:`Communicator.all_to_all` on the default communicator."""
    return get_default_communicator().all_to_all(x, out, in_splits=in_splits,
                                                  out_splits=out_splits, stream=stream)


def send(x: Any, dst: int, *, stream: Any = None) -> None:
    """:meth:`Communicator.send` on the default communicator."""
    get_default_communicator().send(x, dst, stream=stream)


def recv(out: Any = None, src: Optional[int] = None, *, shape: Optional[Sequence[int]] = None,
         dtype: Any = None, stream: Any = None) -> Any:
    """:meth:`Communicator.recv` on the default communicator, e.g.
    ``maco.recv(src=0, shape=x.shape, dtype=x.dtype)``."""
    return get_default_communicator().recv(out, src, shape=shape, dtype=dtype, stream=stream)


def barrier() -> None:
    """:meth:`Communicator.barrier` on the default communicator (host-side)."""
    get_default_communicator().barrier()
