"""Models: ``maco.compile`` and ``torch.compile(backend="maco")`` (each matmul + collective
pair of a tensor-parallel layer becomes one of MACO's GEMM + collective operators, the rest
stays torch's), the FX pass behind them (:func:`fuse_matmul_allreduce`), ``maco.Module``,
``maco.TPLinear``, ``@maco.task_graph`` and ``maco.PersistentContext``.

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
  ``maco_task_graph_add_gemm_allreduce``), built once per call site and shape on the group's
  MACO communicator (collective: every rank reaches the site with the same shapes), with
  registered buffers A, B, OUT. A call copies ``a`` into A (and ``b`` into B when ``b``'s
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

import functools
import itertools
import operator
import sys
import threading
import types
import warnings
from typing import Any, Callable, Optional

from . import _config
from ._overlap import _Scope, _is_compiling, async_tensor, suspended

__all__ = ["compile", "maco_backend", "fuse_matmul_allreduce", "Module", "TPLinear",
           "task_graph", "PersistentContext", "FusedGemmAllreduce"]

_lock = threading.RLock()
_sites = itertools.count()
_runners: dict = {}  # (site, m, n, k, dtype, device index) -> FusedGemmAllreduce
_ops_registered = False


def _torch():
    import torch

    return torch


# ---------------------------------------------------------------------------- groups

def _resolve_group(group_name: str) -> Any:
    import torch.distributed as dist
    from torch._C._distributed_c10d import _resolve_process_group

    if not group_name:
        return dist.group.WORLD
    return _resolve_process_group(group_name)


def _group_name(group: Any) -> str:
    """The name the fused op resolves at run time; "" is the default group."""
    return "" if group is None else group.group_name


def _group_comm(pg: Any, device: Any) -> Any:
    """The MACO communicator of process group ``pg`` on ``device`` (made at first use,
    collectively, as maco.patch_torch_distributed does)."""
    from . import torch as mt

    if isinstance(pg, mt.ProcessGroupMaco):
        return pg.comm
    return mt._maco_pg(pg, device).comm


def _allreduce_on_group(y: Any, pg: Any) -> Any:
    """In-place sum of ``y`` over ``pg``: MACO on CUDA, torch.distributed on the CPU."""
    import torch.distributed as dist

    from ._overlap import _Inside

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
        torch = _torch()
        from .persistent import PersistentKernel

        split = _config.current_split()
        kw = split.persistent_config() if split is not None else {}
        self.kernel = PersistentKernel(comm, profile=_config.setting("profile"), **kw)
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
    torch = _torch()
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
# time (0.2-0.3 ms per call with 4 ranks) is hidden. Llama-3-70B TP4 layer, sequence parallel,
# 4096 tokens, 4x H200: with the QKV (1.7e11) and o_proj (1.4e11) pairs on the copy engines
# too, 3.088 ms per step against 3.240 (docs/performance.md).
_COMPILE_CE_MIN_FLOP = 1.0e11


def _tp_method(comm: Any, flop: int, pattern: str, rows: int = 0) -> str:
    from . import tp

    return tp._method(comm, None, flop, pattern, rows, min_flop=_COMPILE_CE_MIN_FLOP)


def _gemm_allreduce_impl(a, b, bias, group_name, site):
    torch = _torch()
    pg = _resolve_group(group_name)
    y = None
    if (_config.setting("fusion") == "copy_engine" and a.is_cuda and a.dtype == b.dtype
            and a.dtype in (torch.bfloat16, torch.float16, torch.float32)):
        from . import tp

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
                    from ._errors import UnsupportedError

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
    torch = _torch()
    return (a.is_cuda and b.is_cuda and a.dtype == b.dtype and a.dim() == 2 and b.dim() == 2
            and a.dtype in (torch.bfloat16, torch.float16, torch.float32))


def _allgather_gemm_impl(a, b, group_size, group_name, site):
    """``allgather(a) @ b`` over the group (rows of the ranks' shards in rank order)."""
    torch = _torch()
    pg = _resolve_group(group_name)
    if _tp_ready(a, b):
        from . import tp

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

        from ._overlap import _Inside

        parts = [torch.empty_like(a) for _ in range(group_size)]
        with _Inside():
            dist.all_gather(parts, a.contiguous(), group=pg)
        g = torch.cat(parts)
    return torch.mm(g, b)


def _gemm_reduce_scatter_impl(a, b, bias, group_size, group_name, site):
    """This rank's block of rows of ``sum over the group of a @ b (+ bias)``."""
    torch = _torch()
    pg = _resolve_group(group_name)
    if a.shape[0] % group_size:
        raise ValueError(f"maco.gemm_reduce_scatter: a has {a.shape[0]} rows, not a multiple "
                         f"of the group's {group_size} ranks")
    s = a.shape[0] // group_size
    if _tp_ready(a, b):
        from . import tp

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


def _register_ops() -> None:
    """Registers ``torch.ops.maco.gemm_allreduce``, ``allgather_gemm`` and
    ``gemm_reduce_scatter`` (and their fakes, for tracing) once."""
    global _ops_registered
    with _lock:
        if _ops_registered:
            return
        torch = _torch()
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
        _ops_registered = True


def close_kernels(sites: Optional[set] = None) -> None:
    """Frees the fused kernels (of ``sites``, or all) after synchronising the device; later
    calls rebuild them (collectively)."""
    torch = _torch()
    with _lock:
        keys = [k for k in _runners if sites is None or k[0] in sites]
        if keys and torch.cuda.is_available():
            torch.cuda.synchronize()
        for k in keys:
            _runners.pop(k).close()
        for site in [k for k in _contiguous if sites is None or k in sites]:
            del _contiguous[site]


# ---------------------------------------------------------------------------- the FX pass

def _targets() -> dict:
    torch = _torch()
    import torch.distributed as dist
    import torch.nn.functional as F

    aten = torch.ops.aten
    c10d = torch.ops._c10d_functional
    return {
        "mm": {aten.mm.default, torch.mm},
        "matmul": {aten.matmul.default, torch.matmul, operator.matmul},
        "addmm": {aten.addmm.default},
        "linear": {aten.linear.default, F.linear, torch._C._nn.linear},
        "view": {aten.view.default, aten._unsafe_view.default, aten.reshape.default,
                 torch.reshape},
        "view_method": {"view", "reshape"},
        "all_reduce": {c10d.all_reduce.default, c10d.all_reduce},
        "all_gather": {c10d.all_gather_into_tensor.default, c10d.all_gather_into_tensor},
        "reduce_scatter": {c10d.reduce_scatter_tensor.default, c10d.reduce_scatter_tensor},
        "wait": {c10d.wait_tensor.default, c10d.wait_tensor},
        "copy": {aten.copy.default, aten.copy_.default},
        "dist_all_reduce": {dist.all_reduce, dist.distributed_c10d.all_reduce,
                            getattr(dist.all_reduce, "__wrapped__", dist.all_reduce)},
    }


def _is(node: Any, kinds: set, method_names: set = frozenset()) -> bool:
    if node.op == "call_function":
        return node.target in kinds
    if node.op == "call_method":
        return node.target in method_names
    return False


def _fused_matmul_allreduce(x, b, bias, group_name, site):
    """torch-level graphs (torch.fx.symbolic_trace, Dynamo's): ``x`` (..., k) @ ``b`` (k, n)
    summed over the group (+ the summed bias), shaped (..., n)."""
    torch = _torch()
    _register_ops()
    y = torch.ops.maco.gemm_allreduce(x.reshape(-1, x.shape[-1]), b, bias, group_name, site)
    return y.reshape(*x.shape[:-1], b.shape[-1])


def fuse_matmul_allreduce(gm: Any) -> int:
    """Rewrites ``gm`` (a ``torch.fx.GraphModule`` or ``Graph``) in place: each matmul whose
    only consumer is a sum all_reduce or reduce_scatter, and each all_gather whose only
    consumer is a matmul, becomes one fused call; returns how many.

    Recognised (the matmul's result feeding nothing but the all_reduce, through views):

    - aten graphs (AOT Autograd, Inductor's post-grad graph): ``aten.mm(a, b)`` or
      ``aten.addmm(bias, a, b)``, then ``aten.view``/``_unsafe_view``/``reshape`` nodes,
      then ``_c10d_functional.all_reduce(y, "sum", group)`` and ``wait_tensor`` (and the
      ``aten.copy`` back into y that an in-place ``dist.all_reduce`` becomes) ->
      ``torch.ops.maco.gemm_allreduce(a, b, bias, group, site)`` and the same views;
    - torch-level graphs (``torch.fx.symbolic_trace``, Dynamo): ``torch.matmul``/``@``/
      ``torch.mm``/``F.linear`` with a 2-D right operand, then ``torch.distributed
      .all_reduce(y)`` (SUM, async_op False) or the functional all_reduce + wait (+
      ``copy_``) -> a call of the fused operator reshaping as the matmul did.

    The sequence-parallel pairs (aten graphs only, as Inductor's async TP pass sees them):

    - ``_c10d_functional.all_gather_into_tensor(x, group_size, group)`` and its
      ``wait_tensor``, read by nothing but one ``aten.mm(gathered, b)`` ->
      ``torch.ops.maco.allgather_gemm(x, b, group_size, group, site)``
      (:func:`maco.tp.allgather_gemm`);
    - ``aten.mm(a, b)`` or ``aten.addmm(bias, a, b)`` read by nothing but
      ``_c10d_functional.reduce_scatter_tensor(y, "sum", group_size, group)`` and its wait
      -> ``torch.ops.maco.gemm_reduce_scatter(a, b, bias, group_size, group, site)``
      (:func:`maco.tp.gemm_reduce_scatter`).

    Everything else is left as it is (a gathered input read by more than one matmul, views
    between the collective and the matmul, other reductions). Every rank must rewrite the
    same graph (the site numbers given to the fused calls are process-wide counters).
    """
    torch = _torch()
    _register_ops()
    graph = getattr(gm, "graph", gm)
    T = _targets()
    count = 0
    for node in list(graph.nodes):
        if node.op not in ("call_function", "call_method") or node.graph is None:
            continue
        if _is(node, T["all_reduce"]):
            count += _rewrite_functional(graph, node, T, torch)
        elif _is(node, T["all_gather"]):
            count += _rewrite_allgather(graph, node, T, torch)
        elif _is(node, T["reduce_scatter"]):
            count += _rewrite_reduce_scatter(graph, node, T, torch)
        elif _is(node, T["dist_all_reduce"]):
            count += _rewrite_inplace(graph, node, T)
    if count:
        graph.eliminate_dead_code()
        graph.lint()
        if hasattr(gm, "recompile"):
            gm.recompile()
    return count


def _matmul_parts(m: Any, T: dict) -> Optional[tuple]:
    """(a, b, bias, kind) of a matmul node: kind "aten" (2-D a, b as given) or "torch"
    (a of any rank, b 2-D); None when it is not a matmul we fuse."""
    if _is(m, T["mm"]) and m.op == "call_function" and not m.kwargs:
        return m.args[0], m.args[1], None, ("aten" if "aten" in str(m.target) else "torch")
    if _is(m, T["addmm"]) and not m.kwargs and len(m.args) == 3:
        return m.args[1], m.args[2], m.args[0], "aten"
    if _is(m, T["matmul"]) and not m.kwargs and len(m.args) == 2:
        b = m.args[1]
        val = b.meta.get("val", b.meta.get("example_value")) if hasattr(b, "meta") else None
        if val is not None and getattr(val, "dim", lambda: 2)() != 2:
            return None
        return m.args[0], b, None, "torch"
    if _is(m, T["linear"]) and len(m.args) >= 2:
        bias = m.args[2] if len(m.args) > 2 else m.kwargs.get("bias")
        return m.args[0], ("t", m.args[1]), bias, "torch"
    return None


def _rewrite_functional(graph: Any, ar: Any, T: dict, torch: Any) -> int:
    if len(ar.args) < 3 or ar.args[1] != "sum" or ar.kwargs:
        return 0
    src = ar.args[0]
    chain = []  # the matmul, then the views up to src (the all_reduce's input)
    cur = src
    while hasattr(cur, "op") and _is(cur, T["view"], T["view_method"]):
        chain.append(cur)
        cur = cur.args[0]
    m = cur
    if not hasattr(m, "op"):
        return 0
    parts = _matmul_parts(m, T)
    if parts is None:
        return 0
    a, b, bias, kind = parts
    chain = [m] + chain[::-1]
    # The wait (a chain of waits: one per wait_tensor call) on the all_reduce's result.
    if len(ar.users) != 1:
        return 0
    wait = next(iter(ar.users))
    if not _is(wait, T["wait"]):
        return 0
    while len(wait.users) == 1 and _is(next(iter(wait.users)), T["wait"]):
        wait = next(iter(wait.users))
    # The matmul's product may reach nothing but the all_reduce: no partial product read
    # elsewhere (the fused kernel has none). An in-place all_reduce copies the result back
    # into src (aten.copy / Tensor.copy_); src's later readers read the sum.
    for n, nxt in zip(chain, chain[1:]):
        if set(n.users) != {nxt}:
            return 0
    order = {n: i for i, n in enumerate(graph.nodes)}
    copies = [u for u in src.users if u is not ar and _is(u, T["copy"], {"copy_"})
              and len(u.args) == 2 and u.args[0] is src and u.args[1] is wait]
    later = [u for u in src.users if u is not ar and u not in copies]
    if later and (not copies or any(order[u] < min(order[c] for c in copies) for u in later)):
        return 0
    site = next(_sites)
    with graph.inserting_before(ar):
        if kind == "aten":
            new = graph.call_function(torch.ops.maco.gemm_allreduce.default,
                                      (a, b, bias, ar.args[2], site))
        else:
            bb = b
            if isinstance(b, tuple):  # F.linear's weight (n, k): b = weight.t()
                bb = graph.call_method("t", (b[1],))
            new = graph.call_function(_fused_matmul_allreduce, (a, bb, bias, ar.args[2], site))
        for v in chain[1:]:
            if v.op == "call_method":
                new = graph.call_method(v.target, (new,) + tuple(v.args[1:]), dict(v.kwargs))
            else:
                new = graph.call_function(v.target, (new,) + tuple(v.args[1:]), dict(v.kwargs))
    for u in later:
        u.replace_input_with(src, new)
    for c in copies:
        c.replace_all_uses_with(new)
        graph.erase_node(c)
    w = wait
    while w is not ar:
        prev = w.args[0]
        w.replace_all_uses_with(new)
        graph.erase_node(w)
        w = prev
    graph.erase_node(ar)
    for n in reversed(chain):
        if not n.users:
            graph.erase_node(n)
    return 1


def _last_wait(node: Any, T: dict) -> Optional[Any]:
    """The end of the chain of wait_tensor nodes that are ``node``'s only reader (one wait
    per wait_tensor call), or None when something else reads ``node`` or a wait."""
    if len(node.users) != 1:
        return None
    wait = next(iter(node.users))
    if not _is(wait, T["wait"]):
        return None
    while len(wait.users) == 1 and _is(next(iter(wait.users)), T["wait"]):
        wait = next(iter(wait.users))
    return wait


def _erase_waits(graph: Any, wait: Any, upto: Any) -> None:
    while wait is not upto:
        prev = wait.args[0]
        graph.erase_node(wait)
        wait = prev


def _rewrite_allgather(graph: Any, ag: Any, T: dict, torch: Any) -> int:
    if len(ag.args) != 3 or ag.kwargs:
        return 0
    wait = _last_wait(ag, T)
    if wait is None or len(wait.users) != 1:
        return 0
    m = next(iter(wait.users))
    if not (_is(m, T["mm"]) and m.op == "call_function" and "aten" in str(m.target)
            and not m.kwargs and m.args[0] is wait and m.args[1] is not wait):
        return 0
    x, group_size, group = ag.args
    with graph.inserting_before(m):
        new = graph.call_function(torch.ops.maco.allgather_gemm.default,
                                  (x, m.args[1], group_size, group, next(_sites)))
    m.replace_all_uses_with(new)
    graph.erase_node(m)
    _erase_waits(graph, wait, ag)
    graph.erase_node(ag)
    return 1


def _rewrite_reduce_scatter(graph: Any, rs: Any, T: dict, torch: Any) -> int:
    if len(rs.args) != 4 or rs.kwargs or rs.args[1] != "sum":
        return 0
    m = rs.args[0]
    if not hasattr(m, "op") or len(m.users) != 1:
        return 0
    parts = _matmul_parts(m, T)
    if parts is None or parts[3] != "aten":
        return 0
    a, b, bias, _ = parts
    wait = _last_wait(rs, T)
    if wait is None:
        return 0
    _, _, group_size, group = rs.args
    with graph.inserting_before(rs):
        new = graph.call_function(torch.ops.maco.gemm_reduce_scatter.default,
                                  (a, b, bias, group_size, group, next(_sites)))
    wait.replace_all_uses_with(new)
    _erase_waits(graph, wait, rs)
    graph.erase_node(rs)
    graph.erase_node(m)
    return 1


def _rewrite_inplace(graph: Any, ar: Any, T: dict) -> int:
    """``y = matmul(...); torch.distributed.all_reduce(y)``: later uses of y take the fused
    call's result."""
    import torch.distributed as dist

    y = ar.args[0] if ar.args else ar.kwargs.get("tensor")
    if not hasattr(y, "op"):
        return 0
    op = ar.args[1] if len(ar.args) > 1 else ar.kwargs.get("op", dist.ReduceOp.SUM)
    group = ar.args[2] if len(ar.args) > 2 else ar.kwargs.get("group")
    async_op = ar.args[3] if len(ar.args) > 3 else ar.kwargs.get("async_op", False)
    if async_op or op != dist.ReduceOp.SUM or ar.users:
        return 0
    if group is not None and hasattr(group, "op"):
        return 0  # a group computed in the graph
    parts = _matmul_parts(y, T)
    if parts is None:
        return 0
    a, b, bias, _ = parts
    order = {n: i for i, n in enumerate(graph.nodes)}
    if any(order[u] < order[ar] for u in y.users if u is not ar):
        return 0  # the partial product is read before the all_reduce
    site = next(_sites)
    with graph.inserting_before(ar):
        bb = graph.call_method("t", (b[1],)) if isinstance(b, tuple) else b
        new = graph.call_function(_fused_matmul_allreduce, (a, bb, bias, _group_name(group),
                                                             site))
    for u in list(y.users):
        if u is not ar:
            u.replace_input_with(y, new)
    graph.erase_node(ar)
    graph.erase_node(y)
    return 1


# ---------------------------------------------------------------------------- backends

def _inductor_pass_class():
    try:
        from torch._inductor.custom_graph_pass import CustomGraphPass
    except ImportError:  # pragma: no cover - older torch: a plain callable
        CustomGraphPass = object

    class _MacoPass(CustomGraphPass):
        def __call__(self, graph):
            fuse_matmul_allreduce(graph)

        def uuid(self):
            return None  # the pass numbers call sites: never reuse cached code

    return _MacoPass


def maco_backend(gm: Any, example_inputs: Any, *, inner: str = "inductor") -> Any:
    """The ``torch.compile`` backend ``"maco"``: AOT Autograd's forward graph (aten ops,
    functional collectives) gets :func:`fuse_matmul_allreduce`, then runs through ``inner``:
    "inductor" (Inductor compiles the rest; the pass runs as its post-grad custom pass) or
    "eager" (the rewritten aten graph runs op by op). Backward graphs are not rewritten."""
    _register_ops()
    if inner == "inductor":
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs,
                          config_patches={"post_grad_custom_post_pass": _inductor_pass_class()()})
    if inner == "eager":
        from torch._dynamo.backends.common import aot_autograd

        def fw(g, ex):
            fuse_matmul_allreduce(g)
            return g

        return aot_autograd(fw_compiler=fw, bw_compiler=lambda g, ex: g)(gm, example_inputs)
    raise ValueError(f"inner: {inner!r}; accepts 'inductor' or 'eager'")


