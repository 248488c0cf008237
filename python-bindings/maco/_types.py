"""Element types and reduction operations, and how they map to PyTorch, NumPy/CuPy, DLPack
and ``__cuda_array_interface__`` types (both ways); the ranges of the C types that integer
arguments cross into (:func:`c_int`)."""

from __future__ import annotations

import enum
import operator
import sys
from typing import Any

__all__ = [
    "DataType",
    "ReduceOp",
    "to_maco_dtype",
    "to_torch_dtype",
    "to_numpy_dtype",
    "dtype_size",
]


class DataType(enum.IntEnum):
    """MACO's element types (``maco_datatype_t``); the value is the C enum's."""

    INT8 = 0
    UINT8 = 1
    INT32 = 2
    UINT32 = 3
    INT64 = 4
    UINT64 = 5
    FLOAT16 = 6
    BFLOAT16 = 7
    FLOAT32 = 8
    FLOAT64 = 9
    FP8_E4M3 = 10
    FP8_E5M2 = 11

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return _SIZES[self]


class ReduceOp(enum.IntEnum):
    """Reduction operations (``maco_redop_t``). AVG is the sum divided once by the number of
    ranks (integers truncate toward zero)."""

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    AVG = 4


_SIZES = {
    DataType.INT8: 1,
    DataType.UINT8: 1,
    DataType.INT32: 4,
    DataType.UINT32: 4,
    DataType.INT64: 8,
    DataType.UINT64: 8,
    DataType.FLOAT16: 2,
    DataType.BFLOAT16: 2,
    DataType.FLOAT32: 4,
    DataType.FLOAT64: 8,
    DataType.FP8_E4M3: 1,
    DataType.FP8_E5M2: 1,
}


def dtype_size(dtype: DataType | int) -> int:
    """Bytes per element of a MACO type."""
    return _SIZES[DataType(dtype)]


# DLPack (type code, bits) -> MACO type. Codes from the DLPack specification: 0 int, 1 uint,
# 2 float, 4 bfloat, 10 float8_e4m3fn, 12 float8_e5m2.
DLPACK_TO_MACO = {
    (0, 8): DataType.INT8,
    (1, 8): DataType.UINT8,
    (0, 32): DataType.INT32,
    (1, 32): DataType.UINT32,
    (0, 64): DataType.INT64,
    (1, 64): DataType.UINT64,
    (2, 16): DataType.FLOAT16,
    (4, 16): DataType.BFLOAT16,
    (2, 32): DataType.FLOAT32,
    (2, 64): DataType.FLOAT64,
    (10, 8): DataType.FP8_E4M3,
    (12, 8): DataType.FP8_E5M2,
}
MACO_TO_DLPACK = {v: k for k, v in DLPACK_TO_MACO.items()}
DLPACK_COMPLEX = 5

# NumPy-style type strings (__cuda_array_interface__'s typestr without the byte order).
_TYPESTR_TO_MACO = {
    "i1": DataType.INT8,
    "u1": DataType.UINT8,
    "i4": DataType.INT32,
    "u4": DataType.UINT32,
    "i8": DataType.INT64,
    "u8": DataType.UINT64,
    "f2": DataType.FLOAT16,
    "f4": DataType.FLOAT32,
    "f8": DataType.FLOAT64,
}

_NAMES = {
    "int8": DataType.INT8,
    "uint8": DataType.UINT8,
    "int32": DataType.INT32,
    "uint32": DataType.UINT32,
    "int64": DataType.INT64,
    "uint64": DataType.UINT64,
    "float16": DataType.FLOAT16,
    "half": DataType.FLOAT16,
    "fp16": DataType.FLOAT16,
    "bfloat16": DataType.BFLOAT16,
    "bf16": DataType.BFLOAT16,
    "float32": DataType.FLOAT32,
    "float": DataType.FLOAT32,
    "fp32": DataType.FLOAT32,
    "float64": DataType.FLOAT64,
    "double": DataType.FLOAT64,
    "fp64": DataType.FLOAT64,
    "fp8_e4m3": DataType.FP8_E4M3,
    "float8_e4m3fn": DataType.FP8_E4M3,
    "e4m3": DataType.FP8_E4M3,
    "fp8_e5m2": DataType.FP8_E5M2,
    "float8_e5m2": DataType.FP8_E5M2,
    "e5m2": DataType.FP8_E5M2,
}

