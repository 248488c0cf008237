"""Training benchmarks of issue 23 (section 2): a data-parallel training loop and a
tensor-parallel MLP block, timed per step, on one torch.distributed backend. One process per
rank, started by torchrun:

    torchrun --nproc-per-node 4 tests/python/bench_ddp.py --mode ddp --backend nccl --json ddp.json
    LD_PRELOAD=build/nccl/libmaco_nccl.so torchrun ... --backend nccl   # NCCL calls on MACO
    torchrun ... --backend maco                           # the maco package's backend
    torchrun --nproc-per-node 2 tests/python/bench_ddp.py --backend gloo --small   # CPU smoke
    python3 scripts/compare_runs.py ddp-nccl.json ddp-maco.json     # same curve? step time?
    torchrun ... --backends nccl,maco --rounds 4                    # step times, one job

Ranks sharing one GPU (world size > GPUs: cuda:LOCAL_RANK % GPUs) need an MPS server: start
torchrun under `maco-run -n 1 --mps on` (maco-run's own MACO_* variables are dropped here).
NVIDIA's NCCL refuses two ranks on one GPU, so --backend nccl then needs MACO's libnccl
preloaded; without it the run prints 'SKIP: ...' and exits 77.

--mode ddp: torch DistributedDataParallel around a GPT-style decoder (default: 12 blocks of
attention + MLP, hidden 768, 12 heads, vocabulary 32768, 1024 positions, the output layer tied
to the token embedding: 111,008,256 parameters; the count is printed), trained with
AdamW. The model DDP wraps is bfloat16 (parameters, activations, gradients): DDP's reducer
all-reduces bf16 gradient buckets itself (default 25 MB buckets, --bucket-mb), the same call
sequence on every backend, without a comm hook. AdamW updates fp32 master copies of the
parameters (the gradients cast up after the all-reduce, the bf16 parameters copied back after
the step), as mixed-precision training does: AdamW directly on bf16 parameters loses every
update below half a bf16 ulp, so a one-ulp difference in a gradient sum (another reduction
order) changes which updates survive and the curves of two correct backends drift apart by
several percent in 50 steps (seen on an H100, 2026-11-24: NCCL at 1 rank against MACO at 4).
Even with fp32 masters the curve is chaotic once the model starts to learn (the loss drops
fast after about step 25 here, and when it starts depends on the last bits): --perturb-ulp
runs the reference with every gradient element moved by about one bf16 ulp, which
scripts/compare_runs.py --noise turns into the tolerance ("within bf16 noise").
Data: a fixed global batch per step (--global-batch sequences of --seq-len + 1 tokens), each
rank taking its contiguous share (world size must divide it), generated from (--seed, step)
only: the same on every backend and world size, so curves of different world sizes compare
too. Tokens follow a random permutation table with 10% noise (next = P[current]), which the
model can learn, so the loss falls from about ln(vocabulary).

--mode tp-mlp: --layers blocks of x + down(gelu(up(layer_norm(x)))) over [tokens, hidden]
activations, up column-parallel (hidden x 4 hidden, split over ranks), down row-parallel:
one all_reduce of the [tokens, hidden] bf16 partial sums per layer forward and one per layer
backward (the input gradient of the column-parallel layer: Megatron-LM's f and g
operators), i.e. small messages (tokens x hidden x 2 bytes: 4 MiB at the defaults). Inputs are
replicated (the same on every rank, seeded by step); the full model has 4 x 2 x 8192 x 32768
= 2,147,483,648 parameters at the defaults. The weights are cut from full matrices
generated in 8 blocks along the split dimension, so the model and the loss curve do not
depend on the world size (1, 2, 4 or 8). Trained with SGD (mean squared error against the
input shifted by one feature).

Each step (forward, backward, optimizer step) is timed on the host between device
synchronisations; the reported step time is the largest over ranks, the first --warmup steps
excluded (median and mean, ms). Rank 0 prints each step's loss (the mean over ranks) and time,
and a RESULT line; --json writes it all. Checks (exit status 1 on any failure, after the
JSON is written): every loss finite; DDP replicas bitwise equal after the last step (hash of
the parameters), tensor-parallel activations bitwise equal on every rank; with MACO's libnccl
loaded (LD_PRELOAD), every counted NCCL call ran on MACO (maco_nccl_call_count: none
forwarded to the real NCCL, at least one ncclAllReduce on MACO). Prints 'PASS bench_ddp ...'.
"""

