"""The overlap API's entry point: the overlap scope, ``maco.optimize_context()`` — a block (or,
as a decorator, a function) in which collectives overlap the compute that follows them — and
the seeds' other names for it (``auto_overlap``, ``@optimize_comm``, ``@optimize``).
docs/python.md, "The overlap API", says which name is which layer over it.

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

import contextlib
import functools
import inspect
import sys
import threading
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

from . import _config
from ._default_comm import get_default_communicator, is_initialized
from ._errors import InvalidUsageError
from ._region import Future, OverlapRegion
from ._sm import green_context
from ._streams import (_META, _Handle, _Inside, _func_name, _inside, _is_compiling, _key,
                       _priority, _tensors, _tls, _work_handle, apply_split, async_tensor,
                       caps_restored)

__all__ = ["optimize_context", "optimize_comm", "optimize", "auto_overlap", "wait_all"]

_lock = threading.RLock()


def _is_write(name: str, kwargs: dict) -> bool:
    if "out" in kwargs:
        return True
    if name == "__setitem__" or (name.startswith("__i") and name.endswith("__")):
        return True
    return name.endswith("_") and not name.endswith("__")


class _Pending:
    __slots__ = ("handle", "outs", "ins", "conservative")

    def __init__(self, handle: _Handle, outs: set, ins: set, conservative: bool):
        self.handle, self.outs, self.ins, self.conservative = handle, outs, ins, conservative


class _ModeClass:
    """The first-use TorchFunctionMode class, made at first use (it needs torch)."""

    cls: Any = None


def _first_use_mode(scope: "OverlapScope") -> Any:
    if _ModeClass.cls is None:
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

        _ModeClass.cls = _FirstUse
    return _ModeClass.cls(scope)


# ---------------------------------------------------------------------------- torch.distributed

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


class _Wrappers:
    """The scope-aware wrappers on torch.distributed's functions: installed while any scope
    runs (``count`` scopes), ``installed``: name -> (our wrapper, what it replaced)."""

    def __init__(self):
        self.count = 0
        self.installed: dict = {}
        self.signatures: dict = {}


_wrappers = _Wrappers()


def _current_scope() -> Optional["OverlapScope"]:
    st = _tls.scopes
    return st[-1] if st else None


def _install() -> None:
    """Puts the scope-aware wrappers on torch.distributed's functions (once per outermost
    scope; a wrapper passes calls of threads without a scope straight through)."""
    import torch.distributed as dist

    with _lock:
        _wrappers.count += 1
        for name in _DIST:
            cur = getattr(dist, name)
            if getattr(cur, "__maco_scope__", False):
                continue
            _wrappers.signatures.setdefault(name, inspect.signature(inspect.unwrap(cur)))
            w = _make_dist_wrapper(name, cur)
            _wrappers.installed[name] = (w, cur)
            setattr(dist, name, w)
            setattr(dist.distributed_c10d, name, w)


def _uninstall() -> None:
    import torch.distributed as dist

    with _lock:
        _wrappers.count -= 1
        if _wrappers.count > 0:
            return
        for name, (w, prev) in list(_wrappers.installed.items()):
            if getattr(dist, name) is w:  # someone else re-patched it since: leave theirs
                setattr(dist, name, prev)
            if getattr(dist.distributed_c10d, name) is w:
                setattr(dist.distributed_c10d, name, prev)
        _wrappers.installed.clear()


def _make_dist_wrapper(name: str, prev: Callable) -> Callable:
    @functools.wraps(prev)
    def wrapper(*args, **kwargs):
        scope = _current_scope()
        if scope is None or _inside() or _is_compiling():
            return prev(*args, **kwargs)
        return scope._dist_call(name, prev, args, kwargs)

    wrapper.__maco_scope__ = True
    return wrapper


class _Greens:
    """Green contexts the scopes made, per (device index, SMs): ``(context or None, why)``."""

    made: dict = {}


# ---------------------------------------------------------------------------- the scope

class OverlapScope:
    """The overlap scope (``maco.optimize_context()``; see the module's text and
    :func:`optimize_context` for the options). Use it in a ``with`` block, or as a decorator
    (each call of the function runs in a fresh scope with the same options)."""

    def __init__(self, redirect: bool = True, *, priority: Any = None,
                 comm_sms: Optional[int] = None, compute_sms: Optional[int] = None,
                 device: Any = None, what: str = "optimize_context"):
        if priority is not None:
            _priority(priority)  # checks it
        _config.sm_count(comm_sms, "comm_sms")
        _config.sm_count(compute_sms, "compute_sms")
        self.redirect = redirect
        self.priority = priority
        self.comm_sms = comm_sms
        self.compute_sms = compute_sms
        self.device = device
        self.what = what
        self.pending: list = []
        self._mode = None
        self._dist = False
        self._region: Optional[OverlapRegion] = None
        self._block: Optional[contextlib.ExitStack] = None

    def _fresh(self) -> "OverlapScope":
        return OverlapScope(self.redirect, priority=self.priority, comm_sms=self.comm_sms,
                            compute_sms=self.compute_sms, device=self.device, what=self.what)

    def __call__(self, fn: Callable) -> Callable:
        """Decorator: each call of ``fn`` runs in a fresh scope with these options (under
        ``torch.compile`` tracing, ``fn`` runs as written). Raises TypeError: not callable."""
        if not callable(fn):
            raise TypeError(f"{self.what}: {fn!r} is not callable")

        @functools.wraps(fn)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if _is_compiling():
                return fn(*args, **kwargs)
            with self._fresh():
                return fn(*args, **kwargs)

        wrapper.__maco_optimized__ = True
        return wrapper

    # -------------------------------------------------------------- enter / exit

    def __enter__(self) -> "OverlapScope":
        if _is_compiling():
            return self
        torch = sys.modules.get("torch")
        self._block = contextlib.ExitStack()
        try:
            if self.comm_sms is not None or self.compute_sms is not None:
                self._block.enter_context(_config.scoped_split(self.compute_sms, self.comm_sms))
                self._block.enter_context(caps_restored())
        except BaseException:
            self._block.close()
            raise
        _config.scope_enter()
        _tls.scopes.append(self)
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
            block, self._block = self._block, None
            block.close()
            raise
        return self

    def __exit__(self, *exc: Any) -> None:
        if _is_compiling():
            return
        try:
            if self._mode is not None:
                self._mode.__exit__(*exc)
                self._mode = None
            if self._region is not None:
                region, self._region = self._region, None
                region.__exit__(*exc)
        finally:
            pending, self.pending = self.pending, []
            self._leave()
            outer = _current_scope()
            try:
                if outer is not None and exc[0] is None and not _config.setting("debug"):
                    outer.pending.extend(pending)  # they overlap what the enclosing scope does
                else:
                    with _Inside():
                        for p in pending:
                            p.handle.wait()
            finally:
                block, self._block = self._block, None
                if block is not None:
                    block.close()  # the split and the CTA caps from before the block

    def _leave(self) -> None:
        st = _tls.scopes
        if st and st[-1] is self:
            st.pop()
        if self._dist:
            _uninstall()
            self._dist = False
        _config.scope_exit()

    def _run_handing_over(self, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """``fn(*args, **kwargs)`` in this scope; collectives still pending at its end go to
        the enclosing scope, else a single returned tensor waits for its own at first use
        (an ``AsyncCollectiveResult``) and the rest are waited for now (maco.Module)."""
        if _is_compiling():
            return fn(*args, **kwargs)
        self.__enter__()
        try:
            out = fn(*args, **kwargs)
        except BaseException:
            self.__exit__(*sys.exc_info())
            raise
        pending, self.pending = self.pending, []
        self.__exit__(None, None, None)
        return _hand_over(pending, out)

    # -------------------------------------------------------------- submissions and compute

    def submit_compute(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Runs ``fn(*args, **kwargs)`` (torch compute) beside the scope's communication on a
        compute stream of the scope's device; returns a :class:`maco.Future` (as
        :meth:`maco.OverlapRegion.submit_compute`; the scope's end waits for it)."""
        return self._submissions().submit_compute(fn, *args, **kwargs)

    def submit_comm(self, fn: Callable, *args: Any, **kwargs: Any) -> Future:
        """Runs ``fn(*args, **kwargs)`` (collectives) on the communication stream of the
        scope's priority beside its compute; returns a :class:`maco.Future` (as
        :meth:`maco.OverlapRegion.submit_comm`; the scope's end waits for it)."""
        return self._submissions().submit_comm(fn, *args, **kwargs)

    def _submissions(self) -> OverlapRegion:
        if self._block is None:
            raise InvalidUsageError(f"{self.what}: submit inside the with block")
        if self._region is None:
            region = OverlapRegion(self.device, self.priority)
            region.__enter__()
            self._region = region
        return self._region

    def compute(self, fn: Callable, *args: Any, **kwargs: Any) -> Any:
        """Runs ``fn(*args, **kwargs)`` (PyTorch work) and returns what it returns: inside a
        CUDA green context of ``compute_sms`` SMs when the scope has ``compute_sms`` and the
        driver gives one (else, with a RuntimeWarning once per device and count, without an SM
        limit), ordered after the caller's current stream and the caller's stream after it,
        as if it had run there."""
        green = self._green()
        if green is None:
            return fn(*args, **kwargs)
        green.set_context()  # the current stream waits; work goes to the green stream
        try:
            return fn(*args, **kwargs)
        finally:
            green.pop_context()  # the caller's stream waits for the green stream

    def _green(self) -> Any:
        if self.compute_sms is None:
            return None
        torch = sys.modules.get("torch")
        if torch is None or not torch.cuda.is_available():
            return None
        dev = self.device
        if dev is None:
            dev = (get_default_communicator().device if is_initialized()
                   else torch.cuda.current_device())
        d = torch.device("cuda", dev) if isinstance(dev, int) else torch.device(dev)
        key = (d.index if d.index is not None else torch.cuda.current_device(),
               self.compute_sms)
        with _lock:
            made = _Greens.made.get(key)
            if made is None:
                made = _Greens.made[key] = green_context(self.compute_sms,
                                                         torch.device("cuda", key[0]))
                if made[0] is None:
                    warnings.warn(f"maco.optimize_context: compute runs without an SM limit: "
                                  f"{made[1]}", RuntimeWarning, stacklevel=3)
        return made[0]

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
        sig = _wrappers.signatures[name]
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
        redirect = self.redirect and bool(outs + ins) and all(
            t.is_cuda and t.is_contiguous() for t in outs + ins)
        if user_async or strategy == "none":
            return self._dist_issue(name, prev, redirect, a, user_async)
        self.before_issue(outs + ins)
        a["async_op"] = True
        work = self._dist_issue(name, prev, redirect, a, True)
        if work is None:  # e.g. this rank is not in the group
            return None
        self.add(_work_handle(work, name), outs, ins)
        return None

    def _dist_issue(self, name: str, prev: Callable, redirect: bool, a: dict,
                    async_op: bool) -> Any:
        """torch.distributed's ``name`` with arguments ``a``: with ``redirect``, on the
        group's MACO communicator (maco.torch's route, after applying the split to it) when
        MACO takes the call; else (or when it does not) the original function ``prev``."""
        a = dict(a, async_op=async_op)
        if redirect:
            from . import _routes  # needs torch, which CUDA tensors mean is loaded

            route = _routes.ROUTES.get(name)
            tensors = _tensors(a.values())
            if route is not None:
                try:
                    with _Inside():
                        m = _routes.pg_or_fallback(a.get("group"), *tensors)
                        apply_split(m.comm)
                    return route(prev, **a)
                except _routes.Fallback:
                    pass
        return prev(**a)


