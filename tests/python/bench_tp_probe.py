"""Host and GPU time of one maco.tp call, eager and captured in a CUDA graph, per method, chunk
count and world size: where the time of the copy-engine path goes. A benchmark, not a test.

    torchrun --nproc-per-node 4 tests/python/bench_tp_probe.py [--sizes 128,4096,8192]
        [--gemm-k 2048] [--gemm-n 8192] [--iters 20] [--no-graph] [--lines seq,ce,sm]

For each M: the GEMM alone, then gemm_allreduce ("seq"; "ce" with 1, 2 and 4 chunks, both the
reduce-scatter + allgather form and the one-step form), allgather_gemm ("seq"; "ce" with 1 and
2 chunks) and gemm_reduce_scatter ("seq"; "ce" with 1 chunk), bf16. --lines sm adds
gemm_allreduce and allgather_gemm as an SM pipeline, written here (not a maco.tp method): the
GEMM of row chunk i on the current stream while MACO's collective of chunk i - 1 runs on a
side stream, its CTAs capped (--sm-chunks x --sm-ctas). Per line, rank 0's host time per call
(enqueueing, us) and GPU time per call (CUDA events around the calls, us), then every rank's
"host/gpu". Eager calls whose host time exceeds the GPU time are bound by Python's launches;
the GRAPH lines show the same calls without it. Inputs are small integers; only the sm lines
are checked here (against "seq", " WRONG" appended on a mismatch): tests/python/gpu_tp.py
checks maco.tp.
"""

import argparse
import os
import time

import torch
import torch.distributed as dist

