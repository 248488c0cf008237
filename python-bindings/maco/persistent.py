"""The persistent-kernel runtime from Python (the seeds' Level 3) and MACO's profiler.

A :class:`PersistentKernel` holds a task graph built in a ``with kernel.task_graph() as g:``
block from operations on registered tensors, compiled once into ONE persistent kernel
(``maco_persistent_kernel_create``: compute workers, schedulers and communication workers) and
run by calling it::

    k = maco.PersistentKernel(comm, profile=True)
    x = k.register_tensor(x_bf16, name="x")           # (m, k) bfloat16, this rank's shard
    w = k.register_tensor(w_bf16, name="w")           # (k, n) bfloat16
    y = k.register_output((m, n), torch.float32, name="y")
    with k.task_graph() as g:
        g.allreduce(g.matmul(x, w, output=y))          # fused GEMM + allreduce, tile by tile
    k.compile()
    k()                                               # one launch on torch's current stream
    k.print_summary(); k.export_chrome_trace("trace.json")

Operations (``TaskGraph``): ``matmul`` (GEMM tiles of 128 x 128 or 128 x 256 in the order
``maco_gemm_plan_tiles`` plans for the kernel's workers: A (m, k) and B (k, n) bfloat16
row-major, C float32 or bfloat16; n a multiple of 128, k of 32, any m: a partial last row of
tiles needs Hopper's GMMA tiles),
``allreduce`` of a matmul's output (becomes the fused GEMM + allreduce:
``maco_task_graph_add_gemm_allreduce``; the sum is in rank order, bitwise equal on every rank),
``reduce_scatter`` of a matmul's output (the fused GEMM + reduce-scatter:
``maco_task_graph_add_gemm_reduce_scatter``; a new (m / world_size, n) output),
``allgather`` of an A operand feeding a matmul (the fused allgather + GEMM:
``maco_task_graph_add_allgather_gemm``; the output is (world_size * m, n)),
element-wise ``add``, ``scale``, ``residual_add`` (float32, float16, bfloat16) and ``copy``.
Order follows data: an operation waits for the last writer of each tensor it reads and for the
writers and readers of the tensor it writes. Every rank builds the same graph in the same order
(fused operations set up memory or port channels collectively).

How the fused operations move data (``fused_comm``, docs/persistent.md "Copy-engine mode"):
"sm" (the default: the GEMM stores tiles into peers' memory, communication workers copy and sum
on SMs), "copy_engine" (rows of 128 go over port channels, which the copy engines carry between
GPUs of a node, so the GEMM keeps every SM; only the sums take SMs; not working on a GPU yet) or
"auto" (per operator, :func:`choose_fused_comm`'s rule, ``maco_fused_gemm_choose_comm``). Both
give the same bits. :attr:`PersistentKernel.fused_comm_modes` says what each operator took.

:func:`profiler` times MACO's work inside its ``with`` block with CUDA events (recorded on the
streams the work runs on): collectives made through :class:`maco.Communicator` and the steps of
``maco.tp``'s operators (GEMMs, copy-engine transfers, barriers, sums); its summary is the seeds'
table (operation, time, overlap %, SMs) with the total overlap efficiency (maco._prof_table
defines them). It also collects the per-task profiles of persistent kernels created with
``profile=True`` and launched inside it.
"""

from __future__ import annotations

import contextlib
import json
import sys
import threading
from typing import Any, Iterator, Optional, Sequence

from . import _maco
from ._comm import Communicator
from ._default_comm import get_default_communicator
from ._errors import InvalidArgumentError
from ._fused_graph import FUSED_COMM, choose_fused_comm, emit_fused
from ._prof_table import format_table, overlap_table
from ._tensor import stream_handle
from ._types import INT_MAX, DataType, c_int, to_maco_dtype

__all__ = ["PersistentKernel", "TaskGraph", "KernelTensor", "profiler", "Profiler",
           "choose_fused_comm"]

