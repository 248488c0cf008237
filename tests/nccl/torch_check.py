"""PyTorch, unmodified, on MACO's libnccl.so.2: every collective PyTorch's NCCL backend uses,
checked against values computed on the CPU from every rank's inputs.

    LD_PRELOAD=build/nccl/libmaco_nccl.so torchrun --nproc-per-node 4 tests/nccl/torch_check.py

(ranks sharing one GPU need an MPS server: `maco-run -n 1 --mps on -- torchrun ...` starts one).
Proves where the calls ran with the library's counters (maco_nccl_call_count): every counted
call on MACO, none forwarded to NCCL. Exit status 0 when every check passed.
"""
import ctypes
import os
import sys

import torch
import torch.distributed as dist

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
local = int(os.environ.get("LOCAL_RANK", rank))
torch.cuda.set_device(local % torch.cuda.device_count())
dev = torch.device("cuda", torch.cuda.current_device())
dist.init_process_group("nccl", device_id=dev)
failures = []
step = [0]


def inputs(shape, dtype, kind="sum"):
    """Every rank's input of the next call (the same generator on every rank)."""
    step[0] += 1
    out = []
    for r in range(world):
        g = torch.Generator().manual_seed(step[0] * 1009 + r)
        if kind == "prod":
            t = torch.randint(1, 3, shape, generator=g)
        else:
            t = torch.randint(-8, 9, shape, generator=g)
        out.append(t.to(dtype))
    return out


def check(name, got, want, dtype):
    tol = {torch.bfloat16: 1 / 64, torch.float16: 1 / 512}.get(dtype, 1e-6)
    got = got.detach().cpu().double()
    want = want.to(dtype).double()
    bad = (got - want).abs() > tol * want.abs().clamp(min=1)
    if bad.any():
        i = int(bad.nonzero()[0][0]) if bad.dim() else 0
        failures.append(f"{name}: {int(bad.sum())} wrong, first at {i}: {got.flatten()[i]} vs {want.flatten()[i]}")


def stack(xs):
    return torch.stack([x.double() for x in xs])


n = 1000 * world + 7
for dtype in (torch.bfloat16, torch.float16, torch.float32):
    for op, opname in ((dist.ReduceOp.SUM, "sum"), (dist.ReduceOp.AVG, "avg"), (dist.ReduceOp.MAX, "max")):
        xs = inputs((n,), dtype)
        t = xs[rank].to(dev)
        dist.all_reduce(t, op=op)
        s = stack(xs)
        want = {"sum": s.sum(0), "avg": s.mean(0), "max": s.max(0).values}[opname]
        check(f"all_reduce {opname} {dtype}", t, want, dtype)

dtype = torch.float32
xs = inputs((n,), dtype)
out = torch.empty(world * n, dtype=dtype, device=dev)
dist.all_gather_into_tensor(out, xs[rank].to(dev))
check("all_gather_into_tensor", out, torch.cat(xs), dtype)

xs = inputs((world * 513,), dtype)
out = torch.empty(513, dtype=dtype, device=dev)
dist.reduce_scatter_tensor(out, xs[rank].to(dev))
check("reduce_scatter_tensor", out, stack(xs).sum(0)[rank * 513:(rank + 1) * 513], dtype)

root = step[0] % world
xs = inputs((n,), dtype)
t = xs[rank].to(dev)
dist.broadcast(t, src=root)
check("broadcast", t, xs[root], dtype)

xs = inputs((n,), dtype)
t = xs[rank].to(dev)
dist.reduce(t, dst=root)
if rank == root:
    check("reduce", t, stack(xs).sum(0), dtype)

# all_to_all_single, even and uneven splits
xs = inputs((world * 300,), dtype)
out = torch.empty(world * 300, dtype=dtype, device=dev)
dist.all_to_all_single(out, xs[rank].to(dev))
check("all_to_all_single even", out, torch.cat([xs[q][rank * 300:(rank + 1) * 300] for q in range(world)]), dtype)


def split(a, b):
    return (a + 2 * b) % 4 * 50 + 1  # elements rank a sends to rank b


ins = [split(rank, q) for q in range(world)]
outs = [split(q, rank) for q in range(world)]
step[0] += 1
full = []
for r in range(world):
    g = torch.Generator().manual_seed(step[0] * 1009 + r)
    full.append(torch.randint(-8, 9, (sum(split(r, q) for q in range(world)),), generator=g).to(dtype))
