"""How the overlap API issues a collective and waits for it: the communication streams, the
order of a communicator's collectives across streams, handles of issued work
(:class:`CommWork`, overlap groups), the split's CTA cap, and the tensors' identity that first-use
waits compare (maco/_overlap.py's scopes, maco/_region.py's submissions, maco/_collectives.py's
calls and maco/_schedule.py's phases all go through here).

Order: a communicator's collectives issued by the overlap API on different streams run in call
order, as MACO requires: each is enqueued after an event recorded behind the communicator's
previous one (per communicator, held with a weak reference to it).
"""

from __future__ import annotations

import contextlib
import sys
import threading
import weakref
from typing import Any, Callable, Iterable, Iterator, Optional

from . import _config

__all__ = ["CommWork", "wait_overlap_group"]


class _ThreadState(threading.local):
    """What the overlap API keeps per thread: ``inside`` (MACO's own code running inside a
    scope), ``scopes`` (the open overlap scopes, innermost last), ``groups`` (overlap group
    name -> its handles not yet waited), ``ordered`` (submissions and pipeline stages running:
    collectives go on the current stream, in order), ``ring`` (the open :func:`maco.ring`),
    ``caps`` (where a scoped split records the CTA caps it changed)."""

    def __init__(self):
        self.inside = 0
        self.scopes: list = []
        self.groups: dict = {}
        self.ordered = 0
        self.ring: Any = None
        self.caps: Optional[list] = None


_tls = _ThreadState()
_lock = threading.RLock()


def _torch():
    import torch

    return torch


def _is_compiling() -> bool:
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    f = getattr(getattr(torch, "compiler", None), "is_compiling", None)
    return bool(f()) if f is not None else False


class _Inside:
    """Marks MACO's own code running inside a scope: the first-use mode lets it through."""

    def __enter__(self):
        _tls.inside += 1

    def __exit__(self, *exc):
        _tls.inside -= 1


def _inside() -> bool:
    return _tls.inside > 0


class _Ordered:
    """Marks a submission or a pipeline stage running: Level-1 collectives in it run on the
    current stream with the communicator's order kept (:func:`in_ordered_context`)."""

    def __enter__(self):
        _tls.ordered += 1

    def __exit__(self, *exc):
        _tls.ordered -= 1


def in_ordered_context() -> bool:
    """Inside a pipeline stage or an overlap region's submission: Level-1 collectives run on
    the current stream with the communicator's order kept across streams."""
    return _tls.ordered > 0


# ---------------------------------------------------------------------------- handles


class _Handle:
    """One issued collective: ``wait`` makes its result visible to the caller (CUDA: the
    current stream waits for its event; torch.distributed: the work's wait), ``query`` polls,
    ``sync`` blocks the host. Handles of one overlap group are waited together."""

    __slots__ = ("_wait", "_query", "_sync", "name", "done", "group", "after")

    def __init__(self, wait: Callable, query: Callable, sync: Callable, name: str):
        self._wait, self._query, self._sync = wait, query, sync
        self.name = name
        self.done = False
        self.group: Optional[list] = None
        self.after: Optional[Callable] = None  # run once after the wait (AVG on Gloo)

    def wait(self) -> None:
        members = self.group if self.group is not None else [self]
        for h in list(members):
            h._wait1()

    def _wait1(self) -> None:
        if not self.done:
            self.done = True
            self._wait()
            if self.after is not None:
                self.after()
            if self.group is not None and self in self.group:
                self.group.remove(self)

    def query(self) -> bool:
        return self.done or bool(self._query())

    def sync(self) -> None:
        self._sync()
        self.wait()


def _event_handle(ev: Any, device: Any, name: str) -> _Handle:
    torch = _torch()

    def wait():
        torch.cuda.current_stream(device).wait_event(ev)

    return _Handle(wait, ev.query, ev.synchronize, name)


def _work_handle(work: Any, name: str) -> _Handle:
    return _Handle(work.wait, work.is_completed, work.wait, name)


def _done_handle(name: str) -> _Handle:
    h = _Handle(lambda: None, lambda: True, lambda: None, name)
    h.done = True
    return h