def _register_backend() -> None:
    """Registers the backend name "maco" with torch.compile (also found without this through
    the package's "torch_dynamo_backends" entry point)."""
    try:
        from torch._dynamo.backends.registry import register_backend
    except ImportError:  # pragma: no cover
        return
    try:
        register_backend(maco_backend, name="maco")
    except Exception:  # noqa: BLE001 - registered already (e.g. through the entry point)
        pass


def compile(model: Any, *, inner: str = "inductor", **torch_compile_kwargs: Any) -> Any:
    """``torch.compile(model, backend="maco")`` with the choice of what runs the rest of the
    graph: ``inner`` "inductor" (default) or "eager" (see :func:`maco_backend`). Each
    matmul + all_reduce of a tensor-parallel layer becomes ``torch.ops.maco.gemm_allreduce``
    (:func:`maco.tp.gemm_allreduce` by default, the fused persistent kernel with
    ``maco.config.set(fusion="persistent")``); in a sequence-parallel layer each all_gather
    + matmul and matmul + reduce_scatter becomes ``torch.ops.maco.allgather_gemm`` or
    ``gemm_reduce_scatter`` (:func:`fuse_matmul_allreduce`). ``maco.allreduce`` calls in the
    model are traced as torch's functional all_reduce so they fuse too. Other keyword
    arguments go to ``torch.compile``.

    What differs from the design: not the whole model in one kernel launch. Each fused pair
    is one persistent-kernel launch; attention, norms and the rest are Inductor's (or
    eager) kernels between them.

    Raises: ValueError: an unknown ``inner``; what torch.compile raises."""
    torch = _torch()
    if inner not in ("inductor", "eager"):
        raise ValueError(f"inner: {inner!r}; accepts 'inductor' or 'eager'")
    _register_ops()
    return torch.compile(model, backend=functools.partial(maco_backend, inner=inner),
                         **torch_compile_kwargs)