_TORCH_NAMES = {
    DataType.INT8: "int8",
    DataType.UINT8: "uint8",
    DataType.INT32: "int32",
    DataType.UINT32: "uint32",
    DataType.INT64: "int64",
    DataType.UINT64: "uint64",
    DataType.FLOAT16: "float16",
    DataType.BFLOAT16: "bfloat16",
    DataType.FLOAT32: "float32",
    DataType.FLOAT64: "float64",
    DataType.FP8_E4M3: "float8_e4m3fn",
    DataType.FP8_E5M2: "float8_e5m2",
}

_torch_map: dict | None = None


def _torch_to_maco() -> dict:
    global _torch_map
    if _torch_map is None:
        import torch

        _torch_map = {}
        for dt, name in _TORCH_NAMES.items():
            t = getattr(torch, name, None)
            if t is not None:
                _torch_map[t] = dt
    return _torch_map


def _numpy_like_to_maco(dtype: Any) -> DataType | None:
    """A numpy.dtype (NumPy, CuPy, ml_dtypes) -> MACO type, or None."""
    name = getattr(dtype, "name", None)
    if name in _NAMES and name not in ("half", "float", "double"):
        return _NAMES[name]
    kind = getattr(dtype, "kind", None)
    itemsize = getattr(dtype, "itemsize", None)
    if kind in ("i", "u", "f") and itemsize is not None:
        return _TYPESTR_TO_MACO.get(f"{kind}{itemsize}")
    return None


def to_maco_dtype(dtype: Any) -> DataType:
    """Converts a type to MACO's.

    Accepts a :class:`DataType` or its int value, a ``torch.dtype``, a NumPy/CuPy dtype (or
    anything ``numpy.dtype()`` takes, e.g. ``numpy.float32``; bfloat16 and fp8 through
    ``ml_dtypes``), a DLPack ``(code, bits)`` pair, or a name such as ``"bf16"``,
    ``"float32"``, ``"fp8_e4m3"``.

    Raises:
        TypeError: the type has no MACO equivalent (e.g. bool, int16, complex), naming it.
    """
    if isinstance(dtype, DataType):
        return dtype
    if isinstance(dtype, bool):
        raise TypeError("dtype: bool is not a MACO type")
    if isinstance(dtype, int):
        try:
            return DataType(dtype)
        except ValueError:
            raise TypeError(f"dtype: {dtype} is not a MACO datatype value (0..11)") from None
    if isinstance(dtype, str):
        key = dtype.lower().replace("torch.", "")
        if key in _NAMES:
            return _NAMES[key]
        raise TypeError(f"dtype: {dtype!r} is not a MACO type; known names: {sorted(_NAMES)}")
    if isinstance(dtype, tuple) and len(dtype) == 2:
        if tuple(dtype) in DLPACK_TO_MACO:
            return DLPACK_TO_MACO[tuple(dtype)]
        raise TypeError(f"dtype: DLPack type (code, bits) {dtype} has no MACO equivalent")
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dtype, torch.dtype):
        m = _torch_to_maco().get(dtype)
        if m is None:
            raise TypeError(f"dtype: {dtype} has no MACO equivalent; supported: "
                            f"{', '.join('torch.' + n for n in _TORCH_NAMES.values())}")
        return m
    m = _numpy_like_to_maco(dtype)
    if m is not None:
        return m
    np = sys.modules.get("numpy")
    if np is not None:
        try:
            m = _numpy_like_to_maco(np.dtype(dtype))
        except TypeError:
            m = None
        if m is not None:
            return m
    raise TypeError(f"dtype: {dtype!r} has no MACO equivalent")


def to_torch_dtype(dtype: DataType | int | str) -> Any:
    """The ``torch.dtype`` of a MACO type (imports torch).

    Raises:
        TypeError: this torch has no such type (uint32/uint64 need torch >= 2.3).
    """
    import torch

    dt = to_maco_dtype(dtype)
    t = getattr(torch, _TORCH_NAMES[dt], None)
    if t is None:
        raise TypeError(f"dtype: this PyTorch ({torch.__version__}) has no torch.{_TORCH_NAMES[dt]}")
    return t


