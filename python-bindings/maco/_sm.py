"""Where a compute/communication split comes from besides :func:`maco.set_config`: SM roles
(``maco.SMConfig``, ``maco.Role``) and a measurement (``maco.auto_config``); and CUDA green
contexts, the one way to give eager compute fewer SMs (the overlap scope's ``compute`` and
:class:`maco.Context`)."""

from __future__ import annotations

import enum
import json
import sys
from typing import Any, Callable, Optional, Sequence

from ._config import SMSplit, set_measured, set_split, sm_count
from ._default_comm import get_default_communicator, init, is_initialized

__all__ = ["Role", "SMConfig", "auto_config", "green_context"]


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
        ValueError: total_sms not a positive int (at most 2**31 - 1).
        RuntimeError: total_sms None and no GPU.
    """

    def __init__(self, total_sms: Optional[int] = None):
        if total_sms is None:
            total_sms = _device_sms()
        self.total_sms = sm_count(total_sms, "total_sms", allow_none=False)
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
        """Makes this the split in use (as :func:`maco.set_config`); returns it.

        Raises: InvalidUsageError: sm_policy 'manual' while an overlap scope runs."""
        return set_split(self.split(), "SMConfig.apply")


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
    sm_count(total_sms, "total_sms", allow_none=False)
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
        comm = get_default_communicator() if is_initialized() else None
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
        set_measured(split)
    return split


class _GpuMeasure:
    """auto_config's GPU workload (see its docstring); ``close`` restores the CTA cap."""

    def __init__(self, torch, comm, ci: str, mi: str, iters: int):
        if comm is None:
            comm = get_default_communicator() if is_initialized() else init()
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


# ---------------------------------------------------------------------------- green contexts

def green_context(sms: int, device: Any) -> tuple[Any, str]:
    """``(context, "")``: a torch green context (``torch.cuda.GreenContext``) of ``sms`` SMs
    on the CUDA ``device`` (a torch.device) that ran a kernel, or ``(None, why not)``: no
    green contexts in this PyTorch, or the driver refused (too old, MPS, the SM count). The
    driver rounds ``sms`` up to its SM granularity. Blocking (synchronises the device)."""
    import torch

    gc = getattr(torch.cuda, "green_contexts", None)
    if gc is None or not getattr(gc, "SUPPORTED", False):
        return None, f"PyTorch {torch.__version__} has no green contexts (torch.cuda.GreenContext)"
    try:
        g = gc.GreenContext.create(sms, device.index)
    except Exception as e:  # the driver's reason: too old, refused (MPS), SM count
        return None, f"torch.cuda.GreenContext.create({sms}) failed: {e}"
    try:  # a first kernel inside it: creation alone does not prove launches work
        g.set_context()
        try:
            torch.ones(1, device=device).add_(1)
        finally:
            g.pop_context()
        torch.cuda.synchronize(device)
    except Exception as e:
        return None, f"a kernel in a green context of {sms} SMs failed: {e}"
    return g, ""
