"""GPU check of MACO under torch.distributed, one process per rank, started by torchrun:

    torchrun --nproc-per-node 4 tests/python/gpu_torch_backend.py backend
    torchrun --nproc-per-node 4 tests/python/gpu_torch_backend.py init-then-set
    torchrun --nproc-per-node 4 tests/python/gpu_torch_backend.py device-id
    torchrun --nproc-per-node 4 tests/python/gpu_torch_backend.py patch

'backend': torch.cuda.set_device(LOCAL_RANK), then init_process_group("maco"), and every
collective through torch.distributed (sync and async_op, a CUDA graph capture).
'init-then-set': init_process_group("maco") first, then set_device (the group binds to the
device of its first collective's tensors). 'device-id': init_process_group("maco",
device_id=cuda:LOCAL_RANK) with no set_device before (the communicator is made during init on
that GPU; the first collectives run before set_device too). In these three, with more than
one GPU, a tensor on another GPU than the bound one must raise ValueError naming both devices
and the rank (and the group goes on working). 'patch': init_process_group("nccl") and
maco.patch_torch_distributed(), so the same calls run on MACO without NCCL ever creating a
communicator (NCCL refuses ranks that share a GPU). Ranks sharing one GPU need MPS: start
torchrun under `maco-run -n 1 --mps on` (this script ignores maco-run's own MACO_* job
variables). Fresh random data, outputs poisoned first; prints 'PASS ...'."""

import os
import sys
import time

