"""``torch.compile`` with Fabric in this process, with the ``eager`` backend or a counting one.

A compiled module is set up uncompiled and compiled again around the strategy's module (``DataParallel`` too) with
the user's settings, ``fullgraph`` included, or kept as it is with ``_reapply_compile=False``; state dicts never carry
``_orig_mod.``, so compiled and eager checkpoints load into each other; ``_FabricModule`` adds no graph break, and a
method marked with ``mark_forward_method`` runs compiled.

The checks that start processes are in tests/distributed/test_compile.py.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

from fabric_lite import Fabric, is_wrapped
from fabric_lite._compile import clean_state_dict_keys, is_compiled, unwrap_compiled
from fabric_lite.strategies import DataParallelStrategy
from tests.helpers.jobs.compile_jobs import CountingBackend, Net


@pytest.fixture
def fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


def _keys(checkpoint: Path) -> list[str]:
    return sorted(torch.load(checkpoint, weights_only=True)["model"])


class Breaks(nn.Module):
    """A forward with a graph break: compiling it with ``fullgraph=True`` fails when it first runs."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        torch._dynamo.graph_break()
        return self.fc(x)


def test_setup_compiles_again_with_the_same_settings(fabric: Fabric) -> None:
    torch.manual_seed(0)
    net = Net()
    counter = CountingBackend()
    compiled = torch.compile(net, backend=counter, dynamic=False)
    model = fabric.setup(compiled)
    assert model.module is net and model._strategy_module is net  # the original, uncompiled
    assert model._forward_module is model._call  # what calls run through: the new compiled wrapper, as in Lightning
    assert is_compiled(model._call) and model._call is not compiled
    assert model._call.dynamo_ctx is compiled.dynamo_ctx  # backend, mode, options, fullgraph, dynamic: all of them
    x = torch.randn(4, 6)
    torch.testing.assert_close(model(x), net(x))
    model(x)
    assert counter.graphs == 1  # the user's backend compiled it, once


def test_fullgraph_survives_the_setup(fabric: Fabric) -> None:
    x = torch.randn(2, 3)
    strict = fabric.setup(torch.compile(Breaks(), backend="eager", fullgraph=True))
    with pytest.raises(Exception, match="graph_break"):
        strict(x)
    lenient = fabric.setup(torch.compile(Breaks(), backend="eager"))
    assert lenient(x).shape == (2, 3)


def test_reapply_compile_false_sets_up_the_compiled_module_as_it_is(fabric: Fabric, tmp_path: Path) -> None:
    net = Net()
    compiled = torch.compile(net, backend="eager")
    model = fabric.setup(compiled, _reapply_compile=False)
    assert model._call is compiled and model.module is compiled  # as in Lightning: the module as it was given
    assert sorted(model.state_dict()) == sorted(net.state_dict())
    assert sorted(compiled.state_dict()) == sorted(net.state_dict())  # the wrapper's own keys too
    fabric.save(tmp_path / "ckpt", {"model": model})
    assert _keys(tmp_path / "ckpt") == sorted(net.state_dict())


def test_setup_module_signature_and_recompile(fabric: Fabric) -> None:
    counter = CountingBackend()
    model = fabric.setup_module(torch.compile(Net(), backend=counter), move_to_device=True, _reapply_compile=True)
    model(torch.randn(2, 6))
    assert counter.graphs == 1 and is_compiled(model._call)
    net = Net()
    compiled = torch.compile(net, backend=counter)
    plain = fabric.setup_module(compiled, _reapply_compile=False)
    assert plain._call is compiled and plain.module is compiled  # set up as it is: neither unwrapped nor recompiled


def test_checkpoints_of_compiled_and_eager_models_are_interchangeable(fabric: Fabric, tmp_path: Path) -> None:
    torch.manual_seed(0)
    source = Net()
    expected = sorted(source.state_dict())
    set_up = fabric.setup(torch.compile(copy.deepcopy(source), backend="eager"))
    not_set_up = torch.compile(copy.deepcopy(source), backend="eager")
    fabric.save(tmp_path / "set_up", {"model": set_up})
    fabric.save(tmp_path / "not_set_up", {"model": not_set_up})
    fabric.save(tmp_path / "eager", {"model": source})
    assert _keys(tmp_path / "set_up") == _keys(tmp_path / "not_set_up") == _keys(tmp_path / "eager") == expected
    assert sorted(set_up.state_dict()) == expected

    # eager checkpoint -> compiled models (set up or not), and compiled checkpoint -> eager model
    for target in (fabric.setup(torch.compile(Net(), backend="eager")), torch.compile(Net(), backend="eager")):
        fabric.load(tmp_path / "eager", {"model": target})
        loaded = target.module if is_wrapped(target) else target._orig_mod
        torch.testing.assert_close(loaded.fc1.weight, source.fc1.weight)
    eager = Net()
    fabric.load(tmp_path / "set_up", {"model": eager})
    torch.testing.assert_close(eager.fc2.bias, source.fc2.bias)
    # load_raw of a plain state dict into a compiled model that Fabric did not set up
    torch.save(source.state_dict(), tmp_path / "raw.pt")
    raw_target = torch.compile(Net(), backend="eager")
    fabric.load_raw(tmp_path / "raw.pt", raw_target)
    torch.testing.assert_close(raw_target._orig_mod.fc1.bias, source.fc1.bias)


