"""The torch.distributed process group whose CUDA work runs on MACO
(:class:`ProcessGroupMaco`, :class:`MacoWork`): what ``init_process_group("maco")`` makes
(maco/torch.py registers it) and what :func:`maco.patch_torch_distributed` and the overlap
scope's redirect put over an existing group (maco/_routes.py). maco/torch.py's text describes
its behaviour: device binding, streams, queued sends and receives. Needs torch."""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as _c10d

from ._comm import Communicator
from ._comm import group as _group
from ._errors import MacoError
from ._job import unique_id
from ._pg_shrink import backend_for
from ._types import to_maco_op

__all__ = ["ProcessGroupMaco", "MacoWork", "BACKEND_NAME"]

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
        """torch.distributed's question for the group's backend on ``device``: the group
        answers itself (it cannot split or coalesce; it can shrink: ``shrink_group``, in
        _pg_shrink.py)."""
        return backend_for(self, device)

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
        # device instead of a new one per call, which costs host time at every call).
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
        """Revokes the group's communicator (its waits end, here and on the peers, which
        learn it through MACO's bootstrap) and closes it, as ncclCommAbort does for NCCL's."""
        if self._comm is not None:
            try:
                self._comm.revoke()
            finally:
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