from __future__ import annotations

import argparse
import ctypes
import datetime
import hashlib
import json
import math
import os
import statistics
import sys
import time

for _k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_LOCAL_RANK", "MACO_BOOTSTRAP_ADDR",
           "MACO_BOOTSTRAP_NONCE"):
    os.environ.pop(_k, None)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
import torch.nn.functional as F  # noqa: E402

SKIP_EXIT = 77
TP_INIT_BLOCKS = 8  # blocks of the full weight matrices along the split dimension
NCCL_COUNTED = ("ncclAllReduce", "ncclBroadcast", "ncclReduce", "ncclAllGather",
                "ncclReduceScatter", "ncclAlltoAll", "ncclGather", "ncclScatter", "ncclSend",
                "ncclRecv", "ncclCommInitRank", "ncclCommSplit", "ncclCommRegister",
                "ncclMemAlloc")


# --------------------------------------------------------------------------- arguments

def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("ddp", "tp-mlp"), default="ddp")
    p.add_argument("--backend", choices=("nccl", "maco", "gloo"), default="nccl")
    p.add_argument("--steps", type=int, default=50, help="training steps (default 50)")
    p.add_argument("--warmup", type=int, default=5,
                   help="first steps left out of the step times (default 5)")
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--lr", type=float, default=None,
                   help="learning rate (default: 1e-3 AdamW for ddp; SGD at 0.05 x "
                        "sqrt(hidden / 64) for tp-mlp, a step of about the same relative size "
                        "at any width)")
    p.add_argument("--small", action="store_true",
                   help="tiny sizes (CPU smoke test); explicit size options still apply")
    p.add_argument("--cpu", action="store_true",
                   help="run on the CPU whatever the backend (maco: its Gloo fallback takes "
                        "CPU tensors; a CPU check of the backend's wiring)")
    p.add_argument("--json", metavar="FILE", help="write the results (rank 0)")
    p.add_argument("--label", default="", help="a name for this run in the JSON and tables")
    p.add_argument("--timeout", type=float, default=300,
                   help="seconds torch.distributed waits for a collective (default 300)")
    p.add_argument("--backends", metavar="LIST",
                   help="ddp only: compare backends in one job (e.g. nccl,maco): the same model "
                        "and data, one DDP per backend (the first on the default process "
                        "group, the others on groups of their own), their --steps steps run "
                        "in turn --rounds times (ABBA order), so that what drifts between "
                        "jobs (clocks, placement, other tenants) hits every backend alike; "
                        "prints each round's median step and the median over rounds")
    p.add_argument("--rounds", type=int, default=1,
                   help="with --backends: rounds of --steps steps per backend (default 1)")
    p.add_argument("--profile", metavar="FILE",
                   help="after the timed steps, 3 more under torch.profiler: rank 0 prints "
                        "where the GPU time went (communication kernels, the rest, how much "
                        "of the communication ran beside other kernels) and writes the Chrome "
                        "trace to FILE (.json.gz)")
    g = p.add_argument_group("ddp")
    g.add_argument("--layers", type=int, help="blocks (default 12; tp-mlp: 4)")
    g.add_argument("--hidden", type=int, help="model width (default 768; tp-mlp: 8192)")
    g.add_argument("--heads", type=int, help="attention heads (default 12)")
    g.add_argument("--vocab", type=int, help="vocabulary (default 32768)")
    g.add_argument("--seq-len", type=int, help="tokens per sequence (default 1024)")
    g.add_argument("--global-batch", type=int,
                   help="sequences per step over all ranks (default 32)")
    g.add_argument("--bucket-mb", type=float, default=25.0,
                   help="DDP bucket_cap_mb (default 25, DDP's own default)")
    g.add_argument("--perturb-ulp", action="store_true",
                   help="the noise floor: scale every all-reduced gradient element by 1, "
                        "1 + 2^-8 or 1 - 2^-8 (random, the same on every rank): about one "
                        "bfloat16 ulp, what another summation order changes")
    t = p.add_argument_group("tp-mlp")
    t.add_argument("--tokens", type=int, help="tokens per step (default 256)")
    t.add_argument("--ffn-mult", type=int, default=4, help="up projection width / hidden")
    a = p.parse_args(argv)
    if a.mode == "ddp":
        dflt = dict(layers=2, hidden=64, heads=2, vocab=512, seq_len=32, global_batch=4) \
            if a.small else dict(layers=12, hidden=768, heads=12, vocab=32768, seq_len=1024,
                                 global_batch=32)
    else:
        dflt = dict(layers=2, hidden=64, tokens=16) if a.small else \
            dict(layers=4, hidden=8192, tokens=256)
    for k, v in dflt.items():
        if getattr(a, k) is None:
            setattr(a, k, v)
    if a.lr is None:
        a.lr = 1e-3 if a.mode == "ddp" else 0.05 * math.sqrt(a.hidden / 64)
    if a.steps < 1 or not 0 <= a.warmup < a.steps:
        p.error(f"--steps {a.steps} --warmup {a.warmup}: need steps >= 1 and 0 <= warmup < "
                f"steps")
    if a.mode == "ddp" and a.hidden % a.heads:
        p.error(f"--hidden {a.hidden} is not a multiple of --heads {a.heads}")
    if a.rounds < 1:
        p.error(f"--rounds {a.rounds}: need at least 1")
    if a.backends is not None:
        a.backends = [b.strip() for b in a.backends.split(",") if b.strip()]
        bad = [b for b in a.backends if b not in ("nccl", "maco", "gloo")]
        if bad or len(set(a.backends)) != len(a.backends) or not a.backends:
            p.error(f"--backends {','.join(a.backends)}: a list of distinct backends out of "
                    f"nccl, maco, gloo")
        if a.mode != "ddp" or a.profile or a.perturb_ulp:
            p.error("--backends: --mode ddp only, without --profile and --perturb-ulp")
        a.backend = a.backends[0]  # the default process group's
    elif a.rounds != 1:
        p.error("--rounds needs --backends")
    return a


