"""`Fabric.run` launching for real (calling `run` starts the processes and runs the body in each, as Lightning
Fabric's `_wrap_and_launch` does), and Lightning's own `run` and `sharded_model`.

* `ddp_spawn` and `ddp` with 2 real gloo ranks and rank-dependent inputs (tests/helpers/scripts/fabric_run.py): under
  `ddp_spawn` only the launching process returns, with rank 0's result; under `ddp` every process gets its own.
* Compat: Lightning's base `run` and `sharded_model` behave as ours (same return value, warning class and text);
  skipped without the Lightning Fabric venv.

The checks that start no process are in tests/unit/test_fabric_run.py.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import pytest

from fabric_lite import Fabric
from tests.helpers.harness import Completed, lightning_python, run_python

SCRIPT = "tests/helpers/scripts/fabric_run.py"


DEPRECATION = "`Fabric.sharded_model()` is deprecated in favor of `Fabric.init_module()`."


# ---------------------------------------------------------------------------------------------- distributed tier
def lines(done: Completed, tag: str) -> list[dict[str, Any]]:
    return [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith(tag + " ")]


EXPECTED_WEIGHT = 1.0 - 3 * 0.1 * (1 + 2) / 2  # 3 SGD steps on the mean of the ranks' gradients (x = rank + 1)


def check_ranks(done: Completed) -> list[dict[str, Any]]:
    assert done.returncode == 0, done.output
    results = sorted(lines(done, "RESULT"), key=lambda row: row["rank"])
    assert [(r["rank"], r["world"], r["initialized"]) for r in results] == [(0, 2, True), (1, 2, True)], done.output
    for row in results:
        assert row["total"] == 2.0 * (1 + 2)  # scale=2.0 reached the body as a keyword argument
        assert row["weight"] == pytest.approx([EXPECTED_WEIGHT] * 2, abs=1e-6)
    return results


@pytest.mark.distributed
@pytest.mark.timeout(150)
@pytest.mark.parametrize("name", ["TrainFabric", "Inherited", "CallsSuper"])
def test_run_with_ddp_spawn_runs_the_body_in_two_new_processes(name: str) -> None:
    done = run_python([SCRIPT, "ddp_spawn", name], timeout=120)
    check_ranks(done)
    returned = lines(done, "RETURNED")
    assert len(returned) == 1  # only the launching process returns from run(...)
    value = returned[0]["value"]
    assert value["rank"] == 0  # rank 0's result, as launch(fn) returns it
    assert ("outer_rank" in value) == (name == "CallsSuper")  # super().run() inside ran the parent's body once


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_run_with_ddp_runs_the_body_in_every_process_and_each_gets_its_result() -> None:
    done = run_python([SCRIPT, "ddp", "CallsSuper"], timeout=120)
    check_ranks(done)
    returned = sorted(lines(done, "RETURNED"), key=lambda row: row["value"]["rank"])
    assert [r["value"]["rank"] for r in returned] == [0, 1]
    assert [r["value"]["outer_rank"] for r in returned] == [0, 1]
    assert returned[0]["pid"] != returned[1]["pid"]


# ---------------------------------------------------------------------------------------------------------- compat
@pytest.mark.compat
@pytest.mark.timeout(180)
def test_lightning_base_run_and_sharded_model_behave_the_same() -> None:
    python = lightning_python()
    if python is None:
        pytest.skip("no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)")
    code = (
        "import json, warnings; from lightning_fabric import Fabric\n"
        "f = Fabric(accelerator='cpu', devices=1)\n"
        "ret = f.run(1, key='value')\n"
        "with warnings.catch_warnings(record=True) as w:\n"
        "    warnings.simplefilter('always')\n"
        "    f.sharded_model()\n"
        "print(json.dumps({'run': ret, 'warnings': [[c.category.__name__, str(c.message)] for c in w],"
        " 'deprecation': issubclass(w[0].category, DeprecationWarning)}))\n"
    )
    done = run_python(["-c", code], timeout=120, python=python)
    assert done.returncode == 0, done.output
    lightning = json.loads(done.stdout.strip().splitlines()[-1])
    assert lightning == {
        "run": None,
        "warnings": [["LightningDeprecationWarning", DEPRECATION]],
        "deprecation": True,
    }
    fabric = Fabric(accelerator="cpu", devices=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fabric.sharded_model()
    assert [[c.category.__name__, str(c.message)] for c in caught] == lightning["warnings"]
    assert fabric.run(1, key="value") is lightning["run"]
