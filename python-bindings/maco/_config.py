"""Global settings of the overlap API (``maco.config.set``), SM roles (``maco.SMConfig``,
``maco.Role``), the compute/communication split (``maco.set_config``, ``maco.auto_config``,
``@maco.dynamic_sm_config``), and how each maps onto MACO's C configuration.

The split in MACO's terms:

- ``comm_sms``: the most CTAs a collective kernel launches (``maco_collective_set_max_ctas``,
  MACO_COLL_MAX_CTAS; one CTA per SM is what those kernels are sized for), applied to a
  communicator before its next collective issued by the overlap API; in a persistent kernel
  (``maco.compile``, ``maco.PersistentContext``) the communication workers
  (``maco_persistent_config_t.comm_workers``).
- ``compute_sms``: the persistent kernel's compute workers (``.workers``). Eager PyTorch
  compute is not limited by it (CUDA gives a running kernel no SM limit except through green
  contexts: :class:`maco.Context` uses them).
- ``scheduler_sms``: the persistent kernel's schedulers (``.schedulers``).

Thread-safety: the settings are process-wide and guarded by a lock; changing them while
another thread runs collectives is allowed but that thread's next collective sees the change.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import json
import os
import re
import sys
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Optional, Sequence

from . import _maco
from ._errors import InvalidUsageError

__all__ = ["Role", "SMConfig", "SMSplit", "auto_config", "set_config", "get_config",
           "dynamic_sm_config", "config", "ConfigTable"]

_lock = threading.RLock()

_SM_POLICIES = ("auto", "manual", "dynamic")
_STRATEGIES = ("none", "conservative", "aggressive")
_FUSIONS = ("persistent", "copy_engine")
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
}
_settings: dict = dict(_DEFAULTS)

# The split: explicit (set_config / SMConfig.apply), measured (auto_config), or None.
_explicit: Optional["SMSplit"] = None
_measured: Optional["SMSplit"] = None
_scope_depth = 0  # overlap scopes running (any thread): 'manual' forbids changes meanwhile


def _scope_enter() -> None:
    global _scope_depth
    with _lock:
        _scope_depth += 1


def _scope_exit() -> None:
    global _scope_depth
    with _lock:
        _scope_depth -= 1


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
                   ``maco_task_graph_add_gemm_allreduce``). The default is the faster one
                   measured on 2 H200s: the persistent kernel's GEMM tiles reach 81% of
                   cuBLAS (docs/performance.md). Read at each call.
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
        with _lock:
            _settings.update(new)
        if new.get("comm_buffer_size") is not None:
            os.environ["MACO_SCRATCH_SIZE"] = str(new["comm_buffer_size"])
        if new.get("debug"):
            os.environ["MACO_LOG_LEVEL"] = "debug"

    def get(self, name: Optional[str] = None) -> Any:
        """The value of setting ``name``, or all settings as a dict (with the split in use:
        ``compute_sms``, ``comm_sms``, ``scheduler_sms``) when ``name`` is None.

        Raises: TypeError: an unknown name."""
        with _lock:
            if name is None:
                d = dict(_settings)
                s = current_split()
                d.update(compute_sms=s.compute_sms if s else None,
                         comm_sms=s.comm_sms if s else None,
                         scheduler_sms=s.scheduler_sms if s else None)
                return d
            if name in ("compute_sms", "comm_sms", "scheduler_sms"):
                s = current_split()
                return getattr(s, name) if s else None
            if name not in _settings:
                raise TypeError(f"maco.config.get: unknown setting {name!r}; known: "
                                f"{', '.join(sorted(_settings))}")
            return _settings[name]

    def reset(self) -> None:
        """Restores every setting's default and forgets the split (explicit and measured).
        Environment variables already set (MACO_SCRATCH_SIZE, MACO_LOG_LEVEL) stay."""
        global _explicit, _measured
        with _lock:
            _settings.clear()
            _settings.update(_DEFAULTS)
            _explicit = None
            _measured = None

    def __repr__(self) -> str:
        return f"maco.config({self.get()})"


def _check_setting(k: str, v: Any) -> Any:
    if k == "backend":
        if v in (None, "maco", "nvshmem", "nccl_optimized"):
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
    if k in ("debug", "profile"):
        if not isinstance(v, bool):
            raise ValueError(f"{k}: {v!r} is not a bool")
        return v
    raise TypeError(k)  # unreachable: checked by the caller


config = ConfigTable()


def setting(name: str) -> Any:
    """One setting's value (internal, no checks)."""
    return _settings[name]


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


