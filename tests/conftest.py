"""Test hygiene for every test: a hard time bound, a restored environment, no process group left behind."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

import pytest
import torch.distributed as dist

DEFAULT_TIMEOUT = 120  # seconds; multi-process tests bound their children separately (tests/_harness.py)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): hard time bound for the test (default 120 s)")


@pytest.fixture(autouse=True)
def _time_bound(request: pytest.FixtureRequest):  # type: ignore[no-untyped-def]
    """Fail a test that runs longer than its bound instead of hanging the run (SIGALRM, main thread)."""
    marker = request.node.get_closest_marker("timeout")
    seconds = marker.args[0] if marker else DEFAULT_TIMEOUT

    def expired(signum, frame):  # type: ignore[no-untyped-def]
        faulthandler.dump_traceback(file=sys.stderr)
        raise TimeoutError(f"{request.node.nodeid} exceeded its {seconds} s time bound")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@pytest.fixture(autouse=True)
def _restore_environment():  # type: ignore[no-untyped-def]
    """Every test leaves os.environ as it found it, and no default process group behind."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialised")
