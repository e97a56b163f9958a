"""Copied as ``conftest.py`` into the folder above Lightning's ``tests_fabric`` by the lightning-tests tier: records
every test's outcome by node id and writes them as JSON to ``$LIGHTNING_TESTS_OUTCOMES`` when the session ends (on
the pytest-xdist controller, which sees every worker's reports)."""

from __future__ import annotations

import json
import os
import sys

import pytest


def pytest_configure(config: pytest.Config) -> None:
    # A pytest-xdist worker runs as `python -c ...`, whose __main__ has no file, which fabric_lite takes for an
    # interactive session (no script to re-run for strategy="ddp"). Under plain pytest __main__ is pytest's own
    # module: give the worker's __main__ the same, as fabric_lite's own tests/conftest.py does (Lightning reads
    # __main__.__file__ only to re-run a script, which its tests mock).
    main = sys.modules.get("__main__")
    if os.environ.get("PYTEST_XDIST_WORKER") and main is not None and not hasattr(main, "__file__"):
        main.__file__ = pytest.__file__


_OUTCOMES: dict[str, str] = {}
#: what a later phase's result does to what an earlier phase recorded: a failure in setup or teardown is an error
_WORST = ("passed", "xpassed", "skipped", "xfailed", "failed", "error")


def _outcome(report: pytest.TestReport) -> str:
    if report.outcome == "skipped":
        return "xfailed" if hasattr(report, "wasxfail") else "skipped"
    if report.outcome == "passed":
        return "xpassed" if hasattr(report, "wasxfail") else "passed"
    return "failed" if report.when == "call" else "error"


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.outcome == "rerun":
        return
    if report.when != "call" and report.outcome == "passed":
        _OUTCOMES.setdefault(report.nodeid, "passed")
        return
    outcome = _outcome(report)
    previous = _OUTCOMES.get(report.nodeid, "passed")
    _OUTCOMES[report.nodeid] = max(previous, outcome, key=_WORST.index)


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if report.failed:  # a module that cannot be imported: every test in it is lost, recorded under the module
        _OUTCOMES[report.nodeid] = "error"


def pytest_sessionfinish(session: pytest.Session) -> None:
    path = os.environ.get("LIGHTNING_TESTS_OUTCOMES")
    if path and not hasattr(session.config, "workerinput"):
        with open(path, "w") as f:
            json.dump(dict(sorted(_OUTCOMES.items())), f, indent=0)
