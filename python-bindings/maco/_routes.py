"""torch.distributed's functions routed to MACO: the routes that run a call on the MACO
process group shadowing its group (:class:`ProcessGroupMaco`, made at the group's first routed
call), used by :func:`patch_torch_distributed` and by the overlap scope's redirect
(``maco.optimize_context()``). Needs torch."""

from __future__ import annotations

import functools
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from ._comm import Communicator
from ._job import pg_name
from ._process_group import MacoWork, ProcessGroupMaco
from ._types import to_maco_op

__all__ = ["patch_torch_distributed", "unpatch_torch_distributed"]

# ------------------------------------------------------------------ patching

_originals: dict = {}
patched_groups: dict = {}
_patch_lock = threading.Lock()


def _group_key(group: Any) -> str:
    return pg_name(group)


def maco_pg(group: Any, device: Optional[torch.device] = None) -> Optional[ProcessGroupMaco]:
    """The MACO process group shadowing ``group`` (made at its first patched call:
    collective over the group, on ``device``, that call's tensors' device; None: the group's
    bound device, else torch's current one), or None when the call must go to the
    original."""
    pg = group if group is not None else dist.group.WORLD
    if isinstance(pg, ProcessGroupMaco):
        return None
    key = _group_key(pg)
    with _patch_lock:
        m = patched_groups.get(key)
        if m is None:
            comm = Communicator.from_process_group(pg, device=device)
            m = ProcessGroupMaco(dist.get_rank(pg), dist.get_world_size(pg), comm)
            patched_groups[key] = m
    return m


def _eligible(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_contiguous()
               for t in tensors)


def _finish(work: MacoWork, async_op: bool) -> Any:
    if async_op:
        return work
    work.wait()
    return None


