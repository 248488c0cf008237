"""maco.CommScheduler: collectives in named phases with dependencies, planned once and run
many times. A layer over the overlap API: each phase is issued as an asynchronous collective
(``maco.allreduce(..., async_op=True)``'s path: the communication stream, a
:class:`maco.CommWork`), under the split ``optimize_context(comm_sms=num_sms)`` gives a block."""

from __future__ import annotations

import sys
from typing import Any, Optional

from ._collectives import allgather, allreduce, reduce_scatter
from ._config import scoped_split
from ._default_comm import get_default_communicator
from ._errors import InvalidUsageError
from ._streams import CommWork, _done_handle, caps_restored, run_on_comm_stream
from ._types import ReduceOp, to_maco_op

__all__ = ["CommScheduler", "Phase"]


class Phase:
    """A named set of collectives of a :class:`CommScheduler` (``scheduler.phase(name)``).
    Add collectives with :meth:`allreduce`, :meth:`allgather`, :meth:`reduce_scatter`."""

    def __init__(self, sched: "CommScheduler", name: str, depends_on: tuple):
        self._sched = sched
        self.name = name
        self._deps = depends_on  # Phase objects or names (resolved at compile)
        self.ops: list = []      # (kind, tensor, out, op)

    def __repr__(self) -> str:
        return f"<maco.Phase {self.name!r}: {len(self.ops)} collectives>"

    def _add(self, kind: str, x: Any, out: Any, op: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is None or not isinstance(x, torch.Tensor):
            raise TypeError(f"x: a torch.Tensor is needed, got {type(x).__name__}")
        if not x.is_contiguous():
            raise ValueError(f"x: phase {self.name!r}: the tensor is not contiguous")
        if self._sched._compiled:
            raise InvalidUsageError(f"phase {self.name!r}: the scheduler is compiled; make a "
                                    "new one to change its collectives")
        self.ops.append((kind, x, out, to_maco_op(op)))
        return out if out is not None else x

    def allreduce(self, x: Any, op: Any = ReduceOp.SUM) -> Any:
        """Adds an in-place allreduce of ``x`` (contiguous torch tensor); returns ``x``."""
        return self._add("allreduce", x, None, op)

    def allgather(self, x: Any, out: Any) -> Any:
        """Adds an allgather of ``x`` into ``out`` (world_size * x.numel() elements of x's
        type); returns ``out``."""
        if out is None:
            raise ValueError("out: required (world_size * x.numel() elements)")
        return self._add("allgather", x, out, ReduceOp.SUM)

    def reduce_scatter(self, x: Any, out: Any, op: Any = ReduceOp.SUM) -> Any:
        """Adds a reduce-scatter of ``x`` into ``out`` (x.numel() / world_size elements);
        returns ``out``."""
        if out is None:
            raise ValueError("out: required (x.numel() / world_size elements)")
        return self._add("reduce_scatter", x, out, op)


class CommScheduler:
    """Collectives grouped in phases with dependencies, compiled into an order and a plan.

    ::

        sched = maco.CommScheduler(num_sms=32)
        p1 = sched.phase("allreduce_qkv")
        p1.allreduce(q); p1.allreduce(k); p1.allreduce(v)
        p2 = sched.phase("allreduce_output", depends_on=p1)
        p2.allreduce(attn_output)
        sched.compile()
        works = sched.run()            # {"allreduce_qkv": CommWork, ...}; or sched()
        works["allreduce_output"].wait()

    ``compile()`` orders the phases so that each runs after the phases it depends on (among
    phases that are ready, in the order they were made) and plans each phase: its allreduces
    of one type, device and op become ONE allreduce of a flat buffer holding them all (one
    launch instead of several; the results are copied back), other collectives run as they
    are. ``run()`` issues the phases in that order on the default communicator (CUDA: on the
    overlap API's communication stream after the work on the caller's current stream, the
    collective kernels capped at ``num_sms`` CTAs (``maco_collective_set_max_ctas``,
    collective) for the run and the cap from before restored after, as
    ``maco.optimize_context(comm_sms=num_sms)`` does for a block; CPU tensors:
    torch.distributed's group) and returns
    a :class:`maco.CommWork` per phase: ``wait()`` orders the current stream after that phase
    (and so after the phases before it). A phase's tensors are updated when its work is
    waited for.

    What differs from the design: phases do not run concurrently even when independent,
    because MACO runs one communicator's collectives in call order; dependencies therefore
    decide the order, and ``num_sms`` caps each collective rather than reserving SMs for the
    schedule.

    Args:
        num_sms: the CTA cap of the run's collective kernels (None: the split in use).
        comm: a :class:`maco.Communicator` (default: the default one).

    Every rank builds the same phases with tensors of the same sizes and runs them the same
    number of times. Not thread-safe.

    Raises: ValueError: num_sms not positive; a phase name used twice; (compile) a
    dependency on a phase that does not exist (named) or a cycle (named phases).
    """

    def __init__(self, num_sms: Optional[int] = None, *, comm: Any = None):
        if num_sms is not None and (isinstance(num_sms, bool) or not isinstance(num_sms, int)
                                    or num_sms < 1):
            raise ValueError(f"num_sms: {num_sms!r} is not a positive number of SMs")
        self.num_sms = num_sms
        self._comm = comm
        self._phases: dict = {}
        self._compiled = False
        self.order: list = []
        self._plan: list = []  # per phase in order: (phase, [groups])

    def phase(self, name: str, depends_on: Any = None) -> Phase:
        """A new phase ``name`` that runs after ``depends_on`` (a Phase or a phase name, or a
        sequence of them; names may refer to phases made later)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"name: {name!r} is not a non-empty str")
        if name in self._phases:
            raise ValueError(f"name: phase {name!r} exists already")
        if self._compiled:
            raise InvalidUsageError("phase: the scheduler is compiled; make a new one")
        if depends_on is None:
            deps: tuple = ()
        elif isinstance(depends_on, (Phase, str)):
            deps = (depends_on,)
        else:
            deps = tuple(depends_on)
        for d in deps:
            if isinstance(d, Phase) and d._sched is not self:
                raise ValueError(f"depends_on: phase {d.name!r} belongs to another scheduler")
            if not isinstance(d, (Phase, str)):
                raise TypeError(f"depends_on: {d!r} is not a Phase or a phase name")
        p = Phase(self, name, deps)
        self._phases[name] = p
        return p

    def compile(self) -> "CommScheduler":
        """Orders the phases and plans them (see the class text); returns self.

        Raises: ValueError: an unknown dependency or a cycle (the phases on it named)."""
        deps = {}
        for name, p in self._phases.items():
            ds = []
            for d in p._deps:
                dn = d.name if isinstance(d, Phase) else d
                if dn not in self._phases:
                    raise ValueError(f"depends_on: phase {name!r} depends on {dn!r}, which is "
                                     "not a phase of this scheduler")
                if dn == name:
                    raise ValueError(f"depends_on: phase {name!r} depends on itself")
                ds.append(dn)
            deps[name] = ds
        order, done = [], set()
        names = list(self._phases)
        while len(order) < len(names):
            ready = [n for n in names if n not in done and all(d in done for d in deps[n])]
            if not ready:
                left = [n for n in names if n not in done]
                raise ValueError(f"depends_on: the phases {left} depend on each other in a "
                                 "cycle")
            order.append(ready[0])
            done.add(ready[0])
        self.order = order
        self._plan = [(self._phases[n], _plan_phase(self._phases[n])) for n in order]
        self._compiled = True
        return self

    def run(self) -> dict:
        """Issues every phase in order (compiles first if needed); returns ``{phase name:
        CommWork}`` (see the class text). Collective: every rank runs it."""
        if not self._compiled:
            self.compile()
        works = {}
        tensors = [op[1] for p in self._phases.values() for op in p.ops]
        cuda = bool(tensors) and tensors[0].is_cuda
        if not cuda:
            for phase, groups in self._plan:
                for g in groups:
                    _run_cpu(g)
                works[phase.name] = CommWork(None, _done_handle(phase.name))
            return works
        comm = self._comm or get_default_communicator()
        # num_sms: the split's comm_sms for the run, as optimize_context(comm_sms=) gives a
        # block; the cap from before comes back after the run (collective).
        with scoped_split(comm_sms=self.num_sms), caps_restored():
            for phase, groups in self._plan:
                def issue(s, groups=groups):
                    for g in groups:
                        _run_cuda(comm, g, s)
                _, h = run_on_comm_stream(comm, issue, None, phase.name)
                works[phase.name] = CommWork(None, h)
        return works

    __call__ = run


def _plan_phase(p: Phase) -> list:
    """A phase's collectives as groups: ("flat", [tensors], op) for allreduces packed in one
    buffer (same type, device, op; more than one), else ("one", op tuple)."""
    groups: list = []
    packs: dict = {}
    for kind, x, out, op in p.ops:
        if kind == "allreduce":
            key = (x.dtype, x.device, op)
            if key not in packs:
                packs[key] = ["flat", [], op]
                groups.append(packs[key])
            packs[key][1].append(x)
        else:
            groups.append(["one", (kind, x, out, op)])
    return [(g if g[0] == "one" or len(g[1]) > 1 else ["one", ("allreduce", g[1][0], None, g[2])])
            for g in groups]


def _run_cuda(comm: Any, g: list, s: Any) -> None:
    import torch

    if g[0] == "flat":
        ts, op = g[1], g[2]
        with torch.cuda.stream(s):
            flat = torch.cat([t.reshape(-1) for t in ts])
        comm.allreduce(flat, op=op, stream=s)
        with torch.cuda.stream(s):
            at = 0
            for t in ts:
                t.view(-1).copy_(flat[at:at + t.numel()])
                at += t.numel()
        for t in ts:
            t.record_stream(s)
        return
    kind, x, out, op = g[1]
    if kind == "allreduce":
        comm.allreduce(x, op=op, stream=s)
    elif kind == "allgather":
        comm.allgather(x, out, stream=s)
    else:
        comm.reduce_scatter(x, out, op=op, stream=s)


def _run_cpu(g: list) -> None:
    import torch

    if g[0] == "flat":
        ts, op = g[1], g[2]
        flat = torch.cat([t.reshape(-1) for t in ts])
        allreduce(flat, op, async_op=True).wait()
        at = 0
        for t in ts:
            t.view(-1).copy_(flat[at:at + t.numel()])
            at += t.numel()
        return
    kind, x, out, op = g[1]
    if kind == "allreduce":
        allreduce(x, op, async_op=True).wait()
    elif kind == "allgather":
        allgather(x, out, async_op=True).wait()
    else:
        reduce_scatter(x, op, out, async_op=True).wait()
