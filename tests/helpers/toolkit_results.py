"""The results of ``tests.helpers.jobs.ddp_toolkit:suite``, run once per world size and shared by the test files using
it.

A spawn costs seconds and a check milliseconds, so tests/distributed/test_ddp_toolkit.py and
tests/distributed/test_distributed_utils.py read the observations of one job per world size (the job's failure is cached
too, so no test retries it).
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.harness import spawn_job

JOB_TIMEOUT = 180  # seconds, for the whole multi-process job (it takes about 25 s on two shared CPU cores)
_CACHE: dict[int, Any] = {}


def suite_results(world: int) -> list[dict[str, Any]]:
    if world not in _CACHE:
        try:
            _CACHE[world] = spawn_job("tests.helpers.jobs.ddp_toolkit:suite", world, timeout=JOB_TIMEOUT)
        except pytest.fail.Exception as failure:
            _CACHE[world] = failure
    cached = _CACHE[world]
    if isinstance(cached, BaseException):
        pytest.fail(f"the {world}-rank ddp_toolkit job failed (see the first test that ran it): {cached}")
    return cached  # type: ignore[no-any-return]


def values(results: list[dict[str, Any]], check: str, ranks: Any = None) -> list[Any]:
    """Each rank's value for ``check``; a check that raised on a rank fails the test with that rank's traceback."""
    out = []
    for rank in ranks if ranks is not None else range(len(results)):
        assert check in results[rank], f"rank {rank} did not run {check!r}"
        observed = results[rank][check]
        assert "traceback" not in observed, f"{check} on rank {rank}:\n{observed['traceback']}"
        out.append(observed["value"])
    return out
