"""``maco.compile`` and ``torch.compile(backend="maco")``: each matmul + collective pair of a
tensor-parallel layer becomes one of MACO's GEMM + collective operators (maco/_fused_ops.py's
``torch.ops.maco.*``), the rest stays torch's; the FX pass behind them
(:func:`fuse_matmul_allreduce`). Needs torch.
"""

from __future__ import annotations

import functools
import itertools
import operator
from typing import Any, Optional

import torch
import torch.nn.functional as F

from ._fused_ops import register_ops

__all__ = ["compile", "maco_backend", "fuse_matmul_allreduce"]

_sites = itertools.count()


def _group_name(group: Any) -> str:
    """The name the fused op resolves at run time; "" is the default group."""
    return "" if group is None else group.group_name


# ---------------------------------------------------------------------------- the FX pass

def _targets() -> dict:
    import torch.distributed as dist  # where a graph is rewritten: the module loads without it

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
    register_ops()
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
    register_ops()
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
    register_ops()
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
    if inner not in ("inductor", "eager"):
        raise ValueError(f"inner: {inner!r}; accepts 'inductor' or 'eager'")
    register_ops()
    return torch.compile(model, backend=functools.partial(maco_backend, inner=inner),
                         **torch_compile_kwargs)


_register_backend()
