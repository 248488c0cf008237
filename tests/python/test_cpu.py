"""CPU tests of the maco package: import, version, types, errors, argument checks, and a
communicator without a GPU. They run in CI (no GPU) and on GPU machines alike."""

import ast
import os
import re

import numpy as np
import pytest

import maco
from maco import _maco
from conftest import NO_TORCH, REPO
from fakes import FakeCudaArray, FakeCudaTensor

try:
    import torch
except ImportError:  # pragma: no cover - CI installs torch
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)
has_gpu = maco.cuda_device_count()[0] > 0


@pytest.fixture
def comm(clean_env):
    """A one-rank communicator from a unique id (no GPU here: bootstrap-only)."""
    c = maco.Communicator(maco.unique_id(), 0, 1)
    yield c
    c.close()


# ------------------------------------------------------------------ package


def test_version_is_the_c_librarys():
    with open(os.path.join(REPO, "CMakeLists.txt")) as f:
        declared = re.search(r"project\(maco VERSION ([0-9.]+)", f.read()).group(1)
    assert maco.__version__ == _maco.version() == declared
    try:
        from importlib.metadata import version
        assert version("maco") == declared
    except Exception as e:  # noqa: BLE001 - not installed as a distribution (PYTHONPATH)
        if type(e).__name__ != "PackageNotFoundError":
            raise


def test_stub_covers_the_extension():
    """maco/_maco.pyi names every public function, class and constant of the extension."""
    stub_path = os.path.join(os.path.dirname(maco.__file__), "_maco.pyi")
    with open(stub_path) as f:
        tree = ast.parse(f.read())
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.AnnAssign):
            names.add(node.target.id)
    public = {n for n in dir(_maco) if not n.startswith("_")}
    assert public <= names, f"missing from the stub: {sorted(public - names)}"
    comm_stub = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Comm")
    methods = {n.name for n in comm_stub.body if isinstance(n, ast.FunctionDef)}
    assert {m for m in dir(_maco.Comm) if not m.startswith("_")} <= methods


def test_public_functions_have_docstrings():
    for name in maco.__all__:
        obj = getattr(maco, name)
        if callable(obj) and not isinstance(obj, (int, maco.ReduceOp)):
            assert obj.__doc__ and obj.__doc__.strip(), name
    for name, fn in vars(maco.Communicator).items():
        if not name.startswith("_") and callable(fn):
            assert fn.__doc__ and fn.__doc__.strip(), f"Communicator.{name}"


def test_config_table_is_the_c_librarys():
    names = {row[0] for row in maco.config()}
    assert "MACO_BOOTSTRAP_TIMEOUT" in names and "MACO_LOG_LEVEL" in names


# ------------------------------------------------------------------ types


def test_datatype_values_sizes_and_names_match_c():
    assert len(maco.DataType) == _maco.DATATYPE_COUNT
    for dt in maco.DataType:
        assert _maco.datatype_size(int(dt)) == dt.itemsize
        assert _maco.datatype_name(int(dt)).replace("_", "") == dt.name.lower().replace("_", "")
    assert len(maco.ReduceOp) == _maco.REDOP_COUNT
    for op in maco.ReduceOp:
        assert _maco.redop_name(int(op)) == op.name.lower()


@needs_torch
def test_dtype_mapping_torch_both_ways():
    pairs = {
        torch.int8: maco.DataType.INT8, torch.uint8: maco.DataType.UINT8,
        torch.int32: maco.DataType.INT32, torch.uint32: maco.DataType.UINT32,
        torch.int64: maco.DataType.INT64, torch.uint64: maco.DataType.UINT64,
        torch.float16: maco.DataType.FLOAT16, torch.bfloat16: maco.DataType.BFLOAT16,
        torch.float32: maco.DataType.FLOAT32, torch.float64: maco.DataType.FLOAT64,
        torch.float8_e4m3fn: maco.DataType.FP8_E4M3, torch.float8_e5m2: maco.DataType.FP8_E5M2,
    }
    assert set(pairs.values()) == set(maco.DataType)
    for t, m in pairs.items():
        assert maco.to_maco_dtype(t) is m
        assert maco.to_torch_dtype(m) is t
        assert torch.empty(0, dtype=t).element_size() == m.itemsize
    for bad in (torch.bool, torch.int16, torch.complex64, torch.float8_e4m3fnuz):
        with pytest.raises(TypeError, match="no MACO equivalent"):
            maco.to_maco_dtype(bad)


