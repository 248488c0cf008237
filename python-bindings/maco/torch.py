"""MACO as a torch.distributed backend.

``import maco.torch`` registers the backend ``"maco"``::

    import torch.distributed as dist
    import maco.torch  # noqa: F401
    dist.init_process_group("maco")      # or "cuda:maco"; torchrun's variables as usual
    dist.all_reduce(x)                   # x on CUDA: MACO; on CPU: Gloo

Device binding, as NCCL's process group: the group's MACO communicator uses one GPU, chosen

1. by ``init_process_group("maco", device_id=torch.device("cuda", i))``: bound to cuda:i and
   created during init_process_group (every rank passes device_id, or none does);
2. else lazily, by the device of the first tensor of the group's first CUDA operation
   (collective, send or receive): the communicator is created then, by every rank at its own
   first CUDA call on the group (creation is collective: each rank must make one). So
   ``torch.cuda.set_device(local_rank)`` may come before or after init_process_group;
3. else, where a device is needed without a tensor (``pg.comm`` read before any CUDA call, or
   a barrier with ``device_ids``), LOCAL_RANK modulo the visible GPUs (MACO's own choice, its
   local rank, when LOCAL_RANK is unset). A barrier before any CUDA call binds nothing: it runs
   on the Gloo group.

A tensor on another GPU than the bound one raises ValueError naming both devices and the rank,
before anything is enqueued.

The process group runs CUDA tensors' all_reduce, all_gather(_into_tensor), reduce_scatter
(_tensor), broadcast, reduce, all_to_all(_single), gather, scatter, send/recv (isend/irecv,
batch_isend_irecv) and barrier on MACO, and hands
CPU tensors to a Gloo process group it creates beside it. Work runs on one internal CUDA
stream per group, ordered after the caller's current stream; ``work.wait()`` makes the
caller's current stream wait for it (as NCCL's process group does), so ``async_op=True``
overlaps communication with later compute.

Sends and receives (``send``/``recv``, ``isend``/``irecv``, ``batch_isend_irecv``) are
queued and issued together, as one MACO group, when the program first waits on (or polls) one
of their works, or makes any other call on the group. So rings of ``isend``/``irecv`` and
``batch_isend_irecv`` do not deadlock, though torch.distributed gives a Python backend no
coalescing calls. The difference from NCCL's process group: a send that is never waited on
and followed by no other call on its group is not issued; wait on every work (as the
torch.distributed documentation requires anyway). ``gather`` and ``scatter`` run as such
groups of sends and receives.

:func:`patch_torch_distributed` instead keeps an existing process group (e.g. NCCL) and
routes the ``torch.distributed`` functions' CUDA calls through MACO, with no other change to
the program.
"""

from __future__ import annotations

import contextlib
import datetime
import functools
import os
import sys
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from ._comm import Communicator, unique_id
from ._comm import group as _group
from ._errors import MacoError
from ._types import to_maco_op

__all__ = ["ProcessGroupMaco", "MacoWork", "patch_torch_distributed",
           "unpatch_torch_distributed", "BACKEND_NAME"]

BACKEND_NAME = "maco"


_raw_current_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_stream_objects: dict = {}


def _current_stream(device: torch.device) -> torch.cuda.Stream:
    """``torch.cuda.current_stream(device)`` at a fraction of its host cost: the raw handle
    is one C call, and the Stream object for a handle is kept (torch's streams live as long as
    the process; at most 256 are kept)."""
    if _raw_current_stream is None:
        return torch.cuda.current_stream(device)
    idx = device.index if device.index is not None else torch.cuda.current_device()
    key = (idx, _raw_current_stream(idx))
    s = _stream_objects.get(key)
    if s is None:
        s = torch.cuda.current_stream(device)
        if s.cuda_stream == key[1] and len(_stream_objects) < 256:
            _stream_objects[key] = s
    return s


