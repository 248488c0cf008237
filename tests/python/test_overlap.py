"""CPU tests of the overlap API (issue 39): configuration and its mapping onto MACO's C side,
SM roles and the split, auto_config with a supplied measurement, per-call options, and, with
2 ranks on torch.distributed's Gloo backend: the overlap scopes (waits at first use),
overlap regions, pipelines, rings, CommScheduler, maco.Module / TPLinear, and the
torch.compile pass that fuses matmul + all_reduce (checked on traced graphs and numerically
against the unfused model through the operator's CPU fallback)."""

import os

import pytest

import maco
from conftest import NO_TORCH
from fakes import FakeCudaArray
from test_multiprocess import _run

try:
    import torch
except ImportError:  # pragma: no cover
    torch = None

needs_torch = pytest.mark.skipif(torch is None, reason=NO_TORCH)


@pytest.fixture
def fresh_config():
    maco.config.reset()
    yield maco.config
    maco.config.reset()


# ------------------------------------------------------------------ configuration


def test_config_stays_callable_and_gains_set_get(fresh_config, monkeypatch):
    table = maco.config()
    assert {r[0] for r in table} >= {"MACO_SCRATCH_SIZE", "MACO_COLL_MAX_CTAS"}
    assert maco.config.get("overlap_strategy") == "aggressive"
    monkeypatch.delenv("MACO_SCRATCH_SIZE", raising=False)
    monkeypatch.delenv("MACO_LOG_LEVEL", raising=False)
    maco.config.set(sm_policy="dynamic", overlap_strategy="conservative",
                    comm_buffer_size="256MB", profile=True, debug=True, backend="nvshmem")
    got = maco.config.get()
    assert (got["sm_policy"], got["overlap_strategy"], got["comm_buffer_size"], got["profile"],
            got["debug"]) == ("dynamic", "conservative", 256 << 20, True, True)
    # The C library reads these at communicator creation / first log line.
    assert os.environ["MACO_SCRATCH_SIZE"] == str(256 << 20)
    assert os.environ["MACO_LOG_LEVEL"] == "debug"
    maco.config.set(comm_buffer_size=3 << 20)
    assert os.environ["MACO_SCRATCH_SIZE"] == str(3 << 20)
    maco.config.reset()
    assert maco.config.get("sm_policy") == "auto"


@pytest.mark.parametrize("kw, match", [
    (dict(sm_policy="greedy"), r"sm_policy: 'greedy'; accepts auto, manual, dynamic"),
    (dict(overlap_strategy="max"), r"overlap_strategy: 'max'"),
    (dict(comm_buffer_size="12 parsecs"), r"comm_buffer_size: '12 parsecs' is not a size"),
    (dict(comm_buffer_size=1024), r"outside MACO_SCRATCH_SIZE's range"),
    (dict(comm_buffer_size="32G"), r"outside MACO_SCRATCH_SIZE's range"),
    (dict(backend="nccl"), r"backend: 'nccl'; MACO has one backend"),
    (dict(use_pinned_memory=False), r"use_pinned_memory: only True"),
    (dict(profile="yes"), r"profile: 'yes' is not a bool"),
    (dict(fusion="nvlink"), r"fusion: 'nvlink'; accepts persistent, copy_engine"),
    (dict(fused_comm="nvlink"), r"fused_comm: 'nvlink'; accepts auto, sm, copy_engine"),
])
def test_config_rejects_bad_values(fresh_config, kw, match):
    before = maco.config.get()
    with pytest.raises(ValueError, match=match):
        maco.config.set(**{"debug": True, **kw})  # nothing is applied on an error
    assert maco.config.get() == before


def test_config_unknown_names(fresh_config):
    with pytest.raises(TypeError, match="unknown setting 'overlap'; known: backend"):
        maco.config.set(overlap="none")
    with pytest.raises(TypeError, match="unknown setting 'x'"):
        maco.config.get("x")


# ------------------------------------------------------------------ SM roles and the split


def test_sm_config_design_example(fresh_config):
    sm = maco.SMConfig(total_sms=132)
    sm.assign_role(sm_range=(0, 96), role=maco.Role.COMPUTE, task_types=["matmul", "attention"])
    sm.assign_role(sm_range=(96, 120), role=maco.Role.LOCAL_SCHEDULER)
    sm.assign_role(sm_range=(120, 132), role="remote_scheduler")
    assert (sm.sms(maco.Role.COMPUTE), sm.sms("local_scheduler"),
            sm.sms(maco.Role.REMOTE_SCHEDULER), sm.unassigned) == (96, 24, 12, 0)
    assert sm.persistent_config() == {"num_workers": 96, "num_schedulers": 24,
                                      "num_comm_workers": 12}
    assert sm.task_types(maco.Role.COMPUTE) == {"matmul", "attention"}
    assert maco.get_config() is None
    split = sm.apply()
    assert maco.get_config() == split and (split.compute_sms, split.comm_sms,
                                           split.scheduler_sms) == (96, 12, 24)
    assert maco.config.get("comm_sms") == 12


def test_sm_config_errors():
    sm = maco.SMConfig(total_sms=132)
    sm.assign_role((10, 20), maco.Role.COMPUTE)
    with pytest.raises(ValueError, match=r"\(15, 30\) overlaps \(10, 20\), already assigned "
                                         r"to COMPUTE"):
        sm.assign_role((15, 30), maco.Role.REMOTE_SCHEDULER)
    with pytest.raises(ValueError, match=r"\(5, 11\) overlaps \(10, 20\)"):
        sm.assign_role(range(5, 11), maco.Role.LOCAL_SCHEDULER)
    for bad in ((120, 140), (-1, 4), (30, 30), (40, 35)):
        with pytest.raises(ValueError, match=r"is not inside \[0, 132\)"):
            sm.assign_role(bad, maco.Role.COMPUTE)
    with pytest.raises(TypeError, match="not a .start, end. pair"):
        sm.assign_role(5, maco.Role.COMPUTE)
    with pytest.raises(TypeError, match="must be ints"):
        sm.assign_role((0.5, 4), maco.Role.COMPUTE)
    with pytest.raises(TypeError, match="is not a maco.Role"):
        sm.assign_role((30, 40), "gpu")
    with pytest.raises(ValueError, match="'allreduce' does not run on COMPUTE SMs"):
        sm.assign_role((30, 40), maco.Role.COMPUTE, task_types=["allreduce"])
    with pytest.raises(ValueError, match="'matmul' does not run on LOCAL_SCHEDULER SMs "
                                         r"\(schedulers run no tasks\)"):
        sm.assign_role((30, 40), maco.Role.LOCAL_SCHEDULER, task_types=["matmul"])
    with pytest.raises(ValueError, match="'convolution' is not a task type"):
        sm.assign_role((30, 40), maco.Role.COMPUTE, task_types=["convolution"])
    assert sm.roles() == [(10, 20, maco.Role.COMPUTE, ())]  # failed calls added nothing
    sm.assign_role((20, 40), maco.Role.LOCAL_SCHEDULER)
    with pytest.raises(ValueError, match="20 LOCAL_SCHEDULER SMs exceed the 10 COMPUTE SMs"):
        sm.split()
    only = maco.SMConfig(total_sms=8).assign_role((0, 2), maco.Role.REMOTE_SCHEDULER)
    with pytest.raises(ValueError, match="no COMPUTE SMs"):
        only.persistent_config()
    for bad in (0, -3, 2.5, True):
        with pytest.raises(ValueError, match="total_sms"):
            maco.SMConfig(total_sms=bad)


