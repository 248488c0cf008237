"""Hostile integers and tensor descriptors at the public Python API (issue 58): every size,
count, rank, device, timeout, stream and address that cannot reach the C library's type
(negative where it is unsigned, 2**31 and up where it is an int, 2**64 and up anywhere) is a
ValueError or TypeError naming the argument and its range, raised before the extension is
called, never the extension's list of signatures. A DLPack byte_offset that carries the
address past 2**64, a tensor whose bytes run past the end of the address space and a
``__cuda_array_interface__`` with a mask are refused, naming the tensor. Runs without a GPU."""

import ctypes

import pytest

import maco
from maco import _tensor
from test_descriptor_fuzz import _DLManaged, _capsule_new

has_gpu = maco.cuda_device_count()[0] > 0
DUMP = "incompatible function arguments"
ADDR = 0x7F0000000000
ID = bytes(128)  # never reaches the C library: every case below fails before it

# Values that no argument of that C type can hold.
NOT_INT = [2**31, 2**63, 2**64 - 1, 2**64]
NOT_SIZE = [-1, 2**64, 2**65]


class _Cai:
    def __init__(self, shape=(4,), typestr="<f4", data=(ADDR, False), **extra):
        self.__cuda_array_interface__ = dict(shape=shape, typestr=typestr, data=data,
                                             version=3, **extra)


class _DLPack:
    """A DLPack producer of a float32 vector of ``n`` elements at ``data`` + ``byte_offset``."""

    def __init__(self, data, byte_offset, n=4, bits=32):
        self.shape = (ctypes.c_int64 * 1)(n)
        m = _DLManaged()
        m.dl_tensor.data = data
        m.dl_tensor.device_type = 2
        m.dl_tensor.ndim = 1
        m.dl_tensor.code = 2
        m.dl_tensor.bits = bits
        m.dl_tensor.lanes = 1
        m.dl_tensor.shape = ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64))
        m.dl_tensor.byte_offset = byte_offset
        self.m = m

    def __dlpack__(self, stream=None, **kw):
        return _capsule_new(ctypes.addressof(self.m), b"dltensor", None)

    def __dlpack_device__(self):
        return (2, 0)


@pytest.fixture
def comm(clean_env):
    c = maco.Communicator(maco.unique_id(), 0, 1)
    yield c
    c.close()


def _pk(c, **kw):
    maco.PersistentKernel(c, **kw).compile()


# (argument name, values, call); every call must raise naming the argument.
CASES = [
    ("size", NOT_INT, lambda c, v: maco.Communicator(ID, 0, v)),
    ("device", NOT_INT, lambda c, v: maco.Communicator(ID, 0, 1, device=v)),
    ("device", NOT_INT, lambda c, v: maco.Communicator(ID, 0, 1, device=f"cuda:{v}")),
    ("timeout", [2**31, 2**64, float("inf"), float("nan")],
     lambda c, v: maco.Communicator(ID, 0, 1, timeout=v)),
    ("count", NOT_SIZE, lambda c, v: c.algorithm("allreduce", v, "float32")),
    ("max_ctas", NOT_INT, lambda c, v: c.set_max_ctas(v)),
    ("color", NOT_INT, lambda c, v: c.split(v)),
    ("key", NOT_INT + [-2**31 - 1], lambda c, v: c.split(0, v)),
    ("size", NOT_INT, lambda c, v: c.grow(v)),
    ("rank", NOT_INT, lambda c, v: maco.Communicator.join(ID, v, 2)),
    ("size", NOT_INT, lambda c, v: maco.Communicator.join(ID, 1, v)),
    ("shape", [2**63, 2**64], lambda c, v: c.empty((v,), "float32", framework="cupy")),
    ("shape", [2**62, 2**63 - 1], lambda c, v: c.empty((v, 4), "float32", framework="cupy")),
    ("num_workers", NOT_INT, lambda c, v: _pk(c, num_workers=v)),
    ("num_schedulers", NOT_INT, lambda c, v: _pk(c, num_schedulers=v)),
    ("num_comm_workers", NOT_INT, lambda c, v: _pk(c, num_comm_workers=v)),
    ("threads", NOT_INT, lambda c, v: _pk(c, threads=v)),
    ("comm_sms", NOT_INT, lambda c, v: maco.set_config(comm_sms=v)),
    ("total_sms", NOT_INT, lambda c, v: maco.SMConfig(v)),
]


@pytest.mark.parametrize("name,values,call", CASES,
                         ids=[f"{i}-{case[0]}" for i, case in enumerate(CASES)])
def test_out_of_range_integers_are_named(comm, name, values, call):
    for v in values:
        with pytest.raises((ValueError, TypeError)) as e:
            call(comm, v)
        msg = str(e.value)
        assert DUMP not in msg, (name, v, msg)
        assert msg.startswith(f"{name}:"), (name, v, msg)


