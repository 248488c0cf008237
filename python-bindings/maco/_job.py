"""How a communicator finds its job: unique ids, the device argument, the environment's job
(the C library's launcher rules), and a torch.distributed group's store (what
:class:`maco.Communicator` is made from)."""

from __future__ import annotations

import math
import numbers
from typing import Any, Optional

from . import _maco
from ._types import INT_MAX, c_int

UNIQUE_ID_BYTES = _maco.UNIQUE_ID_BYTES


def unique_id() -> bytes:
    """Creates a new job id (128 bytes) whose root listens in this process.

    Call it on the process that will be rank 0, send the bytes to every rank by any means,
    and pass them to :meth:`Communicator.from_unique_id`. Not blocking; thread-safe.

    Raises:
        SystemCallError: no socket could be opened.
        InvalidArgumentError: a bad MACO_SOCKET_IFNAME.
    """
    return _maco.unique_id()


def cuda_device_count() -> tuple[int, str]:
    """``(count, why)``: the CUDA devices this process can use, and when there are none, a
    sentence saying why (no driver, a driver too old, no device). Creates no CUDA context."""
    return _maco.cuda_device_count()


def device_index(device: Any) -> int:
    """None -> -1 (MACO's default: local rank modulo the visible GPUs); int, "cuda:N" or a
    torch.device -> N.

    Raises:
        TypeError: a bool. ValueError: a negative index, one above 2**31 - 1 (a C int), or
        not a CUDA device.
    """
    if device is None:
        return -1
    if isinstance(device, bool):
        raise TypeError("device: expected an int, 'cuda:N' or a torch.device")
    if isinstance(device, int):
        if device < 0:
            raise ValueError(f"device: {device} is negative")
        return c_int(device, "device")
    index = getattr(device, "index", None)
    dtype = getattr(device, "type", None)
    if dtype is not None:
        if dtype != "cuda":
            raise ValueError(f"device: {device} is not a CUDA device")
        return -1 if index is None else c_int(index, "device")
    if isinstance(device, str):
        if device == "cuda":
            return -1
        if device.startswith("cuda:") and device[5:].isdigit():
            return c_int(int(device[5:]), "device")
    raise ValueError(f"device: {device!r} is not a CUDA device (int, 'cuda:N' or torch.device)")


def timeout_ms(timeout: Optional[float]) -> int:
    """Seconds (None: MACO_BOOTSTRAP_TIMEOUT, -1) as the C library's milliseconds.

    Raises: TypeError: not a number. ValueError: a negative timeout, NaN, or one above
    2,147,483 s (the C library takes an int of milliseconds)."""
    if timeout is None:
        return -1
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout: expected seconds (int or float), got {type(timeout).__name__}")
    if timeout < 0:
        raise ValueError(f"timeout: {timeout} s is negative")
    if math.isnan(timeout) or timeout * 1000 > INT_MAX:
        raise ValueError(f"timeout: {timeout} s is not in [0, {INT_MAX // 1000}] s (the C "
                         "library's int of milliseconds; None: MACO_BOOTSTRAP_TIMEOUT)")
    return int(timeout * 1000)


def create_handle(unique_id: Optional[bytes], rank: Optional[int], size: Optional[int],
                  device: Any, timeout: Optional[float]) -> Any:
    """The extension's communicator (``_maco.Comm``) for :class:`maco.Communicator`'s
    arguments: the job of ``unique_id`` as ``rank`` of ``size``, else the job the
    environment describes (:func:`_env_unique_id`). Collective and blocking.

    Raises:
        TypeError, ValueError: a bad argument (named). MACO's errors of the creation.
    """
    if unique_id is None:
        if rank is not None or size is not None:
            raise ValueError("rank/size: given without unique_id (the environment gives "
                             "them to Communicator())")
        uid, rank, size = _env_unique_id()
        return _maco.Comm.from_unique_id(uid, rank, size, device_index(device),
                                         timeout_ms(timeout))
    if not isinstance(unique_id, (bytes, bytearray)):
        raise TypeError(f"unique_id: expected bytes, got {type(unique_id).__name__}")
    if len(unique_id) != UNIQUE_ID_BYTES:
        raise ValueError(f"unique_id: expected {UNIQUE_ID_BYTES} bytes, got {len(unique_id)}")
    if rank is None or size is None:
        raise ValueError("rank and size: both are required with unique_id")
    if not isinstance(size, int) or size < 1:
        raise ValueError(f"size: {size!r} is not a positive int")
    c_int(size, "size", 1)
    if not isinstance(rank, int) or not 0 <= rank < size:
        raise ValueError(f"rank: {rank!r} is not in [0, {size})")
    return _maco.Comm.from_unique_id(bytes(unique_id), rank, size, device_index(device),
                                     timeout_ms(timeout))