def test_set_config_and_policies(fresh_config):
    with pytest.raises(ValueError, match="comm_sms: 0 is not a positive number of SMs"):
        maco.set_config(compute_sms=100, comm_sms=0)
    with pytest.raises(ValueError, match="= 140 exceed total_sms=132"):
        maco.set_config(compute_sms=120, comm_sms=20, total_sms=132)
    s = maco.set_config(compute_sms=120, comm_sms=12)
    assert maco.get_config() is s and s.persistent_config() == {
        "num_workers": 120, "num_schedulers": 0, "num_comm_workers": 12}
    # manual: the split is fixed while an overlap scope runs
    maco.config.set(sm_policy="manual")
    with maco.optimize_context():
        with pytest.raises(maco.InvalidUsageError, match="sm_policy='manual' fixes the split"):
            maco.set_config(compute_sms=80, comm_sms=52)
    assert maco.get_config().comm_sms == 12
    # dynamic (and @maco.dynamic_sm_config): changes allowed, restored after the call

    @maco.dynamic_sm_config
    def step(prefill):
        maco.set_config(compute_sms=120 if prefill else 80, comm_sms=12 if prefill else 52)
        return maco.config.get("comm_sms"), maco.config.get("sm_policy")

    with maco.optimize_context():
        assert step(False) == (52, "dynamic")
    assert maco.get_config().comm_sms == 12 and maco.config.get("sm_policy") == "manual"
    # manual/dynamic without a split: a collective says what is missing
    from maco import _config

    _config.clear_config()
    with pytest.raises(maco.InvalidUsageError, match="no split set"):
        _config.required_split()


def test_auto_config_measures(fresh_config):
    if torch is not None and torch.cuda.is_available():
        pytest.skip("checks the CPU answer; this machine has a GPU")
    with pytest.raises(RuntimeError, match=r"measures on the GPU .* pass measure=fn"):
        maco.auto_config(compute_intensity="high", comm_intensity="medium")
    calls = []

    def measure(comm_sms):  # a model: compute slows with fewer SMs, comm with fewer CTAs
        calls.append(comm_sms)
        return max(100.0 / (132 - comm_sms), 1.0 / comm_sms * 40)

    best = min(range(1, 132), key=lambda c: (measure(c), c))
    calls.clear()
    s = maco.auto_config("high", "medium", measure=measure, total_sms=132,
                         candidates=list(range(1, 132)))
    assert calls == list(range(1, 132))
    assert (s.comm_sms, s.compute_sms, s.source) == (best, 132 - best, "auto_config")
    assert s.times[best] == min(s.times.values())
    assert maco.get_config() == s  # sm_policy 'auto' uses the measurement
    maco.config.set(sm_policy="dynamic")
    assert maco.get_config() is None
    # ties go to fewer communication SMs
    t = maco.auto_config(measure=lambda c: 1.0, total_sms=64, apply=False)
    assert t.comm_sms == 8
    with pytest.raises(ValueError, match="measure: returned -1.0 for comm_sms=8"):
        maco.auto_config(measure=lambda c: -1.0, total_sms=64)
    with pytest.raises(ValueError, match="total_sms: required with measure="):
        maco.auto_config(measure=lambda c: 1.0)
    with pytest.raises(ValueError, match=r"candidates: 64 is not a comm_sms in \[1, 64\)"):
        maco.auto_config(measure=lambda c: 1.0, total_sms=64, candidates=[8, 64])
    with pytest.raises(ValueError, match="compute_intensity: 'extreme'"):
        maco.auto_config("extreme", measure=lambda c: 1.0, total_sms=64)
    with pytest.raises(ValueError, match="gpu_arch: 'volta'"):
        maco.auto_config(gpu_arch="volta", measure=lambda c: 1.0, total_sms=64)


# ------------------------------------------------------------------ per-call options


class _RecordingComm:
    """Stands in for the default communicator: records the algorithm forced at each call."""

    def __init__(self):
        self.forced = {"allreduce": None}
        self.calls = []
        self.closed = False
        self.device = None

    def forced_algorithm(self, kind):
        return self.forced.get(kind)

    def set_algorithm(self, kind, name):
        self.forced[kind] = name or None

    def allreduce(self, x, out=None, *, op=None, stream=None):
        self.calls.append(("allreduce", self.forced["allreduce"], op, stream))
        return x if out is None else out


def test_allreduce_options_map_to_algorithms(monkeypatch, fresh_config):
    from maco import _default_comm

    c = _RecordingComm()
    monkeypatch.setattr(_default_comm._default, "comm", c)
    x = FakeCudaArray((8,))
    assert maco.allreduce(x, use_ring=True) is x
    assert maco.allreduce(x, algorithm="oneshot_ll", op=maco.MAX) is x
    assert maco.allreduce(x, use_ring=False) is x
    c.forced["allreduce"] = "twoshot_ll"  # forced before (set_algorithm / MACO_ALGO_ALLREDUCE)
    maco.allreduce(x, use_ring=True)
    assert c.calls == [("allreduce", "rsag", maco.SUM, None),
                       ("allreduce", "oneshot_ll", maco.MAX, None),
                       ("allreduce", None, maco.SUM, None),
                       ("allreduce", "rsag", maco.SUM, None)]
    assert c.forced["allreduce"] == "twoshot_ll"  # restored after the call
    with pytest.raises(ValueError, match="use_ring=True and algorithm='oneshot_ll' disagree"):
        maco.allreduce(x, use_ring=True, algorithm="oneshot_ll")
    with pytest.raises(ValueError, match="priority: 'urgent'"):
        maco.allreduce(x, priority="urgent")
    with pytest.raises(ValueError, match="overlap_group: ''"):
        maco.allreduce(x, overlap_group="")
    with pytest.raises(ValueError, match="use_ring: 'yes'"):
        maco.allreduce(x, use_ring="yes")
    assert len(c.calls) == 4  # bad options are refused before any call


class _CapComm:
    """What the split's CTA cap reads and sets of a communicator; records every cap set."""

    def __init__(self, cap):
        self.max_ctas, self.caps, self.device, self.closed = cap, [], 0, False

    def set_max_ctas(self, n):
        self.max_ctas = n
        self.caps.append(n)