class CommWork:
    """A collective issued with ``async_op=True`` (``maco.allreduce(x, async_op=True)``, and a
    :class:`CommScheduler` phase).

    ``wait()`` makes the caller's current CUDA stream wait for it (no host blocking; for CPU
    tensors on torch.distributed the host blocks) and returns the result tensor;
    ``synchronize()`` blocks the host; ``is_completed()`` polls. Thread-safety: wait from the
    thread that issued it (CUDA: the stream that is current there).
    """

    def __init__(self, result: Any, handle: _Handle):
        self._result = result
        self._h = handle

    def wait(self) -> Any:
        """Orders the current stream after the collective; returns its result. Idempotent."""
        self._h.wait()
        return self._result

    def is_completed(self) -> bool:
        """True once the collective has finished (does not block)."""
        return self._h.query()

    def synchronize(self) -> Any:
        """Blocks the host until the collective finished; returns its result."""
        self._h.sync()
        return self._result

    @property
    def result(self) -> Any:
        """The output tensor; read it only after :meth:`wait`."""
        return self._result

    def __repr__(self) -> str:
        return f"<maco.CommWork {self._h.name} {'done' if self._h.done else 'pending'}>"


# ---------------------------------------------------------------------------- groups

def _join_group(h: _Handle, name: Optional[str]) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not name:
        raise ValueError(f"overlap_group: {name!r} is not a non-empty str")
    members = _tls.groups.setdefault(name, [])
    members.append(h)
    h.group = members


def wait_overlap_group(name: str) -> None:
    """Waits for every collective of this thread tagged ``overlap_group=name`` and not yet
    waited for (CUDA: the current stream waits; no host blocking)."""
    members = _tls.groups.get(name)
    if members:
        members[0].wait()


# ---------------------------------------------------------------------------- streams

_comm_streams: dict = {}  # (device index, priority) -> torch.cuda.Stream


class _LastIssue:
    """The stream and the event recorded behind a communicator's last collective issued by the
    overlap API."""

    __slots__ = ("stream", "event")

    def __init__(self, stream: Any, event: Any):
        self.stream, self.event = stream, event


_last_issue: "weakref.WeakKeyDictionary[Any, _LastIssue]" = weakref.WeakKeyDictionary()


def _priority(priority: Any) -> int:
    if priority is None or priority == "high":
        return -1
    if priority in ("normal", "low"):
        return 0
    if isinstance(priority, int) and not isinstance(priority, bool):
        return priority
    raise ValueError(f"priority: {priority!r}; accepts 'high', 'normal', 'low' or a CUDA "
                     "stream priority (int, lower is higher)")


def comm_stream(device: Any, priority: Any = None) -> Any:
    """The overlap API's communication stream of ``device`` for ``priority`` ("high"
    (default): CUDA's highest stream priority; "normal"/"low": 0 (CUDA has no priority below
    the default); an int: that priority, clamped by CUDA)."""
    torch = _torch()
    p = _priority(priority)
    dev = torch.device(device)
    idx = dev.index if dev.index is not None else torch.cuda.current_device()
    with _lock:
        s = _comm_streams.get((idx, p))
        if s is None:
            s = _comm_streams[(idx, p)] = torch.cuda.Stream(device=idx, priority=p)
    return s


def order_after_last(comm: Any, stream: Any) -> None:
    """``stream`` waits for ``comm``'s last collective issued by the overlap API when that
    one went to another stream."""
    last = _last_issue.get(comm)
    if last is not None and last.stream is not stream:
        stream.wait_event(last.event)


def note_issue(comm: Any, stream: Any, ev: Any) -> None:
    """``ev``, recorded on ``stream``, follows ``comm``'s latest collective."""
    _last_issue[comm] = _LastIssue(stream, ev)


def apply_split(comm: Any) -> None:
    """Applies the split in use (:func:`maco.set_config`, a scope's ``comm_sms``) to ``comm``:
    its CTA cap (``set_max_ctas``, collective) when it differs. Inside a block that restores
    caps (:func:`caps_restored`), the cap from before is recorded there.

    Raises: InvalidUsageError: sm_policy 'manual' or 'dynamic' without a split."""
    split = _config.required_split()
    want = (split.comm_sms or 0) if split is not None else None
    if want is None or comm.device is None:
        return
    before = comm.max_ctas
    if before != want:
        if _tls.caps is not None and not any(c is comm for c, _ in _tls.caps):
            _tls.caps.append((comm, before))
        comm.set_max_ctas(want)


@contextlib.contextmanager
def caps_restored() -> Iterator[None]:
    """Communicators whose CTA cap :func:`apply_split` changes inside the block get their cap
    from before back at its end (collective, like the change: every rank ends the block)."""
    saved, _tls.caps = _tls.caps, []
    try:
        yield
    finally:
        changed, _tls.caps = _tls.caps, saved
        for comm, cap in reversed(changed):
            if not comm.closed:
                comm.set_max_ctas(cap)


