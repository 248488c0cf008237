"""Fused GEMM + collective operators against the same work done in sequence, and against
PyTorch's async tensor parallel. One process per rank, started by torchrun:

    torchrun --nproc-per-node 4 tests/python/bench_fused.py --json fused.json --trace trace.json
    python3 tests/python/bench_fused.py --dry-run --world-size 4     # the cases, no GPU

The three tensor-parallel patterns, bf16 operands, M tokens (--sizes), ws ranks:

* gemm_allreduce (row-parallel linear): X [M, K] @ W [K, N] on each rank, then the allreduce of
  the [M, N] products.
* gemm_reduce_scatter (row-parallel linear, sequence-parallel output): the same product, then the
  reduce-scatter: rank r keeps rows [r M / ws, (r + 1) M / ws) of the sum.
* allgather_gemm (column-parallel linear, sequence-parallel input): each rank's X shard
  [M / ws, K] gathered to [M, K], then @ W [K, N].

Shape sets (--sets): ``tp`` (hidden H = --hidden, the split ws ways: K = H / ws, N = H for the
two row-parallel patterns, K = H, N = H / ws for allgather_gemm) and ``llama70b`` (Llama-3-70B
tensor parallel over ws ranks: hidden 8192, MLP 28672: allgather_gemm K = 8192, N = 28672 / ws,
and gemm_reduce_scatter K = 28672 / ws, N = 8192).

For each case and output type (--out-dtypes: bfloat16, what a bf16 layer computes and sends;
float32, bf16 inputs with fp32 output, torch.mm(out_dtype=float32)), times in ms:

  t_gemm       the GEMM alone (cuBLAS through torch)
  t_comm       the collective alone on the GEMM's output type, through torch.distributed's NCCL
               process group (t_comm_nccl) and maco.Communicator (t_comm_maco)
  t_seq        GEMM then collective on one stream (t_seq_nccl, t_seq_maco)
  t_fused      one launch of a maco.PersistentKernel whose graph is the fused operator, the best
               over --comm-workers (0: the runtime's choice) with the count that gave it
  t_tp         maco.tp's operator (cuBLAS GEMMs, copy engines, pipelined; see its docstring):
               with its defaults (--pipe-chunks 0), and the best over --pipe-chunks (0: the
               defaults, n: method "ce" with n chunks) x --pipe-ctas (the communicator's CTA
               cap) with the chunk count that gave it; "tp vs seq nccl" is the defaults'
               (the best's when 0 is not among --pipe-chunks)
  t_asynctp    PyTorch's async TP (torch.ops.symm_mem.fused_all_gather_matmul /
               fused_matmul_reduce_scatter; bf16 only, no allreduce form)

Each time is the median over --iters back-to-back iterations between CUDA events, the largest
over ranks. Figures against cuBLAS + NCCL (the issue's targets):

  overlap efficiency = (t_gemm + t_comm - t_fused) / min(t_gemm, t_comm)  (target >= 90%)
  speedup            = t_seq / t_fused            (>= 1.25x where comm share >= 20%; never < 1)
  comm share         = t_comm / (t_gemm + t_comm)

Checks (exit status 1 on a wrong value): inputs are small integers, so every product is exact
in fp32; the reference rounds each rank's product to the output type and sums in fp32 in rank
order, rounding once (what the fused operators do), and the fused output (poisoned with NaN
before) must equal it bit for bit, after its first launch and after the timed ones. The
sequential and async-TP results must match within bf16 rounding (relative Frobenius error
<= 2^-6). --trace FILE writes the Chrome trace of one fused launch (rank 0) of --trace-case.

Ranks sharing one GPU (world size > GPUs): the NCCL and async-TP columns are skipped (NVIDIA's
NCCL refuses a duplicate GPU) and the times describe ranks competing for one GPU.
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
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")

TILE_N, TILE_K = 128, 32  # maco.persistent's GEMM tile (any M)
PATTERNS = ("gemm_allreduce", "gemm_reduce_scatter", "allgather_gemm")
SETS = ("tp", "llama70b")
LLAMA_HIDDEN, LLAMA_MLP = 8192, 28672
EFFICIENCY_TARGET = 0.90
SPEEDUP_TARGET = 1.25
COMM_SHARE_FOR_SPEEDUP = 0.20
SEQ_REL_TOL = 2.0 ** -6


# --------------------------------------------------------------------------- cases

def plan_case(pattern: str, m: int, k: int, n: int, world: int, shape_set: str = "tp") -> dict:
    """One case: shapes (rows, cols), the collective's elements, the GEMM's FLOP per rank, and
    why the fused operator cannot run it (None when it can). Raises ValueError when the case
    cannot run at all (M does not split over the ranks)."""
    if pattern not in PATTERNS:
        raise ValueError(f"pattern {pattern!r}: one of {', '.join(PATTERNS)}")
    if min(m, k, n, world) < 1:
        raise ValueError(f"M {m}, K {k}, N {n}, world size {world}: all must be positive")
    if pattern != "gemm_allreduce" and m % world:
        raise ValueError(f"{pattern}: M {m} is not a multiple of the world size {world}")
    if pattern == "gemm_allreduce":
        x, out, comm = (m, k), (m, n), dict(op="allreduce", elements=m * n)
    elif pattern == "gemm_reduce_scatter":
        x, out, comm = (m, k), (m // world, n), dict(op="reduce_scatter", elements=m * n)
    else:
        x, out, comm = (m // world, k), (m, n), dict(op="allgather", elements=m * k)
    why = []
    if n % TILE_N:
        why.append(f"N = {n} is not a multiple of {TILE_N}")
    if k % TILE_K:
        why.append(f"K = {k} is not a multiple of {TILE_K}")
    return dict(pattern=pattern, set=shape_set, m=m, k=k, n=n, world=world, x_shape=x,
                w_shape=(k, n), out_shape=out, gemm_flop=2 * m * n * k, comm_op=comm["op"],
                comm_elements=comm["elements"], fused_skip="; ".join(why) if why else None)


def overlap_efficiency(t_gemm: float, t_comm: float, t_fused: float) -> float:
    """(t_gemm + t_comm - t_fused) / min(t_gemm, t_comm): 1 when the shorter of the two is
    hidden entirely, 0 when nothing overlaps, negative when fusing costs time."""
    return (t_gemm + t_comm - t_fused) / min(t_gemm, t_comm)


def speedup(t_seq: float, t_fused: float) -> float:
    return t_seq / t_fused


def comm_share(t_gemm: float, t_comm: float) -> float:
    return t_comm / (t_gemm + t_comm)


def judge(eff: float, spd: float, share: float, t_fused: float = None,
          t_asynctp: float = None) -> list:
    """The targets missed by one row's figures against cuBLAS + NCCL (empty: all met)."""
    miss = []
    if share >= COMM_SHARE_FOR_SPEEDUP and eff < EFFICIENCY_TARGET:
        miss.append(f"efficiency {eff:.0%} < {EFFICIENCY_TARGET:.0%}")
    if share >= COMM_SHARE_FOR_SPEEDUP and spd < SPEEDUP_TARGET:
        miss.append(f"speedup {spd:.2f}x < {SPEEDUP_TARGET}x at comm share {share:.0%}")
    if spd < 1.0:
        miss.append(f"slower than sequential ({spd:.2f}x)")
    if t_fused is not None and t_asynctp is not None and t_fused > t_asynctp:
        miss.append(f"slower than async TP ({t_asynctp / t_fused:.2f}x)")
    return miss


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="128,1024,4096,8192", help="M values (tokens)")
    p.add_argument("--sets", default=",".join(SETS), help="shape sets: tp, llama70b")
    p.add_argument("--hidden", type=int, default=8192, help="the tp set's hidden size")
    p.add_argument("--patterns", default=",".join(PATTERNS))
    p.add_argument("--out-dtypes", default="bfloat16,float32")
    p.add_argument("--iters", type=int, default=20, help="timed iterations (default 20)")
    p.add_argument("--warmup", type=int, default=5, help="untimed iterations first (default 5)")
    p.add_argument("--comm-workers", default="0",
                   help="PersistentKernel num_comm_workers to try, comma-separated (0: the "
                        "runtime's choice); the fastest is reported")
    p.add_argument("--workers", type=int, default=0, help="PersistentKernel num_workers")
    p.add_argument("--pipe-chunks", default="0",
                   help="maco.tp chunk counts to try, comma-separated (0: its default; "
                        "empty: leave maco.tp out)")
    p.add_argument("--pipe-ctas", default="0",
                   help="communicator CTA caps to try with maco.tp (0: no cap)")
    p.add_argument("--tp-ar-split", default="",
                   help="maco.tp gemm_allreduce: smallest world sizes for its reduce-scatter + "
                        "allgather path to try, comma-separated (e.g. 3,99 tries it and the "
                        "one-step path at 4 ranks; empty: the library's choice)")
    p.add_argument("--no-fused", action="store_true", help="leave out the persistent kernel")
    p.add_argument("--no-nccl", action="store_true", help="leave out the NCCL columns")
    p.add_argument("--no-asynctp", action="store_true", help="leave out PyTorch's async TP")
    p.add_argument("--no-check", action="store_true", help="leave out the value checks")
    p.add_argument("--trace", metavar="FILE", help="Chrome trace of one fused launch (rank 0)")
    p.add_argument("--trace-case", metavar="PATTERN:M",
                   help="the case --trace profiles (default: the first fused one at M = 1024)")
    p.add_argument("--json", metavar="FILE", help="write the results (rank 0)")
    p.add_argument("--dry-run", action="store_true", help="print the cases and exit; no GPU")
    p.add_argument("--world-size", type=int, help="with --dry-run: the world size (default 4)")
    p.add_argument("--timeout", type=float, default=300, help="seconds to wait for peers")
    a = p.parse_args(argv)
    try:
        a.sizes = [int(s) for s in a.sizes.split(",") if s]
        a.comm_workers = [int(s) for s in a.comm_workers.split(",") if s]
        a.pipe_chunks = [int(s) for s in a.pipe_chunks.split(",") if s]
        a.pipe_ctas = [int(s) for s in a.pipe_ctas.split(",") if s]
    except ValueError:
        p.error("--sizes, --comm-workers, --pipe-chunks, --pipe-ctas: comma-separated integers")
    if any(v < 0 for v in a.pipe_chunks + a.pipe_ctas) or not a.pipe_ctas:
        p.error("--pipe-chunks and --pipe-ctas: integers >= 0, --pipe-ctas not empty")
    a.sets = [s for s in a.sets.split(",") if s]
    a.patterns = [s for s in a.patterns.split(",") if s]
    a.out_dtypes = [s for s in a.out_dtypes.split(",") if s]
    for s in a.sets:
        if s not in SETS:
            p.error(f"--sets: {s!r} is not one of {', '.join(SETS)}")
    for pt in a.patterns:
        if pt not in PATTERNS:
            p.error(f"--patterns: {pt!r} is not one of {', '.join(PATTERNS)}")
    for dt in a.out_dtypes:
        if dt not in ("bfloat16", "float32"):
            p.error(f"--out-dtypes: {dt!r} is not bfloat16 or float32")
    if a.iters < 1 or a.warmup < 0 or not a.comm_workers:
        p.error("--iters must be >= 1, --warmup >= 0, --comm-workers not empty")
    if a.trace_case is not None:
        pt, _, mm = a.trace_case.partition(":")
        if pt not in a.patterns or not mm.isdigit() or int(mm) not in a.sizes:
            p.error(f"--trace-case {a.trace_case!r}: PATTERN:M of a case this run has")
        a.trace_case = (pt, int(mm))
    return a