def _count(value: Any, name: str, allow_none: bool = True) -> Optional[int]:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {value!r} is not a positive number of SMs")
    return value


def current_split() -> Optional[SMSplit]:
    """The split in use: the explicit one, else (sm_policy 'auto') the measured one, else
    None (MACO's defaults)."""
    with _lock:
        if _explicit is not None:
            return _explicit
        if _settings["sm_policy"] == "auto":
            return _measured
        return None


def required_split() -> Optional[SMSplit]:
    """:func:`current_split`, raising under sm_policy 'manual' or 'dynamic' when none was
    set (the overlap API calls it before a collective)."""
    s = current_split()
    if s is None and _settings["sm_policy"] in ("manual", "dynamic"):
        raise InvalidUsageError(f"sm_policy={_settings['sm_policy']!r}: no split set; call "
                                "maco.set_config(compute_sms=..., comm_sms=...) or "
                                "SMConfig.apply() first (or maco.config.set(sm_policy='auto'))")
    return s


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
    global _explicit
    c = _count(compute_sms, "compute_sms")
    m = _count(comm_sms, "comm_sms")
    s = _count(scheduler_sms, "scheduler_sms")
    t = _count(total_sms, "total_sms")
    used = (c or 0) + (m or 0) + (s or 0)
    if t is not None and used > t:
        raise ValueError(f"compute_sms={c} + comm_sms={m} + scheduler_sms={s} = {used} exceed "
                         f"total_sms={t}")
    with _lock:
        if _settings["sm_policy"] == "manual" and _scope_depth and _explicit is not None:
            raise InvalidUsageError("maco.set_config: sm_policy='manual' fixes the split while "
                                    "an overlap scope runs; use sm_policy='dynamic' to change "
                                    "it between steps")
        _explicit = SMSplit(c, m, s, t, "set_config")
        return _explicit


def get_config() -> Optional[SMSplit]:
    """The split in use (None: MACO's defaults); see :func:`set_config`."""
    return current_split()


def clear_config() -> None:
    """Forgets the split set by :func:`set_config` or :meth:`SMConfig.apply`."""
    global _explicit
    with _lock:
        _explicit = None


