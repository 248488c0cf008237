"""GPU check of maco.PersistentKernel and maco.profiler, one process per rank (maco-run):

    maco-run -n 2 python3 tests/python/gpu_persistent.py

Element-wise chains, GEMM tiles against torch.matmul, the fused GEMM + allreduce and allgather +
GEMM against the unfused result computed from every rank's inputs, a second launch on new
inputs, a CUDA graph of a launch, the three fused operations with fused_comm "sm",
"copy_engine" and "auto" (bitwise equal), the profile (summary, Chrome trace) and maco.profiler
around plain collectives. Fresh random inputs (one seed shared through the bootstrap), outputs
poisoned first; prints 'PASS gpu_persistent ...' (or 'SKIP ...' when the library has no GEMM tiles)."""

import json
import os
import sys
import tempfile
import time

import torch

import maco

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
SEED = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little")
failures = []
checks = 0


def gen(rank, salt):
    g = torch.Generator()
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt)
    return g


def ints(shape, rank, salt, dtype):
    """Small integers: exact in bf16 and in fp32 sums, so results can be compared exactly."""
    return torch.randint(-2, 3, shape, generator=gen(rank, salt)).to(dtype).to(DEV)


def check(name, got, want, exact=True):
    global checks
    checks += 1
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)} want {tuple(want.shape)}")
    elif exact and not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].tolist()
        failures.append(f"{name}: {(got != want).sum().item()} wrong, first at {bad}")
    elif not exact and not torch.allclose(got, want, rtol=1e-2, atol=1e-2):
        failures.append(f"{name}: max error {(got - want).abs().max().item():.3g}")


def poison(t):
    t.view(torch.uint8).fill_(0x7F)
    return t


start = time.time()

# 1. element-wise chain: y = 0.5 * x; z = y + w; u = z + 3 * x; v = copy(u)
n = 300_007
for dt in (torch.float32, torch.bfloat16):
    k = maco.PersistentKernel(comm)
    x = k.register_tensor(ints((n,), R, 1, dt), name="x")
    w = k.register_tensor(ints((n,), R, 2, dt), name="w")
    v = k.register_output((n,), dt, name="v")
    with k.task_graph() as g:
        y = g.scale(x, 0.5)
        z = g.add(y, w)
        u = g.residual_add(z, x, 3.0)
        g.copy(u, v)
    poison(v.tensor)
    k()
    torch.cuda.synchronize()
    check(f"elementwise {dt}", v.tensor, x.tensor.float() * 0.5 + w.tensor.float()
          + 3 * x.tensor.float())
    x.tensor.copy_(ints((n,), R, 3, dt))  # a second launch on new inputs
    poison(v.tensor)
    k()
    torch.cuda.synchronize()
    check(f"elementwise {dt} run 2", v.tensor, x.tensor.float() * 0.5 + w.tensor.float()
          + 3 * x.tensor.float())
    k.close()

# 2. GEMM tiles (needs a library built with cuBLASDx)
m, kk, nn = 256, 96, 384
a = ints((m, kk), R, 10, torch.bfloat16)
b = ints((kk, nn), R, 11, torch.bfloat16)
k = maco.PersistentKernel(comm, profile=True)
A, B = k.register_tensor(a, name="A"), k.register_tensor(b, name="B")
C = k.register_output((m, nn), torch.float32, name="C")
Cb = k.register_output((m, nn), torch.bfloat16, name="Cb")
with k.task_graph() as g:
    g.matmul(A, B, output=C, name="gemm_fp32")
    g.matmul(A, B, output=Cb, name="gemm_bf16")
try:
    k.compile()
except maco.UnsupportedError as e:
    print(f"SKIP gpu_persistent rank {R}/{N}: no GEMM tiles in this library: {e}")
    k.close()
    comm.close()
    sys.exit(0)
poison(C.tensor)
poison(Cb.tensor)
k()
torch.cuda.synchronize()
ref = a.float() @ b.float()
check("gemm fp32", C.tensor, ref)
check("gemm bf16", Cb.tensor, ref.to(torch.bfloat16))
summary = k.summary()
checks += 1
if "gemm_fp32" not in summary:
    failures.append(f"summary lacks the task names:\n{summary}")
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "trace.json")
    k.export_chrome_trace(path)
    with open(path) as f:
        trace = json.load(f)
    evs = trace["traceEvents"] if isinstance(trace, dict) else trace
    checks += 1
    if sum(1 for e in evs if e.get("ph") == "X") < k.num_tasks - 2:
        failures.append(f"trace: {len(evs)} events for {k.num_tasks} tasks")
