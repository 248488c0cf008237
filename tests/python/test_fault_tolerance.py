"""A job that loses a rank and goes on, through the Python API, with real processes on the CPU
(bootstrap-only communicators): the survivors' call fails naming the dead rank, they shrink
without naming it, a replacement process joins through grow/join; a watchdog thread's revoke
ends another thread's wait here and a peer's; split; argument errors."""

import multiprocessing as mp
import os
import signal
import threading
import time
import traceback

import pytest

TIMEOUT = 120


def _wait_file(path, seconds=60):
    deadline = time.time() + seconds
    while not os.path.exists(path):
        if time.time() > deadline:
            raise TimeoutError(f"no file {path}")
        time.sleep(0.02)
    with open(path, "rb") as f:
        return f.read()


def _write_file(path, data):
    with open(path + ".tmp", "wb") as f:
        f.write(data)
    os.rename(path + ".tmp", path)


def _entry(fn, rank, q, args):
    for k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_BOOTSTRAP_ADDR", "RANK", "WORLD_SIZE"):
        os.environ.pop(k, None)
    try:
        q.put((rank, True, fn(rank, q, *args)))
    except BaseException:  # noqa: BLE001 - report everything to the parent
        q.put((rank, False, traceback.format_exc()))


def _run(fn, nprocs, *args):
    """Runs fn(rank, queue, *args) in nprocs fresh processes; every process reports once (a
    victim reports before it dies); returns the reports in rank order."""
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_entry, args=(fn, r, q, args)) for r in range(nprocs)]
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
            p.join(timeout=20)
            if p.is_alive():
                p.kill()
    return [results[r] for r in range(nprocs)]


def _comm(rank, n, uid_path):
    import maco

    if rank == 0:
        _write_file(uid_path, maco.unique_id())
    uid = _wait_file(uid_path)
    return maco.Communicator(uid, rank, n, timeout=60)


def _lose_and_replace(rank, q, tmp):
    """Ranks 0-3 form a job; rank 3 dies; 0-2 shrink and grow back with process 4."""
    import maco

    if rank == 4:  # the replacement: joins the grown communicator as rank 3
        gid = _wait_file(os.path.join(tmp, "grow"))
        with maco.Communicator.join(gid, 3, 4) as grown:
            return dict(rank=grown.rank, size=grown.size,
                        got=grown.allgather_bytes(b"J"))
    c = _comm(rank, 4, os.path.join(tmp, "uid"))
    c.barrier()
    if rank == 3:
        q.put((3, True, "dying"))
        q.close()
        q.join_thread()  # the report is in the pipe before the process dies
        os.kill(os.getpid(), signal.SIGKILL)
    err = None
    t0 = time.time()
    try:
        for _ in range(1000):
            c.allgather_bytes(b"x" * 4096)
    except (maco.RemoteError, maco.RevokedError) as e:
        err = (type(e).__name__, str(e))
    small = c.shrink()  # nobody named: the survivors find rank 3 gone
    took = time.time() - t0
    c.close()
    got_small = small.allgather_bytes(bytes([rank]))
    gid = None
    if small.rank == 0:
        gid = small.grow_id()
        _write_file(os.path.join(tmp, "grow"), gid)
    with small, small.grow(4, gid) as grown:
        got = grown.allgather_bytes(str(rank).encode())
        return dict(err=err, took=took, small=(small.rank, small.size, got_small),
                    rank=grown.rank, size=grown.size, got=got)


def test_a_dead_rank_is_shrunk_away_and_replaced(tmp_path):
    res = _run(_lose_and_replace, 5, str(tmp_path))
    assert res[3] == "dying"
    for r in (0, 1, 2):
        x = res[r]
        assert x["err"] is not None, "the death was not noticed"
        assert x["err"][0] in ("RemoteError", "RevokedError"), x["err"]
        assert x["small"] == (r, 3, [b"\x00", b"\x01", b"\x02"]), x["small"]
        assert (x["rank"], x["size"]) == (r, 4)
        assert x["got"] == [b"0", b"1", b"2", b"J"]
        assert x["took"] < TIMEOUT
    assert (res[4]["rank"], res[4]["size"]) == (3, 4)
    assert res[4]["got"] == [b"0", b"1", b"2", b"J"]
    # The one who saw the death itself names the dead rank.
    assert any("rank 3" in res[r]["err"][1] for r in (0, 1, 2)), [res[r]["err"] for r in (0, 1, 2)]