def dynamic_sm_config(fn: Callable) -> Callable:
    """Decorator: inside ``fn``, sm_policy is 'dynamic' (so :func:`set_config` may change the
    split, e.g. prefill vs decode) and after each call the split and policy from before the
    call are restored. Thread-safety: the settings are process-wide; do not run decorated
    functions of different splits on several threads at once."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        global _explicit
        with _lock:
            saved = (_explicit, _settings["sm_policy"])
            _settings["sm_policy"] = "dynamic"
        try:
            return fn(*args, **kwargs)
        finally:
            with _lock:
                _explicit, _settings["sm_policy"] = saved

    return wrapper


# ---------------------------------------------------------------------------- SM roles


class Role(enum.Enum):
    """What a range of SMs does in MACO's persistent kernel (``maco_persistent_config_t``).

    - COMPUTE: compute workers (``workers``): GEMM tiles and element-wise tasks.
    - LOCAL_SCHEDULER: schedulers (``schedulers``): they hand ready tasks to workers.
    - REMOTE_SCHEDULER: communication workers (``comm_workers``): sums and copies to peers,
      gated on peers' signals; for eager collectives, the CTA cap.
    """

    COMPUTE = "compute"
    LOCAL_SCHEDULER = "local_scheduler"
    REMOTE_SCHEDULER = "remote_scheduler"


# task_types a range may name: those of MACO's task graph and the design's words for them.
COMPUTE_TASK_TYPES = frozenset({"matmul", "gemm", "attention", "elementwise", "add", "scale",
                                "residual_add", "copy"})
COMM_TASK_TYPES = frozenset({"allreduce", "allgather", "reduce_scatter", "send", "recv",
                             "put", "signal", "wait"})


class SMConfig:
    """Roles for ranges of a GPU's SMs, mapped onto the persistent kernel's CTA split.

    ::

        sm = maco.SMConfig(total_sms=132)
        sm.assign_role((0, 96), role=maco.Role.COMPUTE, task_types=["matmul", "attention"])
        sm.assign_role((96, 120), role=maco.Role.LOCAL_SCHEDULER)
        sm.assign_role((120, 132), role=maco.Role.REMOTE_SCHEDULER)
        sm.apply()                      # the split of maco.compile, PersistentContext, ...
        k = maco.PersistentKernel(comm, **sm.persistent_config())

    What is kept of the design: the number of SMs per role becomes the number of CTAs per
    role (one CTA per SM: workers = COMPUTE SMs, schedulers = LOCAL_SCHEDULER SMs,
    comm_workers = REMOTE_SCHEDULER SMs). What is not: *which* SMs. CUDA places a kernel's
    CTAs on SMs itself and offers no way to pin a CTA to an SM, so ``sm_range`` fixes a count
    (its length), not SM indices; and ``task_types`` is checked (known names, compute types
    on COMPUTE, communication types on REMOTE_SCHEDULER) and recorded, but does not restrict
    which worker runs a task: MACO's compute workers take any ready compute task and its
    communication workers any communication task (one queue each; pinning task types to
    workers would idle workers whenever a type runs out).

    Args:
        total_sms: the GPU's SMs; None: the current CUDA device's count (needs torch and a
            GPU).

    Not thread-safe (build it on one thread).

    Raises:
        ValueError: total_sms not a positive int.
        RuntimeError: total_sms None and no GPU.
    """

    def __init__(self, total_sms: Optional[int] = None):
        if total_sms is None:
            total_sms = _device_sms()
        if isinstance(total_sms, bool) or not isinstance(total_sms, int) or total_sms < 1:
            raise ValueError(f"total_sms: {total_sms!r} is not a positive int")
        self.total_sms = total_sms
        self._ranges: list = []  # (start, end, Role, tuple(task_types))

    def __repr__(self) -> str:
        parts = ", ".join(f"[{a}, {b}) {r.name}" for a, b, r, _ in self._ranges)
        return f"maco.SMConfig(total_sms={self.total_sms}: {parts or 'nothing assigned'})"

    def assign_role(self, sm_range: Sequence[int], role: Any = Role.COMPUTE,
                    task_types: Optional[Sequence[str]] = None) -> "SMConfig":
        """Gives SMs ``[start, end)`` the role ``role``; returns self (chainable).

        Args:
            sm_range: ``(start, end)``, half-open, ``0 <= start < end <= total_sms``; also a
                ``range`` with step 1.
            role: a :class:`Role` or its name ("compute", "local_scheduler",
                "remote_scheduler", any case).
            task_types: names of task types the range is meant for (see the class text):
                COMPUTE takes matmul, gemm, attention, elementwise, add, scale,
                residual_add, copy; REMOTE_SCHEDULER allreduce, allgather, reduce_scatter,
                send, recv, put, signal, wait; LOCAL_SCHEDULER none.

        Raises:
            TypeError: sm_range not a pair of ints; role not a Role.
            ValueError: a range out of [0, total_sms), empty or reversed, overlapping an
                earlier range (both named with their roles), an unknown task type or one
                that does not fit the role.
        """
        start, end = _range(sm_range)
        if not 0 <= start < end <= self.total_sms:
            raise ValueError(f"sm_range: ({start}, {end}) is not inside [0, {self.total_sms}) "
                             f"with start < end (total_sms={self.total_sms})")
        role = _role(role)
        for a, b, r, _ in self._ranges:
            if start < b and a < end:
                raise ValueError(f"sm_range: ({start}, {end}) overlaps ({a}, {b}), already "
                                 f"assigned to {r.name}")
        types = tuple(task_types or ())
        if isinstance(task_types, str):
            raise TypeError("task_types: a sequence of names, not one string")
        allowed = {Role.COMPUTE: COMPUTE_TASK_TYPES, Role.REMOTE_SCHEDULER: COMM_TASK_TYPES,
                   Role.LOCAL_SCHEDULER: frozenset()}[role]
        for t in types:
            if t not in COMPUTE_TASK_TYPES | COMM_TASK_TYPES:
                raise ValueError(f"task_types: {t!r} is not a task type; known: "
                                 f"{', '.join(sorted(COMPUTE_TASK_TYPES | COMM_TASK_TYPES))}")
            if t not in allowed:
                raise ValueError(f"task_types: {t!r} does not run on {role.name} SMs"
                                 + (" (schedulers run no tasks)" if not allowed else
                                    f"; they take {', '.join(sorted(allowed))}"))
        self._ranges.append((start, end, role, types))
        self._ranges.sort()
        return self

    def sms(self, role: Any) -> int:
        """The number of SMs given ``role``."""
        role = _role(role)
        return sum(b - a for a, b, r, _ in self._ranges if r is role)

    @property
    def unassigned(self) -> int:
        """SMs with no role: the persistent kernel leaves them to other kernels."""
        return self.total_sms - sum(b - a for a, b, _, _ in self._ranges)

    def roles(self) -> list:
        """``(start, end, Role, task_types)`` per assigned range, by start."""
        return list(self._ranges)

    def task_types(self, role: Any) -> set:
        """The task types named for ``role``'s ranges."""
        role = _role(role)
        return {t for _, _, r, ts in self._ranges if r is role for t in ts}

    def split(self) -> SMSplit:
        """The CTA split: compute_sms = COMPUTE SMs, scheduler_sms = LOCAL_SCHEDULER SMs,
        comm_sms = REMOTE_SCHEDULER SMs (a role with no SMs: MACO's default for it).

        Raises:
            ValueError: no COMPUTE SMs while other roles have some, or more LOCAL_SCHEDULER
                than COMPUTE SMs (MACO's kernel needs 1 <= schedulers <= workers).
        """
        c = self.sms(Role.COMPUTE)
        s = self.sms(Role.LOCAL_SCHEDULER)
        m = self.sms(Role.REMOTE_SCHEDULER)
        if c == 0 and (s or m):
            raise ValueError("SMConfig: no COMPUTE SMs; the persistent kernel needs at least "
                             "one compute worker")
        if s > c:
            raise ValueError(f"SMConfig: {s} LOCAL_SCHEDULER SMs exceed the {c} COMPUTE SMs; "
                             "MACO's kernel needs schedulers <= workers")
        return SMSplit(c or None, m or None, s or None, self.total_sms, "SMConfig")

    def persistent_config(self) -> dict:
        """``num_workers``, ``num_schedulers``, ``num_comm_workers`` for
        :class:`maco.PersistentKernel` (0 where a role has no SMs: MACO's default)."""
        return self.split().persistent_config()

    def apply(self) -> SMSplit:
        """Makes this the split in use (as :func:`set_config`); returns it."""
        global _explicit
        sp = self.split()
        with _lock:
            if _settings["sm_policy"] == "manual" and _scope_depth and _explicit is not None:
                raise InvalidUsageError("SMConfig.apply: sm_policy='manual' fixes the split "
                                        "while an overlap scope runs; use 'dynamic'")
            _explicit = sp
        return sp


