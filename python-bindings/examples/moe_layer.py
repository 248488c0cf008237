"""A mixture-of-experts layer on maco.ep (DeepSeek-style: many small experts, top-k routing),
checked against the same layer computed on one GPU:

    torchrun --nproc-per-node 4 python-bindings/examples/moe_layer.py [--mode low_latency]
        [--tokens 128] [--hidden 1024] [--ffn 256] [--experts 64] [--topk 6] [--iters 20]

Each rank holds --tokens tokens ([tokens, hidden] bfloat16) and experts/world_size experts
(SwiGLU MLPs: w_gate, w_up [hidden, ffn], w_down [ffn, hidden]). One step:

    router      probs = softmax(x @ w_router), the top-k experts and their weights (renormalized
                to sum to 1), float32
    dispatch    maco.ep: every token to the ranks of its experts, packed per local expert
    experts     each local expert's SwiGLU MLP on the rows it received (torch GEMMs)
    combine     maco.ep: the outputs back to their tokens, weighted and summed in top-k order

The check: every rank builds all experts' weights from one seed, so it computes the layer for
its own tokens on its GPU alone (each expert on the tokens that chose it, the same weighted sum)
and compares: relative Frobenius error at most --tolerance (bf16 rounding; the expert GEMMs
run on other row counts there). Then the median step time of --iters steps (CUDA events, the
largest over ranks) against the same layer with torch.distributed's all_to_all_single
(counts first, then the rows) on NCCL, in the same run. Exit status 1 on a wrong result.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

import torch
import torch.nn.functional as F


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mode", choices=["low_latency", "normal"], default="low_latency")
    p.add_argument("--tokens", type=int, default=128, help="tokens per rank")
    p.add_argument("--hidden", type=int, default=1024, help="a multiple of 8")
    p.add_argument("--ffn", type=int, default=256, help="each expert's MLP width")
    p.add_argument("--experts", type=int, default=64, help="a multiple of the world size")
    p.add_argument("--topk", type=int, default=6)
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--tolerance", type=float, default=2 ** -6)
    p.add_argument("--seed", type=int, default=1234)
    return p.parse_args(argv)


def make_weights(a, device) -> dict:
    """Every expert's weights and the router's, the same on every rank (one seed), bf16."""
    g = torch.Generator().manual_seed(a.seed)
    E, H, Fw = a.experts, a.hidden, a.ffn

    def rnd(*shape, scale):
        return (torch.randn(*shape, generator=g) * scale).to(torch.bfloat16).to(device)

    return {"router": rnd(H, E, scale=H ** -0.5),
            "gate": rnd(E, H, Fw, scale=H ** -0.5),
            "up": rnd(E, H, Fw, scale=H ** -0.5),
            "down": rnd(E, Fw, H, scale=Fw ** -0.5)}


def make_tokens(a, rank: int, device) -> torch.Tensor:
    """This rank's tokens [tokens, hidden] bf16 (seeded by rank)."""
    g = torch.Generator().manual_seed(a.seed + 1 + rank)
    return torch.randn(a.tokens, a.hidden, generator=g).to(torch.bfloat16).to(device)


def route(x: torch.Tensor, w_router: torch.Tensor, topk: int):
    """(topk_idx [T, k] int64, topk_weights [T, k] float32): the k most probable experts of
    each token and their probabilities renormalized to sum to 1 (Mixtral's and DeepSeek's
    routing, float32 softmax)."""
    probs = torch.softmax(x.float() @ w_router.float(), dim=-1)
    w, idx = probs.topk(topk, dim=-1)
    return idx, (w / w.sum(dim=-1, keepdim=True)).contiguous()


def expert(rows: torch.Tensor, w: dict, e: int) -> torch.Tensor:
    """Expert e's SwiGLU MLP on rows [n, hidden] bf16 -> [n, hidden] bf16."""
    return (F.silu(rows @ w["gate"][e]) * (rows @ w["up"][e])) @ w["down"][e]


def experts_on_received(recv_x: torch.Tensor, handle, w: dict, first_expert: int,
                        low_latency: bool) -> torch.Tensor:
    """Each local expert's MLP on the rows dispatch gave it, in recv_x's layout (low latency:
    [local_experts, capacity, hidden], the first recv_count[e] rows of expert e; normal:
    [num_recv, hidden], expert e's rows from recv_offsets[e]). Rows past the counts stay
    zero. Reads the counts on the host (a synchronization), as a grouped GEMM with host-side
    sizes does."""
    out = torch.zeros_like(recv_x)
    counts = handle.recv_count.tolist()
    offsets = handle.recv_offsets.tolist()
    for j, c in enumerate(counts):
        if c == 0:
            continue
        if low_latency:
            out[j, :c] = expert(recv_x[j, :c], w, first_expert + j)
        else:
            o = offsets[j]
            out[o:o + c] = expert(recv_x[o:o + c], w, first_expert + j)
    return out