def _watchdog(rank, q, tmp):
    """Rank 0: a watchdog thread revokes while the main thread waits in a call; rank 1's wait
    ends too (the revoke reaches it); then both shrink and split."""
    import maco

    c = _comm(rank, 2, os.path.join(tmp, "uid"))
    c.barrier()
    if rank == 0:
        threading.Timer(0.3, c.revoke).start()
    t0 = time.time()
    try:
        c.broadcast_bytes(None, root=1 - rank)  # nobody sends: only the revoke ends it
        raised = None
    except maco.RevokedError as e:
        raised = str(e)
    waited = time.time() - t0
    with c.shrink(abort=False) as again:
        halves = again.split(again.rank, key=-again.rank)
        with halves:
            parts = (halves.rank, halves.size)
        none = again.split(None)
        return dict(raised=raised, waited=waited, size=again.size, parts=parts, none=none)


def test_a_watchdog_revoke_ends_waits_here_and_on_the_peer(tmp_path):
    res = _run(_watchdog, 2, str(tmp_path))
    for r, x in enumerate(res):
        assert x["raised"] is not None and "revoked" in x["raised"], x
        assert x["waited"] < 30, x  # the bootstrap timeout is 60 s here
        assert x["size"] == 2 and x["parts"] == (0, 1) and x["none"] is None, x


def _bad_args(rank, q, tmp):
    import maco

    c = _comm(rank, 2, os.path.join(tmp, "uid"))
    out = {}
    with pytest.raises(ValueError, match=r"exclude\[0\] is 5, outside \[0, 2\)"):
        c.shrink([5])
    with pytest.raises(ValueError, match="color is -2"):
        c.split(-2)
    if rank == 1:
        with pytest.raises(maco.InvalidUsageError, match="only rank 0"):
            c.grow_id()
    with pytest.raises(maco.InvalidArgumentError, match="nranks is 2"):
        c.grow(2)
    with pytest.raises(ValueError, match="grow_id: expected 128 bytes"):
        maco.Communicator.join(b"short", 2, 3)
    with pytest.raises(maco.InvalidArgumentError, match="not a grow id"):
        maco.Communicator.join(maco.unique_id(), 2, 3)
    out["revoked_class"] = maco.error_class(-10).__name__
    c.close()
    return out


def test_bad_arguments_name_the_argument(tmp_path):
    res = _run(_bad_args, 2, str(tmp_path))
    assert res[0]["revoked_class"] == "RevokedError"


def _torchft_loop(rank, q, tmp):
    """A torchft-style loop on the "maco" backend: rank 3 dies; the survivors' barrier fails,
    they shrink the default group with SHRINK_ABORT (torch's shrink_group), and go on."""
    import torch.distributed as dist

    import maco.torch  # noqa: F401 - registers the "maco" backend

    store = dist.FileStore(os.path.join(tmp, "store"), 4)
    dist.init_process_group("maco", store=store, rank=rank, world_size=4)
    pg = dist.group.WORLD
    pg.comm  # the MACO communicator, made now (collective; no GPU needed)
    dist.barrier()
    if rank == 3:
        q.put((3, True, "dying"))
        q.close()
        q.join_thread()
        os.kill(os.getpid(), signal.SIGKILL)
    err = None
    try:
        for _ in range(1000):
            pg.barrier()  # MACO's host barrier: meets the death
    except RuntimeError as e:  # maco.RemoteError / RevokedError are RuntimeErrors
        err = type(e).__name__
    c10d = dist.distributed_c10d
    small = c10d.shrink_group([3], shrink_flags=c10d.SHRINK_ABORT)
    out = dict(err=err, rank=dist.get_rank(), size=dist.get_world_size(),
               default=dist.group.WORLD is small)
    dist.barrier()  # the shrunk group's own barrier: MACO's, over the survivors
    backend = small._get_backend(torch_device_cpu())
    out["got"] = backend.pg.comm.allgather_bytes(bytes([rank]))
    # It can shrink again: rank 2 leaves on purpose.
    if rank != 2:
        smaller = c10d.shrink_group([2], group=small)
        out["smaller"] = (smaller.rank(), smaller.size())
    else:
        out["smaller"] = None
    return out


def torch_device_cpu():
    import torch

    return torch.device("cpu")


def test_torchft_style_loop_on_the_maco_backend(tmp_path):
    pytest.importorskip("torch", reason="needs torch (PYTEST_TORCH=0 leaves it out)")
    import torch.distributed.distributed_c10d as c10d

    if not hasattr(c10d, "shrink_group"):
        pytest.skip("this torch has no torch.distributed shrink_group (torch 2.11+ has)")
    res = _run(_torchft_loop, 4, str(tmp_path))
    assert res[3] == "dying"
    for r in (0, 1, 2):
        x = res[r]
        assert x["err"] is not None, x
        assert (x["rank"], x["size"], x["default"]) == (r, 3, True), x
        assert x["got"] == [b"\x00", b"\x01", b"\x02"], x
    assert res[0]["smaller"] == (0, 2) and res[1]["smaller"] == (1, 2)
    assert res[2]["smaller"] is None