def issue(comm: Any, fn: Callable[[Any], Any], stream: Any) -> tuple:
    """Runs ``fn(stream)`` (Communicator calls with ``stream=``) after ``comm``'s previous
    collective of the overlap API; returns (fn's result, the event recorded behind it on
    ``stream``). The one issue path of the overlap API (:func:`run_on_comm_stream`,
    :func:`run_ordered`, :class:`maco.Context`)."""
    with _Inside():
        order_after_last(comm, stream)
        result = fn(stream)
        ev = _torch().cuda.Event()
        ev.record(stream)
        note_issue(comm, stream, ev)
    return result, ev


def run_on_comm_stream(comm: Any, fn: Callable[[Any], Any], priority: Any = None,
                       name: str = "collective") -> tuple:
    """Runs ``fn(stream)`` (a Communicator call with ``stream=``) on the communication stream
    of ``priority``, after the current stream's work and the communicator's previous
    collective, under the split in use; returns (fn's result, handle)."""
    torch = _torch()
    dev = torch.device("cuda", comm.device)
    with _Inside():
        apply_split(comm)
        s = comm_stream(dev, priority)
        s.wait_stream(torch.cuda.current_stream(dev))
    result, ev = issue(comm, fn, s)
    return result, _event_handle(ev, dev, name)


def run_ordered(comm: Any, fn: Callable[[Any], Any]) -> Any:
    """Runs ``fn(current stream)`` with the communicator's order kept across streams (inside
    pipeline stages and overlap regions, whose streams differ), under the split in use."""
    torch = _torch()
    dev = torch.device("cuda", comm.device)
    with _Inside():
        apply_split(comm)
    return issue(comm, fn, torch.cuda.current_stream(dev))[0]


# ---------------------------------------------------------------------------- tensors

# torch functions that read no tensor data: a first use is never one of these.
_META = frozenset({"__get__", "size", "dim", "numel", "stride", "is_contiguous", "data_ptr",
                   "element_size", "untyped_storage", "storage_offset", "record_stream",
                   "__len__", "is_floating_point", "is_complex", "get_device", "nelement",
                   "ndimension", "__repr__", "__format__", "is_pinned", "_is_view",
                   "__hash__"})


def _func_name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


def _key(t: Any) -> int:
    """The storage a tensor's data lives in (views share it); 0 when it has none."""
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse, fake)
        return 0


def _tensors(values: Iterable[Any]) -> list:
    """The torch tensors among ``values`` and in their lists, tuples and dicts (none when
    torch is not imported)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return []
    out = []
    for v in values:
        if isinstance(v, torch.Tensor):
            out.append(v)
        elif isinstance(v, (list, tuple)):
            out.extend(x for x in v if isinstance(x, torch.Tensor))
        elif isinstance(v, dict):
            out.extend(x for x in v.values() if isinstance(x, torch.Tensor))
    return out


class _AsyncClass:
    """The class of :func:`async_tensor`'s results, made at first use (it needs torch)."""

    cls: Any = None


def async_tensor(t: Any, handle: _Handle) -> Any:
    """A view of ``t`` that waits for ``handle`` at its first use by a torch function (then
    behaves as ``t``); results of operations on it are plain tensors."""
    torch = _torch()
    if _AsyncClass.cls is None:
        class AsyncCollectiveResult(torch.Tensor):
            """The result of ``maco.allreduce(..., overlap_with_next=True)`` outside an overlap
            scope: a tensor whose collective is still running; any torch operation on it first
            makes the current stream wait for it (no host blocking). ``wait()`` does so
            explicitly and returns a plain tensor."""

            @classmethod
            def __torch_function__(cls, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                if _func_name(func) not in _META:
                    for t in _tensors(args) + _tensors(kwargs.values()):
                        h = getattr(t, "_maco_handle", None)
                        if h is not None:
                            h.wait()
                with torch._C.DisableTorchFunctionSubclass():
                    return func(*args, **kwargs)

            def wait(self):
                h = getattr(self, "_maco_handle", None)
                if h is not None:
                    h.wait()
                return self.as_subclass(torch.Tensor)

        _AsyncClass.cls = AsyncCollectiveResult
    r = t.as_subclass(_AsyncClass.cls)
    r._maco_handle = handle
    return r