def test_dtype_mapping_numpy_both_ways():
    for name in ("int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "float32",
                 "float64"):
        m = maco.to_maco_dtype(np.dtype(name))
        assert m.name.lower() == name
        assert maco.to_numpy_dtype(m) == np.dtype(name)
        assert maco.to_maco_dtype(getattr(np, name)) is m
    for bad in (np.int16, np.bool_, np.complex64):
        with pytest.raises(TypeError):
            maco.to_maco_dtype(bad)
    try:
        import ml_dtypes  # noqa: F401
    except ImportError:
        with pytest.raises(TypeError, match="ml_dtypes"):
            maco.to_numpy_dtype(maco.DataType.BFLOAT16)


def test_dtype_mapping_names_and_dlpack_codes():
    assert maco.to_maco_dtype("bf16") is maco.DataType.BFLOAT16
    assert maco.to_maco_dtype("torch.float8_e5m2") is maco.DataType.FP8_E5M2
    assert maco.to_maco_dtype(7) is maco.DataType.BFLOAT16
    # DLPack (code, bits): 2 float, 4 bfloat, 10 float8_e4m3fn, 12 float8_e5m2.
    assert maco.to_maco_dtype((2, 32)) is maco.DataType.FLOAT32
    assert maco.to_maco_dtype((4, 16)) is maco.DataType.BFLOAT16
    assert maco.to_maco_dtype((10, 8)) is maco.DataType.FP8_E4M3
    assert maco.to_maco_dtype((12, 8)) is maco.DataType.FP8_E5M2
    for bad in ("int16", 12, -1, True, (5, 64)):
        with pytest.raises(TypeError):
            maco.to_maco_dtype(bad)


def test_reduce_ops():
    from maco._types import to_maco_op

    assert maco.SUM is maco.ReduceOp.SUM and int(maco.AVG) == 4
    assert to_maco_op("max") is maco.MAX
    with pytest.raises(ValueError, match="op"):
        to_maco_op("band")
    if torch is not None:
        import torch.distributed as dist

        R = dist.ReduceOp
        assert [to_maco_op(o) for o in (R.SUM, R.PRODUCT, R.MIN, R.MAX, R.AVG)] == list(
            maco.ReduceOp)
        with pytest.raises(ValueError, match="no MACO equivalent"):
            to_maco_op(R.BAND)


# ------------------------------------------------------------------ errors


def test_exception_hierarchy():
    expected = {-1: maco.InvalidArgumentError, -2: maco.CudaError, -3: maco.SystemCallError,
                -4: maco.CommTimeoutError, -5: maco.RemoteError, -6: maco.UnsupportedError,
                -7: maco.InternalError, -8: maco.OutOfMemoryError, -9: maco.InvalidUsageError}
    for status, cls in expected.items():
        assert maco.error_class(status) is cls
        assert issubclass(cls, maco.MacoError) and cls.status == status
        assert _maco.status_string(status) != "unknown status"
    assert maco.error_class(-100) is maco.MacoError
    assert issubclass(maco.InvalidArgumentError, ValueError)
    assert issubclass(maco.CommTimeoutError, TimeoutError)


def test_c_error_carries_status_and_message(clean_env):
    bad_id = b"\0" * 128
    with pytest.raises(maco.InvalidArgumentError) as e:
        maco.Communicator(bad_id, 0, 1)
    assert e.value.status == -1
    assert "unique id" in str(e.value) or "magic" in str(e.value), str(e.value)


def test_c_error_appears_once(clean_env, capfd):
    """Issue 38: a failing call's message is in the exception only, not also in MACO's log
    line on standard error (the extension holds the line back: maco_log_set_error_capture)."""
    with pytest.raises(maco.InvalidArgumentError) as e:
        maco.Communicator(b"\0" * 128, 0, 1)
    _, err = capfd.readouterr()
    text = str(e.value)
    assert len(text) > 10, text
    assert (err + "\n" + text).count(text) == 1, f"stderr: {err!r}; exception: {text!r}"
    assert "ERROR" not in err, err


def test_env_error_names_the_variable(clean_env):
    clean_env.setenv("MACO_RANK", "0")
    with pytest.raises(maco.InvalidArgumentError) as e:
        maco.Communicator()
    assert "WORLD_SIZE" in str(e.value), str(e.value)


