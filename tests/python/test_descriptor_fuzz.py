"""Randomised hostile tensor descriptors (issue 37): __cuda_array_interface__ dicts and DLPack
capsules with random keys, shapes, strides, types, devices and addresses, read by
maco._tensor.describe (the DLPack half through the extension's C++ dlpack_describe) and, on a
machine without a GPU, passed to a collective. Every descriptor must give a Buf whose sizes
agree with its shape or one of the documented errors (TypeError, ValueError, maco.MacoError),
never another exception and never a crash (a crash takes pytest down: the test fails).

Each run draws fresh cases; the seed is in the failure message (FUZZ_SEED=... reruns it)."""

import ctypes
import math
import os
import random

import pytest

import maco
from maco import _tensor

has_gpu = maco.cuda_device_count()[0] > 0
CASES = int(os.environ.get("FUZZ_CASES", "3000"))
ALLOWED = (TypeError, ValueError, maco.MacoError)


def _seed():
    return int(os.environ.get("FUZZ_SEED") or int.from_bytes(os.urandom(4), "little"))


def _any_int(rng):
    return rng.choice([0, 1, 2, 3, 4, 7, 8, 16, 64, 65, 1000, -1, -4, -(1 << 31), (1 << 31) - 1,
                       (1 << 32), (1 << 62), (1 << 63) - 1, -(1 << 63), 1 << 64,
                       rng.randint(-100, 100), rng.randint(0, 1 << 40)])


def _any_value(rng):
    return rng.choice([None, True, "4", 4.0, [], (), {}, b"x", _any_int(rng),
                       [_any_int(rng)], (_any_int(rng), False), object()])


def _shape(rng):
    r = rng.random()
    if r < 0.6:
        return tuple(rng.choice([0, 1, 2, 3, 5, 8]) for _ in range(rng.randint(0, 4)))
    if r < 0.85:
        return tuple(_any_int(rng) for _ in range(rng.choice([0, 1, 2, 3, 64, 65, 200])))
    return _any_value(rng)


def _cai(rng):
    d = {}
    if rng.random() < 0.9:
        d["shape"] = _shape(rng)
    if rng.random() < 0.9:
        d["typestr"] = rng.choice(["<f4", "<f2", "<V2", "<i8", "|u1", ">f4", "<c8", "<f",
                                   "f", "", "<f0", "<f99999999999999999999", "<x4", "<f-4",
                                   "<b1", "|b1", 4, None])
    if rng.random() < 0.9:
        d["data"] = rng.choice([(0x7F0000000000, False), (0, True), (None, False), (-1, False),
                                (1 << 64, False), (0x7F0000000000,), "here", None,
                                (0x7F0000000000, False, 3), [0x10, 0]])
    if rng.random() < 0.4:
        s = d.get("shape")
        n = len(s) if isinstance(s, tuple) and len(s) < 70 else rng.randint(0, 3)
        d["strides"] = rng.choice([None, tuple(_any_int(rng) for _ in range(n)),
                                   tuple(rng.choice([2, 4, 8]) for _ in range(n)),
                                   _any_value(rng)])
    if rng.random() < 0.5:
        d["version"] = rng.choice([0, 1, 2, 3, 4, "3", None])
    if rng.random() < 0.1:
        d["stream"] = _any_value(rng)
    if rng.random() < 0.05:
        d["mask"] = rng.choice([None, _any_value(rng)])
    return d


class _Cai:
    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