# maco/persistent.h
_NOP, _COPY, _ADD, _SCALE, _RESIDUAL_ADD, _GEMM_TILE = 0, 1, 2, 3, 4, 10
_TILE_M, _TILE_N, _TILE_K = 128, 128, 32
_ELEMWISE_CHUNK = 1 << 16  # elements per element-wise task (several workers share a big one)
_ELEMWISE_TYPES = (DataType.FLOAT32, DataType.FLOAT16, DataType.BFLOAT16)


def _torch():
    try:
        import torch
    except ImportError as e:  # pragma: no cover - the package works without torch otherwise
        raise ImportError("maco.PersistentKernel needs PyTorch (torch tensors)") from e
    return torch


class KernelTensor:
    """A tensor known to a :class:`PersistentKernel` (registered, an output, or made by a graph
    operation). ``tensor`` is the torch tensor; its memory must stay as it is (same storage)
    for as long as the kernel is used."""

    def __init__(self, tensor: Any, name: str):
        self.tensor = tensor
        self.name = name
        self.shape = tuple(tensor.shape)
        self.dtype = tensor.dtype

    def __repr__(self) -> str:
        return f"<KernelTensor {self.name} {self.shape} {self.dtype}>"


class _Gathered:
    """``graph.allgather(x)``: usable only as the A operand of ``graph.matmul``."""

    def __init__(self, src: KernelTensor):
        self.src = src
        self.used = False


