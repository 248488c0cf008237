"""Level 2 of the seeds' API: explicit SM control, compute and communication overlapped. A
layer over the overlap API's entry point: ``maco.optimize_context(compute_sms=, comm_sms=)``
gives a block the same split, ``scope.compute(fn)`` the same green context and
``maco.allreduce(x, async_op=True)`` the same waitable collective; a Context holds them on one
communicator, from its creation to :meth:`Context.close`.

::

    ctx = maco.Context(compute_sms=96, comm_sms=32)     # a GPU of 132 SMs
    with ctx:
        y = ctx.compute(lambda: torch.matmul(x, w1))
        work = ctx.allreduce(y, async_op=True)          # runs beside the next compute
        z = ctx.compute(lambda: torch.matmul(x, w2))
        y = work.wait()                                 # the current stream waits for it

How the SMs are split:

- ``comm_sms``: the communicator's collective kernels launch at most this many CTAs
  (:meth:`maco.Communicator.set_max_ctas`, ``maco_collective_set_max_ctas`` in C; one CTA per
  SM is what these kernels are sized for), so the rest of the GPU stays free. Collective: every
  rank creates its Context with the same ``comm_sms``.
- ``compute_sms``: ``ctx.compute(fn)`` runs ``fn`` inside a CUDA green context of that many SMs
  (``torch.cuda.GreenContext``, CUDA 12.8+ drivers), so compute cannot take the SMs the
  communication runs on. Where green contexts are not available (an older PyTorch or driver,
  or a driver that refuses them), ``fn`` runs on the current stream without an SM limit;
  :attr:`Context.compute_sms_enforced` says which, and :attr:`Context.compute_sms_reason` why
  not. The driver rounds the count up to its SM granularity.
- Communication runs on the overlap API's high-priority communication stream, ordered after the
  work already on the caller's current stream and after the communicator's previous collective
  of the overlap API; ``async_op=True`` returns a :class:`Work` at once, so the next compute
  overlaps it; ``Work.wait()`` orders the caller's current stream after it (it does not block
  the host).

Thread-safety: a Context is used from one thread. Its communicator must not be used by other
Contexts or threads at the same time.
"""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

from ._comm import Communicator
from ._default_comm import get_default_communicator, init, is_initialized
from ._sm import green_context
from ._streams import comm_stream, issue
from ._types import ReduceOp

__all__ = ["Context", "Work"]


class Work:
    """A collective issued by a :class:`Context` with ``async_op=True``."""

    def __init__(self, result: Any, event: Any, ctx: "Context"):
        self._result = result
        self._event = event
        self._ctx = ctx
        self._waited = False

    def wait(self) -> Any:
        """Orders the caller's current CUDA stream after the collective (no host blocking) and
        returns its result tensor. Idempotent."""
        import torch

        if not self._waited:
            torch.cuda.current_stream(self._ctx.device).wait_event(self._event)
            self._waited = True
            self._ctx._forget(self)
        return self._result

    def is_completed(self) -> bool:
        """True when the collective has finished on the GPU (does not block)."""
        return bool(self._event.query())

    def synchronize(self) -> Any:
        """Blocks the host until the collective has finished; returns its result."""
        self._event.synchronize()
        return self.wait()

    @property
    def result(self) -> Any:
        """The output tensor; read it only after :meth:`wait` or on the Context's stream."""
        return self._result


def _positive(value: Optional[int], name: str) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name}: {value!r} is not a positive number of SMs")
    return value