class _DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class _DLManaged(ctypes.Structure):
    _fields_ = [("dl_tensor", _DLTensor), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p)]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class _DLProducer:
    """A DLPack producer whose DLTensor says what the fuzzer drew. The arrays it points into
    hold as many dimensions as it claims (up to 256), so a reader that trusts ndim in 0..256
    reads only memory that exists; beyond that the reader must refuse before reading."""

    def __init__(self, rng):
        ndim = rng.choice([0, 1, 2, 3, 4, 64, 65, 256, -1, -5, 1000000, (1 << 31) - 1,
                           rng.randint(-3, 8)])
        n = max(1, min(ndim, 256)) if ndim > 0 else 1
        dims = [rng.choice([0, 1, 2, 3, 8]) if rng.random() < 0.7 else _any_int(rng)
                for _ in range(n)]
        self.shape_arr = (ctypes.c_int64 * n)(*[max(min(v, (1 << 63) - 1), -(1 << 63))
                                                for v in dims])
        self.stride_arr = (ctypes.c_int64 * n)(*[rng.choice([1, 2, 0, -1, 1 << 40])
                                                 for _ in range(n)])
        m = _DLManaged()
        m.dl_tensor.data = rng.choice([0x7F0000000000, 0, 1, (1 << 64) - 16])
        m.dl_tensor.device_type = rng.choice([2, 2, 2, 1, 3, 13, 99])
        m.dl_tensor.device_id = rng.choice([0, 1, -1, 1 << 30])
        m.dl_tensor.ndim = ndim
        m.dl_tensor.code = rng.choice([0, 1, 2, 4, 5, 255])
        m.dl_tensor.bits = rng.choice([8, 16, 32, 64, 0, 7, 255])
        m.dl_tensor.lanes = rng.choice([1, 1, 1, 0, 2, 65535])
        m.dl_tensor.shape = (ctypes.cast(self.shape_arr, ctypes.POINTER(ctypes.c_int64))
                             if rng.random() < 0.9 else None)
        m.dl_tensor.strides = (ctypes.cast(self.stride_arr, ctypes.POINTER(ctypes.c_int64))
                               if rng.random() < 0.4 else None)
        m.dl_tensor.byte_offset = rng.choice([0, 0, 16, 1 << 63, (1 << 64) - 8])
        self.m = m
        self.name = rng.choice([b"dltensor", b"dltensor", b"used_dltensor", b"other"])
        self.device = (m.dl_tensor.device_type, m.dl_tensor.device_id) \
            if rng.random() < 0.9 else _any_value(rng)

    def __dlpack__(self, stream=None, **kw):
        return _capsule_new(ctypes.addressof(self.m), self.name, None)

    def __dlpack_device__(self):
        return self.device


def _text(obj):
    if isinstance(obj, _Cai):
        return repr(obj.__cuda_array_interface__)
    t = obj.m.dl_tensor
    fields = {f: getattr(t, f) for f, _ in _DLTensor._fields_ if f not in ("shape", "strides")}
    return f"DLPack {fields} shape {'NULL' if not t.shape else list(obj.shape_arr)[:8]} " \
        f"strides {'NULL' if not t.strides else list(obj.stride_arr)[:8]} capsule {obj.name}"


def _check_buf(buf, what):
    assert all(isinstance(d, int) and d >= 0 for d in buf.shape), (what, buf.shape)
    assert len(buf.shape) <= 64, (what, len(buf.shape))
    assert buf.numel == math.prod(buf.shape), (what, buf.numel, buf.shape)
    assert buf.itemsize >= 0 and buf.nbytes >= 0, (what, buf.itemsize)
    assert 0 <= buf.address and buf.address + buf.nbytes <= 1 << 64, (what, buf.address)


def _run(make, seed, comm):
    rng = random.Random(seed)
    outcomes = {}
    for i in range(CASES):
        obj = make(rng)
        what = f"seed {seed} case {i}: {_text(obj)}"
        try:
            buf = _tensor.describe(obj, "x")
        except ALLOWED as e:
            outcomes[type(e).__name__] = outcomes.get(type(e).__name__, 0) + 1
            assert str(e).startswith("x:") or isinstance(e, maco.MacoError), (what, str(e))
            continue
        except Exception as e:  # noqa: BLE001 - the finding
            pytest.fail(f"{what}: describe raised {type(e).__name__}: {e}")
        _check_buf(buf, what)
        outcomes["accepted"] = outcomes.get("accepted", 0) + 1
        if comm is not None:  # no GPU: the collective must refuse it, never crash
            try:
                comm.allreduce(obj)
            except ALLOWED as e:  # an error naming what is wrong, not the extension's signatures
                assert "incompatible function arguments" not in str(e), (what, str(e))
            except Exception as e:  # noqa: BLE001 - the finding
                pytest.fail(f"{what}: allreduce raised {type(e).__name__}: {e}")
            else:
                pytest.fail(f"{what}: allreduce of a fake address succeeded without a GPU")
    return outcomes


@pytest.fixture
def cpu_comm(clean_env):
    if has_gpu:  # the descriptors' fake addresses must never reach a GPU
        yield None
        return
    c = maco.Communicator(maco.unique_id(), 0, 1)
    yield c
    c.close()


def test_random_cuda_array_interfaces(cpu_comm):
    outcomes = _run(lambda rng: _Cai(_cai(rng)), _seed(), cpu_comm)
    assert outcomes.get("accepted", 0) > 0 and outcomes.get("ValueError", 0) > 0, outcomes


def test_random_dlpack_tensors(cpu_comm):
    outcomes = _run(_DLProducer, _seed(), cpu_comm)
    assert outcomes.get("accepted", 0) > 0 and outcomes.get("ValueError", 0) > 0, outcomes
