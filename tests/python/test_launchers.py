"""torchrun with two agents (two simulated nodes, a c10d rendezvous on 127.0.0.1): the job's
description and unique id come from torchrun's own variables and agent store, with no glue.

- test_launcher_mp (C): the rank is torchrun's RANK, the id came through torchrun's store, a
  stranger with a guessed nonce is refused;
- the Python communicator (``maco.Communicator()``), twice in one process, and in the same
  workers the NCCL-compatible library: rank 0's ncclGetUniqueId handed to the others through torch's
  store (as PyTorch's ProcessGroupNCCL does), ncclCommInitRank and a split by node.

Each agent gets its own MACO_HOST_ID, as two machines would have distinct host ids.
"""

import os
import socket
import subprocess
import sys

import pytest

from conftest import HERE, NO_TORCH, REPO, free_port

try:
    import torch.distributed  # noqa: F401
    HAVE_TORCH = True
except ImportError:  # pragma: no cover
    HAVE_TORCH = False

needs_torch = pytest.mark.skipif(not HAVE_TORCH, reason=NO_TORCH)
TIMEOUT = 240


def _built(var, *parts):
    path = os.environ.get(var) or os.path.join(REPO, "build", *parts)
    return path if os.path.exists(path) else None


def _torchrun_pair(cmd, extra_env=None, nproc=2):
    """Starts two torchrun agents (--nnodes 2, `nproc` workers each) running `cmd`; returns
    [(exit status, stdout + stderr)] per agent. Workers see only torchrun's variables (no
    MACO_* job variables, no other launcher's) and MACO_HOST_ID of their agent."""
    port = free_port()
    run_id = f"maco-test-{os.getpid()}-{port}"
    host = socket.gethostname()
    agents = []
    for node in (0, 1):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("MACO_", "SLURM_", "OMPI_", "PMIX_", "PMI_"))}
        env["PYTHONPATH"] = os.pathsep.join([HERE] + sys.path)
        env["MACO_HOST_ID"] = f"{host}/simulated-node-{node}"
        env.update(extra_env or {})
        agents.append(subprocess.Popen(
            [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
             "--nproc-per-node", str(nproc), "--rdzv-backend", "c10d",
             "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", run_id, "--max-restarts", "0",
             "--no-python", *cmd],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env))
    results = []
    for a in agents:
        try:
            out, _ = a.communicate(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            for b in agents:
                b.kill()
            out, _ = a.communicate()
            out += f"\n(agent killed after {TIMEOUT} s)"
        results.append((a.returncode, out))
    return results


def _assert_all_ok(results):
    for node, (rc, out) in enumerate(results):
        assert rc == 0, f"agent {node} exited {rc}:\n{out[-4000:]}"


@needs_torch
@pytest.mark.skipif(_built("TEST_LAUNCHER_MP", "tests", "test_launcher_mp") is None,
                    reason="test_launcher_mp not built (set TEST_LAUNCHER_MP)")
def test_c_job_under_torchrun_two_agents():
    """test_launcher_mp under torchrun --nnodes 2."""
    results = _torchrun_pair([_built("TEST_LAUNCHER_MP", "tests", "test_launcher_mp")],
                             {"TEST_LAUNCHER": "torchrun/torchrun-store",
                              "TEST_LAUNCHER_RANK_VAR": "RANK", "MACO_LOG_LEVEL": "info"})
    _assert_all_ok(results)
    text = "".join(out for _, out in results)
    assert text.count("[  PASSED  ] 2 tests.") == 4, text[-4000:]
    assert "SKIPPED" not in text, text[-4000:]
    # The INFO line: torchrun's rank, its node (GROUP_RANK) and local rank.
    assert "launcher torchrun: rank 3 of 4, node 1 of 2, local rank 1 of 2" in text, text[-4000:]


# The Python communicator, then the NCCL-compatible library (when TEST_NCCL_LIB is given), in
# the same workers: each torchrun pair costs about 10 s on 2 cores (torch's imports).
SCRIPT = r"""
import ctypes
import datetime
import os

import torch.distributed as dist

import maco

e = os.environ
rank, size = int(e["RANK"]), int(e["WORLD_SIZE"])
c = maco.Communicator()
assert (c.rank, c.size) == (rank, size), (c.rank, c.size, rank, size)
assert (c.num_nodes, c.node) == (2, int(e["GROUP_RANK"])), (c.num_nodes, c.node)
assert c.local_rank == int(e["LOCAL_RANK"]), c.local_rank
got = c.allgather_bytes(b"%02d" % c.rank)
assert got == [b"%02d" % r for r in range(size)], got
c2 = maco.Communicator(timeout=60)  # a second job from the same environment
assert (c2.rank, c2.size) == (rank, size)
c2.barrier()
c2.close()
c.close()
os.write(1, b"rank %d node %d communicator ok\n" % (rank, int(e["GROUP_RANK"])))
if not e.get("TEST_NCCL_LIB"):
    raise SystemExit(0)


class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


lib = ctypes.CDLL(e["TEST_NCCL_LIB"])
lib.ncclGetLastError.restype = ctypes.c_char_p
# As PyTorch's ProcessGroupNCCL: rank 0 makes the id, torch's store carries it.
store = dist.TCPStore(e["MASTER_ADDR"], int(e["MASTER_PORT"]), is_master=False,
                      timeout=datetime.timedelta(seconds=120))
uid = UniqueId()
if rank == 0:
    assert lib.ncclGetUniqueId(ctypes.byref(uid)) == 0
    store.set("test/nccl_id", ctypes.string_at(ctypes.addressof(uid), 128))
else:
    data = store.get("test/nccl_id")
    assert len(data) == 128, len(data)
    ctypes.memmove(ctypes.byref(uid), data, 128)
comm = ctypes.c_void_p()
res = lib.ncclCommInitRank(ctypes.byref(comm), size, uid, rank)
assert res == 0, (res, lib.ncclGetLastError(None))
n, r = ctypes.c_int(), ctypes.c_int()
assert lib.ncclCommCount(comm, ctypes.byref(n)) == 0 and n.value == size
assert lib.ncclCommUserRank(comm, ctypes.byref(r)) == 0 and r.value == rank
# One communicator per node: a split by GROUP_RANK, ordered by rank.
sub = ctypes.c_void_p()
assert lib.ncclCommSplit(comm, int(e["GROUP_RANK"]), rank, ctypes.byref(sub), None) == 0
assert lib.ncclCommCount(sub, ctypes.byref(n)) == 0 and n.value == int(e["LOCAL_WORLD_SIZE"])
assert lib.ncclCommUserRank(sub, ctypes.byref(r)) == 0 and r.value == int(e["LOCAL_RANK"])
assert lib.ncclCommDestroy(sub) == 0
assert lib.ncclCommDestroy(comm) == 0
os.write(1, b"rank %d nccl ok\n" % rank)
"""


@needs_torch
def test_python_and_nccl_under_torchrun_two_agents():
    """maco.Communicator() twice, then (where libmaco_nccl.so is built) rank 0's
    ncclGetUniqueId through torch's store, ncclCommInitRank and a split by node."""
    nccl = _built("TEST_NCCL_LIB", "nccl", "libmaco_nccl.so")
    results = _torchrun_pair([sys.executable, "-c", SCRIPT], {"TEST_NCCL_LIB": nccl or ""})
    _assert_all_ok(results)
    lines = sorted(line for _, out in results for line in out.splitlines() if line.endswith(" ok"))
    want = [f"rank {r} node {r // 2} communicator ok" for r in range(4)]
    if nccl is not None:
        want += [f"rank {r} nccl ok" for r in range(4)]
    else:
        print("the NCCL-compatible library is not built: its hand-over was not run")
    assert lines == sorted(want), lines
