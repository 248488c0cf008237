"""The custom operators ``torch.ops.maco.*`` that maco/_compile.py's FX pass puts in place of
each matmul + collective pair, and the kernels and paths behind them. Needs torch.

Row-parallel matmul + all_reduce becomes the custom op ``torch.ops.maco.gemm_allreduce(a, b,
bias, group_name, site)``: ``a`` (m, k), ``b`` (k, n), result (m, n) of a's dtype = the sum
over the group's ranks of ``a @ b`` (+ the sum of ``bias`` (n,) when given: allreduce(addmm)
semantics). On CUDA it runs what ``maco.config`` ``fusion`` names:

- "copy_engine" (the default; bf16, fp16 or fp32 operands of one type):
  :func:`maco.tp.gemm_allreduce`, cuBLAS in row chunks with the transfers on the copy
  engines from 1e11 flop (2 m n k) with every rank on one node (``_COMPILE_CE_MIN_FLOP``:
  inside a compiled graph the host runs ahead, so the path's host time is hidden), else the
  GEMM then MACO's allreduce;
- "persistent" (bf16, n a multiple of 128 and k of 32): a :class:`maco.PersistentKernel`
  whose graph is ``g.allreduce(g.matmul(A, B, output=OUT))`` (the fused operator of
  ``maco_task_graph_add_gemm_allreduce``, moving data as ``maco.config`` ``fused_comm``
  says: by default the copy engines or the SMs per shape), built once per call site and shape
  on the group's MACO communicator (collective: every rank reaches the site with the same
  shapes), with registered buffers A, B, OUT. A call copies ``a`` into A (and ``b`` into B when ``b``'s
  memory or version changed since the last call: weights are copied once), launches the
  kernel on the current stream, and returns a copy of OUT (the kernel's OUT is overwritten by
  the next launch). The sum is in rank order in fp32 of bf16 products, bitwise equal on every
  rank; it differs from cuBLAS + NCCL by bf16 rounding.

Otherwise (CPU tensors, other dtypes or shapes): ``a @ b`` then an allreduce on the group
(CUDA: MACO's communicator of the group; CPU: torch.distributed, e.g. Gloo): the fallback
that CPU tests check.

The sequence-parallel pairs (Inductor's async-TP form: an all_gather of row shards before a
column-parallel matmul, a reduce_scatter after a row-parallel one) become
``torch.ops.maco.allgather_gemm(a, b, group_size, group_name, site)`` ((s, k) shard ->
(group_size * s, n)) and ``torch.ops.maco.gemm_reduce_scatter(a, b, bias, group_size,
group_name, site)`` ((m, k) -> this rank's (m / group_size, n) rows; m a multiple of
group_size, else ValueError). On CUDA with bf16, fp16 or fp32 operands of one type they run
:func:`maco.tp.allgather_gemm` and :func:`maco.tp.gemm_reduce_scatter` with the same
copy-engine threshold, whatever ``fusion`` says (the persistent kernel's forms of these two
are not used here); otherwise the collective and the matmul one after the other (CPU:
torch.distributed).
"""

from __future__ import annotations

import threading
import warnings
from typing import Any, Optional

import torch

from . import _config, tp
from ._errors import UnsupportedError
from ._streams import _Inside
from .persistent import PersistentKernel

__all__ = ["FusedGemmAllreduce", "close_kernels", "register_ops", "stats"]

_lock = threading.RLock()
_runners: dict = {}  # (site, m, n, k, dtype, device index) -> FusedGemmAllreduce


class _Ops:
    """Whether torch.ops.maco.* are registered (once per process)."""

    registered = False


# ---------------------------------------------------------------------------- groups

# torch.distributed (and the modules of this package over it) are imported where a group is
# used: maco.Module and the compile backend load without them.


def _resolve_group(group_name: str) -> Any:
    import torch.distributed as dist
    from torch._C._distributed_c10d import _resolve_process_group

    if not group_name:
        return dist.group.WORLD
    return _resolve_process_group(group_name)


def _group_comm(pg: Any, device: Any) -> Any:
    """The MACO communicator of process group ``pg`` on ``device`` (made at first use,
    collectively, as maco.patch_torch_distributed does)."""
    from . import _process_group, _routes

    if isinstance(pg, _process_group.ProcessGroupMaco):
        return pg.comm
    return _routes.maco_pg(pg, device).comm


def _allreduce_on_group(y: Any, pg: Any) -> Any:
    """In-place sum of ``y`` over ``pg``: MACO on CUDA, torch.distributed on the CPU."""
    import torch.distributed as dist

    if y.is_cuda:
        _group_comm(pg, y.device).allreduce(y)
    else:
        with _Inside():
            dist.all_reduce(y, group=pg)
    return y


# ---------------------------------------------------------------------------- fused op

