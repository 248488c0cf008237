"""maco.tp without a GPU: argument checks name the argument, chunk arithmetic covers every row
once. The operators themselves are checked on GPUs by gpu_tp.py (test_gpu.py)."""

import random

import pytest

from maco import tp


def test_bounds_cover_every_row_once_in_order():
    rng = random.Random()
    for _ in range(500):
        rows, chunks = rng.randint(1, 100000), rng.randint(1, 16)
        b = tp._bounds(rows, chunks)
        assert b[0] == 0 and b[-1] == rows
        assert all(lo < hi for lo, hi in zip(b, b[1:])), (rows, chunks, b)
        assert len(b) - 1 <= chunks
        assert all(x % 8 == 0 for x in b[:-1])  # every chunk but the end starts 8-row aligned


def test_default_chunks():
    assert tp.default_chunks("gemm_allreduce", 1024, 2) == 1
    assert tp.default_chunks("gemm_allreduce", 4096, 2) == 2
    assert tp.default_chunks("gemm_allreduce", 8192, 2) == 4
    assert tp.default_chunks("allgather_gemm", 8192, 4) == 2
    assert tp.default_chunks("allgather_gemm", 4096, 4) == 1
    assert tp.default_chunks("gemm_reduce_scatter", 65536, 2) == 1


@pytest.mark.parametrize("fn", [tp.gemm_allreduce, tp.gemm_reduce_scatter, tp.allgather_gemm])
def test_bad_arguments_name_the_argument(fn):
    torch = pytest.importorskip("torch")
    x = torch.zeros(8, 4, dtype=torch.bfloat16)
    w = torch.zeros(4, 2, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="x is a list"):
        fn([1.0], w)
    with pytest.raises(ValueError, match="x is on cpu, not a CUDA device"):
        fn(x, w)
    with pytest.raises(TypeError, match="w is a NoneType"):
        fn(x, None)


class _Comm:
    """What maco.tp's method choice reads of a communicator."""

    def __init__(self, hosts):
        self.size, self.rank, self.hosts, self.asked = len(hosts), 0, hosts, 0

    def host_id(self, r):
        self.asked += 1
        return self.hosts[r]


def test_method_choice_per_communicator():
    one, two = _Comm(["a", "a"]), _Comm(["a", "b"])
    for pat in ("gemm_allreduce", "gemm_reduce_scatter", "allgather_gemm"):
        assert tp._method(one, None, 10 ** 12, pat) == "ce"
        assert tp._method(two, None, 10 ** 12, pat) == "seq"  # two nodes: no peer mapping
        assert tp._method(one, None, 10 ** 9, pat) == "seq"  # a small GEMM runs in sequence
        assert tp._method(two, "ce", 10 ** 12, pat) == "ce"  # an explicit method is kept
    asked = one.asked
    assert tp._method(one, None, 10 ** 12, "gemm_allreduce") == "ce" and one.asked == asked
    assert tp._method(_Comm(["a"]), None, 10 ** 12, "gemm_allreduce") == "seq"  # one rank
    four = _Comm(["a"] * 4)  # 3 or more ranks: only reduce-scatter takes the copy engines
    assert tp._method(four, None, 10 ** 12, "gemm_reduce_scatter") == "ce"
    assert tp._method(four, None, 10 ** 12, "gemm_allreduce") == "seq"
    assert tp._method(four, None, 10 ** 12, "allgather_gemm") == "seq"
    assert tp._method(four, "ce", 10 ** 12, "allgather_gemm") == "ce"
