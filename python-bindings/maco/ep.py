"""Expert parallelism: mixture-of-experts dispatch and combine on torch tensors (maco/ep.h).

A :class:`Buffer` is made once per shape; each step then sends every token to the ranks of
its top-k experts and brings the expert outputs back, summed::

    import maco, maco.ep
    comm = maco.Communicator()                     # or a torch.distributed group
    buf = maco.ep.Buffer(comm, num_experts=256, hidden=7168,
                         num_max_dispatch_tokens_per_rank=128, num_topk=8,
                         low_latency_mode=True)
    recv_x, recv_count, handle = buf.dispatch(x, topk_idx, topk_weights)
    # recv_x[e, :recv_count[e]] are the tokens of local expert e (low latency mode)
    out = experts(recv_x, recv_count)               # same layout as recv_x
    y = buf.combine(out, handle)                    # [num_tokens, hidden], in token order

Names follow DeepEP's ``deep_ep.Buffer`` where they mean the same (``group``,
``low_latency_mode``, ``num_max_dispatch_tokens_per_rank``, ``topk_idx``, ``topk_weights``,
``handle``; ``low_latency_dispatch`` / ``low_latency_combine`` are aliases of ``dispatch`` /
``combine``), so code moves with few changes; the semantics are MACO's (docs/ep.md):

* ``recv_x`` is a view of the buffer's receive region, valid until the next ``dispatch``
  (clone it to keep it). Low latency mode: shape ``[local_experts, expert_capacity, hidden]``,
  local expert e's rows first in ``recv_x[e]``; normal mode: ``[num_recv, hidden]``, local
  expert e's rows from ``handle.recv_offsets[e]``. Rows come by source rank, then token order.
* ``combine`` returns ``y[t] = sum over k of topk_weights[t, k] * out(t, k)`` summed in k
  order in float32 and rounded once to bfloat16: bitwise the same on every run.
* Work is enqueued on the current CUDA stream of ``x``'s device (or ``stream=``). Low
  latency calls never wait on the host (CUDA-graph capturable); a normal-mode dispatch waits
  for the count exchange to learn ``num_recv``.

Only ranks of one node in this version; rows travel as bfloat16, or as float8 e4m3 with
per-128-element scales (``dispatch(..., use_fp8=True)``).
"""

from __future__ import annotations

from typing import Any, Optional

from . import _maco
from ._comm import Communicator
from ._types import INT64_MAX, INT_MIN, INT_MAX, DataType, c_int, to_maco_dtype

__all__ = ["Buffer", "Handle"]

_LOW_LATENCY = 0
_NORMAL = 1


class _CudaMemory:
    """A device range as ``__cuda_array_interface__`` (int16 elements), so torch.as_tensor
    makes a zero-copy tensor of it that keeps this object, and so the buffer's memory
    (``owner``: the extension's EpBuffer), alive."""

    def __init__(self, address: int, elements: int, owner: Any):
        self._owner = owner
        self.__cuda_array_interface__ = {
            "shape": (elements,), "typestr": "<i2", "data": (address, False), "version": 3,
            "strides": None,
        }


def _communicator(group: Any) -> Communicator:
    if isinstance(group, Communicator):
        return group
    comm = getattr(group, "comm", None)  # maco.torch.ProcessGroupMaco
    if isinstance(comm, Communicator):
        return comm
    return Communicator.from_process_group(group)