def test_scope_is_the_entry_point_with_the_split_for_its_block(fresh_config):
    """optimize_context's own options: a bad priority or count is refused at the call; the
    block's comm_sms/compute_sms are the split in use inside it (the rest of the split kept),
    a communicator's cap follows at its next collective and comes back at the end; a block's
    split is not refused under sm_policy 'manual' (set_config is); the decorator form runs
    each call in a fresh scope with the same options."""
    from maco import _overlap, _streams

    with pytest.raises(ValueError, match="priority: 'urgent'"):
        maco.optimize_context(priority="urgent")
    with pytest.raises(ValueError, match="comm_sms: 0 is not a positive number of SMs"):
        maco.optimize_context(comm_sms=0)
    with pytest.raises(ValueError, match="compute_sms: True"):
        maco.optimize_context(compute_sms=True)
    maco.set_config(compute_sms=100, comm_sms=20, scheduler_sms=4)
    c = _CapComm(cap=20)
    with maco.optimize_context(comm_sms=8) as sc:
        s = maco.get_config()
        assert (s.compute_sms, s.comm_sms, s.scheduler_sms) == (100, 8, 4)
        _streams.apply_split(c)  # what a collective of the overlap API does first
        _streams.apply_split(c)  # once per change
        assert c.caps == [8] and sc.compute(lambda a: a + 1, 1) == 2  # no compute_sms: plain
    assert c.caps == [8, 20] and maco.get_config().comm_sms == 20
    with maco.optimize_context(compute_sms=64):
        assert (maco.get_config().compute_sms, maco.get_config().comm_sms) == (64, 20)
        _streams.apply_split(c)
    assert c.caps == [8, 20] and maco.get_config().compute_sms == 100
    maco.config.set(sm_policy="manual")
    with maco.optimize_context():
        with maco.optimize_context(comm_sms=4):
            assert maco.get_config().comm_sms == 4
        with pytest.raises(maco.InvalidUsageError, match="sm_policy='manual' fixes the split"):
            maco.set_config(comm_sms=5)
    assert maco.get_config().comm_sms == 20
    outer = []

    @maco.optimize_context(redirect=False, priority="low")
    def f(x):
        sc = _overlap._current_scope()
        outer.append(sc)
        return (sc.redirect, sc.priority, x)

    assert f(3) == (False, "low", 3) and f(4) == (False, "low", 4)
    assert outer[0] is not outer[1] and f.__maco_optimized__ and f.__name__ == "f"
    assert _overlap._current_scope() is None
    with pytest.raises(TypeError, match="optimize_context: 3 is not callable"):
        maco.optimize_context()(3)
    with pytest.raises(TypeError, match="optimize_comm: 3 is not callable"):
        maco.optimize_comm(3)
    assert maco.auto_overlap().redirect is False and maco.optimize_context().redirect is True
    with pytest.raises(maco.InvalidUsageError, match="submit inside the with block"):
        maco.optimize_context().submit_compute(lambda: 1)


@needs_torch
def test_pipeline_and_region_arguments():
    p = maco.Pipeline(num_stages=2)
    with pytest.raises(ValueError, match=r"index 2 is not in \[0, 2\)"):
        p.stage(2)
    p.stage(0)(lambda x: x)
    with pytest.raises(ValueError, match="index 0 already has"):
        p.stage(0)
    with pytest.raises(ValueError, match=r"no function for stage\(s\) \[1\]"):
        p(torch.ones(4))
    p.stage(1)(lambda x: x + 1)
    with pytest.raises(ValueError, match="chunks: 5 exceeds x's dimension 0 .4."):
        p(torch.ones(4), chunks=5)
    with pytest.raises(ValueError, match="num_stages"):
        maco.Pipeline(0)
    with pytest.raises(ValueError, match="direction: 'up'"):
        maco.ring(direction="up")
    r = maco.overlap_region()
    with pytest.raises(maco.InvalidUsageError, match="inside the with block"):
        r.submit_compute(lambda: 1)
    s = maco.CommScheduler(num_sms=8)
    a = s.phase("a", depends_on="c")
    s.phase("b", depends_on=a)
    s.phase("c", depends_on="b")
    with pytest.raises(ValueError, match=r"phases \['a', 'b', 'c'\] depend on each other"):
        s.compile()
    s2 = maco.CommScheduler()
    s2.phase("x", depends_on="nope")
    with pytest.raises(ValueError, match="depends on 'nope', which is not a phase"):
        s2.compile()
    with pytest.raises(ValueError, match="num_sms"):
        maco.CommScheduler(num_sms=0)


@needs_torch
def test_pipeline_order_and_result_on_cpu():
    """Wavefront order (stage i of micro-batch j after stage i - 1 of j and stage i of
    j - 1) and the same result as running the stages one after another."""
    g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
    w1, w2 = torch.randn(16, 16, generator=g), torch.randn(16, 16, generator=g)
    x = torch.randn(12, 16, generator=g)
    seen = []
    p = maco.Pipeline(num_stages=3, chunks=4)

    @p.stage(0)
    def s0(t):
        seen.append((0, t.shape[0]))
        return t @ w1

    @p.stage(1)
    def s1(t):
        seen.append((1, t.shape[0]))
        return torch.relu(t)

    @p.stage(2)
    def s2(t):
        seen.append((2, t.shape[0]))
        return t @ w2

    out = p(x)
    ref = torch.relu(x @ w1) @ w2
    torch.testing.assert_close(out, ref)
    assert p.trace == [(0, 0), (0, 1), (1, 0), (0, 2), (1, 1), (2, 0), (0, 3), (1, 2), (2, 1),
                       (1, 3), (2, 2), (2, 3)]
    for i, j in p.trace:  # dependencies hold in the issue order
        pos = p.trace.index((i, j))
        assert i == 0 or p.trace.index((i - 1, j)) < pos
        assert j == 0 or p.trace.index((i, j - 1)) < pos
    # several inputs split alike; tuples pass from stage to stage
    r = torch.randn(12, 16, generator=g)
    q = maco.Pipeline(num_stages=2, chunks=3)
    q.stage(0)(lambda a, b: (a @ w1, b))
    q.stage(1)(lambda y, b: y + b)
    torch.testing.assert_close(q(x, r), x @ w1 + r)
    with pytest.raises(ValueError, match="argument 1 has 5 rows along dimension 0"):
        q(x, r[:5])
    # a stage that raises stops the call: later stages and micro-batches do not run
    seen.clear()
    bad = maco.Pipeline(num_stages=3, chunks=4)
    bad.stage(0)(lambda t: seen.append(0) or t)
    bad.stage(1)(lambda t: 1 / 0)
    bad.stage(2)(lambda t: seen.append(2) or t)
    with pytest.raises(ZeroDivisionError):
        bad(x)
    assert seen == [0, 0] and bad.trace == [(0, 0), (0, 1), (1, 0)]


# ------------------------------------------------------------------ 2 ranks on Gloo


def _init(rank, n, port):
    import torch.distributed as dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=n)
    return dist


def _seeded(seed, rank, salt):
    import torch

    return torch.Generator().manual_seed(seed * 1000003 + rank * 7919 + salt)