def test_timeout_is_a_timeout_error(clean_env):
    uid = maco.unique_id()  # the root listens in this process, but rank 0 never joins
    with pytest.raises(maco.CommTimeoutError) as e:
        maco.Communicator(uid, 1, 2, timeout=0.5)
    assert isinstance(e.value, TimeoutError) and e.value.status == -4
    assert str(e.value)


def test_python_side_argument_errors(clean_env):
    with pytest.raises(TypeError, match="unique_id"):
        maco.Communicator("x" * 128, 0, 1)
    with pytest.raises(ValueError, match="128 bytes"):
        maco.Communicator(b"x", 0, 1)
    with pytest.raises(ValueError, match="rank"):
        maco.Communicator(b"x" * 128, 3, 2)
    with pytest.raises(ValueError, match="device"):
        maco.Communicator(b"x" * 128, 0, 1, device="cpu")


# ------------------------------------------------------------------ one rank, no GPU


@pytest.mark.skipif(has_gpu, reason="checks the no-GPU answer; this machine has a GPU")
def test_communicator_without_gpu(comm):
    assert (comm.rank, comm.size, comm.local_rank, comm.local_size) == (0, 1, 0, 1)
    assert comm.device is None and comm.num_nodes == 1 and comm.node == 0
    assert "device none" in repr(comm)
    comm.barrier()
    assert comm.allgather_bytes(b"abc") == [b"abc"]
    assert comm.broadcast_bytes(b"xyz", 0) == b"xyz"
    comm.check_async_error()
    x = FakeCudaArray((4,))
    with pytest.raises(maco.UnsupportedError) as e:
        comm.allreduce(x)
    assert e.value.status == -6 and "maco_allreduce" in str(e.value)
    assert "GPU" in str(e.value) or "driver" in str(e.value) or "device" in str(e.value)
    with pytest.raises(maco.UnsupportedError):
        comm.empty((2, 2), "float32")
    with pytest.raises(maco.UnsupportedError):
        comm.recv(src=0, shape=(2,), dtype="float32")
    with pytest.raises(maco.UnsupportedError):
        comm.register(FakeCudaArray((8,)))


def test_context_and_cta_cap_without_gpu(comm):
    """Level 2 on a machine without a GPU: the CTA cap is refused by the C library with its
    reason, a negative cap before it; maco.Context says PyTorch sees no CUDA device."""
    with pytest.raises(ValueError, match="max_ctas"):
        comm.set_max_ctas(-1)
    with pytest.raises(maco.UnsupportedError) as e:
        comm.set_max_ctas(8)
    assert "maco_collective_set_max_ctas" in str(e.value)
    with pytest.raises(maco.UnsupportedError) as e:
        comm._c.last_ctas()  # what maco.profiler reads after each collective
    assert "maco_collective_get_last_ctas" in str(e.value)
    torch = pytest.importorskip("torch", reason=NO_TORCH)
    if torch.cuda.is_available():
        pytest.skip("this check is for machines where PyTorch sees no GPU")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        maco.Context(comm, comm_sms=8)


def test_cpu_tensors_are_refused(comm):
    with pytest.raises(TypeError, match=r"x: .*CPU"):
        comm.allreduce(np.ones(4, np.float32))
    with pytest.raises(TypeError, match="x: expected"):
        comm.allreduce([1.0, 2.0])
    if torch is not None:
        with pytest.raises(TypeError, match=r"x: a tensor on cpu"):
            comm.allgather(torch.ones(4))
        with pytest.raises(TypeError, match=r"tensor: a tensor on cpu"):
            comm.register(torch.ones(4))
        with pytest.raises(TypeError, match="sparse|strided"):
            comm.allreduce(torch.ones(2, 2).to_sparse())


def test_non_contiguous_is_refused(comm):
    x = FakeCudaArray((4, 4), strides=(4, 8))  # every other float of 8-wide rows
    with pytest.raises(ValueError, match="x: the array is not C-contiguous"):
        comm.allreduce(x)
    # Strides of size-1 dimensions do not matter.
    y = FakeCudaArray((4, 1), strides=(4, 1024))
    if not has_gpu:  # the fake address must not reach a GPU
        with pytest.raises(maco.MacoError):
            comm.allreduce(y)  # passes the checks, then MACO answers (no GPU)