def moe_maco(x: torch.Tensor, w: dict, buf, topk: int, low_latency: bool) -> torch.Tensor:
    """The layer on maco.ep: route, dispatch, the local experts, combine -> [T, hidden] bf16."""
    idx, tw = route(x, w["router"], topk)
    recv_x, _, handle = buf.dispatch(x, idx, tw)
    out = experts_on_received(recv_x, handle, w, buf.rank * buf.num_local_experts, low_latency)
    return buf.combine(out, handle)


def moe_reference(x: torch.Tensor, w: dict, topk: int) -> torch.Tensor:
    """The same layer on one device with every expert: each expert on the tokens that chose
    it, then per token the weighted sum in top-k order in float32, rounded once to bf16."""
    idx, tw = route(x, w["router"], topk)
    acc = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for k in range(topk):
        for e in idx[:, k].unique().tolist():
            t = (idx[:, k] == e).nonzero().flatten()
            acc[t] += tw[t, k, None] * expert(x[t], w, e).float()
    return acc.to(torch.bfloat16)


def moe_all_to_all(x: torch.Tensor, w: dict, topk: int, ws: int, E: int):
    """The same layer the way most code does it today, on torch.distributed (NCCL): each
    (token, expert) row sent with all_to_all_single after a count exchange, the experts, the
    rows sent back the same way, the weighted sum."""
    import torch.distributed as dist

    L = E // ws
    idx, tw = route(x, w["router"], topk)
    flat = idx.flatten()
    order = torch.argsort(flat, stable=True)  # rows grouped by expert, hence by rank
    send = x[order // topk]
    counts = torch.bincount(flat // L, minlength=ws)
    recv_counts = torch.empty_like(counts)
    dist.all_to_all_single(recv_counts, counts)
    sc, rc = counts.tolist(), recv_counts.tolist()
    recv = x.new_empty(sum(rc), x.shape[1])
    dist.all_to_all_single(recv, send, rc, sc)
    experts_of = flat[order]  # the expert of each sent row, exchanged the same way
    recv_e = experts_of.new_empty(sum(rc))
    dist.all_to_all_single(recv_e, experts_of, rc, sc)
    out = torch.empty_like(recv)
    for e in recv_e.unique().tolist():
        r = (recv_e == e).nonzero().flatten()
        out[r] = expert(recv[r], w, e)
    back = torch.empty_like(send)
    dist.all_to_all_single(back, out, sc, rc)
    rows = torch.empty_like(back)
    rows[order] = back
    rows = rows.view(x.shape[0], topk, x.shape[1]).float()
    return (rows * tw[..., None]).sum(dim=1).to(torch.bfloat16)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).norm() / want.float().norm().clamp_min(1e-30))


def main(argv=None) -> int:
    import torch.distributed as dist

    import maco
    import maco.ep

    a = parse(argv)
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("nccl", device_id=dev)
    if a.experts % ws:
        raise SystemExit(f"--experts {a.experts} must be a multiple of the world size {ws}")
    comm = maco.Communicator.from_process_group(dist.group.WORLD, device=dev)
    low = a.mode == "low_latency"
    w = make_weights(a, dev)
    x = make_tokens(a, rank, dev)
    buf = maco.ep.Buffer(comm, num_experts=a.experts, hidden=a.hidden,
                         num_max_dispatch_tokens_per_rank=a.tokens, num_topk=a.topk,
                         low_latency_mode=low)
    y = moe_maco(x, w, buf, a.topk, low)
    y_a2a = moe_all_to_all(x, w, a.topk, ws, a.experts)
    ref = moe_reference(x, w, a.topk)
    err, err_a2a = rel_error(y, ref), rel_error(y_a2a, ref)

    def timed(fn) -> float:
        for _ in range(3):
            fn()
        ms = []
        for _ in range(a.iters):
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            dist.barrier()
            s.record()
            fn()
            e.record()
            e.synchronize()
            ms.append(s.elapsed_time(e))
        med = torch.tensor([statistics.median(ms)], device=dev)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        return float(med.item())

    t_maco = timed(lambda: moe_maco(x, w, buf, a.topk, low))
    t_a2a = timed(lambda: moe_all_to_all(x, w, a.topk, ws, a.experts))
    errs = torch.tensor([err, err_a2a], device=dev)
    dist.all_reduce(errs, op=dist.ReduceOp.MAX)
    ok = bool(errs[0] <= a.tolerance)
    if rank == 0:
        print(f"moe_layer: {ws} ranks, {a.mode}, {a.tokens} tokens per rank, hidden {a.hidden}, "
              f"{a.experts} experts (SwiGLU, ffn {a.ffn}), top-{a.topk}, bf16")
        print(f"  error against one GPU: maco.ep {float(errs[0]):.2e}, all_to_all_single "
              f"{float(errs[1]):.2e} (tolerance {a.tolerance:.2e})")
        print(f"  step: maco.ep {t_maco:.3f} ms, torch all_to_all_single on NCCL {t_a2a:.3f} ms "
              f"({t_a2a / t_maco:.2f}x)")
        print(("PASS" if ok else "FAIL") + " moe_layer")
    buf.destroy()
    comm.close()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
