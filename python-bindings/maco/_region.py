"""Submissions: compute and communication handed over as functions that run beside each other,
each returning a :class:`Future` (:class:`OverlapRegion`; the overlap scope's ``submit_compute``
and ``submit_comm`` use one), and :class:`Pipeline`, which submits stages over micro-batches,
one stream per stage."""

from __future__ import annotations

import concurrent.futures
import sys
from typing import Any, Callable, Optional

from ._default_comm import get_default_communicator, is_initialized
from ._errors import InvalidUsageError
from ._streams import (_Handle, _Ordered, _event_handle, _tensors, comm_stream, note_issue,
                       order_after_last)

__all__ = ["Future", "OverlapRegion", "overlap_region", "Pipeline"]


def _torch():
    import torch

    return torch


class Future:
    """The result of a submission (:meth:`OverlapRegion.submit_compute`,
    :meth:`OverlapRegion.submit_comm`, the overlap scope's methods of the same names).

    CUDA: the work was enqueued on the region's stream of its kind; ``result()`` makes the
    caller's current stream wait for it (no host blocking) and returns the function's return
    value. CPU: compute ran when submitted; communication runs on the region's worker thread
    and ``result()`` blocks until it is done. ``done()`` polls; ``exception()`` is the
    exception the function raised (None if none), ``result()`` raises it.
    """

    def __init__(self, kind: str):
        self.kind = kind
        self._value: Any = None
        self._exc: Optional[BaseException] = None
        self._handle: Optional[_Handle] = None
        self._cf: Optional[concurrent.futures.Future] = None

    def result(self) -> Any:
        """The function's value, waited for (see the class text)."""
        if self._cf is not None:
            return self._cf.result()
        if self._exc is not None:
            raise self._exc
        if self._handle is not None:
            self._handle.wait()
        return self._value

    def wait(self) -> Any:
        """Same as :meth:`result`."""
        return self.result()

    def done(self) -> bool:
        """Whether the work has finished (does not block)."""
        if self._cf is not None:
            return self._cf.done()
        return self._handle is None or self._handle.query()

    def exception(self) -> Optional[BaseException]:
        """The exception of the function (CPU communication: waits for it to finish)."""
        if self._cf is not None:
            return self._cf.exception()
        return self._exc


def _resolve(values: tuple, kw: dict) -> tuple:
    """Futures among the arguments become their values (waited for on the current stream)."""
    a = tuple(v.result() if isinstance(v, Future) else v for v in values)
    k = {n: (v.result() if isinstance(v, Future) else v) for n, v in kw.items()}
    return a, k