def test_compiled_wrapper_accepts_keys_with_and_without_the_prefix() -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.BatchNorm1d(2))
    compiled = torch.compile(net, backend="eager")
    with_prefix = compiled.state_dict()
    assert all(key.startswith("_orig_mod.") for key in with_prefix)  # torch's own keys, before
    clean_state_dict_keys(compiled)
    assert list(compiled.state_dict()) == list(net.state_dict())  # same keys, same order
    compiled.load_state_dict(net.state_dict())
    compiled.load_state_dict(with_prefix)
    outer = nn.Sequential(compiled)  # nested: the prefix of the outer module stays
    assert list(outer.state_dict()) == [f"0.{key}" for key in net.state_dict()]
    outer.load_state_dict(outer.state_dict())


def test_blocks_compiled_by_the_user_lose_the_prefix_at_setup(fabric: Fabric) -> None:
    net = nn.Sequential(nn.Linear(2, 2), nn.ReLU(), nn.Linear(2, 1))
    net[0] = torch.compile(net[0], backend="eager")  # torchtitan-style, block by block
    assert "0._orig_mod.weight" in net.state_dict()
    model = fabric.setup(net)
    assert sorted(model.state_dict()) == ["0.bias", "0.weight", "2.bias", "2.weight"]
    model.load_state_dict(model.state_dict())


def test_fabric_module_forward_has_no_graph_break() -> None:
    for precision in ("32-true", "bf16-mixed"):
        fabric = Fabric(accelerator="cpu", devices=1, precision=precision)
        net = Net()
        model = fabric.setup(net)
        counter = CountingBackend()
        compiled = torch.compile(model, backend=counter, fullgraph=True)
        x = torch.randn(3, 6)
        out = compiled(x)
        assert counter.graphs == 1, precision
        torch.testing.assert_close(out, model(x))
        # a compiled Fabric module is still a Fabric module
        assert is_wrapped(compiled)
        with pytest.raises(ValueError, match="already set up"):
            fabric.setup(compiled)
        with fabric.no_backward_sync(compiled):
            fabric.backward(compiled(x).sum(), model=compiled)
        assert net.fc1.weight.grad is not None


def test_mark_forward_method_runs_through_the_compiled_forward(fabric: Fabric) -> None:
    torch.manual_seed(0)
    net = Net()
    counter = CountingBackend()
    model = fabric.setup(torch.compile(net, backend=counter))
    x = torch.randn(2, 6)
    model.score(x).sum().backward()  # unmarked, on one device: runs eagerly, nothing to bypass, no error
    assert counter.graphs == 0
    model.mark_forward_method("score")
    for _ in range(3):
        torch.testing.assert_close(model.score(x), net.score(x))
        torch.testing.assert_close(model(x), net(x))
    assert counter.graphs == 2  # score and forward, compiled once each (no recompilation per call)


def test_data_parallel_compiles_the_data_parallel_module() -> None:
    """As Lightning: the strategy's wrapper (here ``DataParallel``) is what gets compiled."""
    fabric = Fabric(accelerator="cpu", devices=1, strategy=DataParallelStrategy())
    counter = CountingBackend()
    net = Net()
    model = fabric.setup(torch.compile(net, backend=counter))
    assert isinstance(model._strategy_module, nn.DataParallel)
    assert model._forward_module._orig_mod is model._strategy_module
    x = torch.randn(2, 6)
    torch.testing.assert_close(model(x), net(x))
    assert counter.graphs >= 1 and sorted(model.state_dict()) == sorted(net.state_dict())


def test_compiled_module_without_settings_to_reapply(fabric: Fabric) -> None:
    compiled = torch.compile(Net(), backend="eager")
    object.__setattr__(compiled, "dynamo_ctx", None)  # what a torch without OptimizedModule.dynamo_ctx looks like
    with pytest.raises(RuntimeError, match="_reapply_compile=False"):
        unwrap_compiled(compiled)
    with pytest.raises(RuntimeError, match="_reapply_compile=False"):
        fabric.setup(compiled)
    model = fabric.setup(compiled, _reapply_compile=False)  # the way out the message names
    assert model.module is compiled
