"""Hostile integers at the public Python API (issue 58): every size, count, rank, device and
timeout that cannot reach the C library's type (negative where it is unsigned, 2**31 and up
where it is an int, 2**64 and up anywhere) is a ValueError or TypeError naming the argument
and its range, raised before the extension is called, never the extension's list of
signatures. Runs without a GPU."""

import pytest

import maco

DUMP = "incompatible function arguments"
ID = bytes(128)  # never reaches the C library: every case below fails before it

# Values that no argument of that C type can hold.
NOT_INT = [2**31, 2**63, 2**64 - 1, 2**64]
NOT_SIZE = [-1, 2**64, 2**65]


@pytest.fixture
def comm(clean_env):
    c = maco.Communicator(maco.unique_id(), 0, 1)
    yield c
    c.close()


def _pk(c, **kw):
    maco.PersistentKernel(c, **kw).compile()


# (argument name, values, call); every call must raise naming the argument.
CASES = [
    ("size", NOT_INT, lambda c, v: maco.Communicator(ID, 0, v)),
    ("device", NOT_INT, lambda c, v: maco.Communicator(ID, 0, 1, device=v)),
    ("device", NOT_INT, lambda c, v: maco.Communicator(ID, 0, 1, device=f"cuda:{v}")),
    ("timeout", [2**31, 2**64, float("inf"), float("nan")],
     lambda c, v: maco.Communicator(ID, 0, 1, timeout=v)),
    ("count", NOT_SIZE, lambda c, v: c.algorithm("allreduce", v, "float32")),
    ("max_ctas", NOT_INT, lambda c, v: c.set_max_ctas(v)),
    ("color", NOT_INT, lambda c, v: c.split(v)),
    ("key", NOT_INT + [-2**31 - 1], lambda c, v: c.split(0, v)),
    ("size", NOT_INT, lambda c, v: c.grow(v)),
    ("rank", NOT_INT, lambda c, v: maco.Communicator.join(ID, v, 2)),
    ("size", NOT_INT, lambda c, v: maco.Communicator.join(ID, 1, v)),
    ("shape", [2**63, 2**64], lambda c, v: c.empty((v,), "float32", framework="cupy")),
    ("shape", [2**62, 2**63 - 1], lambda c, v: c.empty((v, 4), "float32", framework="cupy")),
    ("num_workers", NOT_INT, lambda c, v: _pk(c, num_workers=v)),
    ("num_schedulers", NOT_INT, lambda c, v: _pk(c, num_schedulers=v)),
    ("num_comm_workers", NOT_INT, lambda c, v: _pk(c, num_comm_workers=v)),
    ("threads", NOT_INT, lambda c, v: _pk(c, threads=v)),
    ("comm_sms", NOT_INT, lambda c, v: maco.set_config(comm_sms=v)),
    ("total_sms", NOT_INT, lambda c, v: maco.SMConfig(v)),
]


@pytest.mark.parametrize("name,values,call", CASES,
                         ids=[f"{i}-{case[0]}" for i, case in enumerate(CASES)])
def test_out_of_range_integers_are_named(comm, name, values, call):
    for v in values:
        with pytest.raises((ValueError, TypeError)) as e:
            call(comm, v)
        msg = str(e.value)
        assert DUMP not in msg, (name, v, msg)
        assert msg.startswith(f"{name}:"), (name, v, msg)


def test_range_errors_state_the_limit(comm):
    with pytest.raises(ValueError, match=r"count: 18446744073709551616 is outside "
                                         r"\[0, 2\*\*64 - 1, a C size_t\]"):
        comm.algorithm("allreduce", 2**64, "float32")
    with pytest.raises(ValueError, match=r"max_ctas: 2147483648 is outside \[0, 2\*\*31 - 1"):
        comm.set_max_ctas(2**31)
    with pytest.raises(ValueError, match=r"timeout: inf s is not in \[0, 2147483\] s"):
        maco.Communicator(ID, 0, 1, timeout=float("inf"))
    with pytest.raises(TypeError, match="count: expected an integer, got float"):
        comm.algorithm("allreduce", 4.5, "float32")
    # The largest values the C types hold still reach the library.
    assert comm.algorithm("allreduce", 2**64 - 1, "float32")


@pytest.mark.parametrize("name", ["num_experts", "hidden", "num_max_dispatch_tokens_per_rank",
                                  "num_topk", "num_max_recv_tokens", "num_sms"])
def test_ep_buffer_sizes_out_of_range_are_named(comm, name):
    pytest.importorskip("torch", reason="maco.ep needs PyTorch")
    import maco.ep

    sizes = dict(num_experts=8, hidden=8, num_max_dispatch_tokens_per_rank=1, num_topk=1)
    for v in (2**63, 2**64):
        with pytest.raises(ValueError, match=f"^{name}: {v} is outside"):
            maco.ep.Buffer(comm, **{**sizes, name: v})