def test_sizes_types_and_ranks_are_checked(comm):
    x = FakeCudaArray((4,))
    with pytest.raises(ValueError, match="out: has 3 elements; allreduce needs 4"):
        comm.allreduce(x, FakeCudaArray((3,), address=0x7F0000100000))
    with pytest.raises(TypeError, match="out: dtype"):
        comm.allreduce(x, FakeCudaArray((4,), "<i4", address=0x7F0000100000))
    with pytest.raises(ValueError, match="out: has 3 elements; allgather needs 2"):
        comm.allgather(FakeCudaArray((2,)), FakeCudaArray((3,)))
    with pytest.raises(ValueError, match="read-only"):
        comm.allreduce(x, FakeCudaArray((4,), address=0x7F0000100000, readonly=True))
    with pytest.raises(ValueError, match="root: 1 is not a rank"):
        comm.broadcast(x, root=1)
    with pytest.raises(ValueError, match="dst: 5 is not a rank"):
        comm.send(x, 5)
    with pytest.raises(ValueError, match="src"):
        comm.recv(x)
    with pytest.raises(TypeError, match="out: required"):
        comm.allgather(x)  # MACO allocates outputs only for torch and CuPy
    with pytest.raises(ValueError, match="op"):
        comm.allreduce(x, op="band")
    with pytest.raises(ValueError, match="in_splits: 2 entries"):
        comm.all_to_all(x, FakeCudaArray((4,)), in_splits=[2, 2], out_splits=[4])


def test_reduction_types(comm):
    with pytest.raises(TypeError, match="cannot reduce"):
        comm.allreduce(FakeCudaArray((4,), "<i2"))
    with pytest.raises(TypeError, match="complex tensors reduce with sum or avg"):
        comm.allreduce(FakeCudaArray((4,), "<c8"), op=maco.MAX)
    # Moving int16 (no MACO type) goes as bytes: past the checks to MACO's own answer.
    if not has_gpu:  # the fake address must not reach a GPU
        with pytest.raises(maco.MacoError):
            comm.broadcast(FakeCudaArray((4,), "<i2"))


def test_dlpack_describe_reads_shape_strides_and_type():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)[:, ::2]
    (address, shape, strides, code, bits, lanes, dev_type, dev_id,
     readonly) = _maco.dlpack_describe(a.__dlpack__())
    assert address == a.__array_interface__["data"][0]
    assert shape == (3, 2) and strides == (4, 2)
    assert (code, bits, lanes, dev_type) == (2, 32, 1, 1)
    with pytest.raises(TypeError):
        _maco.dlpack_describe(object())