prof = k.profile()
checks += 1
if len(prof) != k.num_tasks or any(e < s for s, e, _, _ in prof):
    failures.append(f"profile: {len(prof)} records for {k.num_tasks} tasks, or end < start")
k.close()

# 2b. GEMM tiles of both widths: for 3 workers, maco_gemm_plan_tiles makes 256 x 512 into three
# 128 x 256 tiles and, for the last round, two 128 x 128 ones.
m, kk, nn = 256, 160, 512
a = ints((m, kk), R, 12, torch.bfloat16)
b = ints((kk, nn), R, 13, torch.bfloat16)
plan = maco._maco.plan_gemm_tiles(m, nn, 3)
checks += 1
if sorted(t[2] for t in plan) != [128, 128, 256, 256, 256]:
    failures.append(f"plan for 3 workers: {plan}")
k = maco.PersistentKernel(comm, num_workers=3)
A, B = k.register_tensor(a, name="A"), k.register_tensor(b, name="B")
C = k.register_output((m, nn), torch.float32, name="C")
with k.task_graph() as g:
    g.matmul(A, B, output=C, name="gemm_wide")
k.compile()
poison(C.tensor)
k()
torch.cuda.synchronize()
check("gemm wide and narrow tiles", C.tensor, a.float() @ b.float())
k.close()

# 3. fused GEMM + allreduce (row-parallel): y = sum over ranks of X_r W_r, in rank order
m, kk, nn = 256, 128, 256
xs = [ints((m, kk), r, 20, torch.bfloat16) for r in range(N)]
ws = [ints((kk, nn), r, 21, torch.bfloat16) for r in range(N)]
k = maco.PersistentKernel(comm, profile=True)
X, W = k.register_tensor(xs[R].clone(), "X"), k.register_tensor(ws[R].clone(), "W")
Y = k.register_output((m, nn), torch.float32, "Y")
with k.task_graph() as g:
    g.allreduce(g.matmul(X, W, output=Y, name="row_linear"))
poison(Y.tensor)
k()
torch.cuda.synchronize()
want = sum(x.float() @ w.float() for x, w in zip(xs, ws))
check("gemm+allreduce", Y.tensor, want)
got_all = comm.allgather_bytes(Y.tensor.cpu().numpy().tobytes())
checks += 1
if len(set(got_all)) != 1:
    failures.append("gemm+allreduce: results differ across ranks")
# a second launch on new inputs, then a CUDA graph of a launch
xs = [ints((m, kk), r, 22, torch.bfloat16) for r in range(N)]
X.tensor.copy_(xs[R])
poison(Y.tensor)
k()
torch.cuda.synchronize()
check("gemm+allreduce run 2", Y.tensor, sum(x.float() @ w.float() for x, w in zip(xs, ws)))
s = torch.cuda.Stream()
graph = torch.cuda.CUDAGraph()
with torch.cuda.graph(graph, stream=s):
    k()
for it in range(2):
    xs = [ints((m, kk), r, 30 + it, torch.bfloat16) for r in range(N)]
    X.tensor.copy_(xs[R])
    poison(Y.tensor)
    torch.cuda.synchronize()
    graph.replay()
    torch.cuda.synchronize()
    check(f"gemm+allreduce graph replay {it}", Y.tensor,
          sum(x.float() @ w.float() for x, w in zip(xs, ws)))
fused_summary = k.summary()
k.close()

# 4. fused allgather + GEMM (column-parallel): Y_r = [X_0; ...; X_{N-1}] W_r
m, kk, nn = 128, 64, 256
xs = [ints((m, kk), r, 40, torch.bfloat16) for r in range(N)]
w = ints((kk, nn), R, 41, torch.bfloat16)
k = maco.PersistentKernel(comm)
X, W = k.register_tensor(xs[R].clone(), "X"), k.register_tensor(w, "W")
with k.task_graph() as g:
    Y = g.matmul(g.allgather(X), W, name="col_linear")