# --------------------------------------------------------------------------- data

def ddp_batches(a, rank: int, world: int, device) -> list:
    """Each step's (inputs, targets) of this rank: its share of the global batch of step s,
    generated from (seed, s) only. Tokens: x[t+1] = P[x[t]], with 10% replaced at random."""
    if a.global_batch % world:
        raise SystemExit(f"--global-batch {a.global_batch} is not a multiple of the world size "
                         f"{world}")
    per = a.global_batch // world
    perm = torch.randperm(a.vocab, generator=torch.Generator().manual_seed(a.seed))
    out = []
    for s in range(a.steps):
        g = torch.Generator().manual_seed(a.seed * 1000003 + s)
        n, t = a.global_batch, a.seq_len + 1
        noise = torch.rand(n, t, generator=g) < 0.1
        rnd = torch.randint(0, a.vocab, (n, t), generator=g)
        tok = torch.empty(n, t, dtype=torch.int64)
        tok[:, 0] = rnd[:, 0]
        for i in range(1, t):
            tok[:, i] = torch.where(noise[:, i], rnd[:, i], perm[tok[:, i - 1]])
        mine = tok[rank * per:(rank + 1) * per].to(device)
        out.append((mine[:, :-1].contiguous(), mine[:, 1:].contiguous()))
    return out


# --------------------------------------------------------------------------- ddp model

class Block(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.fc = nn.Linear(d, 4 * d)
        self.out = nn.Linear(4 * d, d)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (y.view(b, t, self.heads, c // self.heads).transpose(1, 2) for y in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    def __init__(self, a):
        super().__init__()
        self.tok = nn.Embedding(a.vocab, a.hidden)
        self.pos = nn.Embedding(a.seq_len, a.hidden)
        self.blocks = nn.ModuleList(Block(a.hidden, a.heads) for _ in range(a.layers))
        self.ln = nn.LayerNorm(a.hidden)
        self.head = nn.Linear(a.hidden, a.vocab, bias=False)
        self.head.weight = self.tok.weight  # tied
        for m in self.modules():
            if isinstance(m, (nn.Linear, nn.Embedding)):
                nn.init.normal_(m.weight, std=0.02)
                if getattr(m, "bias", None) is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, idx):
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1], device=idx.device))
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln(x))


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())  # tied weights counted once


