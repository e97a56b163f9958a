"""The order in which `--dist loadfile` hands out the modules (tests/helpers/schedule.py), on simulated workers."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from xdist.scheduler import LoadFileScheduling

from tests.helpers import schedule
from tests.helpers.schedule import LongestFirstScheduling, expected_seconds


class _Worker:
    """A pytest-xdist worker as the scheduler sees it; like the real one, it runs a test only once it holds the next
    one or has been told to shut down."""

    def __init__(self, name: str) -> None:
        self.gateway = SimpleNamespace(id=name)
        self.queue: list[int] = []
        self.clock = 0.0
        self.shutting_down = False
        self.modules: list[str] = []

    def send_runtest_some(self, indices: list[int]) -> None:
        self.queue.extend(indices)

    def shutdown(self) -> None:
        self.shutting_down = True

    def can_run(self) -> bool:
        return len(self.queue) >= 2 or (self.shutting_down and bool(self.queue))


def _run(scheduler_type: type, modules: dict[str, tuple[int, float]]) -> tuple[float, list[_Worker]]:
    """Simulate a run of ``modules`` (path: (tests, seconds)) on two workers; return when the last ends, and them."""
    collection = [f"{module}::test_{i}" for module, (tests, _) in modules.items() for i in range(tests)]
    config = SimpleNamespace(getvalue=lambda name: ["2*popen"], option=SimpleNamespace(loadscopereorder=False))
    scheduler = scheduler_type(config)
    workers = [_Worker("gw0"), _Worker("gw1")]
    for worker in workers:
        scheduler.add_node(worker)
        scheduler.add_node_collection(worker, collection)
    scheduler.schedule()
    while any(worker.queue for worker in workers):
        if scheduler.tests_finished:  # as pytest-xdist's session does: every worker runs what it holds, and stops
            for worker in workers:
                worker.shutdown()
        runnable = [worker for worker in workers if worker.can_run()]
        assert runnable, "the simulated run stalled: no worker holds a test it may run"
        worker = min(runnable, key=lambda w: w.clock)
        index = worker.queue.pop(0)
        module = collection[index].split("::")[0]
        tests, seconds = modules[module]
        worker.clock += seconds / tests
        if module not in worker.modules:
            worker.modules.append(module)
        scheduler.mark_test_complete(worker, index)
    return max(worker.clock for worker in workers), workers


@pytest.fixture
def durations(monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    recorded: dict[str, float] = {}
    monkeypatch.setattr(schedule, "recorded_durations", lambda: recorded)
    return recorded


def test_the_long_modules_go_first_and_the_workers_end_together(durations: dict[str, float]) -> None:
    # collected in folder order, the two long one-test modules last: the way a plain --dist loadfile meets them
    modules = {f"tests/unit/test_{i}.py": (5, 10.0) for i in range(30)}
    modules |= {"tests/distributed/test_c.py": (10, 300.0)}
    modules |= {"tests/tiers/b/test_b.py": (1, 500.0), "tests/tiers/a/test_a.py": (1, 600.0)}
    durations.update({module: seconds for module, (_, seconds) in modules.items()})
    total = sum(seconds for _, seconds in modules.values())

    plain, _ = _run(LoadFileScheduling, modules)
    ours, workers = _run(LongestFirstScheduling, modules)

    assert plain >= total / 2 + 300  # the scenario is one that the plain order gets wrong
    assert ours <= total / 2 + 10.0, (ours, [w.modules for w in workers])
    firsts = {worker.modules[0] for worker in workers}
    assert firsts == {"tests/tiers/a/test_a.py", "tests/tiers/b/test_b.py"}


def test_a_worker_busy_with_a_long_module_is_handed_the_shortest_one(durations: dict[str, float]) -> None:
    modules = {"tests/tiers/a/test_a.py": (1, 600.0), "tests/tiers/b/test_b.py": (1, 100.0)}
    modules |= {"tests/unit/test_short.py": (3, 1.0), "tests/unit/test_medium.py": (3, 30.0)}
    durations.update({module: seconds for module, (_, seconds) in modules.items()})

    _, (first, second) = _run(LongestFirstScheduling, modules)

    # the first worker holds the 600 s test; the one that must follow it is the shortest, the rest go to the other
    assert first.modules == ["tests/tiers/a/test_a.py", "tests/unit/test_short.py"]
    assert second.modules == ["tests/tiers/b/test_b.py", "tests/unit/test_medium.py"]


def test_a_module_without_a_recorded_time_is_guessed_by_its_folder() -> None:
    recorded = {"tests/unit/test_x.py": 2.5}
    assert expected_seconds("tests/unit/test_x.py", recorded) == 2.5
    assert expected_seconds("tests/tiers/litgpt/test_litgpt.py", recorded) == 120.0
    assert expected_seconds("tests/distributed/test_new.py", recorded) == 60.0
    assert expected_seconds("tests/unit/test_new.py", recorded) == 5.0
