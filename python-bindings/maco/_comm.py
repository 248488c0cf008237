"""maco.Communicator: a MACO communicator driven with tensors, and :func:`maco.group`."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from typing import Any, Iterator, Optional, Sequence

from . import _job, _maco
from ._errors import UnsupportedError, _from_status
from ._comm_ft import _FaultToleranceCalls
from ._comm_memory import _MemoryCalls
from ._tensor import (Buf, describe, empty_like, move_type, new_tensor, reduce_type, same_type,
                      stream_handle)
from ._types import SIZE_MAX, ReduceOp, c_int, to_maco_dtype, to_maco_op

__all__ = ["Communicator", "group"]

# maco_collective_t values (include/maco/collectives.h).
_COLLECTIVES = {
    "allreduce": 0,
    "allgather": 1,
    "reduce_scatter": 2,
    "broadcast": 3,
    "reduce": 4,
    "all_to_all": 5,
    "alltoall": 5,
    "sendrecv": 6,
}


class _GroupState(threading.local):
    """This thread's :func:`group` nesting, and the tensors its queued calls hold."""

    def __init__(self):
        self.depth = 0
        self.kept: Optional[list] = None


_group_state = _GroupState()


def _keep(*objs: Any) -> None:
    """Inside a group, keeps the tensors of queued calls alive until the group is issued (a
    temporary freed meanwhile could hand its memory to another buffer of the group)."""
    if _group_state.kept is not None:
        _group_state.kept.extend(objs)


@contextlib.contextmanager
def group() -> Iterator[None]:
    """Groups MACO calls of this thread, as ``ncclGroupStart``/``ncclGroupEnd``.

    Collectives, all-to-alls, sends and receives made inside the ``with`` block are checked
    and queued, and issued together when the outermost block exits (sends and receives of
    one communicator as one launch), so a rank can send to and receive from peers without
    deadlock. Groups nest. The group holds a reference to every tensor of a queued call
    until it is issued; after that, as outside groups, the framework's stream order keeps
    the memory valid (pass tensors used on another stream with ``record_stream``). If the
    block raises, the group is still closed (and issued, as MACO issues what was queued);
    the exception propagates.

    Raises (on exit):
        InvalidArgumentError and the other MACO errors of the queued calls: nothing of the
        group was issued.
    """
    _maco.group_start()
    depth = _group_state.depth
    _group_state.depth = depth + 1
    if depth == 0:
        _group_state.kept = []
    try:
        yield
    finally:
        _group_state.depth = depth
        try:
            _maco.group_end()
        finally:
            if depth == 0:
                _group_state.kept = None


