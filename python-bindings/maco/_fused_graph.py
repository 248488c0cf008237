"""The fused GEMM + collective operations of a :class:`maco.PersistentKernel`'s graph: how each
moves data (``fused_comm``, ``maco_fused_comm_t``: SM stores or the copy engines), the rule of
"auto", and the scratch and channels each mode needs, set up collectively (maco/persistent.py's
TaskGraph adds the operations through :func:`emit_fused`)."""

from __future__ import annotations

from typing import Any

from . import _maco
from ._types import DataType, to_maco_dtype

FUSED = {"gemm_allreduce": 0, "gemm_reduce_scatter": 1, "allgather_gemm": 2}  # maco_fused_op_t
FUSED_COMM = {"auto": 2, "sm": 0, "copy_engine": 1}  # maco_fused_comm_t
FUSED_COMM_NAMES = {0: "sm", 1: "copy_engine"}


def choose_fused_comm(op: str, world_size: int, m: int, n: int, k: int,
                      out_dtype: Any = DataType.FLOAT32) -> str:
    """What ``fused_comm="auto"`` takes for one fused operator: "copy_engine" or "sm"
    (``maco_fused_gemm_choose_comm``; the rule is in docs/persistent.md, "Copy-engine mode":
    the copy engines when there are peers, every put carries at least 1 MiB and each peer gets
    at least two, and the operator's communication tasks fit the kernel's bound).

    Args:
        op: "gemm_allreduce", "gemm_reduce_scatter" or "allgather_gemm".
        world_size: the ranks; m, n, k: the operator's shape as its ``maco_task_graph_add_*``
            takes it (allgather + GEMM: this rank's m rows); out_dtype: float32 or bfloat16
            (a torch dtype or :class:`maco.DataType`).

    Pure, needs no GPU. Raises ValueError (an unknown ``op``) and InvalidArgumentError (a
    shape the operators refuse: the message names it)."""
    if op not in FUSED:
        raise ValueError(f"op: {op!r}; accepts {', '.join(FUSED)}")
    mode = _maco.fused_choose_comm(FUSED[op], world_size, m, n, k,
                                   int(to_maco_dtype(out_dtype)))
    return FUSED_COMM_NAMES[mode]


def emit_fused(k: Any, kind: str, args: dict, torch: Any) -> str:
    """Adds the fused operation `kind` ("gemm_allreduce", ...; args: a, b, out KernelTensors,
    m, n, k, name) to kernel k's graph in k's ``fused_comm`` mode ("auto" resolved here, so
    only that mode's channels are made): its zeroed scratch (kept by k), its memory or port
    channels (collective: every rank adds the same operations in the same order) and its
    tasks. Returns the mode it took, "sm" or "copy_engine"."""
    a, b, out = args["a"], args["b"], args["out"]
    m, n, kk = args["m"], args["n"], args["k"]
    op = FUSED[kind]
    dt = int(to_maco_dtype(out.dtype))
    mode = FUSED_COMM[k._fused_comm]
    if mode == FUSED_COMM["auto"]:  # resolved here: only that mode's channels
        mode = _maco.fused_choose_comm(op, k.comm.size, m, n, kk, dt)
    size = _maco.fused_scratch_bytes_mode(op, mode, k.comm.size, m, n, kk, dt)
    # Zeroed: the operator's counters start at zero (maco_fused_gemm_t).
    scratch = torch.zeros(size, dtype=torch.uint8, device=out.tensor.device)
    k._scratch.append(scratch)
    out_bytes = out.tensor.numel() * out.tensor.element_size()
    channels, out_channels, ports, out_ports = [], [], [], []
    if mode == FUSED_COMM["copy_engine"]:
        # Rows go from scratch (allgather + GEMM: from a) into the peers' scratch.
        src = a.tensor if kind == "allgather_gemm" else scratch
        ports = k._h.setup_port_channels(src.data_ptr(),
                                         src.numel() * src.element_size(),
                                         scratch.data_ptr(), size)
        if kind == "gemm_allreduce":  # owners put the sums into every rank's out
            out_ports = k._h.setup_port_channels(out.tensor.data_ptr(), out_bytes,
                                                 out.tensor.data_ptr(), out_bytes)
    else:
        channels = k._h.setup_channels(scratch.data_ptr(), size)
        if kind == "gemm_allreduce":  # owners write the sums into every rank's out
            out_channels = k._h.setup_channels(out.tensor.data_ptr(), out_bytes)
    k._h.add_fused(op, mode, channels, out_channels, ports, out_ports,
                   a.tensor.data_ptr(), b.tensor.data_ptr(), out.tensor.data_ptr(),
                   scratch.data_ptr(), m, n, kk, dt, args["name"])
    return FUSED_COMM_NAMES[mode]