def _scope_worker(rank, n, port, seed):
    """Overlap scopes with CPU tensors: collectives issued asynchronously, waited at first
    use (or a write to an input, or the scope's end); results against sums recomputed from
    every rank's inputs."""
    import torch

    dist = _init(rank, n, port)
    import maco
    from maco import _overlap

    def data(r, salt, shape=(6, 8)):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    out = {}
    x = data(rank, 1)
    ref = sum(data(r, 1) for r in range(n))
    with maco.optimize_context():
        sc = _overlap._current_scope()
        y = x.clone()
        dist.all_reduce(y)  # returns at once
        out["pending_after_issue"] = len(sc.pending)
        z = x * 3  # unrelated compute overlaps it
        out["pending_after_unrelated"] = len(sc.pending)
        v = y.view(-1)[:4] + 0  # a view of the result: first use
        out["pending_after_use"] = len(sc.pending)
        out["ar_ok"] = torch.allclose(y, ref, atol=1e-5) and torch.allclose(v, ref.view(-1)[:4])
        out["z_ok"] = torch.equal(z, x * 3)
        # all_gather_into_tensor: a write to its input waits for it first
        g = torch.full((n * 6, 8), float("nan"))
        inp = data(rank, 2)
        keep = inp.clone()
        dist.all_gather_into_tensor(g, inp)
        inp.add_(100.0)
        out["pending_after_write"] = len(sc.pending)
        out["ag_ok"] = torch.equal(g, torch.cat([data(r, 2) for r in range(n)])) and \
            torch.equal(inp, keep + 100.0)
        # maco.allreduce on CPU tensors: the same, through torch.distributed
        m = data(rank, 3)
        r = maco.allreduce(m, op=maco.AVG)
        out["maco_pending"] = len(sc.pending)
        out["maco_ok"] = torch.allclose(r * 1, sum(data(q, 3) for q in range(n)) / n, atol=1e-6)
        last = data(rank, 4)
        dist.all_reduce(last)  # never used inside: waited at the end
    out["end_ok"] = torch.allclose(last, sum(data(q, 4) for q in range(n)), atol=1e-5)
    out["wrappers_removed"] = not getattr(dist.all_reduce, "__maco_scope__", False)
    # conservative: overlaps one operation, then waited; none: no overlap at all
    for strategy in ("conservative", "none"):
        maco.config.set(overlap_strategy=strategy)
        with maco.auto_overlap():
            sc = _overlap._current_scope()
            y = data(rank, 5)
            dist.all_reduce(y)
            a = len(sc.pending)
            _ = x + 1
            out[strategy] = (a, len(sc.pending),
                             torch.allclose(y, sum(data(q, 5) for q in range(n)), atol=1e-5))
    maco.config.set(overlap_strategy="aggressive")
    # @maco.optimize_comm and @maco.optimize (class), nested: the inner hands its pending
    # collective to the outer scope

    @maco.optimize_comm
    def inner(t):
        dist.all_reduce(t)
        return t

    with maco.optimize_context():
        sc = _overlap._current_scope()
        t = data(rank, 6)
        inner(t)
        out["handed_over"] = len(sc.pending)
        out["inner_ok"] = torch.allclose(t + 0, sum(data(q, 6) for q in range(n)), atol=1e-5)

    @maco.optimize
    class Layer(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8, bias=False)
            with torch.no_grad():
                self.lin.weight.copy_(torch.randn(8, 8, generator=_seeded(seed, rank, 7)))

        def forward(self, t):
            y = self.lin(t)
            dist.all_reduce(y)
            return torch.relu(y)

    t = data(rank, 8)
    with torch.no_grad():
        got = Layer()(t)
        want = torch.relu(sum(data(q, 8) @ torch.randn(8, 8, generator=_seeded(seed, q, 7)).T
                              for q in range(n)))
    out["optimize_class_ok"] = torch.allclose(got, want, atol=1e-4)
    # async_op=True is the caller's: a work is returned and nothing is tracked
    with maco.optimize_context():
        sc = _overlap._current_scope()
        y = data(rank, 9)
        w = dist.all_reduce(y, async_op=True)
        out["user_async"] = (w is not None, len(sc.pending))
        w.wait()
    # overlap groups: one wait waits for the whole group
    a, b = data(rank, 10), data(rank, 11)
    wa = maco.allreduce(a, async_op=True, overlap_group="qkv")
    wb = maco.allreduce(b, async_op=True, overlap_group="qkv")
    wa.wait()
    out["group_waited"] = wb._h.done and torch.allclose(b, sum(data(q, 11) for q in range(n)),
                                                        atol=1e-5)
    # overlap_with_next outside a scope: a tensor that waits at first use
    c = data(rank, 12)
    rc = maco.allreduce(c, overlap_with_next=True)
    out["async_tensor"] = type(rc).__name__
    s = rc.sum()
    out["async_tensor_ok"] = rc._maco_handle.done and type(s) is torch.Tensor and \
        torch.allclose(s, sum(data(q, 12) for q in range(n)).sum(), atol=1e-4)
    dist.destroy_process_group()
    return out


@needs_torch
def test_scopes_wait_at_first_use_on_gloo(port):
    for out in _run(_scope_worker, 2, port, int.from_bytes(os.urandom(4), "little")):
        assert (out["pending_after_issue"], out["pending_after_unrelated"],
                out["pending_after_use"]) == (1, 1, 0), out
        assert out["ar_ok"] and out["z_ok"] and out["end_ok"], out
        assert out["pending_after_write"] == 0 and out["ag_ok"], out
        assert out["maco_pending"] == 1 and out["maco_ok"], out
        assert out["wrappers_removed"], out
        assert out["conservative"] == (1, 0, True), out
        assert out["none"] == (0, 0, True), out
        assert out["handed_over"] == 1 and out["inner_ok"], out
        assert out["optimize_class_ok"], out
        assert out["user_async"] == (True, 0), out
        assert out["group_waited"], out
        assert out["async_tensor"] == "AsyncCollectiveResult" and out["async_tensor_ok"], out


