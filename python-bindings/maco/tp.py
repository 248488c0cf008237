"""Tensor-parallel GEMM + collective operators that overlap the two (``maco.tp``).

The three patterns of a tensor-parallel layer, on PyTorch tensors, with the GEMMs on cuBLAS
(through torch) and the data movement on the GPUs' copy engines, pipelined in row chunks so
that the transfer of one chunk runs while the GEMM of the next one computes::

    y = maco.tp.gemm_allreduce(x, w)         # row-parallel linear: allreduce(x @ w)
    y = maco.tp.gemm_reduce_scatter(x, w)    # ... with sequence-parallel output
    y = maco.tp.allgather_gemm(x, w)         # column-parallel linear, sequence-parallel input

Methods (``method=``):

``"ce"`` (the default when every rank is on this node and the GEMM has at least 2e11 flop;
    gemm_allreduce from 3 ranks only where M is a multiple of the world size): a
    workspace that every rank maps (:meth:`maco.Communicator.peer_views`, made at the first
    call of a shape and kept) receives the chunks. The GEMMs run on the caller's current
    stream; each chunk's copies into the peers' workspaces are cudaMemcpyAsync calls
    (``maco_mem_copy_batch``, one library call per chunk) on a communication stream (the copy
    engines: no SM is taken from cuBLAS), followed by a one-element MACO allreduce that serves
    as the barrier after which every rank's copies of that chunk have landed. Sums (reduce-scatter,
    allreduce) are done by the owner from the gathered partial products, in fp32, in rank
    order, rounded once to the output type. A call starts with one such barrier (every rank
    has finished reading its workspace from the previous call).
``"seq"``: the GEMM, then MACO's collective, on the current stream (the sequential
    baseline; used across nodes, for small GEMMs, and for gemm_allreduce from 3 ranks with M
    not a multiple of the world size). A "ce" call spends Python host time per chunk (its
    launches and copies); captured in a CUDA graph it spends none.

Streams and blocking: nothing blocks the host; the result is ordered on the caller's current
stream. The workspace is per communicator and shape; calls on one communicator must come from
one thread at a time and be made by every rank in the same order with the same shapes.

Results: bitwise equal on every rank (allreduce: every rank sums the same partial products in
the same order). Against the sequential path the sums may differ in the last bit for more than
two ranks (MACO's collective may sum in another association).

Why cuBLAS and the copy engines, and not :class:`maco.PersistentKernel`'s fused tiles: the copy
engines move the data without taking SMs from cuBLAS, while SM-driven collectives beside it do;
docs/performance.md ("Tensor-parallel GEMM + collective") compares the three. The thresholds
and chunk counts below were chosen there, by measurement.
"""

from __future__ import annotations

import atexit
import functools
import weakref
from typing import Any, Optional

from . import _maco
from ._default_comm import get_default_communicator
from ._types import DataType, ReduceOp
from .persistent import _active_profiler, _op_scope

__all__ = ["gemm_allreduce", "gemm_reduce_scatter", "allgather_gemm", "default_chunks",
           "release_workspaces"]

# GEMMs smaller than this (2 M N K) take the sequential path by default: below it the copy
# engines' pipeline costs more host time than it hides (docs/performance.md, "Tensor-parallel
# GEMM + collective").
_CE_MIN_FLOP = 2.0e11
# From this many ranks gemm_allreduce's "ce" path is a reduce-scatter then an allgather (each
# rank sends 2 (ws - 1) / ws of the output, not ws - 1 times it): gemm_reduce_scatter's path
# then MACO's allgather where M is a multiple of ws, else both per chunk on the copy engines;
# with 2 ranks the one-step path (every rank sums both partials) moves as much with one
# barrier less.
_AR_SPLIT_MIN_RANKS = 3



