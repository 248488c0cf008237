"""The seeds' model API: ``maco.Module`` (a forward that is an overlap scope), ``maco.TPLinear``,
``@maco.task_graph`` and ``maco.PersistentContext`` (over maco/_compile.py's backend). Needs
torch."""

from __future__ import annotations

import functools
import math
import types
from typing import Any, Callable, Optional

import torch

from . import _config
from ._collectives import allreduce
from ._compile import compile
from ._default_comm import rank_size
from ._errors import InvalidUsageError
from ._fused_ops import close_kernels, kernel_sites, kernels_of
from ._overlap import OverlapScope, suspended
from ._streams import _is_compiling

__all__ = ["Module", "TPLinear", "task_graph", "PersistentContext"]


class Module(torch.nn.Module):
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
        torch.nn.Module.__init__(self)
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        scope = OverlapScope(True, what=type(self).__name__)
        return scope._run_handing_over(super().__call__, args, kwargs)


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
        if world_size is None:
            world_size = rank_size()[1]
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
        y = torch.matmul(x, self.weight.T)
        y = allreduce(y, overlap_with_next=True)
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
        self._saved: Optional[tuple] = None  # the split and fusion from before the block

    def __enter__(self) -> "PersistentContext":
        self._saved = _config.snapshot("fusion")
        _config.override("fusion", "persistent")
        if self.sm_config is not None:
            if hasattr(self.sm_config, "apply"):
                self.sm_config.apply()
            else:
                cs, ms = self.sm_config
                _config.set_config(compute_sms=cs, comm_sms=ms)
        self._sites_before = kernel_sites()
        self._compiled = compile(self.model, inner=self.inner)
        return self

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """The compiled model's output for these inputs.

        Raises: InvalidUsageError outside the ``with`` block."""
        if self._compiled is None:
            raise InvalidUsageError("PersistentContext.forward: use it inside the with block")
        with suspended():
            return self._compiled(*args, **kwargs)

    __call__ = forward

    @property
    def kernels(self) -> list:
        """The fused kernels built inside this context so far."""
        return kernels_of(kernel_sites() - (self._sites_before or set()))

    def __exit__(self, *exc: Any) -> None:
        close_kernels(kernel_sites() - (self._sites_before or set()))
        self._compiled = None
        if self._saved is not None:
            _config.restore(self._saved)
            self._saved = None

