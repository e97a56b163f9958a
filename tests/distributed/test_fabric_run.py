"""`Fabric.run` (subclass and override: calling `run` starts the processes and runs the body in each, as Lightning
Fabric's `_wrap_and_launch` does) and the deprecated `Fabric.sharded_model`.

Unit tier: one process; the base `run`; the wrapping happens once per class, never on the instance. Distributed
tier: `ddp_spawn` and `ddp` with 2 real gloo ranks and rank-dependent inputs (tests/helpers/scripts/fabric_run.py).
Compat: Lightning's base `run` and `sharded_model` behave as ours (same return value, warning class and text).
"""

from __future__ import annotations

import json
import pickle
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.utilities.rank_zero import LightningDeprecationWarning
from tests.helpers.harness import Completed, lightning_python, run_python

SCRIPT = "tests/helpers/scripts/fabric_run.py"
DEPRECATION = "`Fabric.sharded_model()` is deprecated in favor of `Fabric.init_module()`."


class Recording(Fabric):
    def run(self, a: int, *, b: int = 0) -> dict[str, Any]:
        return {"a": a, "b": b, "ready": self._environment_ready, "launched": self._launched, "me": id(self)}


class Child(Recording):
    pass


def test_run_of_a_subclass_sets_up_and_runs_the_body_in_this_process() -> None:
    fabric = Recording(accelerator="cpu", devices=1)
    out = fabric.run(1, b=2)
    assert out == {"a": 1, "b": 2, "ready": True, "launched": True, "me": id(fabric)}
    assert Child(accelerator="cpu", devices=1).run(5)["a"] == 5  # inherited, not overridden: the parent's body


def test_run_is_wrapped_once_per_class_and_never_on_the_instance() -> None:
    fabric = Recording(accelerator="cpu", devices=1)
    assert "run" not in vars(fabric)  # no setattr(self, "run", ...) as in Lightning
    assert Recording.run.__wrapped__.__qualname__ == "Recording.run"  # type: ignore[attr-defined]
    assert "run" not in vars(Child)  # a subclass that does not override it is left alone
    assert Recording.run.__doc__ == Recording.run.__wrapped__.__doc__  # type: ignore[attr-defined]
    pickle.loads(pickle.dumps(fabric))  # picklable still (spawn launchers pickle the Fabric)


def test_base_run_does_nothing_and_returns_none_as_in_lightning() -> None:
    fabric = Fabric(accelerator="cpu", devices=1)
    assert fabric.run(1, key="value") is None
    assert fabric._environment_ready and fabric._launched  # like launch(): the environment is set up


def test_run_with_a_spawn_strategy_in_a_function_is_the_pickled_class_body() -> None:
    # the body handed to the launcher pickles as the class, by reference (the wrapped function could not be)
    from fabric_lite.fabric import _RunBody

    body = pickle.loads(pickle.dumps(_RunBody(Recording)))
    assert body.owner is Recording
    fabric = Recording(accelerator="cpu", devices=1)
    assert body(fabric, 3, b=4)["b"] == 4


def test_sharded_model_warns_and_does_nothing_without_a_sharded_context() -> None:
    # as in Lightning: the deprecated method is the strategy's sharded context, and a strategy without one has none
    # (it is not init_module: the layer stays on the CPU in float32 under bf16-true, and nothing needs launch())
    fabric = Fabric(accelerator="cpu", devices=1, precision="bf16-true")
    with pytest.warns(LightningDeprecationWarning, match=r"sharded_model\(\)` is deprecated in favor of"):
        context = fabric.sharded_model()
    with context:
        layer = nn.Linear(2, 2)
    assert layer.weight.dtype == torch.float32 and layer.weight.device == torch.device("cpu")
    assert issubclass(LightningDeprecationWarning, DeprecationWarning)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LightningDeprecationWarning)
        with Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").sharded_model():
            pass


def test_sharded_model_is_the_sharded_strategys_context(monkeypatch: pytest.MonkeyPatch) -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="fsdp")
    entered = []

    @contextmanager
    def sharded_context(strategy: Any) -> Iterator[None]:
        entered.append(strategy)
        yield

    monkeypatch.setattr(type(fabric.strategy), "module_sharded_context", sharded_context)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LightningDeprecationWarning)
        with fabric.sharded_model():
            pass
    assert entered == [fabric.strategy]


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