def _range(sm_range: Any) -> tuple:
    if isinstance(sm_range, range):
        if sm_range.step != 1:
            raise ValueError(f"sm_range: {sm_range} has step {sm_range.step}; SMs are "
                             "assigned in contiguous ranges")
        return sm_range.start, sm_range.stop
    try:
        a, b = sm_range
    except (TypeError, ValueError):
        raise TypeError(f"sm_range: {sm_range!r} is not a (start, end) pair") from None
    for v in (a, b):
        if isinstance(v, bool) or not isinstance(v, int):
            raise TypeError(f"sm_range: {sm_range!r}: start and end must be ints")
    return a, b


def _role(role: Any) -> Role:
    if isinstance(role, Role):
        return role
    if isinstance(role, str):
        try:
            return Role[role.upper()]
        except KeyError:
            pass
    raise TypeError(f"role: {role!r} is not a maco.Role (COMPUTE, LOCAL_SCHEDULER, "
                    "REMOTE_SCHEDULER)")


def _device_sms() -> int:
    torch = sys.modules.get("torch")
    if torch is None:
        try:
            import torch
        except ImportError:
            torch = None
    if torch is None or not torch.cuda.is_available():
        raise RuntimeError("total_sms: required here (no GPU visible to PyTorch to count "
                           "the SMs of)")
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


