"""maco.tp without a GPU: argument checks name the argument, chunk arithmetic covers every row
once. The operators themselves are checked on GPUs by gpu_tp.py (test_gpu.py)."""

import os
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
    assert tp.default_chunks("allgather_gemm", 8192, 2) == 2
    assert tp.default_chunks("allgather_gemm", 2048, 2) == 1
    assert tp.default_chunks("allgather_gemm", 8192, 4) == 1  # the ring's steps pipeline
    assert tp.default_chunks("allgather_gemm", 65536, 8) == 1
    assert tp.default_chunks("gemm_allreduce", 8192, 4) == 1  # pieces per destination block
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
    four = _Comm(["a"] * 4)  # 3 or more ranks: every pattern from 2e11 flop
    assert tp._method(four, None, 10 ** 12, "gemm_reduce_scatter") == "ce"
    assert tp._method(four, None, 10 ** 12, "gemm_allreduce") == "ce"
    assert tp._method(four, None, 1.5 * 10 ** 11, "gemm_allreduce") == "seq"
    assert tp._method(four, None, 10 ** 12, "allgather_gemm") == "ce"
    assert tp._method(four, None, 1.5 * 10 ** 11, "allgather_gemm") == "seq"  # under 2e11
    # gemm_allreduce with M not a multiple of the world size: the per-chunk split only on request
    assert tp._method(four, None, 10 ** 12, "gemm_allreduce", 8192) == "ce"
    assert tp._method(four, None, 10 ** 12, "gemm_allreduce", 8190) == "seq"
    assert tp._method(four, "ce", 10 ** 12, "gemm_allreduce", 8190) == "ce"
    assert tp._method(one, None, 10 ** 12, "gemm_allreduce", 8191) == "ce"  # 2 ranks: any M
    assert tp._method(four, None, 10 ** 12, "gemm_reduce_scatter", 8190) == "ce"  # allreduce's rule
    # compiled graphs' threshold (maco._fused_ops): 1.5e11 flop takes the copy engines there
    assert tp._method(four, None, 1.5 * 10 ** 11, "allgather_gemm", min_flop=10 ** 11) == "ce"
    assert tp._method(four, None, 0.9 * 10 ** 11, "allgather_gemm", min_flop=10 ** 11) == "seq"
    assert tp._method(four, None, 1.5 * 10 ** 11, "gemm_allreduce", 8190, 10 ** 11) == "seq"
    assert tp._method(two, None, 10 ** 12, "allgather_gemm", min_flop=0) == "seq"  # two nodes


def test_split_layout_covers_every_row_once():
    """gemm_allreduce's reduce-scatter + allgather layout: every output row is owned by exactly
    one rank in exactly one chunk, each owner's rows sit back to back in its workspace, and the
    workspace (cap rows) holds the largest owner's share, for random row counts, chunk counts
    and world sizes (uneven blocks and chunks with fewer rows than ranks included)."""
    rnd = random.Random(int.from_bytes(os.urandom(4), "little"))
    for _ in range(300):
        m, ws, chunks = rnd.randint(1, 5000), rnd.randint(2, 8), rnd.randint(1, 9)
        b = tp._bounds(m, chunks)
        blk, off, cap = tp._split_layout(b, ws)
        owner = [None] * m
        for j, bl in enumerate(blk):
            assert bl[0] == b[j] and bl[-1] == b[j + 1] and bl == sorted(bl)
            for r in range(ws):
                for row in range(bl[r], bl[r + 1]):
                    assert owner[row] is None, (m, ws, chunks, row)
                    owner[row] = (r, off[r][j] + row - bl[r])
        assert None not in owner, (m, ws, chunks)
        for r in range(ws):
            slots = sorted(s for o, s in owner if o == r)
            assert slots == list(range(off[r][-1])), (m, ws, chunks, r)
        assert cap == max(1, max(o[-1] for o in off)) and cap <= m // ws + len(blk)


def test_copy_orders_spread_over_the_peers():
    """The copy-engine batches run one copy after another: at every position of a batch (and
    at every allgather step) the ranks' copies go to distinct ranks, none to itself but at the
    reduce-scatter's own block, and a receiver multiplies the shard of the rank that sent to
    it in that step."""
    for ws in range(2, 9):
        orders = [tp._peer_order(r, ws) for r in range(ws)]
        for r in range(ws):
            assert sorted(orders[r]) == list(range(ws)) and orders[r][0] == r
        for pos in range(ws):
            assert sorted(o[pos] for o in orders) == list(range(ws)), (ws, pos)
        for d in range(1, ws):
            steps = [tp._ring_step(r, ws, d) for r in range(ws)]
            assert sorted(to for to, _ in steps) == list(range(ws)), (ws, d)
            for r, (to, frm) in enumerate(steps):
                assert to != r and steps[to][1] == r and steps[frm][0] == r, (ws, d, r)
        # every rank's shard reaches every other rank once over the steps
        for r in range(ws):
            assert sorted(tp._ring_step(r, ws, d)[0] for d in range(1, ws)) == \
                sorted(set(range(ws)) - {r})