class _Workspaces:
    """What the "ce" path keeps per communicator: its device, the side stream of the copies,
    the barrier's one-element tensor, pooled events, the mapped workspaces by name (local flat
    tensor, every rank's view) and their typed views by (name, dtype, shape)."""

    __slots__ = ("device", "side", "flag", "events", "ws", "typed")

    def __init__(self, device: Any):
        import torch

        self.device = device
        self.side = torch.cuda.Stream(device=device, priority=-1)
        self.flag = torch.zeros(1, dtype=torch.float32, device=device)
        self.events: list = []
        self.ws: dict = {}
        self.typed: dict = {}


# Per communicator, dropped with it (weak keys): its workspaces, and whether every rank is on
# this node.
_state: "weakref.WeakKeyDictionary[Any, _Workspaces]" = weakref.WeakKeyDictionary()
_one_node: "weakref.WeakKeyDictionary[Any, bool]" = weakref.WeakKeyDictionary()


def default_chunks(pattern: str, m: int, world_size: int) -> int:
    """The number of row chunks of the ``"ce"`` pipeline when ``chunks`` is None.

    Args:
        pattern: "gemm_allreduce", "gemm_reduce_scatter" or "allgather_gemm".
        m: the operator's output rows (tokens, all ranks together).
        world_size: the communicator's size.
    Returns: reduce-scatter, and from 3 ranks allreduce and allgather: 1 (their pipelines go
    by destination block and by ring step). With 2 ranks, allreduce: 4 from M = 8192, 2 from
    2048, else 1; allgather: 2 where each rank has at least 2048 rows, else 1. Each chunk
    costs one barrier and several launches of host time; the counts come from measurement
    (docs/performance.md, "Tensor-parallel GEMM + collective").
    """
    if pattern == "gemm_reduce_scatter":
        return 1
    if pattern in ("allgather_gemm", "gemm_allreduce") and world_size >= 3:
        return 1
    if pattern == "gemm_allreduce":
        return 4 if m >= 8192 else 2 if m >= 2048 else 1
    return 2 if m // max(world_size, 1) >= 2048 else 1


def _drop_at_exit() -> None:
    _state.clear()  # the peers' mappings go before the interpreter's teardown


atexit.register(_drop_at_exit)


def release_workspaces(comm: Any = None) -> None:
    """Drops the copy-engine workspaces and streams of ``comm`` (None: of every
    communicator). Collective: every rank calls it before any rank frees the communicator."""
    import torch

    comms = list(_state.keys()) if comm is None else [comm]
    for c in comms:
        st = _state.pop(c, None)
        if st is not None:
            torch.cuda.synchronize(st.device)
            c.barrier()


def _comm_of(comm: Any):
    if comm is not None:
        return comm
    return get_default_communicator()


def _st(comm: Any, device: Any) -> _Workspaces:
    st = _state.get(comm)
    if st is None:
        st = _state[comm] = _Workspaces(device)
    return st


def _workspace(comm: Any, st: _Workspaces, name: str, nbytes: int) -> tuple:
    """(local flat uint8 tensor, peers' views) of at least ``nbytes`` (collective the first
    time and when it grows)."""
    import torch

    have = st.ws.get(name)
    if have is None or have[0].numel() < nbytes:
        st.ws.pop(name, None)
        local = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, device=st.device)
        st.ws[name] = (local, comm.peer_views(local))
        st.typed = {k: v for k, v in st.typed.items() if k[0] != name}
    return st.ws[name]


def _typed(flat: Any, dtype: Any, shape: tuple) -> Any:
    import torch

    n = 1
    for d in shape:
        n *= d
    return flat[:n * torch.empty((), dtype=dtype).element_size()].view(dtype).view(shape)


def _typed_ws(comm: Any, st: _Workspaces, name: str, dtype: Any, shape: tuple,
              esz: int) -> tuple:
    """(this rank's workspace ``name`` as ``dtype`` of ``shape``, every rank's), cached."""
    key = (name, dtype, shape)
    hit = st.typed.get(key)
    if hit is None:
        n = esz
        for d in shape:
            n *= d
        flat, vflat = _workspace(comm, st, name, n)
        hit = (_typed(flat, dtype, shape), [_typed(v, dtype, shape) for v in vflat])
        st.typed[key] = hit
    return hit


