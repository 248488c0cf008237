"""The module-level collectives (``maco.allreduce``, ``maco.allgather``, ...): the default
communicator's collectives with the design's per-call overlap options, overlapped inside an
overlap scope, traced as torch's functional collectives under ``torch.compile``, and run on
torch.distributed for CPU tensors."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Iterator, Optional, Sequence

from . import _config
from ._comm import Communicator
from ._default_comm import dist_ready, get_default_communicator, group, is_initialized
from ._overlap import _current_scope
from ._ring import current_ring
from ._streams import (CommWork, _Inside, _is_compiling, _join_group, _priority, _work_handle,
                       async_tensor, in_ordered_context, run_on_comm_stream, run_ordered)
from ._types import ReduceOp, to_maco_op

__all__ = ["allreduce", "allgather", "reduce_scatter", "broadcast", "reduce", "all_to_all",
           "send", "recv", "barrier"]


class _Opts:
    """Per-call options of the Level-1 collectives (see :func:`allreduce`)."""

    __slots__ = ("async_op", "priority", "overlap_group", "algorithm", "overlap_with_next")

    def __init__(self, async_op: bool = False, priority: Any = None,
                 overlap_group: Optional[str] = None, use_ring: Optional[bool] = None,
                 algorithm: Optional[str] = None, overlap_with_next: bool = False,
                 kind: str = "allreduce"):
        self.async_op = bool(async_op)
        if priority is not None:
            _priority(priority)  # checks it
        self.priority = priority
        if overlap_group is not None and (not isinstance(overlap_group, str) or not overlap_group):
            raise ValueError(f"overlap_group: {overlap_group!r} is not a non-empty str")
        self.overlap_group = overlap_group
        if use_ring not in (None, True, False):
            raise ValueError(f"use_ring: {use_ring!r} is not a bool")
        if use_ring and algorithm is not None and algorithm != _RING[kind]:
            raise ValueError(f"use_ring=True and algorithm={algorithm!r} disagree (use_ring "
                             f"means {_RING[kind]!r} for {kind})")
        if algorithm is not None and not isinstance(algorithm, str):
            raise ValueError(f"algorithm: {algorithm!r} is not a name")
        self.algorithm = _RING[kind] if use_ring else algorithm
        self.overlap_with_next = bool(overlap_with_next)

    def overlapped(self, scope: Any) -> bool:
        """Whether the call runs on the communication stream (else on the caller's)."""
        if self.async_op or self.overlap_with_next:
            return True
        if scope is not None:
            return _config.setting("overlap_strategy") != "none"
        return self.priority is not None or self.overlap_group is not None


# use_ring=True: MACO has no ring algorithm; "rsag" (reduce-scatter then allgather, every
# rank moving 2 (n - 1) / n of the data, as a ring does, in one step over the NVLink mesh)
# and "mesh" are the bandwidth-optimal ones it has.
_RING = {"allreduce": "rsag", "allgather": "mesh", "reduce_scatter": "mesh",
         "broadcast": "mesh"}


@contextlib.contextmanager
def _forced(comm: Communicator, kind: str, algorithm: Optional[str]) -> Iterator[None]:
    """``algorithm`` forced on ``kind`` for one call, then what was forced before."""
    if algorithm is None:
        yield
        return
    before = comm.forced_algorithm(kind)
    comm.set_algorithm(kind, algorithm)
    try:
        yield
    finally:
        comm.set_algorithm(kind, before)


def _is_cpu_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and not x.is_cuda


def _collective(kind: str, x: Any, out: Any, opts: _Opts, stream: Any, **kw: Any) -> Any:
    """The Level-1 collectives' common path: MACO on the default communicator for CUDA
    tensors (on the caller's stream, or overlapped on the communication stream), or
    torch.distributed for CPU tensors."""
    scope = _current_scope()
    overlap = opts.overlapped(scope) and stream is None
    if _is_cpu_tensor(x) and dist_ready():
        return _cpu_collective(kind, x, out, opts, scope, overlap, **kw)
    comm = get_default_communicator()
    fn = getattr(comm, kind)

    def call(s: Any) -> Any:
        return fn(x, *kw.get("pos", ()), out=out, stream=s, **kw.get("named", {}))

    with _forced(comm, kind, opts.algorithm):
        if not overlap:
            if stream is None and in_ordered_context():
                return run_ordered(comm, call)
            return call(stream)
        if scope is not None:
            scope.before_issue([x, out])
        priority = opts.priority if opts.priority is not None or scope is None else scope.priority
        result, h = run_on_comm_stream(comm, call, priority, kind)
    return _finish(result, h, x, opts, scope)


def _finish(result: Any, h: Any, x: Any, opts: _Opts, scope: Any) -> Any:
    _join_group(h, opts.overlap_group)
    if opts.async_op:
        return CommWork(result, h)
    if scope is not None:
        scope.add(h, [result], [] if x is result else [x])
        return result
    torch = sys.modules.get("torch")
    if opts.overlap_with_next and torch is not None and isinstance(result, torch.Tensor):
        return async_tensor(result, h)
    if opts.overlap_with_next:
        return CommWork(result, h)
    h.wait()
    return result


_DIST_OPS = {ReduceOp.SUM: "SUM", ReduceOp.PROD: "PRODUCT", ReduceOp.MIN: "MIN",
             ReduceOp.MAX: "MAX", ReduceOp.AVG: "SUM"}


def _cpu_collective(kind: str, x: Any, out: Any, opts: _Opts, scope: Any, overlap: bool,
                    **kw: Any) -> Any:
    """CPU tensors through torch.distributed (the group of :func:`init`, else the default
    one), asynchronously; AVG as SUM then a division (Gloo has no AVG)."""
    import torch
    import torch.distributed as dist

    g = group()
    ws = dist.get_world_size(g)
    named = kw.get("named", {})
    op = to_maco_op(named.get("op", ReduceOp.SUM))
    after = None
    if scope is not None and overlap:
        scope.before_issue([x, out])
    with _Inside():  # torch.distributed's own functions, not a scope's wrappers
        if kind == "allreduce":
            result = x
            if out is not None:
                if out.numel() != x.numel() or out.dtype != x.dtype:
                    raise ValueError(f"out: {out.dtype} {tuple(out.shape)}; allreduce needs "
                                     f"{x.numel()} elements of {x.dtype}")
                out.view(-1).copy_(x.reshape(-1))
                result = out
            work = dist.all_reduce(result, op=getattr(dist.ReduceOp, _DIST_OPS[op]), group=g,
                                   async_op=True)
            if op == ReduceOp.AVG:
                def after(t=result):
                    if t.is_floating_point() or t.is_complex():
                        t.div_(ws)
                    else:
                        t.copy_(torch.div(t, ws, rounding_mode="trunc"))
        elif kind == "allgather":
            result = out if out is not None else torch.empty((ws, *x.shape), dtype=x.dtype)
            if result.numel() != ws * x.numel():
                raise ValueError(f"out: has {result.numel()} elements; allgather needs "
                                 f"{ws * x.numel()}")
            work = dist.all_gather_into_tensor(result.view(-1), x.contiguous().view(-1), group=g,
                                               async_op=True)
        elif kind == "reduce_scatter":
            if x.numel() % ws:
                raise ValueError(f"x: {x.numel()} elements is not a multiple of the world "
                                 f"size {ws}")
            k = x.numel() // ws
            shape = (k,)
            if x.dim() and x.shape[0] == ws:
                shape = tuple(x.shape[1:])
            elif x.dim() and x.shape[0] % ws == 0:
                shape = (x.shape[0] // ws, *x.shape[1:])
            result = out if out is not None else torch.empty(shape, dtype=x.dtype)
            tmp = x.detach().clone().reshape(-1)
            work = dist.all_reduce(tmp, op=getattr(dist.ReduceOp, _DIST_OPS[op]), group=g,
                                   async_op=True)
            me = dist.get_rank(g)

            def after(t=result, tmp=tmp):
                part = tmp[me * k:(me + 1) * k]
                if op == ReduceOp.AVG:
                    part = part / ws if part.is_floating_point() else \
                        torch.div(part, ws, rounding_mode="trunc")
                t.view(-1).copy_(part)
        elif kind == "broadcast":
            root = kw["pos"][0]
            result = x if out is None else out
            if out is not None:
                out.view(-1).copy_(x.reshape(-1))
            src = dist.get_global_rank(g, root) if g is not None else root
            work = dist.broadcast(result, src=src, group=g, async_op=True)
        else:
            raise TypeError(f"x: {kind} of CPU tensors is not supported here; use a CUDA "
                            "tensor")
    h = _work_handle(work, kind)
    h.after = after
    if not overlap:
        h.wait()
        return result
    return _finish(result, h, x, opts, scope)


def _op_name(op: Any) -> str:
    return {ReduceOp.SUM: "sum", ReduceOp.PROD: "product", ReduceOp.MIN: "min",
            ReduceOp.MAX: "max", ReduceOp.AVG: "avg"}[to_maco_op(op)]


def _traced(kind: str, x: Any, op: Any, out: Any) -> Any:
    """Under torch.compile: the collective as torch's functional collective on the group of
    :func:`init` (else the world), which graphs can hold; the "maco" backend turns a GEMM
    followed by it into the fused operator and the rest into MACO's collective op."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc

    g = group() if group() is not None else dist.group.WORLD
    if kind == "allreduce":
        r = fc.all_reduce(x, _op_name(op), g)
        target = x if out is None else out
        target.copy_(r)
        return target
    if kind == "allgather":
        ws = dist.get_world_size(g)
        r = fc.all_gather_tensor(x.contiguous(), 0, g)
        r = r.view(ws, *x.shape)
        return r if out is None else out.copy_(r.view_as(out))
    r = fc.reduce_scatter_tensor(x.contiguous(), _op_name(op), 0, g)
    return r if out is None else out.copy_(r.view_as(out))


def allreduce(x: Any, op: Any = ReduceOp.SUM, out: Any = None, *, stream: Any = None,
              async_op: bool = False, priority: Any = None, overlap_group: Optional[str] = None,
              use_ring: Optional[bool] = None, algorithm: Optional[str] = None,
              overlap_with_next: bool = False) -> Any:
    """``out[i] = op over ranks of x[i]`` on the default communicator
    (:meth:`Communicator.allreduce`; in place unless ``out``), with the design's per-call
    options.

    Args:
        x: a contiguous CUDA tensor (any shape; types as Communicator.allreduce), or a CPU
            torch tensor when torch.distributed is initialized (it then runs on
            torch.distributed's group: Gloo).
        op: maco.SUM, PROD, MIN, MAX, AVG (or a name / torch.distributed.ReduceOp).
        out: the output (x's type and element count); None: in place.
        stream: run on this stream (the caller's current one when None and nothing below
            asks for overlap). An explicit stream turns overlap off.
        async_op: run on MACO's communication stream and return a :class:`maco.CommWork` at
            once (``work.wait()`` orders the current stream after it and returns the tensor).
        priority: "high", "normal", "low" or an int: the CUDA priority of the communication
            stream it runs on (high: its CTAs are scheduled before queued compute CTAs).
            Without async_op / overlap_with_next / a scope the call still waits at once.
        overlap_group: a name: collectives of one group are waited for together (the first
            wait of any, or :func:`maco.wait_overlap_group`, waits for all of them so far).
            Groups do not run concurrently with each other: MACO runs a communicator's
            collectives in call order.
        use_ring: True forces the bandwidth-optimal algorithm, "rsag" (reduce-scatter then
            allgather: the data a ring moves, in one step over the NVLink mesh; MACO has no
            ring algorithm); None/False: MACO's choice by size. Every rank must pass the same.
        algorithm: force a MACO algorithm by name for this call (MACO_ALGO_ALLREDUCE's names:
            "oneshot_ll", "twoshot_ll", "rsag", "hier"); restored afterwards.
        overlap_with_next: return at once; the result overlaps the operations that follow
            and is waited for at its first use (outside a scope: the returned tensor is an
            ``AsyncCollectiveResult`` that waits when first used; use the returned tensor,
            not ``x``, until then).

    Inside an overlap scope (:func:`maco.optimize_context`, :func:`maco.auto_overlap`,
    ``@maco.optimize_comm``, a :class:`maco.Module`'s forward) the call overlaps by default
    and is waited for at the first use of its result or the scope's end. Under
    ``torch.compile`` the call is traced as torch's functional all_reduce (the "maco"
    backend fuses it with the GEMM before it).

    Returns: the output tensor, a CommWork (async_op) or an AsyncCollectiveResult.
    Raises: as :meth:`Communicator.allreduce`; ValueError for a bad option (named);
    InvalidUsageError without :func:`maco.init` (CUDA tensors).
    """
    if _is_compiling():
        return _traced("allreduce", x, op, out)
    opts = _Opts(async_op, priority, overlap_group, use_ring, algorithm, overlap_with_next)
    return _collective("allreduce", x, out, opts, stream, named={"op": op})


def allgather(x: Any, out: Any = None, *, stream: Any = None, async_op: bool = False,
              priority: Any = None, overlap_group: Optional[str] = None,
              overlap_with_next: bool = False) -> Any:
    """:meth:`Communicator.allgather` on the default communicator: shape (size, *x.shape);
    CPU tensors through torch.distributed; the options as :func:`allreduce`."""
    if _is_compiling():
        return _traced("allgather", x, None, out)
    opts = _Opts(async_op, priority, overlap_group, None, None, overlap_with_next, "allgather")
    return _collective("allgather", x, out, opts, stream)


def reduce_scatter(x: Any, op: Any = ReduceOp.SUM, out: Any = None, *, stream: Any = None,
                   async_op: bool = False, priority: Any = None,
                   overlap_group: Optional[str] = None, overlap_with_next: bool = False) -> Any:
    """:meth:`Communicator.reduce_scatter` on the default communicator; CPU tensors through
    torch.distributed; the options as :func:`allreduce`."""
    if _is_compiling():
        return _traced("reduce_scatter", x, op, out)
    opts = _Opts(async_op, priority, overlap_group, None, None, overlap_with_next,
                 "reduce_scatter")
    return _collective("reduce_scatter", x, out, opts, stream, named={"op": op})


def broadcast(x: Any, root: int = 0, out: Any = None, *, stream: Any = None,
              async_op: bool = False) -> Any:
    """:meth:`Communicator.broadcast` on the default communicator (in place unless ``out``);
    CPU tensors through torch.distributed; ``async_op`` as :func:`allreduce`."""
    opts = _Opts(async_op, kind="broadcast")
    return _collective("broadcast", x, out, opts, stream, pos=(root,))


def reduce(x: Any, root: int = 0, op: Any = ReduceOp.SUM, out: Any = None, *,
           stream: Any = None) -> Any:
    """:meth:`Communicator.reduce` on the default communicator."""
    return get_default_communicator().reduce(x, root, out, op=op, stream=stream)


def all_to_all(x: Any, out: Any = None, *, in_splits: Optional[Sequence[int]] = None,
               out_splits: Optional[Sequence[int]] = None, stream: Any = None) -> Any:
    """:meth:`Communicator.all_to_all` on the default communicator."""
    return get_default_communicator().all_to_all(x, out, in_splits=in_splits,
                                                  out_splits=out_splits, stream=stream)


def send(x: Any, dst: Optional[int] = None, *, stream: Any = None) -> None:
    """:meth:`Communicator.send` on the default communicator. Inside :func:`maco.ring`
    ``dst`` defaults to (and must be) the ring's next rank, and the send is issued with the
    ring's other sends and receives when its block ends. CPU tensors go through
    torch.distributed (the default group).

    Raises: ValueError: no ``dst`` outside a ring; a ``dst`` that is not the ring's next."""
    r = current_ring()
    if r is not None:
        dst = r._check_dst(dst)
        if hasattr(x, "shape") and hasattr(x, "dtype"):
            r._last = (tuple(x.shape), x.dtype, _is_cpu_tensor(x))
    if dst is None:
        raise ValueError("dst: the receiving rank is required (outside maco.ring())")
    if _is_cpu_tensor(x) and dist_ready():
        import torch.distributed as dist

        g = group()
        peer = dist.get_global_rank(g, dst) if g is not None else dst
        if r is not None:
            r._ops.append(dist.P2POp(dist.isend, x.contiguous(), peer, g))
        else:
            dist.send(x.contiguous(), peer, g)
        return
    get_default_communicator().send(x, dst, stream=stream)


def recv(out: Any = None, src: Optional[int] = None, *, shape: Optional[Sequence[int]] = None,
         dtype: Any = None, stream: Any = None) -> Any:
    """:meth:`Communicator.recv` on the default communicator, e.g.
    ``maco.recv(src=0, shape=x.shape, dtype=x.dtype)``. Inside :func:`maco.ring` ``src``
    defaults to (and must be) the ring's previous rank, shape and dtype to those of the
    ring's last send, and the tensor is filled when the ring's block ends. CPU tensors (an
    ``out`` on the CPU, or a ring whose last send was a CPU tensor) go through
    torch.distributed.

    Raises: ValueError: a ``src`` that is not the ring's previous rank; no shape/dtype."""
    r = current_ring()
    cpu = _is_cpu_tensor(out)
    if r is not None:
        src = r._check_src(src)
        if out is None:
            shape, dtype = r._recv_like(shape, dtype)
            cpu = r._last[2] if r._last is not None else not is_initialized()
    if cpu and dist_ready():
        import torch
        import torch.distributed as dist

        if src is None:
            raise ValueError("src: the sending rank is required")
        if out is None:
            if shape is None or dtype is None:
                raise ValueError("out: pass out=, or shape= and dtype= to allocate it")
            out = torch.empty(tuple(shape), dtype=dtype)
        g = group()
        peer = dist.get_global_rank(g, src) if g is not None else src
        if r is not None:
            r._ops.append(dist.P2POp(dist.irecv, out, peer, g))
        else:
            dist.recv(out, peer, g)
        return out
    return get_default_communicator().recv(out, src, shape=shape, dtype=dtype, stream=stream)


def barrier() -> None:
    """:meth:`Communicator.barrier` on the default communicator (host-side)."""
    get_default_communicator().barrier()