poison(Y.tensor)
k()
torch.cuda.synchronize()
check("allgather+gemm", Y.tensor, torch.cat(xs).float() @ w.float())
k.close()

# 4b. the copy-engine mode (fused_comm="copy_engine": rows over port channels) of each fused
# operation, bit for bit against the reference and the SM mode, the allreduce also replayed
# from a CUDA graph; "auto" takes what maco.persistent.choose_fused_comm says.
m, kk, nn = 300, 128, 256
xs = [ints((m * N, kk), r, 50, torch.bfloat16) for r in range(N)]
ws = [ints((kk, nn), r, 51, torch.bfloat16) for r in range(N)]
want_sum = sum(x.float() @ w.float() for x, w in zip(xs, ws))
got_by_mode = {}
for mode in ("sm", "copy_engine", "auto"):
    outs = []
    for op in ("gemm_allreduce", "gemm_reduce_scatter", "allgather_gemm"):
        k = maco.PersistentKernel(comm, fused_comm=mode)
        rows = m if op == "allgather_gemm" else m * N
        X = k.register_tensor(xs[R][:rows].clone(), "X")
        W = k.register_tensor(ws[R].clone(), "W")
        with k.task_graph() as g:
            if op == "gemm_allreduce":
                Y = g.allreduce(g.matmul(X, W, name="rl"))
                want = want_sum
            elif op == "gemm_reduce_scatter":
                Y = g.reduce_scatter(g.matmul(X, W, name="rl"))
                want = want_sum[R * m:(R + 1) * m]
            else:
                Y = g.matmul(g.allgather(X), W, name="cl")
                want = torch.cat([x[:m] for x in xs]).float() @ ws[R].float()
        chosen = maco.persistent.choose_fused_comm(op, N, rows if op != "allgather_gemm" else m,
                                                   nn, kk, torch.float32)
        checks += 1
        took = k.fused_comm_modes[0][1] if k.fused_comm_modes else None
        if took != (chosen if mode == "auto" else mode):
            failures.append(f"{op} {mode}: took {took}, choose_fused_comm says {chosen}")
        for run in range(2):
            poison(Y.tensor)
            k()
            torch.cuda.synchronize()
            check(f"{op} fused_comm={mode} run {run}", Y.tensor, want)
        if op == "gemm_allreduce":
            s = torch.cuda.Stream()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=s):
                k()
            poison(Y.tensor)
            torch.cuda.synchronize()
            graph.replay()
            torch.cuda.synchronize()
            check(f"{op} fused_comm={mode} graph replay", Y.tensor, want)
            del graph
        outs.append(Y.tensor.clone())
        comm.barrier()  # every rank's launches ended before the kernels and channels go
        k.close()
    got_by_mode[mode] = outs
for i, (a, b) in enumerate(zip(got_by_mode["sm"], got_by_mode["copy_engine"])):
    checks += 1
    if not torch.equal(a, b):
        failures.append(f"operation {i}: the copy-engine mode's bits differ from the SM mode's")

# 5. maco.profiler around plain collectives and a profiled persistent kernel
k = maco.PersistentKernel(comm, profile=True)
v = k.register_tensor(torch.ones(4096, device=DEV), "v")
with k.task_graph() as g:
    g.scale(v, 2.0, name="double")
k.compile()
t = torch.ones(1 << 16, device=DEV)
with maco.profiler() as p:
    for _ in range(3):
        comm.allreduce(t)
    comm.allgather(t[:8])
    k()
rec = p.records()
checks += 1
names = [r[0] for r in rec]
if names.count("allreduce") != 3 or names.count("allgather") != 1 or any(r[2] <= 0 for r in rec):
    failures.append(f"profiler records: {rec}")
text = p.summary()
checks += 1
if "allreduce" not in text or "double" not in text:
    failures.append(f"profiler summary:\n{text}")
check("profiled allreduce", t, torch.full_like(t, float(N ** 3)))
k.close()

if failures:
    for f in failures:
        print(f"FAIL rank {R}: {f}", flush=True)
    print(f"FAIL gpu_persistent rank {R}/{N}: {len(failures)} failures, {checks} checks")
    sys.exit(1)
if R == 0:
    print(fused_summary)
    print(text)
print(f"PASS gpu_persistent rank {R}/{N}: {checks} checks in {time.time() - start:.1f} s")
comm.close()
