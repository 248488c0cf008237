"""Fused compute and communication against cuBLAS + a collective in sequence (issue 23,
section 3). One process per rank, started by torchrun:

    torchrun --nproc-per-node 4 tests/python/bench_fused.py --json fused.json --trace trace.json
    python3 tests/python/bench_fused.py --dry-run --world-size 4     # the cases, no GPU

Tensor-parallel shapes, bfloat16 operands, M tokens (--sizes, default 128, 1024, 8192), hidden
H (--hidden, default 8192), the GEMM split world-size (ws) ways:

* gemm_allreduce (row-parallel linear): X [M, H/ws] @ W [H/ws, H] on each rank, then the
  allreduce (sum) of the [M, H] products.
* allgather_gemm (column-parallel linear): each rank's X shard [M/ws, H] gathered to [M, H],
  then @ W [H, H/ws].

For each case and each --out-dtypes type of the unfused path's GEMM output (bfloat16: what a
bf16 layer computes and sends, torch.matmul; float32: bf16 inputs with fp32 output,
torch.mm(out_dtype=float32), the fused kernel's own output type), times in ms:

  t_gemm       the GEMM alone (torch.matmul / torch.mm: cuBLAS)
  t_comm_nccl  the collective alone through torch.distributed's NCCL process group
  t_comm_maco  the collective alone through maco.Communicator (unregistered torch memory, as an
               application has it)
  t_seq_nccl   GEMM then NCCL collective, on one stream (t_seq_maco: GEMM then MACO's)
  t_fused      one launch of a maco.PersistentKernel whose task graph is the fused operator
               (graph.allreduce(graph.matmul(X, W)) or graph.matmul(graph.allgather(X), W)):
               GEMM tiles (128 x 128, or 128 x 256 where there are enough: maco_fused_gemm_*)
               from bf16 with fp32 output, each tile sent and reduced
               (or each 128-row block of X gathered) while later tiles compute

Each time is the median over --iters timed iterations (after --warmup untimed ones), each
iteration between two CUDA events on the current stream, iterations back to back; then the
largest over ranks. From them, per baseline b (nccl, maco), the figures of issue 23:

  overlap efficiency = (t_gemm + t_comm_b - t_fused) / min(t_gemm, t_comm_b)
  speedup            = t_seq_b / t_fused
  comm share         = t_comm_b / (t_gemm + t_comm_b)

(the seeds, /work/shared/seeds/000_*.txt, report 92.2% overlap efficiency; issue 23 asks for
>= 90%, a speedup >= 1.25x where the communication is at least 20% of the sequential time,
and never slower than sequential: the 'targets' column says which are met). Note that the fused
GEMM + allreduce reduces float32 products, twice the bytes of the bfloat16 rows' allreduce; the
float32 rows compare like with like.

Checks (exit status 1 on a wrong value): inputs are small integers, exact in bf16 and in fp32
sums, so the fused output (poisoned with NaN first) must equal bit for bit the fp32 reference
(cuBLAS fp32 GEMM, TF32 off, and MACO's collective), after its first launch and again after the
timed launches; the unfused outputs must match the reference within their bf16 rounding
(relative Frobenius error <= 2^-6). The fused operators need M (allgather_gemm: M / ws) and H
(allreduce: H / ws rows of W) to be multiples of the 128-row, 32-deep tile; other cases are timed
unfused only and say why. --trace FILE writes the Chrome trace (chrome://tracing, Perfetto: one
lane per CTA, compute and communication tasks) of one fused launch of --trace-case (default
the first fused case at M = 1024), rank 0's, from a second kernel built with profile=True, and
prints its summary table.

Ranks sharing one GPU (world size > GPUs; cuda:LOCAL_RANK % GPUs; start torchrun under
`maco-run -n 1 --mps on`): NVIDIA's NCCL refuses a duplicate GPU, so the NCCL columns are
skipped with the reason printed while the MACO ones run (the times then describe ranks
competing for one GPU, not NVLink). The NCCL process group is torch's; with MACO's libnccl
preloaded it is MACO's, and the JSON says so (nccl_library).
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import json
import os
import statistics
import sys
import time

for _k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_LOCAL_RANK", "MACO_BOOTSTRAP_ADDR",
           "MACO_BOOTSTRAP_NONCE"):
    os.environ.pop(_k, None)

TILE_M, TILE_N, TILE_K = 128, 128, 32  # maco.persistent's GEMM tile
PATTERNS = ("gemm_allreduce", "allgather_gemm")
EFFICIENCY_TARGET = 0.90
SPEEDUP_TARGET = 1.25
COMM_SHARE_FOR_SPEEDUP = 0.20
SEQ_REL_TOL = 2.0 ** -6


# --------------------------------------------------------------------------- cases

def plan_case(pattern: str, m: int, hidden: int, world: int) -> dict:
    """Shapes (rows, cols) of one case, the bytes its collective moves per rank's buffer, the
    GEMM's FLOP, and why the fused operator cannot run it (None when it can). Raises
    ValueError when the case cannot run at all (the split does not divide)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r}: one of {', '.join(PATTERNS)}")
    if m < 1 or hidden < 1 or world < 1:
        raise ValueError(f"M {m}, hidden {hidden}, world size {world}: all must be positive")
    if hidden % world:
        raise ValueError(f"hidden {hidden} is not a multiple of the world size {world}")
    h_ws = hidden // world
    if pattern == "gemm_allreduce":
        a, b, out = (m, h_ws), (h_ws, hidden), (m, hidden)
        comm = dict(op="allreduce", elements=m * hidden)
        why = []
        if m % TILE_M:
            why.append(f"M = {m} is not a multiple of {TILE_M}")
        if hidden % TILE_N:
            why.append(f"H = {hidden} is not a multiple of {TILE_N}")
        if h_ws % TILE_K:
            why.append(f"H / ws = {h_ws} is not a multiple of {TILE_K}")
    else:
        if m % world:
            raise ValueError(f"allgather_gemm: M {m} is not a multiple of the world size "
                             f"{world}")
        a, b, out = (m // world, hidden), (hidden, h_ws), (m, h_ws)
        comm = dict(op="allgather", elements=m * hidden)  # the gathered [M, H]
        why = []
        if (m // world) % TILE_M:
            why.append(f"M / ws = {m // world} rows per rank is not a multiple of the "
                       f"{TILE_M}-row tile")
        if h_ws % TILE_N:
            why.append(f"H / ws = {h_ws} is not a multiple of {TILE_N}")
        if hidden % TILE_K:
            why.append(f"H = {hidden} is not a multiple of {TILE_K}")
    k = a[1]
    gemm_rows = out[0]
    return dict(pattern=pattern, m=m, hidden=hidden, world=world, x_shape=a, w_shape=b,
                out_shape=out, gemm_mnk=(gemm_rows, out[1], k),
                gemm_flop=2 * gemm_rows * out[1] * k, comm_op=comm["op"],
                comm_elements=comm["elements"],
                fused_skip="; ".join(why) if why else None)


def overlap_efficiency(t_gemm: float, t_comm: float, t_fused: float) -> float:
    """Issue 23: (t_gemm + t_comm - t_fused) / min(t_gemm, t_comm): 1 when the shorter of the
    two is hidden entirely, 0 when nothing overlaps, negative when fusing costs time."""
    return (t_gemm + t_comm - t_fused) / min(t_gemm, t_comm)


def speedup(t_seq: float, t_fused: float) -> float:
    return t_seq / t_fused


def comm_share(t_gemm: float, t_comm: float) -> float:
    return t_comm / (t_gemm + t_comm)


def judge(eff: float, spd: float, share: float) -> list:
    """Issue 23's targets missed by one baseline's figures (empty: all met)."""
    miss = []
    if eff < EFFICIENCY_TARGET:
        miss.append(f"efficiency {eff:.0%} < {EFFICIENCY_TARGET:.0%}")
    if share >= COMM_SHARE_FOR_SPEEDUP and spd < SPEEDUP_TARGET:
        miss.append(f"speedup {spd:.2f}x < {SPEEDUP_TARGET}x at comm share {share:.0%}")
    if spd < 1.0:
        miss.append(f"slower than sequential ({spd:.2f}x)")
    return miss


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128,1024,8192", help="M values (tokens), comma-separated")
    p.add_argument("--hidden", type=int, default=8192)
    p.add_argument("--patterns", default=",".join(PATTERNS))
    p.add_argument("--out-dtypes", default="bfloat16,float32",
                   help="unfused GEMM output types (bfloat16, float32)")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--no-nccl", action="store_true", help="leave out the NCCL columns")
    p.add_argument("--no-check", action="store_true", help="leave out the value checks")
    p.add_argument("--workers", type=int, default=0, help="PersistentKernel num_workers (0: "
                   "MACO's default split)")
    p.add_argument("--schedulers", type=int, default=0)
    p.add_argument("--comm-workers", type=int, default=0)
    p.add_argument("--trace", metavar="FILE", help="Chrome trace of one fused launch (rank 0)")
    p.add_argument("--trace-case", metavar="PATTERN:M",
                   help="the case --trace profiles (default: the first fused one at M = 1024, "
                        "else the first fused one)")
    p.add_argument("--json", metavar="FILE", help="write the results (rank 0)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the cases (shapes, bytes, which fuse) and exit; no GPU")
    p.add_argument("--world-size", type=int,
                   help="with --dry-run: the world size (default WORLD_SIZE, else 4)")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds the process group and MACO wait for peers (default 300)")
    a = p.parse_args(argv)
    try:
        a.sizes = [int(s) for s in a.sizes.split(",") if s]
    except ValueError:
        p.error(f"--sizes {a.sizes!r}: comma-separated integers")
    a.patterns = [s for s in a.patterns.split(",") if s]
    a.out_dtypes = [s for s in a.out_dtypes.split(",") if s]
    for pt in a.patterns:
        if pt not in PATTERNS:
            p.error(f"--patterns: {pt!r} is not one of {', '.join(PATTERNS)}")
    for dt in a.out_dtypes:
        if dt not in ("bfloat16", "float32"):
            p.error(f"--out-dtypes: {dt!r} is not bfloat16 or float32")
    if a.iters < 1 or a.warmup < 0:
        p.error("--iters must be >= 1 and --warmup >= 0")
    if a.trace_case is not None:
        pt, _, mm = a.trace_case.partition(":")
        if pt not in a.patterns or not mm.isdigit() or int(mm) not in a.sizes:
            p.error(f"--trace-case {a.trace_case!r}: PATTERN:M of a case this run has")
        a.trace_case = (pt, int(mm))
    return a


def plan_all(a, world: int) -> list:
    return [plan_case(pt, m, a.hidden, world) for pt in a.patterns for m in a.sizes]


def pick_trace_case(cases: list, wanted) -> tuple | None:
    fused = [(c["pattern"], c["m"]) for c in cases if c["fused_skip"] is None]
    if wanted is not None:
        return wanted if wanted in fused else None
    for c in fused:
        if c[1] == 1024:
            return c
    return fused[0] if fused else None


def describe(c: dict) -> str:
    mib = c["comm_elements"] * 2 / 2**20
    return (f"{c['pattern']:<15} M {c['m']:>6}  X {c['x_shape']} W {c['w_shape']} -> "
            f"{c['out_shape']}, {c['comm_op']} of {mib:.1f} MiB bf16, GEMM "
            f"{c['gemm_flop'] / 1e9:.1f} GFLOP; fused: "
            f"{'yes' if c['fused_skip'] is None else 'no (' + c['fused_skip'] + ')'}")


# --------------------------------------------------------------------------- GPU part

def maco_nccl_loaded() -> bool:
    try:
        ctypes.CDLL(None).maco_nccl_call_count
    except AttributeError:
        return False
    return True


class Bench:
    def __init__(self, a):
        import torch
        import torch.distributed as dist

        import maco

        self.a, self.torch, self.dist, self.maco = a, torch, dist, maco
        self.rank = int(os.environ.get("RANK", "0"))
        self.world = int(os.environ.get("WORLD_SIZE", "1"))
        local = int(os.environ.get("LOCAL_RANK", str(self.rank)))
        local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(self.world)))
        self.ngpu = torch.cuda.device_count()
        torch.cuda.set_device(local % self.ngpu)
        self.dev = torch.device("cuda", torch.cuda.current_device())
        self.shared = local_world > self.ngpu
        self.maco_nccl = maco_nccl_loaded()
        timeout = datetime.timedelta(seconds=a.timeout)
        self.nccl_skip = None
        if a.no_nccl:
            self.nccl_skip = "--no-nccl"
        elif self.shared and not self.maco_nccl:
            self.nccl_skip = (f"{local_world} ranks share {self.ngpu} GPU(s): NVIDIA's NCCL "
                              f"refuses a duplicate GPU")
        if self.nccl_skip is None:
            dist.init_process_group("nccl", device_id=self.dev, timeout=timeout)
            self.nccl_library = "maco (preloaded libmaco_nccl)" if self.maco_nccl else \
                "nccl " + ".".join(str(v) for v in torch.cuda.nccl.version())
        else:
            dist.init_process_group("gloo", timeout=timeout)
            self.nccl_library = None
        self.comm = maco.Communicator.from_process_group(dist.group.WORLD, device=self.dev,
                                                         timeout=a.timeout)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.gpu = torch.cuda.get_device_name(self.dev)
        self.failures: list = []
        self.kernels: list = []  # kept to the end: freeing a scratch a peer mapped is unsafe
        self.trace_summary = None
        self.mm_fp32 = self._probe_mm_fp32()

    def log(self, text: str) -> None:
        if self.rank == 0:
            print(text, flush=True)

    def _probe_mm_fp32(self):
        """torch.mm(bf16, bf16, out_dtype=float32) where torch has it, else None."""
        t = self.torch
        x = t.ones(16, 16, device=self.dev, dtype=t.bfloat16)
        y = t.empty(16, 16, device=self.dev)
        try:
            t.mm(x, x, out_dtype=t.float32, out=y)
        except (TypeError, RuntimeError) as e:
            self.log(f"note: torch.mm(out_dtype=float32) unavailable ({e}); float32 rows skip")
            return None
        if not bool((y == 16).all()):
            self.log("note: torch.mm(out_dtype=float32) gave wrong values; float32 rows skip")
            return None

        def mm_fp32(a, b, out):
            return t.mm(a, b, out_dtype=t.float32, out=out)
        return mm_fp32

    def ints(self, shape, salt: int, rank: int | None = None):
        """Small integers in [-2, 2] as bf16, from (rank, salt): exact in bf16 and fp32 sums."""
        t = self.torch
        g = t.Generator(device=self.dev)
        g.manual_seed(1000003 * (self.rank if rank is None else rank) + 7919 * salt + 17)
        return t.randint(-2, 3, shape, generator=g, device=self.dev).to(t.bfloat16)

    def time_ms(self, fn) -> float:
        """Median of --iters back-to-back iterations (CUDA events), largest over ranks."""
        t = self.torch
        for _ in range(self.a.warmup):
            fn()
        t.cuda.synchronize()
        self.comm.barrier()
        ev = [(t.cuda.Event(enable_timing=True), t.cuda.Event(enable_timing=True))
              for _ in range(self.a.iters)]
        for s, e in ev:
            s.record()
            fn()
            e.record()
        t.cuda.synchronize()
        med = statistics.median(s.elapsed_time(e) for s, e in ev)
        return max(self.gather_json(med))

    def gather_json(self, obj) -> list:
        """Every rank's ``obj`` (JSON-serializable), in rank order. The bootstrap's allgather
        takes equal lengths, so the lengths go first and every text is padded to the longest."""
        text = json.dumps(obj).encode()
        n = max(int.from_bytes(x, "little")
                for x in self.comm.allgather_bytes(len(text).to_bytes(8, "little")))
        return [json.loads(x.rstrip(b" ")) for x in self.comm.allgather_bytes(text.ljust(n))]

    def check(self, name: str, got, want, exact: bool) -> None:
        t = self.torch
        got, want = got.float(), want.float()
        if exact:
            bad = (got != want) | got.isnan()
            nbad = int(bad.sum())
            if nbad:
                idx = bad.nonzero()[0].tolist()
                self.failures.append(f"rank {self.rank}: {name}: {nbad} wrong of "
                                     f"{got.numel()}, first at {idx}: {got[tuple(idx)].item()} "
                                     f"vs {want[tuple(idx)].item()}")
        else:
            err = (t.linalg.vector_norm(got - want) / t.linalg.vector_norm(want)).item()
            if not err <= SEQ_REL_TOL:
                self.failures.append(f"rank {self.rank}: {name}: relative error {err:.3g} > "
                                     f"{SEQ_REL_TOL:.3g}")

    def fused_kernel(self, c: dict, x, w, profile: bool):
        k = self.maco.PersistentKernel(self.comm, num_workers=self.a.workers,
                                       num_schedulers=self.a.schedulers,
                                       num_comm_workers=self.a.comm_workers, profile=profile)
        kx, kw = k.register_tensor(x, "X"), k.register_tensor(w, "W")
        with k.task_graph() as g:
            if c["pattern"] == "gemm_allreduce":
                ky = k.register_output(c["out_shape"], self.torch.float32, "Y")
                g.allreduce(g.matmul(kx, kw, output=ky, name="rowpar"))
            else:
                ky = g.matmul(g.allgather(kx), kw, name="colpar")
        k.compile()
        self.kernels.append(k)
        return k, ky.tensor

    def run_case(self, c: dict, trace: bool) -> list:
        t, comm, a = self.torch, self.comm, self.a
        ar = c["pattern"] == "gemm_allreduce"
        x = self.ints(c["x_shape"], 1)
        w = self.ints(c["w_shape"], 2)
        # The fp32 reference from every rank's inputs: exact (small integers).
        if ar:
            ref = comm.allreduce(x.float() @ w.float())
        else:
            xfull = comm.allgather(x).reshape(c["m"], c["hidden"])
            ref = xfull.float() @ w.float()
        t.cuda.synchronize()
        res = dict(fused=None, fused_skip=c["fused_skip"])
        if c["fused_skip"] is None:
            k, y = self.fused_kernel(c, x, w, profile=False)
            if not a.no_check:
                y.fill_(float("nan"))
                k()
                t.cuda.synchronize()
                self.check(f"{c['pattern']} M={c['m']} fused, first launch", y, ref, True)
            res["fused"] = self.time_ms(lambda: k())
            if not a.no_check:
                y.fill_(float("nan"))
                k()
                t.cuda.synchronize()
                self.check(f"{c['pattern']} M={c['m']} fused, after the timed launches", y,
                           ref, True)
            if trace:
                kp, _ = self.fused_kernel(c, x, w, profile=True)
                kp()  # the second launch is the one traced
                kp()
                t.cuda.synchronize()
                if self.rank == 0:
                    kp.export_chrome_trace(a.trace)
                self.trace_summary = kp.summary()
                self.log(f"trace of {c['pattern']} M={c['m']} (rank 0) -> {a.trace}\n"
                         f"{self.trace_summary}")
        rows = []
        for dt in a.out_dtypes:
            rows.append(self._unfused(c, dt, x, w, ref, res))
        return rows

    def _unfused(self, c: dict, dt: str, x, w, ref, res: dict) -> dict:
        t, dist, comm, a = self.torch, self.dist, self.comm, self.a
        ar = c["pattern"] == "gemm_allreduce"
        row = dict(c, out_dtype=dt, t_fused_ms=res["fused"], fused_skip=res["fused_skip"],
                   nccl_skip=self.nccl_skip)
        if dt == "float32" and self.mm_fp32 is None:
            row["skip"] = "torch.mm(out_dtype=float32) unavailable"
            return row
        tdt = t.bfloat16 if dt == "bfloat16" else t.float32
        if dt == "bfloat16":
            def gemm(a_, b_, out):
                return t.matmul(a_, b_, out=out)
        else:
            gemm = self.mm_fp32
        if ar:
            y = t.empty(c["out_shape"], dtype=tdt, device=self.dev)
            zeros = t.zeros(c["out_shape"], dtype=tdt, device=self.dev)  # stays 0 when summed
            row["t_gemm_ms"] = self.time_ms(lambda: gemm(x, w, y))
            nccl_comm = (lambda: dist.all_reduce(zeros))
            maco_comm = (lambda: comm.allreduce(zeros))

            def seq_nccl():
                gemm(x, w, y)
                dist.all_reduce(y)

            def seq_maco():
                gemm(x, w, y)
                comm.allreduce(y)
            out = y
        else:
            xfull = t.empty(c["m"], c["hidden"], dtype=t.bfloat16, device=self.dev)
            y = t.empty(c["out_shape"], dtype=tdt, device=self.dev)
            comm.allgather(x, out=xfull)
            row["t_gemm_ms"] = self.time_ms(lambda: gemm(xfull, w, y))
            nccl_comm = (lambda: dist.all_gather_into_tensor(xfull, x))
            maco_comm = (lambda: comm.allgather(x, out=xfull))

            def seq_nccl():
                dist.all_gather_into_tensor(xfull, x)
                gemm(xfull, w, y)

            def seq_maco():
                comm.allgather(x, out=xfull)
                gemm(xfull, w, y)
            out = y
        for name, comm_fn, seq_fn in (("maco", maco_comm, seq_maco),
                                      ("nccl", nccl_comm, seq_nccl)):
            if name == "nccl" and self.nccl_skip is not None:
                continue
            row[f"t_comm_{name}_ms"] = self.time_ms(comm_fn)
            row[f"t_seq_{name}_ms"] = self.time_ms(seq_fn)
            if not a.no_check:
                out.fill_(float("nan"))
                if not ar:
                    xfull.fill_(float("nan"))
                seq_fn()
                t.cuda.synchronize()
                self.check(f"{c['pattern']} M={c['m']} {dt} cuBLAS + {name}", out, ref,
                           exact=dt == "float32")
        # the figures per baseline
        tg, tf = row["t_gemm_ms"], row["t_fused_ms"]
        row["gemm_tflops"] = c["gemm_flop"] / (tg * 1e-3) / 1e12
        for name in ("nccl", "maco"):
            tc, ts = row.get(f"t_comm_{name}_ms"), row.get(f"t_seq_{name}_ms")
            if tc is None:
                continue
            nbytes = c["comm_elements"] * (4 if ar and dt == "float32" else 2)
            factor = 2 * (self.world - 1) / self.world if ar else (self.world - 1) / self.world
            row[f"busbw_{name}_gbs"] = nbytes / (tc * 1e-3) / 1e9 * factor
            row[f"comm_share_{name}"] = comm_share(tg, tc)
            if tf is not None:
                row[f"efficiency_{name}"] = overlap_efficiency(tg, tc, tf)
                row[f"speedup_{name}"] = speedup(ts, tf)
                row[f"targets_missed_{name}"] = judge(row[f"efficiency_{name}"],
                                                      row[f"speedup_{name}"],
                                                      row[f"comm_share_{name}"])
        return row


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list) -> str:
    out = ["| case | M | out | t_gemm | t_comm nccl / maco | t_seq nccl / maco | t_fused | "
           "efficiency nccl / maco | speedup nccl / maco | comm share (nccl) | targets |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r.get("skip"):
            out.append(f"| {r['pattern']} | {r['m']} | {r['out_dtype']} | skipped: "
                       f"{r['skip']} ||||||||")
            continue
        tgt = []
        for n in ("nccl", "maco"):
            miss = r.get(f"targets_missed_{n}")
            if miss is not None:
                tgt.append(f"{n}: {'met' if not miss else '; '.join(miss)}")
        if r["t_fused_ms"] is None:
            tgt = [f"not fused: {r['fused_skip']}"]
        pct = (lambda v: "-" if v is None else f"{v:.0%}")
        out.append(
            f"| {r['pattern']} | {r['m']} | {r['out_dtype']} | {fmt(r.get('t_gemm_ms'))} | "
            f"{fmt(r.get('t_comm_nccl_ms'))} / {fmt(r.get('t_comm_maco_ms'))} | "
            f"{fmt(r.get('t_seq_nccl_ms'))} / {fmt(r.get('t_seq_maco_ms'))} | "
            f"{fmt(r.get('t_fused_ms'))} | {pct(r.get('efficiency_nccl'))} / "
            f"{pct(r.get('efficiency_maco'))} | {fmt(r.get('speedup_nccl'), '.2f')} / "
            f"{fmt(r.get('speedup_maco'), '.2f')} | "
            f"{pct(r.get('comm_share_nccl', r.get('comm_share_maco')))} | {'; '.join(tgt)} |")
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    a = parse_args(argv)
    if a.dry_run:
        world = a.world_size or int(os.environ.get("WORLD_SIZE", "4"))
        try:
            cases = plan_all(a, world)
        except ValueError as e:
            print(f"bench_fused: {e}")
            return 2
        for c in cases:
            print(describe(c))
        tc = pick_trace_case(cases, a.trace_case)
        print(f"trace case: {'none (no case fuses)' if tc is None else '%s M=%d' % tc}")
        return 0
    import torch

    if not torch.cuda.is_available():
        print(f"SKIP: bench_fused: torch {torch.__version__} sees no CUDA device")
        return 77
    b = Bench(a)
    try:
        cases = plan_all(a, b.world)
    except ValueError as e:
        b.log(f"bench_fused: {e}")
        return 2
    trace_case = pick_trace_case(cases, a.trace_case) if a.trace else None
    if a.trace and trace_case is None:
        b.log("note: --trace: no case fuses, no trace written")
    b.log(f"bench_fused: world size {b.world}, {b.gpu}"
          f"{f', {b.world} ranks sharing {b.ngpu} GPU(s)' if b.shared else ''}, hidden "
          f"{a.hidden}, median of {a.iters} iterations (ms, largest over ranks); NCCL: "
          f"{b.nccl_library or 'skipped: ' + b.nccl_skip}")
    if b.nccl_skip:
        b.log(f"SKIP: the NCCL baseline: {b.nccl_skip}")
    rows = []
    t0 = time.time()
    for c in cases:
        b.log(describe(c))
        rows += b.run_case(c, trace=(c["pattern"], c["m"]) == trace_case)
    text = table(rows)
    b.log(text)
    fails = b.gather_json(b.failures)
    failures = [f for fl in fails for f in fl]
    if b.rank == 0:
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(bench="bench_fused", world_size=b.world, gpu=b.gpu,
                               ranks_share_gpu=b.shared, gpus_visible=b.ngpu,
                               nccl_library=b.nccl_library, nccl_skip=b.nccl_skip,
                               hidden=a.hidden, iters=a.iters, warmup=a.warmup,
                               torch=torch.__version__, trace=a.trace if trace_case else None,
                               trace_case=trace_case, trace_summary=b.trace_summary,
                               rows=rows, failures=failures,
                               ok=not failures, table=text), f, indent=1)
        for f in failures:
            print(f"FAIL {f}")
        print(f"{'FAIL' if failures else 'PASS'} bench_fused: {len(rows)} rows, "
              f"{len(failures)} wrong result(s), {time.time() - t0:.0f} s", flush=True)
    b.comm.barrier()
    torch.cuda.synchronize()
    for k in b.kernels:
        k.close()
    b.comm.close()
    b.dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
