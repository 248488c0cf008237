"""Tensors in, device addresses out: how MACO reads PyTorch tensors, CuPy arrays and anything
exporting ``__cuda_array_interface__`` or DLPack, zero-copy, and which stream it uses."""

from __future__ import annotations

import math
import operator
import sys
from typing import Any, Optional, Sequence

from . import _maco
from ._types import (DLPACK_COMPLEX, DLPACK_TO_MACO, SIZE_MAX, DataType, ReduceOp,
                     _TYPESTR_TO_MACO, _numpy_like_to_maco, _torch_to_maco, to_maco_dtype,
                     to_numpy_dtype, to_torch_dtype)

KDL_CPU = 1
KDL_CUDA = 2
KDL_CUDA_HOST = 3
KDL_CUDA_MANAGED = 13

_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDA pinned host", 13: "CUDA managed"}

_SUPPORTED = ("a CUDA torch.Tensor, a cupy.ndarray, or an object with __cuda_array_interface__ "
              "or __dlpack__ on a CUDA device")


class Buf:
    """What MACO needs of one tensor argument."""

    __slots__ = ("obj", "kind", "address", "numel", "itemsize", "dtype", "shape", "device",
                 "fdtype", "readonly")

    def __init__(self, obj, kind, address, numel, itemsize, dtype, shape, device, fdtype,
                 readonly=False):
        self.obj = obj  # the caller's object
        self.kind = kind  # "torch", "cupy", "cai" or "dlpack"
        self.address = address  # device address of element 0
        self.numel = numel  # elements (of the framework's type)
        self.itemsize = itemsize  # bytes per element
        self.dtype = dtype  # DataType, or None when MACO has no such type
        self.shape = tuple(shape)
        self.device = device  # CUDA ordinal, or -1 when unknown
        self.fdtype = fdtype  # the framework's dtype object (for messages and allocation)
        self.readonly = readonly

    @property
    def nbytes(self) -> int:
        return self.numel * self.itemsize