def _patterns_worker(rank, n, port, seed):
    """overlap_region, Pipeline with a collective stage, maco.ring, CommScheduler with 2
    ranks on Gloo."""
    import threading

    import torch

    dist = _init(rank, n, port)
    import maco

    def data(r, salt, shape=(4, 8)):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    out = {}
    # overlap_region: the communication runs on the region's thread while compute runs here
    started = threading.Event()
    release = threading.Event()
    prev_y = data(rank, 1)

    def comm_fn(t):
        started.set()
        release.wait(30)
        return maco.allreduce(t)

    x, w = data(rank, 2), data(rank, 3, (8, 8))
    with maco.overlap_region() as region:
        mf = region.submit_comm(comm_fn, prev_y)
        started.wait(30)
        cf = region.submit_compute(torch.matmul, x, w)
        out["compute_done_while_comm_blocked"] = cf.done() and not mf.done()
        release.set()
        dep = region.submit_compute(torch.add, mf, 1.0)  # a Future argument: its value
    out["region_ok"] = torch.allclose(cf.result(), x @ w) and torch.allclose(
        mf.result(), sum(data(q, 1) for q in range(n)), atol=1e-5) and torch.allclose(
        dep.result(), mf.result() + 1.0)
    # the same through the entry point: the scope's submissions
    with maco.optimize_context() as sc:
        sf = sc.submit_comm(maco.allreduce, data(rank, 12))
        sg = sc.submit_compute(torch.add, sf, 1.0)  # a Future argument: its value
    out["scope_submit_ok"] = torch.allclose(sg.result(), sum(data(q, 12) for q in range(n))
                                            + 1.0, atol=1e-5)
    # Pipeline: the allreduce stage of a row-parallel layer over 3 micro-batches
    wl = data(rank, 4, (8, 8))
    pipe = maco.Pipeline(num_stages=3, chunks=3)
    pipe.stage(0)(lambda t: t @ wl)
    pipe.stage(1)(lambda t: maco.allreduce(t))
    pipe.stage(2)(torch.relu)
    xs = data(rank, 5, (9, 8))
    got = pipe(xs)
    want = torch.relu(sum(data(q, 5, (9, 8)) @ data(q, 4, (8, 8)) for q in range(n)))
    out["pipeline_ok"] = torch.allclose(got, want, atol=1e-4)
    # ring: every rank sends to the next and receives from the previous
    act = data(rank, 6, (3, 5))
    with maco.ring(direction="forward") as ring:
        maco.send(act, dst=(rank + 1) % n)
        got = maco.recv(src=(rank - 1) % n)
        try:
            maco.send(act, dst=rank)
            out["ring_check"] = "no error"
        except ValueError as e:
            out["ring_check"] = str(e)
    out["ring_ok"] = (ring.next, ring.prev) == ((rank + 1) % n, (rank - 1) % n) and \
        torch.equal(got, data((rank - 1) % n, 6, (3, 5)))
    with maco.ring(direction="backward"):
        maco.send(act)
        back = maco.recv()
    out["ring_back_ok"] = torch.equal(back, data((rank + 1) % n, 6, (3, 5)))
    # CommScheduler: q, k, v packed into one allreduce; the output phase after it
    q, k, v = data(rank, 7), data(rank, 8, (2, 3)), data(rank, 9, (5,))
    o = data(rank, 10)
    ag_out = torch.full((n * 4, 8), float("nan"))
    sched = maco.CommScheduler(num_sms=32)
    p1 = sched.phase("allreduce_qkv")
    p1.allreduce(q)
    p1.allreduce(k)
    p1.allreduce(v)
    p2 = sched.phase("allreduce_output", depends_on=p1)
    p2.allreduce(o, op=maco.MAX)
    p2.allgather(data(rank, 11), ag_out)
    sched.compile()
    from maco._schedule import _plan_phase

    out["sched_plan"] = [g[0] for g in _plan_phase(p1)] + [g[0] for g in _plan_phase(p2)]
    works = sched()
    out["sched_order"] = sched.order
    works["allreduce_output"].wait()
    out["sched_ok"] = all(torch.allclose(t, sum(data(r, s, t.shape) for r in range(n)),
                                         atol=1e-5) for t, s in ((q, 7), (k, 8), (v, 9))) and \
        torch.equal(o, torch.stack([data(r, 10) for r in range(n)]).amax(0)) and \
        torch.equal(ag_out, torch.cat([data(r, 11) for r in range(n)]))
    dist.destroy_process_group()
    return out


@needs_torch
def test_region_pipeline_ring_scheduler_on_gloo(port):
    for rank, out in enumerate(_run(_patterns_worker, 2, port,
                                    int.from_bytes(os.urandom(4), "little"))):
        assert out["compute_done_while_comm_blocked"] and out["region_ok"], out
        assert out["scope_submit_ok"], out
        assert out["pipeline_ok"], out
        assert out["ring_ok"] and out["ring_back_ok"], out
        assert out["ring_check"] == (f"dst: {rank} is not the next rank {(rank + 1) % 2} of "
                                     f"this forward ring (rank {rank} of 2)"), out
        assert out["sched_plan"] == ["flat", "one", "one"], out
        assert out["sched_order"] == ["allreduce_qkv", "allreduce_output"], out
        assert out["sched_ok"], out


class _SpyPass:
    """Records (fused count, graph text) of every run of maco._compile's FX pass inside."""

    def __init__(self, mc):
        self.mc, self.graphs, self.real = mc, [], mc.fuse_matmul_allreduce

    def __enter__(self):
        def spy(g):
            k = self.real(g)
            self.graphs.append((k, str(getattr(g, "graph", g))))
            return k

        self.mc.fuse_matmul_allreduce = spy
        return self.graphs

    def __exit__(self, *exc):
        self.mc.fuse_matmul_allreduce = self.real


def _compile_worker(rank, n, port, seed, inner):
    """The "maco" torch.compile backend on a tensor-parallel block (row-parallel matmul +
    dist.all_reduce, a linear with bias + maco.allreduce): two fused calls in the graph, and
    the output equal to the sum over ranks recomputed from every rank's shards."""
    import torch

    dist = _init(rank, n, port)
    import maco
    import maco._compile as mc

    def shard(r, salt, shape):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    class Block(torch.nn.Module):
        def __init__(self, r):
            super().__init__()
            self.w = torch.nn.Parameter(shard(r, 1, (64, 32)))
            self.fc = torch.nn.Linear(64, 16)
            with torch.no_grad():
                self.fc.weight.copy_(shard(r, 2, (16, 64)))
                self.fc.bias.copy_(shard(r, 3, (16,)))

        def forward(self, x):
            y = torch.matmul(x, self.w.T)
            dist.all_reduce(y)
            z = self.fc(torch.relu(y) * 0.5)
            return maco.allreduce(z)

    x = shard(0, 4, (3, 5, 32))  # the same input on every rank
    # the reference: sums over every rank's shards, recomputed here
    y = sum(x @ shard(r, 1, (64, 32)).T for r in range(n))
    h = torch.relu(y) * 0.5
    ref = sum(h @ shard(r, 2, (16, 64)).T + shard(r, 3, (16,)) for r in range(n))
    m = Block(rank)
    with torch.no_grad(), _SpyPass(mc) as graphs:
        if inner == "string":
            got = torch.compile(m, backend="maco")(x)
        else:
            got = maco.compile(m, inner=inner)(x)
        got2 = maco.compile(Block(rank), inner="eager")(x + 1)  # a second graph, new sites
    y2 = sum((x + 1) @ shard(r, 1, (64, 32)).T for r in range(n))
    ref2 = sum((torch.relu(y2) * 0.5) @ shard(r, 2, (16, 64)).T + shard(r, 3, (16,))
               for r in range(n))
    out = {"fused": [k for k, _ in graphs],
           "graph_has_fused": all("maco.gemm_allreduce" in g and "_c10d_functional.all_reduce"
                                  not in g for _, g in graphs),
           "ok": torch.allclose(got, ref, rtol=1e-4, atol=1e-3),
           "ok2": torch.allclose(got2, ref2, rtol=1e-4, atol=1e-3),
           "err": float((got - ref).abs().max())}
    dist.destroy_process_group()
    return out


@needs_torch
@pytest.mark.parametrize("inner", ["eager", "string"])
def test_compile_backend_fuses_and_matches_on_gloo(port, inner):
    """inner "eager": maco.compile(model, inner="eager"); "string":
    torch.compile(model, backend="maco") (Inductor compiles the rest, on the CPU)."""
    for out in _run(_compile_worker, 2, port, int.from_bytes(os.urandom(4), "little"), inner):
        assert out["fused"] == [2, 2] and out["graph_has_fused"], out
        assert out["ok"] and out["ok2"], out