import maco
from maco import tp


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="128,4096,8192", help="M values")
    p.add_argument("--gemm-k", type=int, default=2048, help="K of x @ w (per rank)")
    p.add_argument("--gemm-n", type=int, default=8192, help="N of x @ w")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-graph", action="store_true", help="leave out the CUDA graph lines")
    p.add_argument("--lines", default="seq,ce,sm",
                   help="which paths: seq, ce (copy engines), sm (GEMM chunks on the current "
                        "stream, MACO's collective of each on a side stream, CTAs capped)")
    p.add_argument("--sm-chunks", default="2,4,8", help="the sm lines' chunk counts")
    p.add_argument("--sm-ctas", default="0,16,32", help="the sm lines' CTA caps (0: none)")
    a = p.parse_args()
    rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)))
    dev = torch.device("cuda", torch.cuda.current_device())
    dist.init_process_group("gloo")
    comm = maco.Communicator.from_process_group(dist.group.WORLD, device=dev)

    def timeit(name, fn):
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        comm.barrier()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        t0 = time.perf_counter()
        s.record()
        for _ in range(a.iters):
            fn()
        e.record()
        host = (time.perf_counter() - t0) / a.iters * 1e6
        torch.cuda.synchronize()
        gpu = s.elapsed_time(e) / a.iters * 1e3
        every = comm.allgather_bytes(f"{host:.0f}/{gpu:.0f}".encode().ljust(16))
        if rank == 0:
            print(f"{name:44s} host {host:8.1f} us  gpu {gpu:8.1f} us   ranks host/gpu: "
                  f"{[x.decode().strip() for x in every]}", flush=True)

    def graphed(fn):
        fn()
        torch.cuda.synchronize()
        comm.barrier()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        return g.replay

    def both(name, fn):
        timeit(name, fn)
        if not a.no_graph:
            timeit(name + " GRAPH", graphed(fn))

    if rank == 0:
        print(f"bench_tp_probe: {ws} ranks on {torch.cuda.get_device_name(dev)}, K {a.gemm_k}, "
              f"N {a.gemm_n}, bf16, {a.iters} calls per line", flush=True)
    split0 = tp._AR_SPLIT_MIN_RANKS
    lines = set(a.lines.split(","))
    side = torch.cuda.Stream(device=dev, priority=-1)
    sm_chunks = [int(v) for v in a.sm_chunks.split(",") if v]
    sm_ctas = [int(v) for v in a.sm_ctas.split(",") if v]

    def sm_allreduce(x, w, out, ch):
        # GEMM of row chunk i on the current stream; its allreduce (in place) on the side
        # stream while the GEMM of chunk i + 1 computes.
        cur = torch.cuda.current_stream()
        b = [x.shape[0] * i // ch for i in range(ch + 1)]
        side.wait_stream(cur)
        for i in range(ch):
            torch.matmul(x[b[i]:b[i + 1]], w, out=out[b[i]:b[i + 1]])
            side.wait_stream(cur)
            comm.allreduce(out[b[i]:b[i + 1]], stream=side)
        cur.wait_stream(side)

    def sm_allgather(xs, w, out, gath, tmp, ch):
        # Chunk j: every rank's rows [b_j, b_j+1) gathered on the side stream into gath
        # ([ws, c, K] at the chunk's offset), multiplied on the current stream as soon as its
        # gather is done, the product's rows copied to their places in out (rank r's rows
        # r s + b_j ...).
        cur = torch.cuda.current_stream()
        s = xs.shape[0]
        b = [s * i // ch for i in range(ch + 1)]
        side.wait_stream(cur)
        done = []
        for j in range(ch):
            g = gath[ws * b[j]: ws * b[j + 1]]
            comm.allgather(xs[b[j]:b[j + 1]], g, stream=side)
            e = torch.cuda.Event()
            e.record(side)
            done.append(e)
        for j in range(ch):
            c = b[j + 1] - b[j]
            cur.wait_event(done[j])
            t = tmp[ws * b[j]: ws * b[j + 1]]
            torch.matmul(gath[ws * b[j]: ws * b[j + 1]], w, out=t)
            out.view(ws, s, -1)[:, b[j]:b[j + 1]].copy_(t.view(ws, c, -1))

    def sm_lines(name, out, ref, run):
        # Every CTA cap x chunk count: one checked call (out poisoned first; small-integer
        # inputs make the result exact, so it must equal "seq"'s bit for bit), then timed.
        cap0 = comm.max_ctas
        for ctas in sm_ctas:
            comm.set_max_ctas(ctas)  # collective: every rank runs the same lines
            for ch in sm_chunks:
                out.fill_(float("nan"))
                run(ch)
                ok = bool(torch.equal(out, ref))
                both(f"{name} chunks={ch} ctas={ctas}{'' if ok else ' WRONG'}",
                     lambda: run(ch))
        comm.set_max_ctas(cap0)

    for m in (int(x) for x in a.sizes.split(",") if x):
        x = torch.randint(-2, 3, (m, a.gemm_k), device=dev).to(torch.bfloat16)
        w = torch.randint(-2, 3, (a.gemm_k, a.gemm_n), device=dev).to(torch.bfloat16)
        out = torch.empty(m, a.gemm_n, device=dev, dtype=torch.bfloat16)
        timeit(f"GEMM {m}x{a.gemm_k}x{a.gemm_n}", lambda: torch.matmul(x, w, out=out))
        for method, ch in (("seq", None), ("ce", 1), ("ce", 2), ("ce", 4)):
            if method not in lines:
                continue
            for split in ((split0,) if method == "seq" or ws == 1 else (min(3, ws), ws + 1)):
                tp._AR_SPLIT_MIN_RANKS = split
                form = "" if method == "seq" else " rs+ag" if ws >= split else " one-step"
                both(f"allreduce {method} M={m} chunks={ch}{form}",
                     lambda: tp.gemm_allreduce(x, w, comm, out=out, chunks=ch, method=method))
        tp._AR_SPLIT_MIN_RANKS = split0
        if "sm" in lines:
            ref = torch.empty_like(out)
            tp.gemm_allreduce(x, w, comm, out=ref, method="seq")
            sm_lines(f"allreduce sm M={m}", out, ref, lambda ch: sm_allreduce(x, w, out, ch))
        s = m // ws
        xs = x[:s].contiguous()
        for method, ch in (("seq", None), ("ce", 1), ("ce", 2)):
            if method not in lines:
                continue
            both(f"allgather {method} M={m} chunks={ch}",
                 lambda: tp.allgather_gemm(xs, w, comm, out=out, chunks=ch, method=method))
        if "sm" in lines:
            gath = torch.empty(m, a.gemm_k, device=dev, dtype=torch.bfloat16)
            tmp = torch.empty(m, a.gemm_n, device=dev, dtype=torch.bfloat16)
            ref = torch.empty_like(out)
            tp.allgather_gemm(xs, w, comm, out=ref, method="seq")
            sm_lines(f"allgather sm M={m}", out, ref,
                     lambda ch: sm_allgather(xs, w, out, gath, tmp, ch))
        rs_out = torch.empty(s, a.gemm_n, device=dev, dtype=torch.bfloat16)
        for method, ch in (("seq", None), ("ce", 1)):
            if method not in lines:
                continue
            both(f"reduce-scatter {method} M={m} chunks={ch}",
                 lambda: tp.gemm_reduce_scatter(x, w, comm, out=rs_out, chunks=ch,
                                                method=method))
    comm.barrier()
    torch.cuda.synchronize()
    tp.release_workspaces(comm)
    comm.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
