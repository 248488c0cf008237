"""CPU tests with several processes: bootstrap-only communicators from a unique id, from
maco-run's environment, and from torch.distributed (the "maco" backend and
Communicator.from_process_group), on a machine with or without a GPU."""

import multiprocessing as mp
import os
import subprocess
import sys
import traceback

import pytest

from conftest import HERE, NO_TORCH, REPO, free_port

try:
    import torch.distributed as dist
except ImportError:  # pragma: no cover
    dist = None

needs_torch = pytest.mark.skipif(dist is None, reason=NO_TORCH)
TIMEOUT = 120


def _run(fn, nprocs, *args):
    """Runs fn(rank, nprocs, *args) in nprocs fresh processes; returns their results in
    rank order and fails with a worker's traceback if one raised."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, nprocs, q, args)) for r in range(nprocs)]
    for p in procs:
        p.start()
    results = {}
    try:
        for _ in range(nprocs):
            rank, ok, value = q.get(timeout=TIMEOUT)
            if not ok:
                pytest.fail(f"rank {rank} failed:\n{value}")
            results[rank] = value
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(nprocs)]


def _entry(fn, rank, nprocs, q, args):
    for k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_BOOTSTRAP_ADDR", "RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    try:
        q.put((rank, True, fn(rank, nprocs, *args)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        q.put((rank, False, traceback.format_exc()))


# ------------------------------------------------------------------ unique id


def _uid_worker(rank, n, uid):
    import maco

    with maco.Communicator(uid, rank, n, timeout=60) as c:
        got = c.allgather_bytes(bytes([rank]) * 3)
        root_says = c.broadcast_bytes(b"from root %d" % (n - 1) if rank == n - 1 else None,
                                      root=n - 1)
        c.barrier()
        return dict(rank=c.rank, size=c.size, local_rank=c.local_rank,
                    local_size=c.local_size, nodes=c.num_nodes, got=got, root_says=root_says,
                    hosts={c.host_id(r) for r in range(n)})


def _uid_root(rank, n, _):
    import maco

    # Rank 0 makes the id in its own process and hands it to the others through a file.
    path = _
    if rank == 0:
        uid = maco.unique_id()
        with open(path + ".tmp", "wb") as f:
            f.write(uid)
        os.rename(path + ".tmp", path)
    else:
        import time

        deadline = time.time() + 60
        while not os.path.exists(path):
            if time.time() > deadline:
                raise TimeoutError("no unique id file")
            time.sleep(0.05)
        with open(path, "rb") as f:
            uid = f.read()
    return _uid_worker(rank, n, uid)


def _gil_worker(rank, n, uid_path):
    """Rank 0 waits in barrier() for rank 1 (which sleeps first) while a Python thread of
    rank 0 counts: the count grows only if barrier() released the GIL."""
    import threading
    import time

    import maco

    if rank == 0:
        uid = maco.unique_id()
        with open(uid_path + ".tmp", "wb") as f:
            f.write(uid)
        os.rename(uid_path + ".tmp", uid_path)
    else:
        while not os.path.exists(uid_path):
            time.sleep(0.02)
        with open(uid_path, "rb") as f:
            uid = f.read()
    with maco.Communicator(uid, rank, n, timeout=60) as c:
        c.barrier()
        if rank == 1:
            time.sleep(1.0)
            c.barrier()
            return None
        count = [0]
        stop = threading.Event()

        def spin():
            while not stop.is_set():
                count[0] += 1

        t = threading.Thread(target=spin)
        t.start()
        time.sleep(0.05)
        before = count[0]
        t0 = time.time()
        c.barrier()  # blocks about 1 s in C
        waited = time.time() - t0
        during = count[0] - before
        stop.set()
        t.join()
        return dict(waited=waited, during=during)


def test_blocking_calls_release_the_gil(tmp_path):
    res = _run(_gil_worker, 2, str(tmp_path / "uid"))[0]
    assert res["waited"] > 0.5, res
    assert res["during"] > 10000, res  # the spinning thread ran while rank 0 waited


def test_bootstrap_only_communicator_three_processes(tmp_path):
    n = 3
    res = _run(_uid_root, n, str(tmp_path / "uid"))
    for r, x in enumerate(res):
        assert (x["rank"], x["size"], x["local_rank"], x["local_size"], x["nodes"]) == (
            r, n, r, n, 1)
        assert x["got"] == [bytes([q]) * 3 for q in range(n)]
        assert x["root_says"] == b"from root 2"
        assert len(x["hosts"]) == 1


# ------------------------------------------------------------------ maco-run


def _maco_run():
    path = os.environ.get("TEST_MACO_RUN") or os.path.join(REPO, "build", "tools", "maco-run")
    return path if os.access(path, os.X_OK) else None


@pytest.mark.skipif(_maco_run() is None, reason="maco-run not built (set TEST_MACO_RUN)")
def test_from_env_under_maco_run():
    script = (
        "import maco\n"
        "c = maco.Communicator.from_env()\n"
        "got = c.allgather_bytes(b'%02d' % c.rank)\n"
        "assert got == [b'%02d' % r for r in range(c.size)], got\n"
        "maco.init()\n"
        "assert maco.get_world_size() == c.size == 4\n"
        "maco.barrier(); maco.finalize(); c.close()\n"
        "print('rank', c.rank, 'ok')\n")
    env = {k: v for k, v in os.environ.items()}
    env["PYTHONPATH"] = os.pathsep.join([HERE] + sys.path)
    out = subprocess.run([_maco_run(), "-n", "4", "--timeout", "120", sys.executable, "-c",
                          script], capture_output=True, text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.count(" ok") == 4, out.stdout


# ------------------------------------------------------------------ torch.distributed


def _torch_backend_worker(rank, n, port):
    import torch
    import torch.distributed as dist

    import maco
    import maco.torch as mt

    dist.init_process_group("maco", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    pg = dist.group.WORLD
    out = dict(backend=dist.get_backend(), is_maco=isinstance(pg, mt.ProcessGroupMaco))
    # No communicator at init (it is made at the first CUDA call, on its tensors' device);
    # a barrier before that runs on Gloo and makes none either.
    out["lazy"] = pg._comm is None
    dist.barrier()
    out["lazy_after_barrier"] = pg._comm is None
    out["comm"] = (pg.comm.rank, pg.comm.size)  # made now (collective), without a GPU here
    dist.barrier()
    # CPU tensors go to the Gloo group beside MACO's.
    t = torch.full((5,), float(rank + 1))
    dist.all_reduce(t)
    out["cpu_sum"] = t.tolist()
    g = [torch.empty(2) for _ in range(n)]
    dist.all_gather(g, torch.full((2,), float(rank)))
    out["cpu_gather"] = [x.tolist() for x in g]
    # maco.init() over the initialized torch.distributed world.
    c = maco.init()
    out["level1"] = (maco.get_rank(), maco.get_world_size(), c.size)
    c.barrier()
    maco.finalize()
    dist.destroy_process_group()
    return out


@needs_torch
def test_torch_backend_registers_and_runs_cpu_through_gloo():
    n = 2
    res = _run(_torch_backend_worker, n, free_port())
    for r, x in enumerate(res):
        assert x["backend"] == "maco" and x["is_maco"]
        assert x["lazy"] and x["lazy_after_barrier"]
        assert x["comm"] == (r, n)
        assert x["cpu_sum"] == [3.0] * 5
        assert x["cpu_gather"] == [[0.0, 0.0], [1.0, 1.0]]
        assert x["level1"] == (r, n, n)


def _device_id_worker(rank, n):
    """torch's own group creation with device_id=cuda:1 (its helper, as init_process_group
    calls it; init_process_group itself refuses a CUDA device_id without a GPU), the
    communicator faked (a real one needs the GPU): the maco group must be made on cuda:1
    at creation and answer torch's question for its backend on that device."""
    import datetime

    import torch
    import torch.distributed as dist

    import maco.torch as mt
    from maco import _process_group  # ProcessGroupMaco's module

    made = []

    class FakeComm:
        def __init__(self, uid, rank, size, *, device=None, timeout=None):
            self.device = device
            made.append(device)

    _process_group.Communicator = FakeComm
    c10d = dist.distributed_c10d
    pg, _ = c10d._new_process_group_helper(
        1, 0, [], "maco", dist.HashStore(), "maco-device-id-test",
        timeout=datetime.timedelta(seconds=20), device_id=torch.device("cuda", 1))
    return dict(is_maco=isinstance(pg, mt.ProcessGroupMaco), made=made,
                bound=str(pg.bound_device_id), device=str(pg.device))