def process_group_job(group: Any, device: Any) -> tuple:
    """``(unique id, rank, size, device)`` of a communicator over the ranks of a
    torch.distributed group (default: the world): group rank 0's new unique id reaches the
    others through the group's store (:func:`exchange_id`); ``device`` defaults to the group's
    bound device, else torch's current CUDA device. Collective over the group.

    Raises:
        RuntimeError: torch.distributed is not initialized.
    """
    import torch
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("group: torch.distributed is not initialized "
                           "(call torch.distributed.init_process_group first)")
    pg = group if group is not None else dist.group.WORLD
    rank = dist.get_rank(pg)
    size = dist.get_world_size(pg)
    if device is None:
        bound = getattr(pg, "bound_device_id", None)
        if bound is not None and bound.type == "cuda":
            device = bound
        elif torch.cuda.is_available():
            device = torch.cuda.current_device()
    uid = unique_id() if rank == 0 else None
    return exchange_id(pg, rank, uid), rank, size, device


def pg_name(pg: Any) -> str:
    """A name of the torch.distributed group ``pg`` that every member computes alike."""
    import torch.distributed as dist

    try:
        name = pg.group_name
    except (RuntimeError, AttributeError):  # a Python process group without a name
        name = None
    if not name:
        try:
            name = dist.distributed_c10d._get_process_group_name(pg)
        except Exception:  # noqa: BLE001 - private API
            name = None
    if not name or name == "None":
        ranks = dist.get_process_group_ranks(pg) if pg is not dist.group.WORLD else ["world"]
        name = "ranks-" + "-".join(str(r) for r in ranks)
    return name


class _Exchanges:
    """How many unique ids this process exchanged per group name (the store key's suffix:
    every rank of a group makes the same calls for it in the same order)."""

    def __init__(self):
        self.per_group: dict = {}  # group name -> ids exchanged so far

    def next_for(self, name: str) -> int:
        self.per_group[name] = self.per_group.get(name, 0) + 1
        return self.per_group[name]


_exchanges = _Exchanges()


def exchange_id(pg: Any, rank: int, uid: Optional[bytes]) -> bytes:
    """Group rank 0's unique id on every rank of ``pg``: through the default store under a
    per-group key when torch exposes it, else broadcast_object_list."""
    import torch.distributed as dist

    store = None
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - private API; fall back to a collective
        store = None
    if store is not None:
        name = pg_name(pg)
        key = f"maco/unique_id/{name}/{_exchanges.next_for(name)}"
        if rank == 0:
            store.set(key, uid)
        return bytes(store.get(key))
    obj = [uid]
    src = dist.get_global_rank(pg, 0) if pg is not dist.group.WORLD else 0
    dist.broadcast_object_list(obj, src=src, group=pg)
    return obj[0]


def _env_unique_id() -> tuple:
    """(unique id, rank, size) of the job the environment describes, by the C library's rules
    (maco_unique_id_from_env, docs/multi-node.md): maco-run's, torchrun's, Open MPI's, MPICH's,
    PMIx's or Slurm's variables, the id through the launcher's store (torchrun's, PMIx) or
    from MACO_BOOTSTRAP_ADDR and MACO_BOOTSTRAP_NONCE. Collective, blocking (bounded by
    MACO_BOOTSTRAP_TIMEOUT); errors name the variables."""
    return _maco.unique_id_from_env()

