"""`Fabric.run` in one process (subclass and override, as with Lightning Fabric's `_wrap_and_launch`) and the
deprecated `Fabric.sharded_model`.

A subclass's `run` sets up the environment and runs its body here; the base `run` does nothing and returns None; the
wrapping happens once per class, never on the instance, and the body pickles for spawn. `sharded_model` warns as
Lightning's does and is the strategy's sharded context, where it has one.

The checks that start processes are in tests/distributed/test_fabric_run.py.
"""

from __future__ import annotations

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
