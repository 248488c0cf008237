"""GPU check of maco.ep (expert-parallel dispatch and combine), one process per rank:

    maco-run -n 2 python3 tests/python/gpu_ep.py

Both modes, on routings drawn from a seed shared by the ranks (every rank draws every rank's
inputs, so each knows what it must receive): the rows of each local expert (by source rank,
then token order) compared exactly with the senders' tokens; a per-expert function applied in
torch; the combined output compared with a float64 sum over each token's experts (bfloat16
tolerance), and two runs compared bit for bit; then the same with use_fp8 (e4m3 rows within
their rounding, combine of the same expert outputs bit for bit). Last line: 'PASS gpu_ep <rank>'."""

import os
import sys

import torch

import maco
import maco.ep

comm = maco.Communicator()
R, N = comm.rank, comm.size
torch.cuda.set_device(comm.device)
DEV = torch.device("cuda", comm.device)
SEED = int.from_bytes(comm.allgather_bytes(os.urandom(4))[0], "little")
failures = []


def check(name, ok, detail=""):
    if not ok:
        failures.append(f"{name}: {detail}")


def inputs(rank, T, H, E, K, salt):
    g = torch.Generator()
    g.manual_seed(SEED * 1000003 + rank * 7919 + salt)
    x = (torch.rand(T, H, generator=g) * 4 - 2).to(torch.bfloat16)
    idx = torch.rand(T, E, generator=g).topk(K, dim=1).indices.to(torch.int64)
    idx[torch.rand(T, K, generator=g) < 0.15] = -1
    w = torch.rand(T, K, generator=g)
    return x, idx, w


def expert_fn(rows, e):
    return (rows.float() * (0.5 + (e % 7) * 0.125) + ((e % 5) * 0.25 - 0.5)).to(torch.bfloat16)


def expected_rows(everyone, e):
    """The rows expert e receives: every rank's tokens that name it, by rank, then token."""
    return [x[t] for x, idx, _ in everyone for t in range(x.shape[0])
            if bool((idx[t] == e).any())]


def run_mode(low_latency, T, H, E, K):
    name = "low latency" if low_latency else "normal"
    buf = maco.ep.Buffer(comm, num_experts=E, hidden=H, num_max_dispatch_tokens_per_rank=T,
                         num_topk=K, low_latency_mode=low_latency)
    L = E // N
    everyone = [inputs(r, T - r % 2, H, E, K, 11) for r in range(N)]
    x, idx, w = (t.to(DEV) for t in everyone[R])
    ys = []
    for run in range(2):
        recv_x, count, handle = buf.dispatch(x, idx, w)
        out = torch.empty_like(recv_x)
        offsets = handle.recv_offsets.cpu()
        counts = count.cpu()
        for l in range(L):
            e = R * L + l
            want = expected_rows(everyone, e)
            c = int(counts[l])
            check(f"{name}: count of local expert {l}", c == len(want), f"{c} != {len(want)}")
            if low_latency:
                got, dst = recv_x[l, :c], out[l, :c]
            else:
                o = int(offsets[l])
                got, dst = recv_x[o:o + c], out[o:o + c]
            if want and c == len(want):
                ok = torch.equal(got.cpu(), torch.stack(want))
                check(f"{name}: rows of local expert {l}", ok, "differ from the senders' tokens")
            dst.copy_(expert_fn(got, e))
        y = buf.combine(out, handle)
        torch.cuda.synchronize()
        ys.append(y.cpu())
    check(f"{name}: two runs", torch.equal(ys[0], ys[1]), "differ")
    # use_fp8: the rows arrive as e4m3 values and per-128 scales close to the senders' tokens
    # (within e4m3's rounding: 1/16 of the block's amax); combine of the same expert outputs
    # then gives the same y bit for bit.
    (vals, scales), count, handle = buf.dispatch(x, idx, w, use_fp8=True)
    check(f"{name} fp8: types", vals.dtype == torch.float8_e4m3fn and scales.dtype ==
          torch.float32 and vals.shape[-1] == H and scales.shape[-1] == H // 128,
          f"{vals.dtype} {tuple(vals.shape)} {scales.dtype} {tuple(scales.shape)}")
    deq = vals.float() * scales.repeat_interleave(128, dim=-1)
    out = torch.empty(vals.shape, dtype=torch.bfloat16, device=DEV)
    offsets, counts = handle.recv_offsets.cpu(), count.cpu()
    for l in range(L):
        e = R * L + l
        want = expected_rows(everyone, e)
        c = int(counts[l])
        check(f"{name} fp8: count of local expert {l}", c == len(want), f"{c} != {len(want)}")
        if c != len(want) or not want:
            continue
        rows = slice(0, c) if low_latency else slice(int(offsets[l]), int(offsets[l]) + c)
        got = (deq[l] if low_latency else deq)[rows].cpu()
        ref = torch.stack(want).float()
        amax = ref.view(c, H // 128, 128).abs().amax(dim=-1).clamp_min(1e-4)
        err = ((got - ref).view(c, H // 128, 128).abs().amax(dim=-1) / amax).max().item()
        check(f"{name} fp8: rows of local expert {l}", err <= 1 / 16, f"relative error {err}")
        (out[l] if low_latency else out)[rows].copy_(expert_fn(torch.stack(want).to(DEV), e))
    y8 = buf.combine(out, handle)
    torch.cuda.synchronize()
    check(f"{name} fp8: combine", torch.equal(y8.cpu(), ys[0]), "differs from the bf16 run's")
    ref = torch.zeros(x.shape[0], H, dtype=torch.float64)
    xs, ids, ws = everyone[R]
    for t in range(xs.shape[0]):
        for k in range(K):
            e = int(ids[t, k])
            if e >= 0:
                ref[t] += float(ws[t, k]) * expert_fn(xs[t], e).double()
    err = (ys[0].double() - ref).abs().max().item() if x.shape[0] else 0.0
    check(f"{name}: combine", err <= 0.02 * max(1.0, ref.abs().max().item()), f"max error {err}")
    buf.check()
    buf.destroy()


run_mode(True, 32, 1024, 8 * N, 4)
run_mode(False, 96, 512, 8 * N, 6)
if failures:
    print(f"FAIL gpu_ep {R}: " + "; ".join(failures[:5]), flush=True)
    sys.exit(1)
print(f"PASS gpu_ep {R}", flush=True)
