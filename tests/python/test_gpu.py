"""GPU tests of the maco package (skipped, with the reason, without a GPU): the checks of
gpu_collectives.py under maco-run with 2 and 4 ranks (sharing the GPUs there are, through
MPS), gpu_persistent.py (maco.PersistentKernel, maco.profiler) with 1, 2 and 4 ranks, gpu_context.py
(maco.Context, Level 2) with 1 and 2 ranks, gpu_tp.py (maco.tp's GEMM + collective operators)
with 1, 2 and 4 ranks, and
gpu_torch_backend.py under torchrun with 4 ranks, as the "maco" backend (bound by set_device
before init, by the first collective after init then set_device, and by init's device_id=)
and through patch_torch_distributed, gpu_overlap.py (the overlap API of issue 39) under
torchrun with one rank per GPU (2 to 4), and gpu_ep.py (maco.ep's dispatch and combine) with 2
and 4 ranks."""

import os
import shutil
import subprocess
import sys

import pytest

import maco
from conftest import HERE, REPO

count, why = maco.cuda_device_count()
pytestmark = pytest.mark.skipif(count == 0, reason=f"no GPU: {why}")


def maco_run():
    path = os.environ.get("TEST_MACO_RUN") or os.path.join(REPO, "build", "tools", "maco-run")
    if not os.access(path, os.X_OK):
        pytest.skip("maco-run not built (set TEST_MACO_RUN)")
    return path


def run(cmd, timeout=280):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    env.setdefault("NCCL_NVLS_ENABLE", "0")
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=timeout)
    print(out.stdout[-6000:])
    print(out.stderr[-6000:], file=sys.stderr)
    assert out.returncode == 0, f"{cmd} exited {out.returncode}"
    return out.stdout


@pytest.mark.parametrize("ranks", [2, 4])
def test_collectives(ranks):
    out = run([maco_run(), "-n", str(ranks), "--timeout", "240", sys.executable,
               os.path.join(HERE, "gpu_collectives.py")])
    assert out.count("PASS gpu_collectives") == ranks


@pytest.mark.parametrize("ranks", [1, 2, 4])
def test_persistent_kernel(ranks):
    pytest.importorskip("torch")
    out = run([maco_run(), "-n", str(ranks), "--timeout", "200", sys.executable,
               os.path.join(HERE, "gpu_persistent.py")])
    assert out.count("PASS gpu_persistent") + out.count("SKIP gpu_persistent") == ranks


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
def test_tp_operators(ranks):
    pytest.importorskip("torch")
    out = run([maco_run(), "-n", str(ranks), "--timeout", "200", sys.executable,
               os.path.join(HERE, "gpu_tp.py")])
    assert out.count("PASS gpu_tp") == ranks


@pytest.mark.parametrize("ranks", [1, 2])
def test_context(ranks):
    pytest.importorskip("torch")
    out = run([maco_run(), "-n", str(ranks), "--timeout", "200", sys.executable,
               os.path.join(HERE, "gpu_context.py")])
    assert out.count("PASS gpu_context") == ranks


@pytest.mark.parametrize("mode", ["backend", "init-then-set", "device-id", "patch"])
def test_torch_distributed(mode):
    pytest.importorskip("torch")
    torchrun = shutil.which("torchrun")
    cmd = [sys.executable, "-m", "torch.distributed.run"] if torchrun is None else [torchrun]
    out = run([maco_run(), "-n", "1", "--mps", "on", "--timeout", "240", *cmd,
               "--nproc-per-node", "4", "--master-port", "29517",
               os.path.join(HERE, "gpu_torch_backend.py"), mode])
    assert out.count(f"PASS gpu_torch_backend {mode}") == 4


def test_overlap_api():
    pytest.importorskip("torch")
    if count < 2:
        pytest.skip(f"gpu_overlap.py needs 2 GPUs (NCCL's reference group refuses a shared "
                    f"GPU); {count} visible")
    n = min(count, 4)
    torchrun = shutil.which("torchrun")
    cmd = [sys.executable, "-m", "torch.distributed.run"] if torchrun is None else [torchrun]
    out = run([*cmd, "--nproc-per-node", str(n), "--master-port", "29518",
               os.path.join(HERE, "gpu_overlap.py")], timeout=600)
    assert out.count("PASS gpu_overlap") == n


@pytest.mark.parametrize("ranks", [2, 4])
def test_expert_parallel(ranks):
    """maco.ep's dispatch and combine in both modes (gpu_ep.py)."""
    pytest.importorskip("torch")
    out = run([maco_run(), "-n", str(ranks), "--timeout", "200", sys.executable,
               os.path.join(HERE, "gpu_ep.py")])
    assert out.count("PASS gpu_ep") == ranks
