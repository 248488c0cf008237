"""GPU checks of the overlap API (issue 39), one process per GPU under torchrun:

    torchrun --nproc-per-node 2 tests/python/gpu_overlap.py      # 2 or 4 GPUs

On fresh random inputs (small integers where sums must be exact, bf16 where the fused kernel
rounds), every output poisoned with NaN before it is written, each result checked against the
sum over every rank's inputs recomputed here:

- Level 1: @maco.optimize_comm with dist.all_reduce routed to MACO (the group's MACO
  communicator exists afterwards), waits at first use, maco.optimize_context, auto_overlap on
  NCCL; maco.allreduce's per-call options (async_op, priority, overlap_group, use_ring ->
  "rsag" then restored, overlap_with_next); the split (set_config's comm_sms becomes the
  communicator's CTA cap at the next collective of a scope);
- overlap_region futures, Pipeline with an allreduce stage on CUDA streams, maco.ring,
  CommScheduler (packed phase, cap applied and restored);
- auto_config measured on the GPU (the same answer on every rank);
- maco.compile / torch.compile(backend="maco") of a tensor-parallel block: the fused
  gemm_allreduce kernels run (launch counts) and the output equals the reference within bf16
  rounding; the same with fusion="copy_engine"; a sequence-parallel block (all_gather +
  matmul, matmul + reduce_scatter) through maco.tp's allgather_gemm and gemm_reduce_scatter,
  by default and on the copy engines; maco.PersistentContext frees its kernels; SMConfig's
  split reaches the kernel.

Last line per rank: 'PASS gpu_overlap rank R/N ...' (exit status 1 on a failed check).
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

import maco
import maco._fused_ops as mc
from maco import _overlap

R = int(os.environ["RANK"])
N = int(os.environ["WORLD_SIZE"])
LOCAL = int(os.environ.get("LOCAL_RANK", R))
torch.cuda.set_device(LOCAL % torch.cuda.device_count())
DEV = torch.device("cuda", torch.cuda.current_device())
dist.init_process_group("nccl", device_id=DEV, timeout=datetime.timedelta(seconds=240))
comm = maco.init()  # from torch.distributed's world
SEED = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little")
failures = []
checks = 0
start = time.time()


def check(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def gen(rank, salt):
    g = torch.Generator()
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt)
    return g


def ints(shape, rank, salt, dtype=torch.float32):
    """Small integers: exact in fp32 products and sums (and in bf16 up to 256)."""
    return torch.randint(-3, 4, shape, generator=gen(rank, salt)).to(dtype)


def summed(shape, salt, dtype=torch.float32):
    return sum(ints(shape, r, salt, dtype).double() for r in range(N))


def same(name, got, want):
    check(name, torch.equal(got.double().cpu(), want.double()),
          f"max error {(got.double().cpu() - want.double()).abs().max().item()}")


# ------------------------------------------------------------------ Level 1

@maco.optimize_comm
def my_forward(x, w):
    y = torch.matmul(x, w)
    dist.all_reduce(y)              # on MACO inside the decorated function
    z = torch.matmul(x, w) * 0      # overlaps it
    sc = _overlap._current_scope()
    pending = len(sc.pending)
    return y + z, pending


for it in range(2):
    x, w = ints((256, 128), R, 10 + it).to(DEV), ints((128, 384), R, 20 + it).to(DEV)
    y, pending = my_forward(x, w)
    want = sum(ints((256, 128), r, 10 + it).double() @ ints((128, 384), r, 20 + it).double()
               for r in range(N))
    same(f"optimize_comm iteration {it}", y, want)
    check("optimize_comm: pending while the next matmul ran", pending == 1, f"{pending}")
from maco import _routes  # noqa: E402

check("dist.all_reduce went to MACO (the world's MACO group exists)",
      len(_routes.patched_groups) >= 1, f"{list(_routes.patched_groups)}")
check("wrappers removed after the scope", not getattr(dist.all_reduce, "__maco_scope__", False))

with maco.auto_overlap():  # NCCL stays, made asynchronous
    a = ints((1 << 16,), R, 30).to(DEV)
    dist.all_reduce(a)
    check("auto_overlap: NCCL work pending", len(_overlap._current_scope().pending) == 1)
    b = a * 1
same("auto_overlap value", b, summed((1 << 16,), 30))

# per-call options
t = ints((4 << 20,), R, 40).to(DEV)
wk = maco.allreduce(t, async_op=True, priority="normal")
check("async_op gives a CommWork", isinstance(wk, maco.CommWork), type(wk).__name__)
same("async_op value", wk.wait(), summed((4 << 20,), 40))
before = comm.forced_algorithm("allreduce")
t = ints((8 << 20,), R, 41).to(DEV)
maco.allreduce(t, use_ring=True)
same("use_ring value", t, summed((8 << 20,), 41))
check("use_ring: forced algorithm restored", comm.forced_algorithm("allreduce") == before,
      f"{comm.forced_algorithm('allreduce')} != {before}")
ts = [ints((3000,), R, 50 + i).to(DEV) for i in range(3)]
ws = [maco.allreduce(v, async_op=True, overlap_group="qkv") for v in ts]
ws[1].wait()
check("overlap_group: one wait waits for the group", all(w._h.done for w in ws))
for i, v in enumerate(ts):
    same(f"overlap_group value {i}", v, summed((3000,), 50 + i))
v = ints((5000,), R, 60).to(DEV)
r = maco.allreduce(v, overlap_with_next=True)
check("overlap_with_next gives an AsyncCollectiveResult", type(r).__name__ ==
      "AsyncCollectiveResult", type(r).__name__)
same("overlap_with_next value", r * 1, summed((5000,), 60))

# the split: comm_sms becomes the CTA cap at the next collective of a scope
maco.set_config(compute_sms=100, comm_sms=16)
with maco.optimize_context():
    v = ints((1 << 20,), R, 70).to(DEV)
    maco.allreduce(v)
    check("set_config comm_sms applied", comm.max_ctas == 16, f"{comm.max_ctas}")
same("allreduce under the split", v, summed((1 << 20,), 70))
maco.config.reset()
comm.set_max_ctas(0)

# ------------------------------------------------------------------ overlap patterns

x, w = ints((512, 256), R, 80).to(DEV), ints((256, 256), R, 81).to(DEV)
prev = ints((1 << 18,), R, 82).to(DEV)
with maco.overlap_region() as region:
    cf = region.submit_compute(torch.matmul, x, w)
    mf = region.submit_comm(maco.allreduce, prev)
    dep = region.submit_compute(torch.add, mf, 1)
same("region compute", cf.result(), ints((512, 256), R, 80).double() @
     ints((256, 256), R, 81).double())
same("region comm", mf.result(), summed((1 << 18,), 82))
same("region dependent compute", dep.result(), summed((1 << 18,), 82) + 1)

wl = ints((256, 256), R, 90).to(DEV)
pipe = maco.Pipeline(num_stages=3, chunks=4)
pipe.stage(0)(lambda t: t @ wl)
pipe.stage(1)(lambda t: maco.allreduce(t))
pipe.stage(2)(lambda t: t * 2)
xs = ints((1024, 256), R, 91).to(DEV)
out = pipe(xs)
same("pipeline", out, 2 * sum(ints((1024, 256), r, 91).double() @
                              ints((256, 256), r, 90).double() for r in range(N)))

act = ints((64, 32), R, 100).to(DEV)
with maco.ring(direction="forward"):
    maco.send(act)
    got = maco.recv()
same("ring forward", got, ints((64, 32), (R - 1) % N, 100))

q, k_, v_ = (ints((1000,), R, 110).to(DEV), ints((37, 3), R, 111).to(DEV),
             ints((64,), R, 112).to(DEV))
o = ints((4096,), R, 113).to(DEV)
sched = maco.CommScheduler(num_sms=8)
p1 = sched.phase("allreduce_qkv")
for tt in (q, k_, v_):
    p1.allreduce(tt)
p2 = sched.phase("allreduce_output", depends_on=p1)
p2.allreduce(o)
sched.compile()
works = sched()
works["allreduce_output"].wait()
for tt, salt in ((q, 110), (k_, 111), (v_, 112), (o, 113)):
    same(f"scheduler salt {salt}", tt, summed(tuple(tt.shape), salt))
check("scheduler cap restored", comm.max_ctas == 0, f"{comm.max_ctas}")

# ------------------------------------------------------------------ auto_config

split = maco.auto_config("medium", "medium", gpu_arch=None, candidates=[8, 16, 32], iters=3)
picked = comm.allgather_bytes(str(split.comm_sms).encode().ljust(8))
check("auto_config measured every candidate", sorted(split.times) == [8, 16, 32],
      f"{split.times}")
check("auto_config: the same split on every rank", len(set(picked)) == 1, f"{picked}")
check("auto_config restored the cap", comm.max_ctas == 0, f"{comm.max_ctas}")
maco.config.reset()

# ------------------------------------------------------------------ compile

M, K, NOUT = 512, 256, 1024


class Block(torch.nn.Module):
    def __init__(self, r):
        super().__init__()
        self.w1 = torch.nn.Parameter(ints((NOUT, K), r, 120, torch.bfloat16).to(DEV) / 4)
        self.w2 = torch.nn.Parameter(ints((NOUT, NOUT // N), r, 121, torch.bfloat16).to(DEV) / 4)

    def forward(self, x):
        y = torch.matmul(x, self.w1.T)
        dist.all_reduce(y)
        h = torch.relu(y)[:, R * (NOUT // N):(R + 1) * (NOUT // N)].contiguous()
        z = torch.matmul(h, self.w2.T)
        return maco.allreduce(z)


def reference(xc):
    y = sum(xc.float() @ (ints((NOUT, K), r, 120).float() / 4).T for r in range(N))
    y = y.to(torch.bfloat16).float()
    z = sum(torch.relu(y)[:, r * (NOUT // N):(r + 1) * (NOUT // N)] @
            (ints((NOUT, NOUT // N), r, 121).float() / 4).T for r in range(N))
    return z


xin = ints((M, K), 0, 130, torch.bfloat16)  # the same input on every rank
want = reference(xin)
maco.config.set(fusion="persistent")  # the persistent kernel first (not the default)
for backend in ("maco.compile", "torch.compile"):
    torch._dynamo.reset()
    mc.close_kernels()
    with torch.no_grad():
        blk = Block(R)
        f = maco.compile(blk) if backend == "maco.compile" else torch.compile(blk, backend="maco")
        got = f(xin.to(DEV))
        got = f(xin.to(DEV))
    torch.cuda.synchronize()
    launches = sum(r.launches for r in mc._runners.values())
    check(f"{backend}: fused kernels ran", len(mc._runners) == 2 and launches == 4,
          f"{len(mc._runners)} kernels, {launches} launches")
    err = ((got.float().cpu() - want).norm() / want.norm()).item()
    check(f"{backend}: within bf16 rounding", err <= 2 ** -7, f"relative error {err:.3g}")

# fusion="copy_engine": the same compiled graph runs maco.tp.gemm_allreduce instead
maco.config.set(fusion="copy_engine")
before = mc.stats["copy_engine"]
with torch.no_grad():
    got = f(xin.to(DEV))
torch.cuda.synchronize()
check("copy_engine fusion ran maco.tp", mc.stats["copy_engine"] - before == 2,
      f"{mc.stats['copy_engine'] - before} calls")
err = ((got.float().cpu() - want).norm() / want.norm()).item()
check("copy_engine fusion within bf16 rounding", err <= 2 ** -7, f"relative error {err:.3g}")
maco.config.reset()

# the sequence-parallel layer's pairs: all_gather + matmul and matmul + reduce_scatter become
# maco.tp's allgather_gemm and gemm_reduce_scatter, by default and forced onto the copy engines
import torch.distributed._functional_collectives as fc  # noqa: E402

SP_ROWS, SP_H, SP_F = 64, 256, 384  # rows per rank, hidden, this rank's MLP shard
sp_w1 = [torch.randn(SP_F, SP_H, generator=gen(r, 31)) / 16 for r in range(N)]
sp_w2 = [torch.randn(SP_H, SP_F, generator=gen(r, 32)) / 16 for r in range(N)]
sp_x = [torch.randn(SP_ROWS, SP_H, generator=gen(r, 33)) for r in range(N)]
w1d, w2d = sp_w1[R].to(DEV, torch.bfloat16), sp_w2[R].to(DEV, torch.bfloat16)


def sp_block(xs):
    xf = fc.all_gather_tensor(xs, 0, dist.group.WORLD)
    h = torch.relu(torch.matmul(xf, w1d.T))
    return xs + fc.reduce_scatter_tensor(torch.matmul(h, w2d.T), "sum", 0, dist.group.WORLD)


sp_bf = [t.to(torch.bfloat16).float() for t in sp_x]
sp_full = sum(torch.relu(torch.cat(sp_bf) @ sp_w1[r].to(torch.bfloat16).float().T)
              @ sp_w2[r].to(torch.bfloat16).float().T for r in range(N))
sp_want = sp_bf[R] + sp_full[R * SP_ROWS:(R + 1) * SP_ROWS]
torch._dynamo.reset()
sp_f = maco.compile(sp_block)
for label, ce_min in (("default", mc._COMPILE_CE_MIN_FLOP), ("copy engines", 0)):
    saved, mc._COMPILE_CE_MIN_FLOP = mc._COMPILE_CE_MIN_FLOP, ce_min
    before = dict(mc.stats)
    try:
        with torch.no_grad():
            xs = sp_x[R].to(DEV, torch.bfloat16)
            got = sp_f(xs)
        torch.cuda.synchronize()
    finally:
        mc._COMPILE_CE_MIN_FLOP = saved
    d = {k: mc.stats[k] - before[k] for k in ("allgather_gemm", "gemm_reduce_scatter",
                                              "sp_fallback")}
    check(f"sequence parallel ({label}): maco.tp ran both pairs",
          d == {"allgather_gemm": 1, "gemm_reduce_scatter": 1, "sp_fallback": 0}, f"{d}")
    err = ((got.float().cpu() - sp_want).norm() / sp_want.norm()).item()
    check(f"sequence parallel ({label}): within bf16 rounding", err <= 2 ** -7,
          f"relative error {err:.3g}")

sm = maco.SMConfig(total_sms=torch.cuda.get_device_properties(DEV).multi_processor_count)
sm.assign_role((0, 64), maco.Role.COMPUTE)
sm.assign_role((64, 72), maco.Role.LOCAL_SCHEDULER)
sm.assign_role((72, 88), maco.Role.REMOTE_SCHEDULER)
mc.close_kernels()
torch._dynamo.reset()
with torch.no_grad(), maco.PersistentContext(Block(R), sm_config=sm) as ctx:
    for _ in range(2):
        got = ctx.forward(xin.to(DEV))
    kerns = ctx.kernels
    cfg = kerns[0].kernel.config if kerns else {}
    check("PersistentContext: kernels built", len(kerns) == 2, f"{len(kerns)}")
    check("SMConfig split reached the kernel",
          (cfg.get("workers"), cfg.get("schedulers"), cfg.get("comm_workers")) == (64, 8, 16),
          f"{cfg}")
err = ((got.float().cpu() - want).norm() / want.norm()).item()
check("PersistentContext within bf16 rounding", err <= 2 ** -7, f"relative error {err:.3g}")
check("PersistentContext freed its kernels", not mc._runners, f"{len(mc._runners)} left")
check("no asynchronous error", comm._c.async_error() == 0, comm.last_error)

comm.barrier()
if failures:
    for f_ in failures[:30]:
        print(f"rank {R}: FAIL {f_}", flush=True)
    print(f"FAIL gpu_overlap rank {R}/{N}: {len(failures)} of {checks} checks failed")
    sys.exit(1)
print(f"PASS gpu_overlap rank {R}/{N}: {checks} checks in {time.time() - start:.1f} s", flush=True)
maco.finalize()
dist.destroy_process_group()
