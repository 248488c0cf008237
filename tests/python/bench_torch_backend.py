"""Benchmark (not a test): host-side cost of one small dist.all_reduce through a
torch.distributed backend, and where the maco backend's time goes.

    torchrun --nproc-per-node 1 tests/python/bench_torch_backend.py maco
    torchrun --nproc-per-node 1 tests/python/bench_torch_backend.py nccl

One rank keeps the GPU out of the way (an 8 KiB all_reduce of one rank is a copy at most), so
the numbers are the host's: per call, eager, CALLS calls then one synchronize. For maco it also
times the pieces of one call and prints cProfile's top entries."""

import cProfile
import os
import pstats
import sys
import time

import torch
import torch.distributed as dist

backend = sys.argv[1] if len(sys.argv) > 1 else "maco"
if backend == "maco":
    import maco.torch as mt  # noqa: F401 - registers the backend

CALLS = int(os.environ.get("BENCH_CALLS", "2000"))
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
dist.init_process_group(backend)
R, N = dist.get_rank(), dist.get_world_size()
x = torch.ones(2048, device="cuda")


def per_call(fn, calls=CALLS):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / calls * 1e6


print(f"BENCH {backend} rank {R}/{N}: dist.all_reduce 8 KiB float32: "
      f"{per_call(lambda: dist.all_reduce(x)):.1f} us per call", flush=True)
print(f"BENCH {backend} rank {R}/{N}: dist.all_reduce async_op + wait: "
      f"{per_call(lambda: dist.all_reduce(x, async_op=True).wait()):.1f} us per call", flush=True)

if backend == "maco":
    pg = dist.group.WORLD
    comm = pg.comm
    cur = torch.cuda.current_stream()
    s = pg._stream(x.device)
    opts = dist.AllreduceOptions()
    ev = torch.cuda.Event()
    parts = {
        "pg.allreduce([x]) + work.wait()": lambda: pg.allreduce([x], opts).wait(),
        "pg.allreduce([x]) (no wait)": lambda: pg.allreduce([x], opts),
        "comm.allreduce(x, stream=s)": lambda: comm.allreduce(x, stream=s),
        "comm._c.allreduce (extension)": lambda: comm._c.allreduce(
            x.data_ptr(), x.data_ptr(), 2048, 8, 0, s.cuda_stream),
        "s.wait_stream(cur)": lambda: s.wait_stream(cur),
        "torch.cuda.Event() + record(s)": lambda: torch.cuda.Event().record(s),
        "ev.record(s)": lambda: ev.record(s),
        "cur.wait_event(ev)": lambda: cur.wait_event(ev),
        "torch.cuda.current_stream()": lambda: torch.cuda.current_stream(x.device),
        "x.record_stream(s)": lambda: x.record_stream(s),
        "MacoWork(...)": lambda: mt.MacoWork([x], ev, comm, x.device),
        "comm.check_async_error()": lambda: comm.check_async_error(),
    }
    for name, fn in parts.items():
        print(f"BENCH maco part: {name}: {per_call(fn):.2f} us", flush=True)
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(500):
        dist.all_reduce(x)
    prof.disable()
    torch.cuda.synchronize()
    st = pstats.Stats(prof)
    st.sort_stats("tottime").print_stats(18)
dist.destroy_process_group()