for k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_LOCAL_RANK", "MACO_BOOTSTRAP_ADDR",
          "MACO_BOOTSTRAP_NONCE"):
    os.environ.pop(k, None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import maco  # noqa: E402
import maco.torch as mt  # noqa: E402

MODES = ("backend", "init-then-set", "device-id", "patch")
mode = sys.argv[1] if len(sys.argv) > 1 else "backend"
if mode not in MODES:
    sys.exit(f"mode: {mode!r} is not one of {MODES}")
local_rank = int(os.environ["LOCAL_RANK"])
ngpu = torch.cuda.device_count()
dev = torch.device("cuda", local_rank % ngpu)
failures = []
binding = []  # what the binding checks saw, for the PASS line


def expect(cond, what):
    """A binding check: records a failure and goes on."""
    if not cond:
        failures.append(what)


if mode in ("backend", "patch"):
    torch.cuda.set_device(dev)
if mode == "patch":
    dist.init_process_group("nccl")
    maco.patch_torch_distributed()
else:
    if mode == "device-id":
        before = torch.cuda.current_device()
        dist.init_process_group("maco", device_id=dev)
        expect(torch.cuda.current_device() == before,
               f"init_process_group changed torch's current device from {before} to "
               f"{torch.cuda.current_device()}")
    else:
        dist.init_process_group("maco")
    pg = dist.group.WORLD
    assert isinstance(pg, mt.ProcessGroupMaco)
    assert dist.get_backend() == "maco"
    if mode == "device-id":
        expect(pg._comm is not None and pg.device == dev and pg.comm.device == dev.index,
               f"device_id={dev}: the communicator is on {pg.device} after init")
        expect(pg.bound_device_id == dev, f"bound_device_id is {pg.bound_device_id}, not {dev}")
        # Collectives before any set_device: the group makes its device current for MACO.
        x = torch.full((1000,), float(local_rank + 1), device=dev)
        dist.all_reduce(x)
        torch.cuda.synchronize(dev)
        nw = dist.get_world_size()
        expect(torch.equal(x.cpu(), torch.full((1000,), float(nw * (nw + 1) // 2))),
               f"all_reduce before set_device: got {x[:3].tolist()}")
        binding.append(f"device_id: made at init on {pg.device}")
    else:
        expect(pg._comm is None, "a communicator was made at init (expected at the first "
                                 "CUDA call)")
        if mode == "init-then-set":
            torch.cuda.set_device(dev)
    if mode != "device-id":
        x = torch.ones(3, device=dev)
        dist.all_reduce(x)  # binds the group to the tensor's device
        expect(pg.device == dev and pg.comm.device == dev.index,
               f"the first collective on {dev} bound the group to {pg.device}")
        expect(x.tolist() == [float(dist.get_world_size())] * 3,
               f"the first all_reduce: got {x.tolist()}")
        binding.append(f"{mode}: bound at the first collective to {pg.device}")
    torch.cuda.set_device(dev)  # the rest as a script does it (graphs, synchronize)
    if ngpu > 1:
        other = torch.device("cuda", (dev.index + 1) % ngpu)
        try:
            dist.all_reduce(torch.ones(8, device=other))
            failures.append(f"a tensor on {other} with the group on {dev}: no error")
        except ValueError as e:
            msg = str(e)
            for part in (f"rank {dist.get_rank()}", f"a tensor is on {other}",
                         f"bound to {dev}", "set_device", "device_id"):
                expect(part in msg, f"wrong-device error lacks {part!r}: {msg}")
            binding.append("wrong device refused")
dev = torch.device("cuda", torch.cuda.current_device())
R, N = dist.get_rank(), dist.get_world_size()
seed = torch.tensor([0], dtype=torch.int64)
checks = 0
gen = torch.Generator(device="cpu")
gen.manual_seed(int.from_bytes(os.urandom(4), "little") if R == 0 else 0)


def shared_seed():
    """One random seed for all ranks (broadcast through the store)."""
    store = dist.distributed_c10d._get_default_store()
    if R == 0:
        store.set("test_seed", str(int(torch.randint(0, 2**31, (1,), generator=gen))))
    return int(store.get("test_seed"))


SEED = shared_seed()


def data(rank, n, dtype=torch.float32, salt=0):
    g = torch.Generator(device="cpu")
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt * 104729 + n)
    return torch.randint(-3, 4, (n,), generator=g).to(dtype)


def check(name, got, want):
    """Records a wrong result and goes on (every rank keeps making the same calls)."""
    global checks
    checks += 1
    got = got.detach().cpu()
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)}, want {tuple(want.shape)}")
    elif not torch.equal(got, want.to(got.dtype)):
        bad = (got.reshape(-1).double() != want.reshape(-1).double()).nonzero()[:5].reshape(-1)
        failures.append(f"{name}: got {got.reshape(-1)[bad].tolist()} want "
                        f"{want.reshape(-1)[bad].tolist()} at {bad.tolist()}")


def poison(t):
    t.view(torch.uint8).fill_(0x5A)
    return t


start = time.time()
for n in (5, 4097, 300001):
    for dtype in (torch.float32, torch.bfloat16, torch.int32):
        ins = [data(r, n, dtype, 1) for r in range(N)]
        total = sum(i.double() for i in ins).to(dtype)
        # all_reduce, sync and async
        x = ins[R].to(dev)
        dist.all_reduce(x)
        check(f"all_reduce {dtype} {n}", x, total)
        x = ins[R].to(dev)
        w = dist.all_reduce(x, op=dist.ReduceOp.MAX, async_op=True)
        w.wait()
        check(f"all_reduce max async {dtype} {n}", x, torch.stack(ins).max(0).values)
        # all_gather_into_tensor and all_gather (list)
        out = poison(torch.empty(N * n, dtype=dtype, device=dev))
        dist.all_gather_into_tensor(out, ins[R].to(dev))
        check(f"all_gather_into_tensor {n}", out, torch.cat(ins))
        outs = [poison(torch.empty(n, dtype=dtype, device=dev)) for _ in range(N)]
        dist.all_gather(outs, ins[R].to(dev))
        check(f"all_gather {n}", torch.stack([o.cpu() for o in outs]), torch.stack(ins))
        # reduce_scatter_tensor and reduce_scatter (list)
        rs = [data(r, N * n, dtype, 2) for r in range(N)]
        rtot = sum(i.double() for i in rs).to(dtype)
        o = poison(torch.empty(n, dtype=dtype, device=dev))
        dist.reduce_scatter_tensor(o, rs[R].to(dev))
        check(f"reduce_scatter_tensor {n}", o, rtot[R * n:(R + 1) * n])
        o = poison(torch.empty(n, dtype=dtype, device=dev))
        dist.reduce_scatter(o, list(rs[R].to(dev).chunk(N)))
        check(f"reduce_scatter {n}", o, rtot[R * n:(R + 1) * n])
        # broadcast and reduce
        b = ins[R].to(dev)
        dist.broadcast(b, src=N - 1)
        check(f"broadcast {n}", b, ins[N - 1])
        rr = ins[R].to(dev)
        dist.reduce(rr, dst=0)
        if R == 0:
            check(f"reduce {n}", rr, total)
        # all_to_all_single, even and with splits; all_to_all (lists)
        a = [data(r, N * n, dtype, 3) for r in range(N)]
        ao = poison(torch.empty(N * n, dtype=dtype, device=dev))
        dist.all_to_all_single(ao, a[R].to(dev))
        check(f"all_to_all_single {n}", ao, torch.cat([a[q][R * n:(R + 1) * n] for q in range(N)]))
        if n < 1000:
            sp = [[(r + q) % 3 + 1 for q in range(N)] for r in range(N)]
            src = [data(r, sum(sp[r]), dtype, 4) for r in range(N)]
            osz = [sp[q][R] for q in range(N)]
            ao = poison(torch.empty(sum(osz), dtype=dtype, device=dev))
            dist.all_to_all_single(ao, src[R].to(dev), osz, sp[R])
            want = torch.cat([src[q][sum(sp[q][:R]):sum(sp[q][:R]) + sp[q][R]] for q in range(N)])
            check("all_to_all_single splits", ao, want)
            ol = [poison(torch.empty(2, dtype=dtype, device=dev)) for _ in range(N)]
            dist.all_to_all(ol, [torch.full((2,), float(R * 10 + q), device=dev).to(dtype)
                                 for q in range(N)])
            check("all_to_all lists", torch.stack([t.cpu() for t in ol]),
                  torch.tensor([[q * 10 + R] * 2 for q in range(N)]).to(dtype))

# send/recv between pairs (even ranks send first; backend only: the patch keeps torch's)
if mode != "patch" and N % 2 == 0:
    peer = R ^ 1
    mine = data(R, 1001, salt=5).to(dev)
    got = poison(torch.empty(1001, device=dev))
    if R % 2 == 0:
        dist.send(mine, peer)
        dist.recv(got, peer)
    else:
        dist.recv(got, peer)
        dist.send(mine, peer)
    check("send/recv", got, data(peer, 1001, salt=5))

# rings of isend/irecv and batch_isend_irecv, gather and scatter (backend only): the
# backend queues sends and receives and issues them as one group at the first wait
if mode != "patch":
    right, left = (R + 1) % N, (R - 1) % N
    for n in (1, 4097, 65537):
        mine = data(R, n, salt=20).to(dev)
        got = poison(torch.empty(n, device=dev))
        reqs = [dist.isend(mine, right), dist.irecv(got, left)]
        for q in reqs:
            q.wait()
        check(f"isend/irecv ring {n}", got, data(left, n, salt=20))
        fwd, bwd = poison(torch.empty(n, device=dev)), poison(torch.empty(n, device=dev))
        ops = [dist.P2POp(dist.isend, mine, right), dist.P2POp(dist.irecv, fwd, left),
               dist.P2POp(dist.isend, mine, left), dist.P2POp(dist.irecv, bwd, right)]
        for q in dist.batch_isend_irecv(ops):
            q.wait()
        check(f"batch_isend_irecv forward {n}", fwd, data(left, n, salt=20))
        check(f"batch_isend_irecv backward {n}", bwd, data(right, n, salt=20))
    # a queued receive is issued before a later collective (stream order kept)
    got = poison(torch.empty(333, device=dev))
    w1 = dist.isend(data(R, 333, salt=21).to(dev), right)
    w2 = dist.irecv(got, left)
    y = data(R, 77, salt=22).to(dev)
    dist.all_reduce(y)
    w1.wait()
    w2.wait()
    check("isend/irecv then all_reduce: recv", got, data(left, 333, salt=21))
    check("isend/irecv then all_reduce: sum", y, sum(data(r, 77, salt=22) for r in range(N)))
    for root in (0, N - 1):
        for n in (5, 10007):
            mine = data(R, n, salt=23 + root).to(dev)
            outs = [poison(torch.empty(n, device=dev)) for _ in range(N)] if R == root else None
            dist.gather(mine, outs, dst=root)
            if R == root:
                check(f"gather root {root} {n}", torch.stack([o.cpu() for o in outs]),
                      torch.stack([data(r, n, salt=23 + root) for r in range(N)]))
            got = poison(torch.empty(n, device=dev))
            ins = ([data(100 + r, n, salt=24).to(dev) for r in range(N)] if R == root
                   else None)
            dist.scatter(got, ins, src=root)
            check(f"scatter root {root} {n}", got, data(100 + R, n, salt=24))

# DistributedDataParallel on the maco backend (its reducer calls the process group's
# allreduce directly and chains on work.get_future()): two steps of a small model, the
# gradients against the average of every rank's gradient computed locally
if mode != "patch":
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(SEED)
    net = torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.ReLU(), torch.nn.Linear(17, 5))
    ref = [torch.nn.Sequential(torch.nn.Linear(33, 17), torch.nn.ReLU(),
                               torch.nn.Linear(17, 5)).to(dev) for _ in range(N)]
    for m in ref:
        m.load_state_dict(net.state_dict())
    ddp = DDP(net.to(dev), device_ids=[dev.index], bucket_cap_mb=0.001)
    for step in range(2):
        xs = [data(r, 7 * 33, salt=30 + step).reshape(7, 33).to(dev) for r in range(N)]
        ddp.zero_grad(set_to_none=True)
        ddp(xs[R]).square().sum().backward()
        for r, m in enumerate(ref):
            m.zero_grad(set_to_none=True)
            m(xs[r]).square().sum().backward()
        for i, p in enumerate(ddp.module.parameters()):
            want = sum(list(m.parameters())[i].grad for m in ref) / N
            checks += 1
            if not torch.allclose(p.grad, want, rtol=1e-5, atol=1e-4):
                failures.append(f"DDP step {step} param {i}: max error "
                                f"{(p.grad - want).abs().max().item():.3g}")
        with torch.no_grad():  # the same SGD step everywhere, with DDP's gradients
            grads = [p.grad.clone() for p in ddp.module.parameters()]
            for m in [ddp.module] + ref:
                for p, g in zip(m.parameters(), grads):
                    p -= 0.01 * g

