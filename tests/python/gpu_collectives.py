"""GPU check of maco.Communicator, one process per rank: run under
``maco-run -n N python3 tests/python/gpu_collectives.py`` (ranks may share one GPU: maco-run
starts MPS). Every collective on torch tensors (all 12 types) and CuPy arrays (the types
NumPy has), odd sizes, in place and out of place, registered and not, explicit streams, a
CUDA graph captured through torch, and the GPU-side argument errors. Inputs are fresh random
small integers (exact in every type, fp8 included, so the expected values are exact);
outputs are poisoned first. Prints 'PASS ...' and exits 0, or raises."""

import os
import sys
import time

import numpy as np
import torch

import maco

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
checks = 0
seed_bytes = comm.broadcast_bytes(os.urandom(8) if R == 0 else None, 0)
SEED = int.from_bytes(seed_bytes, "little")
QUICK = os.environ.get("TEST_QUICK") == "1"

try:
    import cupy
except ImportError:
    cupy = None

INT_TYPES = {"int8", "uint8", "int32", "uint32", "int64", "uint64"}
ALL_TYPES = ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16", "bfloat16",
             "float32", "float64", "float8_e4m3fn", "float8_e5m2"]
SIZES = [1, 7, 1023, 70001] if not QUICK else [7, 1023]
BIG = 600_001  # float32: 2.4 MB, above the LL sizes (two-shot: 2 MiB with 2 or 8 ranks): rsag


def values(rank, n, tname, salt):
    """Rank ``rank``'s input: n random ints in [-2, 2] ([0, 3] for unsigned types), as
    float64 numpy (exact in every type)."""
    rng = np.random.default_rng([SEED, rank, salt, n, ALL_TYPES.index(tname)])
    lo, hi = (0, 4) if tname.startswith("u") else (-2, 3)
    return rng.integers(lo, hi, size=n).astype(np.float64)


def to_torch(v, tname):
    if tname in INT_TYPES:
        return torch.from_numpy(v.astype(tname)).to(DEV)
    return torch.from_numpy(v.astype(np.float32)).to(DEV).to(getattr(torch, tname))


def from_torch(t, tname):
    t = t.detach()
    if tname in INT_TYPES:
        return t.cpu().numpy().astype(np.float64)
    return t.float().cpu().numpy().astype(np.float64)


def to_cupy(v, tname):
    return cupy.asarray(v.astype(tname))


def from_cupy(a, tname):
    return cupy.asnumpy(a).astype(np.float64)


def reduce_expected(arrs, op, tname):
    acc = arrs[0].copy()
    for a in arrs[1:]:
        acc = {"sum": acc + a, "avg": acc + a, "prod": acc * a, "min": np.minimum(acc, a),
               "max": np.maximum(acc, a)}[op]
    if op == "avg":
        acc = np.trunc(acc / len(arrs)) if tname in INT_TYPES else acc / len(arrs)
    return acc


failures = []


def check(name, got, want):
    """Records a wrong result and goes on (every rank must keep making the same calls)."""
    global checks
    checks += 1
    if got.shape != want.shape:
        failures.append(f"{name}: shape {got.shape}, want {want.shape}")
    elif not np.array_equal(got, want):
        bad = np.flatnonzero(got.reshape(-1) != want.reshape(-1))
        first = bad[:5]
        failures.append(f"{name}: {len(bad)} wrong values, first at {first.tolist()}: got "
                        f"{got.reshape(-1)[first].tolist()} want {want.reshape(-1)[first].tolist()}")


def block(fn, *args):
    """Runs one group of checks; an exception (the same on every rank: a conversion this
    framework lacks, an argument error) is recorded and the next group runs."""
    try:
        fn(*args)
    except Exception as e:  # noqa: BLE001
        import traceback

        failures.append(f"{fn.__name__}{args[1:3]}: {type(e).__name__}: {e}\n"
                        + traceback.format_exc(limit=4))


class Torch:
    name = "torch"
    to, back = staticmethod(to_torch), staticmethod(from_torch)

    @staticmethod
    def empty(n, tname):
        return torch.empty(n, dtype=getattr(torch, tname), device=DEV)

    @staticmethod
    def poison(t):
        t.view(torch.uint8).fill_(0x7B)

    @staticmethod
    def sync():
        torch.cuda.current_stream().synchronize()


class Cupy:
    name = "cupy"
    to, back = staticmethod(to_cupy), staticmethod(from_cupy)

    @staticmethod
    def empty(n, tname):
        return cupy.empty(n, dtype=tname)

    @staticmethod
    def poison(a):
        a.view(cupy.uint8).fill(0x7B)

    @staticmethod
    def sync():
        cupy.cuda.get_current_stream().synchronize()


