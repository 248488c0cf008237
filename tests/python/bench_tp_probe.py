"""Host and GPU time of one maco.tp call, eager and captured in a CUDA graph, per method, chunk
count and world size: where the time of the copy-engine path goes. A benchmark, not a test.

    torchrun --nproc-per-node 4 tests/python/bench_tp_probe.py [--sizes 128,4096,8192]
        [--k 2048] [--n 8192] [--iters 20] [--no-graph]

For each M: the GEMM alone, then gemm_allreduce ("seq"; "ce" with 1, 2 and 4 chunks, both the
reduce-scatter + allgather form and the one-step form), allgather_gemm ("seq"; "ce" with 1 and
2 chunks) and gemm_reduce_scatter ("seq"; "ce" with 1 chunk), bf16. Per line, rank 0's host time
per call (enqueueing, us) and GPU time per call (CUDA events around the calls, us), then every
rank's "host/gpu". Eager calls whose host time exceeds the GPU time are bound by Python's
launches; the GRAPH lines show the same calls without it. Inputs are small integers (the
results are not checked here: tests/python/gpu_tp.py does).
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
    p.add_argument("--k", type=int, default=2048, help="K of x @ w (per rank)")
    p.add_argument("--n", type=int, default=8192, help="N of x @ w")
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--no-graph", action="store_true", help="leave out the CUDA graph lines")
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
        print(f"bench_tp_probe: {ws} ranks on {torch.cuda.get_device_name(dev)}, K {a.k}, N {a.n}, "
              f"bf16, {a.iters} calls per line", flush=True)
    split0 = tp._AR_SPLIT_MIN_RANKS
    for m in (int(x) for x in a.sizes.split(",") if x):
        x = torch.randint(-2, 3, (m, a.k), device=dev).to(torch.bfloat16)
        w = torch.randint(-2, 3, (a.k, a.n), device=dev).to(torch.bfloat16)
        out = torch.empty(m, a.n, device=dev, dtype=torch.bfloat16)
        timeit(f"GEMM {m}x{a.k}x{a.n}", lambda: torch.matmul(x, w, out=out))
        for method, ch in (("seq", None), ("ce", 1), ("ce", 2), ("ce", 4)):
            for split in ((split0,) if method == "seq" or ws == 1 else (min(3, ws), ws + 1)):
                tp._AR_SPLIT_MIN_RANKS = split
                form = "" if method == "seq" else " rs+ag" if ws >= split else " one-step"
                both(f"allreduce {method} M={m} chunks={ch}{form}",
                     lambda: tp.gemm_allreduce(x, w, comm, out=out, chunks=ch, method=method))
        tp._AR_SPLIT_MIN_RANKS = split0
        s = m // ws
        xs = x[:s].contiguous()
        for method, ch in (("seq", None), ("ce", 1), ("ce", 2)):
            both(f"allgather {method} M={m} chunks={ch}",
                 lambda: tp.allgather_gemm(xs, w, comm, out=out, chunks=ch, method=method))
        rs_out = torch.empty(s, a.n, device=dev, dtype=torch.bfloat16)
        for method, ch in (("seq", None), ("ce", 1)):
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
