"""How the README's ``-n 2 --dist loadfile`` hands the test modules to the two pytest-xdist workers.

Every module is one unit of work, run whole on one worker (its module-scoped fixtures run multi-process jobs once,
and a tier's tests share an outside resource). The run ends when the busier worker ends, and a handful of modules
take minutes each (the litgpt tier, Lightning's own suite, the 4-rank jobs) while most take seconds. So the units
are handed out by their recorded wall time (``tests/durations.json``, written by ``--store-durations``): the longest
first, to the worker expected to be free first, and the seconds-long modules last, to even out the ends.

One detail of pytest-xdist shapes the rule. A worker runs a test only once it holds the next one (pytest tears a
test down knowing what follows), so a worker asks for a new unit while its last two tests are still to run, even when
one of them takes ten minutes. Such a worker gets the shortest unit left, not the longest: the long ones wait for the
worker that will be free to start them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from xdist.scheduler import LoadFileScheduling

DURATIONS = Path(__file__).parents[1] / "durations.json"

# seconds, for a module that durations.json does not list yet, by its folder under tests/
_UNRECORDED = {"tiers": 120.0, "distributed": 60.0, "compat": 60.0, "gpu": 1.0, "unit": 5.0}


def recorded_durations() -> dict[str, float]:
    """Seconds of wall time per test module (its path from the checkout root), as last stored."""
    return json.loads(DURATIONS.read_text()) if DURATIONS.exists() else {}


def store_durations(measured: dict[str, float]) -> None:
    """Record ``measured`` (seconds per module) over the stored figures, keeping the modules not measured."""
    durations = {**recorded_durations(), **{module: round(seconds, 1) for module, seconds in measured.items()}}
    DURATIONS.write_text(json.dumps(dict(sorted(durations.items())), indent=1) + "\n")


def expected_seconds(module: str, durations: dict[str, float]) -> float:
    """The recorded wall time of ``module``, else a guess by its folder."""
    if module in durations:
        return durations[module]
    parts = Path(module).parts
    return _UNRECORDED.get(parts[1] if len(parts) > 2 and parts[0] == "tests" else "", 5.0)


class LongestFirstScheduling(LoadFileScheduling):
    """``--dist loadfile``, with the modules handed out longest first to the worker expected to be free first."""

    def __init__(self, config: Any, log: Any = None) -> None:
        super().__init__(config, log)
        self.durations = recorded_durations()

    def _seconds_left(self, node: Any) -> float:
        """The expected wall time of what ``node`` holds and has not finished: each unit by its share of tests left."""
        left = 0.0
        for module, tests in self.assigned_work.get(node, {}).items():
            if tests:
                left += expected_seconds(module, self.durations) * list(tests.values()).count(False) / len(tests)
        return left

    def _assign_work_unit(self, node: Any) -> None:
        others = [self._seconds_left(other) for other in self.nodes if other is not node]
        free_first = not others or self._seconds_left(node) <= min(others)
        pick = max if free_first else min
        self.workqueue.move_to_end(pick(self.workqueue, key=lambda m: expected_seconds(m, self.durations)), last=False)
        super()._assign_work_unit(node)
