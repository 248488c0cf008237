"""The calls of :class:`maco.Communicator` that make communicators from it and let a job survive
a rank's death (``maco_comm_revoke``, ``maco_comm_shrink``, ``maco_comm_split``,
``maco_comm_grow``, ``maco_comm_join``: include/maco/comm.h states the contracts), kept apart
from its collectives: :class:`maco.Communicator` is made of both.

The loop of a fault-tolerant job (what torchft does with NCCL)::

    try:
        comm.allreduce(grads)
        comm.check_async_error()
    except (maco.RemoteError, maco.RevokedError, maco.CommTimeoutError):
        comm = comm.shrink()          # the survivors agree on who is gone; no list needed
        # ... resume from the last step every survivor finished ...
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from . import _maco
from ._job import device_index
from ._types import INT_MAX, INT_MIN, c_int


class _FaultToleranceCalls:
    """Part of :class:`maco.Communicator` (see its text); uses its ``_c`` (the extension's
    communicator), ``_device`` and ``size``, and makes instances of its class."""

    def _made(self, handle: Any) -> Any:
        return None if handle is None else type(self)(_handle=handle)

    def revoke(self) -> None:
        """Revokes the communicator here and on every peer: waits on it (a host wait, a
        kernel's device wait) end with :class:`maco.RevokedError`, later calls raise it, and the
        peers' ones too once they read the revoke (at their next call, or within 10 ms of a
        :meth:`check_async_error`). Idempotent; thread-safe: meant for a watchdog thread while
        another thread waits in a call. Then :meth:`shrink` or :meth:`close`."""
        self._c.revoke()

    def shrink(self, exclude: Sequence[int] = (), *, abort: bool = True) -> Optional[Any]:
        """The communicator of this communicator's ranks that are alive and not in
        ``exclude``, also after ranks died (at any point, also during this call): the
        survivors find the dead ranks themselves and agree on one membership, so every survivor
        gets the same ranks in the same order; a slow rank is waited for, never dropped. Ranks
        keep their order; the new ranks are 0 .. size-1. A live rank that must leave has to be
        in every caller's ``exclude``; it need not call (if it calls, it gets None).

        Args:
            exclude: ranks of this communicator to leave out (each in [0, size)).
            abort: revoke this communicator first, ending its work in flight
                (``MACO_SHRINK_ABORT``, the default after a failure); False leaves it usable.

        Returns: the new :class:`Communicator` (same CUDA device, its own resources: make
        registrations and plans again on it), or None when this rank was excluded. This
        communicator stays as it is; close it when done. Collective over the survivors,
        blocking, bounded by MACO_BOOTSTRAP_TIMEOUT (a death costs one more message round).

        Raises:
            ValueError: an entry of ``exclude`` outside [0, size).
            CommTimeoutError: a live rank neither called nor was excluded by every caller
                (named).
        """
        ranks = [int(r) for r in exclude]
        for i, r in enumerate(ranks):
            if not 0 <= r < self.size:
                raise ValueError(f"exclude[{i}] is {r}, outside [0, {self.size})")
        return self._made(self._c.shrink(ranks, bool(abort)))

    def split(self, color: Optional[int], key: Optional[int] = None) -> Optional[Any]:
        """Splits the communicator as ``ncclCommSplit``: ranks with the same ``color``
        (an int >= 0) form a new communicator ordered by ``key`` (default: this rank), then by
        rank; ``color`` None joins none and gets None. Collective over every rank, which must
        be alive (use :meth:`shrink` after a failure); blocking."""
        c = -1 if color is None else int(color)
        if c < 0 and color is not None:
            raise ValueError(f"color is {color}; use an int >= 0, or None to join none")
        if color is not None:
            c_int(c, "color")
        k = self.rank if key is None else c_int(int(key), "key", INT_MIN, INT_MAX)
        return self._made(self._c.split(c, k))

    def grow_id(self) -> bytes:
        """On rank 0: the 128-byte id that new processes join with (:meth:`join`) when this
        communicator grows (:meth:`grow`); hand it to them by any means. One grow per id.

        Raises:
            InvalidUsageError: not rank 0.
        """
        return self._c.grow_id()

    def grow(self, size: int, grow_id: Optional[bytes] = None) -> Any:
        """Grows the communicator to ``size`` ranks (``ncclCommGrow``): the existing ranks keep
        their numbers, the processes that :meth:`join` take ranks from this one's size up (to
        replace ranks lost by a shrink, or to scale up). Every existing rank calls it; rank 0
        passes the id from :meth:`grow_id`, the others nothing. Returns the grown
        :class:`Communicator` (a new one; this one stays). Collective, blocking, bounded by
        MACO_BOOTSTRAP_TIMEOUT.

        Raises:
            InvalidArgumentError: size not above this size, the id missing on rank 0 or given
                elsewhere, or made for another communicator.
        """
        n = c_int(int(size), "size", INT_MIN, INT_MAX)
        return self._made(self._c.grow(n, None if grow_id is None else bytes(grow_id)))

    @classmethod
    def join(cls, grow_id: bytes, rank: int, size: int, *, device: Any = None) -> Any:
        """A new process's side of :meth:`grow`: joins the grown communicator of ``size``
        ranks as ``rank`` (from the old size up) with the id rank 0 made. ``device`` as in
        the constructor. Collective with the growing ranks, blocking."""
        r = c_int(int(rank), "rank", INT_MIN, INT_MAX)
        n = c_int(int(size), "size", INT_MIN, INT_MAX)
        return cls(_handle=_maco.Comm.join(bytes(grow_id), r, n, device_index(device)))
