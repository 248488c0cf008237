"""GPU check of maco.Context (the seeds' Level 2), one process per rank (maco-run):

    maco-run -n 2 python3 tests/python/gpu_context.py

The seeds' flow (compute, allreduce with async_op=True, the next compute, wait) on fresh random
inputs, checked against the sum over every rank's inputs recomputed here; allgather and
reduce_scatter, async and not, overlap=False; the CTA cap seen in the communicator's stats after
large calls; argument errors; ranks that pass different comm_sms all get an error naming the rank
that differs. Prints whether compute ran in a green context. Last line: 'PASS gpu_context ...'."""

import os
import sys
import time

import torch

import maco

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
SEED = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little")
SMS = torch.cuda.get_device_properties(DEV).multi_processor_count
failures = []
checks = 0


def check(name, ok, detail=""):
    global checks
    checks += 1
    if not ok:
        failures.append(f"{name}: {detail}")


def gen(rank, salt):
    g = torch.Generator()
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt)
    return g


def ints(shape, rank, salt):
    """Small integers: exact in fp32 products and sums, so results compare exactly."""
    return torch.randint(-3, 4, shape, generator=gen(rank, salt)).float()


def expect_raises(name, exc, fn, text=""):
    global checks
    checks += 1
    try:
        fn()
    except exc as e:
        if text and text not in str(e):
            failures.append(f"{name}: message {str(e)!r} lacks {text!r}")
        return
    except Exception as e:  # noqa: BLE001 - reported as a failure
        failures.append(f"{name}: raised {type(e).__name__}: {e}")
        return
    failures.append(f"{name}: no error")


start = time.time()
COMM_SMS = 8

# Bad arguments (no collective call is made before they are rejected).
expect_raises("compute_sms + comm_sms too large", ValueError,
              lambda: maco.Context(comm, compute_sms=SMS, comm_sms=COMM_SMS), f"{SMS} SMs")
expect_raises("comm_sms 0", ValueError, lambda: maco.Context(comm, comm_sms=0), "comm_sms")
expect_raises("world_size", ValueError, lambda: maco.Context(comm, world_size=N + 1),
              "world_size")

# Ranks that disagree on comm_sms: every rank gets the error, naming the last rank.
if N > 1:
    expect_raises("comm_sms differs", maco.InvalidArgumentError,
                  lambda: maco.Context(comm, comm_sms=COMM_SMS + (R == N - 1)),
                  f"rank {N - 1} passed max_ctas={COMM_SMS + 1}")
    check("cap unchanged after the mismatch", comm.max_ctas == 0, f"{comm.max_ctas}")

compute_sms = (SMS - COMM_SMS) // 8 * 8
ctx = maco.Context(comm, world_size=N, compute_sms=compute_sms, comm_sms=COMM_SMS)
print(f"rank {R}: {ctx!r}; green context: {ctx.compute_sms_enforced} "
      f"({ctx.compute_sms_reason or 'ok'})", flush=True)
check("cap set", comm.max_ctas == COMM_SMS, f"{comm.max_ctas}")

M, K, NN = 256, 512, 384
for it in range(3):
    xs = [ints((M, K), r, 10 * it + 1) for r in range(N)]
    w1 = [ints((K, NN), r, 10 * it + 2) for r in range(N)]
    w2 = [ints((K, NN), r, 10 * it + 3) for r in range(N)]
    x, a, b = xs[R].to(DEV), w1[R].to(DEV), w2[R].to(DEV)
    with ctx:
        y = ctx.compute(lambda: torch.matmul(x, a))
        work = ctx.allreduce(y, async_op=True)
        z = ctx.compute(lambda: torch.matmul(x, b))
        y2 = work.wait()
    want_y = sum(xs[r] @ w1[r] for r in range(N))
    check(f"iteration {it}: allreduce of the first matmul", torch.equal(y2.cpu(), want_y),
          f"max error {(y2.cpu() - want_y).abs().max().item()}")
    check(f"iteration {it}: second matmul", torch.equal(z.cpu(), xs[R] @ w2[R]))
    check(f"iteration {it}: result is the input tensor (in place)", y2 is y)

# A large allreduce through the Context launches at most comm_sms CTAs.
big = torch.randn(8 << 20, generator=gen(R, 99)).to(DEV)
ref = big.clone()
ctx.allreduce(big)
torch.cuda.current_stream().synchronize()
last = comm.stats()["last_launch_ctas"]
if N > 1:
    check("large allreduce capped", 1 <= last <= COMM_SMS, f"{last} CTAs")
else:  # one rank: a copy, no collective kernel
    check("one rank launches no collective kernel", last == 0, f"{last} CTAs")
ref_all = comm.allgather(ref)  # every rank's input, to recompute the sum here
want = ref_all.double().sum(0)
check("large allreduce value", torch.allclose(big.double(), want, rtol=1e-5, atol=1e-4),
      f"max error {(big.double() - want).abs().max().item():.3g}")

# allgather and reduce_scatter, async and not.
v = ints((1000, 3), R, 50).to(DEV)
g = ctx.allgather(v, async_op=True).wait()
want_g = torch.stack([ints((1000, 3), r, 50) for r in range(N)])
check("allgather async", torch.equal(g.cpu(), want_g))
rs_in = ints((N * 777,), R, 60).to(DEV)
out = torch.full((777,), float("nan"), device=DEV)
rs = ctx.reduce_scatter(rs_in, out=out)
want_rs = sum(ints((N * 777,), r, 60) for r in range(N))[R * 777:(R + 1) * 777]
check("reduce_scatter", rs is out and torch.equal(out.cpu(), want_rs))
avg = ctx.allreduce(ints((4099,), R, 70).to(DEV), op=maco.AVG)
want_avg = sum(ints((4099,), r, 70) for r in range(N)) / N
check("allreduce avg", torch.allclose(avg.cpu(), want_avg, rtol=1e-6, atol=1e-6))

# Several collectives in flight, waited in reverse order.
ts = [ints((5000,), R, 80 + i).to(DEV) for i in range(4)]
works = [ctx.allreduce(t, async_op=True) for t in ts]
for i in reversed(range(4)):
    works[i].wait()
for i in range(4):
    want_i = sum(ints((5000,), r, 80 + i) for r in range(N))
    check(f"in flight {i}", torch.equal(ts[i].cpu(), want_i))

# overlap=False runs on the caller's stream.
ctx.close()
check("cap restored", comm.max_ctas == 0, f"{comm.max_ctas}")
serial = maco.Context(comm, comm_sms=COMM_SMS, overlap=False)
t = ints((3333,), R, 90).to(DEV)
serial.allreduce(t)
check("overlap=False", torch.equal(t.cpu(), sum(ints((3333,), r, 90) for r in range(N))))
t2 = ints((3333,), R, 91).to(DEV)
w = serial.allreduce(t2, async_op=True)
check("overlap=False, async_op=True gives a Work", isinstance(w, maco.Work), type(w).__name__)
check("overlap=False async value", torch.equal(w.wait().cpu(),
                                               sum(ints((3333,), r, 91) for r in range(N))))
serial.close()

comm.barrier()
if failures:
    for f in failures[:20]:
        print(f"rank {R}: FAIL {f}", flush=True)
    print(f"FAIL gpu_context rank {R}/{N}: {len(failures)} of {checks} checks failed")
    sys.exit(1)
print(f"PASS gpu_context rank {R}/{N}: {checks} checks in {time.time() - start:.1f} s "
      f"(green context: {ctx.compute_sms_enforced})")