# ---------------------------------------------------------------------------- auto_config

_INTENSITY = ("low", "medium", "high")
# What each intensity measures: a bf16 GEMM of m = n = k and a bf16 allreduce of this many
# elements, run at the same time (the allreduce on a second stream).
_GEMM_SIZE = {"low": 2048, "medium": 4096, "high": 8192}
_COMM_ELEMS = {"low": 1 << 20, "medium": 16 << 20, "high": 64 << 20}
_ARCH_MAJOR = {"ampere": (8,), "hopper": (9,), "blackwell": (10, 12)}


def auto_config(compute_intensity: str = "medium", comm_intensity: str = "medium",
                gpu_arch: Optional[str] = None, *, measure: Optional[Callable[[int], float]] = None,
                candidates: Optional[Sequence[int]] = None, total_sms: Optional[int] = None,
                comm: Any = None, apply: bool = True, iters: int = 5) -> SMSplit:
    """Recommends a compute/communication split from a measurement, not a guess: for each
    candidate ``comm_sms`` it times a workload of the given intensities with the collective
    capped at that many CTAs, and keeps the fastest (ties: fewer communication SMs).

    On a GPU (``measure`` None) the workload is a bf16 GEMM (m = n = k = 2048 / 4096 / 8192 for
    low / medium / high compute) on the current stream while a bf16 allreduce (1 M / 16 M /
    64 M elements for low / medium / high communication) runs on a second stream of the
    default communicator (:func:`maco.init`), ``iters`` times, timed with CUDA events; the
    cap is set with ``maco_collective_set_max_ctas`` (collective: every rank calls
    auto_config with the same arguments) and restored afterwards. Elsewhere pass
    ``measure(comm_sms) -> seconds`` (your own workload, or a model of it) and ``total_sms``.

    With a communicator of several ranks (``comm``, default: the default one when initialized)
    the times are the largest over ranks (exchanged over the bootstrap), so every rank picks
    the same split.

    Args:
        compute_intensity, comm_intensity: "low", "medium" or "high".
        gpu_arch: None, or "ampere" / "hopper" / "blackwell": checked against the GPU.
        measure: the measurement to use instead of the GPU's.
        candidates: comm_sms values to try (default 8, 16, 24, 32, 48, 64 below total_sms).
        total_sms: the GPU's SMs (default: the device's; required without a GPU).
        comm: a :class:`maco.Communicator` to agree with and (GPU) to measure on.
        apply: True makes the result the split in use under sm_policy 'auto'.
        iters: timed repetitions per candidate (GPU).

    Returns: an :class:`SMSplit` (``compute_sms = total_sms - comm_sms``, ``times``: seconds
    per candidate).

    Raises:
        ValueError: an intensity, architecture, candidate, total_sms or iters out of range;
            ``measure`` returned something that is not a positive number; ``gpu_arch`` is
            not this GPU's.
        RuntimeError: no GPU and no ``measure`` (says to pass one).
    """
    for v, nm in ((compute_intensity, "compute_intensity"), (comm_intensity, "comm_intensity")):
        if v not in _INTENSITY:
            raise ValueError(f"{nm}: {v!r}; accepts {', '.join(_INTENSITY)}")
    if gpu_arch is not None and gpu_arch not in _ARCH_MAJOR:
        raise ValueError(f"gpu_arch: {gpu_arch!r}; accepts {', '.join(_ARCH_MAJOR)} or None")
    if isinstance(iters, bool) or not isinstance(iters, int) or iters < 1:
        raise ValueError(f"iters: {iters!r} is not a positive int")
    torch = sys.modules.get("torch")
    gpu = False
    if measure is None:
        try:
            import torch
            gpu = torch.cuda.is_available()
        except ImportError:
            gpu = False
        if not gpu:
            raise RuntimeError("maco.auto_config measures on the GPU and none is visible to "
                               "PyTorch; pass measure=fn(comm_sms) -> seconds (and total_sms=) "
                               "to supply the measurement")
    if gpu:
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        if gpu_arch is not None and props.major not in _ARCH_MAJOR[gpu_arch]:
            raise ValueError(f"gpu_arch: {gpu_arch!r}, but this GPU ({props.name}) is compute "
                             f"capability {props.major}.{props.minor}")
        if total_sms is None:
            total_sms = props.multi_processor_count
    if total_sms is None:
        raise ValueError("total_sms: required with measure= (no GPU to count the SMs of)")
    _count(total_sms, "total_sms", allow_none=False)
    if candidates is None:
        candidates = [c for c in (8, 16, 24, 32, 48, 64) if c < total_sms]
    cands = []
    for c in candidates:
        if isinstance(c, bool) or not isinstance(c, int) or not 1 <= c < total_sms:
            raise ValueError(f"candidates: {c!r} is not a comm_sms in [1, {total_sms})")
        cands.append(c)
    if not cands:
        raise ValueError(f"candidates: none below total_sms={total_sms}")
    if comm is None:
        from . import _level1

        comm = _level1.get_default_communicator() if _level1.is_initialized() else None
    if measure is None:
        measure = _gpu_measure(torch, comm, compute_intensity, comm_intensity, iters)
    times = {}
    try:
        for c in cands:
            t = measure(c)
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
                raise ValueError(f"measure: returned {t!r} for comm_sms={c}; expected a "
                                 "positive number of seconds")
            times[c] = float(t)
    finally:
        close = getattr(measure, "close", None)
        if close is not None:
            close()
    if comm is not None and comm.size > 1:
        rows = [json.loads(b.decode()) for b in comm.allgather_bytes(
            json.dumps([times[c] for c in cands]).encode().ljust(64 * len(cands) + 64))]
        times = {c: max(r[i] for r in rows) for i, c in enumerate(cands)}
    best = min(cands, key=lambda c: (times[c], c))
    split = SMSplit(total_sms - best, best, None, total_sms, "auto_config", times)
    if apply:
        global _measured
        with _lock:
            _measured = split
    return split


