"""A Llama-3-70B tensor-parallel transformer layer written as the design's
OptimizedTransformerLayer, timed with MACO's overlap API against torch + NCCL and against
torch.compile with PyTorch's async tensor-parallel pass. One process per GPU, under torchrun:

    torchrun --nproc-per-node 2 tests/python/bench_tp_layer.py --json tp2.json
    torchrun --nproc-per-node 4 tests/python/bench_tp_layer.py --json tp4.json
    python3 tests/python/bench_tp_layer.py --dry-run --world-size 4    # shapes, no GPU

The layer (Llama-3-70B: hidden 8192, 64 query heads and 8 key/value heads of 128, SwiGLU MLP
28672, RMSNorm, rotary embeddings, bf16; --tokens 4096 tokens as --batch sequences), TP = the
world size: QKV and gate/up projections column-parallel (no communication), o_proj and down
row-parallel, each followed by an allreduce of [tokens, 8192]. As the design writes it:
x = norm1(x + allreduce(o_proj(attention(qkv_proj(x))))); x = norm2(x + allreduce(ffn(x))).

Variants (--variants), each on the same weights and input:

  torch-nccl      eager PyTorch, torch.distributed.all_reduce on NCCL      (the reference)
  torch-compile   torch.compile (Inductor), the same allreduces (functional, NCCL)
  torch-asynctp   torch.compile with Inductor's micro-pipeline TP pass (async TP): the layer in
                  its sequence-parallel form (all_gather + column-parallel matmul,
                  row-parallel matmul + reduce_scatter), which that pass fuses; its output
                  gathered for the check
  maco-eager      eager, maco.allreduce (MACO's allreduce instead of NCCL's, no overlap)
  maco-pipeline   eager, the layer after attention as a maco.Pipeline over --chunks token
                  chunks: o_proj | allreduce | residual + norm + MLP | allreduce | residual +
                  norm, so each chunk's allreduce overlaps the next chunk's GEMMs (collective
                  CTAs capped at --comm-sms)
  maco-compile    @maco.task_graph (maco.compile): o_proj + allreduce and down + allreduce
                  become MACO's fused GEMM + allreduce persistent kernels, the rest Inductor
  maco-compile-ce the same compiled layer with maco.config.set(fusion="copy_engine"): the
                  pairs run as maco.tp.gemm_allreduce (cuBLAS in row chunks, copy engines)
  maco-compile-sp torch-asynctp's sequence-parallel layer through maco.compile: each
                  all_gather + matmul and matmul + reduce_scatter becomes maco.tp's
                  allgather_gemm / gemm_reduce_scatter (copy engines from 1e11 flop, the
                  compiled graphs' default)
  maco-compile-sp-seq  the same, every pair sequential (the GEMM and MACO's collective one
                  after the other; the copy-engine threshold of compiled graphs raised for
                  this variant: a measurement, not an API)

Each step time is the median of --iters steps between CUDA events, the largest over ranks
(ms); with --rounds R the variants are timed R times in turn and the table gives the median of
the R times. Checks: every variant's output against torch-nccl's, relative Frobenius error <=
--tolerance (bf16 rounding: the variants sum in different orders); exit status 1 otherwise.
Then maco.profiler's summary tables (per operation: time, overlap %, SMs; the total overlap
efficiency) of one step of maco-compile and of the maco.tp variants (maco-compile-sp,
maco-compile-ce), on rank 0; the efficiency also goes into their rows. --json writes the rows
and the environment.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import statistics
import sys
import time

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, MLP = 8192, 64, 8, 128, 28672
VARIANTS = ["torch-nccl", "torch-compile", "torch-asynctp", "maco-eager", "maco-pipeline",
            "maco-compile", "maco-compile-ce", "maco-compile-sp", "maco-compile-sp-seq"]
SHARDED = ("torch-asynctp", "maco-compile-sp", "maco-compile-sp-seq")  # output: a row shard


def parse(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=4096)
    p.add_argument("--batch", type=int, default=1, help="sequences (tokens / batch each)")
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1,
                   help="time every variant this many times in turn; the table gives the "
                        "median of the rounds' medians")
    p.add_argument("--chunks", type=int, default=4, help="maco-pipeline's token chunks")
    p.add_argument("--comm-sms", type=int, default=24,
                   help="maco-pipeline: CTA cap of the allreduce kernels (0: none)")
    p.add_argument("--tolerance", type=float, default=2 ** -6)
    p.add_argument("--json", default=None)
    p.add_argument("--no-profile", action="store_true")
    p.add_argument("--dry-run", action="store_true", help="print the shapes; no GPU")
    p.add_argument("--world-size", type=int, default=None, help="with --dry-run")
    p.add_argument("--small", action="store_true",
                   help="a small layer (hidden 1024, 8 heads, MLP 2048): for a quick check")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU over Gloo (a check of this script, not a benchmark; "
                        "torch-asynctp is left out)")
    p.add_argument("--inner", default="inductor", choices=["inductor", "eager"],
                   help="what runs maco-compile's non-fused operations")
    a = p.parse_args(argv)
    a.variants = [v for v in a.variants.split(",") if v]
    bad = [v for v in a.variants if v not in VARIANTS]
    if bad:
        p.error(f"--variants: unknown {bad}; known: {VARIANTS}")
    if a.tokens % a.batch:
        p.error(f"--tokens {a.tokens} is not a multiple of --batch {a.batch}")
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: at least 1")
    return a


def dims(ws: int, small: bool) -> dict:
    """This rank's shapes for a TP size of ``ws``."""
    h, heads, kv, hd, mlp = (1024, 8, 8, 128, 2048) if small else (HIDDEN, HEADS, KV_HEADS,
                                                                     HEAD_DIM, MLP)
    for total, what in ((heads, "query heads"), (kv, "key/value heads"), (mlp, "MLP width")):
        if total % ws:
            raise SystemExit(f"the world size {ws} does not divide the {total} {what}")
    return dict(hidden=h, head_dim=hd, q_heads=heads // ws, kv_heads=kv // ws,
                qkv_out=(heads + 2 * kv) // ws * hd, attn_in=heads // ws * hd,
                mlp_local=mlp // ws)


def dry_run(a) -> None:
    ws = a.world_size or 2
    d = dims(ws, a.small)
    print(f"TP {ws}, {a.tokens} tokens ({a.batch} x {a.tokens // a.batch}), bf16; per rank: "
          f"qkv_proj [{d['hidden']}, {d['qkv_out']}], o_proj [{d['attn_in']}, {d['hidden']}] "
          f"+ allreduce [{a.tokens}, {d['hidden']}], gate_up [{d['hidden']}, "
          f"{2 * d['mlp_local']}], down [{d['mlp_local']}, {d['hidden']}] + allreduce; "
          f"variants: {', '.join(a.variants)}")


# ---------------------------------------------------------------------------- the layer

def build(torch, maco, a, rank, ws, dev):
    import torch.distributed as dist
    import torch.nn.functional as F

    d = dims(ws, a.small)
    H, hd = d["hidden"], d["head_dim"]
    seq = a.tokens // a.batch

    def weight(shape, salt):
        g = torch.Generator(device=dev)
        g.manual_seed(1000003 * rank + 7919 * salt + a.seed)
        return (torch.randn(shape, generator=g, device=dev) * 0.02).to(torch.bfloat16)

    W = dict(qkv=weight((d["qkv_out"], H), 1), o=weight((H, d["attn_in"]), 2),
             gate_up=weight((2 * d["mlp_local"], H), 3), down=weight((H, d["mlp_local"]), 4),
             n1=torch.ones(H, device=dev, dtype=torch.bfloat16),
             n2=torch.ones(H, device=dev, dtype=torch.bfloat16))
    pos = torch.arange(seq, device=dev, dtype=torch.float32)
    inv = 1.0 / (500000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.outer(pos, inv)
    cos, sin = ang.cos().to(torch.bfloat16), ang.sin().to(torch.bfloat16)

    def rms(x, w):
        return F.rms_norm(x, (H,), w, 1e-5)

    def rope(t):  # t [b, heads, seq, hd]
        t1, t2 = t[..., : hd // 2], t[..., hd // 2:]
        return torch.cat([t1 * cos - t2 * sin, t1 * sin + t2 * cos], dim=-1)

    def attention(qkv):  # [b, seq, qkv_out] -> [b, seq, attn_in]
        b = qkv.shape[0]
        q, k, v = qkv.split([d["q_heads"] * hd, d["kv_heads"] * hd, d["kv_heads"] * hd], -1)
        q = rope(q.view(b, seq, d["q_heads"], hd).transpose(1, 2))
        k = rope(k.view(b, seq, d["kv_heads"], hd).transpose(1, 2))
        v = v.view(b, seq, d["kv_heads"], hd).transpose(1, 2)
        o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return o.transpose(1, 2).reshape(b, seq, d["attn_in"])

    def ffn(x):
        gu = torch.matmul(x, W["gate_up"].T)
        g, u = gu.chunk(2, dim=-1)
        return torch.matmul(F.silu(g) * u, W["down"].T)

    class OptimizedTransformerLayer(maco.Module):
        """The design's layer; ``allreduce`` is maco.allreduce or torch.distributed's."""

        def __init__(self, allreduce):
            self.allreduce = allreduce
            self._maco_inner = a.inner

        def qkv_proj(self, x):
            return torch.matmul(x, W["qkv"].T)

        def attention(self, qkv, kv_cache=None):
            return attention(qkv)

        def o_proj(self, x):
            return torch.matmul(x, W["o"].T)

        def norm1(self, x):
            return rms(x, W["n1"])

        def norm2(self, x):
            return rms(x, W["n2"])

        def ffn(self, x):
            return ffn(x)

        def forward(self, x, kv_cache=None):
            qkv = self.qkv_proj(x)
            attn_out = self.attention(qkv, kv_cache)
            attn_out = self.o_proj(attn_out)
            attn_out = self.allreduce(attn_out)
            x = x + attn_out
            x = self.norm1(x)
            ffn_out = self.ffn(x)
            ffn_out = self.allreduce(ffn_out)
            x = x + ffn_out
            x = self.norm2(x)
            return x

    class TaskGraphLayer(OptimizedTransformerLayer):
        @maco.task_graph
        def forward(self, x, kv_cache=None):
            return OptimizedTransformerLayer.forward(self, x, kv_cache)

    def nccl_allreduce(t):
        dist.all_reduce(t)
        return t

    def functional_allreduce(t):
        import torch.distributed._functional_collectives as fc

        return fc.all_reduce(t, "sum", dist.group.WORLD)

    class Plain(torch.nn.Module):  # torch-nccl and torch-compile: no maco.Module scope
        def __init__(self, allreduce):
            super().__init__()
            self.inner = OptimizedTransformerLayer.__new__(OptimizedTransformerLayer)
            self.inner.allreduce = allreduce

        def forward(self, x):
            return OptimizedTransformerLayer.forward(self.inner, x)

    # maco-pipeline: attention whole, the rest over token chunks
    pipe = maco.Pipeline(num_stages=5, chunks=a.chunks)
    pipe.stage(0)(lambda at, r: (torch.matmul(at, W["o"].T), r))
    pipe.stage(1)(lambda y, r: (maco.allreduce(y), r))

    def s2(y, r):
        h = rms(r + y, W["n1"])
        return ffn(h), h
    pipe.stage(2)(s2)
    pipe.stage(3)(lambda f, h: (maco.allreduce(f), h))
    pipe.stage(4)(lambda f, h: rms(h + f, W["n2"]))

    def pipelined(x):
        b = x.shape[0]
        at = attention(torch.matmul(x, W["qkv"].T))
        out = pipe(at.reshape(-1, d["attn_in"]), x.reshape(-1, H))
        return out.view(b, seq, H)

    # torch-asynctp: the sequence-parallel form (rows of the token dimension sharded)
    def sp_layer(x_shard):
        import torch.distributed._functional_collectives as fc

        g = dist.group.WORLD
        b = a.batch
        xf = fc.all_gather_tensor(x_shard, 0, g)                       # [tokens, H]
        qkv = torch.matmul(xf, W["qkv"].T).view(b, seq, -1)
        at = attention(qkv).reshape(-1, d["attn_in"])
        y = fc.reduce_scatter_tensor(torch.matmul(at, W["o"].T), "sum", 0, g)
        h = rms(x_shard + y, W["n1"])
        hf = fc.all_gather_tensor(h, 0, g)
        f = fc.reduce_scatter_tensor(ffn(hf), "sum", 0, g)
        return rms(h + f, W["n2"])

    return dict(OptimizedTransformerLayer=OptimizedTransformerLayer,
                TaskGraphLayer=TaskGraphLayer, Plain=Plain, nccl_allreduce=nccl_allreduce,
                functional_allreduce=functional_allreduce, pipelined=pipelined,
                sp_layer=sp_layer, dims=d, seq=seq)


# ---------------------------------------------------------------------------- timing

def main(argv=None) -> int:
    a = parse(argv)
    if a.dry_run:
        dry_run(a)
        return 0
    import torch
    import torch.distributed as dist

    import maco

    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if a.cpu:
        dev = torch.device("cpu")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
        a.variants = [v for v in a.variants if v != "torch-asynctp"]  # needs CUDA
        a.no_profile = True  # maco.profiler times with CUDA events
    else:
        torch.cuda.set_device(local % torch.cuda.device_count())
        dev = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", device_id=dev, timeout=datetime.timedelta(seconds=600))
    comm = maco.init()
    a.seed = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little") % 100000
    torch.backends.cuda.matmul.allow_tf32 = False
    L = build(torch, maco, a, rank, ws, dev)
    H = L["dims"]["hidden"]
    g = torch.Generator(device=dev)
    g.manual_seed(a.seed)
    x = torch.randn(a.batch, L["seq"], H, generator=g, device=dev).to(torch.bfloat16)

    def log(s):
        if rank == 0:
            print(s, flush=True)

    def sync():
        if not a.cpu:
            torch.cuda.synchronize()

    def time_ms(fn):
        for _ in range(a.warmup):
            fn()
        sync()
        comm.barrier()
        if a.cpu:
            ts = []
            for _ in range(a.iters):
                t0 = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t0) * 1e3)
            med = statistics.median(ts)
        else:
            evs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                   for _ in range(a.iters)]
            for s, e in evs:
                s.record()
                fn()
                e.record()
            torch.cuda.synchronize()
            med = statistics.median(s.elapsed_time(e) for s, e in evs)
        t = torch.tensor([med], device=dev)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return float(t.item())

    gpu = "CPU (Gloo)" if a.cpu else torch.cuda.get_device_name(dev)
    log(f"bench_tp_layer: TP {ws} on {gpu}, {a.tokens} tokens "
        f"({a.batch} x {L['seq']}), hidden {H}, torch {torch.__version__}, maco "
        f"{maco.__version__}")
    fns = {}
    with torch.no_grad():
        fns["torch-nccl"] = L["Plain"](L["nccl_allreduce"])
        if "torch-compile" in a.variants:
            fns["torch-compile"] = torch.compile(L["Plain"](L["functional_allreduce"]))
        rows = a.tokens // ws
        xs = x.reshape(-1, H)[rank * rows:(rank + 1) * rows].contiguous()
        if "torch-asynctp" in a.variants:
            try:
                import torch._inductor.config as ic
                from torch.distributed._symmetric_memory import enable_symm_mem_for_group

                enable_symm_mem_for_group(dist.group.WORLD.group_name)
                ic._micro_pipeline_tp = True
                sp = torch.compile(L["sp_layer"], fullgraph=True)

                def asynctp():
                    return sp(xs)

                asynctp()  # compiles here, with the pass on
                ic._micro_pipeline_tp = False
                fns["torch-asynctp"] = asynctp
            except Exception as e:  # noqa: BLE001 - reported in the table
                log(f"torch-asynctp: unavailable: {type(e).__name__}: {e}")
        fns["maco-eager"] = L["OptimizedTransformerLayer"](maco.allreduce)

        fns["maco-pipeline"] = L["pipelined"]
        fns["maco-compile"] = L["TaskGraphLayer"](maco.allreduce)
        fns["maco-compile-ce"] = fns["maco-compile"]  # the same graph; fusion set below
        if any(v.startswith("maco-compile-sp") for v in a.variants):
            def sp_entry(t):  # its own code object: Dynamo's cache apart from asynctp's
                return L["sp_layer"](t)

            msp = maco.compile(sp_entry, fullgraph=True)
            fns["maco-compile-sp"] = lambda: msp(xs)
            fns["maco-compile-sp-seq"] = fns["maco-compile-sp"]  # threshold set below

        ref = fns["torch-nccl"](x.clone())
        sync()
        rows, failures = [], []
        import maco._fused_ops as mcomp

        ce_min = mcomp._COMPILE_CE_MIN_FLOP

        def enter(v):  # the variant's settings
            if v == "maco-pipeline" and a.comm_sms:
                maco.set_config(comm_sms=a.comm_sms)  # applied at its first allreduce
            maco.config.set(fusion="copy_engine" if v == "maco-compile-ce" else "persistent")
            if v == "maco-compile-sp-seq":
                mcomp._COMPILE_CE_MIN_FLOP = float("inf")

        def leave(v):
            mcomp._COMPILE_CE_MIN_FLOP = ce_min
            if v == "maco-pipeline" and a.comm_sms:
                from maco import _config

                _config.clear_config()
                if not a.cpu:
                    comm.set_max_ctas(0)  # collective, as the cap was

        def timed(v):
            f = fns[v]
            xin = x.clone()
            return time_ms((lambda: f()) if v in SHARDED else (lambda: f(xin)))

        for v in a.variants:
            if v not in fns:
                rows.append(dict(variant=v, skip="unavailable"))
                continue
            f = fns[v]
            enter(v)
            try:
                out = f(x.clone()) if v not in SHARDED else f()
                if v in SHARDED:
                    shard = out.contiguous()
                    out = torch.empty(a.tokens, H, device=dev, dtype=shard.dtype)
                    dist.all_gather_into_tensor(out, shard)
                out = out.reshape(ref.shape).float()
                err = ((out - ref.float()).norm() / ref.float().norm()).item()
                if not err <= a.tolerance:
                    failures.append(f"{v}: relative error {err:.3g} > {a.tolerance:.3g}")
                if v.startswith("maco-compile"):
                    import maco._fused_ops as mc

                    before = dict(mc.stats)
                    f(x.clone()) if v not in SHARDED else f()
                    d = {k: mc.stats[k] - before[k] for k in before}
                    log(f"  {v}: per step {d['fused']} fused GEMM + allreduce kernel(s), "
                        f"{d['copy_engine']} maco.tp.gemm_allreduce, {d['allgather_gemm']} "
                        f"maco.tp.allgather_gemm, {d['gemm_reduce_scatter']} "
                        f"maco.tp.gemm_reduce_scatter, {d['fallback'] + d['sp_fallback']} "
                        f"through the fallback (matmul and collective one after the other)")
                t = timed(v)
                rows.append(dict(variant=v, ms=t, rounds=[t], rel_error=err))
                log(f"  {v:<15} {t:8.3f} ms   error {err:.2e}")
            except Exception as e:  # noqa: BLE001 - a failing variant is reported
                failures.append(f"{v}: {type(e).__name__}: {e}")
                rows.append(dict(variant=v, skip=f"{type(e).__name__}: {e}"[:200]))
                log(f"  {v:<15} failed: {type(e).__name__}: {e}")
            finally:
                leave(v)
        for i in range(1, a.rounds):  # the variants in turn again: drift hits them alike
            for r in rows:
                if "ms" in r:
                    enter(r["variant"])
                    try:
                        r["rounds"].append(timed(r["variant"]))
                    finally:
                        leave(r["variant"])
            log(f"  round {i + 1}: " + ", ".join(f"{r['variant']} {r['rounds'][-1]:.3f}"
                                                for r in rows if "ms" in r))
        for r in rows:
            if "ms" in r:
                r["ms"] = statistics.median(r["rounds"])
        base = {r["variant"]: r.get("ms") for r in rows}
        log(f"{'variant':<15} {'ms':>9} {'vs torch-nccl':>14} {'vs asynctp':>11}")
        for r in rows:
            if "ms" not in r:
                log(f"{r['variant']:<15} {'-':>9}  ({r['skip']})")
                continue
            vs_n = base.get("torch-nccl") and f"{base['torch-nccl'] / r['ms']:.2f}x"
            vs_a = base.get("torch-asynctp") and f"{base['torch-asynctp'] / r['ms']:.2f}x"
            r.update(speedup_vs_nccl=vs_n, speedup_vs_asynctp=vs_a)
            log(f"{r['variant']:<15} {r['ms']:>9.3f} {vs_n or '-':>14} {vs_a or '-':>11}")
        maco.config.set(fusion="persistent")
        if "maco-compile" in fns and "maco-compile" in a.variants and not a.no_profile:
            import maco._fused_ops as mc

            sync()
            mc.close_kernels()  # rebuilt with per-task profiles
            maco.config.set(profile=True)
            f = fns["maco-compile"]
            f(x.clone())
            with maco.profiler() as prof:
                f(x.clone())
            maco.config.set(profile=False)
            if rank == 0:
                print("maco.profiler summary of one maco-compile step (rank 0):")
                prof.print_summary()
        for v in ("maco-compile-sp", "maco-compile-ce"):  # the maco.tp paths: copy engines
            if v in fns and v in a.variants and not a.no_profile and not a.cpu:
                enter(v)
                try:
                    f = fns[v]
                    f() if v in SHARDED else f(x.clone())
                    sync()
                    with maco.profiler() as prof:
                        f() if v in SHARDED else f(x.clone())
                    _, eff = prof.overlap()
                    for r in rows:
                        if r["variant"] == v:
                            r["overlap_efficiency_pct"] = eff
                    if rank == 0:
                        print(f"maco.profiler summary of one {v} step (rank 0):")
                        prof.print_summary()
                finally:
                    leave(v)
    if a.json and rank == 0:
        with open(a.json, "w") as fh:
            json.dump(dict(world_size=ws, gpu=gpu,
                           torch=torch.__version__, maco=maco.__version__, tokens=a.tokens,
                           batch=a.batch, chunks=a.chunks, comm_sms=a.comm_sms, rows=rows,
                           failures=failures, time=time.strftime("%Y-%m-%d %H:%M:%S")),
                      fh, indent=1)
    comm.barrier()
    for f_ in failures:
        log(f"FAIL {f_}")
    log(("FAIL" if failures else "PASS") + f" bench_tp_layer TP {ws}")
    maco.finalize()
    dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