# Work.get_future() leaves the caller's current stream free, as NCCL's process group does
# (DDP's reducer takes a Future at every bucket): the group's stream is held by a GPU sleep
# of about 0.1 s; an event on the current stream after get_future() must complete long before
# it, and the Future's value, read on the current stream, must be the sum
if mode != "patch":
    fx = data(R, 4099, salt=40).to(dev)
    torch.cuda.synchronize()
    with torch.cuda.stream(pg._stream(dev)):
        torch.cuda._sleep(200_000_000)
    fut = dist.all_reduce(fx, async_op=True).get_future()
    free = torch.cuda.Event()
    free.record(torch.cuda.current_stream())
    t0 = time.monotonic()
    while not free.query() and time.monotonic() - t0 < 0.05:
        time.sleep(0.0005)
    checks += 1
    if not free.query():
        failures.append("get_future(): the current stream waited for the all_reduce")
    check("all_reduce get_future", fut.wait()[0], sum(data(r, 4099, salt=40) for r in range(N)))

# a CUDA graph of an all_reduce, captured through torch.distributed
gx = torch.zeros(2049, device=dev)
dist.all_reduce(gx)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    dist.all_reduce(gx)
for it in range(3):
    gin = [data(r, 2049, salt=10 + it) for r in range(N)]
    gx.copy_(gin[R].to(dev))
    g.replay()
    torch.cuda.synchronize()
    check(f"graph replay {it}", gx, sum(gin))