class MacoWork(dist.Work):
    """The handle of one MACO operation of a :class:`ProcessGroupMaco`.

    ``wait()`` makes the caller's current CUDA stream wait for the operation (it does not
    block the host) and raises MACO's asynchronous error if one was reported;
    ``synchronize()`` blocks the host until it is done; ``is_completed()`` polls;
    ``get_future()`` leaves the current stream free (the Future's readers wait on theirs).
    """

    def __init__(self, outputs: list, event: Optional[torch.cuda.Event], comm: Communicator,
                 device: Optional[torch.device], pg: Optional["ProcessGroupMaco"] = None):
        super().__init__()
        self._outputs = outputs
        self._event = event
        self._comm = comm
        self._device = device
        self._pg = pg  # set while the work is a queued send or receive, until it is issued
        self._error: Optional[BaseException] = None  # issuing its queued batch failed

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error
        self._comm.check_async_error()

    def _issue(self) -> None:
        pg = self._pg
        if pg is not None:
            pg._flush_p2p()

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        self._issue()
        if self._event is not None:
            _current_stream(self._device).wait_event(self._event)
        self._raise()
        return True

    def block_current_stream(self) -> None:
        self._issue()
        if self._event is not None:
            _current_stream(self._device).wait_event(self._event)

    def synchronize(self) -> None:
        self._issue()
        if self._event is not None:
            self._event.synchronize()
        self._raise()

    def is_completed(self) -> bool:
        self._issue()
        return self._event is None or self._event.query()

    def is_success(self) -> bool:
        return self.is_completed() and self._error is None and self._comm._c.async_error() == 0

    def exception(self) -> Any:
        try:
            self._raise()
        except MacoError as e:
            return e
        except Exception as e:  # issuing the queued batch failed (an argument error)
            return e
        return None

    def result(self) -> list:
        return self._outputs

    def get_future(self) -> torch.futures.Future:
        """A CUDA-aware Future of the outputs, completed on a stream that waits for the
        operation (as NCCL's process group completes it on its own stream): whoever reads the
        value (``wait()``, ``value()``, a ``then`` callback) waits for the operation on its
        own stream; the caller's current stream is left free (DDP's reducer chains its bucket
        callbacks on this while the backward pass goes on). Raises the issuing error or
        MACO's asynchronous error if one was reported already."""
        self._issue()
        self._raise()
        if self._event is None or self._device is None:
            fut = torch.futures.Future()
            fut.set_result(self._outputs)
            return fut
        s = _future_stream(self._device)
        s.wait_event(self._event)
        fut = torch.futures.Future(devices=[self._device])
        with torch.cuda.stream(s):  # the Future records its completion event on s
            fut.set_result(self._outputs)
        return fut


_future_streams: dict = {}


def _future_stream(device: torch.device) -> torch.cuda.Stream:
    """The stream, one per device, on which the Futures of :meth:`MacoWork.get_future` are
    completed: it only waits for operations' events."""
    s = _future_streams.get(device.index)
    if s is None:
        s = torch.cuda.Stream(device=device)
        _future_streams[device.index] = s
    return s


class _BoundBackend:
    """What :meth:`ProcessGroupMaco._get_backend` answers for the device bound by
    ``device_id=``: torch.distributed then asks whether the backend can split (no) instead of
    failing on a Python process group that registered no C++ backend."""

    supports_splitting = False
    supports_coalescing = False
    supports_time_estimate = False

    def name(self) -> str:
        return BACKEND_NAME