@needs_torch
def test_fx_pass_on_traced_graphs():
    """The pass on graphs built by hand (torch.fx), without running them: what is fused and
    what is left alone."""
    import torch.distributed as dist
    import torch.fx as fx

    from maco._compile import fuse_matmul_allreduce

    c10d = torch.ops._c10d_functional
    aten = torch.ops.aten

    def aten_graph(extra_user=False, op="sum", addmm=False):
        g = fx.Graph()
        a, b, bias = g.placeholder("a"), g.placeholder("b"), g.placeholder("bias")
        mm = (g.call_function(aten.addmm.default, (bias, a, b)) if addmm else
              g.call_function(aten.mm.default, (a, b)))
        v = g.call_function(aten._unsafe_view.default, (mm, [2, 4, 16]))
        ar = g.call_function(c10d.all_reduce.default, (v, op, "0"))
        w = g.call_function(c10d.wait_tensor.default, (ar,))
        cp = g.call_function(aten.copy.default, (v, w))
        r = g.call_function(aten.relu.default, (cp,))
        g.output((r, mm) if extra_user else r)
        return g

    g = aten_graph()
    assert fuse_matmul_allreduce(g) == 1
    targets = [str(n.target) for n in g.nodes if n.op == "call_function"]
    assert targets == ["maco.gemm_allreduce.default", "aten._unsafe_view.default",
                       "aten.relu.default"], targets
    fused = next(n for n in g.nodes if "gemm_allreduce" in str(n.target))
    assert [getattr(a, "name", a) for a in fused.args[:4]] == ["a", "b", None, "0"]
    g = aten_graph(addmm=True)
    assert fuse_matmul_allreduce(g) == 1
    fused = next(n for n in g.nodes if "gemm_allreduce" in str(n.target))
    assert fused.args[2].name == "bias"
    # left alone: the partial product is read elsewhere; a max all_reduce
    for g in (aten_graph(extra_user=True), aten_graph(op="max")):
        before = [n.target for n in g.nodes]
        assert fuse_matmul_allreduce(g) == 0
        assert [n.target for n in g.nodes] == before
    # torch-level, in place: torch.distributed.all_reduce(y) then uses of y
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(torch.matmul, (x, w))
    g.call_function(dist.all_reduce, (y,))
    g.output(g.call_function(torch.relu, (y,)))
    assert fuse_matmul_allreduce(g) == 1
    assert [n.target.__name__ for n in g.nodes if n.op == "call_function"] == [
        "_fused_matmul_allreduce", "relu"]
    # ... but not when y is read before the all_reduce
    g = fx.Graph()
    x, w = g.placeholder("x"), g.placeholder("w")
    y = g.call_function(torch.matmul, (x, w))
    early = g.call_function(torch.relu, (y,))
    g.call_function(dist.all_reduce, (y,))
    g.output((early, y))
    assert fuse_matmul_allreduce(g) == 0


def _sp_worker(rank, n, port, seed, inner):
    """A sequence-parallel block (all_gather + column-parallel matmul, row-parallel matmul +
    reduce_scatter, as Inductor's async TP pass sees it) through maco.compile: both pairs
    become MACO's fused ops and the output equals the reference recomputed from every rank's
    shards."""
    import torch
    import torch.distributed._functional_collectives as fc

    dist = _init(rank, n, port)
    import maco
    import maco._compile as mc
    import maco._fused_ops as fo

    def t(r, salt, shape):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    rows = 3  # rows of the token dimension per rank
    w1 = [t(r, 1, (48, 16)) for r in range(n)]  # column-parallel: (out shard, hidden)
    w2 = [t(r, 2, (16, 48)) for r in range(n)]  # row-parallel: (hidden, in shard)
    x = [t(r, 3, (rows, 16)) for r in range(n)]  # each rank's row shard

    def block(xs):
        xf = fc.all_gather_tensor(xs, 0, dist.group.WORLD)
        h = torch.relu(torch.matmul(xf, w1[rank].T))
        y = fc.reduce_scatter_tensor(torch.matmul(h, w2[rank].T), "sum", 0, dist.group.WORLD)
        return xs + y

    xf = torch.cat(x)
    full = sum(torch.relu(xf @ w1[r].T) @ w2[r].T for r in range(n))
    ref = x[rank] + full[rank * rows:(rank + 1) * rows]
    before = dict(fo.stats)
    with torch.no_grad(), _SpyPass(mc) as graphs:
        got = maco.compile(block, inner=inner)(x[rank])
    out = {"fused": [k for k, _ in graphs],
           "clean": all("maco.allgather_gemm" in g and "maco.gemm_reduce_scatter" in g
                        and "all_gather_into_tensor" not in g and "reduce_scatter_tensor" not in g
                        for _, g in graphs),
           "calls": fo.stats["sp_fallback"] - before["sp_fallback"],
           "ok": torch.allclose(got, ref, rtol=1e-4, atol=1e-4),
           "err": float((got - ref).abs().max())}
    dist.destroy_process_group()
    return out


@needs_torch
@pytest.mark.parametrize("inner", ["eager", "inductor"])
def test_compile_fuses_sequence_parallel_pairs_on_gloo(port, inner):
    for out in _run(_sp_worker, 2, port, int.from_bytes(os.urandom(4), "little"), inner):
        assert out["fused"] == [2] and out["clean"], out
        assert out["calls"] == 2 and out["ok"], out


@needs_torch
def test_fx_pass_sequence_parallel_patterns():
    """all_gather -> wait -> mm and mm -> reduce_scatter -> wait on hand-built aten graphs:
    what is fused and what is left alone."""
    import torch.fx as fx

    from maco._compile import fuse_matmul_allreduce

    c10d = torch.ops._c10d_functional
    aten = torch.ops.aten

    def ag_graph(second_reader=False):
        g = fx.Graph()
        x, b = g.placeholder("x"), g.placeholder("b")
        ag = g.call_function(c10d.all_gather_into_tensor.default, (x, 4, "7"))
        w = g.call_function(c10d.wait_tensor.default, (ag,))
        mm = g.call_function(aten.mm.default, (w, b))
        outs = [g.call_function(aten.relu.default, (mm,))]
        if second_reader:
            outs.append(g.call_function(aten.neg.default, (w,)))
        g.output(tuple(outs))
        return g

    def rs_graph(op="sum", addmm=False, extra_user=False):
        g = fx.Graph()
        a, b, bias = g.placeholder("a"), g.placeholder("b"), g.placeholder("bias")
        mm = (g.call_function(aten.addmm.default, (bias, a, b)) if addmm else
              g.call_function(aten.mm.default, (a, b)))
        rs = g.call_function(c10d.reduce_scatter_tensor.default, (mm, op, 4, "7"))
        w = g.call_function(c10d.wait_tensor.default, (rs,))
        r = g.call_function(aten.relu.default, (w,))
        g.output((r, mm) if extra_user else r)
        return g

    def calls(g):
        return [str(n.target) for n in g.nodes if n.op == "call_function"]

    g = ag_graph()
    assert fuse_matmul_allreduce(g) == 1
    assert calls(g) == ["maco.allgather_gemm.default", "aten.relu.default"], calls(g)
    fused = next(n for n in g.nodes if "allgather_gemm" in str(n.target))
    assert [getattr(a, "name", a) for a in fused.args[:4]] == ["x", "b", 4, "7"]
    g = rs_graph()
    assert fuse_matmul_allreduce(g) == 1
    assert calls(g) == ["maco.gemm_reduce_scatter.default", "aten.relu.default"], calls(g)
    fused = next(n for n in g.nodes if "gemm_reduce_scatter" in str(n.target))
    assert [getattr(a, "name", a) for a in fused.args[:5]] == ["a", "b", None, 4, "7"]
    g = rs_graph(addmm=True)
    assert fuse_matmul_allreduce(g) == 1
    fused = next(n for n in g.nodes if "gemm_reduce_scatter" in str(n.target))
    assert fused.args[2].name == "bias"
    # left alone: the gathered input read elsewhere, the partial product read elsewhere, a
    # max reduce_scatter
    for g in (ag_graph(second_reader=True), rs_graph(extra_user=True), rs_graph(op="max")):
        before = calls(g)
        assert fuse_matmul_allreduce(g) == 0
        assert calls(g) == before