def to_numpy_dtype(dtype: DataType | int | str) -> Any:
    """The ``numpy.dtype`` of a MACO type (CuPy uses NumPy's dtypes).

    bfloat16 and the fp8 types need the ``ml_dtypes`` package.

    Raises:
        TypeError: NumPy cannot represent the type and ml_dtypes is missing.
    """
    import numpy as np

    dt = to_maco_dtype(dtype)
    if dt in (DataType.BFLOAT16, DataType.FP8_E4M3, DataType.FP8_E5M2):
        try:
            import ml_dtypes
        except ImportError:
            raise TypeError(f"dtype: NumPy has no {dt.name.lower()}; install ml_dtypes") from None
        return np.dtype(getattr(ml_dtypes, _TORCH_NAMES[dt]))
    return np.dtype(_TORCH_NAMES[dt])


_OP_NAMES = {
    "sum": ReduceOp.SUM,
    "prod": ReduceOp.PROD,
    "product": ReduceOp.PROD,
    "min": ReduceOp.MIN,
    "max": ReduceOp.MAX,
    "avg": ReduceOp.AVG,
    "mean": ReduceOp.AVG,
}


def to_maco_op(op: Any) -> ReduceOp:
    """Converts ``op`` to a :class:`ReduceOp`: a ReduceOp or its int value, a name ("sum",
    "prod", "min", "max", "avg") or a ``torch.distributed.ReduceOp`` (SUM, PRODUCT, MIN,
    MAX, AVG).

    Raises:
        ValueError: an operation MACO does not have (e.g. BAND, PREMUL_SUM), naming it.
    """
    if isinstance(op, ReduceOp):
        return op
    if isinstance(op, int) and not isinstance(op, bool):
        try:
            return ReduceOp(op)
        except ValueError:
            raise ValueError(f"op: {op} is not a MACO reduction (0..4)") from None
    if isinstance(op, str):
        try:
            return _OP_NAMES[op.lower()]
        except KeyError:
            raise ValueError(f"op: {op!r} is not a MACO reduction (sum, prod, min, max, avg)") from None
    dist = sys.modules.get("torch.distributed")
    if dist is not None and hasattr(dist, "ReduceOp"):
        R = dist.ReduceOp
        for theirs, ours in ((R.SUM, ReduceOp.SUM), (R.PRODUCT, ReduceOp.PROD),
                             (R.MIN, ReduceOp.MIN), (R.MAX, ReduceOp.MAX),
                             (R.AVG, ReduceOp.AVG)):
            try:
                if op == theirs:
                    return ours
            except TypeError:
                pass
        if isinstance(op, (R, getattr(R, "RedOpType", R))):
            raise ValueError(f"op: torch.distributed {op} has no MACO equivalent "
                             "(SUM, PRODUCT, MIN, MAX, AVG do)")
    raise ValueError(f"op: {op!r} is not a reduction MACO knows")


INT_MAX = (1 << 31) - 1
INT_MIN = -(1 << 31)
INT64_MAX = (1 << 63) - 1
SIZE_MAX = (1 << 64) - 1  # size_t, uintptr_t and uint64_t: MACO runs on 64-bit platforms only
_LIMITS = {INT_MAX: "2**31 - 1, a C int", INT64_MAX: "2**63 - 1, a C int64_t",
           SIZE_MAX: "2**64 - 1, a C size_t"}


def c_int(value: Any, name: str, low: int = 0, high: int = INT_MAX) -> int:
    """``value`` as an int in ``[low, high]``, for an integer argument that crosses into the C
    library (default: a non-negative C int; ``high=SIZE_MAX`` for sizes, counts and addresses).
    Checked here so that a bad value is an error naming the argument and its range rather than
    the extension's list of signatures.

    Raises:
        TypeError: not an integer (a bool, a float, a str), naming ``name``.
        ValueError: outside ``[low, high]``, naming ``name`` and the range.
    """
    if isinstance(value, bool):
        raise TypeError(f"{name}: expected an integer, got a bool")
    try:
        v = operator.index(value)
    except TypeError:
        raise TypeError(f"{name}: expected an integer, got {type(value).__name__}") from None
    if not low <= v <= high:
        raise ValueError(f"{name}: {v} is outside [{low}, {_LIMITS.get(high, high)}]")
    return v