def run_collectives(F, tname, n, ops, salt):
    tag = f"{F.name} {tname} n={n}"
    ins = [values(r, n, tname, salt) for r in range(N)]
    x = F.to(ins[R], tname)
    # allreduce, out of place, every op asked for
    for op in ops:
        out = F.empty(n, tname)
        F.poison(out)
        y = comm.allreduce(x, out, op=op)
        assert y is out
        F.sync()
        check(f"{tag} allreduce {op}", F.back(out, tname), reduce_expected(ins, op, tname))
    # allreduce in place
    xi = F.to(ins[R], tname)
    assert comm.allreduce(xi) is xi
    F.sync()
    check(f"{tag} allreduce in place", F.back(xi, tname), reduce_expected(ins, "sum", tname))
    # allgather: new output (size, n); in place (x is this rank's block of out)
    g = comm.allgather(x)
    F.sync()
    assert tuple(g.shape) == (N, n)
    check(f"{tag} allgather", F.back(g, tname).reshape(-1), np.concatenate(ins))
    go = F.empty(N * n, tname)
    F.poison(go)
    go[R * n:(R + 1) * n] = x
    comm.allgather(go[R * n:(R + 1) * n], go)
    F.sync()
    check(f"{tag} allgather in place", F.back(go, tname), np.concatenate(ins))
    # reduce_scatter: input of N*n elements
    rs_in = [values(r, N * n, tname, salt + 1) for r in range(N)]
    full = reduce_expected(rs_in, "sum", tname)
    xs = F.to(rs_in[R], tname)
    o = F.empty(n, tname)
    F.poison(o)
    comm.reduce_scatter(xs, o)
    F.sync()
    check(f"{tag} reduce_scatter", F.back(o, tname), full[R * n:(R + 1) * n])
    comm.reduce_scatter(xs, xs[R * n:(R + 1) * n])  # in place
    F.sync()
    check(f"{tag} reduce_scatter in place", F.back(xs, tname)[R * n:(R + 1) * n],
          full[R * n:(R + 1) * n])
    # broadcast from the last rank, out of place and in place
    root = N - 1
    b = F.empty(n, tname)
    F.poison(b)
    comm.broadcast(x, root, b)
    F.sync()
    check(f"{tag} broadcast", F.back(b, tname), ins[root])
    bi = F.to(ins[R], tname)
    comm.broadcast(bi, root)
    F.sync()
    check(f"{tag} broadcast in place", F.back(bi, tname), ins[root])
    # reduce to rank 1 % N
    root = 1 % N
    ro = F.empty(n, tname)
    F.poison(ro)
    comm.reduce(x, root, ro, op=ops[-1])
    F.sync()
    if R == root:
        check(f"{tag} reduce {ops[-1]}", F.back(ro, tname), reduce_expected(ins, ops[-1], tname))
    # all_to_all: block q of rank r goes to rank q
    a_in = [values(r, N * n, tname, salt + 2) for r in range(N)]
    a = comm.all_to_all(F.to(a_in[R], tname))
    F.sync()
    want = np.concatenate([a_in[q][R * n:(R + 1) * n] for q in range(N)])
    check(f"{tag} all_to_all", F.back(a, tname), want)
    # send/recv around the ring, in one group
    s = F.to(ins[R], tname)
    rbuf = F.empty(n, tname)
    F.poison(rbuf)
    with maco.group():
        comm.send(s, (R + 1) % N)
        comm.recv(rbuf, (R - 1) % N)
    F.sync()
    check(f"{tag} send/recv ring", F.back(rbuf, tname), ins[(R - 1) % N])


