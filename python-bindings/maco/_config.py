"""Global settings of the overlap API (``maco.config.set``) and the compute/communication split
in use (``maco.set_config``, ``@maco.dynamic_sm_config``, a block's split of
``maco.optimize_context(comm_sms=...)``), and how each maps onto MACO's C configuration. Where
a split comes from besides these (SM roles, a measurement) is maco/_sm.py.

The split in MACO's terms:

- ``comm_sms``: the most CTAs a collective kernel launches (``maco_collective_set_max_ctas``,
  MACO_COLL_MAX_CTAS; one CTA per SM is what those kernels are sized for), applied to a
  communicator before its next collective issued by the overlap API; in a persistent kernel
  (``maco.compile``, ``maco.PersistentContext``) the communication workers
  (``maco_persistent_config_t.comm_workers``).
- ``compute_sms``: the persistent kernel's compute workers (``.workers``). Eager PyTorch
  compute is not limited by it (CUDA gives a running kernel no SM limit except through green
  contexts: the overlap scope's ``compute`` and :class:`maco.Context` use them).
- ``scheduler_sms``: the persistent kernel's schedulers (``.schedulers``).

Thread-safety: the settings are process-wide and guarded by a lock; changing them while
another thread runs collectives is allowed but that thread's next collective sees the change.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional

from . import _maco
from ._default_comm import BACKEND_NAMES
from ._errors import InvalidUsageError
from ._types import INT_MAX

__all__ = ["SMSplit", "set_config", "get_config", "dynamic_sm_config", "config", "ConfigTable"]

_SM_POLICIES = ("auto", "manual", "dynamic")
_STRATEGIES = ("none", "conservative", "aggressive")
_FUSIONS = ("persistent", "copy_engine")
_FUSED_COMMS = ("auto", "sm", "copy_engine")  # maco.PersistentKernel's fused_comm
_SCRATCH_MIN, _SCRATCH_MAX = 1 << 20, 16 << 30  # src/host/base/config.c: MACO_SCRATCH_SIZE
_SIZE_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20,
               "MB": 1 << 20, "MIB": 1 << 20, "G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30}

_DEFAULTS = {
    "backend": "maco",
    "sm_policy": "auto",
    "overlap_strategy": "aggressive",
    "comm_buffer_size": None,
    "use_pinned_memory": True,
    "debug": False,
    "profile": False,
    "fusion": "copy_engine",
    "fused_comm": "sm",
}


class _State:
    """The process-wide settings and split, guarded by ``lock``.

    ``explicit``: the split of :func:`set_config`, :meth:`maco.SMConfig.apply` or a block's
    :func:`scoped_split`; ``measured``: :func:`maco.auto_config`'s; ``scope_depth``: overlap
    scopes running on any thread (sm_policy 'manual' refuses changes meanwhile)."""

    def __init__(self):
        self.lock = threading.RLock()
        self.settings: dict = dict(_DEFAULTS)
        self.explicit: Optional[SMSplit] = None
        self.measured: Optional[SMSplit] = None
        self.scope_depth = 0


_state = _State()


def scope_enter() -> None:
    """An overlap scope starts (any thread)."""
    with _state.lock:
        _state.scope_depth += 1


def scope_exit() -> None:
    """An overlap scope ends."""
    with _state.lock:
        _state.scope_depth -= 1


def parse_size(value: Any, name: str = "comm_buffer_size") -> int:
    """Bytes of ``value``: an int, or a string such as "256MB", "256M", "1GiB", "65536".

    Raises:
        ValueError: not a size (names ``name``).
    """
    if isinstance(value, bool):
        raise ValueError(f"{name}: {value!r} is not a size")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+)\s*([A-Za-z]*)\s*", value)
        unit = m.group(2).upper() if m else None
        if m is None or unit not in _SIZE_UNITS:
            raise ValueError(f"{name}: {value!r} is not a size (e.g. 268435456, '256MB', "
                             f"'256M', '1GiB')")
        n = int(m.group(1)) * _SIZE_UNITS[unit]
    else:
        raise ValueError(f"{name}: {value!r} is not a size (an int of bytes or a string)")
    return n


class ConfigTable:
    """``maco.config``: MACO's configuration, callable as before and with :meth:`set` and
    :meth:`get` for the overlap API's settings.

    ``maco.config()`` returns the C library's table: one ``(name, type, default, unit, doc)``
    per MACO_* variable (docs/configuration.md).

    ``maco.config.set(**settings)`` changes these settings (each maps onto MACO's C side as
    written; unknown names raise ``TypeError`` naming them; bad values ``ValueError`` naming
    the setting and what it accepts):

    ============== ===================================================================
    backend        MACO has one backend (NVLink/PCIe kernels, proxies for IB/TCP):
                   "maco", or the design's names for it, "nvshmem" and "nccl_optimized"
                   (MACO does not use NVSHMEM; its memory channels do that job); "nccl"
                   and "gloo" are refused: they are torch.distributed's backends.
    sm_policy      where the compute/communication split comes from: "auto" (default:
                   the last :func:`auto_config` measurement applied, else MACO's
                   defaults), "manual" (:func:`set_config` / :meth:`SMConfig.apply`
                   required before a collective of the overlap API; changes refused
                   while an overlap scope runs), "dynamic" (like manual, changes allowed
                   at any time, e.g. prefill vs decode).
    overlap_strategy how overlap scopes (``optimize``, ``auto_overlap``...) treat a
                   collective: "none" (runs on the caller's stream, no overlap),
                   "conservative" (overlaps the one torch operation that follows it,
                   then is waited for), "aggressive" (default: overlaps everything up
                   to the first use of its tensors or the end of the scope).
    comm_buffer_size scratch per rank for collectives: sets MACO_SCRATCH_SIZE (1 MiB to
                   16 GiB) for communicators created afterwards (the C library reads it
                   at creation); an int of bytes or "256MB" / "256M" / "1GiB".
    use_pinned_memory True only: MACO always stages host copies through pinned buffers;
                   False is refused with that reason.
    debug          True: overlap scopes wait for each collective right after issuing it
                   and check the communicator's asynchronous error
                   (``maco_comm_get_async_error``); also sets MACO_LOG_LEVEL=debug,
                   which the C library reads when it first logs (a process that already
                   logged keeps its level: MACO has no call to change it later).
    profile        True: persistent kernels made by :func:`maco.compile` and
                   :class:`maco.PersistentContext` record per-task profiles
                   (``maco_persistent_config_t.profile``), shown by ``maco.profiler``.
    fusion         what ``torch.ops.maco.gemm_allreduce`` (``maco.compile``) runs on CUDA:
                   "copy_engine" (default: :func:`maco.tp.gemm_allreduce`, cuBLAS GEMMs
                   in row chunks with the transfers on the copy engines; it keeps a
                   contiguous copy of each transposed weight) or "persistent" (MACO's fused
                   GEMM + allreduce persistent kernel,
                   ``maco_task_graph_add_gemm_allreduce``: bf16, n a multiple of 128 and
                   k of 32; other shapes and types take the copy engines' path). The
                   default and its measurement: docs/performance.md. Read at each call.
    fused_comm     how that persistent kernel (``fusion="persistent"``) moves data: "sm"
                   (default), "copy_engine" or "auto" (per shape,
                   ``maco.persistent.choose_fused_comm``) (:class:`maco.PersistentKernel`'s
                   ``fused_comm``; docs/persistent.md, "Copy-engine mode": not yet working on
                   a GPU). Read when a call site's kernel is built (once per site and shape).
    ============== ===================================================================

    Thread-safe (one lock). Settings are per process; ranks should set the same values
    (``sm_policy``, the split and ``comm_buffer_size`` must agree across ranks).
    """

    def __call__(self) -> list:
        """MACO's configuration table: ``(name, type, default, unit, doc)`` per MACO_*
        variable."""
        return _maco.config()

    def set(self, **settings: Any) -> None:
        """Changes the overlap API's settings (see the class docstring); all are checked
        before any is applied.

        Raises:
            TypeError: an unknown setting (named, with the known ones).
            ValueError: a bad value (the setting, the value and what it accepts).
        """
        new = {}
        for k, v in settings.items():
            if k not in _DEFAULTS:
                raise TypeError(f"maco.config.set: unknown setting {k!r}; known: "
                                f"{', '.join(sorted(_DEFAULTS))}")
            new[k] = _check_setting(k, v)
        with _state.lock:
            _state.settings.update(new)
        if new.get("comm_buffer_size") is not None:
            os.environ["MACO_SCRATCH_SIZE"] = str(new["comm_buffer_size"])
        if new.get("debug"):
            os.environ["MACO_LOG_LEVEL"] = "debug"

    def get(self, name: Optional[str] = None) -> Any:
        """The value of setting ``name``, or all settings as a dict (with the split in use:
        ``compute_sms``, ``comm_sms``, ``scheduler_sms``) when ``name`` is None.

        Raises: TypeError: an unknown name."""
        with _state.lock:
            if name is None:
                d = dict(_state.settings)
                s = current_split()
                d.update(compute_sms=s.compute_sms if s else None,
                         comm_sms=s.comm_sms if s else None,
                         scheduler_sms=s.scheduler_sms if s else None)
                return d
            if name in ("compute_sms", "comm_sms", "scheduler_sms"):
                s = current_split()
                return getattr(s, name) if s else None
            if name not in _state.settings:
                raise TypeError(f"maco.config.get: unknown setting {name!r}; known: "
                                f"{', '.join(sorted(_state.settings))}")
            return _state.settings[name]

    def reset(self) -> None:
        """Restores every setting's default and forgets the split (explicit and measured).
        Environment variables already set (MACO_SCRATCH_SIZE, MACO_LOG_LEVEL) stay."""
        with _state.lock:
            _state.settings = dict(_DEFAULTS)
            _state.explicit = None
            _state.measured = None

    def __repr__(self) -> str:
        return f"maco.config({self.get()})"


def _check_setting(k: str, v: Any) -> Any:
    if k == "backend":
        if v in BACKEND_NAMES:
            return "maco"
        raise ValueError(f"backend: {v!r}; MACO has one backend, 'maco' (its own kernels over "
                         "NVLink/PCIe and proxies for IB/TCP; the design's 'nvshmem' and "
                         "'nccl_optimized' name it too); torch.distributed keeps 'nccl' and "
                         "'gloo' for what does not run on MACO")
    if k == "sm_policy":
        if v not in _SM_POLICIES:
            raise ValueError(f"sm_policy: {v!r}; accepts {', '.join(_SM_POLICIES)}")
        return v
    if k == "overlap_strategy":
        if v not in _STRATEGIES:
            raise ValueError(f"overlap_strategy: {v!r}; accepts {', '.join(_STRATEGIES)}")
        return v
    if k == "comm_buffer_size":
        if v is None:
            return None
        n = parse_size(v)
        if not _SCRATCH_MIN <= n <= _SCRATCH_MAX:
            raise ValueError(f"comm_buffer_size: {n} bytes is outside MACO_SCRATCH_SIZE's "
                             f"range [{_SCRATCH_MIN}, {_SCRATCH_MAX}] (1 MiB to 16 GiB)")
        return n
    if k == "use_pinned_memory":
        if v is True:
            return True
        raise ValueError("use_pinned_memory: only True; MACO always stages host copies "
                         "through pinned buffers and has no unpinned path")
    if k == "fusion":
        if v not in _FUSIONS:
            raise ValueError(f"fusion: {v!r}; accepts {', '.join(_FUSIONS)}")
        return v
    if k == "fused_comm":
        if v not in _FUSED_COMMS:
            raise ValueError(f"fused_comm: {v!r}; accepts {', '.join(_FUSED_COMMS)}")
        return v
    if k in ("debug", "profile"):
        if not isinstance(v, bool):
            raise ValueError(f"{k}: {v!r} is not a bool")
        return v
    raise TypeError(k)  # unreachable: checked by the caller


config = ConfigTable()


def setting(name: str) -> Any:
    """One setting's value (internal, no checks)."""
    return _state.settings[name]


def snapshot(*names: str) -> tuple:
    """The explicit split and the settings ``names``, for :func:`restore`."""
    with _state.lock:
        return _state.explicit, {n: _state.settings[n] for n in names}


def restore(saved: tuple) -> None:
    """Puts back what :func:`snapshot` saved."""
    with _state.lock:
        _state.explicit = saved[0]
        _state.settings.update(saved[1])


def override(name: str, value: Any) -> None:
    """Sets one setting without the checks of :meth:`ConfigTable.set` (a value it accepts)."""
    with _state.lock:
        _state.settings[name] = value


# ---------------------------------------------------------------------------- the split


@dataclass(frozen=True)
class SMSplit:
    """A compute/communication split of a GPU's SMs.

    Attributes:
        compute_sms: SMs (persistent kernel: compute workers) for compute; None: default.
        comm_sms: the most CTAs a collective launches (persistent kernel: communication
            workers); None: no cap (MACO's default).
        scheduler_sms: the persistent kernel's scheduler CTAs; None: default.
        total_sms: the SMs the split was made for (None: not known).
        source: "set_config", "SMConfig", "auto_config".
        times: auto_config's measurement, seconds per candidate comm_sms (max over ranks).
    """

    compute_sms: Optional[int] = None
    comm_sms: Optional[int] = None
    scheduler_sms: Optional[int] = None
    total_sms: Optional[int] = None
    source: str = "set_config"
    times: dict = field(default_factory=dict)

    def persistent_config(self) -> dict:
        """Keyword arguments for :class:`maco.PersistentKernel`: ``num_workers``,
        ``num_schedulers``, ``num_comm_workers`` (0 where the split leaves it to MACO)."""
        return {"num_workers": self.compute_sms or 0,
                "num_schedulers": self.scheduler_sms or 0,
                "num_comm_workers": self.comm_sms or 0}


def sm_count(value: Any, name: str, allow_none: bool = True) -> Optional[int]:
    """``value`` checked as a number of SMs: a positive int up to 2**31 - 1 (the C library's
    CTA counts are ints; None passes when allowed).

    Raises: ValueError naming ``name``."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= INT_MAX:
        raise ValueError(f"{name}: {value!r} is not a positive number of SMs (at most "
                         "2**31 - 1)")
    return value


def current_split() -> Optional[SMSplit]:
    """The split in use: the explicit one, else (sm_policy 'auto') the measured one, else
    None (MACO's defaults)."""
    with _state.lock:
        if _state.explicit is not None:
            return _state.explicit
        if _state.settings["sm_policy"] == "auto":
            return _state.measured
        return None


def required_split() -> Optional[SMSplit]:
    """:func:`current_split`, raising under sm_policy 'manual' or 'dynamic' when none was
    set (the overlap API calls it before a collective)."""
    s = current_split()
    policy = _state.settings["sm_policy"]
    if s is None and policy in ("manual", "dynamic"):
        raise InvalidUsageError(f"sm_policy={policy!r}: no split set; call "
                                "maco.set_config(compute_sms=..., comm_sms=...) or "
                                "SMConfig.apply() first (or maco.config.set(sm_policy='auto'))")
    return s


def set_split(split: SMSplit, who: str) -> SMSplit:
    """Makes ``split`` the explicit split (``who`` names the caller in the error).

    Raises:
        InvalidUsageError: sm_policy 'manual' while an overlap scope runs and a split is set.
    """
    with _state.lock:
        if (_state.settings["sm_policy"] == "manual" and _state.scope_depth
                and _state.explicit is not None):
            raise InvalidUsageError(f"{who}: sm_policy='manual' fixes the split while an "
                                    "overlap scope runs; use sm_policy='dynamic' to change it "
                                    "between steps")
        _state.explicit = split
        return split


def set_measured(split: SMSplit) -> None:
    """Makes ``split`` (maco.auto_config's) the measured split."""
    with _state.lock:
        _state.measured = split


def set_config(compute_sms: Optional[int] = None, comm_sms: Optional[int] = None, *,
               scheduler_sms: Optional[int] = None, total_sms: Optional[int] = None) -> SMSplit:
    """Sets the compute/communication split used from the next collective of the overlap API
    on (every rank must set the same values: the CTA cap is collective), e.g. more compute SMs
    for prefill and more communication SMs for decode.

    Args:
        compute_sms: compute SMs (persistent kernels' compute workers); None: default. Eager
            PyTorch compute is not limited by it (only green contexts can: maco.Context).
        comm_sms: the cap on collective kernels' CTAs (``maco_collective_set_max_ctas``) and
            persistent kernels' communication workers; None: no cap.
        scheduler_sms: persistent kernels' schedulers; None: default.
        total_sms: the GPU's SMs, to check the sum against (None: not checked here; the C
            library checks a persistent kernel's CTAs against the GPU when it is created).

    Returns: the :class:`SMSplit` now in use.
    Raises:
        ValueError: a count not positive, or the sum above ``total_sms`` (both named).
        InvalidUsageError: sm_policy 'manual' while an overlap scope runs (use 'dynamic').
    Not blocking here: the cap is applied (collectively, over the bootstrap) before the
    next collective on each communicator.
    """
    c = sm_count(compute_sms, "compute_sms")
    m = sm_count(comm_sms, "comm_sms")
    s = sm_count(scheduler_sms, "scheduler_sms")
    t = sm_count(total_sms, "total_sms")
    used = (c or 0) + (m or 0) + (s or 0)
    if t is not None and used > t:
        raise ValueError(f"compute_sms={c} + comm_sms={m} + scheduler_sms={s} = {used} exceed "
                         f"total_sms={t}")
    return set_split(SMSplit(c, m, s, t, "set_config"), "maco.set_config")


def get_config() -> Optional[SMSplit]:
    """The split in use (None: MACO's defaults); see :func:`set_config`."""
    return current_split()


def clear_config() -> None:
    """Forgets the split set by :func:`set_config` or :meth:`SMConfig.apply`."""
    with _state.lock:
        _state.explicit = None


@contextlib.contextmanager
def scoped_split(compute_sms: Optional[int] = None, comm_sms: Optional[int] = None
                 ) -> Iterator[Optional[SMSplit]]:
    """The split for a block: ``compute_sms`` and ``comm_sms`` where given, the other fields
    from the split in use; the split from before the block is put back at its end. Nothing
    changes when both are None (yields None). An explicit request for a block, so not refused
    under sm_policy 'manual' as :func:`set_config` is while a scope runs. The communicators'
    CTA caps follow the split at their next collective of the overlap API; putting the caps
    back is the caller's (maco/_streams.py's ``caps_restored``).

    Raises: ValueError: a count that is not a positive int (named)."""
    c = sm_count(compute_sms, "compute_sms")
    m = sm_count(comm_sms, "comm_sms")
    if c is None and m is None:
        yield None
        return
    saved = snapshot()
    base = current_split() or SMSplit()
    split = SMSplit(c if c is not None else base.compute_sms,
                    m if m is not None else base.comm_sms, base.scheduler_sms, base.total_sms,
                    "scope")
    with _state.lock:
        _state.explicit = split
    try:
        yield split
    finally:
        restore(saved)


def dynamic_sm_config(fn: Callable) -> Callable:
    """Decorator: inside ``fn``, sm_policy is 'dynamic' (so :func:`set_config` may change the
    split, e.g. prefill vs decode) and after each call the split and policy from before the
    call are restored. Thread-safety: the settings are process-wide; do not run decorated
    functions of different splits on several threads at once."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        saved = snapshot("sm_policy")
        with _state.lock:
            _state.settings["sm_policy"] = "dynamic"
        try:
            return fn(*args, **kwargs)
        finally:
            restore(saved)

    return wrapper
