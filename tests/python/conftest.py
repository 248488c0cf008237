"""pytest setup for MACO's Python tests: shared helpers, and every skip's reason printed as
'SKIP: ...' (scripts/test.sh collects those lines)."""

import os
import socket
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
# Why a torch test skips: run.sh leaves torch out under PYTEST_TORCH=0 (no multi-GB download).
NO_TORCH = "PyTorch is not installed" + (
    " (PYTEST_TORCH=0: run.sh installs no torch)" if os.environ.get("PYTEST_TORCH") == "0" else "")
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def port() -> int:
    return free_port()


@pytest.fixture
def clean_env(monkeypatch):
    """No job variables from the caller's environment (maco-run, torchrun)."""
    for k in ("MACO_RANK", "MACO_WORLD_SIZE", "MACO_LOCAL_RANK", "MACO_BOOTSTRAP_ADDR",
              "MACO_BOOTSTRAP_NONCE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR",
              "MASTER_PORT", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(k, raising=False)
    return monkeypatch


def pytest_terminal_summary(terminalreporter):
    for rep in terminalreporter.stats.get("skipped", []):
        reason = rep.longrepr[2] if isinstance(rep.longrepr, tuple) else str(rep.longrepr)
        reason = reason.replace("Skipped: ", "")
        terminalreporter.write_line(f"SKIP: {rep.nodeid}: {reason}")
