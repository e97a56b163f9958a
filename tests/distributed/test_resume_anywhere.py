"""A job killed with SIGKILL at a random step inside an epoch, and started again, ends with exactly the weights and
optimizer state of a run that never stopped (issue 25, part 1), on 1 and 2 CPU ranks, with shuffling, 2 loader
workers, dropout, gradient accumulation, an LR scheduler and ``bf16-mixed``.

The kill goes to the job's whole process group (the ranks, the launcher and the loader workers, as when a node is
lost), as soon as the job prints the chosen step, so it may land inside ``fabric.save``: the atomic write is part
of what is tested. The step is drawn from a seed printed in the test's output, never on an epoch boundary.
"""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import run_python
from tests.helpers.resume_anywhere import (
    EPOCHS,
    RUN_BOUND,
    STEPS_PER_EPOCH,
    args,
    differences,
    kill_step,
    load,
    run_and_kill_at,
    steps,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module", params=[1, 2], ids=["1-rank", "2-ranks"])
def uninterrupted(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[int, Any]:
    devices: int = request.param
    folder = tmp_path_factory.mktemp(f"uninterrupted{devices}")
    done = run_python(args(devices, folder), RUN_BOUND)
    assert done.returncode == 0, done.output
    assert steps(done.stdout)[-1] == STEPS_PER_EPOCH[devices] * EPOCHS
    return devices, load(folder / "final.pt")


@pytest.mark.timeout(3 * RUN_BOUND + 60)
def test_sigkill_at_a_random_step_then_resume_gives_identical_weights(uninterrupted: Any, tmp_path: Path) -> None:
    devices, expected = uninterrupted
    seed = random.randrange(10**6)
    step = kill_step(devices, seed)
    print(f"seed={seed}: SIGKILL at STEP {step} on {devices} rank(s)")
    killed = run_and_kill_at(args(devices, tmp_path), step, RUN_BOUND)
    assert not (tmp_path / "final.pt").exists()
    assert (tmp_path / "last.ckpt").exists(), killed

    resumed = run_python(args(devices, tmp_path), RUN_BOUND)
    assert resumed.returncode == 0, resumed.output
    saved = int(re.search(r"^RESUMED step=(\d+)", resumed.stdout, re.M).group(1))  # type: ignore[union-attr]
    assert saved in (step, step - 2) and saved % STEPS_PER_EPOCH[devices] != 0, resumed.stdout
    # the resumed run trains exactly the steps left: no batch twice, none skipped
    assert steps(resumed.stdout) == list(range(saved + 1, STEPS_PER_EPOCH[devices] * EPOCHS + 1))
    assert differences(load(tmp_path / "final.pt"), expected) == []
