"""Overlap of collectives with the compute that follows them: the scopes of Level 1
(``@maco.optimize_comm``, ``@maco.optimize``, ``maco.optimize_context()``,
``maco.auto_overlap()``), per-call options of ``maco.allreduce`` and friends, overlap regions
with futures, pipelines of stages, and rings for pipeline-parallel send/recv.

How a collective overlaps (CUDA tensors, MACO's communicator): it is enqueued on a
communication stream of the tensor's device, ordered after the work already on the caller's
current stream, and a CUDA event is recorded after it. The caller's stream goes on with the
next compute at once. The result is *waited for* by making the caller's current stream wait
for that event (``cudaStreamWaitEvent``: the host does not block), at the first use of any
tensor the collective writes (or a write to one it reads) inside the scope, or when the scope
ends. Communication streams are per device and priority (default "high": the collective's
CTAs are scheduled before queued compute CTAs); collectives on one communicator issued from
several of them are chained with events, so they run in call order as MACO requires.

CPU tensors (torch.distributed initialized, e.g. Gloo): the collective is issued with
``async_op=True`` on torch.distributed's group and its work's ``wait()`` is called at the same
points (Gloo's wait blocks the host). This is also what CPU tests exercise.

"First use" is seen by a ``torch.overrides.TorchFunctionMode`` active inside a scope: every
torch function called with a tensor that shares storage with a pending collective's output
(views included) waits first; metadata queries (shape, dtype, device, ...) do not wait. Code
that reads the memory without a torch function (a C extension given ``data_ptr()``) must call
:func:`wait_all` first.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import inspect
import sys
import threading
from typing import Any, Callable, Iterable, Iterator, Optional, Sequence

from . import _config
from ._errors import InvalidUsageError

__all__ = ["optimize_comm", "optimize", "optimize_context", "auto_overlap", "overlap_region",
           "OverlapRegion", "Future", "Pipeline", "ring", "Ring", "CommWork", "wait_all",
           "wait_overlap_group"]

_tls = threading.local()
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
        _tls.inside = getattr(_tls, "inside", 0) + 1

    def __exit__(self, *exc):
        _tls.inside -= 1


def _inside() -> bool:
    return getattr(_tls, "inside", 0) > 0


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

def _groups() -> dict:
    g = getattr(_tls, "groups", None)
    if g is None:
        g = _tls.groups = {}
    return g


def _join_group(h: _Handle, name: Optional[str]) -> None:
    if name is None:
        return
    if not isinstance(name, str) or not name:
        raise ValueError(f"overlap_group: {name!r} is not a non-empty str")
    members = _groups().setdefault(name, [])
    members.append(h)
    h.group = members


def wait_overlap_group(name: str) -> None:
    """Waits for every collective of this thread tagged ``overlap_group=name`` and not yet
    waited for (CUDA: the current stream waits; no host blocking)."""
    members = _groups().get(name)
    if members:
        members[0].wait()


# ---------------------------------------------------------------------------- streams

_comm_streams: dict = {}   # (device index, priority) -> torch.cuda.Stream
_last_issue: dict = {}     # id(comm) -> (stream, event): the last collective the API issued


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


def _order_after_last(comm: Any, stream: Any) -> None:
    last = _last_issue.get(id(comm))
    if last is not None and last[0] is not stream:
        stream.wait_event(last[1])


def _note_issue(comm: Any, stream: Any, ev: Any) -> None:
    _last_issue[id(comm)] = (stream, ev)


def apply_split(comm: Any) -> None:
    """Applies the split in use (:func:`maco.set_config`) to ``comm``: its CTA cap
    (``set_max_ctas``, collective) when it differs."""
    split = _config.required_split()
    want = (split.comm_sms or 0) if split is not None else None
    if want is None or comm.device is None:
        return
    if comm.max_ctas != want:
        comm.set_max_ctas(want)


def run_on_comm_stream(comm: Any, fn: Callable[[Any], Any], priority: Any = None,
                       name: str = "collective") -> tuple:
    """Runs ``fn(stream)`` (a Communicator call with ``stream=``) on the communication stream,
    after the current stream's work and the communicator's previous collective; returns
    (fn's result, handle)."""
    torch = _torch()
    dev = torch.device("cuda", comm.device)
    with _Inside():
        apply_split(comm)
        cur = torch.cuda.current_stream(dev)
        s = comm_stream(dev, priority)
        s.wait_stream(cur)
        _order_after_last(comm, s)
        result = fn(s)
        ev = torch.cuda.Event()
        ev.record(s)
        _note_issue(comm, s, ev)
    return result, _event_handle(ev, dev, name)


def run_ordered(comm: Any, fn: Callable[[Any], Any]) -> Any:
    """Runs ``fn(current stream)`` with the communicator's order kept across streams (inside
    pipeline stages and overlap regions, whose streams differ)."""
    torch = _torch()
    dev = torch.device("cuda", comm.device)
    with _Inside():
        apply_split(comm)
        cur = torch.cuda.current_stream(dev)
        _order_after_last(comm, cur)
        result = fn(cur)
        ev = torch.cuda.Event()
        ev.record(cur)
        _note_issue(comm, cur, ev)
    return result


# ---------------------------------------------------------------------------- first use

_META = frozenset({"__get__", "size", "dim", "numel", "stride", "is_contiguous", "data_ptr",
                   "element_size", "untyped_storage", "storage_offset", "record_stream",
                   "__len__", "is_floating_point", "is_complex", "get_device", "nelement",
                   "ndimension", "__repr__", "__format__", "is_pinned", "_is_view",
                   "__hash__"})


def _func_name(func: Any) -> str:
    return getattr(func, "__name__", "") or ""


def _is_write(name: str, kwargs: dict) -> bool:
    if "out" in kwargs:
        return True
    if name == "__setitem__" or (name.startswith("__i") and name.endswith("__")):
        return True
    return name.endswith("_") and not name.endswith("__")


def _key(t: Any) -> int:
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage (meta, sparse, fake)
        return 0


def _tensors(values: Iterable[Any]) -> list:
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


class _Pending:
    __slots__ = ("handle", "outs", "ins", "conservative")

    def __init__(self, handle: _Handle, outs: set, ins: set, conservative: bool):
        self.handle, self.outs, self.ins, self.conservative = handle, outs, ins, conservative


_mode_class = None


def _first_use_mode(scope: "_Scope") -> Any:
    global _mode_class
    if _mode_class is None:
        from torch.overrides import TorchFunctionMode

        class _FirstUse(TorchFunctionMode):
            def __init__(self, scope):
                super().__init__()
                self.scope = scope

            def __torch_function__(self, func, types, args=(), kwargs=None):
                kwargs = kwargs or {}
                sc = self.scope
                if not sc.pending or _inside():
                    return func(*args, **kwargs)
                name = _func_name(func)
                if name in _META:
                    return func(*args, **kwargs)
                sc._before_op(name, args, kwargs)
                cons = [p for p in sc.pending if p.conservative]
                out = func(*args, **kwargs)
                for p in cons:  # 'conservative': overlapped one operation, now waited
                    sc._wait(p)
                return out

        _mode_class = _FirstUse
    return _mode_class(scope)


# ---------------------------------------------------------------------------- scopes

# torch.distributed functions a scope takes over: name -> (written parameters, read ones).
_DIST = {
    "all_reduce": (("tensor",), ()),
    "all_gather_into_tensor": (("output_tensor",), ("input_tensor",)),
    "all_gather": (("tensor_list",), ("tensor",)),
    "reduce_scatter_tensor": (("output",), ("input",)),
    "reduce_scatter": (("output",), ("input_list",)),
    "broadcast": (("tensor",), ()),
    "reduce": (("tensor",), ()),
    "all_to_all_single": (("output",), ("input",)),
    "all_to_all": (("output_tensor_list",), ("input_tensor_list",)),
}
_installed: dict = {}      # name -> (our wrapper, what it replaced)
_install_count = 0
_signatures: dict = {}


def _current_scope() -> Optional["_Scope"]:
    st = getattr(_tls, "scopes", None)
    return st[-1] if st else None


def _install() -> None:
    """Puts the scope-aware wrappers on torch.distributed's functions (once per outermost
    scope; a wrapper passes calls of threads without a scope straight through)."""
    global _install_count
    import torch.distributed as dist

    with _lock:
        _install_count += 1
        for name in _DIST:
            cur = getattr(dist, name)
            if getattr(cur, "__maco_scope__", False):
                continue
            _signatures.setdefault(name, inspect.signature(inspect.unwrap(cur)))
            w = _make_dist_wrapper(name, cur)
            _installed[name] = (w, cur)
            setattr(dist, name, w)
            setattr(dist.distributed_c10d, name, w)


def _uninstall() -> None:
    global _install_count
    import torch.distributed as dist

    with _lock:
        _install_count -= 1
        if _install_count > 0:
            return
        for name, (w, prev) in list(_installed.items()):
            if getattr(dist, name) is w:  # someone else re-patched it since: leave theirs
                setattr(dist, name, prev)
            if getattr(dist.distributed_c10d, name) is w:
                setattr(dist.distributed_c10d, name, prev)
        _installed.clear()


def _make_dist_wrapper(name: str, prev: Callable) -> Callable:
    @functools.wraps(prev)
    def wrapper(*args, **kwargs):
        scope = _current_scope()
        if scope is None or _inside() or _is_compiling():
            return prev(*args, **kwargs)
        return scope._dist_call(name, prev, args, kwargs)

    wrapper.__maco_scope__ = True
    return wrapper


class _Scope:
    """An overlap scope (see the module's text). ``redirect``: torch.distributed collectives
    on CUDA tensors run on MACO (else on their own backend, made asynchronous)."""

    def __init__(self, redirect: bool, what: str):
        self.redirect = redirect
        self.what = what
        self.pending: list = []
        self._mode = None
        self._dist = False

    # -------------------------------------------------------------- enter / exit

    def __enter__(self) -> "_Scope":
        if _is_compiling():
            return self
        torch = sys.modules.get("torch")
        _config._scope_enter()
        st = getattr(_tls, "scopes", None)
        if st is None:
            st = _tls.scopes = []
        st.append(self)
        try:
            if torch is not None:
                import torch.distributed as dist

                if dist.is_available():
                    _install()
                    self._dist = True
                self._mode = _first_use_mode(self)
                self._mode.__enter__()
        except BaseException:
            self._leave()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if _is_compiling():
            return
        try:
            if self._mode is not None:
                self._mode.__exit__(*exc)
                self._mode = None
        finally:
            pending, self.pending = self.pending, []
            self._leave()
            outer = _current_scope()
            if outer is not None and exc[0] is None and not _config.setting("debug"):
                outer.pending.extend(pending)  # they overlap what the enclosing scope does next
            else:
                with _Inside():
                    for p in pending:
                        p.handle.wait()

    def _leave(self) -> None:
        st = _tls.scopes
        if st and st[-1] is self:
            st.pop()
        if self._dist:
            _uninstall()
            self._dist = False
        _config._scope_exit()

    # -------------------------------------------------------------- pending

    def add(self, handle: _Handle, outs: Sequence[Any], ins: Sequence[Any]) -> None:
        """Tracks a collective: waited at the first use of ``outs`` (or write to ``ins``)."""
        if _config.setting("debug"):
            handle.wait()
            return
        with _Inside():
            ok = {_key(t) for t in _tensors(outs)} - {0}
            ik = {_key(t) for t in _tensors(ins)} - {0}
        cons = _config.setting("overlap_strategy") == "conservative"
        self.pending.append(_Pending(handle, ok, ik - ok, cons))

    def _wait(self, p: _Pending) -> None:
        with _Inside():
            p.handle.wait()
        self.pending = [q for q in self.pending if not q.handle.done]

    def wait_all(self) -> None:
        """Waits for every collective of the scope not yet waited for."""
        with _Inside():
            for p in list(self.pending):
                p.handle.wait()
        self.pending = []

    def _before_op(self, name: str, args: tuple, kwargs: dict) -> None:
        ts = _tensors(args) + _tensors(kwargs.values())
        if not ts:
            return
        keys = {_key(t) for t in ts}
        wkeys: set = set()
        if _is_write(name, kwargs):
            w = _tensors(args[:1]) + _tensors([kwargs.get("out")])
            wkeys = {_key(t) for t in w}
        for p in list(self.pending):
            if not p.handle.done and (p.outs & keys or p.ins & wkeys):
                self._wait(p)

    def before_issue(self, tensors: Sequence[Any]) -> None:
        """A new collective on ``tensors``: earlier ones of this scope on the same memory are
        waited for first (two collectives in flight on one buffer would race)."""
        if not self.pending:
            return
        with _Inside():
            keys = {_key(t) for t in _tensors(tensors)} - {0}
        for p in list(self.pending):
            if not p.handle.done and (p.outs & keys or p.ins & keys):
                self._wait(p)

    # -------------------------------------------------------------- torch.distributed

    def _dist_call(self, name: str, prev: Callable, args: tuple, kwargs: dict) -> Any:
        sig = _signatures[name]
        try:
            ba = sig.bind(*args, **kwargs)
        except TypeError:
            return prev(*args, **kwargs)  # torch reports the bad call
        a = dict(ba.arguments)
        outs_p, ins_p = _DIST[name]
        outs = _tensors(a.get(p) for p in outs_p)
        ins = _tensors(a.get(p) for p in ins_p)
        user_async = bool(a.get("async_op", False))
        strategy = _config.setting("overlap_strategy")
        route = self._maco_route(name, outs + ins) if self.redirect else None
        if user_async or strategy == "none":
            return self._dist_issue(name, prev, route, a, user_async)
        self.before_issue(outs + ins)
        a["async_op"] = True
        work = self._dist_issue(name, prev, route, a, True)
        if work is None:  # e.g. this rank is not in the group
            return None
        self.add(_work_handle(work, name), outs, ins)
        return None

    def _maco_route(self, name: str, tensors: list) -> Optional[Callable]:
        """maco.torch's route for ``name`` when its tensors can run on MACO, after applying
        the split to the group's communicator; None: the original function."""
        if not tensors or not all(t.is_cuda and t.is_contiguous() for t in tensors):
            return None
        from . import torch as mt

        return mt._ROUTES.get(name)

    def _dist_issue(self, name: str, prev: Callable, route: Optional[Callable], a: dict,
                    async_op: bool) -> Any:
        a = dict(a, async_op=async_op)
        if route is not None:
            from . import torch as mt

            tensors = _tensors(a.values())
            try:
                with _Inside():
                    m = mt._pg_or_fallback(a.get("group"), *tensors)
                    apply_split(m.comm)
                return route(prev, **a)
            except mt._Fallback:
                pass
        return prev(**a)


def optimize_context(redirect: bool = True) -> _Scope:
    """A scope (``with maco.optimize_context(): ...``) in which collectives run on MACO and
    overlap the compute that follows them.

    Inside it, on this thread:

    - ``torch.distributed`` collectives (all_reduce, all_gather(_into_tensor),
      reduce_scatter(_tensor), broadcast, reduce, all_to_all(_single)) on contiguous CUDA
      tensors run on MACO (``redirect=True``; through the group's MACO communicator, made at
      its first call as :func:`maco.patch_torch_distributed` does); other tensors (CPU) stay
      on the group's own backend (Gloo). Each is issued asynchronously and returns None
      (``async_op=True`` calls return their work, as torch.distributed's do, and are the
      caller's to wait for).
    - ``maco.allreduce`` and the other Level-1 collectives are issued on a communication
      stream and return their output tensor at once.
    - Each collective is waited for at the first use of its result (see the module's text)
      or at the end of the scope, whichever is first; ``maco.config.set(overlap_strategy=)``
      changes this ("none", "conservative").

    Streams: the caller's current stream is the compute stream; at exit it is ordered after
    every collective of the scope (no host blocking on CUDA). Scopes nest. Under
    ``torch.compile`` tracing the scope does nothing (compiled graphs schedule their own
    collectives: use ``backend="maco"``).

    Thread-safety: the scope belongs to the thread that entered it; torch.distributed's
    functions are wrapped process-wide while any scope runs, and calls from threads without a
    scope pass through unchanged.

    Raises (at a collective): what the collective raises; InvalidUsageError under
    sm_policy 'manual'/'dynamic' without a split.
    """
    return _Scope(redirect, "optimize_context")


def auto_overlap() -> _Scope:
    """A scope in which each collective overlaps the compute that follows it, up to the first
    use of its result (``with maco.auto_overlap(): ...``): as :func:`optimize_context`, but
    ``torch.distributed`` collectives stay on their own backend (NCCL, Gloo), made
    asynchronous and waited for at first use; ``maco.*`` collectives run on MACO as always.
    The design's "each allreduce overlaps the next matmul" is the case where the next matmul
    does not read the allreduce's result; a matmul that does read it waits (it must)."""
    return _Scope(False, "auto_overlap")


def optimize_comm(fn: Callable) -> Callable:
    """Decorator: each call of ``fn`` runs inside :func:`optimize_context` (collectives on
    MACO, each overlapping the compute that follows it; those still running when ``fn``
    returns are waited for then, or, when the call is inside another scope, handed to it so
    they overlap what the caller does next).

    ::

        @maco.optimize_comm
        def my_forward(x, weight):
            y = torch.matmul(x, weight)
            y = maco.allreduce(y)
            return y

    Raises: TypeError when ``fn`` is not callable."""
    if not callable(fn):
        raise TypeError(f"optimize_comm: {fn!r} is not callable")

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return fn(*args, **kwargs)
        with _Scope(True, "optimize_comm"):
            return fn(*args, **kwargs)

    wrapper.__maco_optimized__ = True
    return wrapper


def optimize(cls_or_module: Any) -> Any:
    """Class decorator for an ``nn.Module`` (or a module instance): its ``forward`` runs
    inside :func:`optimize_context`, so ``dist.all_reduce`` and ``maco.allreduce`` in it run
    on MACO and overlap what follows. Returns the class (or the instance) itself.

    Raises: TypeError for anything that is not an nn.Module class or instance."""
    torch = _torch()
    nn = torch.nn
    if isinstance(cls_or_module, type) and issubclass(cls_or_module, nn.Module):
        f = cls_or_module.forward
        if not getattr(f, "__maco_optimized__", False):
            cls_or_module.forward = optimize_comm(f)
        return cls_or_module
    if isinstance(cls_or_module, nn.Module):
        f = cls_or_module.forward
        if not getattr(f, "__maco_optimized__", False):
            cls_or_module.forward = optimize_comm(f)
        return cls_or_module
    raise TypeError(f"optimize: {cls_or_module!r} is not an nn.Module class or instance")


@contextlib.contextmanager
def suspended() -> Iterator[None]:
    """Runs a block outside this thread's first-use modes (compiled graphs, which the modes
    cannot see into): the scopes' pending collectives are waited for first, and the modes are
    put back afterwards. When another torch function mode sits above ours, nothing is
    suspended (only the waits happen)."""
    scopes = list(getattr(_tls, "scopes", None) or [])
    for sc in scopes:
        sc.wait_all()
    from torch.overrides import _get_current_function_mode

    popped = []
    for sc in reversed(scopes):
        if sc._mode is None or _get_current_function_mode() is not sc._mode:
            break
        sc._mode.__exit__(None, None, None)
        popped.append(sc)
    try:
        yield
    finally:
        for sc in reversed(popped):
            sc._mode.__enter__()


def wait_all() -> None:
    """Waits for every pending collective of this thread's scopes (CUDA: the current stream
    waits; no host blocking). Call it before handing memory to code that bypasses torch
    functions (a C extension reading ``data_ptr()``)."""
    for sc in list(getattr(_tls, "scopes", None) or []):
        sc.wait_all()


# ---------------------------------------------------------------------------- async tensor

_async_class = None


def async_tensor(t: Any, handle: _Handle) -> Any:
    """A view of ``t`` that waits for ``handle`` at its first use by a torch function (then
    behaves as ``t``); results of operations on it are plain tensors."""
    global _async_class
    torch = _torch()
    if _async_class is None:
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

        _async_class = AsyncCollectiveResult
    r = t.as_subclass(_async_class)
    r._maco_handle = handle
    return r


# ---------------------------------------------------------------------------- regions

class Future:
    """The result of :meth:`OverlapRegion.submit_compute` or
    :meth:`OverlapRegion.submit_comm`.

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
    block run at the same time; leaving the block waits for all of it.

    ::

        with maco.overlap_region() as region:
            cf = region.submit_compute(torch.matmul, x, w)
            mf = region.submit_comm(maco.allreduce, prev_y)
        y, prev_y = cf.result(), mf.result()

    CUDA (``device``: the current device, or the default communicator's): compute goes to a
    region compute stream, communication to the overlap API's communication stream
    (``priority``); both start after the work on the caller's current stream at entry, run in
    submission order within their kind, and the caller's stream waits for both at exit. A
    Future passed as an argument is waited for on the submitting kind's stream first (its
    value is passed), which is how a submission depends on another. Collectives inside
    ``submit_comm`` run on that stream, in call order after the other collectives of the
    overlap API on the same communicator.

    CPU (no CUDA): compute runs at submission; communication runs, in submission order, on
    one worker thread of the region (so it overlaps the compute that follows); submit
    collectives only through ``submit_comm`` inside a region (collectives from two threads
    at once could reach the ranks in different orders).

    Thread-safety: one thread uses a region. Raises: InvalidUsageError when used after exit.
    """

    def __init__(self, device: Any = None, priority: Any = None):
        self._device = device
        self._priority = priority
        self._cuda = False
        self._open = False
        self._futures: list = []
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None

    def __enter__(self) -> "OverlapRegion":
        torch = sys.modules.get("torch")
        self._cuda = torch is not None and torch.cuda.is_available()
        if self._cuda:
            dev = self._device
            if dev is None:
                from . import _level1

                dev = (_level1.get_default_communicator().device if _level1.is_initialized()
                       else torch.cuda.current_device())
            d = torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
            if d.type != "cuda":
                raise ValueError(f"device: {dev!r} is not a CUDA device")
            self._dev = torch.device("cuda", d.index if d.index is not None
                                     else torch.cuda.current_device())
            cur = torch.cuda.current_stream(self._dev)
            self._compute = torch.cuda.Stream(device=self._dev)
            self._comm = comm_stream(self._dev, self._priority)
            self._compute.wait_stream(cur)
            self._comm.wait_stream(cur)
        else:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, "maco-overlap-region")
        self._open = True
        return self

    def __exit__(self, *exc: Any) -> None:
        self._open = False
        if self._cuda:
            torch = _torch()
            cur = torch.cuda.current_stream(self._dev)
            cur.wait_stream(self._compute)
            cur.wait_stream(self._comm)
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

    def _submit(self, kind: str, fn: Callable, args: tuple, kwargs: dict) -> Future:
        f = Future(kind)
        self._futures.append(f)
        if not self._cuda:
            if kind == "comm":
                f._cf = self._pool.submit(lambda: fn(*_resolve(args, kwargs)[0],
                                                     **_resolve(args, kwargs)[1]))
            else:
                try:
                    a, k = _resolve(args, kwargs)
                    f._value = fn(*a, **k)
                except Exception as e:  # noqa: BLE001 - handed to the Future
                    f._exc = e
            return f
        torch = _torch()
        s = self._comm if kind == "comm" else self._compute
        with torch.cuda.stream(s):
            try:
                a, k = _resolve(args, kwargs)  # waits for Future arguments on s
                for t in _tensors(a) + _tensors(k.values()):
                    if t.is_cuda:
                        t.record_stream(s)  # the caller may free them before s is done
                _tls.region = getattr(_tls, "region", 0) + 1
                try:
                    if kind == "comm":
                        f._value = _with_comm_order(fn, a, k, s)
                    else:
                        f._value = fn(*a, **k)
                finally:
                    _tls.region -= 1
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
    from . import _level1

    if not _level1.is_initialized():
        return fn(*a, **k)
    comm = _level1.get_default_communicator()
    _order_after_last(comm, s)
    out = fn(*a, **k)
    ev = _torch().cuda.Event()
    ev.record(s)
    _note_issue(comm, s, ev)
    return out