def plan_all(a, world: int) -> list:
    cases = []
    for s in a.sets:
        for pt in a.patterns:
            if s == "tp":
                h = a.hidden
                if h % world:
                    raise ValueError(f"hidden {h} is not a multiple of the world size {world}")
                k, n = (h, h // world) if pt == "allgather_gemm" else (h // world, h)
            else:
                if pt == "gemm_allreduce":
                    continue
                if LLAMA_MLP % world:
                    raise ValueError(f"the MLP size {LLAMA_MLP} is not a multiple of the world "
                                     f"size {world}")
                f = LLAMA_MLP // world
                k, n = (LLAMA_HIDDEN, f) if pt == "allgather_gemm" else (f, LLAMA_HIDDEN)
            for m in a.sizes:
                cases.append(plan_case(pt, m, k, n, world, s))
    return cases


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
    return (f"{c['set']:<8} {c['pattern']:<19} M {c['m']:>6}  X {c['x_shape']} W "
            f"{c['w_shape']} -> {c['out_shape']}, {c['comm_op']} of {mib:.1f} MiB bf16, GEMM "
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
        self.asynctp_skip = self._setup_asynctp()
        self.comm = maco.Communicator.from_process_group(dist.group.WORLD, device=self.dev,
                                                         timeout=a.timeout)
        torch.backends.cuda.matmul.allow_tf32 = False
        torch.backends.cudnn.allow_tf32 = False
        self.gpu = torch.cuda.get_device_name(self.dev)
        self.failures: list = []
        self.trace_summary = None
        self.mm_fp32 = self._probe_mm_fp32()

    def _setup_asynctp(self):
        if self.a.no_asynctp:
            return "--no-asynctp"
        if self.nccl_skip is not None:
            return "needs the NCCL process group (" + self.nccl_skip + ")"
        try:
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group
            self.group_name = self.dist.group.WORLD.group_name
            enable_symm_mem_for_group(self.group_name)
        except Exception as e:  # noqa: BLE001 - reported in the table
            return f"unavailable: {type(e).__name__}: {e}"
        return None

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
            return None

        def mm_fp32(a, b, out):
            return t.mm(a, b, out_dtype=t.float32, out=out)
        return mm_fp32

    def ints(self, shape, salt: int):
        """Small integers in [-2, 2] as bf16 (this rank's): exact products."""
        t = self.torch
        g = t.Generator(device=self.dev)
        g.manual_seed(1000003 * self.rank + 7919 * salt + int(time.time()) % 1000)
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
        """Every rank's ``obj`` (JSON), in rank order (lengths first, texts padded)."""
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

    def reference(self, c: dict, x, w, tdt):
        """The fused operators' exact result (see the module's text)."""
        t, comm = self.torch, self.comm
        if c["pattern"] == "allgather_gemm":
            xfull = comm.allgather(x).reshape(c["m"], c["k"])
            return (xfull.float() @ w.float()).to(tdt)
        part = (x.float() @ w.float()).to(tdt)
        parts = comm.allgather(part).reshape(self.world, c["m"], c["n"])
        s = parts[0].float()
        for q in range(1, self.world):
            s = s + parts[q].float()
        s = s.to(tdt)
        if c["pattern"] == "gemm_reduce_scatter":
            rows = c["m"] // self.world
            s = s[self.rank * rows:(self.rank + 1) * rows].contiguous()
        del parts
        t.cuda.synchronize()
        return s

    def fused_kernel(self, c: dict, x, w, tdt, comm_workers: int, profile: bool):
        k = self.maco.PersistentKernel(self.comm, num_workers=self.a.workers,
                                       num_comm_workers=comm_workers, profile=profile)
        kx, kw = k.register_tensor(x, "X"), k.register_tensor(w, "W")
        with k.task_graph() as g:
            if c["pattern"] == "allgather_gemm":
                ky = k.register_output(c["out_shape"], tdt, "Y")
                g.matmul(g.allgather(kx), kw, output=ky, name="colpar")
            else:
                ky = k.register_output((c["m"], c["n"]), tdt, "Y")
                y = g.matmul(kx, kw, output=ky, name="rowpar")
                if c["pattern"] == "gemm_allreduce":
                    g.allreduce(y)
                else:
                    ky = g.reduce_scatter(y)
        k.compile()
        return k, ky.tensor

    def run_fused(self, c: dict, x, w, tdt, ref, trace: bool) -> dict:
        t, a = self.torch, self.a
        best = None
        tag = f"{c['set']} {c['pattern']} M={c['m']} {str(tdt)[6:]} fused"
        for cw in a.comm_workers:
            k, y = self.fused_kernel(c, x, w, tdt, cw, profile=False)
            if not a.no_check:
                y.fill_(float("nan"))
                self.comm.barrier()
                k()
                t.cuda.synchronize()
                self.check(f"{tag} (comm workers {cw}), first launch", y, ref, True)
            tf = self.time_ms(lambda: k())
            if not a.no_check:
                y.fill_(float("nan"))
                self.comm.barrier()
                k()
                t.cuda.synchronize()
                self.check(f"{tag} (comm workers {cw}), after the timed launches", y, ref, True)
            used = k.config["comm_workers"]
            self.comm.barrier()
            t.cuda.synchronize()
            k.close()
            if best is None or tf < best[0]:
                best = (tf, used)
        if trace:
            k, _ = self.fused_kernel(c, x, w, tdt, a.comm_workers[0], profile=True)
            k()
            k()
            t.cuda.synchronize()
            if self.rank == 0:
                k.export_chrome_trace(a.trace)
            self.trace_summary = k.summary()
            self.log(f"trace of {c['pattern']} M={c['m']} (rank 0) -> {a.trace}\n"
                     f"{self.trace_summary}")
            self.comm.barrier()
            t.cuda.synchronize()
            k.close()
        return dict(t_fused_ms=best[0], fused_comm_workers=best[1])

    def run_asynctp(self, c: dict, x, w, ref, row: dict) -> None:
        t = self.torch
        if self.asynctp_skip is not None:
            row["asynctp_skip"] = self.asynctp_skip
            return
        try:
            if c["pattern"] == "allgather_gemm":
                def fn():
                    return t.ops.symm_mem.fused_all_gather_matmul(
                        x, [w], gather_dim=0, group_name=self.group_name)[1][0]
            elif c["pattern"] == "gemm_reduce_scatter":
                def fn():
                    return t.ops.symm_mem.fused_matmul_reduce_scatter(
                        x, w, "sum", scatter_dim=0, group_name=self.group_name)
            else:
                row["asynctp_skip"] = "no fused matmul + allreduce in async TP"
                return
            out = fn()
            t.cuda.synchronize()
            if not self.a.no_check:
                self.check(f"{c['set']} {c['pattern']} M={c['m']} async TP", out, ref, False)
            row["t_asynctp_ms"] = self.time_ms(fn)
        except Exception as e:  # noqa: BLE001 - a peer that fails is reported, not fatal
            row["asynctp_skip"] = f"{type(e).__name__}: {str(e).splitlines()[0][:120]}"

    def run_case(self, c: dict, trace: bool) -> list:
        rows = []
        x = self.ints(c["x_shape"], 1)
        w = self.ints(c["w_shape"], 2)
        for dt in self.a.out_dtypes:
            tdt = self.torch.bfloat16 if dt == "bfloat16" else self.torch.float32
            row = dict(c, out_dtype=dt, nccl_skip=self.nccl_skip)
            if dt == "float32" and self.mm_fp32 is None:
                row["skip"] = "torch.mm(out_dtype=float32) unavailable"
                rows.append(row)
                continue
            ref = self.reference(c, x, w, tdt)
            if c["fused_skip"] is None and not self.a.no_fused:
                row.update(self.run_fused(c, x, w, tdt, ref, trace and dt == "bfloat16"))
            self._unfused(c, dt, tdt, x, w, ref, row)
            self.run_pipe(c, dt, tdt, x, w, ref, row)
            if dt == "bfloat16":
                self.run_asynctp(c, x, w, ref, row)
            self._figures(c, row)
            rows.append(row)
            del ref
        return rows

    def _unfused(self, c: dict, dt: str, tdt, x, w, ref, row: dict) -> None:
        t, dist, comm, a = self.torch, self.dist, self.comm, self.a
        gemm = (lambda a_, b_, out: t.matmul(a_, b_, out=out)) if dt == "bfloat16" \
            else self.mm_fp32
        pat = c["pattern"]
        if pat == "allgather_gemm":
            xfull = t.empty(c["m"], c["k"], dtype=t.bfloat16, device=self.dev)
            y = t.empty(c["out_shape"], dtype=tdt, device=self.dev)
            comm.allgather(x, out=xfull)
            row["t_gemm_ms"] = self.time_ms(lambda: gemm(xfull, w, y))
            comm_fns = dict(nccl=lambda: dist.all_gather_into_tensor(xfull, x),
                            maco=lambda: comm.allgather(x, out=xfull))

            def seq(name):
                comm_fns[name]()
                gemm(xfull, w, y)
            out = y
        else:
            p = t.empty(c["m"], c["n"], dtype=tdt, device=self.dev)
            zeros = t.zeros(c["m"], c["n"], dtype=tdt, device=self.dev)
            row["t_gemm_ms"] = self.time_ms(lambda: gemm(x, w, p))
            if pat == "gemm_allreduce":
                comm_fns = dict(nccl=lambda: dist.all_reduce(zeros),
                                maco=lambda: comm.allreduce(zeros))
                out = p

                def seq(name):
                    gemm(x, w, p)
                    (dist.all_reduce(p) if name == "nccl" else comm.allreduce(p))
            else:
                shard = t.empty(c["out_shape"], dtype=tdt, device=self.dev)
                comm_fns = dict(nccl=lambda: dist.reduce_scatter_tensor(shard, zeros),
                                maco=lambda: comm.reduce_scatter(zeros, out=shard))
                out = shard

                def seq(name):
                    gemm(x, w, p)
                    (dist.reduce_scatter_tensor(shard, p) if name == "nccl"
                     else comm.reduce_scatter(p, out=shard))
        for name in ("maco", "nccl"):
            if name == "nccl" and self.nccl_skip is not None:
                continue
            row[f"t_comm_{name}_ms"] = self.time_ms(comm_fns[name])
            row[f"t_seq_{name}_ms"] = self.time_ms(lambda: seq(name))
            if not a.no_check:
                out.fill_(float("nan"))
                seq(name)
                t.cuda.synchronize()
                self.check(f"{c['set']} {pat} M={c['m']} {dt} cuBLAS + {name}", out, ref,
                           exact=False)

    def run_pipe(self, c: dict, dt: str, tdt, x, w, ref, row: dict) -> None:
        """maco.tp's pipelined operator: the best over --pipe-chunks x --pipe-ctas, each
        pair's result checked (within bf16 rounding, as the sequential paths)."""
        if not self.a.pipe_chunks:
            return
        from maco import tp
        t, comm = self.torch, self.comm
        fn = dict(gemm_allreduce=tp.gemm_allreduce, gemm_reduce_scatter=tp.gemm_reduce_scatter,
                  allgather_gemm=tp.allgather_gemm)[c["pattern"]]
        out = t.empty(c["out_shape"], dtype=tdt, device=self.dev)
        cap0, split0 = comm.max_ctas, tp._AR_SPLIT_MIN_RANKS
        splits = [int(v) for v in self.a.tp_ar_split.split(",") if v] \
            if c["pattern"] == "gemm_allreduce" else []
        best, tried = None, {}
        try:
            for ctas, ch, split in ((ctas, ch, split) for ctas in self.a.pipe_ctas
                                    for ch in self.a.pipe_chunks for split in splits or [None]):
                comm.set_max_ctas(ctas)
                tp._AR_SPLIT_MIN_RANKS = split0 if split is None else split
                # 0: the operator's defaults (method and chunks), else "ce" with ch chunks
                kw = dict() if ch == 0 else dict(chunks=ch, method="ce")
                if not self.a.no_check:
                    out.fill_(float("nan"))
                    fn(x, w, comm, out=out, **kw)
                    t.cuda.synchronize()
                    self.check(f"{c['set']} {c['pattern']} M={c['m']} {dt} maco.tp "
                               f"chunks={ch} ctas={ctas}", out, ref, exact=False)
                ms = self.time_ms(lambda: fn(x, w, comm, out=out, **kw))
                tried[f"{ch}/{ctas}" + ("" if split is None else f"/split{split}")] = ms
                if ch == 0 and ctas == self.a.pipe_ctas[0] and split == (splits[0] if splits else None):
                    row["t_tp_default_ms"] = ms
                if best is None or ms < best[0]:
                    best = (ms, ch, ctas)
        finally:
            comm.set_max_ctas(cap0)
            tp._AR_SPLIT_MIN_RANKS = split0
        row["t_pipe_ms"], row["pipe_chunks"], row["pipe_ctas"] = best
        row["pipe_tried"] = tried

    def _figures(self, c: dict, row: dict) -> None:
        tg, tf = row.get("t_gemm_ms"), row.get("t_fused_ms")
        esz = 2 if row["out_dtype"] == "bfloat16" or c["pattern"] == "allgather_gemm" else 4
        row["gemm_tflops"] = c["gemm_flop"] / (tg * 1e-3) / 1e12 if tg else None
        for name in ("nccl", "maco"):
            tc, ts = row.get(f"t_comm_{name}_ms"), row.get(f"t_seq_{name}_ms")
            if tc is None or tg is None:
                continue
            factor = 2 * (self.world - 1) / self.world if c["pattern"] == "gemm_allreduce" \
                else (self.world - 1) / self.world
            row[f"busbw_{name}_gbs"] = c["comm_elements"] * esz / (tc * 1e-3) / 1e9 * factor
            row[f"comm_share_{name}"] = comm_share(tg, tc)
            if tf is not None:
                row[f"efficiency_{name}"] = overlap_efficiency(tg, tc, tf)
                row[f"speedup_{name}"] = speedup(ts, tf)
        if tf is not None and "speedup_nccl" in row:
            row["targets_missed"] = judge(row["efficiency_nccl"], row["speedup_nccl"],
                                          row["comm_share_nccl"], tf, row.get("t_asynctp_ms"))


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def table(rows: list) -> str:
    out = ["| set | case | M | out | t_gemm | t_comm nccl / maco | t_seq nccl / maco | "
           "t_asynctp | t_fused (comm SMs) | t_tp default / best (chunks) | tp vs seq nccl | "
           "efficiency | speedup vs nccl / maco / asynctp | "
           "comm share | targets |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    pct = (lambda v: "-" if v is None else f"{v:.0%}")
    for r in rows:
        head = f"| {r['set']} | {r['pattern']} | {r['m']} | {r['out_dtype']} |"
        if r.get("skip"):
            out.append(f"{head} skipped: {r['skip']} |||||||||||")
            continue
        if r.get("t_fused_ms") is None:
            tgt = f"not fused: {r.get('fused_skip')}"
        elif r.get("targets_missed") is None:
            tgt = "-"
        else:
            tgt = "met" if not r["targets_missed"] else "; ".join(r["targets_missed"])
        tf, ta = r.get("t_fused_ms"), r.get("t_asynctp_ms")
        sp_a = None if tf is None or ta is None else ta / tf
        tp_, ts_ = r.get("t_tp_default_ms", r.get("t_pipe_ms")), r.get("t_seq_nccl_ms")
        pipe = "-" if r.get("t_pipe_ms") is None else \
            f"{fmt(r.get('t_tp_default_ms'))} / {r['t_pipe_ms']:.3f} ({r['pipe_chunks']})"
        pipe_sp = None if tp_ is None or ts_ is None else ts_ / tp_
        out.append(
            f"{head} {fmt(r.get('t_gemm_ms'))} | {fmt(r.get('t_comm_nccl_ms'))} / "
            f"{fmt(r.get('t_comm_maco_ms'))} | {fmt(r.get('t_seq_nccl_ms'))} / "
            f"{fmt(r.get('t_seq_maco_ms'))} | {fmt(ta)} | {fmt(tf)} "
            f"({r.get('fused_comm_workers', '-')}) | {pipe} | {fmt(pipe_sp, '.2f')} | "
            f"{pct(r.get('efficiency_nccl'))} | "
            f"{fmt(r.get('speedup_nccl'), '.2f')} / {fmt(r.get('speedup_maco'), '.2f')} / "
            f"{fmt(sp_a, '.2f')} | {pct(r.get('comm_share_nccl', r.get('comm_share_maco')))} | "
            f"{tgt} |")
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
    b.log(f"bench_fused: world size {b.world}, {b.gpu}"
          f"{f', {b.world} ranks sharing {b.ngpu} GPU(s)' if b.shared else ''}, median of "
          f"{a.iters} iterations (ms, largest over ranks); NCCL: "
          f"{b.nccl_library or 'skipped: ' + b.nccl_skip}; async TP: "
          f"{b.asynctp_skip or 'torch ' + torch.__version__}")
    rows = []
    t0 = time.time()
    for c in cases:
        b.log(describe(c))
        rows += b.run_case(c, trace=(c["pattern"], c["m"]) == trace_case)
        if b.rank == 0 and a.json:  # what has run so far, should a later case fail
            with open(a.json + ".partial", "w") as f:
                json.dump(rows, f)
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
                               asynctp=b.asynctp_skip or "torch " + torch.__version__,
                               iters=a.iters, warmup=a.warmup, torch=torch.__version__,
                               comm_workers_tried=a.comm_workers,
                               trace=a.trace if trace_case else None, trace_case=trace_case,
                               trace_summary=b.trace_summary, rows=rows, failures=failures,
                               ok=not failures, table=text), f, indent=1)
        for f in failures:
            print(f"FAIL {f}")
        print(f"{'FAIL' if failures else 'PASS'} bench_fused: {len(rows)} rows, "
              f"{len(failures)} wrong result(s), {time.time() - t0:.0f} s", flush=True)
    b.comm.barrier()
    torch.cuda.synchronize()
    b.comm.close()
    b.dist.destroy_process_group()
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
