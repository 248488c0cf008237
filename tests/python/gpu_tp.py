"""GPU check of maco.tp (GEMM + allreduce / reduce-scatter, allgather + GEMM), one process per
rank (maco-run):

    maco-run -n 2 python3 tests/python/gpu_tp.py

Each operator, both methods ("ce": copy engines into mapped workspaces; "seq"), several chunk
counts, bf16 and fp32 outputs, against the result computed from every rank's inputs (small
integers with K = 16, so every product and every sum of up to 4 ranks is exact in bf16: the
check is bit for bit whatever the summation order); outputs poisoned first; fresh inputs per
case (one seed shared through the bootstrap). Also: results equal on every rank, a second call
with new inputs (the workspace reused), a CUDA graph of the "ce" path replayed on new inputs,
bad arguments refused with the argument named, and maco.profiler's spans of the "ce" paths.
Prints 'PASS gpu_tp ...' per rank."""

import os
import sys
import time
import zlib

import torch

import maco
from maco import tp

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
SEED = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little")
failures = []
checks = 0
salt = [0]


def ints(shape, rank, dtype=torch.bfloat16):
    """Small integers in [-2, 2], the same on every rank for a given (rank, call)."""
    g = torch.Generator()
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt[0])
    return torch.randint(-2, 3, shape, generator=g).to(dtype).to(DEV)


def check(name, got, want):
    global checks
    checks += 1
    got, want = got.detach().float().cpu(), want.detach().float().cpu()
    if got.shape != want.shape:
        failures.append(f"{name}: shape {tuple(got.shape)} want {tuple(want.shape)}")
    elif not torch.equal(got, want):
        bad = (got != want).nonzero()[:3].tolist()
        failures.append(f"{name}: {(got != want).sum().item()} of {got.numel()} wrong, first at "
                        f"{bad}: got {got[tuple(bad[0])].item()} want {want[tuple(bad[0])].item()}")


