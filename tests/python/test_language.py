"""maco.language from the installed package: the DSL's plans match the shipped files (the
full DSL, schema and verifier tests are tests/plans/test_plans.py, ctest `plans`)."""

import json
import os

import pytest

from conftest import REPO


def test_language_is_in_the_package():
    import maco.language as L

    assert L.PLAN_MAGIC == "MACO-PLAN" and L.PLAN_VERSION == 1
    with L.Program("ag", L.AllGather(world_size=2)) as prog:
        for r in range(2):
            p = 1 - r
            L.Rank(r).copy(L.Rank(r).output[r], L.Rank(r).input[0], tb=0)
            ch = L.MemoryChannel(dst_rank=p, src_rank=r, tb=0)
            ch.put(L.Rank(p).output[r], L.Rank(r).input[0], tb=0)
            ch.signal(tb=0)
            ch.wait(tb=0)
    d = json.loads(prog.to_json())
    assert d["collective"] == "allgather" and len(d["ranks"]) == 2


def test_example_plan_matches_the_shipped_file():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "plan_allreduce", os.path.join(REPO, "examples", "plan_allreduce.py"))
    ex = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ex)
    with open(os.path.join(REPO, "examples", "plans", "allreduce_read_2r.json")) as f:
        assert f.read() == ex.read_reduce_allreduce(2).to_json()


def test_errors_name_rank_tb_op():
    import maco.language as L

    with L.Program("x", L.AllReduce(world_size=2)):
        ch = L.MemoryChannel(dst_rank=1, src_rank=0, tb=0)
        with pytest.raises(L.PlanError, match=r"rank 0 tb 1 op 0 \(signal\)"):
            ch.signal(tb=1)


def test_verify_through_the_library():
    import maco.language as L

    with L.Program("ar", L.AllReduce(world_size=2)) as prog:
        for r in range(2):
            p = 1 - r
            ch = L.MemoryChannel(dst_rank=p, src_rank=r, tb=0)
            me = L.Rank(r)
            me.reduce(me.output[0], [me.input[0], ch.remote(L.Rank(p).input[0])], tb=0)
    prog.verify()
    with L.Program("bad", L.AllReduce(world_size=2)) as bad:
        for r in range(2):
            L.MemoryChannel(dst_rank=1 - r, src_rank=r, tb=0)
            me = L.Rank(r)
            me.reduce(me.output[0], [me.input[0]], tb=0)  # forgets the peer's input
    with pytest.raises(L.PlanError, match=r"postcondition: rank 0 output\[0\] lacks input\[0\] "
                                          r"of rank 1"):
        bad.verify()


def _read_reduce(n, drop_self=False):
    import maco.language as L

    with L.Program(f"read_{n}r", L.AllReduce(world_size=n, parts=1)) as prog:
        for r in range(n):
            me = L.Rank(r)
            srcs = [] if drop_self else [me.input[0]]
            for q in range(n):
                if q != r:
                    ch = L.MemoryChannel(dst_rank=q, src_rank=r, tb=0)
                    srcs.append(ch.remote(L.Rank(q).input[0]))
            me.reduce(me.output[0], srcs, tb=0)
    return prog


def test_load_plan_without_a_gpu(tmp_path):
    """Communicator.load_plan (maco_plan_load through the extension) on a machine without a
    usable GPU: the Program and the path forms both reach the library, which says why it
    cannot run the plan (the GPU tests run plans: gpu_collectives.py); a missing file is
    FileNotFoundError before any MACO call."""
    import maco

    if maco.cuda_device_count()[0] != 0:
        pytest.skip("a GPU is visible (gpu_collectives.py runs plans there)")
    c = maco.Communicator(maco.unique_id(), 0, 1)
    try:
        one = _read_reduce(1)
        one.verify()
        with pytest.raises(maco.UnsupportedError, match="no usable CUDA device"):
            c.load_plan(one)
        path = tmp_path / "read_1r.json"
        one.save(str(path))
        with pytest.raises(maco.UnsupportedError, match=f"{path}|no usable CUDA device"):
            c.load_plan(path)
        with pytest.raises(FileNotFoundError):
            c.load_plan(tmp_path / "missing.json")
    finally:
        c.close()


def test_group_operations_refuse_sources_of_another_size():
    """A thread-block group splits an operation by the destination's size: a source of another
    size is an error (as on one thread block), not silently cut."""
    import maco.language as L

    g = L.ThreadBlockGroup([0, 1])
    with L.Program("x", L.AllReduce(world_size=2, parts=4)):
        me = L.Rank(0)
        with pytest.raises(L.PlanError, match=r"rank 0 \(copy\): .* differ in size"):
            me.copy(me.output[0:2], me.input[0:4], tb=g)
        with pytest.raises(L.PlanError, match=r"rank 0 \(reduce\): .* differ in size"):
            me.reduce(me.output[0:2], [me.output[0:2], me.input[0:3]], tb=g)
        ch = L.PortChannel(dst_rank=1, src_rank=0, tb=g)
        with pytest.raises(L.PlanError, match=r"rank 0 \(put_with_signal\): .* differ in size"):
            ch.put_with_signal(L.Rank(1).output[0:2], me.input[0:4], tb=g)