def build_ddp(a, dev, use_cuda: bool, batches: list, group=None) -> tuple:
    """(model, step, parameter count): the GPT in bfloat16 wrapped by DDP on ``group`` (None:
    the default process group) with fp32 AdamW masters; step(s) trains on batches[s] and
    returns the loss. The same initial weights on every call (seeded)."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(a.seed)
    net = GPT(a)
    params = count_params(net)
    net = net.to(dev, torch.bfloat16)
    model = DDP(net, device_ids=[dev.index] if use_cuda else None, bucket_cap_mb=a.bucket_mb,
                process_group=group)
    live = list(model.parameters())
    master = [p.detach().float().requires_grad_(True) for p in live]
    opt = torch.optim.AdamW(master, lr=a.lr, weight_decay=0.0)

    def step(s):
        x, y = batches[s]
        logits = model(x)
        loss = F.cross_entropy(logits.float().view(-1, a.vocab), y.view(-1))
        model.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the bf16 gradients here
        for m, p in zip(master, live):
            m.grad = p.grad.float()
        if a.perturb_ulp:  # (seed, step): the same on every rank, replicas stay equal
            g = torch.Generator(device=dev)
            g.manual_seed(a.seed * 1000003 + s)
            for m in master:
                r = torch.randint(-1, 2, m.grad.shape, generator=g, device=dev)
                m.grad.mul_(1.0 + r.float() * 2.0**-8)
        opt.step()
        with torch.no_grad():
            torch._foreach_copy_(live, master)  # fp32 masters to the bf16 model
        return loss
    return model, step, params


# --------------------------------------------------------------------------- tp-mlp

class _CopyToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all_reduce of the input gradient backward."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous()
        dist.all_reduce(g)
        return g


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's g: all_reduce of the partial sums forward, identity backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, g):
        return g


def tp_weight(a, layer: int, which: int, rows: int, cols: int, split_dim: int, rank: int,
              world: int, device, std: float) -> torch.Tensor:
    """This rank's shard of a full (rows x cols) matrix generated in TP_INIT_BLOCKS blocks
    along split_dim, each from its own seed: the same full matrix at any world size that
    divides TP_INIT_BLOCKS."""
    if TP_INIT_BLOCKS % world:
        raise SystemExit(f"tp-mlp: world size {world} does not divide {TP_INIT_BLOCKS} (the "
                         f"weights are generated in {TP_INIT_BLOCKS} blocks)")
    full = rows if split_dim == 0 else cols
    blk = full // TP_INIT_BLOCKS
    per = TP_INIT_BLOCKS // world
    parts = []
    for b in range(rank * per, (rank + 1) * per):
        g = torch.Generator(device=device).manual_seed(
            a.seed * 1000003 + layer * 7919 + which * 104729 + b)
        shape = (blk, cols) if split_dim == 0 else (rows, blk)
        parts.append(torch.randn(shape, generator=g, device=device) * std)
    return torch.cat(parts, dim=split_dim).to(torch.bfloat16)


class TPMLP(nn.Module):
    def __init__(self, a, rank: int, world: int, device):
        super().__init__()
        h, f = a.hidden, a.hidden * a.ffn_mult
        if f % TP_INIT_BLOCKS:
            raise SystemExit(f"tp-mlp: hidden x ffn-mult = {f} is not a multiple of "
                             f"{TP_INIT_BLOCKS}")
        self.hidden = h
        self.up = nn.ParameterList()
        self.down = nn.ParameterList()
        for i in range(a.layers):
            self.up.append(nn.Parameter(tp_weight(a, i, 1, h, f, 1, rank, world, device,
                                                  1 / math.sqrt(h))))
            self.down.append(nn.Parameter(tp_weight(a, i, 2, f, h, 0, rank, world, device,
                                                    0.5 / math.sqrt(f))))

    def forward(self, x):
        for up, down in zip(self.up, self.down):
            h = _CopyToTP.apply(F.layer_norm(x, (self.hidden,)))
            x = x + _ReduceFromTP.apply(F.gelu(h @ up) @ down)
        return x


def tp_batches(a, device) -> list:
    """Each step's (input, target): the same on every rank, from (seed, step) only."""
    out = []
    for s in range(a.steps):
        g = torch.Generator().manual_seed(a.seed * 1000003 + s)
        x = torch.randn(a.tokens, a.hidden, generator=g)
        out.append((x.to(device, torch.bfloat16), torch.roll(x, 1, dims=1).to(device)))
    return out