def torch_extras():
    """Registered buffers, explicit streams, splits, graphs, Level 1, GPU-side errors."""
    global checks
    tname, n = "float32", BIG
    ins = [values(r, n, tname, 900) for r in range(N)]
    want = reduce_expected(ins, "sum", tname)
    # maco.empty (registered at allocation) used in place by the mesh kernels
    before = comm.stats()["inplace"]
    x = comm.empty((n,), torch.float32)
    out = comm.empty((n,), "float32")
    x.copy_(to_torch(ins[R], tname))
    Torch.poison(out)
    # A collective never maps a peer's memory: registered on every rank but not mapped, the
    # call goes through scratch; after map_registrations (a barrier, then the mapping) in place.
    comm.barrier()
    comm.allreduce(x, out)
    torch.cuda.synchronize()
    check("maco.empty allreduce before the map", from_torch(out, tname), want)
    unmapped = comm.stats()["inplace"]
    checks += 1
    if unmapped != before:
        failures.append(f"maco.empty: in place before map_registrations ({before} -> {unmapped})")
    comm.map_registrations()
    for _ in range(2):
        Torch.poison(out)
        comm.allreduce(x, out)
    torch.cuda.synchronize()
    check("maco.empty allreduce", from_torch(out, tname), want)
    after = comm.stats()["inplace"]
    checks += 1
    if after - unmapped != 2:
        failures.append(f"maco.empty: {after - unmapped} of 2 calls in place after the map")
    # register() on torch's own memory
    xt = to_torch(ins[R], tname)
    ot = torch.empty_like(xt)
    with comm.register(xt) as rx, comm.register(ot):
        assert rx.registered and rx.nbytes == n * 4
        comm.map_registrations()
        for _ in range(2):
            Torch.poison(ot)
            comm.allreduce(xt, ot)
        torch.cuda.synchronize()
        comm.barrier()  # peers may read these buffers in place until they are done
    check("register allreduce", from_torch(ot, tname), want)
    after2 = comm.stats()["inplace"]
    checks += 1
    if not after2 > after:
        failures.append(f"register: no in-place launch (stats {after} -> {after2})")
    comm.barrier()
    del x, out
    # an explicit stream, ordered after the current one
    s = torch.cuda.Stream()
    xs = to_torch(ins[R], tname)
    s.wait_stream(torch.cuda.current_stream())
    comm.allreduce(xs, stream=s)
    s.synchronize()
    check("explicit stream", from_torch(xs, tname), want)
    # all_to_all with splits along dim 0 (rows of 3)
    splits_of = [[(r + q) % 3 + 1 for q in range(N)] for r in range(N)]  # rows r sends to q
    rows_in = [sum(sp) for sp in splits_of]
    src = [values(r, rows_in[r] * 3, "int32", 901).reshape(rows_in[r], 3) for r in range(N)]
    x2 = to_torch(src[R].reshape(-1), "int32").reshape(rows_in[R], 3)
    out_splits = [splits_of[q][R] for q in range(N)]
    y2 = comm.all_to_all(x2, in_splits=splits_of[R], out_splits=out_splits)
    torch.cuda.synchronize()
    want2 = []
    for q in range(N):
        start = sum(splits_of[q][:R])
        want2.append(src[q][start:start + splits_of[q][R]])
    check("all_to_all splits", from_torch(y2, "int32"), np.concatenate(want2))
    # a CUDA graph captured through torch, replayed on fresh inputs
    gx = torch.empty(4099, dtype=torch.bfloat16, device=DEV)
    gy = torch.empty_like(gx)
    comm.allreduce(gx.zero_(), gy)  # warm up outside capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        comm.allreduce(gx, gy)
    for it in range(3):
        gin = [values(r, 4099, "bfloat16", 1000 + it) for r in range(N)]
        gx.copy_(to_torch(gin[R], "bfloat16"))
        Torch.poison(gy)
        g.replay()
        torch.cuda.synchronize()
        check(f"graph replay {it}", from_torch(gy, "bfloat16"), reduce_expected(gin, "sum", "bf16"))
    # complex sum (pairs of reals), and types MACO moves as bytes
    c = torch.full((5,), complex(R + 1, -R), dtype=torch.complex64, device=DEV)
    comm.allreduce(c)
    torch.cuda.synchronize()
    tot = sum(range(1, N + 1))
    check("complex64 sum", c.cpu().numpy(), np.full(5, complex(tot, -sum(range(N))),
                                                        dtype=np.complex64))
    h = torch.arange(7, dtype=torch.int16, device=DEV) * (R + 1)
    hg = comm.allgather(h)
    bb = torch.tensor([R % 2 == 0] * 3, device=DEV)
    comm.broadcast(bb, root=N - 1)
    torch.cuda.synchronize()
    check("int16 allgather", hg.cpu().numpy().astype(np.float64),
          np.stack([np.arange(7) * (r + 1) for r in range(N)]).astype(np.float64))
    check("bool broadcast", bb.cpu().numpy(), np.array([(N - 1) % 2 == 0] * 3))
    # a producer that exports only DLPack (no torch or CuPy type, no __cuda_array_interface__):
    # in place into the torch tensor behind it, and allgather into a DLPack-only output
    class DLPackOnly:
        def __init__(self, t):
            self._t = t

        def __dlpack__(self, **kw):
            return self._t.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._t.__dlpack_device__()

    dv = [values(r, 1001, "float32", 950) for r in range(N)]
    dx = to_torch(dv[R], "float32")
    dg = torch.empty(N * 1001, device=DEV)
    Torch.poison(dg)
    torch.cuda.synchronize()
    comm.allreduce(DLPackOnly(dx))
    comm.allgather(DLPackOnly(dx), DLPackOnly(dg))
    torch.cuda.synchronize()
    check("DLPack-only allreduce", from_torch(dx, "float32"), reduce_expected(dv, "sum", "float32"))
    check("DLPack-only allgather", from_torch(dg, "float32"),
          np.tile(reduce_expected(dv, "sum", "float32"), N))
    # recv allocating its output (seed API: maco.recv(src=..., shape=..., dtype=...))
    with maco.group():
        comm.send(torch.full((2, 3), float(R), device=DEV), (R + 1) % N)
        got = comm.recv(src=(R - 1) % N, shape=(2, 3), dtype=torch.float32)
    torch.cuda.synchronize()
    check("recv allocates", got.cpu().numpy(), np.full((2, 3), float((R - 1) % N)))
    # GPU-side argument errors
    nc = torch.zeros(4, 4, device=DEV)[:, ::2]
    for fn, exc, pat in ((lambda: comm.allreduce(nc), ValueError, "not contiguous"),
                         (lambda: comm.allreduce(torch.zeros(3, dtype=torch.int16, device=DEV)),
                          TypeError, "cannot reduce"),
                         (lambda: comm.allreduce(torch.zeros(4, device=DEV),
                                                 torch.zeros(5, device=DEV)), ValueError,
                          "needs 4"),
                         (lambda: comm.reduce_scatter(torch.zeros(N * 2 + 1, device=DEV)),
                          ValueError, "multiple")):
        try:
            fn()
        except exc as e:
            assert pat in str(e), str(e)
            checks += 1
        else:
            if not (pat == "multiple" and N == 1):
                raise AssertionError(f"no {exc.__name__} ({pat})")
    # Level 1 on the same job
    maco.init()
    y = maco.allreduce(to_torch(ins[R][:1001], tname), op=maco.SUM)
    gl = maco.allgather(torch.full((2,), float(R), device=DEV))
    torch.cuda.synchronize()
    check("maco.allreduce", from_torch(y, tname), want[:1001])
    check("maco.allgather", gl.cpu().numpy(), np.repeat(np.arange(N, dtype=np.float64), 2).reshape(N, 2))
    maco.barrier()
    maco.finalize()


