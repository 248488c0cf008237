"""MACO from Python: collectives on PyTorch tensors and CuPy arrays, and a torch.distributed
backend.

Level 1 (one default communicator)::

    import maco
    maco.init()                      # maco-run / torchrun variables, or torch.distributed
    y = maco.allreduce(x)            # x: a CUDA tensor; in place, returns x
    g = maco.allgather(x)            # shape (world_size, *x.shape)

Level 2 (SMs split between compute and communication, overlapped)::

    ctx = maco.Context(compute_sms=96, comm_sms=32)
    y = ctx.compute(lambda: x @ w1)
    work = ctx.allreduce(y, async_op=True)
    z = ctx.compute(lambda: x @ w2)
    y = work.wait()

Overlap (the design's API: docs/python.md, "The overlap API")::

    @maco.optimize_comm                  # or @maco.optimize, maco.optimize_context(),
    def f(x, w):                         # maco.auto_overlap(), maco.Module
        y = maco.allreduce(x @ w)        # overlaps what follows, waited at first use
        return y
    model = torch.compile(model, backend="maco")   # matmul + all_reduce -> fused kernel

Explicit communicators: :class:`maco.Communicator`. torch.distributed: ``import maco.torch``
registers the backend ``"maco"``; :func:`maco.patch_torch_distributed` routes an existing
group's collectives through MACO.
"""

import importlib.util as _importlib_util

from . import _maco
from ._comm import (Communicator, Plan, Registration, cuda_device_count, empty, group,
                    unique_id)
from .context import Context, Work
from ._errors import (CommTimeoutError, CudaError, InternalError, InvalidArgumentError,
                      InvalidUsageError, MacoError, OutOfMemoryError, RemoteError,
                      SystemCallError, UnsupportedError, error_class)
from . import tp
from .persistent import KernelTensor, PersistentKernel, Profiler, TaskGraph, profiler
from ._level1 import (all_to_all, allgather, allreduce, barrier, broadcast, finalize,
                      get_default_communicator, get_local_rank, get_rank, get_world_size, init,
                      is_initialized, recv, reduce, reduce_scatter, send)
from ._types import (DataType, ReduceOp, dtype_size, to_maco_dtype, to_numpy_dtype,
                     to_torch_dtype)
from ._config import (ConfigTable, Role, SMConfig, SMSplit, auto_config, config,
                      dynamic_sm_config, get_config, set_config)
from ._overlap import (CommWork, Future, OverlapRegion, Pipeline, Ring, auto_overlap, optimize,
                       optimize_comm, optimize_context, overlap_region, ring, wait_all,
                       wait_overlap_group)
from ._schedule import CommScheduler, Phase

__version__ = _maco.version()
"""The package's version: the C library's (``maco_version_string()``)."""

SUM = ReduceOp.SUM
PROD = ReduceOp.PROD
MIN = ReduceOp.MIN
MAX = ReduceOp.MAX
AVG = ReduceOp.AVG


def patch_torch_distributed(*args, **kwargs):
    """Routes ``torch.distributed`` collectives on CUDA tensors through MACO (see
    :func:`maco.torch.patch_torch_distributed`)."""
    from .torch import patch_torch_distributed as _patch

    return _patch(*args, **kwargs)


def unpatch_torch_distributed():
    """Undoes :func:`patch_torch_distributed`."""
    from .torch import unpatch_torch_distributed as _unpatch

    return _unpatch()


_MODELS = ("Module", "TPLinear", "task_graph", "compile", "PersistentContext",
           "fuse_matmul_allreduce", "maco_backend", "FusedGemmAllreduce")


def __getattr__(name: str):
    """The model API (maco.Module, TPLinear, task_graph, compile, PersistentContext, ...)
    needs PyTorch; it is imported at first use so that ``import maco`` does not import torch."""
    if name in _MODELS:
        from . import _compile

        return getattr(_compile, name)
    raise AttributeError(f"module 'maco' has no attribute {name!r}")


__all__ = [
    "__version__",
    "Communicator", "Registration", "Plan", "unique_id", "group", "empty", "cuda_device_count",
    "MacoError", "InvalidArgumentError", "CudaError", "SystemCallError", "CommTimeoutError",
    "RemoteError", "UnsupportedError", "InternalError", "OutOfMemoryError",
    "InvalidUsageError", "error_class",
    "init", "finalize", "is_initialized", "get_default_communicator", "get_rank",
    "get_world_size", "get_local_rank", "allreduce", "allgather", "reduce_scatter",
    "broadcast", "reduce", "all_to_all", "send", "recv", "barrier",
    "DataType", "ReduceOp", "dtype_size", "to_maco_dtype", "to_torch_dtype", "to_numpy_dtype",
    "SUM", "PROD", "MIN", "MAX", "AVG",
    "patch_torch_distributed", "unpatch_torch_distributed", "config",
    "PersistentKernel", "TaskGraph", "KernelTensor", "profiler", "Profiler",
    "Context", "Work",
    "ConfigTable", "Role", "SMConfig", "SMSplit", "auto_config", "dynamic_sm_config",
    "get_config", "set_config",
    "CommWork", "Future", "OverlapRegion", "Pipeline", "Ring", "auto_overlap", "optimize",
    "optimize_comm", "optimize_context", "overlap_region", "ring", "wait_all",
    "wait_overlap_group", "CommScheduler", "Phase",
    # maco.compile stays out of __all__: ``from maco import *`` must not hide the builtin.
    *((n for n in _MODELS if n != "compile") if _importlib_util.find_spec("torch") is not None
      else ()),
]