# --------------------------------------------------------------------------- helpers

def maco_nccl_counts() -> dict | None:
    """Counts of MACO's libnccl (LD_PRELOAD puts it in the global scope), or None when the
    libnccl.so.2 loaded is not MACO's."""
    try:
        fn = ctypes.CDLL(None).maco_nccl_call_count
    except AttributeError:
        return None
    fn.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_uint64),
                   ctypes.POINTER(ctypes.c_uint64)]
    out = {}
    for name in NCCL_COUNTED:
        n, f = ctypes.c_uint64(), ctypes.c_uint64()
        if fn(name.encode(), ctypes.byref(n), ctypes.byref(f)) == 0:
            out[name] = [n.value, f.value]
    return out


def nccl_count_failures(counts: dict | None, preloaded: bool) -> list:
    """What the counters say against 'every NCCL call went through MACO'."""
    if counts is None:
        return ["LD_PRELOAD names libmaco_nccl but the libnccl.so.2 loaded is not MACO's (no "
                "maco_nccl_call_count)"] if preloaded else []
    bad = [f"{k}: {f} call(s) forwarded to the real NCCL" for k, (n, f) in counts.items() if f]
    if counts.get("ncclAllReduce", [0, 0])[0] == 0:
        bad.append("ncclAllReduce: no call ran on MACO")
    return bad


def params_digest(model: nn.Module) -> str:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().contiguous().view(torch.uint8).cpu().numpy().tobytes())
    return h.hexdigest()


def tensor_digest(t: torch.Tensor) -> str:
    return hashlib.sha256(t.detach().contiguous().view(torch.uint8).cpu().numpy()
                          .tobytes()).hexdigest()


def exchange(key: str, value, rank: int, world: int) -> list:
    """Every rank's value (JSON), through the job's key-value store: no collective of the
    backend under test (and torch 2.15's all_gather_object refuses CPU objects on the maco
    group)."""
    store = dist.distributed_c10d._get_default_store()
    store.set(f"bench_ddp/{key}/{rank}", json.dumps(value))
    return [json.loads(store.get(f"bench_ddp/{key}/{r}")) for r in range(world)]


COMM_KERNELS = ("nccl", "maco__")  # kernel names that are communication


def profile_steps(step, sync, steps: int, rank: int, path: str) -> None:
    """Runs ``steps`` steps under torch.profiler on every rank (the same work everywhere);
    rank 0 prints the GPU time by kind and writes the Chrome trace to ``path``."""
    import gzip
    import shutil
    import tempfile

    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    sync()
    t0 = time.perf_counter()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for s in range(steps):
            step(s)
        sync()
    wall = (time.perf_counter() - t0) * 1e3 / steps
    if rank != 0:
        return
    from maco._prof_table import covered, merge  # interval arithmetic, as maco.profiler's

    comm, rest, by_name = [], [], {}
    for e in prof.events():
        if e.device_type != DeviceType.CUDA:
            continue
        iv = (e.time_range.start / 1e3, e.time_range.end / 1e3)  # ms
        (comm if any(k in e.name for k in COMM_KERNELS) else rest).append(iv)
        n, t = by_name.get(e.name[:60], (0, 0.0))
        by_name[e.name[:60]] = (n + 1, t + iv[1] - iv[0])
    cu, ru = merge(comm), merge(rest)
    both = sum(covered(a, b, ru) for a, b in cu)
    c_ms, r_ms = (sum(b - a for a, b in iv) for iv in (cu, ru))
    busy = sum(b - a for a, b in merge(cu + ru))
    print(f"PROFILE {steps} steps, {wall:.2f} ms per step on the host clock (profiled); per "
          f"step: communication kernels busy {c_ms / steps:.2f} ms, other kernels "
          f"{r_ms / steps:.2f} ms, both at once {both / steps:.2f} ms, communication "
          f"alone {(c_ms - both) / steps:.2f} ms, GPU idle "
          f"{max(0.0, wall - busy / steps):.2f} ms", flush=True)
    for name, (n, t) in sorted(by_name.items(), key=lambda kv: -kv[1][1])[:12]:
        print(f"PROFILE   {t / steps:8.3f} ms/step {n // steps:5d} calls/step  {name}")
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as tmp:
        prof.export_chrome_trace(tmp.name)
    with open(tmp.name, "rb") as src, gzip.open(path, "wb") as dst:
        shutil.copyfileobj(src, dst)
    os.unlink(tmp.name)


