"""A tensor-parallel, sequence-parallel MLP block on maco.tp, with a Chrome trace:

    torchrun --nproc-per-node 2 python-bindings/examples/tp_mlp.py [--tokens 4096] [--trace t.json]

Each rank holds 1/world_size of the tokens (sequence parallel) and 1/world_size of the MLP's
columns of W_up and rows of W_down (tensor parallel), as Megatron-LM's sequence-parallel MLP:

    h = allgather(x) @ W_up        maco.tp.allgather_gemm        (tokens, ffn / ws)
    a = gelu(h)                    torch
    y = reduce_scatter(a @ W_down) maco.tp.gemm_reduce_scatter   (tokens / ws, hidden)

The output is checked against the same block computed on one GPU from every rank's shards
(gathered through the communicator) and the step time is printed against the same block with
NCCL collectives in sequence (torch.distributed on the NCCL backend). --trace writes rank 0's
torch.profiler Chrome trace of one step: the GEMMs on the compute stream, the copy-engine
transfers (Memcpy PtoP) on maco.tp's communication stream beside them.
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F

import maco

p = argparse.ArgumentParser()
p.add_argument("--tokens", type=int, default=4096, help="tokens, all ranks together")
p.add_argument("--hidden", type=int, default=8192)
p.add_argument("--ffn", type=int, default=28672, help="MLP width before the split")
p.add_argument("--iters", type=int, default=20)
p.add_argument("--trace", help="Chrome trace of one step (rank 0)")
a = p.parse_args()

rank, ws = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())
dist.init_process_group("nccl", device_id=dev)
comm = maco.Communicator.from_process_group(dist.group.WORLD, device=dev)
if a.tokens % ws or a.ffn % ws:
    raise SystemExit(f"--tokens {a.tokens} and --ffn {a.ffn} must be multiples of {ws}")

torch.manual_seed(1234 + rank)
scale = a.hidden ** -0.5
x = (torch.randn(a.tokens // ws, a.hidden, device=dev) * 0.5).to(torch.bfloat16)
w_up = (torch.randn(a.hidden, a.ffn // ws, device=dev) * scale).to(torch.bfloat16)
w_down = (torch.randn(a.ffn // ws, a.hidden, device=dev) * (a.ffn ** -0.5)).to(torch.bfloat16)


def block_maco(x):
    h = maco.tp.allgather_gemm(x, w_up, comm)
    return maco.tp.gemm_reduce_scatter(F.gelu(h), w_down, comm)


def block_nccl(x):
    full = torch.empty(a.tokens, a.hidden, dtype=x.dtype, device=dev)
    dist.all_gather_into_tensor(full, x)
    partial = F.gelu(full @ w_up) @ w_down
    y = torch.empty(a.tokens // ws, a.hidden, dtype=x.dtype, device=dev)
    dist.reduce_scatter_tensor(y, partial)
    return y


def step_ms(fn):
    for _ in range(3):
        fn(x)
    torch.cuda.synchronize()
    dist.barrier()
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(a.iters):
        fn(x)
    e.record()
    torch.cuda.synchronize()
    t = torch.tensor([s.elapsed_time(e) / a.iters], device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


# Check: every rank's shards gathered, the block computed on one GPU in fp32.
y = block_maco(x)
xs = comm.allgather(x)                                   # (ws, tokens / ws, hidden)
ups = comm.allgather(w_up)                               # (ws, hidden, ffn / ws)
downs = comm.allgather(w_down)                           # (ws, ffn / ws, hidden)
xf = xs.reshape(a.tokens, a.hidden).float()
ref = sum(F.gelu((xf @ ups[r].float()).to(torch.bfloat16).float()).to(torch.bfloat16).float()
          @ downs[r].float() for r in range(ws))
ref = ref[rank * (a.tokens // ws):(rank + 1) * (a.tokens // ws)]
err = ((y.float() - ref).norm() / ref.norm()).item()
ok = err < 2 ** -6  # bf16 rounding of the products and of the activation

t_maco, t_nccl = step_ms(block_maco), step_ms(block_nccl)
if a.trace:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        block_maco(x)
        torch.cuda.synchronize()
    if rank == 0:
        prof.export_chrome_trace(a.trace)
if rank == 0:
    print(f"tp_mlp: {ws} ranks, {a.tokens} tokens, hidden {a.hidden}, ffn {a.ffn}: "
          f"maco.tp {t_maco:.3f} ms, NCCL in sequence {t_nccl:.3f} ms ({t_nccl / t_maco:.2f}x); "
          f"relative error against one GPU {err:.2e}: {'PASS' if ok else 'FAIL'}", flush=True)
maco.tp.release_workspaces(comm)
comm.close()
dist.destroy_process_group()
raise SystemExit(0 if ok else 1)