class Communicator(_MemoryCalls, _FaultToleranceCalls):
    """A MACO communicator: ranks of a job, one CUDA device each, and the collectives.

    Create one per process with one of:

    * ``Communicator()`` or :meth:`from_env`: from the launcher's variables (``maco-run``,
      torchrun, Open MPI's mpirun, MPICH, PMIx, Slurm's srun; docs/multi-node.md);
    * :meth:`from_unique_id`: from :func:`maco.unique_id` bytes made on rank 0;
    * :meth:`from_process_group`: from an existing ``torch.distributed`` group, which
      carries the id.

    Creation is collective (every rank calls it) and blocking, bounded by
    MACO_BOOTSTRAP_TIMEOUT. On a machine without a usable GPU the communicator is still
    created (``device`` is None) and host-side calls work (:meth:`barrier`,
    :meth:`allgather_bytes`, :meth:`broadcast_bytes`); GPU operations raise
    :class:`maco.UnsupportedError` saying why.

    Tensors: CUDA ``torch.Tensor``, ``cupy.ndarray`` or any object exporting
    ``__cuda_array_interface__`` or DLPack, contiguous, on this communicator's device; they
    are used zero-copy. Operations are stream-ordered and asynchronous like NCCL's: a call
    enqueues the work on ``stream`` (default: the current stream of the tensor's framework,
    ``torch.cuda.current_stream()`` or ``cupy.cuda.get_current_stream()``; the legacy
    default stream for other objects) and returns the output tensor at once; work later
    enqueued on that stream sees the result. Calls release the GIL while MACO runs.

    Rules (MACO's): every rank makes the same collective calls in the same order with the
    same sizes, type, op and root; calls on one communicator come from one thread at a time
    and run in call order (one stream, or streams ordered with events). Different
    communicators are independent.

    Errors: argument checks raise ``TypeError`` (not a CUDA tensor, a type MACO cannot
    take) or ``ValueError`` (not contiguous, wrong size, wrong device, bad root or peer)
    before anything is enqueued; MACO's own failures raise :class:`maco.MacoError`
    subclasses with ``.status`` and MACO's message. A kernel that waits too long for a peer
    stops and reports through :meth:`check_async_error`.

    Surviving failures: :meth:`revoke`, :meth:`shrink`, :meth:`split`, :meth:`grow` and
    :meth:`join` (``_comm_ft.py`` shows a job's recovery loop).
    """

    def __init__(self, unique_id: Optional[bytes] = None, rank: Optional[int] = None,
                 size: Optional[int] = None, *, device: Any = None,
                 timeout: Optional[float] = None, _handle=None):
        """``Communicator()`` joins the job described by the environment;
        ``Communicator(unique_id, rank, size)`` the job of ``unique_id``.

        Args:
            unique_id: 128 bytes from :func:`maco.unique_id` on rank 0, or None.
            rank: this process's rank in [0, size) (with unique_id).
            size: the number of ranks (with unique_id).
            device: CUDA device (int, "cuda:N" or torch.device); None: the local rank
                modulo the visible GPUs. It becomes the calling thread's current device.
            timeout: seconds to wait for the other ranks (None: MACO_BOOTSTRAP_TIMEOUT).

        Raises:
            ValueError: a bad argument (named).
            CommTimeoutError, RemoteError, InvalidArgumentError, SystemCallError,
            CudaError: from MACO, with its message.
        """
        self._lock = threading.Lock()
        self._c = (_handle if _handle is not None else
                   _job.create_handle(unique_id, rank, size, device, timeout))
        self._cache()

    def _cache(self) -> None:
        c = self._c
        # What set_algorithm forced, per collective (None: by size), starting from the
        # MACO_ALGO_* variables the C library read at creation; per-call choices restore it.
        self._forced = {k: os.environ.get(f"MACO_ALGO_{k.upper()}") or None
                        for k in ("allreduce", "allgather", "reduce_scatter", "broadcast",
                                  "reduce")}
        self._rank = c.rank
        self._size = c.size
        self._local_rank = c.local_rank
        self._local_size = c.local_size
        self._node = c.node
        self._num_nodes = c.num_nodes
        dev = c.device
        self._device = None if dev < 0 else dev

    # ------------------------------------------------------------ construction

    @classmethod
    def from_env(cls, *, device: Any = None) -> "Communicator":
        """Joins the job described by the environment: the variables of maco-run, torchrun,
        Open MPI's mpirun, MPICH, PMIx or Slurm's srun, the unique id through the launcher's
        store (C's maco_unique_id_from_env; docs/multi-node.md). Collective, blocking.

        Raises:
            InvalidArgumentError: a variable is missing or malformed (named).
            CommTimeoutError, RemoteError: another rank did not join or failed.
        """
        return cls(device=device)

    @classmethod
    def from_unique_id(cls, unique_id: bytes, rank: int, size: int, *, device: Any = None,
                       timeout: Optional[float] = None) -> "Communicator":
        """Joins the job of ``unique_id`` (from :func:`maco.unique_id` on rank 0) as
        ``rank`` of ``size``. Collective, blocking (``timeout`` seconds, None: the default).
        """
        return cls(unique_id, rank, size, device=device, timeout=timeout)

    @classmethod
    def from_process_group(cls, group: Any = None, *, device: Any = None,
                           timeout: Optional[float] = None) -> "Communicator":
        """A communicator over the ranks of a ``torch.distributed`` process group (default:
        the world), with the same rank numbering.

        Group rank 0 makes the unique id; it reaches the other ranks through the group's
        key-value store when torch exposes it (no collective on the group, so this works
        for NCCL groups of ranks that share a GPU), else ``broadcast_object_list`` on the
        group. Collective over the group. ``device`` defaults to the group's bound device,
        else torch's current CUDA device, else MACO's choice.

        Raises:
            RuntimeError: torch.distributed is not initialized.
            and the errors of :meth:`from_unique_id`.
        """
        uid, rank, size, device = _job.process_group_job(group, device)
        return cls(uid, rank, size, device=device, timeout=timeout)

    # ------------------------------------------------------------ properties

    @property
    def rank(self) -> int:
        """This process's rank, in [0, size)."""
        return self._rank

    @property
    def size(self) -> int:
        """The number of ranks (world size)."""
        return self._size

    @property
    def local_rank(self) -> int:
        """Rank among the ranks of this node, in rank order."""
        return self._local_rank

    @property
    def local_size(self) -> int:
        """Number of ranks on this node."""
        return self._local_size

    @property
    def node(self) -> int:
        """Index of this node (nodes numbered by their lowest rank)."""
        return self._node

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self._num_nodes

    @property
    def device(self) -> Optional[int]:
        """This rank's CUDA device ordinal, or None when it has no usable GPU."""
        return self._device

    @property
    def handle(self) -> int:
        """The ``maco_comm_t`` as an int, for C code that wants the same communicator."""
        return self._c.handle

    @property
    def closed(self) -> bool:
        return self._c.closed

    def __repr__(self) -> str:
        if self._c.closed:
            return "<maco.Communicator closed>"
        dev = "none" if self._device is None else f"cuda:{self._device}"
        return f"<maco.Communicator rank {self._rank}/{self._size} device {dev}>"

    # ------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Destroys the communicator (not collective; waits for its device work, bounded).
        Memory from :func:`maco.empty` and live registrations keep MACO's resources until
        they are freed. Idempotent; later calls raise :class:`maco.InvalidUsageError`."""
        self._c.close()

    def __enter__(self) -> "Communicator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def check_async_error(self) -> None:
        """Raises the error of device or proxy work that failed asynchronously (a peer that
        stopped answering, a receive of the wrong size), if any; a communicator in that state
        must be closed. Does not block or synchronise."""
        st = self._c.async_error()
        if st != 0:
            raise _from_status(st, self._c.last_error or _maco.status_string(st))

    @property
    def last_error(self) -> str:
        """MACO's message for the first error this communicator saw ("" if none)."""
        return self._c.last_error

    # ------------------------------------------------------------ host-side calls

    def barrier(self) -> None:
        """Blocks until every rank has called barrier(). Host-side, over the bootstrap's TCP
        connections: it does not wait for GPU work (synchronise the stream first for that).
        Collective; works without a GPU; bounded by MACO_BOOTSTRAP_TIMEOUT.

        Raises:
            CommTimeoutError, RemoteError: a rank did not arrive or died (named).
        """
        self._c.bootstrap_barrier()

    def allgather_bytes(self, data: bytes) -> list[bytes]:
        """Every rank's ``data`` (same length on every rank), in rank order. Host-side over
        the bootstrap; collective, blocking; works without a GPU."""
        return self._c.bootstrap_allgather(bytes(data))

    def broadcast_bytes(self, data: Optional[bytes], root: int = 0) -> bytes:
        """``root``'s ``data`` on every rank (others may pass None). Host-side over the
        bootstrap; collective, blocking; works without a GPU."""
        self._check_rank(root, "root")
        return self._c.bootstrap_broadcast(bytes(data or b""), root)

    def host_id(self, rank: int) -> str:
        """The node identity of ``rank`` (MACO_HOST_ID, else host name and boot id)."""
        self._check_rank(rank, "rank")
        return self._c.host_id(rank)

    # ------------------------------------------------------------ helpers

    def _check_rank(self, r: Any, name: str) -> int:
        if isinstance(r, bool) or not isinstance(r, int):
            raise TypeError(f"{name}: expected an int rank, got {type(r).__name__}")
        if not 0 <= r < self._size:
            raise ValueError(f"{name}: {r} is not a rank of this communicator [0, {self._size})")
        return r

    def _buf(self, x: Any, name: str) -> Buf:
        b = describe(x, name)
        if self._device is not None and b.device >= 0 and b.device != self._device:
            raise ValueError(f"{name}: on cuda:{b.device}, but this communicator's device is "
                             f"cuda:{self._device}")
        return b

    def _out(self, out: Any, ref: Buf, shape: Sequence[int], numel: int, what: str) -> Buf:
        """Checks ``out`` (or allocates it) for ``numel`` elements of ``ref``'s type."""
        if out is None:
            out = empty_like(ref, shape)
        ob = self._buf(out, "out")
        if ob.readonly:
            raise ValueError("out: the array is read-only")
        if not same_type(ob, ref):
            raise TypeError(f"out: dtype {ob.fdtype} differs from the input's {ref.fdtype}")
        if ob.numel != numel:
            raise ValueError(f"out: has {ob.numel} elements; {what} needs {numel}")
        return ob

    def _stream(self, stream: Any, b: Buf, *others: Buf) -> int:
        _keep(b.obj, *(o.obj for o in others))
        s = stream_handle(stream, b)
        if stream is not None:
            # An explicit stream other than the framework's: keep the caching allocator from
            # reusing the memory before that stream is done with it.
            torch = sys.modules.get("torch")
            if torch is not None:
                ts = stream if isinstance(stream, torch.cuda.Stream) else None
                for x in (b, *others):
                    if ts is not None and x.kind == "torch":
                        x.obj.record_stream(ts)
        return s

    # ------------------------------------------------------------ collectives

    def allreduce(self, x: Any, out: Any = None, *, op: Any = ReduceOp.SUM,
                  stream: Any = None) -> Any:
        """``out[i] = op over ranks of x[i]`` on every rank.

        Args:
            x: the input tensor (any shape).
            out: the output, same type and number of elements; None: in place (x is
                overwritten and returned).
            op: :class:`maco.ReduceOp` (SUM, PROD, MIN, MAX, AVG), a name, or a
                torch.distributed.ReduceOp. Complex tensors take SUM and AVG.
            stream: see the class docstring.

        Returns: ``out`` (or ``x``). Results are bitwise identical on every rank.
        """
        op = to_maco_op(op)
        xb = self._buf(x, "x")
        dt, count = reduce_type(xb, "x", op)
        ob = xb if out is None else self._out(out, xb, xb.shape, xb.numel, "allreduce")
        self._c.allreduce(xb.address, ob.address, count, int(dt), int(op),
                          self._stream(stream, xb, ob))
        return ob.obj

    def allgather(self, x: Any, out: Any = None, *, stream: Any = None) -> Any:
        """``out`` holds every rank's ``x``, in rank order.

        Args:
            x: this rank's block (any shape, n elements).
            out: size * n elements of x's type (e.g. shape (size, *x.shape) or
                (size * x.shape[0], ...)); None: a new tensor of shape (size, *x.shape).
                In place when ``x`` is ``out``'s block of this rank (same address).
        Returns: ``out``.
        """
        xb = self._buf(x, "x")
        dt, count = move_type(xb)
        ob = self._out(out, xb, (self._size, *xb.shape), xb.numel * self._size, "allgather")
        self._c.allgather(xb.address, ob.address, count, int(dt), self._stream(stream, xb, ob))
        return ob.obj

    def reduce_scatter(self, x: Any, out: Any = None, *, op: Any = ReduceOp.SUM,
                       stream: Any = None) -> Any:
        """``out[i] = op over ranks r of x_r[rank * k + i]``: block ``rank`` of the reduction.

        Args:
            x: size * k elements (e.g. shape (size, ...) or (size * m, ...)).
            out: k elements of x's type; None: a new tensor, x's shape with the first
                dimension divided by size (x.shape[1:] when it equals size; flat otherwise).
        Returns: ``out``.
        Raises:
            ValueError: x's element count is not a multiple of size.
        """
        op = to_maco_op(op)
        xb = self._buf(x, "x")
        dt, count = reduce_type(xb, "x", op)
        if xb.numel % self._size:
            raise ValueError(f"x: {xb.numel} elements is not a multiple of the world size "
                             f"{self._size}")
        k = xb.numel // self._size
        shape: tuple = (k,)
        if xb.shape and xb.shape[0] == self._size:
            shape = xb.shape[1:]
        elif xb.shape and xb.shape[0] % self._size == 0:
            shape = (xb.shape[0] // self._size, *xb.shape[1:])
        ob = self._out(out, xb, shape, k, "reduce_scatter")
        self._c.reduce_scatter(xb.address, ob.address, count // self._size, int(dt), int(op),
                               self._stream(stream, xb, ob))
        return ob.obj

    def broadcast(self, x: Any, root: int = 0, out: Any = None, *, stream: Any = None) -> Any:
        """``out = root's x`` on every rank.

        Args:
            x: the data on ``root`` (read there only); on other ranks the receive buffer
                when ``out`` is None.
            root: the sending rank.
            out: receive buffer, x's type and size; None: x (in place).
        Returns: ``out`` (or ``x``).
        """
        self._check_rank(root, "root")
        xb = self._buf(x, "x")
        dt, count = move_type(xb)
        ob = xb if out is None else self._out(out, xb, xb.shape, xb.numel, "broadcast")
        self._c.broadcast(xb.address, ob.address, count, int(dt), root,
                          self._stream(stream, xb, ob))
        return ob.obj

    def reduce(self, x: Any, root: int = 0, out: Any = None, *, op: Any = ReduceOp.SUM,
               stream: Any = None) -> Any:
        """``out[i] = op over ranks of x[i]`` on ``root``; ``out`` is not touched elsewhere.

        Args:
            out: x's type and size; None: x (in place on the root).
        Returns: ``out`` (or ``x``) on every rank.
        """
        self._check_rank(root, "root")
        op = to_maco_op(op)
        xb = self._buf(x, "x")
        dt, count = reduce_type(xb, "x", op)
        ob = xb if out is None else self._out(out, xb, xb.shape, xb.numel, "reduce")
        self._c.reduce(xb.address, ob.address, count, int(dt), int(op), root,
                       self._stream(stream, xb, ob))
        return ob.obj

    def all_to_all(self, x: Any, out: Any = None, *, in_splits: Optional[Sequence[int]] = None,
                   out_splits: Optional[Sequence[int]] = None, stream: Any = None) -> Any:
        """Block q of ``x`` goes to rank q and lands in block ``rank`` of q's ``out``.

        Without splits, x has size * k elements and each block is k elements. With
        ``in_splits``/``out_splits`` (size entries each, counted along the first dimension
        as torch's all_to_all_single), block q of x is ``in_splits[q]`` rows and block q of
        out ``out_splits[q]`` rows; ``out_splits[q]`` must equal rank q's ``in_splits[rank]``
        (a mismatch is reported by the receiver through :meth:`check_async_error`).

        Args:
            out: must not overlap x; None: a new tensor (x's shape, or
                (sum(out_splits), *x.shape[1:])).
        Returns: ``out``.
        """
        xb = self._buf(x, "x")
        dt, count = move_type(xb)
        n = self._size
        if in_splits is None and out_splits is None:
            if xb.numel % n:
                raise ValueError(f"x: {xb.numel} elements is not a multiple of the world size {n}")
            ob = self._out(out, xb, xb.shape, xb.numel, "all_to_all")
            self._c.alltoall(xb.address, ob.address, count // n, int(dt),
                             self._stream(stream, xb, ob))
            return ob.obj
        rows = xb.shape[0] if xb.shape else 1
        row = (count // rows) if rows else 0
        ins = _splits(in_splits, n, "in_splits", rows)
        if out_splits is None:
            raise ValueError("out_splits: required with in_splits (this rank cannot know what "
                             "the others send)")
        outs = _splits(out_splits, n, "out_splits", None)
        shape = (sum(outs), *xb.shape[1:])
        ob = self._out(out, xb, shape, sum(outs) * (xb.numel // rows if rows else 0),
                       "all_to_all")
        sc = [s * row for s in ins]
        rc = [s * row for s in outs]
        self._c.alltoallv(xb.address, sc, _displs(sc), ob.address, rc, _displs(rc), int(dt),
                          self._stream(stream, xb, ob))
        return ob.obj

    def send(self, x: Any, dst: int, *, stream: Any = None) -> None:
        """Sends ``x`` to rank ``dst``. Sends and receives match in call order per pair; the
        receive must have x's size. Outside a :func:`maco.group` the send completes only
        when ``dst`` posts its receive, so a rank that sends and receives puts both in one
        group."""
        self._check_rank(dst, "dst")
        xb = self._buf(x, "x")
        dt, count = move_type(xb)
        self._c.send(xb.address, count, int(dt), dst, self._stream(stream, xb))

    def recv(self, out: Any = None, src: Optional[int] = None, *,
             shape: Optional[Sequence[int]] = None, dtype: Any = None,
             stream: Any = None) -> Any:
        """Receives from rank ``src`` into ``out`` (or a new tensor of ``shape`` and
        ``dtype``: a torch dtype gives a torch tensor, a NumPy dtype a CuPy array).

        Returns: the received tensor. A size other than the matching send's is reported by
        :meth:`check_async_error` (nothing is written).
        """
        if src is None:
            raise ValueError("src: the sending rank is required")
        self._check_rank(src, "src")
        if out is None:
            if shape is None or dtype is None:
                raise ValueError("out: pass out=, or shape= and dtype= to allocate it")
            if self._device is None:
                raise UnsupportedError("recv: this rank has no usable GPU: "
                                       + (_job.cuda_device_count()[1] or "no CUDA device"))
            out = new_tensor(shape, dtype, self._device)
        ob = self._buf(out, "out")
        if ob.readonly:
            raise ValueError("out: the array is read-only")
        dt, count = move_type(ob)
        self._c.recv(ob.address, count, int(dt), src, self._stream(stream, ob))
        return ob.obj

    # ------------------------------------------------------------ algorithms

    def algorithm(self, collective: str, count: int, dtype: Any) -> str:
        """The algorithm ``collective`` ("allreduce", "allgather", "reduce_scatter",
        "broadcast", "reduce", "all_to_all", "sendrecv") would use for ``count`` elements."""
        return self._c.algorithm(_collective(collective), c_int(count, "count", 0, SIZE_MAX),
                                 int(to_maco_dtype(dtype)))

    def set_algorithm(self, collective: str, name: Optional[str]) -> None:
        """Forces ``collective``'s algorithm on this communicator (None: by size again).
        Every rank must force the same one."""
        self._c.set_algorithm(_collective(collective), name)
        self._forced[collective] = name or None

    def forced_algorithm(self, collective: str) -> Optional[str]:
        """The algorithm forced on ``collective`` (:meth:`set_algorithm`, else its
        MACO_ALGO_* variable at creation); None: chosen by size."""
        _collective(collective)
        return self._forced.get(collective)

    def set_max_ctas(self, max_ctas: Optional[int]) -> None:
        """Caps the CTAs of this communicator's collective and send/recv kernels (None or 0:
        no cap), leaving the rest of the GPU's SMs to compute that overlaps them
        (``maco_collective_set_max_ctas``). Collective and blocking: every rank passes the
        same value, else :class:`InvalidArgumentError` on every rank naming the first rank
        that differs. Calls already issued keep their CTA count.

        Raises:
            ValueError: ``max_ctas`` negative or above 2**31 - 1 (a C int).
        """
        n = 0 if max_ctas is None else int(max_ctas)
        if n < 0:
            raise ValueError(f"max_ctas: {max_ctas} is negative")
        self._c.set_max_ctas(c_int(n, "max_ctas"))

    @property
    def max_ctas(self) -> int:
        """The cap of :meth:`set_max_ctas` (0: none)."""
        return self._c.max_ctas()[0]

    @property
    def coresident_ctas(self) -> int:
        """The most CTAs a kernel that waits on peers launches on this communicator (SM count
        divided by the ranks sharing the GPU, minimum over ranks)."""
        return self._c.max_ctas()[1]

    def stats(self) -> dict:
        """``{"inplace": n, "scratch": m, "last_launch_ctas": c}``: mesh kernel launches that
        used registered buffers in place and that went through scratch, and the CTAs of the
        last collective kernel launched (0: none yet). Synchronises the device."""
        i, s, c = self._c.stats()
        return {"inplace": i, "scratch": s, "last_launch_ctas": c}


def _collective(name: str) -> int:
    try:
        return _COLLECTIVES[name]
    except KeyError:
        raise ValueError(f"collective: {name!r} is not one of {sorted(set(_COLLECTIVES))}") from None


def _splits(splits: Optional[Sequence[int]], n: int, name: str, total: Optional[int]) -> list[int]:
    if splits is None:
        if total is None or total % n:
            raise ValueError(f"{name}: required (the first dimension {total} does not divide "
                             f"into {n} equal blocks)")
        return [total // n] * n
    s = [int(v) for v in splits]
    if len(s) != n:
        raise ValueError(f"{name}: {len(s)} entries; the world size is {n}")
    if any(v < 0 for v in s):
        raise ValueError(f"{name}: negative entry in {s}")
    if total is not None and sum(s) != total:
        raise ValueError(f"{name}: sums to {sum(s)}, but x's first dimension is {total}")
    return s


def _displs(counts: Sequence[int]) -> list[int]:
    out, acc = [], 0
    for c in counts:
        out.append(acc)
        acc += c
    return out
