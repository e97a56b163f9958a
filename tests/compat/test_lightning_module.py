"""A pytorch_lightning ``LightningModule`` trained with fabric_lite's ``Fabric``, as with Lightning Fabric.

tests/helpers/scripts/lightning_module_script.py runs in the Lightning venv's interpreter (pytorch_lightning 2.6.6,
installed with ``--no-deps`` by ``.ci/setup``), once with ``lightning_fabric.Fabric`` and once with
``fabric_lite.Fabric`` (on ``PYTHONPATH``), on 1 and 2 CPU ranks: the module's ``self.log``/``log_dict`` (through
``fabric.log_dict``),
``self.all_gather``, ``self.fabric``, ``self.logger``, ``self.trainer.*``, ``self.optimizers()``,
``self.manual_backward`` and its hooks (through ``fabric.call``) must work, write the same CSV metrics file and
train to the same weights.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import REPO, Completed, base_env, lightning_python, run_python


def _pytorch_lightning_python() -> str | None:
    python = lightning_python()
    if python is None:
        return None
    check = subprocess.run([python, "-c", "import pytorch_lightning"], capture_output=True, timeout=120)
    return python if check.returncode == 0 else None


PYTHON = _pytorch_lightning_python()
pytestmark = [
    pytest.mark.compat,
    pytest.mark.distributed,
    pytest.mark.skipif(
        PYTHON is None,
        reason="no Lightning venv with pytorch_lightning: run .ci/setup (it installs pytorch-lightning==2.6.6)",
    ),
]
SCRIPT = "tests/helpers/scripts/lightning_module_script.py"


def run(impl: str, devices: int, root: Path) -> tuple[list[dict[str, Any]], str]:
    env = base_env({"PYTHONPATH": str(REPO)})
    done: Completed = run_python([SCRIPT, impl, str(devices), str(root)], timeout=200, env=env, python=PYTHON)
    assert done.returncode == 0, done.output
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert sorted(row["rank"] for row in rows) == list(range(devices)), done.output
    metrics = sorted(root.glob("lit/version_*/metrics.csv"))
    assert len(metrics) == 1, (metrics, done.output)  # rank 0 alone writes
    return sorted(rows, key=lambda row: row["rank"]), metrics[0].read_text()


@pytest.mark.timeout(420)
@pytest.mark.parametrize("devices", [1, 2])
def test_lightning_module_logs_and_trains_as_with_lightning_fabric(devices: int, tmp_path: Path) -> None:
    ours, our_csv = run("fabric_lite", devices, tmp_path / "ours")
    lightning, lightning_csv = run("lightning", devices, tmp_path / "lightning")
    for row in ours:
        assert row["fabric_attached"] and row["fabric_optimizers"] == [True] and row["module_is_callback"]
        assert row["epoch_ends"] == [row["rank"]] * 2  # fabric.call reached the module's hook each epoch
        assert row["checks"] == {
            "optimizer_is_set_up": True,
            "gathered_shape": [devices, 2] if devices > 1 else [2],
            "trainer_world_size": devices,
            "trainer_global_rank": row["rank"],
            "trainer_strategy_is_fabric_strategy": True,
            "loggers": 1,
            "logger_is_fabric_logger": True,
            "device": "cpu",
        }
    # the same observations, weights and metrics file as Lightning Fabric's (Lightning's rank 1 names its own
    # version folder, though it writes nothing: the folder is compared on rank 0 only)
    assert ours[0]["log_dir"] == lightning[0]["log_dir"] == "lit/version_0"
    strip = [{k: v for k, v in row.items() if k != "log_dir"} for row in ours]
    assert strip == [{k: v for k, v in row.items() if k != "log_dir"} for row in lightning]
    assert our_csv == lightning_csv
    header, *rows = our_csv.splitlines()
    assert header == "batch_idx,direct,epoch_end,loss,rank_sum,step"
    rank_sums = {line.split(",")[4] for line in rows if line.split(",")[4]}
    assert rank_sums == {str(float(sum(range(1, devices + 1))))}  # self.all_gather over the ranks, then log_dict
    assert len(rows) == 2 * (2 * 3 + 1)  # per epoch: 2 batches of 3 rows, and the hook's row