class TaskGraph:
    """Operations of a :class:`PersistentKernel`, recorded in a ``with kernel.task_graph()``
    block and turned into tasks when the block ends."""

    def __init__(self, kernel: "PersistentKernel"):
        self._k = kernel
        self._ops: list = []  # (kind, args) in program order

    # ------------------------------------------------------------ operations

    def matmul(self, a: Any, b: Any, output: Any = None, *, name: str = "matmul") -> KernelTensor:
        """C = A x B in tiles of 128 x 128 or 128 x 256 (``maco_gemm_plan_tiles``: widths and
        order for the kernel's compute workers; bfloat16 in, float32 accumulation). ``a`` (m, k) and
        ``b`` (k, n) bfloat16, contiguous; ``output`` (m, n) float32 or bfloat16 (None: a new
        float32 output). With ``a`` from :meth:`allgather`: the fused allgather + GEMM, output
        (world_size * m, n) float32 or bfloat16.

        Raises: ValueError (shapes: n a multiple of 128, k of 32), TypeError (dtypes)."""
        torch = _torch()
        gathered = isinstance(a, _Gathered)
        at = self._k._ref(a.src if gathered else a, "a")
        bt = self._k._ref(b, "b")
        for t, nm in ((at, "a"), (bt, "b")):
            if t.dtype != torch.bfloat16 or len(t.shape) != 2:
                raise TypeError(f"{nm}: a 2-D bfloat16 tensor is needed, got {t.dtype} "
                                f"{t.shape}")
        m, k = at.shape
        k2, n = bt.shape
        if k != k2:
            raise ValueError(f"b: {k2} rows; a has {k} columns")
        if m < 1 or n % _TILE_N or k % _TILE_K:
            raise ValueError(f"matmul: n={n} must be a multiple of 128 and k={k} of 32 (the "
                             f"GEMM tile), m={m} at least 1")
        rows = m * self._k.comm.size if gathered else m
        if output is None:
            output = self._k.register_output((rows, n), torch.float32, name=name + ".out")
        ot = self._k._ref(output, "output")
        if ot.shape != (rows, n) or ot.dtype not in (torch.float32, torch.bfloat16):
            raise ValueError(f"output: ({rows}, {n}) float32 or bfloat16 is needed, got "
                             f"{ot.dtype} {ot.shape}")
        if gathered:
            if a.used:
                raise ValueError("a: one allgather feeds one matmul")
            a.used = True
            self._ops.append(("allgather_gemm", dict(a=at, b=bt, out=ot, m=m, n=n, k=k,
                                                      name=name)))
        else:
            self._ops.append(("matmul", dict(a=at, b=bt, out=ot, m=m, n=n, k=k, name=name)))
        return ot

    def allreduce(self, y: Any, *, name: str = "allreduce") -> KernelTensor:
        """Sums ``y`` over ranks in place, where ``y`` is the float32 or bfloat16 output of
        this graph's last :meth:`matmul` that produced it: the two become the fused GEMM +
        allreduce (``maco_task_graph_add_gemm_allreduce``: each tile's products, in ``y``'s
        type, summed in rank order in float32 by the tile's owner rank as soon as every rank
        has produced it; the sum then written into every rank's ``y``). Returns ``y``.

        Raises: ValueError for any other ``y`` (the runtime fuses allreduce with a GEMM;
        use :meth:`maco.Communicator.allreduce` outside the kernel otherwise)."""
        yt, i, args = self._producer(y, "allreduce")
        self._ops[i] = ("gemm_allreduce", dict(args, name=f"{args['name']}+{name}"))
        return yt

    def reduce_scatter(self, y: Any, *, name: str = "reduce_scatter") -> KernelTensor:
        """Sums ``y`` (m, n) over ranks and keeps this rank's rows: returns a new tensor
        (m / world_size, n) of ``y``'s type holding rows [rank * m / ws, (rank + 1) * m / ws)
        of the sum. ``y`` must be the output of this graph's last :meth:`matmul` that produced
        it; the two become the fused GEMM + reduce-scatter
        (``maco_task_graph_add_gemm_reduce_scatter``; sum in rank order in float32); ``y``
        itself is not written.

        Raises: ValueError for any other ``y``, or m not a multiple of the world size."""
        yt, i, args = self._producer(y, "reduce_scatter")
        ws = self._k.comm.size
        if args["m"] % ws:
            raise ValueError(f"y: {args['m']} rows are not a multiple of the world size {ws}")
        out = self._k.register_output((args["m"] // ws, args["n"]), yt.dtype,
                                      name=f"{name}.out")
        self._ops[i] = ("gemm_reduce_scatter",
                        dict(args, out=out, name=f"{args['name']}+{name}"))
        return out

    def _producer(self, y: Any, what: str):
        yt = self._k._ref(y, "y")
        for i in range(len(self._ops) - 1, -1, -1):
            kind, args = self._ops[i]
            if kind == "matmul" and args["out"] is yt:
                return yt, i, args
            if yt in self._touched(kind, args):
                break
        raise ValueError(f"y: {yt.name} is not the output of a graph.matmul of this graph (with "
                         f"nothing else touching it since); the persistent kernel fuses "
                         f"{what} with the GEMM that produces it")

    def allgather(self, x: Any) -> _Gathered:
        """Every rank's ``x`` (m, k) bfloat16, stacked: only as the ``a`` of :meth:`matmul`
        (the fused allgather + GEMM)."""
        return _Gathered(self._k._ref(x, "x"))

    def add(self, a: Any, b: Any, out: Any = None, *, name: str = "add") -> KernelTensor:
        """out = a + b, element-wise (float32, float16 or bfloat16; same type and size)."""
        return self._elementwise(_ADD, name, out, a, b, alpha=0.0)

    def scale(self, a: Any, alpha: float, out: Any = None, *, name: str = "scale") -> KernelTensor:
        """out = alpha * a."""
        return self._elementwise(_SCALE, name, out, a, None, alpha=float(alpha))

    def residual_add(self, a: Any, b: Any, alpha: float = 1.0, out: Any = None, *,
                     name: str = "residual_add") -> KernelTensor:
        """out = a + alpha * b."""
        return self._elementwise(_RESIDUAL_ADD, name, out, a, b, alpha=float(alpha))

    def copy(self, src: Any, out: Any = None, *, name: str = "copy") -> KernelTensor:
        """out = src (bytes; any type, same size)."""
        return self._elementwise(_COPY, name, out, src, None, alpha=0.0)

    # ------------------------------------------------------------ building

    def _elementwise(self, ttype: int, name: str, out: Any, a: Any, b: Any, alpha: float):
        at = self._k._ref(a, "a")
        bt = self._k._ref(b, "b") if b is not None else None
        if out is None:
            out = self._k.register_output(at.shape, at.dtype, name=name + ".out")
        ot = self._k._ref(out, "out")
        for t, nm in ((bt, "b"), (ot, "out")):
            if t is not None and (t.tensor.numel() != at.tensor.numel() or t.dtype != at.dtype):
                raise ValueError(f"{nm}: {t.dtype} {t.shape}; a is {at.dtype} {at.shape} (same "
                                 f"type and size needed)")
        if ttype != _COPY and to_maco_dtype(at.dtype) not in _ELEMWISE_TYPES:
            raise TypeError(f"a: {at.dtype}: element-wise tasks take float32, float16 or "
                            f"bfloat16")
        self._ops.append(("elementwise", dict(type=ttype, a=at, b=bt, out=ot, alpha=alpha,
                                              name=name)))
        return ot

    @staticmethod
    def _touched(kind: str, args: dict) -> list:
        return [t for t in (args.get("a"), args.get("b"), args.get("out")) if t is not None]

    def _emit(self) -> None:
        """Adds the recorded operations' tasks and their dependencies to the kernel's graph."""
        k = self._k
        h = k._h
        last_writer: dict = {}  # id(KernelTensor) -> join task id
        readers: dict = {}      # id(KernelTensor) -> [join task ids since the last write]
        for kind, args in self._ops:
            reads = [args["a"]] + ([args["b"]] if args.get("b") is not None else [])
            out = args["out"]
            deps = {last_writer[id(t)] for t in reads + [out] if id(t) in last_writer}
            deps.update(readers.get(id(out), []))
            first = k._ntasks
            self._emit_op(kind, args)
            ids = range(first, k._ntasks)
            join = k._add({"type": _NOP, "name": f"{args['name']}.done"})
            for t in ids:
                for d in deps:
                    h.add_dependency(t, d)
                h.add_dependency(join, t)
            last_writer[id(out)] = join
            readers[id(out)] = []
            for t in reads:
                if t is not out:
                    readers.setdefault(id(t), []).append(join)

    def _emit_op(self, kind: str, args: dict) -> None:
        k = self._k
        torch = _torch()
        if kind == "elementwise":
            a, b, out = args["a"], args["b"], args["out"]
            dt = int(to_maco_dtype(a.dtype))
            n = a.tensor.numel()
            esize = a.tensor.element_size()
            for at in range(0, n, _ELEMWISE_CHUNK):
                cnt = min(_ELEMWISE_CHUNK, n - at)
                task = {"type": args["type"], "name": args["name"],
                        "out": out.tensor.data_ptr() + at * esize,
                        "a": a.tensor.data_ptr() + at * esize}
                if args["type"] == _COPY:
                    task["count"] = cnt * esize
                else:
                    task.update(datatype=dt, count=cnt, alpha=args["alpha"])
                    if b is not None:
                        task["b"] = b.tensor.data_ptr() + at * esize
                k._add(task)
        elif kind == "matmul":
            a, b, out = args["a"], args["b"], args["out"]
            m, n, kk = args["m"], args["n"], args["k"]
            dt = int(to_maco_dtype(out.dtype))
            es = out.tensor.element_size()
            for tr, tc, tn in _maco.plan_gemm_tiles(m, n, k._gemm_workers()):
                k._add({"type": _GEMM_TILE, "name": args["name"], "a": a.tensor.data_ptr(),
                        "b": b.tensor.data_ptr(), "datatype": dt, "m": m, "n": n, "k": kk,
                        "tile_row": tr, "tile_col": tc, "tile_n": tn, "ldc": n,
                        "out": out.tensor.data_ptr() + (tr * _TILE_M * n + tc * tn) * es})
        else:  # the fused operators (maco/_fused_graph.py)
            k._fused_modes.append((args["name"], emit_fused(k, kind, args, torch)))
            k._ntasks = k._h.ntasks()


class PersistentKernel:
    """A persistent kernel over a communicator (the seeds' Level 3; see the module's text).

    Args:
        comm: the communicator (None: the default one of :func:`maco.init`).
        num_workers, num_schedulers, num_comm_workers: the CTA split (0: MACO's defaults from
            the graph, ``maco_persistent_kernel_create``; num_comm_workers -1: none).
        threads: threads per CTA (0: 256, what GEMM tiles need).
        profile: record each task's start, end and SM (:meth:`print_summary`,
            :meth:`export_chrome_trace`, :func:`profiler`).
        world_size, rank: optional checks against the communicator (the seeds pass them).
        fused_comm: how the fused operations move data: "sm" (default), "copy_engine" or
            "auto" (per operator, :func:`choose_fused_comm`). The copy-engine mode does not
            work on a GPU yet (docs/persistent.md, "Copy-engine mode"): launches that use it
            end at MACO_DEVICE_TIMEOUT naming a peer.
        num_local_schedulers, num_remote_schedulers: the design's names of num_schedulers
            and num_comm_workers (maco.Role.LOCAL_SCHEDULER and REMOTE_SCHEDULER).

    Not thread-safe. :meth:`close` (or leaving a ``with`` block) frees the kernel; launches
    must be finished first (synchronise their stream).
    """

    def __init__(self, comm: Optional[Communicator] = None, *, num_workers: int = 0,
                 num_schedulers: int = 0, num_comm_workers: int = 0, threads: int = 0,
                 profile: bool = False, world_size: Optional[int] = None,
                 rank: Optional[int] = None, num_local_schedulers: Optional[int] = None,
                 num_remote_schedulers: Optional[int] = None, fused_comm: str = "sm"):
        if num_local_schedulers is not None:  # the design's names (maco.Role's mapping)
            if num_schedulers:
                raise ValueError("num_local_schedulers: given with num_schedulers (the same "
                                 "thing); pass one")
            num_schedulers = num_local_schedulers
        if num_remote_schedulers is not None:
            if num_comm_workers:
                raise ValueError("num_remote_schedulers: given with num_comm_workers (the "
                                 "same thing); pass one")
            num_comm_workers = num_remote_schedulers
        if comm is None:
            comm = get_default_communicator()
        if world_size is not None and world_size != comm.size:
            raise ValueError(f"world_size: {world_size}; the communicator has {comm.size} ranks")
        if rank is not None and rank != comm.rank:
            raise ValueError(f"rank: {rank}; this process is rank {comm.rank}")
        for v, nm in ((num_workers, "num_workers"), (num_schedulers, "num_schedulers"),
                      (threads, "threads")):
            if v < 0:
                raise ValueError(f"{nm}: {v} is negative (0 picks the default)")
            c_int(v, nm)
        if num_comm_workers < -1:
            raise ValueError(f"num_comm_workers: {num_comm_workers} (-1: none, 0: default)")
        c_int(num_comm_workers, "num_comm_workers", -1, INT_MAX)
        if fused_comm not in FUSED_COMM:
            raise ValueError(f"fused_comm: {fused_comm!r}; accepts {', '.join(FUSED_COMM)}")
        self.comm = comm
        self._h = comm._c.persistent_kernel()
        self._cfg = (num_workers, num_schedulers, num_comm_workers, threads, bool(profile))
        self._tensors: list = []
        self._scratch: list = []
        self._fused_comm = fused_comm
        self._fused_modes: list = []  # (operation name, "sm" or "copy_engine")
        self._ntasks = 0
        self._graph_done = False
        self._compiled = False

    def _gemm_workers(self) -> int:
        """The compute workers that maco_persistent_kernel_create will give a graph of GEMM
        tiles: num_workers, else its default split (one CTA per SM: the co-resident CTAs less
        the communication workers and max(1, rest / 32) schedulers)."""
        workers, schedulers, comm_workers = self._cfg[0], self._cfg[1], self._cfg[2]
        if workers > 0:
            return workers
        ctas = self.comm.coresident_ctas
        if comm_workers > 0:
            ctas -= comm_workers
        if schedulers <= 0:
            schedulers = max(1, ctas // 32)
        return max(1, ctas - schedulers)

    # ------------------------------------------------------------ tensors

    def _ref(self, x: Any, name: str) -> KernelTensor:
        if isinstance(x, KernelTensor):
            return x
        raise TypeError(f"{name}: a KernelTensor (from register_tensor, register_output or a "
                        f"graph operation) is needed, got {type(x).__name__}")

    def register_tensor(self, tensor: Any, name: Optional[str] = None) -> KernelTensor:
        """Makes ``tensor`` (a contiguous CUDA torch tensor on the communicator's device)
        usable in the task graph; the kernel keeps a reference. Raises TypeError/ValueError
        (CPU, non-contiguous, another device)."""
        torch = _torch()
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(f"tensor: a torch.Tensor is needed, got {type(tensor).__name__}")
        self.comm._buf(tensor, "tensor")  # CUDA, contiguous, this communicator's device
        kt = KernelTensor(tensor, name or f"t{len(self._tensors)}")
        self._tensors.append(kt)
        return kt

    def register_output(self, shape: Sequence[int], dtype: Any, name: Optional[str] = None
                        ) -> KernelTensor:
        """A new tensor (uninitialised) on the communicator's device for the graph to write."""
        torch = _torch()
        t = torch.empty(tuple(shape), dtype=dtype, device=f"cuda:{self.comm.device}")
        return self.register_tensor(t, name)

    # ------------------------------------------------------------ graph

    def _add(self, task: dict) -> int:
        tid = self._h.add_task(task)
        self._ntasks = tid + 1
        return tid

    @contextlib.contextmanager
    def task_graph(self) -> Iterator[TaskGraph]:
        """Records operations (see :class:`TaskGraph`); their tasks are added when the block
        ends without an exception. One graph per kernel."""
        if self._graph_done:
            raise InvalidArgumentError("task_graph: this kernel already has its graph")
        g = TaskGraph(self)
        yield g
        g._emit()
        self._graph_done = True

    def compile(self) -> "PersistentKernel":
        """Validates the graph and uploads it: ``maco_persistent_kernel_create`` (blocking).
        Raises InvalidArgumentError naming the bad task, UnsupportedError (no GPU; GEMM tiles
        in a library built without cuBLASDx)."""
        if not self._graph_done:
            raise InvalidArgumentError("compile: build the graph first (with "
                                       "kernel.task_graph() as g: ...)")
        if not self._compiled:
            self._h.compile(*self._cfg)
            self._compiled = True
        return self

    def __call__(self, stream: Any = None) -> None:
        """Runs the whole graph once: one launch on ``stream`` (None: torch's current stream
        of the communicator's device). Compiles first if needed. Asynchronous; capturable in
        a CUDA graph."""
        self.compile()
        if stream is None:
            torch = _torch()
            s = torch.cuda.current_stream(self.comm.device).cuda_stream
        else:
            s = stream_handle(stream, None)
        self._h.launch(s)
        prof = _active_profiler()
        if prof is not None and self._cfg[4]:
            prof._kernels.append(self)

    @property
    def config(self) -> dict:
        """The CTA split in use: workers, schedulers, comm_workers, threads, profile."""
        self.compile()
        return self._h.config()

    @property
    def num_tasks(self) -> int:
        return self._ntasks

    @property
    def fused_comm_modes(self) -> list:
        """(operation name, "sm" or "copy_engine") of each fused operation of the graph, in
        graph order: what ``fused_comm`` resolved to. Empty before the graph is built."""
        return list(self._fused_modes)

    # ------------------------------------------------------------ profile

    def profile(self) -> list:
        """The last launch's per-task (start_ns, end_ns, sm, cta), in task order (blocking;
        needs profile=True)."""
        return [tuple(r) for r in self._h.profile(self._ntasks)]

    def summary(self) -> str:
        """The seeds' summary table of the last launch (per operation: tasks, time, busy time,
        overlap %, SMs), as ``maco_persistent_kernel_print_summary`` prints it."""
        return self._h.summary()

    def print_summary(self, file: Any = None) -> None:
        print(self.summary(), end="", file=file or sys.stdout)

    def export_chrome_trace(self, path: str) -> None:
        """Writes the last launch as a Chrome trace (chrome://tracing, Perfetto): one lane
        per CTA."""
        self._h.write_trace(str(path))

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Frees the kernel, its graph and channels (after its launches finished)."""
        self._h.close()
        self._scratch.clear()

    def __enter__(self) -> "PersistentKernel":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ---------------------------------------------------------------------------- profiler

_state = threading.local()
_COLLECTIVES = ("allreduce", "allgather", "reduce_scatter", "broadcast", "reduce",
                "all_to_all", "send", "recv")


def _active_profiler() -> Optional["Profiler"]:
    return getattr(_state, "profiler", None)


class _Span:
    """One timed piece of work: its name, kind ("comm" or "compute"), stream, CUDA events
    and SMs (Profiler.spans)."""

    __slots__ = ("name", "kind", "stream", "start", "end", "sms")

    def __init__(self, name: str, kind: str, stream: Any, start: Any):
        self.name, self.kind, self.stream, self.start = name, kind, stream, start
        self.end, self.sms = None, None


class Profiler:
    """What :func:`profiler` collected: spans of MACO's work (CUDA events on the streams it
    ran on) and persistent kernels (their per-task profiles).

    A span is a collective made through :class:`maco.Communicator` (kind "comm", on the
    call's stream, SMs = the CTAs of its kernel), or a step of a ``maco.tp`` operator: its
    GEMMs and sums ("compute", on the current stream), its copy-engine transfers ("comm", on
    its communication stream, 0 SMs) and barriers ("comm"), named ``op.step`` (e.g.
    ``gemm_reduce_scatter.copy``); collectives made inside a ``maco.tp`` operator are named
    ``op.collective``."""

    def __init__(self):
        self._events: list = []   # _Span, closed
        self._kernels: list = []
        self._base = None
        self._saved: dict = {}
        self._device_sms: Optional[int] = None

    def _begin(self, name: str, kind: str, stream: Any) -> Optional["_Span"]:
        """Starts a span on ``stream`` (a torch.cuda.Stream); :meth:`_end` closes it. None
        while a CUDA graph is being captured (work in a graph is not timed: its events would
        be recorded at replay, after the block)."""
        torch = _torch()
        if torch.cuda.is_current_stream_capturing():
            return None
        op = getattr(_state, "op", None)
        ev = torch.cuda.Event(enable_timing=True)
        ev.record(stream)
        return _Span(f"{op}.{name}" if op else name, kind, stream, ev)

    def _end(self, span: Optional["_Span"], sms: Optional[int] = None) -> None:
        """Closes ``span`` (None: nothing) on its stream; ``sms`` as :meth:`spans` says."""
        if span is None:
            return
        span.end = _torch().cuda.Event(enable_timing=True)
        span.end.record(span.stream)
        span.sms = sms
        self._events.append(span)

    def _wrap(self, name: str, fn: Any) -> Any:
        torch = _torch()
        prof = self

        def timed(comm_self, *args, **kw):
            if _active_profiler() is not prof:
                return fn(comm_self, *args, **kw)
            stream = kw.get("stream")
            s = None
            if stream is None:
                s = torch.cuda.current_stream(comm_self.device)
            elif isinstance(stream, torch.cuda.Stream):
                s = stream
            if s is None:  # another kind of stream: not timed
                return fn(comm_self, *args, **kw)
            span = prof._begin(name, "comm", s)
            out = fn(comm_self, *args, **kw)
            if span is not None:
                prof._end(span, comm_self._c.last_ctas() if comm_self.size > 1 else 0)
            return out

        timed.__wrapped__ = fn
        return timed

    def _start(self) -> None:
        torch = _torch()
        self._base = torch.cuda.Event(enable_timing=True)
        self._base.record()
        self._device_sms = torch.cuda.get_device_properties(
            torch.cuda.current_device()).multi_processor_count
        for name in _COLLECTIVES:
            fn = getattr(Communicator, name)
            self._saved[name] = fn
            setattr(Communicator, name, self._wrap(name, fn))

    def _stop(self) -> None:
        for name, fn in self._saved.items():
            setattr(Communicator, name, fn)
        self._saved.clear()
        _torch().cuda.synchronize()

    def records(self) -> list:
        """(name, start_ms, duration_ms) of each span, from the block's start."""
        return [(r.name, self._base.elapsed_time(r.start), r.start.elapsed_time(r.end))
                for r in self._events]

    def spans(self) -> list:
        """(name, kind, start_ms, duration_ms, sms) of each span (kind "comm" or "compute";
        sms: CTAs of a collective's kernel, 0 for copy-engine transfers, None where MACO does
        not choose the grid, as for cuBLAS)."""
        return [(r.name, r.kind, st, d, r.sms)
                for r, (_, st, d) in zip(self._events, self.records())]

    def overlap(self) -> tuple:
        """``(rows, efficiency)``: per operation its calls, time, mean, overlap % and SMs, and
        the total overlap efficiency in percent (None without communication); the
        definitions are in maco._prof_table."""
        return overlap_table(self.spans())

    def summary(self) -> str:
        """The seeds' table (operation, time, overlap %, SMs) of the spans and the total
        overlap efficiency, then each profiled persistent kernel's own summary."""
        rows, eff = self.overlap()
        out = format_table(rows, eff, self._device_sms)
        for i, k in enumerate(dict.fromkeys(self._kernels)):
            out += f"persistent kernel {i} ({k.num_tasks} tasks):\n" + k.summary()
        return out

    def print_summary(self, file: Any = None) -> None:
        print(self.summary(), end="", file=file or sys.stdout)

    def export_chrome_trace(self, path: str) -> None:
        """Writes the spans as a Chrome trace: lane 0 "compute", lane 1 "communication";
        times in us from the block's start. Persistent kernels write their own:
        :meth:`PersistentKernel.export_chrome_trace`."""
        lane = {"compute": 0, "comm": 1}
        ev = [{"name": n, "ph": "X", "pid": 0, "tid": lane[k], "ts": st * 1e3, "dur": d * 1e3,
               "args": {"sms": sms}} for n, k, st, d, sms in self.spans()]
        for name, tid in (("compute", 0), ("communication", 1)):
            ev.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": tid,
                       "args": {"name": name}})
        with open(path, "w") as f:
            json.dump({"traceEvents": ev, "displayTimeUnit": "ms"}, f)


@contextlib.contextmanager
def _op_scope(name: str) -> Iterator[None]:
    """Names the spans made inside (maco.tp's operators: ``name.step``); the outermost scope
    of a thread wins (gemm_allreduce's reduce-scatter + allgather form stays
    "gemm_allreduce")."""
    if getattr(_state, "op", None) is not None:
        yield
        return
    _state.op = name
    try:
        yield
    finally:
        _state.op = None


_profiler_lock = threading.Lock()


@contextlib.contextmanager
def profiler() -> Iterator[Profiler]:
    """Profiles MACO work of this thread inside the block (see the module's text); the
    returned :class:`Profiler` is filled when the block ends (which synchronises the
    device). One profiler at a time per process (it wraps Communicator's methods).

    Raises: InvalidArgumentError when another profiler is active."""
    if not _profiler_lock.acquire(blocking=False):
        raise InvalidArgumentError("profiler: another maco.profiler() is active in this "
                                   "process")
    try:
        prof = Profiler()
        prof._start()
        _state.profiler = prof
        try:
            yield prof
        finally:
            _state.profiler = None
            prof._stop()
    finally:
        _profiler_lock.release()