start = time.time()
for tname in ALL_TYPES:
    for i, n in enumerate(SIZES):
        ops = ["sum", "prod", "min", "max", "avg"] if i == 1 else ["sum"]
        block(run_collectives, Torch, tname, n, ops, i)
block(torch_extras)
if cupy is not None:
    with cupy.cuda.Device(comm.device):
        for tname in ["int8", "uint8", "int32", "uint32", "int64", "uint64", "float16",
                      "float32", "float64"]:
            for i, n in enumerate(SIZES[:3]):
                ops = ["sum", "max"] if i == 1 else ["sum"]
                block(run_collectives, Cupy, tname, n, ops, 50 + i)
else:
    print(f"rank {R}: SKIP: CuPy is not installed", file=sys.stderr)
def timing():
    """Host-side cost of a small allreduce through the Python layer (eager, torch tensor,
    current stream), against the same call through the extension with precomputed args."""
    x = torch.ones(2048, device=DEV)  # 8 KiB
    for _ in range(20):
        comm.allreduce(x)
    torch.cuda.synchronize()
    comm.barrier()
    iters = 300
    t0 = time.perf_counter()
    for _ in range(iters):
        comm.allreduce(x)
    torch.cuda.synchronize()
    t_py = (time.perf_counter() - t0) / iters * 1e6
    s = torch.cuda.current_stream().cuda_stream
    comm.barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        comm._c.allreduce(x.data_ptr(), x.data_ptr(), 2048, 8, 0, s)
    torch.cuda.synchronize()
    t_ext = (time.perf_counter() - t0) / iters * 1e6
    print(f"TIME rank {R}/{N}: 8 KiB float32 allreduce, eager: {t_py:.1f} us per call through "
          f"Communicator.allreduce, {t_ext:.1f} us through the extension alone")




