"""What a job returns from its checks, on every rank (the jobs' one ``record``)."""

from __future__ import annotations

import traceback
from collections.abc import Callable
from typing import Any


def record(checks: dict[str, Callable[[], Any]]) -> dict[str, Any]:
    """Run each check in order and map its name to what it returned, or to ``{"traceback": ...}`` when it raised: a
    check that fails on one rank does not stop the others, and the test shows that rank's traceback
    (``tests.helpers.harness.per_rank``).

    Example::

        record({"sum": lambda: fabric.all_reduce(torch.tensor(1.0))})  # {"sum": tensor(2.)} on 2 ranks
    """
    results: dict[str, Any] = {}
    for name, check in checks.items():
        try:
            results[name] = check()
        except Exception:
            results[name] = {"traceback": traceback.format_exc()}
    return results