@needs_torch
def test_torch_backend_device_id_through_torchs_group_creation():
    (x,) = _run(_device_id_worker, 1)
    assert x == dict(is_maco=True, made=[1], bound="cuda:1", device="cuda:1"), x


def _pg_worker(rank, n, port):
    import torch
    import torch.distributed as dist

    import maco

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=n)
    c = maco.Communicator.from_process_group()
    sub = dist.new_group([1, 2])
    sc = maco.Communicator.from_process_group(sub) if rank in (1, 2) else None
    res = dict(world=(c.rank, c.size), sub=(sc.rank, sc.size) if sc else None,
               got=c.allgather_bytes(bytes([rank])))
    # patch_torch_distributed: CPU tensors keep torch's own path; the patch undoes cleanly.
    maco.patch_torch_distributed()
    patched = getattr(dist.all_reduce, "__maco_patched__", False)
    t = torch.full((3,), float(rank))
    dist.all_reduce(t)
    maco.unpatch_torch_distributed()
    res.update(patched=patched, unpatched=not hasattr(dist.all_reduce, "__maco_patched__"),
               sum=t.tolist())
    c.close()
    if sc:
        sc.close()
    dist.destroy_process_group()
    return res


@needs_torch
def test_from_process_group_and_patch_fallback():
    n = 3
    res = _run(_pg_worker, n, free_port())
    for r, x in enumerate(res):
        assert x["world"] == (r, n)
        assert x["sub"] == ({1: (0, 2), 2: (1, 2)}[r] if r in (1, 2) else None)
        assert x["got"] == [bytes([q]) for q in range(n)]
        assert x["patched"] and x["unpatched"]
        assert x["sum"] == [3.0] * 3