class _RawCai:
    """An object whose __cuda_array_interface__ is whatever the test says."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def test_malformed_array_interfaces_are_clear_errors(comm):
    good = {"shape": (4,), "typestr": "<f4", "data": (0x7F0000000000, False), "version": 3}
    cases = [
        ({k: v for k, v in good.items() if k != "shape"}, ValueError, r"x: .*lacks 'shape'"),
        ({k: v for k, v in good.items() if k != "data"}, ValueError, r"x: .*lacks 'data'"),
        (dict(good, shape=(-4, -4)), ValueError, r"x: .*negative dimension"),
        (dict(good, shape=(-1,)), ValueError, r"x: .*negative dimension"),
        (dict(good, shape=5), ValueError, r"x: .*not a sequence"),
        (dict(good, shape=("4",)), ValueError, r"x: .*not an integer"),
        (dict(good, shape=(1,) * 65), ValueError, r"x: .*65 dimensions"),
        (dict(good, typestr="f"), ValueError, r"x: .*typestr"),
        (dict(good, data=(1,)), ValueError, r"x: .*data"),
        (dict(good, data="here"), ValueError, r"x: .*data"),
        (dict(good, strides=(4, 4)), ValueError, r"x: .*strides"),
        ([1, 2], TypeError, r"x: .*not a dict"),
    ]
    for cai, exc, regex in cases:
        with pytest.raises(exc, match=regex):
            comm.allreduce(_RawCai(cai))


def _hostile_dlpack(ndim, shape):
    """A DLPack producer (CUDA device 0) whose tensor claims `ndim` and `shape` (None: NULL)."""
    import ctypes

    class DLTensor(ctypes.Structure):
        _fields_ = [("data", ctypes.c_void_p), ("device_type", ctypes.c_int32),
                    ("device_id", ctypes.c_int32), ("ndim", ctypes.c_int32),
                    ("code", ctypes.c_uint8), ("bits", ctypes.c_uint8),
                    ("lanes", ctypes.c_uint16), ("shape", ctypes.POINTER(ctypes.c_int64)),
                    ("strides", ctypes.POINTER(ctypes.c_int64)),
                    ("byte_offset", ctypes.c_uint64)]

    class DLManaged(ctypes.Structure):
        _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p),
                    ("deleter", ctypes.c_void_p)]

    dims = (ctypes.c_int64 * max(1, len(shape or ())))(*(shape or ()))
    m = DLManaged()
    m.dl_tensor.data = 0x7F0000000000
    m.dl_tensor.device_type, m.dl_tensor.device_id = 2, 0
    m.dl_tensor.ndim = ndim
    m.dl_tensor.code, m.dl_tensor.bits, m.dl_tensor.lanes = 2, 32, 1
    m.dl_tensor.shape = ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)) if shape else None
    new = ctypes.pythonapi.PyCapsule_New
    new.restype = ctypes.py_object
    new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

    class Producer:
        def __dlpack__(self, stream=None, **kw):
            return new(ctypes.addressof(m), b"dltensor", None)

        def __dlpack_device__(self):
            return (2, 0)

    p = Producer()
    p.keep = (m, dims)  # the capsule points into these
    return p


def test_hostile_dlpack_tensors_are_clear_errors(comm):
    cases = [
        (_hostile_dlpack(-5, None), r"ndim -5"),
        (_hostile_dlpack(1000000, None), r"ndim 1000000"),
        (_hostile_dlpack(2, None), r"ndim 2 but a NULL shape"),
        (_hostile_dlpack(2, (-4, -4)), r"dimension 0 .* is -4"),
    ]
    for producer, regex in cases:
        with pytest.raises(ValueError, match=regex):
            comm.allreduce(producer)
    if not has_gpu:  # a sound one passes the checks; the fake address must not reach a GPU
        with pytest.raises(maco.MacoError):
            comm.allreduce(_hostile_dlpack(2, (2, 2)))


def test_streams_are_read_from_any_kind():
    from maco._tensor import stream_handle

    class TorchLike:
        cuda_stream = 0x1234

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0x5678)

    class CupyLike:
        ptr = 0x9ABC

    assert stream_handle(None, None) == 0
    assert stream_handle(7, None) == 7
    assert stream_handle(TorchLike(), None) == 0x1234
    assert stream_handle(Protocol(), None) == 0x5678
    assert stream_handle(CupyLike(), None) == 0x9ABC
    with pytest.raises(TypeError, match="stream"):
        stream_handle("default", None)
    with pytest.raises(ValueError, match="stream"):
        stream_handle(-1, None)


def test_closed_communicator(clean_env):
    c = maco.Communicator(maco.unique_id(), 0, 1)
    with c:
        pass
    assert c.closed and "closed" in repr(c)
    with pytest.raises(maco.InvalidUsageError, match="closed"):
        c.barrier()
    c.close()  # idempotent


def test_group_context_with_nothing_queued():
    with maco.group():
        pass
    with pytest.raises(maco.InvalidUsageError):
        _maco.group_end()  # no group open


# ------------------------------------------------------------------ Level 1


def test_level1_init_from_env(clean_env, port):
    with pytest.raises(maco.InvalidUsageError, match="maco.init"):
        maco.allreduce(FakeCudaArray((1,)))
    clean_env.setenv("MACO_RANK", "0")
    clean_env.setenv("MACO_WORLD_SIZE", "1")
    clean_env.setenv("MACO_BOOTSTRAP_ADDR", f"127.0.0.1:{port}")
    clean_env.setenv("MACO_BOOTSTRAP_NONCE", os.urandom(8).hex())
    with pytest.raises(ValueError, match="backend: 'gloo'; MACO has one backend"):
        maco.init(backend="gloo")
    comm = maco.init(backend="nvshmem")  # the design's name for MACO's one backend
    try:
        assert maco.is_initialized() and maco.get_default_communicator() is comm
        assert (maco.get_rank(), maco.get_world_size(), maco.get_local_rank()) == (0, 1, 0)
        with pytest.raises(maco.InvalidUsageError, match="already"):
            maco.init()
        maco.barrier()
        with pytest.raises(TypeError, match="x: .*CPU"):
            maco.allreduce(np.ones(2))
    finally:
        maco.finalize()
    assert not maco.is_initialized()
    maco.finalize()  # idempotent


@pytest.mark.skipif(has_gpu, reason="uses a fake device address; this machine has a GPU")
def test_group_keeps_tensors_until_issued(comm):
    from maco import _comm

    x = FakeCudaArray((4,))
    with pytest.raises(maco.MacoError):  # no GPU: the group fails, at the call or at its end
        with maco.group():
            with maco.group():  # nested: the outermost end issues
                try:
                    comm.send(x, 0)
                except maco.MacoError:
                    pass
            assert any(o is x for o in _comm._group_state.kept)
    assert _comm._group_state.kept is None and _comm._group_state.depth == 0


def test_persistent_kernel_arguments(comm):
    """maco.PersistentKernel's checks that need no GPU (the GPU suite runs graphs:
    gpu_persistent.py)."""
    with pytest.raises(ValueError, match="world_size: 3"):
        maco.PersistentKernel(comm, world_size=3)
    with pytest.raises(ValueError, match="rank: 1"):
        maco.PersistentKernel(comm, rank=1)
    with pytest.raises(ValueError, match="num_workers: -2 is negative"):
        maco.PersistentKernel(comm, num_workers=-2)
    with pytest.raises(ValueError, match="num_comm_workers: -3"):
        maco.PersistentKernel(comm, num_comm_workers=-3)
    k = maco.PersistentKernel(comm, world_size=1, rank=0)
    with pytest.raises(maco.InvalidArgumentError, match="build the graph first"):
        k.compile()
    with k.task_graph() as g:
        with pytest.raises(TypeError, match="a KernelTensor"):
            g.add(object(), object())
    with pytest.raises(maco.InvalidArgumentError, match="already has its graph"):
        with k.task_graph():
            pass
    with pytest.raises(maco.MacoError):  # an empty graph, and no GPU here
        k.compile()
    k.close()


def test_persistent_kernel_fused_comm(comm):
    """fused_comm is checked when the kernel is made; nothing is fused before a graph."""
    with pytest.raises(ValueError, match="fused_comm: 'nvlink'; accepts auto, sm, copy_engine"):
        maco.PersistentKernel(comm, fused_comm="nvlink")
    for mode in ("auto", "sm", "copy_engine"):
        k = maco.PersistentKernel(comm, fused_comm=mode)
        assert k.fused_comm_modes == []
        k.close()
    # The SM mode is the default until the copy-engine mode works on a GPU (docs/persistent.md).
    k = maco.PersistentKernel(comm)
    assert k._fused_comm == "sm"
    k.close()
    assert maco.config.get("fused_comm") == "sm"


@pytest.mark.parametrize("op, ws, m, n, k, dt, want", [
    ("allgather_gemm", 1, 8192, 8192, 8192, "bf16", "sm"),            # no peer
    ("allgather_gemm", 2, 256, 1024, 4096, "bf16", "copy_engine"),    # 1 MiB puts, 2 per peer
    ("allgather_gemm", 2, 256, 1024, 2048, "bf16", "sm"),             # 512 KiB puts
    ("allgather_gemm", 2, 128, 1024, 4096, "bf16", "sm"),             # one put per peer
    ("gemm_allreduce", 4, 1024, 4096, 1024, "float32", "copy_engine"),  # 2 MiB, 2 per owner
    ("gemm_allreduce", 4, 512, 4096, 1024, "float32", "sm"),          # one row per owner
    ("gemm_allreduce", 4, 1024, 2048, 1024, "bf16", "sm"),            # 512 KiB rows
    ("gemm_reduce_scatter", 2, 512, 4096, 1024, "bf16", "copy_engine"),
    ("gemm_reduce_scatter", 2, 16384, 8192, 1024, "float32", "sm"),   # too many tasks
])
def test_choose_fused_comm_follows_the_rule(op, ws, m, n, k, dt, want):
    """maco.persistent.choose_fused_comm: maco_fused_gemm_choose_comm's rule
    (docs/persistent.md, "Copy-engine mode"), pure, no GPU."""
    assert maco.persistent.choose_fused_comm(op, ws, m, n, k, dt) == want


def test_choose_fused_comm_refuses_bad_input():
    with pytest.raises(ValueError, match="op: 'allreduce'; accepts gemm_allreduce"):
        maco.persistent.choose_fused_comm("allreduce", 2, 128, 128, 64)
    with pytest.raises(maco.InvalidArgumentError, match="n 100"):
        maco.persistent.choose_fused_comm("gemm_allreduce", 2, 128, 100, 64)
    with pytest.raises(maco.InvalidArgumentError, match="m a multiple of nranks"):
        maco.persistent.choose_fused_comm("gemm_reduce_scatter", 3, 128, 128, 64)


def test_fused_scratch_bytes_per_mode():
    """The copy-engine reduce-scatter keeps send slots: nranks x pad(m / nranks) x n more
    elements; the other operators need what the SM mode needs; AUTO what it chooses."""
    f32 = int(maco.DataType.FLOAT32)
    for kind in (0, 1, 2):
        for ws in (1, 2, 4):
            m, n, k = 300 * ws, 4096, 4096
            sm = _maco.fused_scratch_bytes(kind, ws, m, n, k, f32)
            assert _maco.fused_scratch_bytes_mode(kind, 0, ws, m, n, k, f32) == sm
            ce = _maco.fused_scratch_bytes_mode(kind, 1, ws, m, n, k, f32)
            pad = (m // ws + 127) // 128 * 128
            assert ce == (sm + ws * pad * n * 4 if kind == 1 else sm)
            chosen = _maco.fused_choose_comm(kind, ws, m, n, k, f32)
            assert _maco.fused_scratch_bytes_mode(kind, 2, ws, m, n, k, f32) == (ce if chosen
                                                                                 else sm)
    with pytest.raises(maco.InvalidArgumentError, match="mode 7"):
        _maco.fused_scratch_bytes_mode(0, 7, 2, 128, 128, 64, f32)


# ------------------------------------------------------------------ torch backend: device binding
# The rules of maco/torch.py's docstring (ProcessGroupMaco is in maco/_process_group.py), with a
# fake Communicator that records the device it was made on (the real one needs a GPU for a
# device) and fake CUDA tensors.


class _FakeComm:
    made: list = []

    def __init__(self, uid, rank, size, *, device=None, timeout=None):
        self.uid, self.rank, self.size, self.device, self.timeout = uid, rank, size, device, timeout
        self.barriers = 0
        _FakeComm.made.append(self)

    def barrier(self):
        self.barriers += 1

    def close(self):
        pass


class _FakeGloo:
    def __init__(self):
        self.barriers = 0

    def barrier(self, opts=None):
        self.barriers += 1
        return "gloo-work"


@pytest.fixture
def fake_comms(monkeypatch):
    import contextlib

    import maco.torch as mt
    from maco import _process_group  # ProcessGroupMaco's module

    _FakeComm.made = []
    monkeypatch.setattr(_process_group, "Communicator", _FakeComm)
    monkeypatch.setattr(_process_group, "unique_id", lambda: b"u" * 128)
    monkeypatch.setattr(torch.cuda, "device", lambda index: contextlib.nullcontext())
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    return mt


def _maco_pg(mt, rank=1, size=2, fallback=None, **kw):
    import datetime

    import torch.distributed as dist

    store = dist.HashStore()
    store.set("maco/unique_id", b"r" * 128)  # as rank 0 would
    return mt.ProcessGroupMaco(rank, size, None, fallback, store=store,
                               timeout=datetime.timedelta(seconds=7), **kw)


@needs_torch
def test_torch_backend_binds_to_the_first_tensors_device(fake_comms):
    """Nothing is made at init; the first CUDA call makes the communicator on its tensor's
    device (init_process_group then torch.cuda.set_device works); a later tensor on another
    device is an error naming both devices, the rank and the remedies, raised before
    anything is enqueued."""
    mt = fake_comms
    pg = _maco_pg(mt)
    assert _FakeComm.made == [] and pg.device is None
    c = pg._comm_for([FakeCudaTensor(2), FakeCudaTensor(2)])
    assert [(x.device, x.rank, x.size, x.uid, x.timeout) for x in _FakeComm.made] == [
        (2, 1, 2, b"r" * 128, 7.0)]
    assert pg.device == torch.device("cuda", 2) and pg.comm is c
    assert pg._comm_for([FakeCudaTensor(2)]) is c and len(_FakeComm.made) == 1
    with pytest.raises(ValueError) as e:
        pg.allreduce([FakeCudaTensor(0)])
    msg = str(e.value)
    for part in ("rank 1", "a tensor is on cuda:0", "bound to cuda:2",
                 "first tensor of the group's first CUDA call, on cuda:2",
                 "torch.cuda.set_device(0)", "device_id=torch.device('cuda', 0)"):
        assert part in msg, msg
    with pytest.raises(ValueError, match="bound to cuda:2"):
        pg.send([FakeCudaTensor(3)], 0)
    with pytest.raises(ValueError, match="a tensor is on cuda:1"):
        pg._comm_for([FakeCudaTensor(2), FakeCudaTensor(1)])
    assert len(_FakeComm.made) == 1


@needs_torch
def test_torch_backend_device_id_binds_at_init(fake_comms, monkeypatch):
    """init_process_group("maco", device_id=cuda:3): the communicator is made during init on
    cuda:3 (read from torch's helper frame, which is all torch gives a Python backend), the
    group reports it as bound_device_id, and torch's question for its backend on that device
    gets an answer (torch fails on a Python group otherwise)."""
    import datetime

    import torch.distributed as dist

    mt = fake_comms
    monkeypatch.setattr(mt.dist, "is_gloo_available", lambda: False)
    store = dist.HashStore()

    def _new_process_group_helper(device_id):  # noqa: ARG001 - read from this frame
        return mt._create(store, 0, 2, datetime.timedelta(seconds=3))

    pg = _new_process_group_helper(torch.device("cuda", 3))
    assert [(x.device, x.rank, x.uid) for x in _FakeComm.made] == [(3, 0, b"u" * 128)]
    assert bytes(store.get("maco/unique_id")) == b"u" * 128
    assert pg.bound_device_id == torch.device("cuda", 3) and pg.device == torch.device("cuda", 3)
    assert pg._get_backend(torch.device("cuda", 3)).supports_splitting is False
    with pytest.raises(ValueError, match=r"by init_process_group's device_id=cuda:3"):
        pg.allreduce([FakeCudaTensor(1)])
    assert pg._comm_for([FakeCudaTensor(3)]) is _FakeComm.made[0]
    # An int device_id is cuda:N; none (or a CPU one) leaves the group unbound until its
    # first CUDA call.
    pg = _new_process_group_helper(1)
    assert _FakeComm.made[-1].device == 1
    n = len(_FakeComm.made)
    for none in (None, torch.device("cpu", 0)):
        pg = _new_process_group_helper(none)
        assert len(_FakeComm.made) == n and pg.device is None and pg.bound_device_id is None


@needs_torch
def test_torch_backend_falls_back_to_local_rank_without_a_tensor(fake_comms, monkeypatch):
    """pg.comm read before any CUDA call: LOCAL_RANK modulo the visible GPUs (MACO's own
    choice without LOCAL_RANK); a barrier before any CUDA call runs on Gloo and binds
    nothing, unless its device_ids names a GPU."""
    import torch.distributed as dist

    mt = fake_comms
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setenv("LOCAL_RANK", "6")
    assert _maco_pg(mt).comm.device == 2
    monkeypatch.delenv("LOCAL_RANK")
    assert _maco_pg(mt).comm.device is None
    gloo = _FakeGloo()
    pg = _maco_pg(mt, fallback=gloo)
    assert pg.barrier() == "gloo-work" and gloo.barriers == 1 and pg._comm is None
    opts = dist.BarrierOptions()
    opts.device_ids = [3]
    pg.barrier(opts)
    assert pg.device == torch.device("cuda", 3) and pg.comm.barriers == 1
    assert gloo.barriers == 1
    pg.barrier()  # bound: MACO's barrier from now on
    assert pg.comm.barriers == 2 and gloo.barriers == 1


# ------------------------------------------------------------------ maco.ep (expert parallelism)


@needs_torch
@pytest.mark.skipif(has_gpu, reason="checks the no-GPU answer; this machine has a GPU")
def test_ep_buffer_without_gpu(comm):
    """maco.ep.Buffer on a communicator without a GPU: the C library's refusal, with the call
    named; maco.ep imports and documents its API."""
    import maco.ep

    assert maco.ep.Buffer.dispatch.__doc__ and maco.ep.Buffer.combine.__doc__
    with pytest.raises(maco.UnsupportedError) as e:
        maco.ep.Buffer(comm, num_experts=8, hidden=64, num_max_dispatch_tokens_per_rank=16,
                       num_topk=2, low_latency_mode=True)
    assert e.value.status == -6 and "maco_ep_buffer_create" in str(e.value)