class _Pipe:
    """One call's stream plumbing, at a few microseconds of host time per step: copies
    through maco_mem_copy_batch (one library call for a chunk's copies), the barrier as a
    direct one-element allreduce on the side stream, and events from a pool kept with the
    communicator's state (an event may be recorded again once the waits on it are enqueued)."""

    __slots__ = ("st", "cur", "side", "side_h", "n_ev", "_c", "_bar")

    def __init__(self, comm: Any, st: _Workspaces, cur: Any):
        self.st, self.cur, self.side = st, cur, st.side
        self.side_h = self.side.cuda_stream
        self.n_ev = 0
        c, fa = comm._c, st.flag.data_ptr()
        self._c = c
        dt, op = int(DataType.FLOAT32), int(ReduceOp.SUM)
        self._bar = lambda: c.allreduce(fa, fa, 1, dt, op, self.side_h)

    def event(self, stream: Any) -> Any:
        """A pooled event recorded on ``stream``."""
        import torch

        pool = self.st.events
        if self.n_ev == len(pool):
            pool.append(torch.cuda.Event())
        ev = pool[self.n_ev]
        self.n_ev += 1
        ev.record(stream)
        return ev

    def side_waits(self) -> None:
        """The side stream waits for the work on the current stream so far."""
        self.side.wait_event(self.event(self.cur))

    def copies(self, dst: list, src: list, nbytes: list) -> None:
        """Enqueued on the side stream (the copy engines)."""
        end = _span("copy", "comm", self.side)
        _maco.mem_copy_batch(dst, src, nbytes, self.side_h)
        if end:
            end(0)

    def barrier(self) -> None:
        """On the side stream: every rank's side-stream work enqueued before it is done."""
        end = _span("barrier", "comm", self.side)
        self._bar()
        if end:
            end(self._c.last_ctas())


