"""The process's default communicator (:func:`maco.init`), which the module-level collectives,
``maco.tp``, :class:`maco.PersistentKernel` and the overlap API use when given none."""

from __future__ import annotations

import sys
import threading
from typing import Any, Optional, Sequence

from ._comm import Communicator
from ._errors import InvalidUsageError

__all__ = ["init", "finalize", "is_initialized", "get_default_communicator", "get_rank",
           "get_world_size", "get_local_rank", "empty"]

BACKEND_NAMES = (None, "maco", "nvshmem", "nccl_optimized")
"""What ``maco.init(backend=)`` and ``maco.config.set(backend=)`` take: all name MACO's one
backend."""


class _Default:
    """The default communicator and the torch.distributed group it was made over (None: the
    default group, or none); ``lock`` orders :func:`init` and :func:`finalize`."""

    def __init__(self):
        self.comm: Optional[Communicator] = None
        self.group: Any = None
        self.lock = threading.Lock()


_default = _Default()


def init(backend: Optional[str] = None, *, group: Any = None, device: Any = None,
         timeout: Optional[float] = None) -> Communicator:
    """Creates the process's default communicator, used by ``maco.allreduce`` and the other
    module-level calls, and returns it.

    Where the job comes from: ``group`` (a torch.distributed process group) when given, else
    torch.distributed's world when it is initialized, else the environment (maco-run's or
    torchrun's variables). Collective over the job's ranks; blocking.

    Args:
        backend: None or "maco"; the design's "nvshmem" and "nccl_optimized" are accepted as
            names of the same backend (MACO has one: its memory channels do the one-sided
            device-initiated transfers NVSHMEM does in the design, over NVLink/PCIe, with
            proxies for IB/TCP; MACO does not use NVSHMEM or NCCL).
        group, device, timeout: as :meth:`Communicator.from_process_group` and
            :class:`Communicator`.

    Raises:
        InvalidUsageError: already initialized (call :func:`finalize` first).
        ValueError: another backend name.
        and the errors of the Communicator constructors.
    """
    if backend not in BACKEND_NAMES:
        raise ValueError(f"backend: {backend!r}; MACO has one backend, 'maco' (also accepted "
                         "under the design's names 'nvshmem' and 'nccl_optimized')")
    with _default.lock:
        if _default.comm is not None and not _default.comm.closed:
            raise InvalidUsageError("maco.init: already initialized (maco.finalize() first)")
        if group is not None or dist_ready():
            comm = Communicator.from_process_group(group, device=device, timeout=timeout)
        else:
            comm = Communicator(device=device, timeout=timeout)
        _default.comm = comm
        _default.group = group
        return comm


def finalize() -> None:
    """Closes the default communicator (if any). Not collective. Idempotent."""
    with _default.lock:
        if _default.comm is not None:
            _default.comm.close()
        _default.comm = None


def is_initialized() -> bool:
    """Whether :func:`init` made a default communicator that is still open."""
    c = _default.comm
    return c is not None and not c.closed


def get_default_communicator() -> Communicator:
    """The communicator of :func:`init`.

    Raises:
        InvalidUsageError: :func:`init` was not called (or :func:`finalize` was).
    """
    c = _default.comm
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


def group() -> Any:
    """The torch.distributed group :func:`init` was given (None: the default group)."""
    return _default.group


def dist_ready() -> bool:
    """Whether torch.distributed is imported, available and initialized (never imports it)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()


def rank_size(comm: Optional[Communicator] = None) -> tuple:
    """(rank, world size) of ``comm``, else the default communicator, else
    torch.distributed's group of :func:`init` (its default group).

    Raises: InvalidUsageError: none of them exists."""
    if comm is not None:
        return comm.rank, comm.size
    c = _default.comm
    if c is not None and not c.closed:
        return c.rank, c.size
    if dist_ready():
        dist = sys.modules["torch.distributed"]
        return dist.get_rank(_default.group), dist.get_world_size(_default.group)
    raise InvalidUsageError("maco: no default communicator; call maco.init() first")


def empty(shape: Sequence[int] | int, dtype: Any, comm: Optional[Communicator] = None, *,
          framework: str = "torch") -> Any:
    """``comm.empty(shape, dtype)`` (default: the communicator of :func:`maco.init`)."""
    if comm is None:
        comm = get_default_communicator()
    return comm.empty(shape, dtype, framework=framework)