out = torch.empty(sum(outs), dtype=dtype, device=dev)
dist.all_to_all_single(out, full[rank].to(dev), output_split_sizes=outs, input_split_sizes=ins)
want = []
for q in range(world):
    off = sum(split(q, p) for p in range(rank))
    want.append(full[q][off:off + split(q, rank)])
check("all_to_all_single uneven", out, torch.cat(want), dtype)

# send/recv around the ring (even ranks send first), then batch_isend_irecv both ways
xs = inputs((4099,), dtype)
nxt, prv = (rank + 1) % world, (rank - 1) % world
buf = torch.empty(4099, dtype=dtype, device=dev)
if rank % 2 == 0:
    dist.send(xs[rank].to(dev), nxt)
    dist.recv(buf, prv)
else:
    dist.recv(buf, prv)
    dist.send(xs[rank].to(dev), nxt)
check("send/recv ring", buf, xs[prv], dtype)

xs = inputs((70000,), dtype)
a = torch.empty(70000, dtype=dtype, device=dev)
b = torch.empty(70000, dtype=dtype, device=dev)
mine = xs[rank].to(dev)
reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, mine, nxt), dist.P2POp(dist.irecv, a, prv),
                               dist.P2POp(dist.isend, mine, prv), dist.P2POp(dist.irecv, b, nxt)])
for r in reqs:
    r.wait()
check("batch_isend_irecv from prev", a, xs[prv], dtype)
check("batch_isend_irecv from next", b, xs[nxt], dtype)

dist.barrier()

# new_group and split_group
low = list(range(0, (world + 1) // 2))
grp_low = dist.new_group(low)
grp_high = dist.new_group(list(range((world + 1) // 2, world)))
mine_grp, members = (grp_low, low) if rank in low else (grp_high, [r for r in range(world) if r not in low])
xs = inputs((333,), dtype)
t = xs[rank].to(dev)
dist.all_reduce(t, group=mine_grp)
check("new_group all_reduce", t, stack([xs[r] for r in members]).sum(0), dtype)
try:
    from torch.distributed import split_group
except ImportError:
    split_group = None
if split_group is not None:
    evens = [r for r in range(world) if r % 2 == 0]
    odds = [r for r in range(world) if r % 2 == 1]
    sg = split_group(split_ranks=[evens, odds] if odds else [evens])
    members = evens if rank % 2 == 0 else odds
    xs = inputs((555,), dtype)
    t = xs[rank].to(dev)
    dist.all_reduce(t, group=sg)
    check("split_group all_reduce", t, stack([xs[r] for r in members]).sum(0), dtype)
else:
    print(f"rank {rank}: torch.distributed.split_group not in this PyTorch; skipped")

# CUDA graph capture of an all_reduce, replayed with new inputs
static = torch.zeros(2048, dtype=dtype, device=dev)
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):
    dist.all_reduce(static)  # warm-up outside the capture
torch.cuda.current_stream().wait_stream(s)
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph):
    dist.all_reduce(static)
for k in range(3):
    xs = inputs((2048,), dtype)
    static.copy_(xs[rank].to(dev))
    graph.replay()
    torch.cuda.synchronize()
    check(f"graph replay {k}", static, stack(xs).sum(0), dtype)

torch.cuda.synchronize()
dist.barrier()

# Where the calls ran: MACO's counters (LD_PRELOAD puts them in the global scope).
lib = ctypes.CDLL(None)
try:
    count = lib.maco_nccl_call_count
except AttributeError:
    count = None
    failures.append("the libnccl.so.2 loaded is not MACO's (no maco_nccl_call_count)")
if count is not None:
    count.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_uint64)]
    line = []
    for name in ("ncclAllReduce", "ncclAllGather", "ncclReduceScatter", "ncclBroadcast", "ncclReduce",
                 "ncclSend", "ncclRecv", "ncclCommInitRank", "ncclCommSplit"):
        a, f = ctypes.c_uint64(), ctypes.c_uint64()
        count(name.encode(), ctypes.byref(a), ctypes.byref(f))
        line.append(f"{name} {a.value}/{f.value}")
        if f.value != 0:
            failures.append(f"{name}: {f.value} calls went to the real NCCL")
        if a.value == 0 and name not in ("ncclCommSplit",):
            failures.append(f"{name}: no call ran on MACO")
    print(f"rank {rank}: calls on MACO/forwarded: " + ", ".join(line))
print(f"rank {rank}: torch {torch.__version__}, NCCL version reported {torch.cuda.nccl.version()}")
dist.destroy_process_group()
if failures:
    for f in failures:
        print(f"rank {rank}: FAIL {f}")
    sys.exit(1)
print(f"rank {rank}: PASS")
