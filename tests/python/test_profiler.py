"""maco.profiler without a GPU: the overlap arithmetic of its summary (maco._prof_table) against
a brute-force count on random spans, the seeds' table, and the spans that maco.tp's steps and
the Communicator's collectives record, with CUDA events replaced by a fake clock. On GPUs the
profiler runs in gpu_persistent.py, gpu_tp.py and bench_tp_layer.py."""

import json
import random

import pytest

import maco
from maco import _prof_table as pt
from maco import persistent, tp


def brute(spans, step=1):
    """Overlap per name and the efficiency, by counting integer time units."""
    busy = {"comm": set(), "compute": set()}
    for _, kind, s, d, _ in spans:
        busy[kind].update(range(s, s + d, step))
    other = {"comm": "compute", "compute": "comm"}
    per = {}
    for name, kind, s, d, _ in spans:
        t, h = per.get(name, (0, 0))
        per[name] = (t + d, h + sum(1 for u in range(s, s + d) if u in busy[other[kind]]))
    c = busy["comm"]
    eff = 100.0 * len(c & busy["compute"]) / len(c) if c else None
    return {n: (100.0 * h / t if t else 0.0) for n, (t, h) in per.items()}, eff


def test_merge_and_covered():
    assert pt.merge([(5, 7), (1, 3), (2, 4), (7, 8), (9, 9), (6, 5)]) == [(1, 4), (5, 8)]
    m = pt.merge([(0, 2), (4, 6), (8, 10)])
    assert pt.covered(1, 9, m) == 1 + 2 + 1
    assert pt.covered(2, 4, m) == 0
    assert pt.covered(-5, 100, m) == 6
    assert pt.covered(3, 3, m) == 0 and pt.covered(1, 2, []) == 0


def test_overlap_table_matches_a_brute_force_count():
    rng = random.Random()
    for _ in range(300):
        spans = []
        for i in range(rng.randint(1, 12)):
            kind = rng.choice(["comm", "compute"])
            name = f"{kind}{rng.randint(0, 2)}"
            spans.append((name, kind, rng.randint(0, 60), rng.randint(0, 15), None))
        rows, eff = pt.overlap_table(spans)
        want, want_eff = brute(spans)
        got = {r["name"]: r["overlap_pct"] for r in rows}
        assert got == pytest.approx(want), spans
        if want_eff is None:
            assert eff is None, spans
        else:
            assert eff == pytest.approx(want_eff), spans
        assert sum(r["calls"] for r in rows) == len(spans)
        times = [r["time_ms"] for r in rows]
        assert times == sorted(times, reverse=True)


def test_overlap_table_rows_and_errors():
    spans = [("gemm", "compute", 0.0, 1.0, None), ("gemm", "compute", 2.0, 1.0, None),
             ("copy", "comm", 0.5, 1.0, 0), ("allreduce", "comm", 4.0, 0.5, 24),
             ("allreduce", "comm", 5.0, 0.5, 32)]
    rows, eff = pt.overlap_table(spans)
    by = {r["name"]: r for r in rows}
    assert by["gemm"]["calls"] == 2 and by["gemm"]["time_ms"] == pytest.approx(2.0)
    assert by["gemm"]["mean_us"] == pytest.approx(1000.0)
    assert by["gemm"]["overlap_pct"] == pytest.approx(25.0)   # 0.5 of 2 ms beside the copy
    assert by["copy"]["overlap_pct"] == pytest.approx(50.0)
    assert by["allreduce"]["overlap_pct"] == 0.0 and by["allreduce"]["sms"] == 32
    assert by["copy"]["sms"] == 0 and by["gemm"]["sms"] is None
    assert eff == pytest.approx(100.0 * 0.5 / 2.0)
    assert pt.overlap_table([("gemm", "compute", 0.0, 1.0, None)]) == (
        [dict(name="gemm", kind="compute", calls=1, sms=None, time_ms=1.0, mean_us=1000.0,
              overlap_pct=0.0)], None)
    with pytest.raises(ValueError, match="span 'x' has kind 'io'"):
        pt.overlap_table([("x", "io", 0.0, 1.0, None)])
    with pytest.raises(ValueError, match="span 'x' has duration -1"):
        pt.overlap_table([("x", "comm", 0.0, -1, None)])


def test_format_table_is_the_seeds_table():
    rows, eff = pt.overlap_table([("gemm_reduce_scatter.gemm", "compute", 0.0, 1.0, None),
                                  ("gemm_reduce_scatter.copy", "comm", 0.0, 0.9, 0),
                                  ("allgather", "comm", 1.0, 0.1, 16)])
    text = pt.format_table(rows, eff, 132)
    lines = text.splitlines()
    assert lines[0].startswith("┌") and lines[2].startswith("├") and lines[-2].startswith("└")
    assert [c.strip() for c in lines[1].strip("│").split("│")] == [
        "Operation", "Kind", "Calls", "Time(ms)", "Mean(us)", "Overlap%", "SMs"]
    body = {ln.split("│")[1].strip(): [c.strip() for c in ln.strip("│").split("│")]
            for ln in lines[3:-2]}
    assert body["gemm_reduce_scatter.gemm"][5:] == ["90%", "<= 132"]
    assert body["gemm_reduce_scatter.copy"][5:] == ["100%", "0 (CE)"]
    assert body["allgather"][5:] == ["0%", "16"]
    assert len({len(ln) for ln in lines[:-1]}) == 1  # every line of the box as wide
    assert lines[-1] == ("Total overlap efficiency: 90% (communication time hidden behind "
                         "MACO's compute)")
    assert pt.format_table([], None, None).endswith("Total overlap efficiency: - (no "
                                                    "communication)\n")