# host-side cost of a small dist.all_reduce on this backend (eager)
tx = torch.ones(2048, device=dev)
for _ in range(20):
    dist.all_reduce(tx)
torch.cuda.synchronize()
dist.barrier()
t0 = time.perf_counter()
for _ in range(300):
    dist.all_reduce(tx)
torch.cuda.synchronize()
print(f"TIME {mode} rank {R}/{N}: 8 KiB float32 dist.all_reduce eager: "
      f"{(time.perf_counter() - t0) / 300 * 1e6:.1f} us per call")
if mode != "patch":
    # the same through the group's communicator directly (what the backend adds is the rest)
    c = dist.group.WORLD.comm
    dist.barrier()
    t0 = time.perf_counter()
    for _ in range(300):
        c.allreduce(tx)
    torch.cuda.synchronize()
    print(f"TIME {mode} rank {R}/{N}: 8 KiB float32 Communicator.allreduce eager: "
          f"{(time.perf_counter() - t0) / 300 * 1e6:.1f} us per call")
dist.barrier()
if failures:
    for f in failures:
        print(f"FAIL rank {R}: {f}", flush=True)
    print(f"FAIL gpu_torch_backend {mode} rank {R}/{N}: {len(failures)} failures")
    sys.exit(1)
if mode == "patch":
    from maco import _routes

    assert _routes.patched_groups, "no group was routed through MACO"
    for m in _routes.patched_groups.values():
        m.comm.check_async_error()
else:
    dist.group.WORLD.comm.check_async_error()
print(f"PASS gpu_torch_backend {mode} rank {R}/{N}: {checks} checks in "
      f"{time.time() - start:.1f} s; {'; '.join(binding) or 'patched'}")
if mode == "patch":
    maco.unpatch_torch_distributed()
dist.destroy_process_group()
