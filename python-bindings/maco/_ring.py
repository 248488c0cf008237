"""``maco.ring()``: sends to the next rank and receives from the previous one (pipeline
parallelism), issued together as one :func:`maco.group` when the block ends. A communication
pattern, not an overlap tool: it overlaps nothing with compute by itself."""

from __future__ import annotations

from typing import Any, Optional

from ._comm import group
from ._default_comm import rank_size
from ._errors import InvalidUsageError
from ._streams import _tls

__all__ = ["Ring", "ring"]


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
        r, n = rank_size(self._comm)
        step = 1 if self.direction == "forward" else -1
        return r, n, (r + step) % n, (r - step) % n

    def __enter__(self) -> "Ring":
        self.rank, self.world_size, self.next, self.prev = self._ranks()
        if _tls.ring is not None:
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
    return _tls.ring