class _GpuMeasure:
    """auto_config's GPU workload (see its docstring); ``close`` restores the CTA cap."""

    def __init__(self, torch, comm, ci: str, mi: str, iters: int):
        if comm is None:
            from . import _level1

            comm = _level1.get_default_communicator() if _level1.is_initialized() else \
                _level1.init()
        self.torch, self.comm, self.iters = torch, comm, iters
        dev = torch.device("cuda", comm.device)
        n = _GEMM_SIZE[ci]
        self.a = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.b = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
        self.x = torch.randn(_COMM_ELEMS[mi], device=dev, dtype=torch.bfloat16)
        self.side = torch.cuda.Stream(device=dev)
        self.saved = comm.max_ctas

    def __call__(self, comm_sms: int) -> float:
        torch = self.torch
        self.comm.set_max_ctas(comm_sms)  # collective
        cur = torch.cuda.current_stream(self.comm.device)
        times = []
        for i in range(self.iters + 1):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record(cur)
            self.side.wait_stream(cur)
            self.comm.allreduce(self.x, stream=self.side)
            torch.matmul(self.a, self.b)
            cur.wait_stream(self.side)
            end.record(cur)
            end.synchronize()
            if i:  # the first is a warm-up
                times.append(start.elapsed_time(end) / 1e3)
        times.sort()
        return times[len(times) // 2]

    def close(self) -> None:
        self.comm.set_max_ctas(self.saved)


def _gpu_measure(torch, comm, ci, mi, iters):
    return _GpuMeasure(torch, comm, ci, mi, iters)


@contextlib.contextmanager
def _patched(**settings: Any) -> Iterator[None]:
    """Test helper: settings changed for the block, restored after."""
    with _lock:
        saved = dict(_settings)
    config.set(**settings)
    try:
        yield
    finally:
        with _lock:
            _settings.clear()
            _settings.update(saved)