def _hand_over(pending: list, out: Any) -> Any:
    """Collectives still pending at the end of a maco.Module's forward: to the enclosing
    scope; else the returned tensor waits at its first use; the rest is waited for now."""
    if not pending:
        return out
    outer = _current_scope()
    if outer is not None:
        outer.pending.extend(pending)
        return out
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(out, torch.Tensor):
        k = _key(out)
        mine = [p for p in pending if k in p.outs]
        for p in pending:
            if p not in mine:
                p.handle.wait()
        if mine:
            h = mine[0].handle
            if len(mine) > 1:
                group: list = []
                for p in mine:
                    p.handle.group = group
                    group.append(p.handle)
            return async_tensor(out, h)
        return out
    for p in pending:
        p.handle.wait()
    return out


# ---------------------------------------------------------------------------- the names

def optimize_context(redirect: bool = True, *, priority: Any = None,
                     comm_sms: Optional[int] = None, compute_sms: Optional[int] = None,
                     device: Any = None) -> OverlapScope:
    """The overlap API's entry point: a scope (``with maco.optimize_context(): ...``, or
    ``@maco.optimize_context(...)`` on a function) in which collectives run on MACO and
    overlap the compute that follows them.

    Inside it, on this thread:

    - ``torch.distributed`` collectives (all_reduce, all_gather(_into_tensor),
      reduce_scatter(_tensor), broadcast, reduce, all_to_all(_single)) on contiguous CUDA
      tensors run on MACO (``redirect=True``; through the group's MACO communicator, made at
      its first call as :func:`maco.patch_torch_distributed` does); other tensors (CPU) stay
      on the group's own backend (Gloo); with ``redirect=False`` all stay on their backend.
      Each is issued asynchronously and returns None (``async_op=True`` calls return their
      work, as torch.distributed's do, and are the caller's to wait for).
    - ``maco.allreduce`` and the other Level-1 collectives are issued on a communication
      stream and return their output tensor at once.
    - Each collective is waited for at the first use of its result (see the module's text)
      or at the end of the scope, whichever is first; ``maco.config.set(overlap_strategy=)``
      changes this ("none", "conservative").
    - ``scope.submit_compute(fn, ...)`` and ``scope.submit_comm(fn, ...)`` run functions
      beside each other and return :class:`maco.Future` s (as :class:`maco.OverlapRegion`);
      ``scope.compute(fn, ...)`` runs compute on ``compute_sms`` SMs (a CUDA green context);
      ``scope.wait_all()`` waits for every pending collective.

    Args:
        redirect: run torch.distributed's CUDA collectives on MACO (True) or leave them on
            their backend, made asynchronous (False: :func:`auto_overlap`).
        priority: the communication stream's priority for the scope's collectives and
            submissions: "high" (default), "normal", "low" or a CUDA priority (int); a
            collective's own ``priority=`` wins.
        comm_sms: for the block, the most CTAs a collective kernel launches (the split's
            ``comm_sms``, as :func:`maco.set_config`; applied to a communicator before its
            next collective of the overlap API, collectively; the caps from before are put
            back at the end of the block). Every rank passes the same value.
        compute_sms: for the block, the split's ``compute_sms`` (persistent kernels' compute
            workers) and the SMs of ``scope.compute``.
        device: the CUDA device of submissions and ``compute`` (default: the default
            communicator's, else the current one).

    Streams: the caller's current stream is the compute stream; at exit it is ordered after
    every collective of the scope (no host blocking on CUDA). Scopes nest: an inner scope's
    collectives still pending at its end are handed to the enclosing one. Under
    ``torch.compile`` tracing the scope does nothing (compiled graphs schedule their own
    collectives: use ``backend="maco"``).

    Thread-safety: the scope belongs to the thread that entered it; torch.distributed's
    functions are wrapped process-wide while any scope runs, and calls from threads without a
    scope pass through unchanged.

    Raises: ValueError: a bad ``priority``, ``comm_sms`` or ``compute_sms`` (at the call);
    (at a collective) what the collective raises; InvalidUsageError under sm_policy
    'manual'/'dynamic' without a split.
    """
    return OverlapScope(redirect, priority=priority, comm_sms=comm_sms, compute_sms=compute_sms,
                        device=device)