class Handle:
    """What :meth:`Buffer.combine` needs from a dispatch (opaque device bytes), and the
    dispatch's layout: ``recv_count`` (int32 ``[local_experts]``), ``recv_offsets`` (int32
    ``[local_experts + 1]``: each local expert's first row of ``recv_x``, then the end),
    ``recv_topk_weights`` (float32, the weight of each received row, or None),
    ``num_recv`` (normal mode: rows received; low latency: None), ``num_tokens`` and
    ``topk_weights`` (this rank's, the default weights of combine)."""

    def __init__(self, data, num_tokens: int, topk_weights, recv_count, recv_offsets,
                 recv_topk_weights, num_recv: Optional[int]):
        self.data = data
        self.num_tokens = num_tokens
        self.topk_weights = topk_weights
        self.recv_count = recv_count
        self.recv_offsets = recv_offsets
        self.recv_topk_weights = recv_topk_weights
        self.num_recv = num_recv

    def num_recv_tokens_per_expert_list(self) -> list:
        """The rows received per local expert as a Python list (copies to the host: waits
        for the dispatch)."""
        return [int(v) for v in self.recv_count.tolist()]


class Buffer:
    """An expert-parallel buffer on a communicator (collective to create).

    Args:
        group: a :class:`maco.Communicator`, a ``torch.distributed`` process group (a MACO
            communicator is made over it, collectively) or a ``maco.torch`` process group.
        num_experts: experts over all ranks (a multiple of the world size, at most 1024).
        hidden: elements per token (a multiple of 8).
        num_max_dispatch_tokens_per_rank: the most tokens one rank dispatches per call.
        num_topk: experts per token.
        low_latency_mode: True for the decode mode (fixed capacity per expert, no host wait,
            graph-capturable), False for the normal (prefill) mode.
        num_max_recv_tokens: normal mode: rows of the receive region (0: the worst case,
            world size x tokens x min(topk, local experts)).
        num_sms: CTAs (SMs) each kernel uses; 0: MACO's default (16 low latency, 24 normal).

    Raises:
        maco.InvalidArgumentError: a bad size (named, with its limit) or ranks passing
            different values; maco.UnsupportedError: no GPU, several nodes, more than 8 ranks.
    """

    def __init__(self, group: Any, *, num_experts: int, hidden: int,
                 num_max_dispatch_tokens_per_rank: int, num_topk: int,
                 low_latency_mode: bool = False, num_max_recv_tokens: int = 0,
                 num_sms: int = 0):
        import torch

        self._torch = torch
        self.comm = _communicator(group)
        self.low_latency_mode = bool(low_latency_mode)

        def c(v, nm, high=INT_MAX):  # the C library checks the limits; here the C types
            return c_int(int(v), nm, INT_MIN, high)

        self.num_experts = c(num_experts, "num_experts")
        self.hidden = c(hidden, "hidden")
        self.num_topk = c(num_topk, "num_topk")
        self.num_max_dispatch_tokens_per_rank = c(num_max_dispatch_tokens_per_rank,
                                                  "num_max_dispatch_tokens_per_rank")
        self._b = _maco.ep_buffer_create(
            self.comm._c, _LOW_LATENCY if self.low_latency_mode else _NORMAL,
            self.num_max_dispatch_tokens_per_rank, self.hidden, self.num_experts,
            self.num_topk, int(DataType.BFLOAT16),
            c_int(int(num_max_recv_tokens), "num_max_recv_tokens", -INT64_MAX - 1, INT64_MAX),
            c(num_sms, "num_sms"))
        info = self._b.info()
        self.rank = info["rank"]
        self.group_size = info["nranks"]
        self.num_local_experts = info["local_experts"]
        self.num_sms = info["num_ctas"]
        self.expert_capacity = info["expert_capacity"]
        self.num_recv_rows = info["recv_rows"]
        self.handle_bytes = info["handle_bytes"]
        self.device = torch.device("cuda", self.comm.device if self.comm.device is not None else 0)
        region = torch.as_tensor(
            _CudaMemory(info["recv_x"], self.num_recv_rows * self.hidden, self._b),
            device=self.device)
        self._recv = region.view(torch.bfloat16).view(self.num_recv_rows, self.hidden)

    # ------------------------------------------------------------ helpers

    def _tensor(self, t: Any, name: str, dtype, shape: tuple):
        torch = self._torch
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device != self.device:
            raise ValueError(f"{name}: on {t.device}, but the buffer is on {self.device}")
        if dtype is not None and t.dtype != dtype:
            raise TypeError(f"{name}: dtype {t.dtype}, expected {dtype}")
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
        if not t.is_contiguous():
            raise ValueError(f"{name}: not contiguous")
        return t

    def _stream(self, stream: Any) -> int:
        if stream is None:
            return self._torch.cuda.current_stream(self.device).cuda_stream
        return int(getattr(stream, "cuda_stream", stream))

    # ------------------------------------------------------------ calls

    def dispatch(self, x: Any, topk_idx: Any, topk_weights: Any = None, *,
                 use_fp8: bool = False, stream: Any = None):
        """Sends each token of ``x`` ([num_tokens, hidden] bfloat16) to the ranks of its
        experts ``topk_idx`` ([num_tokens, num_topk] int64, -1: none); ``topk_weights``
        ([num_tokens, num_topk] float32) travel with them and are combine's default weights.

        Returns ``(recv_x, recv_count, handle)``: ``recv_x`` a view of the receive region
        (low latency: ``[local_experts, expert_capacity, hidden]``; normal:
        ``[num_recv, hidden]``), ``recv_count`` int32 ``[local_experts]``, and the
        :class:`Handle` for :meth:`combine`.

        ``use_fp8=True`` (maco_ep_dispatch_fp8; hidden a multiple of 128): the rows travel
        as float8 e4m3 with one float32 scale per 128 elements, and ``recv_x`` is the pair
        ``(values, scales)`` of views of the receive region, as DeepEP's low-latency
        dispatch returns it: ``values`` torch.float8_e4m3fn and ``scales`` float32 with
        recv_x's leading shape and last dimensions ``hidden`` and ``hidden // 128``
        (``x ~ values.float() * scales`` repeated over each block of 128). Both are strided
        views (rows ``2 * hidden`` bytes apart); ``.contiguous()`` copies them. combine still
        takes bfloat16 expert outputs of ``values.shape`` (e.g. ``torch.empty(values.shape,
        dtype=torch.bfloat16, device=...)``). Raises maco.InvalidArgumentError when hidden is
        not a multiple of 128.

        Raises:
            TypeError, ValueError: a tensor of another type, device, shape, or not
                contiguous. maco.InvalidArgumentError: MACO's checks (more tokens than the
                buffer takes, ...); normal mode also a bad ``topk_idx`` entry found on the
                device (in low latency mode :meth:`check` reports those).
        """
        torch = self._torch
        if not isinstance(x, torch.Tensor) or x.dim() != 2:
            raise ValueError("x: expected a 2-d torch.Tensor [num_tokens, hidden]")
        T = int(x.shape[0])
        x = self._tensor(x, "x", None, (T, self.hidden))
        topk_idx = self._tensor(topk_idx, "topk_idx", torch.int64, (T, self.num_topk))
        if topk_weights is not None:
            topk_weights = self._tensor(topk_weights, "topk_weights", torch.float32,
                                        (T, self.num_topk))
        L = self.num_local_experts
        dev = self.device
        recv_count = torch.empty(L, dtype=torch.int32, device=dev)
        recv_offsets = torch.empty(L + 1, dtype=torch.int32, device=dev)
        recv_w = None
        if topk_weights is not None:
            recv_w = torch.empty(self.num_recv_rows, dtype=torch.float32, device=dev)
        data = torch.empty(self.handle_bytes, dtype=torch.uint8, device=dev)
        s = self._stream(stream)
        num_recv = self._b.dispatch(
            x.data_ptr(), int(to_maco_dtype(x.dtype)), T, self.hidden, topk_idx.data_ptr(),
            topk_weights.data_ptr() if topk_weights is not None else 0, self.num_topk,
            recv_count.data_ptr(), recv_offsets.data_ptr(),
            recv_w.data_ptr() if recv_w is not None else 0, data.data_ptr(),
            not self.low_latency_mode, s, bool(use_fp8))
        if self.low_latency_mode:
            recv_x = self._recv.view(L, self.expert_capacity, self.hidden)
            handle = Handle(data, T, topk_weights, recv_count, recv_offsets, recv_w, None)
        else:
            recv_x = self._recv[:num_recv]
            if recv_w is not None:
                recv_w = recv_w[:num_recv]
            handle = Handle(data, T, topk_weights, recv_count, recv_offsets, recv_w, num_recv)
        if use_fp8:  # the rows' bytes: hidden e4m3 values, then hidden / 128 float32 scales
            H = self.hidden
            rows = recv_x.reshape(-1, H).view(torch.uint8)  # [rows, 2 H]
            lead = tuple(recv_x.shape[:-1])
            recv_x = (rows[:, :H].view(torch.float8_e4m3fn).unflatten(0, lead),
                      rows[:, H:H + H // 32].view(torch.float32).unflatten(0, lead))
        # Keep the inputs alive until the stream has read them.
        handle._inputs = (x, topk_idx)
        return recv_x, recv_count, handle

    def combine(self, x: Any, handle: Handle, topk_weights: Any = None, *,
                out: Any = None, stream: Any = None):
        """Sends every expert output row back and sums each token's: ``x`` holds the experts'
        outputs in ``recv_x``'s layout (it may be ``recv_x`` itself). ``topk_weights``
        default to the dispatch's. Returns ``out`` (or a new tensor), ``[num_tokens, hidden]``
        bfloat16 in the dispatch's token order.

        Raises:
            ValueError: no weights, or tensors of the wrong shape or device.
        """
        torch = self._torch
        if not isinstance(handle, Handle):
            raise TypeError("handle: expected the Handle a dispatch returned")
        T = handle.num_tokens
        w = topk_weights if topk_weights is not None else handle.topk_weights
        if w is None:
            raise ValueError("topk_weights: none given here or to dispatch")
        w = self._tensor(w, "topk_weights", torch.float32, (T, self.num_topk))
        rows = self.num_recv_rows if self.low_latency_mode else handle.num_recv
        if not isinstance(x, torch.Tensor) or x.numel() != rows * self.hidden:
            raise ValueError(f"x: expected {rows} x {self.hidden} elements in recv_x's layout")
        if not x.is_contiguous() or x.device != self.device:
            raise ValueError(f"x: must be contiguous and on {self.device}")
        if out is None:
            out = torch.empty((T, self.hidden), dtype=torch.bfloat16, device=self.device)
        out = self._tensor(out, "out", torch.bfloat16, (T, self.hidden))
        self._b.combine(x.data_ptr(), int(to_maco_dtype(x.dtype)), self.hidden,
                        handle.data.data_ptr(), w.data_ptr(), T, self.num_topk, out.data_ptr(),
                        self._stream(stream))
        return out

    # DeepEP's names for the low-latency calls.
    def low_latency_dispatch(self, x: Any, topk_idx: Any, topk_weights: Any = None, **kw):
        """:meth:`dispatch` (DeepEP's name)."""
        return self.dispatch(x, topk_idx, topk_weights, **kw)

    def low_latency_combine(self, x: Any, topk_idx: Any, topk_weights: Any, handle: Handle,
                            **kw):
        """:meth:`combine` with DeepEP's argument order (``topk_idx`` is not needed: the
        handle has the routing)."""
        return self.combine(x, handle, topk_weights, **kw)

    def check(self) -> None:
        """Raises :class:`maco.InvalidArgumentError` for an input error the device found in a
        launch that ended (synchronize first) and that no call raised yet."""
        self._b.check()

    def destroy(self) -> None:
        """Frees the buffer (waits for the device). Views of ``recv_x`` must not be used
        afterwards. Idempotent."""
        self._b.destroy()

    def __enter__(self) -> "Buffer":
        return self

    def __exit__(self, *exc) -> None:
        self.destroy()