class FakeStream:
    def __init__(self, name):
        self.name = name


class FakeClock:
    """torch.cuda's events and streams, with time advancing 1 ms per recorded event."""

    def __init__(self):
        self.now = 0.0
        self.current = FakeStream("current")
        clock = self

        class Event:
            def __init__(self, enable_timing=False):
                assert enable_timing
                self.t = None
                self.stream = None

            def record(self, stream=None):
                clock.now += 1.0
                self.t, self.stream = clock.now, stream

            def elapsed_time(self, end):
                return end.t - self.t

        self.Event = Event


@pytest.fixture
def fake_cuda(monkeypatch):
    torch = pytest.importorskip("torch")
    clock = FakeClock()

    class Props:
        multi_processor_count = 132

    monkeypatch.setattr(torch.cuda, "Event", clock.Event)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: clock.current)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: Props())
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    clock.capturing = False
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: clock.capturing)
    return torch, clock


def test_tp_steps_are_spans_named_after_their_operator(fake_cuda, monkeypatch, tmp_path):
    torch, clock = fake_cuda
    side = FakeStream("side")
    calls = []

    class C:
        def last_ctas(self):
            return 1

    class Comm:
        _c = C()

    pipe = object.__new__(tp._Pipe)
    pipe.st, pipe.cur, pipe.side, pipe.side_h = None, clock.current, side, 7
    pipe._c = Comm._c
    pipe._bar = lambda: calls.append("barrier")
    monkeypatch.setattr(maco._maco, "mem_copy_batch",
                        lambda d, s, n, h: calls.append(("copy", tuple(n), h)))

    @tp._profiled
    def gemm_reduce_scatter(a, b):
        """doc"""
        out = torch.empty(a.shape[0], b.shape[1])
        tp._mm(a, b, out)
        pipe.copies([0], [0], [64])
        pipe.barrier()
        tp._sum_into(torch.stack([out, out]), out)
        return out

    assert gemm_reduce_scatter.__doc__ == "doc"
    a, b = torch.randn(8, 4), torch.randn(4, 3)
    gemm_reduce_scatter(a, b)  # no profiler: nothing recorded, same work done
    assert calls == [("copy", (64,), 7), "barrier"]
    with maco.profiler() as p:
        y = gemm_reduce_scatter(a, b)
        with persistent._op_scope("outer"):  # the outermost scope names the spans
            gemm_reduce_scatter(a, b)
    assert torch.equal(y, 2 * (a @ b))
    sp = p.spans()
    assert [(n, k, d, s) for n, k, _, d, s in sp[:4]] == [
        ("gemm_reduce_scatter.gemm", "compute", 1.0, None),
        ("gemm_reduce_scatter.copy", "comm", 1.0, 0),
        ("gemm_reduce_scatter.barrier", "comm", 1.0, 1),
        ("gemm_reduce_scatter.sum", "compute", 1.0, None)]
    assert [n for n, *_ in sp[4:]] == ["outer.gemm", "outer.copy", "outer.barrier", "outer.sum"]
    starts = [st for _, _, st, _, _ in sp]
    assert starts == sorted(starts) and starts[0] > 0
    assert [r[0] for r in p.records()] == [s[0] for s in sp]
    text = p.summary()
    assert "gemm_reduce_scatter.copy" in text and "0 (CE)" in text and "<= 132" in text
    assert "Total overlap efficiency: 0%" in text  # one stream's clock: nothing overlapped
    assert getattr(persistent._state, "op", None) is None
    with maco.profiler() as q:  # work captured into a CUDA graph is not timed
        clock.capturing = True
        gemm_reduce_scatter(a, b)
        clock.capturing = False
    assert q.spans() == [] and calls[-2:] == [("copy", (64,), 7), "barrier"]
    p.export_chrome_trace(tmp_path / "t.json")
    ev = json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    lanes = {e["name"]: e["tid"] for e in ev if e["ph"] == "X"}
    assert lanes["gemm_reduce_scatter.gemm"] == 0 and lanes["gemm_reduce_scatter.copy"] == 1
    assert {e["args"]["name"] for e in ev if e["ph"] == "M"} == {"compute", "communication"}


def test_collectives_are_comm_spans_with_their_ctas(fake_cuda, monkeypatch):
    torch, clock = fake_cuda

    class C:
        def last_ctas(self):
            return 24

    class FakeComm(maco.Communicator):
        def __init__(self):  # no library communicator: only what the profiler reads
            self._c = C()

        device = 0
        size = 4

    monkeypatch.setattr(maco.Communicator, "allreduce",
                        lambda self, x, out=None, **kw: x)
    comm = FakeComm()
    with maco.profiler() as p:
        comm.allreduce("x")
        with persistent._op_scope("gemm_allreduce"):
            comm.allreduce("x", stream=FakeStream("s"))  # not a torch stream: not timed
            comm.allreduce("x")
    assert [(n, k, s) for n, k, _, _, s in p.spans()] == [
        ("allreduce", "comm", 24), ("gemm_allreduce.allreduce", "comm", 24)]
    assert maco.Communicator.allreduce.__name__ == "<lambda>"  # unwrapped after the block