def plans():
    """Execution plans run from Python (Communicator.load_plan / Plan.__call__): the README's
    custom allreduce from the DSL (a Program) and from its file, the shipped allgather and
    reduce-scatter plans, in and out of place, odd and large counts, and a CUDA graph."""
    root = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
    sys.path.insert(0, os.path.join(root, "examples"))
    from plan_allreduce import read_reduce_allreduce

    progs = [comm.load_plan(read_reduce_allreduce(N)),
             comm.load_plan(os.path.join(root, "examples", "plans", f"allreduce_read_{N}r.json"))]
    for k, plan in enumerate(progs):
        for n in (1, 1001, 262147):
            ins = [values(r, n, "float32", 1200 + n) for r in range(N)]
            x = to_torch(ins[R], "float32")
            out = torch.empty_like(x)
            Torch.poison(out)
            plan(x, out)
            torch.cuda.synchronize()
            check(f"plan {plan.name} ({'program' if k == 0 else 'file'}) {n}",
                  from_torch(out, "float32"), reduce_expected(ins, "sum", "float32"))
        ins = [values(r, 4097, "int32", 1300) for r in range(N)]
        y = to_torch(ins[R], "int32")
        plan(y, op=maco.MAX)  # in place
        torch.cuda.synchronize()
        check(f"plan {plan.name} max in place", from_torch(y, "int32"),
              reduce_expected(ins, "max", "int32"))
    ag = comm.load_plan(os.path.join(root, "algorithms", "plans", f"allgather_{N}r.json"))
    rs = comm.load_plan(os.path.join(root, "algorithms", "plans", f"reduce_scatter_{N}r.json"))
    for n in (3, 65537):
        ins = [values(r, n, "bfloat16", 1400) for r in range(N)]
        g = ag(to_torch(ins[R], "bfloat16"))
        torch.cuda.synchronize()
        check(f"plan allgather {n}", from_torch(g, "bfloat16").reshape(-1),
              np.concatenate(ins))
        full = [values(r, n * N, "float32", 1500) for r in range(N)]
        o = rs(to_torch(full[R], "float32"))
        torch.cuda.synchronize()
        check(f"plan reduce_scatter {n}", from_torch(o, "float32"),
              reduce_expected(full, "sum", "float32")[R * n:(R + 1) * n])
    # thread-block groups (maco.language.ThreadBlockGroup): the read-reduce allreduce with
    # each rank's work spread over 4 thread blocks, built and run from Python
    import maco.language as L

    with L.Program(f"ar_tbg_{N}r", L.AllReduce(world_size=N, parts=8)) as gp:
        grp = L.ThreadBlockGroup(range(4))
        for r in range(N):
            me = L.Rank(r)
            srcs = [me.input[0:8]]
            for q in range(N):
                if q != r:
                    srcs.append(L.MemoryChannel(dst_rank=q, src_rank=r, tb=grp).remote(
                        L.Rank(q).input[0:8]))
            me.reduce(me.output[0:8], srcs, tb=grp)
    gplan = comm.load_plan(gp)
    for n in (5, 100003):
        ins = [values(r, n, "float32", 1700 + n) for r in range(N)]
        out = torch.empty(n, device=DEV)
        Torch.poison(out)
        gplan(to_torch(ins[R], "float32"), out)
        torch.cuda.synchronize()
        check(f"plan with thread-block groups {n}", from_torch(out, "float32"),
              reduce_expected(ins, "sum", "float32"))
    gplan.close()
    # a CUDA graph of a plan call, replayed on new inputs
    plan = progs[0]
    gx = torch.zeros(5003, device=DEV)
    gy = torch.empty_like(gx)
    plan(gx, gy)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        plan(gx, gy)
    for it in range(2):
        gin = [values(r, 5003, "float32", 1600 + it) for r in range(N)]
        gx.copy_(to_torch(gin[R], "float32"))
        Torch.poison(gy)
        g.replay()
        torch.cuda.synchronize()
        check(f"plan graph replay {it}", from_torch(gy, "float32"),
              reduce_expected(gin, "sum", "float32"))
    for p in progs + [ag, rs]:
        p.close()


if N in (2, 4):
    block(plans)
block(timing)
comm.check_async_error()
comm.barrier()
if failures:
    for f in failures:
        print(f"FAIL rank {R}: {f}", flush=True)
    print(f"FAIL gpu_collectives rank {R}/{N}: {len(failures)} failures, {checks} checks")
    sys.exit(1)
print(f"PASS gpu_collectives rank {R}/{N}: {checks} checks in {time.time() - start:.1f} s "
      f"(torch{'+cupy' if cupy else ''})")
comm.close()
