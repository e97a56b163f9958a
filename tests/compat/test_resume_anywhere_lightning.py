"""The control for tests/distributed/test_resume_anywhere.py: the same script on Lightning Fabric, killed at a
step inside an epoch and started again, does not end with the weights of the run that never stopped. Lightning
saves a plain ``DataLoader`` as the pickled object, without its position, so the resumed epoch starts over and
trains again on the batches it had already seen. The README ("Resuming inside an epoch") quotes the figures this
test records (``record_property``: the batches trained twice, and the largest weight difference).
"""

from __future__ import annotations

import random
import re
from pathlib import Path

import pytest

from tests.helpers.harness import lightning_python, run_python
from tests.helpers.resume_anywhere import (
    BATCH,
    EPOCHS,
    RUN_BOUND,
    STEPS_PER_EPOCH,
    args,
    kill_step,
    load,
    run_and_kill_at,
    steps,
)

pytestmark = [
    pytest.mark.compat,
    pytest.mark.distributed,
    pytest.mark.skipif(lightning_python() is None, reason="no Lightning venv: run .ci/setup (or set LIGHTNING_PYTHON)"),
]


@pytest.mark.timeout(3 * RUN_BOUND + 60)
def test_lightning_fabric_resumes_at_the_epoch_start_and_ends_elsewhere(
    tmp_path: Path, record_property: pytest.RecordProperty
) -> None:
    python = lightning_python()
    total = STEPS_PER_EPOCH[1] * EPOCHS
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    done = run_python(args(1, tmp_path / "a", "--impl", "lightning"), RUN_BOUND, python=python)
    assert done.returncode == 0, done.output
    expected = load(tmp_path / "a" / "final.pt")

    seed = random.randrange(10**6)
    step = kill_step(1, seed)
    print(f"seed={seed}: SIGKILL at STEP {step}")
    run_and_kill_at(args(1, tmp_path / "b", "--impl", "lightning"), step, RUN_BOUND, python=python)
    resumed = run_python(args(1, tmp_path / "b", "--impl", "lightning"), RUN_BOUND, python=python)
    assert resumed.returncode == 0, resumed.output
    saved = int(re.search(r"^RESUMED step=(\d+)", resumed.stdout, re.M).group(1))  # type: ignore[union-attr]
    trained_twice = (steps(resumed.stdout)[-1] - total) * 2 * BATCH  # samples: 2 batches a step
    got = load(tmp_path / "b" / "final.pt")["model"]
    difference = max(float((got[k].float() - v.float()).abs().max()) for k, v in expected["model"].items())
    record_property("lightning_samples_trained_twice", trained_twice)
    record_property("lightning_max_weight_difference", difference)
    print(f"Lightning Fabric: saved at step {saved}, {trained_twice} samples trained twice, max |dw| {difference:.3g}")
    assert saved % STEPS_PER_EPOCH[1] != 0
    assert trained_twice == (saved % STEPS_PER_EPOCH[1]) * 2 * BATCH > 0
    assert difference > 0