class Context:
    """An execution context that splits the GPU's SMs between compute and communication.

    Args:
        comm: the :class:`maco.Communicator` to run collectives on; None: the default one
            (:func:`maco.init` is called when it does not exist yet).
        world_size: optional check: the communicator's size must equal it.
        compute_sms: SMs for :meth:`compute` (a green context); None: no limit.
        comm_sms: the most CTAs (about SMs) a collective kernel may take; None: no cap.
            Every rank must pass the same value (the call is collective and blocking).
        overlap: False runs collectives on the caller's current stream (serialised with
            compute, as plain ``maco.allreduce`` does); True on the Context's stream.
    The device is the communicator's (its collectives run there).

    Raises:
        ValueError: a count that is not positive, ``compute_sms + comm_sms`` above the GPU's SM
            count (the message names both and the count), ``world_size`` not the
            communicator's size.
        InvalidArgumentError: ranks passed different ``comm_sms``.
        RuntimeError: PyTorch without CUDA.
    """

    def __init__(self, comm: Optional[Communicator] = None, *, world_size: Optional[int] = None,
                 compute_sms: Optional[int] = None, comm_sms: Optional[int] = None,
                 overlap: bool = True):
        import torch

        if not torch.cuda.is_available():
            raise RuntimeError("maco.Context: PyTorch sees no CUDA device")
        self.compute_sms = _positive(compute_sms, "compute_sms")
        self.comm_sms = _positive(comm_sms, "comm_sms")
        if comm is None:
            comm = get_default_communicator() if is_initialized() else init()
        if world_size is not None and int(world_size) != comm.size:
            raise ValueError(f"world_size: {world_size} but the communicator has {comm.size} "
                             "ranks")
        self.comm = comm
        self.device = torch.device(
            "cuda", comm.device if comm.device is not None else torch.cuda.current_device())
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.sm_count = sms
        used = (self.compute_sms or 0) + (self.comm_sms or 0)
        if used > sms:
            raise ValueError(f"compute_sms={self.compute_sms} + comm_sms={self.comm_sms} = {used} "
                             f"exceed the {sms} SMs of {self.device}")
        self.overlap = bool(overlap)
        self._previous_cap = comm.max_ctas
        comm.set_max_ctas(self.comm_sms or 0)  # collective: every rank, same value
        self._stream = comm_stream(self.device, "high")  # the overlap API's
        self._pending: list[Work] = []
        self._green = None
        self.compute_sms_enforced = False
        self.compute_sms_reason = "compute_sms not given"
        if self.compute_sms is not None:
            self._green, self.compute_sms_reason = green_context(self.compute_sms, self.device)
            self.compute_sms_enforced = self._green is not None
            if self._green is None:
                warnings.warn(f"maco.Context: compute runs without an SM limit: "
                              f"{self.compute_sms_reason}", RuntimeWarning, stacklevel=2)

    def __repr__(self) -> str:
        return (f"maco.Context(rank={self.comm.rank}, world_size={self.comm.size}, "
                f"compute_sms={self.compute_sms} (enforced: {self.compute_sms_enforced}), "
                f"comm_sms={self.comm_sms}, overlap={self.overlap}, device={self.device})")

    # ------------------------------------------------------------ scope

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.wait_all()

    def wait_all(self) -> None:
        """Orders the caller's current stream after every collective not yet waited for."""
        for w in list(self._pending):
            w.wait()

    def close(self) -> None:
        """Waits for outstanding collectives and restores the communicator's CTA cap from
        before this Context (collective: every rank calls it)."""
        self.wait_all()
        self.comm.set_max_ctas(self._previous_cap)
        self._green = None

    def _forget(self, w: Work) -> None:
        if w in self._pending:
            self._pending.remove(w)

    # ------------------------------------------------------------ compute

    def compute(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Runs ``fn(*args, **kwargs)`` (PyTorch work) on ``compute_sms`` SMs and returns what
        it returns. The work is ordered after the caller's current stream and the caller's
        current stream after it, as if it had run there."""
        if self._green is None:
            return fn(*args, **kwargs)
        self._green.set_context()  # the current stream waits; work goes to the green stream
        try:
            return fn(*args, **kwargs)
        finally:
            self._green.pop_context()  # the caller's stream waits for the green stream

    # ------------------------------------------------------------ communication

    def _issue(self, run: Callable[[Any], Any], async_op: bool) -> Any:
        import torch

        current = torch.cuda.current_stream(self.device)
        stream = current
        if self.overlap:
            stream = self._stream
            stream.wait_stream(current)
        # The overlap API's issue path (after the communicator's previous collective of the
        # overlap API, on any stream). Communicator calls on an explicit torch stream record it
        # on the tensors, so the caching allocator keeps them until that stream is done.
        result, event = issue(self.comm, run, stream)
        w = Work(result, event, self)
        self._pending.append(w)
        if async_op:
            return w
        return w.wait()

    def allreduce(self, x: Any, *, op: Any = ReduceOp.SUM, out: Any = None,
                  async_op: bool = False) -> Any:
        """:meth:`maco.Communicator.allreduce` on the Context's stream (in place unless
        ``out``). Returns the result tensor, or a :class:`Work` with ``async_op=True`` (with
        ``overlap=False`` too: the work then ran on the current stream)."""
        return self._issue(lambda s: self.comm.allreduce(x, out, op=op, stream=s), async_op)

    def allgather(self, x: Any, *, out: Any = None, async_op: bool = False) -> Any:
        """:meth:`maco.Communicator.allgather` (``out`` shape ``(world_size, *x.shape)``)."""
        return self._issue(lambda s: self.comm.allgather(x, out, stream=s), async_op)

    def reduce_scatter(self, x: Any, *, op: Any = ReduceOp.SUM, out: Any = None,
                       async_op: bool = False) -> Any:
        """:meth:`maco.Communicator.reduce_scatter` (``x``'s first dimension split over the
        ranks)."""
        return self._issue(lambda s: self.comm.reduce_scatter(x, out, op=op, stream=s), async_op)