def leave(gloo: bool, failed: bool) -> int:
    """The job's end: a barrier, then the process groups torn down and the exit status (1:
    failed). With a Gloo group the process exits here instead, without tearing it down: its
    teardown aborted a rank now and then in CI ("terminate called without an active
    exception", a joinable std::thread destroyed), after PASS."""
    dist.barrier()
    if gloo:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1 if failed else 0)
    dist.destroy_process_group()
    return 1 if failed else 0


def timed_steps(step, sync, steps: int) -> tuple:
    """After a barrier, steps 0 .. steps - 1, each timed on the host between device
    synchronisations: (times in ms, losses)."""
    dist.barrier()
    step_ms, losses = [], []
    for s in range(steps):
        sync()
        t0 = time.perf_counter()
        loss = step(s)
        sync()
        step_ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss.item()))
    return step_ms, losses


def summarize(step_ms: list, warmup: int) -> dict:
    timed = step_ms[warmup:]
    return dict(median_ms=statistics.median(timed), mean_ms=statistics.fmean(timed),
                min_ms=min(timed), max_ms=max(timed), timed_steps=len(timed))


def compare_backends(a, rank: int, world: int, dev, use_cuda: bool, sync, timeout) -> int:
    """--backends: one DDP per backend (the first on the default group), --rounds rounds of
    --steps steps each, the backends' turns in ABBA order; per round the median step (largest
    over ranks, warm-up steps left out). Checks: finite losses, replicas equal per backend.
    Prints a table and 'PASS/FAIL bench_ddp compare ...'; --json writes the rounds."""
    groups = {a.backends[0]: None}
    for b in a.backends[1:]:
        if b == "maco":
            import maco.torch  # noqa: F401 - registers the backend
        groups[b] = dist.new_group(backend=b, timeout=timeout)
    batches = ddp_batches(a, rank, world, dev)
    runs = {b: build_ddp(a, dev, use_cuda, batches, groups[b]) for b in a.backends}
    red_dev = dev if use_cuda else torch.device("cpu")
    rounds = {b: [] for b in a.backends}
    failures = []
    for r in range(a.rounds):
        for b in (a.backends if r % 2 == 0 else a.backends[::-1]):
            ms, losses = timed_steps(runs[b][1], sync, a.steps)
            tt = torch.tensor(ms, dtype=torch.float64, device=red_dev)
            dist.all_reduce(tt, op=dist.ReduceOp.MAX)  # on the default group, untimed
            rounds[b].append(summarize(tt.tolist(), a.warmup)["median_ms"])
            if not all(math.isfinite(v) for v in losses):
                failures.append(f"{b}, round {r}: a loss is not finite")
    for b in a.backends:
        digests = exchange(f"digest-{b}", params_digest(runs[b][0].module), rank, world)
        if len(set(digests)) != 1:
            failures.append(f"{b}: DDP replicas differ across ranks ({len(set(digests))} "
                            f"distinct hashes)")
    fails = exchange("failures", failures, rank, world)
    all_failures = [f"rank {q}: {f}" for q, fl in enumerate(fails) for f in fl]
    gpu = torch.cuda.get_device_name(dev) if use_cuda else "cpu"
    med = {b: statistics.median(v) for b, v in rounds.items()}
    if rank == 0:
        first = a.backends[0]
        print(f"bench_ddp compare: {', '.join(a.backends)}, world size {world}, {gpu}, "
              f"{runs[first][2]:,} parameters, {a.rounds} round(s) of {a.steps} steps "
              f"(median step in ms, largest over ranks)")
        for b in a.backends:
            print(f"  {b:<6} rounds " + " ".join(f"{t:8.2f}" for t in rounds[b]) +
                  f"   median {med[b]:8.2f}   {first}/{b} {med[first] / med[b]:.3f}")
        if a.json:
            with open(a.json, "w") as f:
                json.dump(dict(bench="bench_ddp", mode="ddp-compare", backends=a.backends,
                               world_size=world, gpu=gpu, torch=torch.__version__,
                               steps=a.steps, warmup=a.warmup, rounds=rounds, median_ms=med,
                               failures=all_failures, ok=not all_failures), f, indent=1)
        for f in all_failures:
            print(f"FAIL {f}")
        print(f"{'FAIL' if all_failures else 'PASS'} bench_ddp compare {','.join(a.backends)}: "
              f"{a.rounds} round(s), replicas equal per backend on {world} rank(s)", flush=True)
    return leave("gloo" in a.backends, bool(all_failures))


