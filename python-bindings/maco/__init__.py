"""MACO from Python: collectives on PyTorch tensors and CuPy arrays, and a torch.distributed
backend.

Level 1 (one default communicator)::

    import maco
    maco.init()                      # maco-run / torchrun variables, or torch.distributed
    y = maco.allreduce(x)            # x: a CUDA tensor; in place, returns x
    g = maco.allgather(x)            # shape (world_size, *x.shape)

Overlap: one entry point, the overlap scope (docs/python.md, "The overlap API", says what
the seed design's other names are over it)::

    with maco.optimize_context():        # or @maco.optimize_context() on a function
        y = maco.allreduce(x @ w)        # overlaps what follows, waited at first use
        z = x @ w2
    model = torch.compile(model, backend="maco")   # matmul + all_reduce -> fused operator

Explicit communicators: :class:`maco.Communicator`. torch.distributed: ``import maco.torch``
registers the backend ``"maco"``; :func:`maco.patch_torch_distributed` routes an existing
group's collectives through MACO.

The package is a one-way stack (docs/design.md, "Python package"): the extension
(``maco._maco``), the communicator, the default communicator and the settings, the
torch.distributed process group, the overlap API, then ``maco.torch``, ``maco.tp``,
``maco.ep``, :class:`maco.PersistentKernel` and the compile backend; the DSL
(``maco.language``) beside them.
"""

import importlib.util as _importlib_util

from . import _maco, tp  # noqa: F401 - maco.tp without a separate import
from ._collectives import (all_to_all, allgather, allreduce, barrier, broadcast, recv, reduce,
                           reduce_scatter, send)
from ._comm import Communicator, group
from ._config import (ConfigTable, SMSplit, config, dynamic_sm_config, get_config,
                      set_config)
from ._default_comm import (empty, finalize, get_default_communicator, get_local_rank,
                            get_rank, get_world_size, init, is_initialized)
from ._errors import (CommTimeoutError, CudaError, InternalError, InvalidArgumentError,
                      InvalidUsageError, MacoError, OutOfMemoryError, RemoteError,
                      RevokedError, SystemCallError, UnsupportedError, error_class)
from ._handles import Plan, Registration
from ._job import cuda_device_count, unique_id
from ._overlap import auto_overlap, optimize, optimize_comm, optimize_context, wait_all
from ._region import Future, OverlapRegion, Pipeline, overlap_region
from ._ring import Ring, ring
from ._schedule import CommScheduler, Phase
from ._sm import Role, SMConfig, auto_config
from ._streams import CommWork, wait_overlap_group
from ._types import (DataType, ReduceOp, dtype_size, to_maco_dtype, to_numpy_dtype,
                     to_torch_dtype)
from .context import Context, Work
from .persistent import KernelTensor, PersistentKernel, Profiler, TaskGraph, profiler

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
    from .torch import patch_torch_distributed as _patch  # needs torch: loaded at first use

    return _patch(*args, **kwargs)


def unpatch_torch_distributed():
    """Undoes :func:`patch_torch_distributed`."""
    from .torch import unpatch_torch_distributed as _unpatch  # needs torch

    return _unpatch()


# The model API and the compile backend need PyTorch: name -> the module that holds it.
_MODELS = {"Module": "_models", "TPLinear": "_models", "task_graph": "_models",
           "PersistentContext": "_models", "compile": "_compile",
           "fuse_matmul_allreduce": "_compile", "maco_backend": "_compile",
           "FusedGemmAllreduce": "_fused_ops"}


def __getattr__(name: str):
    """The model API (maco.Module, TPLinear, task_graph, compile, PersistentContext, ...)
    needs PyTorch; it is imported at first use so that ``import maco`` does not import torch."""
    if name in _MODELS:
        from . import _compile, _fused_ops, _models  # need torch: loaded at first use

        return getattr({"_models": _models, "_compile": _compile,
                        "_fused_ops": _fused_ops}[_MODELS[name]], name)
    raise AttributeError(f"module 'maco' has no attribute {name!r}")


__all__ = [
    "__version__",
    "Communicator", "Registration", "Plan", "unique_id", "group", "empty", "cuda_device_count",
    "MacoError", "InvalidArgumentError", "CudaError", "SystemCallError", "CommTimeoutError",
    "RemoteError", "UnsupportedError", "InternalError", "OutOfMemoryError",
    "InvalidUsageError", "RevokedError", "error_class",
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