def overlap_region(device: Any = None, priority: Any = None) -> OverlapRegion:
    """A new :class:`OverlapRegion` (use it in a ``with`` block).

    Args:
        device: the CUDA device (default: the default communicator's, else the current one).
        priority: the communication stream's priority ("high" (default), "normal", "low").
    """
    return OverlapRegion(device, priority)


def in_ordered_context() -> bool:
    """Inside a pipeline stage or an overlap region's submission: Level-1 collectives run on
    the current stream with the communicator's order kept across streams."""
    return getattr(_tls, "region", 0) > 0 or getattr(_tls, "stage", 0) > 0


# ---------------------------------------------------------------------------- pipeline

class Pipeline:
    """Stages run over micro-batches so that one micro-batch's communication overlaps another
    micro-batch's compute (the design's Strategy 3).

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
    current stream waits for the last stage at the end (no host blocking). Level-1
    collectives in a stage run on the stage's stream, chained with the communicator's other
    collectives so they run in call order. CPU: stages run one after another in the same
    order.

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
        parts = [split[0][j] if len(xs) == 1 else tuple(p[j] for p in split) for j in range(c)]
        S = self.num_stages
        self.trace = []
        cuda = x.is_cuda
        if cuda:
            dev = x.device
            cur = torch.cuda.current_stream(dev)
            streams = self._streams.get(dev.index)
            if streams is None:
                streams = self._streams[dev.index] = [torch.cuda.Stream(device=dev)
                                                      for _ in range(S)]
            start = torch.cuda.Event()
            start.record(cur)
            ready: dict = {}
        vals: list = list(parts)
        _tls.stage = getattr(_tls, "stage", 0) + 1
        try:
            for t in range(c + S - 1):
                for i in range(S):
                    j = t - i
                    if not 0 <= j < c:
                        continue
                    self.trace.append((i, j))
                    if not cuda:
                        vals[j] = _call_stage(self._stages[i], vals[j])
                        continue
                    s = streams[i]
                    s.wait_event(ready[(i - 1, j)] if i else start)
                    for tt in _tensors([vals[j]]):
                        if tt.is_cuda:
                            tt.record_stream(s)
                    with torch.cuda.stream(s):
                        vals[j] = _call_stage(self._stages[i], vals[j])
                    ev = torch.cuda.Event()
                    ev.record(s)
                    ready[(i, j)] = ev
        finally:
            _tls.stage -= 1
        if cuda:
            for j in range(c):
                cur.wait_event(ready[(S - 1, j)])
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


# ---------------------------------------------------------------------------- ring

class Ring:
    """``with maco.ring(direction="forward"):`` — sends to the next rank and receives from the
    previous one (pipeline parallelism), issued together when the block ends so no rank
    waits on another's send.

    ``forward``: next = (rank + 1) % world_size, prev = (rank - 1) % world_size;
    ``backward``: the other way. Inside the block ``maco.send(x)`` sends to ``next``
    (``dst=`` may be given and must equal it) and ``maco.recv()`` receives from ``prev``
    (``src=`` likewise), with the shape and dtype of the last tensor sent in the block unless
    ``shape=``/``dtype=`` (or ``out=``) say otherwise. The received tensor is filled when the
    block ends (CUDA: stream-ordered on the current stream; CPU via torch.distributed: the
    host waits at the end of the block).

    CUDA tensors go through the default communicator as one ``maco.group()``; CPU tensors
    through torch.distributed's ``batch_isend_irecv`` on the default group.

    Raises: ValueError: a direction other than "forward"/"backward"; a dst/src that is not
    the ring's neighbour (named); a recv without a shape before any send.
    """

    def __init__(self, direction: str = "forward", comm: Any = None):
        if direction not in ("forward", "backward"):
            raise ValueError(f"direction: {direction!r}; accepts 'forward' or 'backward'")
        self.direction = direction
        self._comm = comm
        self._ops: list = []
        self._group = None
        self._last = None

    def _ranks(self) -> tuple:
        from . import _level1

        r, n = _level1._rank_size(self._comm)
        step = 1 if self.direction == "forward" else -1
        return r, n, (r + step) % n, (r - step) % n

    def __enter__(self) -> "Ring":
        from ._comm import group

        self.rank, self.world_size, self.next, self.prev = self._ranks()
        if getattr(_tls, "ring", None) is not None:
            raise InvalidUsageError("maco.ring: rings do not nest")
        _tls.ring = self
        self._group = group()
        self._group.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        _tls.ring = None
        try:
            self._group.__exit__(*exc)
        finally:
            ops, self._ops = self._ops, []
            if ops and exc[0] is None:
                import torch.distributed as dist

                for w in dist.batch_isend_irecv(ops):
                    w.wait()

    def _check_dst(self, dst: Optional[int]) -> int:
        if dst is None:
            return self.next
        if dst != self.next:
            raise ValueError(f"dst: {dst} is not the next rank {self.next} of this "
                             f"{self.direction} ring (rank {self.rank} of {self.world_size})")
        return dst

    def _check_src(self, src: Optional[int]) -> int:
        if src is None:
            return self.prev
        if src != self.prev:
            raise ValueError(f"src: {src} is not the previous rank {self.prev} of this "
                             f"{self.direction} ring (rank {self.rank} of {self.world_size})")
        return src

    def _recv_like(self, shape: Any, dtype: Any) -> tuple:
        if shape is None or dtype is None:
            if self._last is None:
                raise ValueError("recv: shape= and dtype= are needed before the ring's first "
                                 "send (they default to the last tensor sent)")
            shape = self._last[0] if shape is None else shape
            dtype = self._last[1] if dtype is None else dtype
        return shape, dtype


def ring(direction: str = "forward", comm: Any = None) -> Ring:
    """A :class:`Ring` for pipeline-parallel send/recv (use it in a ``with`` block).

    Args:
        direction: "forward" (to rank + 1) or "backward" (to rank - 1).
        comm: a :class:`maco.Communicator` (default: the default one; CPU tensors use
            torch.distributed's default group).
    """
    return Ring(direction, comm)


def current_ring() -> Optional[Ring]:
    """The :class:`Ring` this thread is inside, or None."""
    return getattr(_tls, "ring", None)
