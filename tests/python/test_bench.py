"""CPU checks of the benchmark tools that scripts/gpu-nodes-apps.sh runs: bench_ddp.py's training
loops under torchrun on the Gloo backend (and the maco backend's CPU path),
scripts/compare_runs.py's verdicts, bench_fused.py's cases and figures, scripts/nodes_tables.py,
and the script's own plan (DRY_RUN=1). No GPU needed; each test takes seconds."""

import copy
import json
import os
import subprocess
import sys

import pytest

from conftest import HERE, NO_TORCH, REPO

sys.path.insert(0, os.path.join(REPO, "scripts"))
import compare_runs  # noqa: E402
import nodes_tables  # noqa: E402

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
needs_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)
SMALL = ["--small", "--steps", "6", "--warmup", "1"]


def torchrun(nproc, *args, timeout=120):
    """bench_ddp.py under torchrun (standalone: a free port), on the CPU; returns its output."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MACO_RANK", "MACO_WORLD", "MACO_LOCAL", "MACO_BOOTSTRAP"))}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           str(nproc), os.path.join(HERE, "bench_ddp.py"), *args]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    text = out.stdout + out.stderr
    assert out.returncode == 0, f"{cmd} exited {out.returncode}:\n{text[-4000:]}"
    return text


def load(path):
    with open(path) as f:
        return json.load(f)


@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    """One DDP run on Gloo, 2 ranks: (its JSON file, its output)."""
    if torch is None:
        pytest.skip(NO_TORCH)
    a = tmp_path_factory.mktemp("gloo") / "a.json"
    out = torchrun(2, "--backend", "gloo", *SMALL, "--label", "a", "--json", str(a))
    return a, out


@needs_torch
def test_ddp_gloo_is_deterministic_and_compare_runs_says_so(gloo_run, tmp_path):
    a, out = gloo_run
    b = tmp_path / "b.json"
    assert "PASS bench_ddp a" in out and "replicas equal on 2 rank(s)" in out
    torchrun(2, "--backend", "gloo", *SMALL, "--label", "b", "--json", str(b))
    ra, rb = load(a), load(b)
    assert ra["ok"] and ra["world_size"] == 2 and ra["mode"] == "ddp"
    assert ra["params"] == 134912  # the --small GPT, tied output layer counted once
    assert len(ra["loss"]) == 6 and len(ra["step_ms"]) == 6 and ra["timed_steps"] == 5
    assert ra["loss"] == rb["loss"]  # same seed, same data, same reductions: the same curve
    assert ra["loss"][-1] < ra["loss"][0]
    assert compare_runs.main([str(a), str(b)]) == 0
    # a curve moved by 3% at one step is not the same curve; 1% is within the tolerance
    for factor, want in ((1.03, 1), (1.01, 0)):
        c = copy.deepcopy(rb)
        c["loss"][3] *= factor
        p = tmp_path / f"c{factor}.json"
        p.write_text(json.dumps(c))
        assert compare_runs.main([str(a), str(p)]) == want
    # --perturb-ulp: every gradient element moved by about a bf16 ulp: a curve that leaves
    # the unperturbed one after the first update, replicas still equal, marked in the JSON
    n = tmp_path / "n.json"
    out = torchrun(2, "--backend", "gloo", *SMALL, "--perturb-ulp", "--label", "n", "--json",
                   str(n))
    rn = load(n)
    assert rn["perturbed"] and not ra["perturbed"] and "replicas equal on 2 rank(s)" in out
    assert rn["loss"][0] == ra["loss"][0] and rn["loss"][1:] != ra["loss"][1:]
    assert compare_runs.main([str(a), str(b), "--noise", str(n)]) == 0


@needs_torch
def test_tp_mlp_does_not_depend_on_the_world_size(tmp_path):
    one, two = tmp_path / "1.json", tmp_path / "2.json"
    torchrun(1, "--mode", "tp-mlp", "--backend", "gloo", *SMALL, "--json", str(one))
    out = torchrun(2, "--mode", "tp-mlp", "--backend", "gloo", *SMALL, "--json", str(two))
    assert "activations equal on 2 rank(s)" in out
    r1, r2 = load(one), load(two)
    assert r1["params"] == r2["params"] == 2 * 2 * 64 * 256
    assert r2["params_per_rank"] == r1["params_per_rank"] // 2
    rows, problems = compare_runs.compare([dict(r1, _path="1"), dict(r2, _path="2")], 0.02)
    assert not problems, problems
    assert rows[1]["diff"] < 0.01  # bf16 rounding of a different split, nothing more


@needs_torch
def test_ddp_on_the_maco_backend_cpu_path(gloo_run, tmp_path):
    pytest.importorskip("maco.torch")
    g, m = gloo_run[0], tmp_path / "m.json"
    out = torchrun(2, "--backend", "maco", "--cpu", *SMALL, "--json", str(m))
    assert "PASS bench_ddp ddp-maco" in out
    assert load(m)["loss"] == load(g)["loss"]  # CPU tensors go to the backend's Gloo group


@needs_torch
def test_ddp_backends_compared_in_one_job(tmp_path):
    pytest.importorskip("maco.torch")
    j = tmp_path / "cmp.json"
    out = torchrun(2, "--backends", "gloo,maco", "--cpu", "--rounds", "3", *SMALL, "--json",
                   str(j))
    assert "PASS bench_ddp compare gloo,maco: 3 round(s)" in out
    r = load(j)
    assert r["ok"] and r["backends"] == ["gloo", "maco"]
    assert all(len(r["rounds"][b]) == 3 and all(t > 0 for t in r["rounds"][b])
               for b in ("gloo", "maco"))
    for b in ("gloo", "maco"):
        assert f"  {b:<6} rounds" in out
        assert r["median_ms"][b] == sorted(r["rounds"][b])[1]


@needs_torch
@pytest.mark.parametrize("args, text", [
    (["--steps", "3", "--warmup", "3"], "warmup"),
    (["--rounds", "2"], "--rounds needs --backends"),
    (["--rounds", "0", "--backends", "gloo"], "need at least 1"),
    (["--backends", "gloo,gloo"], "distinct backends"),
    (["--backends", "gloo,mpi"], "distinct backends"),
    (["--backends", "gloo,maco", "--mode", "tp-mlp"], "--mode ddp only"),
])
def test_bench_ddp_refuses_bad_arguments(args, text):
    r = subprocess.run([sys.executable, os.path.join(HERE, "bench_ddp.py"), *args],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and text in r.stderr, r.stderr


def run(ref_loss, other_loss, **kw):
    base = dict(bench="bench_ddp", mode="ddp", shape={"hidden": 64}, steps=len(ref_loss), seed=1,
                lr=0.001, ok=True, median_ms=10.0, mean_ms=11.0, world_size=4, backend="nccl",
                warmup=1, params=10)
    return [dict(base, loss=ref_loss, label="ref", _path="r"),
            dict(base, loss=other_loss, label="other", _path="o", **kw)]


def test_compare_runs_verdicts():
    rows, problems = compare_runs.compare(run([2.0, 1.5], [2.0, 1.52]), 0.02)
    assert not problems and rows[1]["verdict"] == "same curve"
    assert rows[1]["diff"] == pytest.approx(0.02 / 1.5)
    _, problems = compare_runs.compare(run([2.0, 1.5], [2.0, float("nan")]), 0.02)
    assert problems and "differs" in problems[0]
    _, problems = compare_runs.compare(run([2.0, 1.5], [2.0, 1.5], seed=2), 0.02)
    assert problems and "not the same benchmark" in problems[0] and "seed" in problems[0]
    _, problems = compare_runs.compare(run([2.0, 1.5], [2.0, 1.5], ok=False, failures=["x"]),
                                       0.02)
    assert problems and "failed its own checks" in problems[0]
    rows, _ = compare_runs.compare(run([2.0, 1.5], [2.0, 1.5], median_ms=8.0), 0.02)
    assert rows[1]["ratio"] == pytest.approx(0.8)
    text = compare_runs.markdown(rows, run([2.0, 1.5], [2.0, 1.5])[0], 0.02)
    assert text.count("\n| ") == 3 and "| 0.800 |" in text


def test_compare_runs_noise_floor(tmp_path):
    """--noise: the tolerance per step is twice the perturbed reference's largest relative
    difference so far (at least rtol); a curve outside it, or inside it too early, fails."""
    ref = [10.0, 10.0, 9.0, 8.0]
    noise = dict(run(ref, [10.0, 10.0, 9.0, 7.6])[1], label="noise", perturbed=True)  # 5% late
    ok = run(ref, [10.0, 10.05, 9.1, 7.3])[1]         # 0.5%, 1.1%, 8.75% < 10% at the end
    early = run(ref, [10.0, 10.0, 9.5, 8.0])[1]       # 5.6% at step 2: noise is 0 there
    late = run(ref, [10.0, 10.0, 9.0, 6.9])[1]        # 13.75% > 10%
    rows, problems = compare_runs.compare([run(ref, ref)[0], ok], 0.02, noise)
    assert not problems and rows[1]["verdict"] == "same curve"
    assert rows[2]["verdict"].startswith("noise floor")
    _, problems = compare_runs.compare([run(ref, ref)[0], early], 0.02, noise)
    assert problems and "at step 2" in problems[0] and "2.00%" in problems[0]
    _, problems = compare_runs.compare([run(ref, ref)[0], late], 0.02, noise)
    assert problems and "at step 3" in problems[0] and "10.00%" in problems[0]
    assert compare_runs.tolerances(ref, noise["loss"], 0.02) == pytest.approx(
        [0.02, 0.02, 0.02, 0.1])
    # A noise file that is not a --perturb-ulp run is refused.
    paths = []
    for i, r in enumerate((run(ref, ref)[0], ok, dict(noise, perturbed=False))):
        paths.append(tmp_path / f"{i}.json")
        paths[-1].write_text(json.dumps({k: v for k, v in r.items() if k != "_path"}))
    assert compare_runs.main([str(paths[0]), str(paths[1]), "--noise", str(paths[2])]) == 2


def test_compare_runs_refuses_other_files(tmp_path):
    p = tmp_path / "x.json"
    p.write_text(json.dumps({"bench": "bench_fused"}))
    assert compare_runs.main([str(p), str(p)]) == 2


def test_bench_fused_cases_and_figures():
    sys.path.insert(0, HERE)
    import bench_fused as bf

    c = bf.plan_case("gemm_allreduce", 1024, 2048, 8192, 4)
    assert c["x_shape"] == (1024, 2048) and c["w_shape"] == (2048, 8192)
    assert c["out_shape"] == (1024, 8192) and c["comm_elements"] == 1024 * 8192
    assert c["gemm_flop"] == 2 * 1024 * 8192 * 2048 and c["fused_skip"] is None
    c = bf.plan_case("allgather_gemm", 8192, 8192, 2048, 4)
    assert c["x_shape"] == (2048, 8192) and c["out_shape"] == (8192, 2048)
    c = bf.plan_case("gemm_reduce_scatter", 128, 7168, 8192, 4)
    assert c["out_shape"] == (32, 8192) and c["fused_skip"] is None  # 32 rows per rank fuse
    assert bf.plan_case("allgather_gemm", 128, 8192, 2048, 4)["fused_skip"] is None
    assert "N = 100" in bf.plan_case("gemm_allreduce", 128, 64, 100, 4)["fused_skip"]
    with pytest.raises(ValueError):
        bf.plan_case("allgather_gemm", 130, 8192, 2048, 4)
    with pytest.raises(ValueError):
        bf.plan_case("gemm_reduce_scatter", 130, 8192, 2048, 4)
    # the figures
    assert bf.overlap_efficiency(1.0, 0.5, 1.0) == pytest.approx(1.0)
    assert bf.overlap_efficiency(1.0, 0.5, 1.5) == pytest.approx(0.0)
    assert bf.speedup(1.5, 1.2) == pytest.approx(1.25)
    assert bf.judge(0.95, 1.3, 0.33) == []
    assert len(bf.judge(0.5, 0.9, 0.33)) == 3  # efficiency, speedup, slower than sequential
    assert bf.judge(0.5, 1.05, 0.1) == []  # little communication: no efficiency/speedup target
    assert "async TP" in bf.judge(0.95, 1.3, 0.33, 1.0, 0.9)[0]
    a = bf.parse_args(["--trace-case", "allgather_gemm:8192"])
    cases = bf.plan_all(a, 4)
    # tp: 3 patterns x 4 sizes; llama70b: 2 patterns x 4 sizes
    assert len(cases) == 20 and bf.pick_trace_case(cases, a.trace_case) == ("allgather_gemm", 8192)
    assert bf.pick_trace_case(cases, None) == ("gemm_allreduce", 1024)
    llama = [c for c in cases if c["set"] == "llama70b"]
    assert {(c["pattern"], c["k"], c["n"]) for c in llama} == {
        ("allgather_gemm", 8192, 7168), ("gemm_reduce_scatter", 7168, 8192)}
    row = dict(cases[1], out_dtype="bfloat16", t_gemm_ms=1.0, t_comm_nccl_ms=0.5,
               t_comm_maco_ms=0.4, t_seq_nccl_ms=1.5, t_seq_maco_ms=1.4, t_fused_ms=1.1,
               fused_comm_workers=16, fused_skip=None, efficiency_nccl=0.8, speedup_nccl=1.36,
               speedup_maco=1.27, comm_share_nccl=0.33, targets_missed=[])
    text = bf.table([row, dict(cases[3], out_dtype="float32", skip="no mm")])
    assert "| tp | gemm_allreduce | 1024 | bfloat16 | 1.000 |" in text and "| met |" in text
    assert "1.100 (16)" in text and "skipped: no mm" in text


def test_bench_fused_dry_run():
    r = subprocess.run([sys.executable, os.path.join(HERE, "bench_fused.py"), "--dry-run",
                        "--world-size", "4"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.count("fused: yes") == 20 and "trace case: gemm_allreduce M=1024" in r.stdout
    r = subprocess.run([sys.executable, os.path.join(HERE, "bench_fused.py"), "--dry-run",
                        "--world-size", "3"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "multiple of the world size 3" in r.stdout


def test_nodes_tables(tmp_path):
    def rec(size, t, algo, wrong=0):
        return dict(size_bytes=size, time_us=t, busbw_gbps=size / t / 1e3, algorithm=algo,
                    wrong=wrong, inplace=False)
    (tmp_path / "perf-4x1-allreduce.json").write_text(json.dumps(
        [rec(1024, 10.0, "ll"), rec(1 << 20, 40.0, "rsag"),
         dict(rec(1024, 9.0, "ll"), inplace=True)]))
    (tmp_path / "perf-2x2-allreduce.json").write_text(json.dumps(
        [rec(1024, 25.0, "hier"), rec(1 << 20, 400.0, "hier")]))
    (tmp_path / "perf-2x2-allreduce.txt").write_text(
        "[0] host:1:1 [0] rank 0's proxy uses the tcp transport\n"
        "[2] host:1:1 [2] rank 2's proxy uses the cuda transport\n")
    text, wrong = nodes_tables.table(str(tmp_path), "allreduce")
    assert wrong == 0 and "between nodes: cuda, tcp" in text
    assert "| 1K | ll | 10.00 | 0.10 | hier | 25.00 | 0.04 | 2.50 |" in text
    assert "| 1M | rsag | 40.00" in text and "| 10.00 |" in text
    (tmp_path / "perf-2x2-allreduce.json").write_text(json.dumps([rec(1024, 25.0, "hier", 3)]))
    assert nodes_tables.main([str(tmp_path), "allreduce"]) == 1
    text, _ = nodes_tables.table(str(tmp_path), "sendrecv")  # nothing ran: empty table
    assert "transport not logged" in text


def dry_run(tmp_path, ngpu, *stages):
    env = dict(os.environ, DRY_RUN="1", NGPU=str(ngpu), OUT=str(tmp_path))
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-nodes-apps.sh"), *stages],
                       capture_output=True, text=True, env=env, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return {line.split(" (")[0]: line for line in r.stdout.splitlines()[1:]}


def test_nodes_apps_plans(tmp_path):
    four = dry_run(tmp_path, 4)
    assert len(four) > 30
    # 2 nodes x 2: maco-run gives each simulated node GPUs of its own (tests/test_maco_run.cc)
    assert "--simulate-nodes 2 " in four["hier_2x2"]
    assert "--simulate-nodes 4 " in four["hier_4x1nodes"]
    assert "--simulate-nodes" not in four["perf-4x1-sendrecv"]
    assert "MACO_LOG_SUBSYS=proxy" in four["perf-2x2-alltoall"]
    assert "LD_PRELOAD=" in four["torch_check_4"] and "--mps on" not in four["torch_check_4"]
    assert "--nproc-per-node 4" in four["ddp-nccl"] and "LD_PRELOAD" not in four["ddp-nccl"]
    assert "--backend maco" in four["tp-mlp-maco-backend"]
    assert "maco-run -n 4" in four["from_nccl_4"] and "TEST_NCCL_BOOT=gpu" in four["from_nccl_4"]
    assert "--trace" in four["fused_4"]
    assert "--backends nccl" in four["ddp-compare"] and "--rounds 4" in four["ddp-compare"]
    assert "--nproc-per-node 4" in four["ddp-compare"]
    one = dry_run(tmp_path, 1, "nodes", "apps")
    assert "--mps off" not in one["hier_2x2"]
    assert "--mps on" in one["ddp-maco-backend"] and "--nproc-per-node 4" in one["ddp-maco-backend"]
    assert "--nproc-per-node 1" in one["ddp-nccl"] and "--mps on" not in one["ddp-nccl"]
    assert "run_bootstrap_gpu.sh" in one["from_nccl_1"]
    assert "fused_4" not in one and "ddp-compare" not in one  # NCCL refuses shared GPUs
    r = subprocess.run(["bash", os.path.join(REPO, "scripts", "gpu-nodes-apps.sh"), "bogus"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "unknown stage" in r.stderr