class FusedGemmAllreduce:
    """The persistent kernel behind one call site of ``torch.ops.maco.gemm_allreduce`` for
    one shape (see the module's text): registered ``A`` (m, k) bf16, ``B`` (k, n) bf16 and
    ``OUT`` (m, n) of the output dtype, and the kernel running
    ``g.allreduce(g.matmul(A, B, output=OUT))``. Not thread-safe; one stream at a time.
    :meth:`close` frees it (after its launches finished)."""

    def __init__(self, comm: Any, m: int, n: int, k: int, out_dtype: Any):
        split = _config.current_split()
        kw = split.persistent_config() if split is not None else {}
        self.kernel = PersistentKernel(comm, profile=_config.setting("profile"),
                                       fused_comm=_config.setting("fused_comm"), **kw)
        kern = self.kernel
        self.A = kern.register_output((m, k), torch.bfloat16, name="a")
        self.B = kern.register_output((k, n), torch.bfloat16, name="b")
        self.OUT = kern.register_output((m, n), out_dtype, name="out")
        with kern.task_graph() as g:
            g.allreduce(g.matmul(self.A, self.B, output=self.OUT, name="gemm"), name="allreduce")
        kern.compile()
        self._b_seen: Optional[tuple] = None
        self.launches = 0

    def __call__(self, a: Any, b: Any) -> Any:
        seen = (b.data_ptr(), b._version, tuple(b.stride()))
        if seen != self._b_seen:
            self.B.tensor.copy_(b)
            self._b_seen = seen
        self.A.tensor.copy_(a)
        self.kernel()
        self.launches += 1
        return self.OUT.tensor.clone()

    def close(self) -> None:
        self.kernel.close()


def _fusable(a: Any, b: Any) -> bool:
    return (a.is_cuda and b.is_cuda and a.dtype == torch.bfloat16 and b.dtype == torch.bfloat16
            and a.dim() == 2 and b.dim() == 2 and b.shape[1] % 128 == 0 and a.shape[1] % 32 == 0
            and a.shape[0] >= 1)


_warned: set = set()
stats = {"fused": 0, "copy_engine": 0, "fallback": 0, "allgather_gemm": 0,
         "gemm_reduce_scatter": 0, "sp_fallback": 0}
"""Calls in this process: of torch.ops.maco.gemm_allreduce through the fused persistent
kernel ("fused"), through maco.tp.gemm_allreduce ("copy_engine": ``maco.config.set(
fusion="copy_engine")``) and through the fallback (matmul, then an allreduce: "fallback");
of torch.ops.maco.allgather_gemm and gemm_reduce_scatter through maco.tp (by name) and through
their fallback (the collective and the matmul one after the other: "sp_fallback")."""
_contiguous: dict = {}  # site -> ((data_ptr, version, shape, stride), contiguous copy of b)


def _contiguous_b(site: int, b: Any) -> Any:
    """``b`` row-major: itself, or a copy made once per call site and weight version."""
    if b.is_contiguous():
        return b
    seen = (b.data_ptr(), b._version, tuple(b.shape), tuple(b.stride()))
    hit = _contiguous.get(site)
    if hit is None or hit[0] != seen:
        hit = _contiguous[site] = (seen, b.contiguous())
    return hit[1]


# Inside compiled graphs the copy-engine path of maco.tp is taken from this many flop (2 M N K)
# instead of maco.tp's 2e11: there the host runs ahead of the GPU, so the path's Python host
# time is hidden (chosen by measurement: docs/performance.md, "Tensor-parallel GEMM +
# collective", the Llama-3-70B layer).
_COMPILE_CE_MIN_FLOP = 1.0e11


def _tp_method(comm: Any, flop: int, pattern: str, rows: int = 0) -> str:
    return tp._method(comm, None, flop, pattern, rows, min_flop=_COMPILE_CE_MIN_FLOP)


def _gemm_allreduce_impl(a, b, bias, group_name, site):
    pg = _resolve_group(group_name)
    y = None
    if (_config.setting("fusion") == "copy_engine" and a.is_cuda and a.dtype == b.dtype
            and a.dtype in (torch.bfloat16, torch.float16, torch.float32)):
        comm = _group_comm(pg, a.device)
        flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        y = tp.gemm_allreduce(a.contiguous(), _contiguous_b(site, b), comm,
                              method=_tp_method(comm, flop, "gemm_allreduce", a.shape[0]))
        stats["copy_engine"] += 1
    elif _fusable(a, b):
        key = (site, a.shape[0], b.shape[1], a.shape[1], a.dtype, a.device.index)
        with _lock:
            r = _runners.get(key)
            if r is None and key not in _warned:
                try:
                    r = _runners[key] = FusedGemmAllreduce(_group_comm(pg, a.device),
                                                            a.shape[0], b.shape[1], a.shape[1],
                                                            a.dtype)
                except Exception as e:  # noqa: BLE001 - e.g. a library without GEMM tiles
                    if not isinstance(e, UnsupportedError):
                        raise
                    _warned.add(key)
                    warnings.warn(f"maco.gemm_allreduce: the fused kernel is unavailable ({e}); "
                                  "running matmul then MACO's allreduce", RuntimeWarning,
                                  stacklevel=2)
        if r is not None:
            y = r(a, b)
            stats["fused"] += 1
    if y is None:
        y = _allreduce_on_group(torch.mm(a, b), pg)
        stats["fallback"] += 1
    if bias is not None:
        y = y + _allreduce_on_group(bias.detach().clone(), pg).to(y.dtype)
    return y