class OverlapRegion:
    """``with maco.overlap_region() as region:`` — compute and communication submitted in the
    block run at the same time; leaving the block waits for all of it. The submissions of the
    overlap scope (``maco.optimize_context()``'s ``submit_compute`` and ``submit_comm``), here
    without its first-use tracking.

    ::

        with maco.overlap_region() as region:
            cf = region.submit_compute(torch.matmul, x, w)
            mf = region.submit_comm(maco.allreduce, prev_y)
        y, prev_y = cf.result(), mf.result()

    CUDA (``device``: the current device, or the default communicator's): compute goes to a
    region compute stream, communication to the overlap API's communication stream
    (``priority``); both start after the work on the caller's current stream at entry, run in
    submission order within their kind, and the caller's stream waits for those used at exit. A
    Future passed as an argument is waited for on the submitting kind's stream first (its
    value is passed), which is how a submission depends on another. Collectives inside
    ``submit_comm`` run on that stream, in call order after the other collectives of the
    overlap API on the same communicator.

    CPU (no CUDA): compute runs at submission; communication runs, in submission order, on
    one worker thread of the region (so it overlaps the compute that follows); submit
    collectives only through ``submit_comm`` inside a region (collectives from two threads
    at once could reach the ranks in different orders).

    Thread-safety: one thread uses a region. Raises: InvalidUsageError when used after exit;
    ValueError at entry: ``device`` is not a CUDA device.
    """

    def __init__(self, device: Any = None, priority: Any = None, *, cpu: bool = False):
        self._device = device
        self._priority = priority
        self._force_cpu = cpu  # Pipeline on CPU tensors: the CPU path even with a GPU
        self._cuda = False
        self._open = False
        self._futures: list = []
        self._streams: list = []  # every stream submissions used, waited for at exit
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def __enter__(self) -> "OverlapRegion":
        torch = sys.modules.get("torch")  # without torch: the CPU path, torch not imported
        self._cuda = not self._force_cpu and torch is not None and torch.cuda.is_available()
        if self._cuda:
            dev = self._device
            if dev is None:
                dev = (get_default_communicator().device if is_initialized()
                       else torch.cuda.current_device())
            d = torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
            if d.type != "cuda":
                raise ValueError(f"device: {dev!r} is not a CUDA device")
            self._dev = torch.device("cuda", d.index if d.index is not None
                                     else torch.cuda.current_device())
            self._start = torch.cuda.Event()
            self._start.record(torch.cuda.current_stream(self._dev))
            self._compute: Any = None  # made and joined at the first submission of each kind
            self._comm: Any = None
        self._open = True
        return self

    def _join(self, stream: Any) -> Any:
        """``stream`` starts after the caller's work at entry; the caller waits for it at exit."""
        if not any(s is stream for s in self._streams):
            stream.wait_event(self._start)
            self._streams.append(stream)
        return stream

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        if self._cuda:
            cur = _torch().cuda.current_stream(self._dev)
            for s in self._streams:
                cur.wait_stream(s)
            for f in self._futures:
                if f._handle is not None:
                    f._handle.done = True
        elif self._pool is not None:
            self._pool.shutdown(wait=True)

    def _check(self) -> None:
        if not self._open:
            raise InvalidUsageError("overlap_region: submit inside the with block")

    def submit_compute(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Runs ``fn(*args, **kwargs)`` (torch compute) beside the region's communication;
        returns a :class:`Future` of its value."""
        self._check()
        return self._submit("compute", fn, args, kwargs)

    def submit_comm(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Runs ``fn(*args, **kwargs)`` (collectives: ``maco.allreduce``, ``dist.all_reduce``,
        a Communicator method...) beside the region's compute; returns a :class:`Future` of
        its value."""
        self._check()
        return self._submit("comm", fn, args, kwargs)

    def _submit(self, kind: str, fn: Callable, args: tuple, kwargs: dict,
                stream: Any = None) -> Future:
        """A submission of ``kind`` ("compute" or "comm"); CUDA: on ``stream`` (None: the
        region's stream of that kind; another one is joined to the region)."""
        f = Future(kind)
        self._futures.append(f)
        if not self._cuda:
            if kind == "comm":
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(1, "maco-overlap-region")
                f._cf = self._pool.submit(lambda: fn(*_resolve(args, kwargs)[0],
                                                     **_resolve(args, kwargs)[1]))
            else:
                try:
                    a, k = _resolve(args, kwargs)
                    with _Ordered():
                        f._value = fn(*a, **k)
                except Exception as e:  # noqa: BLE001 - handed to the Future
                    f._exc = e
            return f
        torch = _torch()
        if stream is None:
            if kind == "comm":
                if self._comm is None:
                    self._comm = comm_stream(self._dev, self._priority)
                stream = self._comm
            else:
                if self._compute is None:
                    self._compute = torch.cuda.Stream(device=self._dev)
                stream = self._compute
        s = self._join(stream)
        with torch.cuda.stream(s):
            try:
                a, k = _resolve(args, kwargs)  # waits for Future arguments on s
                for t in _tensors(a) + _tensors(k.values()):
                    if t.is_cuda:
                        t.record_stream(s)  # the caller may free them before s is done
                with _Ordered():
                    if kind == "comm":
                        f._value = _with_comm_order(fn, a, k, s)
                    else:
                        f._value = fn(*a, **k)
            except Exception as e:  # noqa: BLE001 - handed to the Future
                f._exc = e
                return f
            for t in _tensors([f._value]):
                if t.is_cuda:
                    t.record_stream(s)
            ev = torch.cuda.Event()
            ev.record(s)
        f._handle = _event_handle(ev, self._dev, kind)
        return f


def _with_comm_order(fn: Callable, a: tuple, k: dict, s: Any) -> Any:
    if not is_initialized():
        return fn(*a, **k)
    comm = get_default_communicator()
    order_after_last(comm, s)
    out = fn(*a, **k)
    ev = _torch().cuda.Event()
    ev.record(s)
    note_issue(comm, s, ev)
    return out


def overlap_region(device: Any = None, priority: Any = None) -> OverlapRegion:
    """A new :class:`OverlapRegion` (use it in a ``with`` block): the submissions of
    ``maco.optimize_context()`` without the scope's first-use tracking.

    Args:
        device: the CUDA device (default: the default communicator's, else the current one).
        priority: the communication stream's priority ("high" (default), "normal", "low").
    """
    return OverlapRegion(device, priority)


# ---------------------------------------------------------------------------- pipeline

class Pipeline:
    """Stages run over micro-batches so that one micro-batch's communication overlaps another
    micro-batch's compute (the design's Strategy 3): submissions (as
    :class:`OverlapRegion`'s) in wavefront order, one stream per stage.

    ::

        pipeline = maco.Pipeline(num_stages=3)

        @pipeline.stage(0)
        def attention_stage(x): return attention(x)
        @pipeline.stage(1)
        def allreduce_stage(x): return maco.allreduce(x)
        @pipeline.stage(2)
        def ffn_stage(x): return ffn(x)

        out = pipeline(inp)              # inp split into num_stages micro-batches along dim 0

    The input is split into ``chunks`` micro-batches along ``dim`` (``torch.tensor_split``);
    stage i of micro-batch j runs after stage i - 1 of micro-batch j and after stage i of
    micro-batch j - 1; the host issues them in wavefront order (step t runs stage i on
    micro-batch t - i, i ascending), the same order on every rank, so the collectives of the
    stages reach every rank in the same order. The outputs of the last stage are concatenated
    along ``dim`` (a stage that returns a non-tensor: the list of per-micro-batch outputs is
    returned). Stages must treat the rows of ``dim`` independently (row-wise layers, the
    allreduce of a row-parallel linear): splitting the sequence of a causal attention is
    not that.

    CUDA: stage i runs on its own stream (created per device), ordered with CUDA events as
    above; tensors passed between stages are recorded on the consuming stream; the caller's
    current stream waits for the stages at the end (no host blocking). Level-1
    collectives in a stage run on the stage's stream, chained with the communicator's other
    collectives so they run in call order. CPU: stages run one after another in the same
    order. A stage that raises stops the call (the exception propagates).

    Args:
        num_stages: the number of stages (>= 1).
        chunks: micro-batches per call (default: num_stages).
        dim: the dimension to split (default 0).

    Thread-safety: one call at a time per pipeline.
    Raises (at the call): ValueError: a stage is missing, chunks < 1 or larger than the
    dimension; (at ``stage``) ValueError: an index out of range or already taken.
    """

    def __init__(self, num_stages: int, *, chunks: Optional[int] = None, dim: int = 0):
        if isinstance(num_stages, bool) or not isinstance(num_stages, int) or num_stages < 1:
            raise ValueError(f"num_stages: {num_stages!r} is not a positive int")
        self.num_stages = num_stages
        self.chunks = _positive_int(chunks, "chunks") if chunks is not None else num_stages
        self.dim = dim
        self._stages: dict = {}
        self._streams: dict = {}
        self.trace: list = []  # (stage, micro-batch) in issue order, of the last call

    def stage(self, index: int) -> Callable[[Callable], Callable]:
        """Decorator registering ``fn(x) -> y`` as stage ``index`` (0 <= index < num_stages)."""
        if isinstance(index, bool) or not isinstance(index, int) or \
                not 0 <= index < self.num_stages:
            raise ValueError(f"stage: index {index!r} is not in [0, {self.num_stages})")
        if index in self._stages:
            raise ValueError(f"stage: index {index} already has "
                             f"{getattr(self._stages[index], '__name__', 'a function')}")

        def register(fn: Callable) -> Callable:
            if not callable(fn):
                raise TypeError(f"stage {index}: {fn!r} is not callable")
            self._stages[index] = fn
            return fn

        return register

    def __call__(self, *xs: Any, chunks: Optional[int] = None) -> Any:
        """Runs the stages over ``xs`` (see the class text); returns the joined output.

        With several tensors (same size along ``dim``) each is split alike and stage 0 gets
        one part of each as its arguments; a stage that returns a tuple passes it on as the
        next stage's arguments."""
        torch = _torch()
        missing = [i for i in range(self.num_stages) if i not in self._stages]
        if missing:
            raise ValueError(f"Pipeline: no function for stage(s) {missing}")
        c = _positive_int(chunks, "chunks") if chunks is not None else self.chunks
        if not xs:
            raise TypeError("Pipeline: an input tensor is needed")
        for i, x in enumerate(xs):
            if not isinstance(x, torch.Tensor):
                raise TypeError(f"x: argument {i} is a {type(x).__name__}, not a torch.Tensor")
            if x.shape[self.dim] != xs[0].shape[self.dim]:
                raise ValueError(f"x: argument {i} has {x.shape[self.dim]} rows along dimension "
                                 f"{self.dim}; argument 0 has {xs[0].shape[self.dim]}")
        x = xs[0]
        if c > x.shape[self.dim]:
            raise ValueError(f"chunks: {c} exceeds x's dimension {self.dim} "
                             f"({x.shape[self.dim]})")
        split = [torch.tensor_split(t, c, dim=self.dim) for t in xs]
        vals: list = [split[0][j] if len(xs) == 1 else tuple(p[j] for p in split)
                      for j in range(c)]
        S = self.num_stages
        self.trace = []
        cuda = x.is_cuda
        streams: list = [None] * S
        if cuda:
            streams = self._streams.get(x.device.index)
            if streams is None:
                streams = self._streams[x.device.index] = [torch.cuda.Stream(device=x.device)
                                                           for _ in range(S)]
        with OverlapRegion(x.device if cuda else None, cpu=not cuda) as region:
            for t in range(c + S - 1):
                for i in range(S):
                    j = t - i
                    if not 0 <= j < c:
                        continue
                    self.trace.append((i, j))
                    f = region._submit("compute", _call_stage, (self._stages[i], vals[j]), {},
                                       streams[i])
                    if f._exc is not None:
                        raise f._exc
                    vals[j] = f
        vals = [f.result() for f in vals]  # the caller's stream waited for every stage
        if cuda:
            cur = torch.cuda.current_stream(x.device)
            for tt in _tensors(vals):
                if tt.is_cuda:
                    tt.record_stream(cur)
        if all(isinstance(v, torch.Tensor) for v in vals):
            return torch.cat(vals, dim=self.dim)
        return vals


def _call_stage(fn: Callable, v: Any) -> Any:
    return fn(*v) if isinstance(v, tuple) else fn(v)


def _positive_int(v: Any, name: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{name}: {v!r} is not a positive int")
    return v