def auto_overlap() -> OverlapScope:
    """``optimize_context(redirect=False)``: each collective overlaps the compute that follows
    it, up to the first use of its result (``with maco.auto_overlap(): ...``), and
    ``torch.distributed`` collectives stay on their own backend (NCCL, Gloo), made
    asynchronous and waited for at first use; ``maco.*`` collectives run on MACO as always.
    The design's "each allreduce overlaps the next matmul" is the case where the next matmul
    does not read the allreduce's result; a matmul that does read it waits (it must)."""
    return OverlapScope(False, what="auto_overlap")


def optimize_comm(fn: Callable) -> Callable:
    """Decorator, ``optimize_context()`` applied to ``fn``: each call of ``fn`` runs in a
    scope (collectives on MACO, each overlapping the compute that follows it; those still
    running when ``fn`` returns are waited for then, or, when the call is inside another
    scope, handed to it so they overlap what the caller does next).

    ::

        @maco.optimize_comm
        def my_forward(x, weight):
            y = torch.matmul(x, weight)
            y = maco.allreduce(y)
            return y

    Raises: TypeError when ``fn`` is not callable."""
    return OverlapScope(True, what="optimize_comm")(fn)


def optimize(cls_or_module: Any) -> Any:
    """Class decorator for an ``nn.Module`` (or a module instance): its ``forward`` is wrapped
    by :func:`optimize_comm` (each call runs in ``optimize_context()``), so
    ``dist.all_reduce`` and ``maco.allreduce`` in it run on MACO and overlap what follows.
    Returns the class (or the instance) itself.

    Raises: TypeError for anything that is not an nn.Module class or instance."""
    import torch

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
    scopes = list(_tls.scopes)
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
    for sc in list(_tls.scopes):
        sc.wait_all()
