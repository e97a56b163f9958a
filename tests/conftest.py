"""Test hygiene for every test: a hard time bound, a restored environment, no process group left behind."""

from __future__ import annotations

import faulthandler
import os
import signal
import sys

import pytest
import torch.distributed as dist

DEFAULT_TIMEOUT = 120  # seconds; multi-process tests bound their children separately (tests/helpers/harness.py)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "timeout(seconds): hard time bound for the test (default 120 s)")
    # A pytest-xdist worker runs as `python -c ...`, whose __main__ has no file: fabric_lite would then take the tests
    # for an interactive session (where strategy="ddp" cannot re-run the script). Under plain pytest __main__ is
    # pytest's own module; give the worker's __main__ the same, so that both runs see the same process.
    main = sys.modules.get("__main__")
    if os.environ.get("PYTEST_XDIST_WORKER") and main is not None and not hasattr(main, "__file__"):
        main.__file__ = pytest.__file__
    if config.pluginmanager.hasplugin("xdist"):
        config.pluginmanager.register(_Scheduling(), "fabric-lite-scheduling")
    # every process the tests start (the xdist workers included: they start after this) skips the interpreter's last
    # garbage collections (tests/helpers/site/sitecustomize.py)
    from tests.helpers.harness import SITE

    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    if str(SITE) not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([str(SITE), *filter(None, paths)])


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
    """Every test leaves os.environ and the rank that rank_zero_only reads (a strategy set up in the test process sets
    it) as it found them, and no default process group behind."""
    from fabric_lite.utilities.rank_zero import rank_zero_only

    saved, rank = dict(os.environ), rank_zero_only.rank  # type: ignore[attr-defined]
    yield
    os.environ.clear()
    os.environ.update(saved)
    rank_zero_only.rank = rank  # type: ignore[attr-defined]
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        pytest.fail("the test left a torch.distributed process group initialised")


# ------------------------------------------------------------------ options, and the order of the modules under -n 2
def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--reliability-report",
        action="store_true",
        help="after the run, print one row per RELIABILITY.md case: result, longest test, time to fail",
    )
    parser.addoption(
        "--store-durations",
        action="store_true",
        help="after a whole run, record each module's wall time in tests/durations.json (how -n 2 orders them)",
    )


class _Scheduling:
    """``--dist loadfile`` hands the modules out longest first (tests/helpers/schedule.py), by their recorded times."""

    @pytest.hookimpl(tryfirst=True)
    def pytest_xdist_make_scheduler(self, config: pytest.Config, log: object) -> object:
        if config.getvalue("dist") != "loadfile":
            return None
        from tests.helpers.schedule import LongestFirstScheduling

        return LongestFirstScheduling(config, log)


_MODULE_SECONDS: dict[str, float] = {}


def pytest_sessionfinish(session: pytest.Session) -> None:
    if session.config.getoption("--store-durations") and not hasattr(session.config, "workerinput"):
        from tests.helpers.schedule import store_durations

        store_durations(_MODULE_SECONDS)


# ------------------------------------------------------------------ the reliability tier and its report
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    from tests.reliability_cases import cases_of

    for item in items:
        cases = cases_of(item.nodeid)
        if cases:
            item.add_marker(pytest.mark.reliability(*cases))


_RELIABILITY_RUNS: dict[str, dict[str, object]] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    from tests.reliability_cases import cases_of

    module = report.nodeid.split("::", 1)[0]
    _MODULE_SECONDS[module] = _MODULE_SECONDS.get(module, 0.0) + report.duration
    if not cases_of(report.nodeid):
        return
    run = _RELIABILITY_RUNS.setdefault(report.nodeid, {"outcome": "passed", "seconds": 0.0, "properties": {}})
    rank = ("passed", "skipped", "failed")
    if rank.index(report.outcome) > rank.index(str(run["outcome"])):
        run["outcome"] = report.outcome
    if report.when == "call":
        run["seconds"] = report.duration
    run["properties"] = {**run["properties"], **dict(report.user_properties)}  # type: ignore[dict-item]


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:  # type: ignore[no-untyped-def]
    if not config.getoption("--reliability-report"):
        return
    from tests.reliability_cases import CASES, cases_of

    write = terminalreporter.write_line
    write("")
    write(
        "RELIABILITY.md cases (CPU, gloo, 2 cores). time to fail: the slowest recorded, from the start of the failing"
        " job (or the signal) to its exit; '-' where the case has no failing job to time"
    )
    write(f"{'case':>4}  {'result':<22}  {'tests':>5}  {'longest':>8}  {'time to fail':>12}  what")
    for case, (what, _) in CASES.items():
        runs = [run for nodeid, run in _RELIABILITY_RUNS.items() if case in cases_of(nodeid)]
        outcomes = [str(run["outcome"]) for run in runs]
        if not runs:
            result = "not run"
        elif all(o == "passed" for o in outcomes):
            result = "pass"
        else:
            result = ", ".join(f"{outcomes.count(o)} {o}" for o in ("failed", "skipped", "passed") if o in outcomes)
        longest = max((float(run["seconds"]) for run in runs), default=0.0)  # type: ignore[arg-type]
        fails = [
            float(v)
            for run in runs
            for k, v in run["properties"].items()  # type: ignore[attr-defined]
            if k == "time_to_fail_s"
        ]
        ttf = f"{max(fails):.2f} s" if fails else "-"
        write(f"{case:>4}  {result:<22}  {len(runs):>5}  {longest:>7.1f}s  {ttf:>12}  {what}")