# --------------------------------------------------------------------------- main

def main(argv=None) -> int:
    a = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local = int(os.environ.get("LOCAL_RANK", str(rank)))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", str(world)))
    preloaded = "maco_nccl" in os.environ.get("LD_PRELOAD", "")
    counts0 = maco_nccl_counts()
    if a.cpu and "nccl" in (a.backends or [a.backend]):
        print("bench_ddp: --cpu needs --backend gloo or maco (NCCL runs on GPUs only)")
        return 2
    use_cuda = a.backend != "gloo" and not a.cpu
    if a.backends and "gloo" in a.backends and use_cuda:
        print("bench_ddp: --backends with gloo compares on the CPU only (--cpu)")
        return 2
    if use_cuda and not torch.cuda.is_available():
        print(f"SKIP: bench_ddp --backend {a.backend}: torch {torch.__version__} sees no CUDA "
              f"device (--backend gloo runs on the CPU)")
        return SKIP_EXIT
    ngpu = torch.cuda.device_count() if use_cuda else 0
    shared = use_cuda and local_world > ngpu
    if "nccl" in (a.backends or [a.backend]) and shared and counts0 is None:
        print(f"SKIP: bench_ddp --backend nccl: {local_world} ranks share {ngpu} GPU(s) and "
              f"NVIDIA's NCCL refuses a duplicate GPU (preload MACO's libnccl, or use "
              f"--backend maco)")
        return SKIP_EXIT
    if use_cuda:
        torch.cuda.set_device(local % ngpu)
        dev = torch.device("cuda", torch.cuda.current_device())
    else:
        dev = torch.device("cpu")
    timeout = datetime.timedelta(seconds=a.timeout)
    if a.backend == "maco":
        import maco.torch  # noqa: F401 - registers the backend

        dist.init_process_group("maco", timeout=timeout)
    elif a.backend == "nccl":
        dist.init_process_group("nccl", device_id=dev, timeout=timeout)
    else:
        dist.init_process_group("gloo", timeout=timeout)
    assert dist.get_rank() == rank and dist.get_world_size() == world

    def sync():
        if use_cuda:
            torch.cuda.synchronize(dev)

    if a.backends is not None:
        return compare_backends(a, rank, world, dev, use_cuda, sync, timeout)

    failures = []
    if a.mode == "ddp":
        batches = ddp_batches(a, rank, world, dev)
        model, step, params = build_ddp(a, dev, use_cuda, batches)
        shape = dict(layers=a.layers, hidden=a.hidden, heads=a.heads, vocab=a.vocab,
                     seq_len=a.seq_len, global_batch=a.global_batch)
        extra = dict(bucket_mb=a.bucket_mb)
        comm_note = (f"DDP bf16 gradient buckets of {a.bucket_mb:g} MB over "
                     f"{2 * params / 2**20:.1f} MiB of gradients per step")
    else:
        model = TPMLP(a, rank, world, dev)
        params = a.layers * 2 * a.hidden * a.hidden * a.ffn_mult  # full model
        opt = torch.optim.SGD(model.parameters(), lr=a.lr)
        batches = tp_batches(a, dev)
        last_out = [None]

        def step(s):
            x, target = batches[s]
            out = model(x)
            loss = F.mse_loss(out.float(), target)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            last_out[0] = out
            return loss
        shape = dict(layers=a.layers, hidden=a.hidden, ffn=a.hidden * a.ffn_mult,
                     tokens=a.tokens)
        extra = dict(params_per_rank=count_params(model))
        comm_note = (f"{2 * a.layers} all_reduce(s) of {a.tokens} x {a.hidden} bf16 "
                     f"({a.tokens * a.hidden * 2 / 2**20:.2f} MiB) per step")

    gpu = torch.cuda.get_device_name(dev) if use_cuda else "cpu"
    if rank == 0:
        print(f"bench_ddp: mode {a.mode}, backend {a.backend}"
              f"{' (libnccl: MACO, preloaded)' if counts0 is not None else ''}, world size "
              f"{world}, {gpu}{f', {local_world} ranks on {ngpu} GPU(s)' if shared else ''}, "
              f"{params:,} parameters, {comm_note}", flush=True)

    step_ms, losses = timed_steps(step, sync, a.steps)

    if a.profile and use_cuda:
        profile_steps(step, sync, 3, rank, a.profile)

    # The job's view: losses averaged over ranks, step times the largest over ranks.
    red_dev = dev if use_cuda else torch.device("cpu")
    lt = torch.tensor(losses, dtype=torch.float64, device=red_dev)
    tt = torch.tensor(step_ms, dtype=torch.float64, device=red_dev)
    dist.all_reduce(lt)
    dist.all_reduce(tt, op=dist.ReduceOp.MAX)
    losses = (lt / world).tolist()
    step_ms = tt.tolist()
    bad_steps = [i for i, v in enumerate(losses) if not math.isfinite(v)]
    if bad_steps:
        failures.append(f"loss not finite at step(s) {bad_steps[:10]}")

    # Replicas (ddp) or activations (tp-mlp) must be bitwise equal on every rank.
    digest = params_digest(model.module) if a.mode == "ddp" else tensor_digest(last_out[0])
    digests = exchange("digest", digest, rank, world)
    what = "DDP replicas' parameters" if a.mode == "ddp" else "tensor-parallel activations"
    in_sync = len(set(digests)) == 1
    if not in_sync:
        failures.append(f"{what} differ across ranks after step {a.steps - 1}: "
                        f"{len(set(digests))} distinct hashes")

    counts = maco_nccl_counts() if a.backend == "nccl" else None
    if a.backend == "nccl":
        failures += nccl_count_failures(counts, preloaded)
    nccl_lib = None
    if a.backend == "nccl":
        nccl_lib = "maco" if counts is not None else \
            "nccl " + ".".join(str(v) for v in torch.cuda.nccl.version())
    fails = exchange("failures", failures, rank, world)
    all_failures = [f"rank {r}: {f}" for r, fl in enumerate(fails) for f in fl]

    res = dict(bench="bench_ddp", label=a.label or f"{a.mode}-{a.backend}", mode=a.mode,
               backend=a.backend, nccl_library=nccl_lib, world_size=world,
               local_world_size=local_world, gpus_visible=ngpu, ranks_share_gpu=shared,
               gpu=gpu, torch=torch.__version__, params=params, shape=shape, **extra,
               seed=a.seed, perturbed=bool(a.mode == "ddp" and a.perturb_ulp),
               lr=a.lr, steps=a.steps, warmup=a.warmup, loss=losses, step_ms=step_ms,
               **summarize(step_ms, a.warmup), in_sync=in_sync, nccl_calls=counts,
               failures=all_failures, ok=not all_failures)
    if rank == 0:
        for s, (l, t) in enumerate(zip(losses, step_ms)):
            note = " (warm-up)" if s < a.warmup else ""
            print(f"step {s:3d} loss {l:.5f} time {t:8.2f} ms{note}")
        if counts is not None:
            print("NCCL calls on MACO/forwarded: " + ", ".join(
                f"{k} {n}/{f}" for k, (n, f) in counts.items() if n or f))
        print(f"RESULT bench_ddp {res['label']}: mode {a.mode}, backend {a.backend}"
              f"{' (' + nccl_lib + ')' if nccl_lib else ''}, world size {world}, {gpu}, "
              f"{params:,} parameters, step median {res['median_ms']:.2f} ms, mean "
              f"{res['mean_ms']:.2f} ms over {res['timed_steps']} steps, loss "
              f"{losses[0]:.4f} -> {losses[-1]:.4f}", flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)
        if all_failures:
            for f in all_failures:
                print(f"FAIL {f}")
            print(f"FAIL bench_ddp {res['label']}: {len(all_failures)} failure(s)")
        else:
            print(f"PASS bench_ddp {res['label']}: {a.steps} steps, finite losses, "
                  f"{'replicas' if a.mode == 'ddp' else 'activations'} equal on {world} rank(s)"
                  f"{', every NCCL call on MACO' if counts is not None else ''}")
    return leave(a.backend == "gloo", bool(all_failures))


if __name__ == "__main__":
    sys.exit(main())