def _group_rank(group: Any, global_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return global_rank
    return dist.get_group_rank(group, global_rank)


def _wrap(name: str, route: Callable) -> None:
    orig = getattr(dist, name)
    _originals[name] = orig

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        try:
            return route(orig, *args, **kwargs)
        except Fallback:
            return orig(*args, **kwargs)

    wrapper.__maco_patched__ = True
    setattr(dist, name, wrapper)
    setattr(dist.distributed_c10d, name, wrapper)


class Fallback(Exception):
    """The call is not one MACO takes: run torch's own."""


def pg_or_fallback(group: Any, *tensors: Any) -> ProcessGroupMaco:
    if not _eligible(*tensors):
        raise Fallback()
    if group is not None and dist.distributed_c10d._rank_not_in_group(group):
        raise Fallback()
    m = maco_pg(group, tensors[0].device if tensors else None)
    if m is None:
        raise Fallback()
    return m


def _op_or_fallback(op: Any) -> Any:
    try:
        return to_maco_op(op)
    except ValueError:
        raise Fallback() from None


def _r_all_reduce(orig, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    m = pg_or_fallback(group, tensor)
    o = _op_or_fallback(op)
    w = m._launch([tensor], [tensor], lambda s: m.comm.allreduce(tensor, op=o, stream=s))
    return _finish(w, async_op)


def _r_all_gather_into_tensor(orig, output_tensor, input_tensor, group=None, async_op=False):
    m = pg_or_fallback(group, output_tensor, input_tensor)
    return _finish(m._allgather_base(output_tensor, input_tensor), async_op)


def _r_all_gather(orig, tensor_list, tensor, group=None, async_op=False):
    m = pg_or_fallback(group, tensor, *tensor_list)
    return _finish(m.allgather([tensor_list], [tensor]), async_op)


def _r_reduce_scatter_tensor(orig, output, input, op=dist.ReduceOp.SUM, group=None,  # noqa: A002
                             async_op=False):
    m = pg_or_fallback(group, output, input)
    o = _op_or_fallback(op)
    w = m._launch([output, input], [output],
                  lambda s: m.comm.reduce_scatter(input, output, op=o, stream=s))
    return _finish(w, async_op)


def _r_reduce_scatter(orig, output, input_list, op=dist.ReduceOp.SUM, group=None,
                      async_op=False):
    m = pg_or_fallback(group, output, *input_list)
    opts = _c10d.ReduceScatterOptions()
    _op_or_fallback(op)
    opts.reduceOp = op
    return _finish(m.reduce_scatter([output], [input_list], opts), async_op)


def _r_broadcast(orig, tensor, src=None, group=None, async_op=False, group_src=None):
    m = pg_or_fallback(group, tensor)
    root = group_src if group_src is not None else _group_rank(group, src or 0)
    w = m._launch([tensor], [tensor], lambda s: m.comm.broadcast(tensor, root, stream=s))
    return _finish(w, async_op)


def _r_reduce(orig, tensor, dst=None, op=dist.ReduceOp.SUM, group=None, async_op=False,
              group_dst=None):
    m = pg_or_fallback(group, tensor)
    o = _op_or_fallback(op)
    root = group_dst if group_dst is not None else _group_rank(group, dst or 0)
    w = m._launch([tensor], [tensor], lambda s: m.comm.reduce(tensor, root, op=o, stream=s))
    return _finish(w, async_op)


def _r_all_to_all_single(orig, output, input, output_split_sizes=None,  # noqa: A002
                         input_split_sizes=None, group=None, async_op=False):
    m = pg_or_fallback(group, output, input)
    return _finish(m.alltoall_base(output, input, output_split_sizes or [],
                                   input_split_sizes or []), async_op)


def _r_all_to_all(orig, output_tensor_list, input_tensor_list, group=None, async_op=False):
    m = pg_or_fallback(group, *output_tensor_list, *input_tensor_list)
    return _finish(m.alltoall(output_tensor_list, input_tensor_list), async_op)


def _r_barrier(orig, group=None, async_op=False, device_ids=None):
    if group is not None and dist.distributed_c10d._rank_not_in_group(group):
        raise Fallback()
    m = maco_pg(group)
    if m is None:
        raise Fallback()
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()
    return _finish(m.barrier(), async_op)


ROUTES = {
    "all_reduce": _r_all_reduce,
    "all_gather_into_tensor": _r_all_gather_into_tensor,
    "all_gather": _r_all_gather,
    "reduce_scatter_tensor": _r_reduce_scatter_tensor,
    "reduce_scatter": _r_reduce_scatter,
    "broadcast": _r_broadcast,
    "reduce": _r_reduce,
    "all_to_all_single": _r_all_to_all_single,
    "all_to_all": _r_all_to_all,
    "barrier": _r_barrier,
}


def patch_torch_distributed() -> None:
    """Routes ``torch.distributed``'s collectives on CUDA tensors through MACO, for every
    process group already made or made later (NCCL's included), with no other change to
    the program.

    Patched: all_reduce, all_gather, all_gather_into_tensor, reduce_scatter,
    reduce_scatter_tensor, broadcast, reduce, all_to_all, all_to_all_single, barrier
    (``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X``). A call takes
    MACO when its tensors are contiguous CUDA tensors and its op is SUM, PRODUCT, MIN, MAX
    or AVG; anything else (CPU tensors, other ops, non-members) runs torch's own function.
    Each group gets a MACO communicator at its first patched call (collective over the
    group; the unique id travels through torch's store). ``async_op=True`` returns a
    :class:`MacoWork`.

    Not patched: code that bound the functions before this call
    (``from torch.distributed import all_reduce``), and callers of the process group's
    C++ API (DDP's reducer, FSDP, functional collectives): use
    ``init_process_group("maco")`` for those. send/recv stay torch's.
    Idempotent; not thread-safe with concurrent collectives.
    """
    if _originals:
        return
    for name, route in ROUTES.items():
        _wrap(name, route)


def unpatch_torch_distributed() -> None:
    """Restores torch's functions; the MACO communicators made for groups are closed."""
    for name, orig in _originals.items():
        setattr(dist, name, orig)
        setattr(dist.distributed_c10d, name, orig)
    _originals.clear()
    with _patch_lock:
        for m in patched_groups.values():
            m.comm.close()
        patched_groups.clear()