def _module_worker(rank, n, port, seed):
    """maco.Module, TPLinear, @maco.task_graph and PersistentContext with 2 ranks on Gloo."""
    import torch

    dist = _init(rank, n, port)
    import maco

    def t(r, salt, shape):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    out = {}

    class Layer(maco.Module):
        def __init__(self, r):  # no super().__init__(), as in the design
            self.lin = maco.TPLinear(16, 8, world_size=n)
            with torch.no_grad():
                self.lin.weight.copy_(t(r, 1, (8, 16 // n)))

        def forward(self, x):
            return torch.relu(self.lin(x)) * 2

    layer = Layer(rank)
    out["registered"] = sorted(name for name, _ in layer.named_parameters())
    x = t(rank, 2, (4, 16 // n))
    ref_lin = sum(t(r, 2, (4, 16 // n)) @ t(r, 1, (8, 16 // n)).T for r in range(n))
    ref = torch.relu(ref_lin) * 2
    with torch.no_grad():
        y = layer.lin(x)  # outermost module: an AsyncCollectiveResult
        out["tplinear_type"] = type(y).__name__
        out["tplinear_ok"] = torch.allclose(y + 0, ref_lin, atol=1e-5)
        out["layer_ok"] = torch.allclose(layer(x), ref, atol=1e-5)

    class Block(maco.Module):
        def __init__(self, r):
            self.w = torch.nn.Parameter(t(r, 3, (16, 8)))
            self._maco_inner = "eager"

        @maco.task_graph
        def forward(self, x):
            y = torch.matmul(x, self.w.T)
            y = maco.allreduce(y)
            return torch.relu(y)

    b = Block(rank)
    xb = t(rank, 4, (6, 8))
    refb = torch.relu(sum(t(r, 4, (6, 8)) @ t(r, 3, (16, 8)).T for r in range(n)))
    with torch.no_grad():
        out["task_graph_ok"] = torch.allclose(b(xb), refb, atol=1e-5)
        out["task_graph_compiled"] = "_maco_task_graph" in b.__dict__
        with maco.PersistentContext(Block(rank), inner="eager", sm_config=(100, 28)) as ctx:
            out["ctx_split"] = maco.config.get("comm_sms")
            out["ctx_ok"] = all(torch.allclose(ctx.forward(xb), refb, atol=1e-5)
                                for _ in range(2))
        out["ctx_split_after"] = maco.config.get("comm_sms")
    dist.destroy_process_group()
    return out


@needs_torch
def test_module_tplinear_task_graph_on_gloo(port):
    for out in _run(_module_worker, 2, port, int.from_bytes(os.urandom(4), "little")):
        assert out["registered"] == ["lin.weight"], out
        assert out["tplinear_type"] == "AsyncCollectiveResult" and out["tplinear_ok"], out
        assert out["layer_ok"], out
        assert out["task_graph_ok"] and out["task_graph_compiled"], out
        assert out["ctx_ok"] and out["ctx_split"] == 28 and out["ctx_split_after"] is None, out


@needs_torch
def test_bench_tp_layer_runs_on_cpu():
    """bench_tp_layer.py's logic on 2 Gloo ranks at a small size (--cpu: not a benchmark):
    every variant but async TP runs and matches torch + NCCL's output, and maco-compile's
    steps go through torch.ops.maco.gemm_allreduce, the sequence-parallel ones' through
    allgather_gemm and gemm_reduce_scatter (their CPU fallbacks here)."""
    import subprocess
    import sys

    from conftest import HERE

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MACO_RANK", "MACO_WORLD", "MACO_LOCAL", "MACO_BOOTSTRAP"))}
    env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")
    env["PYTHONPATH"] = os.pathsep.join([HERE] + [p for p in sys.path if p])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node",
           "2", os.path.join(HERE, "bench_tp_layer.py"), "--cpu", "--small", "--tokens", "64",
           "--iters", "2", "--warmup", "1", "--inner", "eager", "--rounds", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    text = out.stdout + out.stderr
    assert out.returncode == 0, text[-4000:]
    assert "PASS bench_tp_layer TP 2" in text, text[-4000:]
    assert "  round 2: torch-nccl " in text, text[-4000:]
    for v in ("torch-nccl", "torch-compile", "maco-eager", "maco-pipeline", "maco-compile",
              "maco-compile-ce", "maco-compile-sp", "maco-compile-sp-seq"):
        assert f"\n{v} " in text, (v, text[-3000:])
    for v, k in (("maco-compile", 2), ("maco-compile-ce", 2), ("maco-compile-sp", 4),
                 ("maco-compile-sp-seq", 4)):  # the sp layer: 2 all_gathers, 2 reduce_scatters
        assert (f"{v}: per step 0 fused GEMM + allreduce kernel(s), 0 maco.tp.gemm_allreduce, "
                f"0 maco.tp.allgather_gemm, 0 maco.tp.gemm_reduce_scatter, {k} through the "
                "fallback") in text, text[-3000:]


def test_persistent_kernel_takes_the_designs_names(clean_env):
    c = maco.Communicator(maco.unique_id(), 0, 1)
    try:
        k = maco.PersistentKernel(c, world_size=1, rank=0, num_workers=96,
                                  num_local_schedulers=24, num_remote_schedulers=8)
        assert k._cfg[:3] == (96, 24, 8)
        k.close()
        with pytest.raises(ValueError, match="num_local_schedulers: given with num_schedulers"):
            maco.PersistentKernel(c, num_schedulers=2, num_local_schedulers=3)
        with pytest.raises(ValueError, match="num_remote_schedulers: given with num_comm"):
            maco.PersistentKernel(c, num_comm_workers=2, num_remote_schedulers=3)
    finally:
        c.close()


def _design_worker(rank, n, port, seed):
    """The design's examples (docs/../seeds), as written, with CPU tensors on 2 Gloo ranks;
    each result against the sum over ranks recomputed here."""
    import torch
    import torch.nn as nn

    dist = _init(rank, n, port)
    import maco

    def t(r, salt, shape):
        return torch.randn(shape, generator=_seeded(seed, r, salt))

    def total(salt, shape, f=lambda v: v):
        return sum(f(t(r, salt, shape)) for r in range(n))

    out = {}
    world_size = n
    maco.init(backend="nvshmem")  # or "nccl_optimized"

    @maco.optimize_comm
    def my_forward(x, weight):
        y = torch.matmul(x, weight)
        y = maco.allreduce(y)  # 替代 dist.all_reduce
        return y

    w = t(0, 1, (8, 4))
    out["level1"] = torch.allclose(my_forward(t(rank, 2, (3, 8)), w),
                                   total(2, (3, 8), lambda v: v @ w), atol=1e-5)

    matmul = torch.matmul
    x, w1, w2 = t(rank, 3, (4, 8)), t(0, 4, (8, 8)), t(0, 5, (8, 8))
    with maco.auto_overlap():
        y1 = matmul(x, w1)
        y1_reduced = maco.allreduce(y1)  # 自动与下一个 matmul 重叠
        y2 = matmul(x, w2)
        y2_reduced = maco.allreduce(y2)
    out["auto_overlap"] = torch.allclose(y1_reduced, total(3, (4, 8), lambda v: v @ w1),
                                         atol=1e-5) and torch.allclose(
        y2_reduced, total(3, (4, 8), lambda v: v @ w2), atol=1e-5)

    prev_y = t(rank, 6, (5,))
    with maco.overlap_region() as region:
        compute_future = region.submit_compute(matmul, x, w1)
        comm_future = region.submit_comm(maco.allreduce, prev_y)
    y = compute_future.result()
    prev_y_reduced = comm_future.result()
    out["region"] = torch.allclose(y, x @ w1) and torch.allclose(prev_y_reduced,
                                                                  total(6, (5,)), atol=1e-6)

    def attention(v):
        return v @ w1

    def ffn(v):
        return torch.relu(v) @ w2

    pipeline = maco.Pipeline(num_stages=3)

    @pipeline.stage(0)
    def stage_attention(x):
        return attention(x)

    @pipeline.stage(1)
    def stage_allreduce(x):
        return maco.allreduce(x)

    @pipeline.stage(2)
    def stage_ffn(x):
        return ffn(x)

    inp = t(rank, 7, (6, 8))
    output = pipeline(inp)
    out["pipeline"] = torch.allclose(output, ffn(total(7, (6, 8), attention)), atol=1e-4)

    activation = t(rank, 8, (2, 3))
    with maco.ring(direction="forward"):
        maco.send(activation, dst=(rank + 1) % world_size)
        recv_activation = maco.recv(src=(rank - 1) % world_size)
    out["ring"] = torch.equal(recv_activation, t((rank - 1) % n, 8, (2, 3)))

    q_proj, k_proj, v_proj, attn_output = (t(rank, 9 + i, (4, 4)) for i in range(4))
    scheduler = maco.CommScheduler(num_sms=32)
    phase1 = scheduler.phase("allreduce_qkv")
    phase1.allreduce(q_proj)
    phase1.allreduce(k_proj)
    phase1.allreduce(v_proj)
    phase2 = scheduler.phase("allreduce_output", depends_on=phase1)
    phase2.allreduce(attn_output)
    scheduler.compile()
    scheduler.run()
    out["scheduler"] = all(torch.allclose(v, total(9 + i, (4, 4)), atol=1e-5)
                           for i, v in enumerate((q_proj, k_proj, v_proj, attn_output)))

    maco.config.set(backend="nvshmem", sm_policy="auto", overlap_strategy="aggressive",
                    comm_buffer_size="256MB", use_pinned_memory=True, debug=False, profile=True)
    tensor = t(rank, 13, (16,))
    work = maco.allreduce(tensor, op=maco.SUM, async_op=True, priority="high",
                          overlap_group="attn", use_ring=False)
    out["per_op"] = torch.allclose(work.wait(), total(13, (16,)), atol=1e-5)

    sm_config = maco.SMConfig(total_sms=132)
    sm_config.assign_role(sm_range=(0, 96), role=maco.Role.COMPUTE,
                          task_types=["matmul", "attention"])
    sm_config.assign_role(sm_range=(96, 120), role=maco.Role.LOCAL_SCHEDULER)
    sm_config.assign_role(sm_range=(120, 132), role=maco.Role.REMOTE_SCHEDULER)
    out["sm"] = sm_config.persistent_config()

    model = nn.Linear(8, 8)
    is_prefill = rank == 0

    @maco.dynamic_sm_config
    def forward(x):
        if is_prefill:
            maco.set_config(compute_sms=120, comm_sms=12)
        else:
            maco.set_config(compute_sms=80, comm_sms=52)
        out["dynamic_inside"] = maco.config.get("comm_sms")
        return model(x)

    forward(x)
    out["dynamic_after"] = maco.config.get("comm_sms")

    @maco.optimize
    class MyModel(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear1 = nn.Linear(8, 8, bias=False)
            self.linear2 = nn.Linear(8, 8, bias=False)
            with torch.no_grad():
                self.linear1.weight.copy_(t(rank, 14, (8, 8)))
                self.linear2.weight.copy_(t(0, 15, (8, 8)))

        def forward(self, x):
            y = self.linear1(x)
            # dist.all_reduce 自动被优化
            dist.all_reduce(y)
            z = self.linear2(y)
            return z

    with torch.no_grad():
        m = MyModel()
        want = sum(t(r, 3, (4, 8)) @ t(r, 14, (8, 8)).T for r in range(n)) @ t(0, 15, (8, 8)).T
        a = m(x)
        with maco.optimize_context():
            b = m(x)
    out["optimize"] = torch.allclose(a, want, atol=1e-4) and torch.allclose(b, want, atol=1e-4)

    class TPLinear(maco.Module):
        """Tensor Parallel Linear with optimized communication"""

        def __init__(self, in_features, out_features, world_size):
            super().__init__()
            self.world_size = world_size
            # 按列切分权重
            self.weight = nn.Parameter(
                torch.randn(out_features, in_features // world_size)
            )

        def forward(self, x):
            y = torch.matmul(x, self.weight.T)
            y = maco.allreduce(y, overlap_with_next=True)
            return y

    model = TPLinear(64, 32, world_size=n)
    weights = [torch.empty(0)] * n
    dist.all_gather_object(weights, model.weight.detach())
    dataloader = [t(rank, 16 + i, (4, 64 // n)) for i in range(2)]
    outs = []
    fusion_before = maco.config.get("fusion")
    with torch.no_grad(), maco.PersistentContext(model) as ctx:
        out["fusion_inside"] = maco.config.get("fusion")
        for batch in dataloader:
            output = ctx.forward(batch)
            outs.append(output)
    out["fusion_restored"] = maco.config.get("fusion") == fusion_before
    out["tplinear"] = all(torch.allclose(o, sum(t(r, 16 + i, (4, 64 // n)) @ weights[r].T
                                                for r in range(n)), atol=1e-4)
                          for i, o in enumerate(outs))
    maco.config.reset()
    maco.finalize()
    dist.destroy_process_group()
    return out


@needs_torch
def test_design_examples_run_as_written_on_gloo(port):
    """The design's Level 1, overlap strategies, patterns, scheduling, configuration, SM
    roles, PyTorch integration and TPLinear + PersistentContext examples, as written (CPU
    tensors; torch.compile's Inductor compiles the TPLinear on the CPU)."""
    for rank, out in enumerate(_run(_design_worker, 2, port,
                                    int.from_bytes(os.urandom(4), "little"))):
        for k in ("level1", "auto_overlap", "region", "pipeline", "ring", "scheduler",
                  "per_op", "optimize", "tplinear", "fusion_restored"):
            assert out[k] is True, (k, out)
        assert out["fusion_inside"] == "persistent", out
        assert out["sm"] == {"num_workers": 96, "num_schedulers": 24, "num_comm_workers": 12}
        assert out["dynamic_inside"] == (12 if rank == 0 else 52) and \
            out["dynamic_after"] is None, out
