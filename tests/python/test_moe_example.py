"""python-bindings/examples/moe_layer.py without a GPU: its layer run through a stand-in for
maco.ep.Buffer that keeps the documented layouts (docs/ep.md: rows of each local expert in
token order; low latency [local_experts, capacity, hidden], normal packed with offsets) on
one rank, against the example's one-device reference; the all_to_all_single variant over a
one-rank Gloo group; and a stand-in that delivers one expert's rows to another, which the
check must catch."""

import importlib.util
import os

import pytest

torch = pytest.importorskip("torch")

_EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "..", "python-bindings", "examples",
                        "moe_layer.py")


def _load():
    spec = importlib.util.spec_from_file_location("moe_layer", _EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


moe = _load()


class _Handle:
    def __init__(self, recv_count, recv_offsets, where, topk_weights):
        self.recv_count = recv_count
        self.recv_offsets = recv_offsets
        self.where = where  # [T, k]: the row of recv_x (flattened) each entry went to
        self.topk_weights = topk_weights


class OneRankBuffer:
    """maco.ep.Buffer's dispatch and combine for a world of one rank, in torch on the CPU:
    expert e receives the tokens that chose it, in token order; combine sums each token's
    rows weighted in top-k order in float32 and rounds once to bfloat16. `swap` delivers
    expert swap[0]'s rows to swap[1] and back (a wrong dispatch)."""

    rank = 0
    group_size = 1

    def __init__(self, num_experts, hidden, tokens, low_latency, swap=None):
        self.num_local_experts = num_experts
        self.hidden = hidden
        self.capacity = tokens
        self.low_latency = low_latency
        self.swap = swap

    def dispatch(self, x, topk_idx, topk_weights):
        E, H = self.num_local_experts, self.hidden
        T, K = topk_idx.shape
        dest = topk_idx.clone()
        if self.swap is not None:
            a, b = self.swap
            dest[topk_idx == a], dest[topk_idx == b] = b, a
        counts = torch.bincount(dest.flatten(), minlength=E).to(torch.int32)
        offsets = torch.zeros(E + 1, dtype=torch.int32)
        offsets[1:] = torch.cumsum(counts, 0)
        where = torch.empty(T, K, dtype=torch.int64)
        slot = [0] * E
        rows = torch.zeros(E * self.capacity if self.low_latency else int(offsets[-1]), H,
                           dtype=torch.bfloat16)
        for t in range(T):
            for k in range(K):
                e = int(dest[t, k])
                r = e * self.capacity + slot[e] if self.low_latency else int(offsets[e]) + slot[e]
                slot[e] += 1
                rows[r] = x[t]
                where[t, k] = r
        recv_x = rows.view(E, self.capacity, H) if self.low_latency else rows
        return recv_x, counts, _Handle(counts, offsets, where, topk_weights)

    def combine(self, out, handle):
        flat = out.reshape(-1, self.hidden).float()
        w = handle.topk_weights
        acc = torch.zeros(w.shape[0], self.hidden, dtype=torch.float32)
        for k in range(w.shape[1]):
            acc = acc + w[:, k, None] * flat[handle.where[:, k]]
        return acc.to(torch.bfloat16)


def _args(**kw):
    a = moe.parse(["--tokens", "24", "--hidden", "64", "--ffn", "32", "--experts", "8",
                   "--topk", "3"])
    for k, v in kw.items():
        setattr(a, k, v)
    return a


@pytest.mark.parametrize("low_latency", [True, False])
def test_layer_through_the_layouts_matches_the_reference(low_latency):
    a = _args(seed=int.from_bytes(os.urandom(2), "little"))
    w = moe.make_weights(a, "cpu")
    x = moe.make_tokens(a, 0, "cpu")
    buf = OneRankBuffer(a.experts, a.hidden, a.tokens, low_latency)
    y = moe.moe_maco(x, w, buf, a.topk, low_latency)
    ref = moe.moe_reference(x, w, a.topk)
    assert y.shape == (a.tokens, a.hidden) and y.dtype == torch.bfloat16
    assert moe.rel_error(y, ref) <= a.tolerance


def test_a_wrong_dispatch_fails_the_check():
    a = _args(seed=7)
    w = moe.make_weights(a, "cpu")
    x = moe.make_tokens(a, 0, "cpu")
    idx, _ = moe.route(x, w["router"], a.topk)
    used = idx.flatten().unique().tolist()
    buf = OneRankBuffer(a.experts, a.hidden, a.tokens, True, swap=(used[0], used[1]))
    y = moe.moe_maco(x, w, buf, a.topk, True)
    assert moe.rel_error(y, moe.moe_reference(x, w, a.topk)) > a.tolerance


def test_routing_weights_and_experts():
    a = _args(seed=11)
    w = moe.make_weights(a, "cpu")
    x = moe.make_tokens(a, 0, "cpu")
    idx, tw = moe.route(x, w["router"], a.topk)
    assert idx.dtype == torch.int64 and tw.dtype == torch.float32
    assert idx.shape == tw.shape == (a.tokens, a.topk)
    assert torch.allclose(tw.sum(-1), torch.ones(a.tokens), atol=1e-6)
    probs = torch.softmax(x.float() @ w["router"].float(), dim=-1)
    for t in range(a.tokens):
        assert len(set(idx[t].tolist())) == a.topk
        assert set(idx[t].tolist()) == set(probs[t].topk(a.topk).indices.tolist())


def test_all_to_all_variant_on_one_gloo_rank(tmp_path):
    dist = pytest.importorskip("torch.distributed")
    a = _args(seed=3)
    w = moe.make_weights(a, "cpu")
    x = moe.make_tokens(a, 0, "cpu")
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method=f"file://{tmp_path / 'store'}")
    try:
        y = moe.moe_all_to_all(x, w, a.topk, 1, a.experts)
    finally:
        dist.destroy_process_group()
    assert moe.rel_error(y, moe.moe_reference(x, w, a.topk)) <= a.tolerance
