"""Benchmark of maco.Context (Level 2): a GEMM, an allreduce of its output, and a second GEMM,
run one after the other on one stream against the Context's overlap (the allreduce on comm_sms
CTAs beside the second GEMM in a green context of compute_sms SMs). One process per rank:

    maco-run -n 2 python3 tests/python/bench_context.py [M] [comm_sms]

Prints per-phase times (ms, CUDA events, median of 20) and the overlap: the share of the shorter
of (allreduce, second GEMM) hidden, (serial - overlapped) / min(allreduce, GEMM). Ranks that share
one GPU compete for its SMs, so numbers from such runs describe that setting only."""

import statistics
import sys

import torch

import maco

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
SMS = torch.cuda.get_device_properties(DEV).multi_processor_count
M = int(sys.argv[1]) if len(sys.argv) > 1 else 4096
COMM_SMS = int(sys.argv[2]) if len(sys.argv) > 2 else 16
REPS = 20

x = torch.randn(M, M, device=DEV, dtype=torch.bfloat16)
w1 = torch.randn(M, M, device=DEV, dtype=torch.bfloat16)
w2 = torch.randn(M, M, device=DEV, dtype=torch.bfloat16)


def timed(fn):
    times = []
    for i in range(REPS + 3):
        comm.barrier()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        if i >= 3:
            times.append(a.elapsed_time(b))
    return statistics.median(times)


y = torch.matmul(x, w1)
t_gemm = timed(lambda: torch.matmul(x, w2))
t_ar = timed(lambda: comm.allreduce(y))
t_serial = timed(lambda: (comm.allreduce(torch.matmul(x, w1)), torch.matmul(x, w2)))
ctx = maco.Context(comm, compute_sms=(SMS - COMM_SMS) // 8 * 8, comm_sms=COMM_SMS)
t_gemm_ctx = timed(lambda: ctx.compute(lambda: torch.matmul(x, w2)))
t_ar_ctx = timed(lambda: ctx.allreduce(y))


def overlapped():
    y1 = ctx.compute(lambda: torch.matmul(x, w1))
    work = ctx.allreduce(y1, async_op=True)
    ctx.compute(lambda: torch.matmul(x, w2))
    work.wait()


t_ctx = timed(overlapped)
hidden = (t_serial - t_ctx) / min(t_ar_ctx, t_gemm_ctx)
print(f"rank {R}/{N} {torch.cuda.get_device_name(DEV)} M={M} bf16 allreduce {M * M * 2 >> 20} MiB "
      f"comm_sms={COMM_SMS} compute_sms={ctx.compute_sms} green={ctx.compute_sms_enforced}: "
      f"gemm {t_gemm:.3f} ms (in ctx {t_gemm_ctx:.3f}), allreduce {t_ar:.3f} ms (capped "
      f"{t_ar_ctx:.3f}), serial gemm+allreduce+gemm {t_serial:.3f} ms, Context overlapped "
      f"{t_ctx:.3f} ms, hidden {100 * hidden:.0f}% of min(allreduce, gemm)", flush=True)
ctx.close()