def _tp_ready(a: Any, b: Any) -> bool:
    """Whether maco.tp takes the pair: CUDA, one float type of maco.tp's, 2-D."""
    return (a.is_cuda and b.is_cuda and a.dtype == b.dtype and a.dim() == 2 and b.dim() == 2
            and a.dtype in (torch.bfloat16, torch.float16, torch.float32))


def _allgather_gemm_impl(a, b, group_size, group_name, site):
    """``allgather(a) @ b`` over the group (rows of the ranks' shards in rank order)."""
    pg = _resolve_group(group_name)
    if _tp_ready(a, b):
        stats["allgather_gemm"] += 1
        comm = _group_comm(pg, a.device)
        flop = 2 * group_size * a.shape[0] * a.shape[1] * b.shape[1]
        return tp.allgather_gemm(a.contiguous(), _contiguous_b(site, b), comm,
                                 method=_tp_method(comm, flop, "allgather_gemm"))
    stats["sp_fallback"] += 1
    if a.is_cuda:
        g = _group_comm(pg, a.device).allgather(a.contiguous()).reshape(-1, a.shape[1])
    else:
        import torch.distributed as dist

        parts = [torch.empty_like(a) for _ in range(group_size)]
        with _Inside():
            dist.all_gather(parts, a.contiguous(), group=pg)
        g = torch.cat(parts)
    return torch.mm(g, b)


def _gemm_reduce_scatter_impl(a, b, bias, group_size, group_name, site):
    """This rank's block of rows of ``sum over the group of a @ b (+ bias)``."""
    pg = _resolve_group(group_name)
    if a.shape[0] % group_size:
        raise ValueError(f"maco.gemm_reduce_scatter: a has {a.shape[0]} rows, not a multiple "
                         f"of the group's {group_size} ranks")
    s = a.shape[0] // group_size
    if _tp_ready(a, b):
        stats["gemm_reduce_scatter"] += 1
        comm = _group_comm(pg, a.device)
        flop = 2 * a.shape[0] * a.shape[1] * b.shape[1]
        y = tp.gemm_reduce_scatter(a.contiguous(), _contiguous_b(site, b), comm,
                                   method=_tp_method(comm, flop, "gemm_reduce_scatter"))
    else:
        import torch.distributed as dist

        stats["sp_fallback"] += 1
        rank = dist.get_rank(pg)
        y = _allreduce_on_group(torch.mm(a, b), pg)[rank * s:(rank + 1) * s].contiguous()
    if bias is not None:
        y = y + _allreduce_on_group(bias.detach().clone(), pg).to(y.dtype)
    return y


def register_ops() -> None:
    """Registers ``torch.ops.maco.gemm_allreduce``, ``allgather_gemm`` and
    ``gemm_reduce_scatter`` (and their fakes, for tracing) once."""
    with _lock:
        if _Ops.registered:
            return
        # name -> (schema, implementation, output shape from the fake arguments)
        ops = {
            "gemm_allreduce": (
                "(Tensor a, Tensor b, Tensor? bias, str group_name, int site) -> Tensor",
                _gemm_allreduce_impl, lambda a, b, *_: (a.shape[0], b.shape[1])),
            "allgather_gemm": (
                "(Tensor a, Tensor b, int group_size, str group_name, int site) -> Tensor",
                _allgather_gemm_impl, lambda a, b, ws, *_: (a.shape[0] * ws, b.shape[1])),
            "gemm_reduce_scatter": (
                "(Tensor a, Tensor b, Tensor? bias, int group_size, str group_name, int site) "
                "-> Tensor",
                _gemm_reduce_scatter_impl,
                lambda a, b, bias, ws, *_: (a.shape[0] // ws, b.shape[1])),
        }
        for name, (schema, impl, shape) in ops.items():
            op = torch.library.custom_op(f"maco::{name}", impl, mutates_args=(), schema=schema)
            op.register_fake(lambda a, *rest, shape=shape: a.new_empty(shape(a, *rest)))
        _Ops.registered = True


def close_kernels(sites: Optional[set] = None) -> None:
    """Frees the fused kernels (of ``sites``, or all) after synchronising the device; later
    calls rebuild them (collectively)."""
    with _lock:
        keys = [k for k in _runners if sites is None or k[0] in sites]
        if keys and torch.cuda.is_available():
            torch.cuda.synchronize()
        for k in keys:
            _runners.pop(k).close()
        for site in [k for k in _contiguous if sites is None or k in sites]:
            del _contiguous[site]


def kernel_sites() -> set:
    """The call sites that have a fused kernel now."""
    with _lock:
        return {k[0] for k in _runners}


def kernels_of(sites: set) -> list:
    """The fused kernels of ``sites``."""
    with _lock:
        return [r for k, r in _runners.items() if k[0] in sites]
