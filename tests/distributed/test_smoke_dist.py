import pytest

from tests.helpers.harness import spawn_job


@pytest.mark.distributed
def test_spawn_job_two_ranks():
    results = spawn_job("tests.helpers.jobs.smoke:ranks", 2)
    assert results == [{"rank": 0, "world": 2, "sum": 3.0}, {"rank": 1, "world": 2, "sum": 3.0}]