def _bounds(rows: int, chunks: int) -> list:
    """Row bounds of ``chunks`` near-equal pieces of ``rows`` (multiples of 8 rows where
    possible)."""
    if chunks <= 1 or rows < 16:
        return [0, rows]
    chunks = min(chunks, rows // 8)
    step = (rows // chunks) // 8 * 8
    return [i * step for i in range(chunks)] + [rows]


def _peer_order(rank: int, ws: int) -> list:
    """The order in which ``rank`` walks the ranks in a batch of copies (one per rank, run one
    after another on the side stream): rank, rank + 1, ..., rank - 1. At every position every
    rank copies to (or pulls from) a different rank: in plain rank order every rank would copy
    into rank 0 first, all its links idle but one."""
    return [(rank + i) % ws for i in range(ws)]


def _ring_step(rank: int, ws: int, d: int) -> tuple:
    """allgather_gemm's step d (1 .. ws - 1): (the rank this rank's shard goes to, the rank
    whose shard arrives here). Every rank sends to one rank and receives from one."""
    return (rank + d) % ws, (rank - d) % ws


def _check(x: Any, w: Any, name: str, chunks: Optional[int], method: Optional[str]):
    import torch

    for t, n in ((x, "x"), (w, "w")):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"maco.tp.{name}: {n} is a {type(t).__name__}, not a torch.Tensor")
    for t, n in ((x, "x"), (w, "w")):
        if not t.is_cuda:
            raise ValueError(f"maco.tp.{name}: {n} is on {t.device}, not a CUDA device")
        if t.dim() != 2:
            raise ValueError(f"maco.tp.{name}: {n} has shape {tuple(t.shape)}; 2-D expected")
        if not t.is_contiguous():
            raise ValueError(f"maco.tp.{name}: {n} is not contiguous (row-major expected)")
    if x.dtype != w.dtype:
        raise ValueError(f"maco.tp.{name}: x is {x.dtype} but w is {w.dtype}")
    if x.device != w.device:
        raise ValueError(f"maco.tp.{name}: x is on {x.device} but w on {w.device}")
    if x.shape[1] != w.shape[0]:
        raise ValueError(f"maco.tp.{name}: x has {x.shape[1]} columns but w has {w.shape[0]} "
                         "rows (x [M, K] @ w [K, N])")
    if chunks is not None and (isinstance(chunks, bool) or not isinstance(chunks, int)
                               or chunks < 1):
        raise ValueError(f"maco.tp.{name}: chunks={chunks!r}; a positive int or None expected")
    if method not in (None, "ce", "seq"):
        raise ValueError(f"maco.tp.{name}: method={method!r}; 'ce', 'seq' or None expected")


def _method(comm: Any, method: Optional[str], flop: int, pattern: str, rows: int = 0,
            min_flop: Optional[float] = None) -> str:
    """The path a call takes: ``method`` where given, else "ce" from ``min_flop`` (None:
    _CE_MIN_FLOP) with every rank on this node, except gemm_allreduce from
    _AR_SPLIT_MIN_RANKS ranks with ``rows`` (M) not a multiple of the world size (where its
    per-chunk split measured slower than "seq": docs/performance.md)."""
    if method is not None:
        return method
    if comm.size == 1 or flop < (_CE_MIN_FLOP if min_flop is None else min_flop):
        return "seq"
    if pattern == "gemm_allreduce" and comm.size >= _AR_SPLIT_MIN_RANKS and rows % comm.size:
        return "seq"
    one = _one_node.get(comm)
    if one is None:
        here = comm.host_id(comm.rank)
        one = _one_node[comm] = all(comm.host_id(r) == here for r in range(comm.size))
    return "ce" if one else "seq"


def _profiled(fn: Any) -> Any:
    """A public operator: under :func:`maco.profiler` its steps are timed as spans named
    ``<operator>.<step>`` (gemm, sum: compute; copy, barrier: communication)."""
    name = fn.__name__

    @functools.wraps(fn)
    def op(*args: Any, **kw: Any) -> Any:
        if _active_profiler() is None:
            return fn(*args, **kw)
        with _op_scope(name):
            return fn(*args, **kw)

    return op


def _span(step: str, kind: str, stream: Any, like: Any = None) -> Any:
    """When a :func:`maco.profiler` is active: starts a span of ``step`` on ``stream`` (None:
    the current stream of ``like``'s device) and returns ``end(sms=None)``, which closes it;
    else None."""
    prof = _active_profiler()
    if prof is None:
        return None
    if stream is None:
        import torch

        stream = torch.cuda.current_stream(like.device)
    span = prof._begin(step, kind, stream)
    return lambda sms=None: prof._end(span, sms)


def _mm(a: Any, b: Any, out: Any) -> None:
    import torch

    end = _span("gemm", "compute", None, out)
    if out.dtype == a.dtype:
        torch.matmul(a, b, out=out)
    else:
        torch.mm(a, b, out_dtype=out.dtype, out=out)
    if end:
        end()


def _sum_into(parts: Any, out: Any) -> None:
    """out = sum over dim 0 of parts (ws, rows, n), in fp32, rounded once to out's type."""
    import torch

    end = _span("sum", "compute", None, out)
    if parts.shape[0] == 2:  # one pass: torch adds bf16/fp16 in fp32 and rounds once
        torch.add(parts[0], parts[1], out=out)
    elif out.dtype == torch.float32:
        torch.sum(parts, dim=0, dtype=torch.float32, out=out)
    else:
        out.copy_(torch.sum(parts, dim=0, dtype=torch.float32))
    if end:
        end()


def _out(out: Any, shape: tuple, dtype: Any, like: Any, name: str) -> Any:
    import torch

    if dtype is None:  # out's type where out is given, else the input's
        dtype = out.dtype if isinstance(out, torch.Tensor) else like.dtype
    if out is None:
        return torch.empty(shape, dtype=dtype, device=like.device)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != tuple(shape) \
            or out.dtype != dtype or out.device != like.device or not out.is_contiguous():
        raise ValueError(f"maco.tp.{name}: out must be a contiguous {dtype} tensor of shape "
                         f"{tuple(shape)} on {like.device}; got "
                         f"{getattr(out, 'dtype', type(out).__name__)} "
                         f"{tuple(getattr(out, 'shape', ()))}")
    return out


@_profiled
def gemm_allreduce(x: Any, w: Any, comm: Any = None, *, out: Any = None, out_dtype: Any = None,
                   chunks: Optional[int] = None, method: Optional[str] = None) -> Any:
    """``out = allreduce(x @ w)`` (sum) over the communicator's ranks.

    Args:
        x: [M, K] this rank's input (bf16, fp16 or fp32, contiguous, on the communicator's GPU).
        w: [K, N] this rank's weight shard, x's dtype.
        comm: a :class:`maco.Communicator`; None: the default one (:func:`maco.init`).
        out: [M, N] output (contiguous, ``out_dtype``); None: a new tensor.
        out_dtype: the product's and the sum's type; None: out's, else x's.
            ``torch.float32`` with bf16 inputs needs ``torch.mm(out_dtype=)`` (PyTorch 2.8+).
        chunks: row chunks of the pipeline; None: :func:`default_chunks`. From 3 ranks
            with M a multiple of the world size: pieces of each destination's block, as
            for :func:`gemm_reduce_scatter` (None: 1).
        method: "ce", "seq" or None: "ce" where every rank is on this node and the GEMM has
            at least 2e11 flop (2 M N K), and from 3 ranks M is a multiple of the world size;
            else "seq" (see the module's docstring).
    Returns: ``out``, ordered on the caller's current stream (no host blocking).
    Workspace ("ce"), elements of ``out_dtype`` per rank: 2 ranks, 2 x M x N (every rank
        sums both partial products); from 3 ranks with M a multiple of the world size,
        2 x M x N (gemm_reduce_scatter's "ce" path into this rank's block of ``out``, then
        MACO's allgather in place); else about (ws + 1) x M / ws x N (per chunk a
        reduce-scatter to each block's owner, then an allgather of the owners' sums, both
        on the copy engines).
    Raises:
        TypeError, ValueError: an argument of the wrong type, device, shape or layout (the
            message names it). Errors of the collectives as the Communicator raises them.
    """
    import torch

    _check(x, w, "gemm_allreduce", chunks, method)
    comm = _comm_of(comm)
    ws, rank = comm.size, comm.rank
    m, n = x.shape[0], w.shape[1]
    out = _out(out, (m, n), out_dtype, x, "gemm_allreduce")
    if _method(comm, method, 2 * m * n * x.shape[1], "gemm_allreduce", m) == "seq":
        _mm(x, w, out)
        return comm.allreduce(out)
    if ws >= _AR_SPLIT_MIN_RANKS and m % ws == 0:
        return _gemm_allreduce_rs_ag(x, w, out, comm, chunks)
    st = _st(comm, x.device)
    c = default_chunks("gemm_allreduce", m, ws) if chunks is None else chunks
    b = _bounds(m, c)
    if ws >= _AR_SPLIT_MIN_RANKS:
        return _gemm_allreduce_split(x, w, out, comm, st, b)
    esz = out.element_size()
    parts, views = _typed_ws(comm, st, "ar", out.dtype, (ws, m, n), esz)
    pp = _Pipe(comm, st, torch.cuda.current_stream(x.device))
    rowb = n * esz
    mine = views[rank].data_ptr() + rank * m * rowb  # parts[rank], at this rank's index
    dst = [v.data_ptr() + rank * m * rowb for p, v in enumerate(views) if p != rank]
    pp.side_waits()
    pp.barrier()  # every rank is done with its workspace of the last call
    done = []
    for i in range(len(b) - 1):
        lo, hi = b[i], b[i + 1]
        _mm(x[lo:hi], w, parts[rank, lo:hi])
        pp.side_waits()
        pp.copies([d + lo * rowb for d in dst], [mine + lo * rowb] * len(dst),
                  [(hi - lo) * rowb] * len(dst))
        pp.barrier()
        done.append(pp.event(pp.side))
        if i > 0:  # the sum of the chunk before, behind this chunk's GEMM
            pp.cur.wait_event(done[i - 1])
            _sum_into(parts[:, b[i - 1]:b[i]], out[b[i - 1]:b[i]])
    pp.cur.wait_event(done[-1])
    _sum_into(parts[:, b[-2]:b[-1]], out[b[-2]:b[-1]])
    return out


def _gemm_allreduce_rs_ag(x: Any, w: Any, out: Any, comm: Any, chunks: Optional[int]) -> Any:
    """gemm_allreduce's "ce" path for 3 or more ranks and M a multiple of the world size:
    :func:`gemm_reduce_scatter`'s "ce" path (each destination's block of rows computed and
    copied to its owner by the copy engines while the next block computes; the owner sums in
    rank order, fp32, rounded once) into this rank's block of ``out``, then MACO's allgather in
    place on the current stream. Every rank gets the owners' bits. ``chunks``: pieces of each
    destination's block, as for gemm_reduce_scatter."""
    s = out.shape[0] // comm.size
    mine = out[comm.rank * s:(comm.rank + 1) * s]
    gemm_reduce_scatter(x, w, comm, out=mine, chunks=chunks, method="ce")
    comm.allgather(mine, out=out)
    return out


def _split_layout(b: list, ws: int) -> tuple:
    """The row layout of gemm_allreduce's reduce-scatter + allgather form, for chunk bounds
    ``b`` (from :func:`_bounds`) and ``ws`` ranks: (blk, off, cap). blk[j][r]..blk[j][r + 1]
    are chunk j's rows owned by rank r (ws near-equal blocks, in rank order); off[r][j] is where
    they sit in rank r's compact workspaces (its blocks of every chunk one after another;
    off[r][-1] is its total); cap is the largest total (at least 1): the workspaces' rows."""
    blk = [[lo + (hi - lo) * r // ws for r in range(ws + 1)] for lo, hi in zip(b, b[1:])]
    off = []
    for r in range(ws):
        acc, row = 0, []
        for bl in blk:
            row.append(acc)
            acc += bl[r + 1] - bl[r]
        off.append(row + [acc])
    return blk, off, max(max(o[-1] for o in off), 1)


def _gemm_allreduce_split(x: Any, w: Any, out: Any, comm: Any, st: _Workspaces,
                          b: list) -> Any:
    """gemm_allreduce's "ce" path for 3 or more ranks where M is not a multiple of the world
    size: per chunk a reduce-scatter, then an allgather. Chunk j's rows are cut in world-size
    blocks; block r goes to its owner, rank r (pushed by the copy engines), which sums the
    ranks' partial products in rank order (fp32, rounded once) into its mapped workspace; after
    a barrier every rank pulls each owner's sum into ``out``. Each rank moves 2 (ws - 1) / ws of
    the output instead of ws - 1 times it, and sums 1 / ws of it; every rank gets the owner's
    bits, so results agree on all ranks. Workspace: (ws + 1) x ceil(M / ws) x N elements
    (received partials, the owner's sums).
    """
    import torch

    ws, rank, n = comm.size, comm.rank, out.shape[1]
    esz = out.element_size()
    blk, off, cap = _split_layout(b, ws)
    recv, rviews = _typed_ws(comm, st, "ar", out.dtype, (ws, cap, n), esz)  # [source rank]
    red, dviews = _typed_ws(comm, st, "ar_sum", out.dtype, (cap, n), esz)   # this rank's sums
    rowb = n * esz
    ra = [v.data_ptr() + rank * cap * rowb for v in rviews]  # recv[rank] of every rank
    da = [v.data_ptr() for v in dviews]
    oa = out.data_ptr()
    pp = _Pipe(comm, st, torch.cuda.current_stream(x.device))
    pp.side_waits()
    pp.barrier()  # every rank is done with its workspaces of the last call
    scattered, gathered = [], []
    order = _peer_order(rank, ws)  # each batch's copies, one peer at a time per position

    def reduce_and_gather(j: int) -> None:  # chunk j: sum this rank's block, then allgather
        a, z, o = blk[j][rank], blk[j][rank + 1], off[rank][j]
        pp.cur.wait_event(scattered[j])
        if z > a:
            _sum_into(recv[:, o:o + z - a], red[o:o + z - a])
        pp.side_waits()
        pp.barrier()  # every owner's sum of chunk j is in its workspace
        bl = blk[j]
        pp.copies([oa + bl[q] * rowb for q in order],
                  [da[q] + off[q][j] * rowb for q in order],
                  [(bl[q + 1] - bl[q]) * rowb for q in order])
        gathered.append(pp.event(pp.side))

    for j, bl in enumerate(blk):
        _mm(x[bl[0]:bl[-1]], w, out[bl[0]:bl[-1]])  # the partial product, in out for now
        pp.side_waits()
        pp.copies([ra[r] + off[r][j] * rowb for r in order],
                  [oa + bl[r] * rowb for r in order],
                  [(bl[r + 1] - bl[r]) * rowb for r in order])
        pp.barrier()  # every rank's partials of chunk j are with their owners
        scattered.append(pp.event(pp.side))
        if j > 0:  # the chunk before is summed behind this chunk's GEMM
            reduce_and_gather(j - 1)
    reduce_and_gather(len(blk) - 1)
    for ev in gathered:
        pp.cur.wait_event(ev)
    return out


@_profiled
def gemm_reduce_scatter(x: Any, w: Any, comm: Any = None, *, out: Any = None,
                        out_dtype: Any = None, chunks: Optional[int] = None,
                        method: Optional[str] = None) -> Any:
    """``out = rows [rank * M / ws, (rank + 1) * M / ws) of sum over ranks of x @ w``.

    Args:
        x: [M, K] this rank's input; M a multiple of the world size ws. Other requirements
            as for :func:`gemm_allreduce`.
        w: [K, N] this rank's weight shard.
        comm, out_dtype: as for :func:`gemm_allreduce`.
        method: "ce", "seq" or None: "ce" where every rank is on this node and the GEMM has
            at least 2e11 flop (2 M N K), with any number of ranks, else "seq".
        chunks: pieces of each destination's block of rows (None: 1); the blocks go in the
            order rank + 1, rank + 2, ..., each copied to its owner while the next computes.
        out: [M / ws, N] output; None: a new tensor.
    Returns: ``out`` (this rank's block of the sum), ordered on the current stream.
    Workspace ("ce"): M x N elements of ``out_dtype`` received, plus M x N staged.
    Raises:
        ValueError: M not a multiple of the world size, and as for :func:`gemm_allreduce`.
    """
    import torch

    _check(x, w, "gemm_reduce_scatter", chunks, method)
    comm = _comm_of(comm)
    ws, rank = comm.size, comm.rank
    m, k, n = x.shape[0], x.shape[1], w.shape[1]
    if m % ws:
        raise ValueError(f"maco.tp.gemm_reduce_scatter: x has {m} rows, not a multiple of the "
                         f"world size {ws}")
    s = m // ws
    out = _out(out, (s, n), out_dtype, x, "gemm_reduce_scatter")
    if _method(comm, method, 2 * m * n * k, "gemm_reduce_scatter") == "seq":
        partial = torch.empty((m, n), dtype=out.dtype, device=x.device)
        _mm(x, w, partial)
        return comm.reduce_scatter(partial, out=out)
    st = _st(comm, x.device)
    # recv[source rank]: its partial product of this rank's rows (this rank's own: stage)
    recv, views = _typed_ws(comm, st, "rs", out.dtype, (ws, s, n), out.element_size())
    stage = torch.empty((ws, s, n), dtype=out.dtype, device=x.device)  # [destination]
    xr = x.view(ws, s, k)
    c = 1 if chunks is None else chunks  # pieces per destination's block
    b = _bounds(s, c)
    rowb = n * out.element_size()
    dst = [v.data_ptr() + rank * s * rowb for v in views]  # recv[this rank] of each rank
    sa = stage.data_ptr()
    pp = _Pipe(comm, st, torch.cuda.current_stream(x.device))
    pp.side_waits()
    pp.barrier()
    # Destinations in the order rank + 1, rank + 2, ..., rank: each block's copy to its owner
    # runs while the next block's GEMM computes; this rank's own block comes last.
    for d in range(1, ws + 1):
        r = (rank + d) % ws
        for i in range(len(b) - 1):
            lo, hi = b[i], b[i + 1]
            _mm(xr[r, lo:hi], w, (recv[rank] if r == rank else stage[r])[lo:hi])
            if r != rank:
                pp.side_waits()
                pp.copies([dst[r] + lo * rowb], [sa + (r * s + lo) * rowb], [(hi - lo) * rowb])
    pp.barrier()
    pp.cur.wait_event(pp.event(pp.side))
    _sum_into(recv, out)  # the current stream waited for the copies out of stage
    return out


@_profiled
def allgather_gemm(x: Any, w: Any, comm: Any = None, *, out: Any = None, out_dtype: Any = None,
                   chunks: Optional[int] = None, method: Optional[str] = None) -> Any:
    """``out = allgather(x) @ w``: the ranks' row shards gathered in rank order, times w.

    Args:
        x: [S, K] this rank's row shard (every rank the same S).
        w: [K, N] this rank's weight shard.
        comm, out_dtype, chunks: as for :func:`gemm_allreduce`.
        method: "ce", "seq" or None: "ce" where every rank is on this node and the GEMM has
            at least 2e11 flop (2 M N K), with any number of ranks (from 3, a ring of
            ws - 1 steps, each rank sending its shard to rank + d in step d), else "seq".
        out: [ws * S, N] output; None: a new tensor.
    Returns: ``out``, ordered on the current stream. The gathered input is not returned.
    Workspace ("ce"): ws x S x K elements of x's type.
    Raises: as for :func:`gemm_allreduce`.
    """
    import torch

    _check(x, w, "allgather_gemm", chunks, method)
    comm = _comm_of(comm)
    ws, rank = comm.size, comm.rank
    s, k, n = x.shape[0], x.shape[1], w.shape[1]
    out = _out(out, (ws * s, n), out_dtype, x, "allgather_gemm")
    if _method(comm, method, 2 * ws * s * n * k, "allgather_gemm") == "seq":
        g = torch.empty((ws * s, k), dtype=x.dtype, device=x.device)
        comm.allgather(x, out=g)
        _mm(g, w, out)
        return out
    st = _st(comm, x.device)
    # [source rank]: its shard
    gathered, views = _typed_ws(comm, st, "ag", x.dtype, (ws, s, k), x.element_size())
    c = default_chunks("allgather_gemm", ws * s, ws) if chunks is None else chunks
    b = _bounds(s, c)
    rowb = k * x.element_size()
    dst = [v.data_ptr() + rank * s * rowb for v in views]  # gathered[rank] of every rank
    xa = x.data_ptr()
    pp = _Pipe(comm, st, torch.cuda.current_stream(x.device))
    pp.side_waits()
    pp.barrier()
    # Step d = 1 .. ws - 1: this rank's shard to rank + d, so in every step each rank sends to
    # one peer and receives from one (rank - d): no rank takes every peer's copy at once. The
    # shard from rank - d is multiplied once step d is done, behind the next step's copies.
    done = []
    for d in range(1, ws):
        q = _ring_step(rank, ws, d)[0]
        for i in range(len(b) - 1):
            lo, hi = b[i], b[i + 1]
            pp.copies([dst[q] + lo * rowb], [xa + lo * rowb], [(hi - lo) * rowb])
            pp.barrier()
            done.append(pp.event(pp.side))
    _mm(x, w, out[rank * s:(rank + 1) * s])  # this rank's rows need no copy
    e = 0
    for d in range(1, ws):
        r = _ring_step(rank, ws, d)[1]
        for i in range(len(b) - 1):
            pp.cur.wait_event(done[e])
            e += 1
            _mm(gathered[r, b[i]:b[i + 1]], w, out[r * s + b[i]:r * s + b[i + 1]])
    return out