def _is_torch_tensor(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _is_cupy_array(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def _c_contiguous(shape: Sequence[int], strides_elems: Optional[Sequence[int]]) -> bool:
    if strides_elems is None:
        return True
    expected = 1
    for dim, stride in zip(reversed(shape), reversed(strides_elems)):
        if dim != 1 and stride != expected:
            return False
        expected *= dim
    return True


def _describe_torch(x, name: str) -> Buf:
    torch = sys.modules["torch"]
    if x.layout != torch.strided:
        raise TypeError(f"{name}: a {x.layout} tensor; MACO needs dense (strided) CUDA tensors")
    if not x.is_cuda:
        raise TypeError(f"{name}: a tensor on {x.device}; MACO needs CUDA tensors "
                        f"(move it with {name}.cuda())")
    if not x.is_contiguous():
        raise ValueError(f"{name}: the tensor is not contiguous (shape {tuple(x.shape)}, "
                         f"stride {x.stride()}); pass {name}.contiguous()")
    return Buf(x, "torch", x.data_ptr(), x.numel(), x.element_size(),
               _torch_to_maco().get(x.dtype), x.shape, x.device.index, x.dtype)


_MAX_DIMS = 64  # NumPy's limit; DLPack and the array interface set none


def _checked_shape(shape, name: str, where: str) -> tuple:
    """``shape`` as a tuple of non-negative ints, else ValueError naming ``name``."""
    try:
        dims = tuple(shape)
    except TypeError:
        raise ValueError(f"{name}: {where} shape {shape!r} is not a sequence of integers") from None
    if len(dims) > _MAX_DIMS:
        raise ValueError(f"{name}: {where} shape has {len(dims)} dimensions; at most "
                         f"{_MAX_DIMS} are accepted")
    out = []
    for d in dims:
        try:
            if isinstance(d, bool):
                raise TypeError
            d = operator.index(d)
        except TypeError:
            raise ValueError(f"{name}: {where} shape {dims!r} holds {d!r}, not an integer") \
                from None
        if d < 0:
            raise ValueError(f"{name}: {where} shape {dims!r} has a negative dimension")
        out.append(d)
    return tuple(out)


def _is_int(v) -> bool:
    try:
        operator.index(v)
    except TypeError:
        return False
    return not isinstance(v, bool)


def _checked_extent(address: int, numel: int, itemsize: int, name: str, where: str) -> None:
    """ValueError naming ``name`` unless the address and the bytes from it lie inside the
    64-bit address space (a range that wraps past 2**64 would reach the C library as a size
    or an address it cannot hold, or as a range that starts high and ends low)."""
    if not 0 <= address <= SIZE_MAX:
        raise ValueError(f"{name}: {where} address {address} is outside [0, 2**64 - 1]")
    nbytes = numel * itemsize
    if numel > SIZE_MAX or address + nbytes > SIZE_MAX + 1:
        raise ValueError(f"{name}: {where} of {numel} elements of {itemsize} bytes from "
                         f"address {address:#x} runs past the end of the 64-bit address space")


def _describe_cai(x, name: str, cai: dict) -> Buf:
    where = "__cuda_array_interface__"
    if not isinstance(cai, dict):
        raise TypeError(f"{name}: {where} is a {type(cai).__name__}, not a dict")
    missing = [k for k in ("shape", "typestr", "data") if k not in cai]
    if missing:
        raise ValueError(f"{name}: {where} lacks {', '.join(repr(k) for k in missing)} "
                         "(version 3 of the protocol requires shape, typestr and data)")
    shape = _checked_shape(cai["shape"], name, where)
    typestr = cai["typestr"]
    if not isinstance(typestr, str) or len(typestr) < 3:
        raise ValueError(f"{name}: {where} typestr {typestr!r} is not like '<f4'")
    data = cai["data"]
    if (not isinstance(data, (tuple, list)) or len(data) != 2
            or not (data[0] is None or _is_int(data[0]))):
        raise ValueError(f"{name}: {where} data {data!r} is not (address, read-only flag)")
    if cai.get("mask") is not None:
        raise ValueError(f"{name}: {where} has a mask; MACO does not read masked arrays (the "
                         "mask must be None: every element valid)")
    if cai.get("strides") is not None:
        strides = cai["strides"]
        if (not isinstance(strides, (tuple, list)) or len(strides) != len(shape)
                or not all(_is_int(v) for v in strides)):
            raise ValueError(f"{name}: {where} strides {strides!r} are not {len(shape)} "
                             "integers (one per dimension)")
    itemsize = int(typestr[2:]) if typestr[2:].isdigit() else 0
    kind_size = typestr[1:]
    dtype = _TYPESTR_TO_MACO.get(kind_size)
    fdtype = getattr(x, "dtype", typestr)
    if dtype is None and hasattr(x, "dtype"):
        dtype = _numpy_like_to_maco(x.dtype)
    if typestr[0] == ">":
        raise TypeError(f"{name}: big-endian data ({typestr}) is not supported")
    strides = cai.get("strides")
    if strides is not None and itemsize:
        if any(s % itemsize for s in strides):
            raise ValueError(f"{name}: strides {strides} are not multiples of the element size")
        strides = [s // itemsize for s in strides]
    if not _c_contiguous(shape, strides):
        raise ValueError(f"{name}: the array is not C-contiguous (shape {shape}, strides "
                         f"{cai.get('strides')} bytes); pass a contiguous copy")
    address, readonly = cai["data"]
    device = -1
    dev = getattr(x, "device", None)
    if dev is not None and hasattr(dev, "id"):
        device = int(dev.id)
    elif hasattr(x, "__dlpack_device__"):
        device = int(x.__dlpack_device__()[1])
    kind = "cupy" if _is_cupy_array(x) else "cai"
    address = operator.index(address or 0)
    numel = math.prod(shape)
    _checked_extent(address, numel, itemsize, name, where)
    return Buf(x, kind, address, numel, itemsize, dtype, shape, device, fdtype, bool(readonly))


def _describe_dlpack(x, name: str) -> Buf:
    dev = x.__dlpack_device__()
    if not isinstance(dev, (tuple, list)) or len(dev) != 2 or not all(_is_int(v) for v in dev):
        raise TypeError(f"{name}: __dlpack_device__() returned {dev!r}, not (device type, "
                        "device id)")
    dev_type, dev_id = (int(v) for v in dev)
    if dev_type != KDL_CUDA:
        where = _DEVICE_NAMES.get(int(dev_type), f"DLPack device type {dev_type}")
        raise TypeError(f"{name}: a {type(x).__name__} in {where} memory; MACO needs CUDA "
                        "device memory")
    capsule = x.__dlpack__()
    try:
        (address, shape, strides, code, bits, lanes, dev_type, dev_id,
         readonly) = _maco.dlpack_describe(capsule)
    except (TypeError, ValueError) as e:  # the extension's text, with the argument's name
        msg = str(e).removeprefix("dlpack_describe: ")
        raise type(e)(f"{name}: {msg}") from None
    finally:
        del capsule
    if lanes != 1:
        raise TypeError(f"{name}: vector types (lanes={lanes}) are not supported")
    if bits <= 0 or bits % 8:
        raise TypeError(f"{name}: elements of {bits} bits; MACO moves whole bytes (8, 16, 32, "
                        "64 ... bits)")
    shape = _checked_shape(shape, name, "DLPack tensor")
    if not _c_contiguous(shape, strides):
        raise ValueError(f"{name}: the array is not C-contiguous (shape {shape}, strides "
                         f"{strides} elements); pass a contiguous copy")
    dtype = DLPACK_TO_MACO.get((code, bits))
    fdtype = getattr(x, "dtype", (code, bits))
    if code == DLPACK_COMPLEX:
        fdtype = getattr(x, "dtype", f"complex{bits}")
    numel = math.prod(shape)
    _checked_extent(address, numel, bits // 8, name, "DLPack tensor")
    return Buf(x, "dlpack", address, numel, bits // 8, dtype, shape, dev_id, fdtype,
               bool(readonly))


def describe(x: Any, name: str) -> Buf:
    """Reads tensor ``x`` (argument ``name``) zero-copy.

    Raises:
        TypeError: not a tensor, or a tensor in CPU (or other non-CUDA) memory.
        ValueError: not contiguous; a malformed __cuda_array_interface__ (missing shape,
            typestr or data; a negative or non-integer dimension; more than 64 dimensions;
            strides not one integer per dimension; a mask) or DLPack tensor (ndim outside
            0..64, a NULL shape, a negative dimension, a byte_offset that carries the address
            past 2**64); an address outside [0, 2**64) or elements that run past the end of the
            64-bit address space.
    """
    if _is_torch_tensor(x):
        return _describe_torch(x, name)
    cai = getattr(x, "__cuda_array_interface__", None)
    if cai is not None:
        return _describe_cai(x, name, cai)
    if hasattr(x, "__dlpack__") and hasattr(x, "__dlpack_device__"):
        return _describe_dlpack(x, name)
    if hasattr(x, "__array_interface__") or hasattr(x, "__array__"):
        raise TypeError(f"{name}: a {type(x).__name__} in CPU memory; MACO needs {_SUPPORTED}")
    raise TypeError(f"{name}: expected {_SUPPORTED}; got {type(x).__name__}")


def _is_complex(buf: Buf) -> bool:
    if buf.kind == "torch":
        return buf.obj.is_complex()
    kind = getattr(buf.fdtype, "kind", None)
    if isinstance(buf.fdtype, str):  # a typestr ("<c8") or "complexNN"
        return buf.fdtype[1:2] == "c" or buf.fdtype.startswith("complex")
    return kind == "c"


def reduce_type(buf: Buf, name: str, op) -> tuple[DataType, int]:
    """(MACO type, element count) to reduce ``buf`` with ``op``. Complex tensors reduce as
    pairs of reals under SUM and AVG.

    Raises:
        TypeError: MACO cannot reduce this type.
    """
    if buf.dtype is not None:
        return buf.dtype, buf.numel
    if _is_complex(buf) and buf.itemsize in (8, 16):
        if op not in (ReduceOp.SUM, ReduceOp.AVG):
            raise TypeError(f"{name}: complex tensors reduce with sum or avg only, not "
                            f"{ReduceOp(op).name.lower()}")
        return (DataType.FLOAT32 if buf.itemsize == 8 else DataType.FLOAT64), buf.numel * 2
    raise TypeError(f"{name}: MACO cannot reduce {buf.fdtype}; it reduces int8, uint8, int32, "
                    "uint32, int64, uint64, float16, bfloat16, float32, float64, fp8 e4m3 and "
                    "e5m2 (and complex under sum/avg)")


def move_type(buf: Buf) -> tuple[DataType, int]:
    """(MACO type, element count) to move ``buf`` without reducing: its own type when MACO
    has it, else its bytes (bool, int16, complex, ...)."""
    if buf.dtype is not None:
        return buf.dtype, buf.numel
    return DataType.UINT8, buf.nbytes


def same_type(a: Buf, b: Buf) -> bool:
    if a.kind == b.kind == "torch":
        return a.obj.dtype == b.obj.dtype
    if a.dtype is not None or b.dtype is not None:
        return a.dtype == b.dtype
    return a.itemsize == b.itemsize and str(a.fdtype) == str(b.fdtype)


def empty_like(ref: Buf, shape: Sequence[int], name: str = "out"):
    """A new tensor of ``ref``'s framework, type and device with ``shape``."""
    shape = tuple(int(s) for s in shape)
    if ref.kind == "torch":
        torch = sys.modules["torch"]
        return torch.empty(shape, dtype=ref.obj.dtype, device=ref.obj.device)
    if ref.kind == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(ref.device):
            return cupy.empty(shape, dtype=ref.obj.dtype)
    raise TypeError(f"{name}: required for {type(ref.obj).__name__} inputs (MACO allocates "
                    "outputs only for torch tensors and CuPy arrays)")


def new_tensor(shape: Sequence[int], dtype: Any, device: int):
    """A new tensor of ``dtype``'s framework (torch dtype -> torch, else CuPy when imported,
    else torch) on CUDA device ``device``."""
    torch = sys.modules.get("torch")
    shape = tuple(int(s) for s in shape)
    if torch is not None and isinstance(dtype, torch.dtype):
        return torch.empty(shape, dtype=dtype, device=f"cuda:{device}")
    cupy = sys.modules.get("cupy")
    if cupy is not None:
        try:
            np_dtype = to_numpy_dtype(dtype)
        except TypeError:
            np_dtype = None
        if np_dtype is not None:
            with cupy.cuda.Device(device):
                return cupy.empty(shape, dtype=np_dtype)
    try:
        import torch as torch_mod
    except ImportError:
        raise TypeError("dtype: cannot allocate the output: neither PyTorch nor CuPy is "
                        "installed; pass out=") from None
    return torch_mod.empty(shape, dtype=to_torch_dtype(to_maco_dtype(dtype)),
                           device=f"cuda:{device}")


def stream_handle(stream: Any, buf: Optional[Buf]) -> int:
    """The cudaStream_t value to use: ``stream`` when given (an int, a torch.cuda.Stream,
    a CuPy stream, or an object with ``__cuda_stream__``), else the current stream of the
    tensor's framework (0, the legacy default stream, for other objects)."""
    if stream is None:
        if buf is not None and buf.kind == "torch":
            torch = sys.modules["torch"]
            raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
            if raw is not None:  # the handle without Stream's Python layer (3 us -> 0.2 us)
                return int(raw(buf.obj.device.index))
            return torch.cuda.current_stream(buf.obj.device).cuda_stream
        if buf is not None and buf.kind == "cupy":
            cupy = sys.modules["cupy"]
            with cupy.cuda.Device(buf.device):
                return int(cupy.cuda.get_current_stream().ptr)
        return 0
    if isinstance(stream, int) and not isinstance(stream, bool):
        handle = stream
    elif hasattr(stream, "cuda_stream"):
        handle = int(stream.cuda_stream)
    elif hasattr(stream, "__cuda_stream__"):
        handle = int(stream.__cuda_stream__()[1])
    elif hasattr(stream, "ptr"):
        handle = int(stream.ptr)
    else:
        handle = None
    if handle is not None:
        if not 0 <= handle <= SIZE_MAX:
            raise ValueError(f"stream: {handle} is not a cudaStream_t value (0 to 2**64 - 1)")
        return handle
    raise TypeError(f"stream: expected an int (cudaStream_t), a torch.cuda.Stream, a CuPy "
                    f"stream or an object with __cuda_stream__; got {type(stream).__name__}")


class DLPackExport:
    """A one-shot DLPack producer around a capsule made by the extension (maco.empty)."""

    def __init__(self, capsule, device: int):
        self._capsule = capsule
        self._device = device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self._capsule is None:
            raise BufferError("the MACO buffer was already exported")
        capsule, self._capsule = self._capsule, None
        return capsule

    def __dlpack_device__(self):
        return (KDL_CUDA, self._device)