class ProcessGroupMaco(dist.ProcessGroup):
    """A torch.distributed process group whose CUDA collectives run on MACO.

    Created by ``init_process_group("maco")`` (through :func:`_create`), or over an existing
    group by :func:`patch_torch_distributed`. CPU tensors go to ``fallback`` (a Gloo group
    made beside it when created by init_process_group), else raise TypeError.

    Args:
        rank, size: this rank and the group's size.
        comm: a ready communicator (its device is the bound one), or None: one is made at
            the first use from ``store`` (rank 0 puts a unique id there) and ``timeout``, on
            the device chosen by the rules of this module's docstring.
        fallback: the process group CPU tensors go to (None: they raise TypeError).
        store: the group's key-value store (needed when ``comm`` is None).
        timeout: creation's bound (None: MACO_BOOTSTRAP_TIMEOUT).
        device: a CUDA device to bind to now (``init_process_group``'s ``device_id``): the
            communicator is created in the constructor (collective: every rank).

    Raises:
        ValueError: ``device`` is not a CUDA device with an index.
    """

    def __init__(self, rank: int, size: int, comm: Optional[Communicator] = None,
                 fallback: Optional[dist.ProcessGroup] = None, *, store: Any = None,
                 timeout: Optional[datetime.timedelta] = None,
                 device: Optional[torch.device] = None):
        super().__init__(rank, size)
        if comm is None and store is None:
            raise ValueError("store: required when no communicator is given (comm=None)")
        self._comm = comm
        self._store = store
        self._timeout = timeout
        self._fallback = fallback
        self._streams: dict = {}
        # Per device: the event that orders the group's stream after the current stream's work
        # (recorded again at every call: a wait already enqueued keeps the record it saw).
        self._order_events: dict = {}
        self._lock = threading.RLock()  # held while the p2p queue is issued (_flush_p2p)
        # Queued sends and receives: (is_send, tensors, peer, ready event, work), in call order.
        self._p2p: list = []
        # The bound device (None: not bound yet, or no GPU) and what bound it.
        self._bound: Optional[torch.device] = None
        self._bound_by = ""
        self._device_id: Optional[torch.device] = None
        if comm is not None:
            if comm.device is not None:
                self._bound = torch.device("cuda", comm.device)
                self._bound_by = "the communicator the group was made with"
        elif device is not None:
            device = torch.device(device)
            if device.type != "cuda" or device.index is None:
                raise ValueError(f"device: {device} is not a CUDA device with an index "
                                 "(e.g. torch.device('cuda', 0))")
            self._device_id = device
            self._bind(device, f"init_process_group's device_id={device}")

    # ------------------------------------------------------------ device binding

    @property
    def comm(self) -> Communicator:
        """The group's MACO communicator. Reading it before the group's first CUDA call
        creates it (collective: every rank must read it) on LOCAL_RANK's GPU (rule 3 of the
        module's docstring)."""
        c = self._comm
        if c is None:
            dev = _local_rank_device()
            why = (f"LOCAL_RANK={os.environ.get('LOCAL_RANK')}" if dev is not None else
                   "MACO's choice, its local rank modulo the GPUs")
            c = self._bind(dev, f"{why}: pg.comm was read before the group's first CUDA call")
        return c

    @property
    def device(self) -> Optional[torch.device]:
        """The CUDA device the group is bound to; None before its first CUDA call (or on a
        machine without a usable GPU)."""
        return self._bound

    def _bind(self, device: Optional[torch.device], why: str) -> Communicator:
        """Creates the communicator on ``device`` (None: MACO's choice) unless there is one
        already; collective over the group's ranks. torch's current device is left as it was.
        """
        with self._lock:
            if self._comm is not None:
                return self._comm
            key = "maco/unique_id"
            if self.rank() == 0:
                self._store.set(key, unique_id())
            uid = bytes(self._store.get(key))
            timeout = None if self._timeout is None else self._timeout.total_seconds()
            index = None if device is None else device.index
            guard = (torch.cuda.device(index) if index is not None and torch.cuda.is_available()
                     else contextlib.nullcontext())
            with guard:  # maco_comm_create makes its device current: restore torch's
                comm = Communicator(uid, self.rank(), self.size(), device=index,
                                    timeout=timeout)
            self._comm = comm
            if comm.device is not None:
                self._bound = torch.device("cuda", comm.device)
                self._bound_by = why
            return comm

    def _comm_for(self, tensors: list) -> Communicator:
        """The communicator for a CUDA call on ``tensors``: made on the first tensor's device
        at the group's first CUDA call; afterwards every tensor must be on the bound device.

        Raises:
            ValueError: a tensor on another device than the bound one (names both, the rank
                and the remedies); nothing is enqueued.
        """
        c = self._comm
        if c is None:
            dev = tensors[0].device
            c = self._bind(dev, f"the first tensor of the group's first CUDA call, on {dev}")
        b = self._bound
        if b is not None:
            for t in tensors:
                d = t.device
                if d != b:
                    raise ValueError(
                        f"maco process group, rank {self.rank()}: a tensor is on {d}, but the "
                        f"group's MACO communicator is bound to {b} (by {self._bound_by}); a "
                        f"group uses one GPU. Put the call's tensors on {b}, or bind the group "
                        f"to {d}: torch.cuda.set_device({d.index}) before the group's first "
                        f"CUDA call, or init_process_group('maco', "
                        f"device_id=torch.device('cuda', {d.index}))")
        return c

    def _get_backend(self, device: Any) -> Any:
        """torch.distributed's question for the group's backend on ``device``: on the device
        bound by ``device_id=`` this group answers itself (it cannot split); elsewhere
        torch's own answer (a RuntimeError: no C++ backend is registered)."""
        d = torch.device(device)
        if self._device_id is not None and d == self._device_id:
            return _BoundBackend()
        return super()._get_backend(device)

    # ------------------------------------------------------------ plumbing

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        s = self._streams.get(device.index)
        if s is None:
            s = torch.cuda.Stream(device=device)
            self._streams[device.index] = s
        return s

    def _cpu(self, tensors: list) -> bool:
        kinds = {t.is_cuda for t in tensors}
        if kinds == {True}:
            return False
        if kinds == {False}:
            if self._fallback is None:
                raise TypeError("maco process group: CPU tensors need a CPU backend "
                                "(init_process_group('maco') makes a Gloo one)")
            return True
        raise TypeError("maco process group: a call mixes CPU and CUDA tensors")

    def _launch(self, tensors: list, outputs: list, fn: Callable[[Any], None]) -> MacoWork:
        """Runs fn(stream) on the group's stream after the current stream's work (and after
        the queued sends and receives), with the tensors' device current (torch's current
        device may be another one, e.g. after ``device_id=`` without set_device), as NCCL's
        process group does."""
        self._flush_p2p()
        comm = self._comm_for(tensors)
        device = tensors[0].device
        s = self._stream(device)
        # s waits for the current stream (Stream.wait_stream's order, through one event per
        # device instead of a new one per call: 8 us of host time per call, 2026-11-28).
        with self._lock:  # record and wait as a pair when threads share the group
            order = self._order_events.get(device.index)
            if order is None:
                order = self._order_events[device.index] = torch.cuda.Event()
            order.record(_current_stream(device))
            s.wait_event(order)
        if torch.cuda.current_device() == device.index:
            fn(s)
        else:
            with torch.cuda.device(device):  # MACO launches on the current device: the tensors'
                fn(s)
        for t in tensors:
            t.record_stream(s)
        ev = torch.cuda.Event()
        ev.record(s)
        return MacoWork(outputs, ev, comm, device)

    # ------------------------------------------------------------ collectives

    def allreduce(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        opts = opts if isinstance(opts, _c10d.AllreduceOptions) else _allreduce_opts(opts)
        if self._cpu(tensors):
            return self._fallback.allreduce(tensors, opts)
        op = to_maco_op(opts.reduceOp)

        def run(s):
            for t in tensors:
                self.comm.allreduce(t, op=op, stream=s)
        return self._launch(tensors, tensors, run)

    def allreduce_coalesced(self, tensors, opts=None):
        opts = opts or _c10d.AllreduceCoalescedOptions()
        if self._cpu(tensors):
            return self._fallback.allreduce_coalesced(tensors, opts)
        op = to_maco_op(opts.reduceOp)

        def run(s):
            for t in tensors:
                self.comm.allreduce(t, op=op, stream=s)
        return self._launch(tensors, tensors, run)

    def broadcast(self, tensors, opts=None):
        if not isinstance(tensors, list):
            tensors = [tensors]
        opts = opts or _c10d.BroadcastOptions()
        if self._cpu(tensors):
            return self._fallback.broadcast(tensors, opts)

        def run(s):
            for t in tensors:
                self.comm.broadcast(t, opts.rootRank, stream=s)
        return self._launch(tensors, tensors, run)

    def reduce(self, tensors, opts=None):
        opts = opts or _c10d.ReduceOptions()
        if self._cpu(tensors):
            return self._fallback.reduce(tensors, opts)
        op = to_maco_op(opts.reduceOp)

        def run(s):
            for t in tensors:
                self.comm.reduce(t, opts.rootRank, op=op, stream=s)
        return self._launch(tensors, tensors, run)

    def _allgather_base(self, output, input, opts=None):  # noqa: A002 - torch's name
        opts = opts or _c10d.AllgatherOptions()
        if self._cpu([output, input]):
            return self._fallback._allgather_base(output, input, opts)
        return self._launch([output, input], [output],
                            lambda s: self.comm.allgather(input, output, stream=s))

    def allgather(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        flat_in = list(input_tensors)
        flat_out = [t for lst in output_tensors for t in lst]
        if self._cpu(flat_in + flat_out):
            return self._fallback.allgather(output_tensors, input_tensors, opts)
        staged = []

        def run(s):
            for outs, inp in zip(output_tensors, input_tensors):
                if len(outs) != self.size():
                    raise ValueError(f"tensor_list: {len(outs)} tensors; the group has "
                                     f"{self.size()} ranks")
                with torch.cuda.stream(s):
                    buf = torch.empty((self.size(), *inp.shape), dtype=inp.dtype,
                                      device=inp.device)
                    self.comm.allgather(inp, buf, stream=s)
                    for r, o in enumerate(outs):
                        o.copy_(buf[r].view_as(o))
                staged.append(buf)
        return self._launch(flat_in + flat_out, output_tensors, run)

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.AllgatherOptions()
        if self._cpu(list(outputs) + list(inputs)):
            return self._fallback.allgather_into_tensor_coalesced(outputs, inputs, opts)

        def run(s):
            for o, i in zip(outputs, inputs):
                self.comm.allgather(i, o, stream=s)
        return self._launch(list(outputs) + list(inputs), list(outputs), run)

    def _reduce_scatter_base(self, output, input, opts=None):  # noqa: A002
        opts = opts or _c10d.ReduceScatterOptions()
        if self._cpu([output, input]):
            return self._fallback._reduce_scatter_base(output, input, opts)
        op = to_maco_op(opts.reduceOp)
        return self._launch([output, input], [output],
                            lambda s: self.comm.reduce_scatter(input, output, op=op, stream=s))

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        flat_in = [t for lst in input_tensors for t in lst]
        if self._cpu(list(output_tensors) + flat_in):
            return self._fallback.reduce_scatter(output_tensors, input_tensors, opts)
        op = to_maco_op(opts.reduceOp)

        def run(s):
            for out, ins in zip(output_tensors, input_tensors):
                if len(ins) != self.size():
                    raise ValueError(f"input_list: {len(ins)} tensors; the group has "
                                     f"{self.size()} ranks")
                with torch.cuda.stream(s):
                    buf = torch.cat([t.reshape(-1) for t in ins])
                self.comm.reduce_scatter(buf, out, op=op, stream=s)
        return self._launch(list(output_tensors) + flat_in, list(output_tensors), run)

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or _c10d.ReduceScatterOptions()
        if self._cpu(list(outputs) + list(inputs)):
            return self._fallback.reduce_scatter_tensor_coalesced(outputs, inputs, opts)
        op = to_maco_op(opts.reduceOp)

        def run(s):
            for o, i in zip(outputs, inputs):
                self.comm.reduce_scatter(i, o, op=op, stream=s)
        return self._launch(list(outputs) + list(inputs), list(outputs), run)

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes,  # noqa: A002
                      opts=None):
        opts = opts or _c10d.AllToAllOptions()
        if self._cpu([output, input]):
            return self._fallback.alltoall_base(output, input, output_split_sizes,
                                                input_split_sizes, opts)
        ins = list(input_split_sizes) or None
        outs = list(output_split_sizes) or None
        if ins is not None and outs is None:
            outs = [output.shape[0] // self.size()] * self.size()
        if outs is not None and ins is None:
            ins = [input.shape[0] // self.size()] * self.size()
        return self._launch([output, input], [output], lambda s: self.comm.all_to_all(
            input, output, in_splits=ins, out_splits=outs, stream=s))

    def alltoall(self, output_tensors, input_tensors, opts=None):
        opts = opts or _c10d.AllToAllOptions()
        if self._cpu(list(output_tensors) + list(input_tensors)):
            return self._fallback.alltoall(output_tensors, input_tensors, opts)
        n = self.size()
        if len(input_tensors) != n or len(output_tensors) != n:
            raise ValueError(f"all_to_all: lists of {n} tensors are needed")

        def run(s):
            with torch.cuda.stream(s):
                flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
                flat_out = torch.empty(sum(t.numel() for t in output_tensors),
                                       dtype=output_tensors[0].dtype,
                                       device=output_tensors[0].device)
            self.comm.all_to_all(flat_in, flat_out,
                                 in_splits=[t.numel() for t in input_tensors],
                                 out_splits=[t.numel() for t in output_tensors], stream=s)
            with torch.cuda.stream(s):
                at = 0
                for t in output_tensors:
                    t.copy_(flat_out[at:at + t.numel()].view_as(t))
                    at += t.numel()
        return self._launch(list(output_tensors) + list(input_tensors), list(output_tensors), run)

    def _post_p2p(self, is_send: bool, tensors: list, peer: int) -> MacoWork:
        """Queues a send or receive (see the module's text); its work issues the queue."""
        if not 0 <= peer < self.size():
            raise ValueError(f"{'dst' if is_send else 'src'}: rank {peer} is outside the "
                             f"group's [0, {self.size()})")
        comm = self._comm_for(tensors)
        device = tensors[0].device
        ready = torch.cuda.Event()
        ready.record(_current_stream(device))
        work = MacoWork([] if is_send else tensors, None, comm, device, pg=self)
        with self._lock:
            self._p2p.append((is_send, tensors, peer, ready, work))
        return work

    def _flush_p2p(self) -> None:
        """Issues the queued sends and receives as one MACO group on the group's stream.
        Under the group's lock, so a work waited for on another thread meanwhile finds its
        operation issued (or its batch's error), never an empty queue."""
        with self._lock:
            ops, self._p2p = self._p2p, []
            if not ops:
                return
            device = ops[0][1][0].device
            s = self._stream(device)
            for _, _, _, ready, _ in ops:
                s.wait_event(ready)
            error: Optional[BaseException] = None
            try:
                with torch.cuda.device(device), _group():
                    for is_send, tensors, peer, _, _ in ops:
                        for t in tensors:
                            if is_send:
                                self.comm.send(t, peer, stream=s)
                            else:
                                self.comm.recv(t, peer, stream=s)
            except BaseException as e:  # nothing of the group was issued: every work fails
                error = e
                raise
            finally:
                ev = torch.cuda.Event()
                ev.record(s)
                for _, tensors, _, _, work in ops:
                    for t in tensors:
                        t.record_stream(s)
                    work._event = ev
                    work._error = error
                    work._pg = None

    def send(self, tensors, dstRank, tag=0):  # noqa: N803 - torch's names
        if self._cpu(tensors):
            return self._fallback.send(tensors, dstRank, tag)
        return self._post_p2p(True, list(tensors), dstRank)

    def recv(self, tensors, srcRank, tag=0):  # noqa: N803
        if self._cpu(tensors):
            return self._fallback.recv(tensors, srcRank, tag)
        return self._post_p2p(False, list(tensors), srcRank)

    def gather(self, output_tensors, input_tensors, opts=None):
        """dist.gather: every rank sends its tensor to the root, in one group of sends and
        receives (the root copies its own)."""
        opts = opts or _c10d.GatherOptions()
        root = opts.rootRank
        flat_out = [t for lst in output_tensors for t in lst]
        if self._cpu(list(input_tensors) + flat_out):
            return self._fallback.gather(output_tensors, input_tensors, opts)
        if len(input_tensors) != 1:
            raise ValueError(f"gather: one input tensor per rank, not {len(input_tensors)}")
        inp = input_tensors[0]
        if self.rank() == root:
            if len(output_tensors) != 1 or len(output_tensors[0]) != self.size():
                got = len(output_tensors[0]) if len(output_tensors) == 1 else None
                raise ValueError(f"gather_list: {self.size()} tensors are needed on the root, "
                                 f"got {got if got is not None else len(output_tensors)} "
                                 f"{'tensors' if got is not None else 'lists'}")
            outs = output_tensors[0]
            for r, o in enumerate(outs):
                if o.numel() != inp.numel() or o.dtype != inp.dtype:
                    raise ValueError(f"gather_list[{r}]: {o.numel()} {o.dtype} elements; the "
                                     f"input has {inp.numel()} {inp.dtype}")

            def run(s):
                with _group():
                    for r, o in enumerate(outs):
                        if r != root:
                            self.comm.recv(o, r, stream=s)
                with torch.cuda.stream(s):
                    outs[root].copy_(inp.view_as(outs[root]))
            return self._launch([inp] + list(outs), [outs], run)
        return self._launch([inp], [], lambda s: self.comm.send(inp, root, stream=s))

    def scatter(self, output_tensors, input_tensors, opts=None):
        """dist.scatter: the root sends one tensor to every rank, in one group of sends and
        receives (it copies its own)."""
        opts = opts or _c10d.ScatterOptions()
        root = opts.rootRank
        flat_in = [t for lst in input_tensors for t in lst]
        if self._cpu(list(output_tensors) + flat_in):
            return self._fallback.scatter(output_tensors, input_tensors, opts)
        if len(output_tensors) != 1:
            raise ValueError(f"scatter: one output tensor per rank, not {len(output_tensors)}")
        out = output_tensors[0]
        if self.rank() == root:
            if len(input_tensors) != 1 or len(input_tensors[0]) != self.size():
                got = len(input_tensors[0]) if len(input_tensors) == 1 else None
                raise ValueError(f"scatter_list: {self.size()} tensors are needed on the root, "
                                 f"got {got if got is not None else len(input_tensors)} "
                                 f"{'tensors' if got is not None else 'lists'}")
            ins = input_tensors[0]
            for r, t in enumerate(ins):
                if t.numel() != out.numel() or t.dtype != out.dtype:
                    raise ValueError(f"scatter_list[{r}]: {t.numel()} {t.dtype} elements; the "
                                     f"output has {out.numel()} {out.dtype}")

            def run(s):
                with _group():
                    for r, t in enumerate(ins):
                        if r != root:
                            self.comm.send(t, r, stream=s)
                with torch.cuda.stream(s):
                    out.copy_(ins[root].view_as(out))
            return self._launch([out] + list(ins), [out], run)
        return self._launch([out], [out], lambda s: self.comm.recv(out, root, stream=s))

    def barrier(self, opts=None):
        """Waits for this rank's MACO work, then for every rank (host-side). Before the
        group's first CUDA call there is no MACO work: the Gloo group's barrier runs and
        nothing is bound, unless ``device_ids`` names a GPU (it binds the group there)."""
        self._flush_p2p()
        if self._comm is None:
            ids = list(getattr(opts, "device_ids", None) or [])
            if ids:
                self._bind(torch.device("cuda", int(ids[0])), f"barrier's device_ids={ids}")
            elif self._fallback is not None:
                return self._fallback.barrier(opts or _c10d.BarrierOptions())
        comm = self.comm
        for s in list(self._streams.values()):
            s.synchronize()
        comm.barrier()
        return MacoWork([], None, comm, None)

    def shutdown(self) -> None:
        if self._comm is not None:
            self._flush_p2p()
            self._comm.close()

    def abort(self) -> None:
        if self._comm is not None:
            self._comm.close()


def _allreduce_opts(op: Any) -> _c10d.AllreduceOptions:
    o = _c10d.AllreduceOptions()
    if op is not None:
        o.reduceOp = op
    return o


def _local_rank_device() -> Optional[torch.device]:
    """cuda:(LOCAL_RANK modulo the visible GPUs); None without LOCAL_RANK or a usable GPU
    (MACO then picks its own local rank modulo the GPUs, or runs without one)."""
    lr = os.environ.get("LOCAL_RANK", "")
    if not lr.isdigit() or not torch.cuda.is_available():
        return None
    n = torch.cuda.device_count()
    return torch.device("cuda", int(lr) % n) if n > 0 else None


def _requested_device_id() -> Optional[torch.device]:
    """The ``device_id=`` of the init_process_group (or new_group) call that is creating the
    group: torch sets it as ``bound_device_id`` on a ProcessGroup that a Python backend's group
    replaces, and hands a backend's constructor only (store, rank, size, timeout); so it is
    read from torch's helper frame (its parameter ``device_id`` in every release since 2.3).
    None when there is none, or it is not a CUDA device."""
    f = sys._getframe(1)
    while f is not None:
        if f.f_code.co_name == "_new_process_group_helper":
            d = f.f_locals.get("device_id")
            if isinstance(d, int) and not isinstance(d, bool):
                d = torch.device("cuda", d)
            if isinstance(d, torch.device) and d.type == "cuda" and d.index is not None:
                return d
            return None
        f = f.f_back
    return None


def _create(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> ProcessGroupMaco:
    """init_process_group's constructor for "maco": the communicator is made at once on
    ``device_id`` when init_process_group was given one, else at the group's first CUDA call
    (the module's binding rules); its unique id travels through the group's store. A Gloo
    group beside it takes CPU tensors."""
    fallback = None
    if dist.is_gloo_available():
        fallback = dist.ProcessGroupGloo(dist.PrefixStore("maco_gloo/", store), rank, size,
                                         timeout)
    device = _requested_device_id()
    pg = ProcessGroupMaco(rank, size, None, fallback, store=store, timeout=timeout,
                          device=device)
    if device is not None:
        pg.bound_device_id = device  # what torch set on the group this one replaces
    return pg


def _register() -> None:
    if BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {}):
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, devices=["cpu", "cuda"])


_register()


# ------------------------------------------------------------------ patching

_originals: dict = {}
_patched_groups: dict = {}
_patch_lock = threading.Lock()


def _group_key(group: Any) -> str:
    from ._comm import _pg_name

    return _pg_name(group)


def _maco_pg(group: Any, device: Optional[torch.device] = None) -> Optional[ProcessGroupMaco]:
    """The MACO process group shadowing ``group`` (made at its first patched call:
    collective over the group, on ``device``, that call's tensors' device; None: the group's
    bound device, else torch's current one), or None when the call must go to the
    original."""
    pg = group if group is not None else dist.group.WORLD
    if isinstance(pg, ProcessGroupMaco):
        return None
    key = _group_key(pg)
    with _patch_lock:
        m = _patched_groups.get(key)
        if m is None:
            comm = Communicator.from_process_group(pg, device=device)
            m = ProcessGroupMaco(dist.get_rank(pg), dist.get_world_size(pg), comm)
            _patched_groups[key] = m
    return m


def _eligible(*tensors: Any) -> bool:
    return all(isinstance(t, torch.Tensor) and t.is_cuda and t.is_contiguous()
               for t in tensors)


def _finish(work: MacoWork, async_op: bool) -> Any:
    if async_op:
        return work
    work.wait()
    return None


def _group_rank(group: Any, global_rank: int) -> int:
    if group is None or group is dist.group.WORLD:
        return global_rank
    return dist.get_group_rank(group, global_rank)


def _wrap(name: str, route: Callable) -> None:
    orig = getattr(dist, name)
    _originals[name] = orig

    @functools.wraps(orig)
    def wrapper(*args, **kwargs):
        try:
            return route(orig, *args, **kwargs)
        except _Fallback:
            return orig(*args, **kwargs)

    wrapper.__maco_patched__ = True
    setattr(dist, name, wrapper)
    setattr(dist.distributed_c10d, name, wrapper)


class _Fallback(Exception):
    """The call is not one MACO takes: run torch's own."""


def _pg_or_fallback(group: Any, *tensors: Any) -> ProcessGroupMaco:
    if not _eligible(*tensors):
        raise _Fallback()
    if group is not None and dist.distributed_c10d._rank_not_in_group(group):
        raise _Fallback()
    m = _maco_pg(group, tensors[0].device if tensors else None)
    if m is None:
        raise _Fallback()
    return m


def _op_or_fallback(op: Any) -> Any:
    try:
        return to_maco_op(op)
    except ValueError:
        raise _Fallback() from None


def _r_all_reduce(orig, tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
    m = _pg_or_fallback(group, tensor)
    o = _op_or_fallback(op)
    w = m._launch([tensor], [tensor], lambda s: m.comm.allreduce(tensor, op=o, stream=s))
    return _finish(w, async_op)


def _r_all_gather_into_tensor(orig, output_tensor, input_tensor, group=None, async_op=False):
    m = _pg_or_fallback(group, output_tensor, input_tensor)
    return _finish(m._allgather_base(output_tensor, input_tensor), async_op)


def _r_all_gather(orig, tensor_list, tensor, group=None, async_op=False):
    m = _pg_or_fallback(group, tensor, *tensor_list)
    return _finish(m.allgather([tensor_list], [tensor]), async_op)


def _r_reduce_scatter_tensor(orig, output, input, op=dist.ReduceOp.SUM, group=None,  # noqa: A002
                             async_op=False):
    m = _pg_or_fallback(group, output, input)
    o = _op_or_fallback(op)
    w = m._launch([output, input], [output],
                  lambda s: m.comm.reduce_scatter(input, output, op=o, stream=s))
    return _finish(w, async_op)


def _r_reduce_scatter(orig, output, input_list, op=dist.ReduceOp.SUM, group=None,
                      async_op=False):
    m = _pg_or_fallback(group, output, *input_list)
    opts = _c10d.ReduceScatterOptions()
    _op_or_fallback(op)
    opts.reduceOp = op
    return _finish(m.reduce_scatter([output], [input_list], opts), async_op)


def _r_broadcast(orig, tensor, src=None, group=None, async_op=False, group_src=None):
    m = _pg_or_fallback(group, tensor)
    root = group_src if group_src is not None else _group_rank(group, src or 0)
    w = m._launch([tensor], [tensor], lambda s: m.comm.broadcast(tensor, root, stream=s))
    return _finish(w, async_op)


def _r_reduce(orig, tensor, dst=None, op=dist.ReduceOp.SUM, group=None, async_op=False,
              group_dst=None):
    m = _pg_or_fallback(group, tensor)
    o = _op_or_fallback(op)
    root = group_dst if group_dst is not None else _group_rank(group, dst or 0)
    w = m._launch([tensor], [tensor], lambda s: m.comm.reduce(tensor, root, op=o, stream=s))
    return _finish(w, async_op)


def _r_all_to_all_single(orig, output, input, output_split_sizes=None,  # noqa: A002
                         input_split_sizes=None, group=None, async_op=False):
    m = _pg_or_fallback(group, output, input)
    return _finish(m.alltoall_base(output, input, output_split_sizes or [],
                                   input_split_sizes or []), async_op)


def _r_all_to_all(orig, output_tensor_list, input_tensor_list, group=None, async_op=False):
    m = _pg_or_fallback(group, *output_tensor_list, *input_tensor_list)
    return _finish(m.alltoall(output_tensor_list, input_tensor_list), async_op)


def _r_barrier(orig, group=None, async_op=False, device_ids=None):
    if group is not None and dist.distributed_c10d._rank_not_in_group(group):
        raise _Fallback()
    m = _maco_pg(group)
    if m is None:
        raise _Fallback()
    if torch.cuda.is_available():
        torch.cuda.current_stream().synchronize()
    return _finish(m.barrier(), async_op)


_ROUTES = {
    "all_reduce": _r_all_reduce,
    "all_gather_into_tensor": _r_all_gather_into_tensor,
    "all_gather": _r_all_gather,
    "reduce_scatter_tensor": _r_reduce_scatter_tensor,
    "reduce_scatter": _r_reduce_scatter,
    "broadcast": _r_broadcast,
    "reduce": _r_reduce,
    "all_to_all_single": _r_all_to_all_single,
    "all_to_all": _r_all_to_all,
    "barrier": _r_barrier,
}


def patch_torch_distributed() -> None:
    """Routes ``torch.distributed``'s collectives on CUDA tensors through MACO, for every
    process group already made or made later (NCCL's included), with no other change to
    the program.

    Patched: all_reduce, all_gather, all_gather_into_tensor, reduce_scatter,
    reduce_scatter_tensor, broadcast, reduce, all_to_all, all_to_all_single, barrier
    (``torch.distributed.X`` and ``torch.distributed.distributed_c10d.X``). A call takes
    MACO when its tensors are contiguous CUDA tensors and its op is SUM, PRODUCT, MIN, MAX
    or AVG; anything else (CPU tensors, other ops, non-members) runs torch's own function.
    Each group gets a MACO communicator at its first patched call (collective over the
    group; the unique id travels through torch's store). ``async_op=True`` returns a
    :class:`MacoWork`.

    Not patched: code that bound the functions before this call
    (``from torch.distributed import all_reduce``), and callers of the process group's
    C++ API (DDP's reducer, FSDP, functional collectives): use
    ``init_process_group("maco")`` for those. send/recv stay torch's.
    Idempotent; not thread-safe with concurrent collectives.
    """
    if _originals:
        return
    for name, route in _ROUTES.items():
        _wrap(name, route)


def unpatch_torch_distributed() -> None:
    """Restores torch's functions; the MACO communicators made for groups are closed."""
    for name, orig in _originals.items():
        setattr(dist, name, orig)
        setattr(dist.distributed_c10d, name, orig)
    _originals.clear()
    with _patch_lock:
        for m in _patched_groups.values():
            m.comm.close()
        _patched_groups.clear()
