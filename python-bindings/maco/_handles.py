"""What a communicator makes besides collectives: :class:`Registration` (a registered
tensor), the mapping of a peer's buffer (:meth:`Communicator.peer_views`) and :class:`Plan`
(an execution plan loaded for a communicator)."""

from __future__ import annotations

from typing import Any

from ._tensor import move_type, reduce_type
from ._types import ReduceOp, to_maco_op

__all__ = ["Registration", "Plan"]


class Registration:
    """A tensor registered with a communicator (``maco_mem_register``).

    Collectives whose buffers are registered on every rank read and write them in place
    (no scratch copies) on the mesh algorithms. The registration keeps the tensor alive;
    :meth:`deregister` (or leaving the ``with`` block) ends it. Deregister only after the
    operations using it have completed on every rank.
    """

    def __init__(self, mem, tensor: Any):
        self._mem = mem
        self.tensor = tensor

    @property
    def address(self) -> int:
        """Device address of the registered range."""
        return self._mem.address

    @property
    def nbytes(self) -> int:
        """Registered bytes."""
        return self._mem.bytes

    @property
    def registered(self) -> bool:
        return self._mem.registered

    def deregister(self) -> None:
        """Ends the registration (idempotent). Raises CudaError if unmapping failed."""
        self._mem.deregister()
        self.tensor = None

    def __enter__(self) -> "Registration":
        return self

    def __exit__(self, *exc) -> None:
        self.deregister()


class _MappedPeer:
    """A peer's mapped buffer as ``__cuda_array_interface__`` (:meth:`Communicator.peer_views`);
    keeps the import and this rank's registration alive as long as a view of it lives."""

    def __init__(self, mem, mine, like):
        import torch

        self._mem, self._mine, self._like = mem, mine, like
        typestr = {torch.bfloat16: "<V2", torch.float16: "<f2", torch.float32: "<f4",
                   torch.float64: "<f8", torch.int32: "<i4", torch.int64: "<i8",
                   torch.uint8: "|u1", torch.int8: "|i1"}.get(like.dtype)
        if typestr is None:
            raise ValueError(f"tensor: dtype {like.dtype} cannot be mapped (bf16, fp16, fp32, "
                             "fp64, int8/32/64, uint8)")
        self._bf16 = like.dtype == torch.bfloat16
        self.__cuda_array_interface__ = dict(
            shape=tuple(like.shape), typestr="<i2" if self._bf16 else typestr,
            data=(mem.address, False), version=3, strides=None)


class Plan:
    """An execution plan loaded for a communicator (:meth:`Communicator.load_plan`): a
    collective algorithm written as data (:mod:`maco.language`, docs/plan-format.md), verified
    by MACO's verifier at load, with its channels set up. Calling it runs the collective with
    one launch of MACO's executor kernel (``maco_plan_execute``), stream-ordered like the
    other collectives and capturable in a CUDA graph.

    Attributes: ``collective`` ("allreduce", "allgather" or "reduce_scatter"), ``name``.
    Not thread-safe: one call at a time per plan (one stream at a time). :meth:`close` (or
    leaving a ``with`` block) frees it after waiting for the device; so does garbage
    collection.
    """

    def __init__(self, comm: Any, handle: Any, collective: str, name: str):
        self._comm = comm
        self._h = handle
        self.collective = collective
        self.name = name

    def __repr__(self) -> str:
        state = "closed" if self._h.destroyed else f"{self._comm.size} ranks"
        return f"<maco.Plan {self.name!r} {self.collective}, {state}>"

    def __enter__(self) -> "Plan":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        """Frees the plan's buffers and channels (waits for the device); idempotent."""
        self._h.destroy()

    def __call__(self, x: Any, out: Any = None, *, op: Any = ReduceOp.SUM,
                 stream: Any = None) -> Any:
        """Runs the plan's collective on ``x`` (every rank calls it with the same size, type
        and op). Shapes as the communicator's call of the same name: allreduce: ``out`` has
        x's size (None: in place); allgather: ``out`` has size * x.numel elements (None: a new
        tensor of shape (size, *x.shape)); reduce_scatter: x has size * k elements and
        ``out`` k (None: a new flat tensor). ``op`` applies to reductions.

        Returns: the output. Raises: ValueError/TypeError for sizes and types (nothing runs);
        InvalidArgumentError when the unit exceeds the plan's buffers (MACO_PLAN_MAX_BYTES);
        InvalidUsageError after :meth:`close` or an earlier device failure.
        """
        c = self._comm
        xb = c._buf(x, "x")
        n = c.size
        op = to_maco_op(op)
        if self.collective == "allgather":
            dt, count = move_type(xb)
            ob = c._out(out, xb, (n, *xb.shape), xb.numel * n, "allgather")
            op = ReduceOp.SUM  # ignored by allgather
        elif self.collective == "reduce_scatter":
            dt, count = reduce_type(xb, "x", op)
            if xb.numel % n:
                raise ValueError(f"x: {xb.numel} elements is not a multiple of the world size "
                                 f"{n}")
            ob = c._out(out, xb, (xb.numel // n,), xb.numel // n, "reduce_scatter")
            count //= n
        else:
            dt, count = reduce_type(xb, "x", op)
            ob = xb if out is None else c._out(out, xb, xb.shape, xb.numel, "allreduce")
        self._h.execute(xb.address, ob.address, count, int(dt), int(op),
                        c._stream(stream, xb, ob))
        return ob.obj