@needs_torch
def test_from_env_under_torchrun():
    """torchrun's agent listens on MASTER_PORT itself: the id travels through its store."""
    script = (
        "import maco\n"
        "c = maco.Communicator()\n"
        "c2 = maco.Communicator()  # a second one from the same environment\n"
        "got = c.allgather_bytes(b'%02d' % c.rank)\n"
        "assert got == [b'%02d' % r for r in range(c.size)], got\n"
        "assert (c.size, c2.size, c2.rank) == (3, 3, c.rank)\n"
        "import os; os.write(1, b'rank %d local %d ok\\n' % (c.rank, c.local_rank))\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("MACO_")}
    env["PYTHONPATH"] = os.pathsep.join([HERE] + sys.path)
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                          "--master-port", str(free_port()), "--no-python",
                          sys.executable, "-c", script], capture_output=True, text=True,
                         env=env, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert sorted(line for line in out.stdout.splitlines() if " ok" in line) == [
        f"rank {r} local {r} ok" for r in range(3)], out.stdout


def _test_unit():
    path = os.environ.get("TEST_UNIT") or os.path.join(REPO, "build", "tests", "test_unit")
    return path if os.access(path, os.X_OK) else None


@needs_torch
@pytest.mark.skipif(_test_unit() is None, reason="test_unit not built (set TEST_UNIT)")
def test_c_bootstrap_from_env_under_torchrun():
    """The C library's maco_bootstrap_create_from_env under a real torchrun: MASTER_PORT is
    the agent's TCPStore, so rank 0 publishes a unique id there (src/host/bootstrap/
    torch_store.c) and the others read it; each rank makes two bootstraps."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MACO_")}
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3",
                          "--master-port", str(free_port()), "--no-python", _test_unit(),
                          "--gtest_filter=BootstrapEnv.UnderTorchrun"], capture_output=True,
                         text=True, env=env, timeout=180)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert out.stdout.count("[  PASSED  ] 1 test.") == 3, out.stdout[-3000:]
    assert "SKIPPED" not in out.stdout, out.stdout[-3000:]