def same_on_every_rank(name, t):
    global checks
    checks += 1
    crc = zlib.crc32(t.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    crcs = comm.allgather_bytes(crc.to_bytes(4, "little"))
    if len(set(crcs)) != 1:
        failures.append(f"{name}: results differ between ranks (crc32 {[c.hex() for c in crcs]})")


def poisoned(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device=DEV)
    t.view(torch.uint8).fill_(0x7F)
    return t


def case(pattern, m, k, n, out_dtype, method, chunks):
    """Runs one call on fresh inputs and checks it against every rank's inputs."""
    salt[0] += 1
    name = f"{pattern} M={m} K={k} N={n} {out_dtype} {method} chunks={chunks}"
    if pattern == "allgather_gemm":
        s = m // N
        xs = [ints((s, k), r) for r in range(N)]
        ws_ = [ints((k, n), r + 100) for r in range(N)]
        want = torch.cat(xs).float() @ ws_[R].float()
        out = poisoned((m, n), out_dtype)
        got = tp.allgather_gemm(xs[R], ws_[R], comm, out=out, out_dtype=out_dtype,
                                chunks=chunks, method=method)
    else:
        xs = [ints((m, k), r) for r in range(N)]
        ws_ = [ints((k, n), r + 100) for r in range(N)]
        total = sum(x.float() @ w.float() for x, w in zip(xs, ws_))
        if pattern == "gemm_allreduce":
            want, shape, fn = total, (m, n), tp.gemm_allreduce
        else:
            s = m // N
            want, shape, fn = total[R * s:(R + 1) * s], (s, n), tp.gemm_reduce_scatter
        out = poisoned(shape, out_dtype)
        got = fn(xs[R], ws_[R], comm, out=out, out_dtype=out_dtype, chunks=chunks, method=method)
    torch.cuda.synchronize()
    if got is not out:
        failures.append(f"{name}: did not return out")
    check(name, got, want.to(out_dtype))
    if pattern == "gemm_allreduce":
        same_on_every_rank(name, got)


start = time.time()
for pattern in ("gemm_allreduce", "gemm_reduce_scatter", "allgather_gemm"):
    for out_dtype in (torch.bfloat16, torch.float32):
        for method, chunks in (("seq", None), ("ce", None), ("ce", 1), ("ce", 2), ("ce", 3)):
            case(pattern, 96 * N, 16, 384, out_dtype, method, chunks)
    case(pattern, 8 * N, 16, 64, torch.bfloat16, "ce", 3)  # fewer rows than chunks allow
    case(pattern, 96 * N, 16, 384, torch.bfloat16, "ce", 2)  # the workspace reused
# gemm_allreduce's paths from 3 ranks also with 2 ranks: the reduce-scatter + allgather form
# (M a multiple of N) and the per-chunk split (M = 25: uneven blocks).
if N == 2:
    split0, tp._AR_SPLIT_MIN_RANKS = tp._AR_SPLIT_MIN_RANKS, 2
    for out_dtype in (torch.bfloat16, torch.float32):
        case("gemm_allreduce", 96 * N, 16, 384, out_dtype, "ce", 3)
    case("gemm_allreduce", 8 * N + 9, 16, 64, torch.float32, "ce", 3)
    tp._AR_SPLIT_MIN_RANKS = split0
if N > 1:  # from 3 ranks: M a multiple of N takes the reduce-scatter + allgather form, M
    # not a multiple of N the per-chunk split (uneven blocks)
    case("gemm_allreduce", 8 * N + 8, 16, 64, torch.float32, "ce", 3)
    case("gemm_allreduce", 8 * N + 9, 16, 64, torch.bfloat16, "ce", 2)

# A CUDA graph of the "ce" path (the workspace exists from the calls above), replayed on new
# inputs copied into the captured ones.
m, k, n = 96 * N, 16, 384
x_in = ints((m, k), R)
w_in = ints((k, n), R + 100)
out_g = poisoned((m, n), torch.bfloat16)
tp.gemm_allreduce(x_in, w_in, comm, out=out_g, method="ce", chunks=2)  # warm-up
torch.cuda.synchronize()
graph = torch.cuda.CUDAGraph()
try:
    with torch.cuda.graph(graph):
        tp.gemm_allreduce(x_in, w_in, comm, out=out_g, method="ce", chunks=2)
    for rep in range(2):
        salt[0] += 1
        xs = [ints((m, k), r) for r in range(N)]
        ws_ = [ints((k, n), r + 100) for r in range(N)]
        x_in.copy_(xs[R])
        w_in.copy_(ws_[R])
        out_g.view(torch.uint8).fill_(0x7F)
        graph.replay()
        torch.cuda.synchronize()
        want = sum(x.float() @ w.float() for x, w in zip(xs, ws_))
        check(f"CUDA graph replay {rep}", out_g, want.to(torch.bfloat16))
except Exception as e:  # noqa: BLE001 - reported as a failure with its cause
    failures.append(f"CUDA graph of maco.tp.gemm_allreduce: {type(e).__name__}: {e}")
del graph

# maco.profiler around the "ce" paths: every step a span of the right kind (GEMMs and sums
# compute; copies on the copy engines with 0 SMs; barriers comm with their CTAs), results right.
if N > 1:
    with maco.profiler() as prof:
        case("gemm_reduce_scatter", 96 * N, 16, 384, torch.bfloat16, "ce", 2)
        case("allgather_gemm", 96 * N, 16, 384, torch.bfloat16, "ce", 2)
    checks += 1
    spans = prof.spans()
    kinds = {}
    for name, kind, st, d, sms in spans:
        kinds.setdefault(name, set()).add((kind, sms if name.endswith(".copy") else None))
        if not (st >= 0 and d > 0) or (name.endswith(".barrier") and not sms):
            failures.append(f"profiler span {name}: start {st} ms, {d} ms, sms {sms}")
    want_k = {f"{op}.{step}": {(kind, 0 if step == "copy" else None)}
              for op, steps in (("gemm_reduce_scatter", "gemm copy barrier sum"),
                                ("allgather_gemm", "gemm copy barrier"))
              for step in steps.split() for kind in ["comm" if step in ("copy", "barrier")
                                                     else "compute"]}
    rows, eff = prof.overlap()
    if kinds != want_k or eff is None or not 0 <= eff <= 100:
        failures.append(f"profiler: spans {kinds}, efficiency {eff}")
    if R == 0:
        prof.print_summary()

# Bad arguments: refused before anything runs, naming the argument.
x = ints((8 * N, 16), R)
w = ints((16, 32), R)
bad = [
    ("x on the CPU", lambda: tp.gemm_allreduce(x.cpu(), w, comm), ValueError, "x is on cpu"),
    ("w not 2-D", lambda: tp.gemm_allreduce(x, w.view(-1), comm), ValueError, "w has shape"),
    ("K differs", lambda: tp.gemm_allreduce(x, ints((8, 32), R), comm), ValueError,
     "x has 16 columns"),
    ("dtypes differ", lambda: tp.gemm_allreduce(x, w.float(), comm), ValueError, "w is"),
    ("out of the wrong shape", lambda: tp.allgather_gemm(x, w, comm, out=poisoned(
        (3, 32), torch.bfloat16)), ValueError, "out must be"),
    ("chunks 0", lambda: tp.gemm_allreduce(x, w, comm, chunks=0), ValueError, "chunks=0"),
    ("method unknown", lambda: tp.gemm_allreduce(x, w, comm, method="nvls"), ValueError,
     "method='nvls'"),
    ("x not a tensor", lambda: tp.gemm_allreduce([1, 2], w, comm), TypeError, "x is a list"),
]
if N > 1:
    bad.append(("M not a multiple", lambda: tp.gemm_reduce_scatter(ints((8 * N + 1, 16), R), w,
                                                                 comm), ValueError,
                "not a multiple"))
for what, fn, exc, text in bad:
    checks += 1
    try:
        fn()
        failures.append(f"bad argument accepted: {what}")
    except exc as e:
        if text not in str(e):
            failures.append(f"{what}: message {str(e)!r} lacks {text!r}")

torch.cuda.synchronize()
tp.release_workspaces(comm)
comm.close()
for f in failures:
    print(f"FAIL gpu_tp rank {R}: {f}", flush=True)
verdict = "FAIL" if failures else "PASS"
print(f"{verdict} gpu_tp rank {R}/{N}: {checks} checks, {len(failures)} failed, "
      f"{time.time() - start:.1f} s", flush=True)
sys.exit(1 if failures else 0)