# ---------------------------------------------------------------------------- models

def _module_base():
    return _torch().nn.Module


class Module(_module_base()):
    """An ``nn.Module`` whose forward is an overlap scope (:func:`maco.optimize_context`):
    ``maco.allreduce`` (and ``dist.all_reduce``) inside it run on MACO and overlap the
    operations that follow them, waited for at the first use of their result.

    Across modules: when the forward ends inside another scope (an enclosing maco.Module, an
    ``optimize_context``), collectives still running are handed to it, so a layer's final
    allreduce overlaps what the parent does next; at the outermost module a single returned
    tensor whose collective still runs comes back as an ``AsyncCollectiveResult`` (waited
    for at its first use), anything else is waited for.

    The design's layers assign attributes without calling ``super().__init__()``; a
    maco.Module works either way (``nn.Module.__init__`` runs before the subclass's).
    Under ``torch.compile`` (``maco.compile``) the scope does nothing: the compiled graph
    fuses the matmul + allreduce pairs instead.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> "Module":
        self = super().__new__(cls)
        _torch().nn.Module.__init__(self)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return super().__call__(*args, **kwargs)
        scope = _Scope(True, type(self).__name__)
        scope.__enter__()
        try:
            out = super().__call__(*args, **kwargs)
        except BaseException:
            scope.__exit__(*sys.exc_info())
            raise
        pending = scope.pending
        scope.pending = []
        scope.__exit__(None, None, None)
        return _hand_over(pending, out)


def _hand_over(pending: list, out: Any) -> Any:
    """Collectives still pending at the end of a maco.Module's forward: to the enclosing
    scope; else the returned tensor waits at its first use; the rest is waited for now."""
    from . import _overlap

    if not pending:
        return out
    outer = _overlap._current_scope()
    if outer is not None:
        outer.pending.extend(pending)
        return out
    torch = _torch()
    if isinstance(out, torch.Tensor):
        k = _overlap._key(out)
        mine = [p for p in pending if k in p.outs]
        for p in pending:
            if p not in mine:
                p.handle.wait()
        if mine:
            h = mine[0].handle
            if len(mine) > 1:
                group: list = []
                for p in mine:
                    p.handle.group = group
                    group.append(p.handle)
            return async_tensor(out, h)
        return out
    for p in pending:
        p.handle.wait()
    return out


class TPLinear(Module):
    """A row-parallel linear layer (the design's TPLinear): this rank holds the columns
    ``[rank * in / ws, (rank + 1) * in / ws)`` of the weight, multiplies its shard of the
    input features by it, and the allreduce of the products overlaps the next operation.

    Args:
        in_features, out_features: the full layer's sizes (in_features divisible by
            world_size).
        world_size: the tensor-parallel size (None: the default communicator's, else
            torch.distributed's).
        bias: a bias of out_features (replicated), added after the allreduce (adding it
            waits for the allreduce).
        dtype, device: of the parameters.

    Shapes: ``x`` (..., in_features / world_size) -> (..., out_features), x's dtype. The
    weight is (out_features, in_features / world_size), initialised as nn.Linear's.
    Streams: the allreduce runs on MACO's communication stream (see maco.allreduce).

    Raises: ValueError: in_features not divisible by world_size; sizes not positive.
    """

    def __init__(self, in_features: int, out_features: int, world_size: Optional[int] = None,
                 *, bias: bool = False, dtype: Any = None, device: Any = None):
        super().__init__()
        torch = _torch()
        import math

        from . import _level1

        if world_size is None:
            world_size = _level1._rank_size()[1]
        for v, nm in ((in_features, "in_features"), (out_features, "out_features"),
                      (world_size, "world_size")):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{nm}: {v!r} is not a positive int")
        if in_features % world_size:
            raise ValueError(f"in_features: {in_features} is not divisible by world_size "
                             f"{world_size}")
        self.world_size = world_size
        self.in_features, self.out_features = in_features, out_features
        self.weight = torch.nn.Parameter(torch.empty(out_features, in_features // world_size,
                                                     dtype=dtype, device=device))
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        self.bias = None
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(out_features, dtype=dtype, device=device))

    def forward(self, x: Any) -> Any:
        torch = _torch()
        from . import _level1

        y = torch.matmul(x, self.weight.T)
        y = _level1.allreduce(y, overlap_with_next=True)
        if self.bias is not None:
            y = y + self.bias
        return y


def task_graph(fn: Callable) -> Callable:
    """Decorator for a layer's ``forward``: the method is compiled with ``backend="maco"``
    (once per instance, at its first call), so its matmul + allreduce pairs run as fused
    persistent-kernel operators and the rest through Inductor; under an enclosing
    ``torch.compile`` it is traced as written.

    What differs from the design: the "task graph" is the compiled FX graph with the fused
    operators, not a single persistent kernel for the whole layer (MACO's runtime has no
    attention or normalisation tasks). The inner compiler is ``maco.config``-independent:
    pass ``maco.task_graph`` on a function whose module sets ``_maco_inner = "eager"`` to
    run the rest eagerly (CPU tests do).

    Raises: TypeError when ``fn`` is not callable."""
    if not callable(fn):
        raise TypeError(f"task_graph: {fn!r} is not callable")

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if _is_compiling():
            return fn(self, *args, **kwargs)
        c = self.__dict__.get("_maco_task_graph")
        if c is None:
            inner = getattr(self, "_maco_inner", "inductor")
            c = compile(types.MethodType(fn, self), inner=inner)
            object.__setattr__(self, "_maco_task_graph", c)
        with suspended():
            return c(*args, **kwargs)

    wrapper.__maco_task_graph__ = True
    return wrapper


class PersistentContext:
    """``with maco.PersistentContext(model) as ctx: out = ctx.forward(batch)`` — runs ``model``
    compiled with ``backend="maco"``, keeping the fused persistent kernels it builds (their
    registered buffers and memory channels) from one batch to the next, and freeing them when
    the block ends (after synchronising the device).

    Args:
        model: an ``nn.Module`` (or any callable torch.compile takes).
        inner: "inductor" (default) or "eager": what runs the non-fused operations.
        sm_config: an :class:`maco.SMConfig` or ``(compute_sms, comm_sms)``: the split of
            the fused kernels (default: the split in use, else MACO's).

    What differs from the design: one persistent kernel per matmul + allreduce pair and
    shape, not one for the whole model (see :func:`maco.compile`). Every rank enters the
    context and runs the same batches (kernels are built collectively at the first batch of
    each shape). Inside the block ``maco.config``'s ``fusion`` is "persistent" (the context
    exists for those kernels; the process-wide default is "copy_engine"); it is restored at
    exit. Not thread-safe.
    """

    def __init__(self, model: Any, *, inner: str = "inductor", sm_config: Any = None):
        if inner not in ("inductor", "eager"):
            raise ValueError(f"inner: {inner!r}; accepts 'inductor' or 'eager'")
        self.model = model
        self.inner = inner
        self.sm_config = sm_config
        self._compiled = None
        self._sites_before: Optional[set] = None
        self._saved_split = None
        self._saved_fusion = None

    def __enter__(self) -> "PersistentContext":
        from . import _config as c

        self._saved_split = c._explicit
        with c._lock:
            self._saved_fusion = c._settings["fusion"]
            c._settings["fusion"] = "persistent"
        if self.sm_config is not None:
            if hasattr(self.sm_config, "apply"):
                self.sm_config.apply()
            else:
                cs, ms = self.sm_config
                c.set_config(compute_sms=cs, comm_sms=ms)
        with _lock:
            self._sites_before = {k[0] for k in _runners}
        self._compiled = compile(self.model, inner=self.inner)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled model's output for these inputs.

        Raises: InvalidUsageError outside the ``with`` block."""
        if self._compiled is None:
            from ._errors import InvalidUsageError

            raise InvalidUsageError("PersistentContext.forward: use it inside the with block")
        with suspended():
            return self._compiled(*args, **kwargs)

    __call__ = forward

    @property
    def kernels(self) -> list:
        """The fused kernels built inside this context so far."""
        with _lock:
            return [r for k, r in _runners.items() if k[0] not in (self._sites_before or set())]

    def __exit__(self, *exc: Any) -> None:
        from . import _config as c

        with _lock:
            mine = {k[0] for k in _runners} - (self._sites_before or set())
        close_kernels(mine)
        self._compiled = None
        with c._lock:
            c._explicit = self._saved_split
            if self._saved_fusion is not None:
                c._settings["fusion"] = self._saved_fusion


_register_backend()