# Tensors: a stream or an address outside [0, 2**64), elements past the end of the address space.
TENSOR_CASES = [
    ("stream", NOT_SIZE, lambda c, v: c.allreduce(_Cai(), stream=v)),
    ("x", NOT_SIZE, lambda c, v: c.allreduce(_Cai(data=(v, False)))),
    ("x", [2**64 - 1, 2**64 - 8], lambda c, v: c.allreduce(_Cai(data=(v, False)))),
    ("x", [2**62, 2**63, 2**64 - 1, 2**64], lambda c, v: c.allreduce(_Cai(shape=(v,)))),
    ("x", [2**32, 2**63], lambda c, v: c.allreduce(_Cai(shape=(v, 2**32)))),
    ("x", [2**62, 2**64], lambda c, v: c.allgather(_Cai(shape=(v,)), _Cai(shape=(v,)))),
    ("x", [2**62, 2**64], lambda c, v: c.send(_Cai(shape=(v,)), 0)),
]


@pytest.mark.skipif(has_gpu, reason="the fake addresses must never reach a GPU")
@pytest.mark.parametrize("name,values,call", TENSOR_CASES,
                         ids=[f"{i}-{case[0]}" for i, case in enumerate(TENSOR_CASES)])
def test_out_of_range_tensors_are_named(comm, name, values, call):
    test_out_of_range_integers_are_named(comm, name, values, call)


def test_range_errors_state_the_limit(comm):
    with pytest.raises(ValueError, match=r"count: 18446744073709551616 is outside "
                                         r"\[0, 2\*\*64 - 1, a C size_t\]"):
        comm.algorithm("allreduce", 2**64, "float32")
    with pytest.raises(ValueError, match=r"max_ctas: 2147483648 is outside \[0, 2\*\*31 - 1"):
        comm.set_max_ctas(2**31)
    with pytest.raises(ValueError, match=r"timeout: inf s is not in \[0, 2147483\] s"):
        maco.Communicator(ID, 0, 1, timeout=float("inf"))
    with pytest.raises(TypeError, match="count: expected an integer, got float"):
        comm.algorithm("allreduce", 4.5, "float32")
    # The largest values the C types hold still reach the library.
    assert comm.algorithm("allreduce", 2**64 - 1, "float32")


@pytest.mark.parametrize("name", ["num_experts", "hidden", "num_max_dispatch_tokens_per_rank",
                                  "num_topk", "num_max_recv_tokens", "num_sms"])
def test_ep_buffer_sizes_out_of_range_are_named(comm, name):
    pytest.importorskip("torch", reason="maco.ep needs PyTorch")
    import maco.ep

    sizes = dict(num_experts=8, hidden=8, num_max_dispatch_tokens_per_rank=1, num_topk=1)
    for v in (2**63, 2**64):
        with pytest.raises(ValueError, match=f"^{name}: {v} is outside"):
            maco.ep.Buffer(comm, **{**sizes, name: v})


def test_dlpack_byte_offset_that_wraps_is_refused():
    # data + byte_offset = 2**64 + 16: wrapped, it was read as address 16.
    x = _DLPack(ADDR, 2**64 - ADDR + 16)
    with pytest.raises(ValueError, match=r"^x: the DLPack tensor's byte_offset \d+ from its "
                                         r"data address \d+ passes the end"):
        _tensor.describe(x, "x")
    with pytest.raises(ValueError, match="byte_offset"):
        _tensor.describe(_DLPack(2**64 - 16, 16), "x")


def test_dlpack_tensor_that_runs_past_the_address_space_is_refused():
    # The start fits; its 4 float32 (16 bytes) end 8 bytes past 2**64.
    x = _DLPack(2**64 - 64, 56)
    with pytest.raises(ValueError, match=r"^x: DLPack tensor of 4 elements of 4 bytes from "
                                         r"address 0xfffffffffffffff8 runs past the end"):
        _tensor.describe(x, "x")
    # Ending exactly at 2**64 is a valid range.
    buf = _tensor.describe(_DLPack(2**64 - 64, 48), "x")
    assert (buf.address, buf.nbytes) == (2**64 - 16, 16)
    buf = _tensor.describe(_DLPack(ADDR, 32), "x")
    assert (buf.address, buf.numel, buf.itemsize) == (ADDR + 32, 4, 4)


def test_dlpack_sub_byte_elements_are_refused():
    # 4-bit elements have no whole-byte size: they were moved as 0 bytes.
    with pytest.raises(TypeError, match="^x: elements of 4 bits; MACO moves whole bytes"):
        _tensor.describe(_DLPack(ADDR, 0, bits=4), "x")


def test_cuda_array_interface_mask_is_refused():
    with pytest.raises(ValueError, match=r"^x: __cuda_array_interface__ has a mask; MACO does "
                                         r"not read masked arrays"):
        _tensor.describe(_Cai(mask=_Cai(typestr="|b1")), "x")
    buf = _tensor.describe(_Cai(mask=None), "x")  # None: every element valid
    assert (buf.address, buf.numel) == (ADDR, 4)


def test_cuda_array_interface_range_is_checked():
    with pytest.raises(ValueError, match=r"^x: __cuda_array_interface__ address -1 is outside"):
        _tensor.describe(_Cai(data=(-1, False)), "x")
    with pytest.raises(ValueError, match="runs past the end of the 64-bit address space"):
        _tensor.describe(_Cai(data=(2**64 - 8, False)), "x")
    buf = _tensor.describe(_Cai(data=(2**64 - 16, False)), "x")
    assert buf.address + buf.nbytes == 2**64
