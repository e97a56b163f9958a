"""Plugins beyond precision, in this process: collectives (``fabric_lite.plugins.collectives``), checkpoint IO
(``fabric_lite.plugins.io`` and ``checkpoint_io=`` on the strategies) and ``FSDPPrecision``.

* Collectives: ``SingleDeviceCollective`` is an identity, ``Collective`` is abstract with Lightning's methods, and
  ``TorchCollective`` converts reduce ops, passes its lists to torch as given and needs the default group first.
* Checkpoint IO: ``TorchCheckpointIO`` keeps the safe save and load guarantees; a user's ``CheckpointIO``, given as a
  plugin or to the strategy, carries ``Fabric.save``/``load``; the strategies take ``checkpoint_io`` where
  Lightning's do, and FSDP refuses one.
* ``FSDPPrecision``: the mixed-precision policy, scaler and hooks of each precision name, and its use as a plugin.

The checks that start processes are in tests/distributed/test_collective_plugins.py.
"""

from __future__ import annotations

import inspect
import json
import os
import warnings
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins import CheckpointIO, FSDPPrecision, TorchCheckpointIO
from fabric_lite.plugins.collectives import Collective, SingleDeviceCollective, TorchCollective
from fabric_lite.runtime.checkpoint import CheckpointError
from fabric_lite.strategies import (
    DataParallelStrategy,
    DDPStrategy,
    FSDPStrategy,
    ParallelStrategy,
    SingleDeviceStrategy,
    Strategy,
)
from tests.helpers.scripts.checkpoint_io_plugins import JsonCheckpointIO


# ---------------------------------------------------------------------------------------------- collectives: unit
def test_single_device_collective_is_an_identity() -> None:
    c = SingleDeviceCollective()
    with pytest.raises(RuntimeError, match="`SingleDeviceCollective` does not own a group"):  # Lightning's words
        _ = c.group
    assert c.create_group() is c and c.group is not None
    t = torch.tensor([3.0])
    assert (c.rank, c.world_size) == (0, 1)
    assert c.broadcast(t, 0) is t and c.all_reduce(t, "sum") is t and c.reduce(t, 0, "max") is t
    assert c.all_gather([torch.zeros(1)], t) == [t] and c.gather(t, [], 0) == [t]
    parts = [torch.tensor([7.0])]
    assert c.scatter(torch.zeros(1), parts) is parts[0] and c.reduce_scatter(torch.zeros(1), parts) is parts[0]
    assert c.all_to_all([torch.zeros(1)], parts) is parts
    assert c.recv(t, 0) is t and c.send(t, 0) is None and c.barrier() is None
    assert SingleDeviceCollective.is_available() and SingleDeviceCollective.is_initialized()
    assert SingleDeviceCollective._convert_to_native_op("sum") == "sum"
    with pytest.raises(RuntimeError, match="`SingleDeviceCollective` already owns a group"):
        c.create_group()
    assert c.teardown() is c
    with pytest.raises(RuntimeError, match="`SingleDeviceCollective` does not own a group to destroy"):
        c.teardown()


def test_collective_is_abstract_with_lightnings_methods() -> None:
    with pytest.raises(TypeError):
        Collective()  # type: ignore[abstract]
    expected = {
        "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter", "reduce_scatter", "all_to_all",
        "send", "recv", "barrier", "is_available", "is_initialized", "init_group", "new_group", "destroy_group",
        "_convert_to_native_op", "rank", "world_size",
    }  # fmt: skip
    assert Collective.__abstractmethods__ == expected
    for name in ("broadcast_object_list", "gather_object", "scatter_object_list", "monitored_barrier"):
        assert callable(getattr(TorchCollective, name))


@pytest.mark.parametrize(
    ("op", "expected"),
    [
        ("sum", torch.distributed.ReduceOp.SUM),
        ("Max", torch.distributed.ReduceOp.MAX),
        ("avg", torch.distributed.ReduceOp.AVG),
        ("mean", torch.distributed.ReduceOp.AVG),
        ("prod", torch.distributed.ReduceOp.PRODUCT),
        ("product", torch.distributed.ReduceOp.PRODUCT),
        (torch.distributed.ReduceOp.MIN, torch.distributed.ReduceOp.MIN),
    ],
)
def test_torch_collective_converts_reduce_ops(op: Any, expected: Any) -> None:
    assert TorchCollective._convert_to_native_op(op) == expected


@pytest.mark.parametrize(
    ("op", "fragment"), [("median", "op 'MEDIAN' is not a member of `ReduceOp`"), (3, "Unsupported op 3 of type int")]
)
def test_torch_collective_rejects_unknown_ops(op: Any, fragment: str) -> None:
    with pytest.raises(ValueError, match=fragment):
        TorchCollective._convert_to_native_op(op)


@pytest.mark.parametrize(
    ("name", "kwargs"),
    [
        ("gather", {"tensor": torch.zeros(1), "gather_list": [torch.zeros(1)], "dst": 1}),
        ("scatter", {"tensor": torch.zeros(1), "scatter_list": [torch.zeros(1)], "src": 1}),
        ("gather_object", {"obj": 1, "object_gather_list": [None], "dst": 1}),
        (
            "scatter_object_list",
            {"scatter_object_output_list": [None], "scatter_object_input_list": [2], "src": 1},
        ),
    ],
)
def test_torch_collective_passes_the_lists_to_torch_as_given(name: str, kwargs: dict[str, Any]) -> None:
    """Whatever the rank: torch itself says that a non-destination rank must pass ``[]`` (as with Lightning's)."""
    collective = TorchCollective()
    collective._group = mock.sentinel.group  # no process group is needed: torch's calls are mocked, no rank asked
    with mock.patch(f"torch.distributed.{name}", autospec=True) as call:
        result = getattr(collective, name)(**kwargs)
    call.assert_called_once_with(**kwargs, group=collective.group)
    returned = {"gather": "gather_list", "gather_object": "object_gather_list"}.get(name)
    if returned is not None:
        assert result is kwargs[returned]


def test_torch_collective_create_group_needs_the_default_group() -> None:
    assert not torch.distributed.is_initialized()
    c = TorchCollective()
    with pytest.raises(ValueError, match=r"call collective.setup\(main_address=..."):
        c.create_group()
    assert c._group is None and not TorchCollective.manages_default_group


def tensor(values: list[Any]) -> list[Any]:
    return ["tensor", "torch.float32", values]


# ---------------------------------------------------------------------------------------------- checkpoint IO
def test_torch_checkpoint_io_round_trip_and_remove(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "sub" / "state.ckpt"
    io.save_checkpoint({"w": torch.arange(3.0), "step": 4}, path)
    loaded = io.load_checkpoint(path)
    assert torch.equal(loaded["w"], torch.arange(3.0)) and loaded["step"] == 4
    io.remove_checkpoint(path)
    assert not path.exists()
    io.remove_checkpoint(path)  # nothing there: no error
    folder = tmp_path / "folder"
    (folder / "inner").mkdir(parents=True)
    (folder / "inner" / "x").write_text("x")
    io.remove_checkpoint(folder)
    assert not folder.exists()


def test_torch_checkpoint_io_refuses_storage_options(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"storage_options=\{'compress': True\}.*CheckpointIO of your own"):
        TorchCheckpointIO().save_checkpoint({"a": 1}, tmp_path / "x.ckpt", storage_options={"compress": True})
    assert not (tmp_path / "x.ckpt").exists()


def test_torch_checkpoint_io_keeps_the_safe_guarantees(tmp_path: Path) -> None:
    io = TorchCheckpointIO()
    path = tmp_path / "state.ckpt"
    io.save_checkpoint({"step": 1}, path)
    with pytest.raises(CheckpointError):  # an unpicklable object: the previous file is kept, no temp file left
        io.save_checkpoint({"step": 2, "bad": lambda: None}, path)
    assert io.load_checkpoint(path) == {"step": 1} and os.listdir(tmp_path) == ["state.ckpt"]
    torch.save({"fn": Path("x")}, path)  # a Python object: refused unless weights_only=False
    with pytest.raises(CheckpointError, match="weights_only=True"):
        io.load_checkpoint(path)
    assert io.load_checkpoint(path, weights_only=False) == {"fn": Path("x")}
    with pytest.raises(FileNotFoundError):
        io.load_checkpoint(tmp_path / "missing.ckpt")


def test_checkpoint_io_is_abstract() -> None:
    with pytest.raises(TypeError):
        CheckpointIO()  # type: ignore[abstract]
    assert CheckpointIO.__abstractmethods__ == {"save_checkpoint", "load_checkpoint", "remove_checkpoint"}


@pytest.mark.parametrize(
    ("cls", "names"),
    [
        (Strategy, ["accelerator", "checkpoint_io", "precision"]),
        (SingleDeviceStrategy, ["device", "accelerator", "checkpoint_io", "precision"]),
        (ParallelStrategy, ["accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision"]),
        (DDPStrategy, ["accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision"]),
        (DataParallelStrategy, ["accelerator", "parallel_devices", "checkpoint_io", "precision"]),
    ],
)
def test_strategies_take_checkpoint_io_where_lightnings_do(cls: type, names: list[str]) -> None:
    assert list(inspect.signature(cls.__init__).parameters)[1 : len(names) + 1] == names


def test_fsdp_strategy_has_no_checkpoint_io_argument_as_in_lightning() -> None:
    params = list(inspect.signature(FSDPStrategy.__init__).parameters)
    assert "checkpoint_io" not in params
    assert params[1:5] == ["accelerator", "parallel_devices", "cluster_environment", "precision"]


def test_default_and_given_checkpoint_io() -> None:
    strategy = SingleDeviceStrategy()
    assert type(strategy.checkpoint_io) is TorchCheckpointIO
    assert strategy.checkpoint_io is strategy.checkpoint_io  # created once
    io = JsonCheckpointIO()
    assert SingleDeviceStrategy(checkpoint_io=io).checkpoint_io is io
    assert DDPStrategy(checkpoint_io=io).checkpoint_io is io
    strategy.checkpoint_io = io
    assert strategy.checkpoint_io is io
    with pytest.raises(TypeError, match=r"SingleDeviceStrategy\(checkpoint_io='file'\).*CheckpointIO"):
        SingleDeviceStrategy(checkpoint_io="file")  # type: ignore[arg-type]


def _save_and_load(fabric: Fabric, path: Path) -> tuple[dict[str, Any], bool]:
    torch.manual_seed(0)
    model = fabric.setup(nn.Linear(3, 2))
    fabric.save(path, {"model": model, "step": 7})
    restored = fabric.setup(nn.Linear(3, 2))
    remainder = fabric.load(path, {"model": restored})
    return remainder, all(torch.equal(a, b) for a, b in zip(model.parameters(), restored.parameters()))


@pytest.mark.parametrize("how", ["plugins", "strategy"])
def test_fabric_save_and_load_go_through_a_users_checkpoint_io(tmp_path: Path, how: str) -> None:
    io = JsonCheckpointIO()
    if how == "plugins":
        fabric = Fabric(accelerator="cpu", devices=1, plugins=[io])
    else:
        fabric = Fabric(accelerator="cpu", devices=1, strategy=SingleDeviceStrategy(checkpoint_io=io))
    assert fabric.strategy.checkpoint_io is io
    remainder, restored = _save_and_load(fabric, tmp_path / "state.json")
    assert remainder == {"step": 7} and restored
    assert io.calls == [["save", "state.json", ["model", "step"], None], ["load", "state.json", None]]
    saved = json.loads((tmp_path / "state.json").read_text())  # the plugin's own format, not torch.save
    assert saved["step"] == 7 and set(saved["model"]) == {"weight", "bias"}
    fabric.strategy.teardown()
    assert io.calls[-1] == ["teardown"]


def test_default_checkpoint_io_writes_torch_files(tmp_path: Path) -> None:
    fabric = Fabric(accelerator="cpu", devices=1)
    remainder, restored = _save_and_load(fabric, tmp_path / "state.ckpt")
    assert remainder == {"step": 7} and restored
    assert torch.load(tmp_path / "state.ckpt", weights_only=True)["step"] == 7


def test_checkpoint_io_given_twice_or_of_the_wrong_type() -> None:
    with pytest.raises(ValueError, match="both set the checkpoint IO: choose one"):
        Fabric(
            accelerator="cpu",
            plugins=[JsonCheckpointIO()],
            strategy=SingleDeviceStrategy(checkpoint_io=TorchCheckpointIO()),
        )
    with pytest.raises(ValueError, match=r"multiple values for CheckpointIO .*JsonCheckpointIO, TorchCheckpointIO"):
        Fabric(accelerator="cpu", plugins=[JsonCheckpointIO(), TorchCheckpointIO()])
    with pytest.raises(TypeError, match=r"fabric_lite\.plugins\.io\.CheckpointIO"):
        Fabric(accelerator="cpu", plugins=[object()])


def test_fsdp_refuses_a_checkpoint_io() -> None:
    strategy = FSDPStrategy()
    with pytest.raises(NotImplementedError, match="does not use the `CheckpointIO` plugin interface"):
        _ = strategy.checkpoint_io
    with pytest.raises(NotImplementedError, match=r"does not support setting a `CheckpointIO` plugin.*strategy='ddp'"):
        strategy.checkpoint_io = TorchCheckpointIO()
    with pytest.raises(NotImplementedError, match="does not support setting a `CheckpointIO` plugin"):
        Fabric(accelerator="cpu", devices=2, strategy="fsdp", plugins=[JsonCheckpointIO()])
    with pytest.raises(TypeError, match=r"storage_options=...\)` is not supported .*got storage_options=\{'a': 1\}"):
        strategy.save_checkpoint("x", {}, storage_options={"a": 1})
    strategy.teardown()  # the checkpoint IO it refuses is not asked to tear down


# ---------------------------------------------------------------------------------------------- FSDPPrecision
@pytest.mark.parametrize("precision", ["32-true", "16-true", "bf16-true", "16-mixed", "bf16-mixed"])
def test_fsdp_precision_gives_the_policy_and_hooks_of_the_precision_name(precision: str) -> None:
    from fabric_lite.plugins.precision.fsdp import mixed_precision_policy

    plugin = FSDPPrecision(precision)  # type: ignore[arg-type]
    assert plugin.precision == precision
    with warnings.catch_warnings():  # the true half precisions warn that everything computes in the half type
        warnings.simplefilter("ignore")
        config = plugin.mixed_precision_config
    policy = mixed_precision_policy(precision)
    applied = (policy.param_dtype or torch.float32, policy.reduce_dtype or torch.float32)
    assert (config.param_dtype, config.reduce_dtype) == applied
    assert FSDPStrategy(precision=plugin).mixed_precision == mixed_precision_policy(precision)
    assert (plugin.scaler is not None) == (precision == "16-mixed")
    module = plugin.convert_module(nn.Linear(2, 2))
    half = {"16": torch.float16, "bf16": torch.bfloat16}
    kind, _, mode = precision.partition("-")
    assert module.weight.dtype == (half[kind] if mode == "true" and kind in half else torch.float32)
    out = plugin.convert_input(torch.ones(1))
    assert out.dtype == half.get(kind, torch.float32)
    with plugin.forward_context():
        y = nn.Linear(2, 2)(torch.ones(1, 2))
    assert y.dtype == half.get(kind, torch.float32)
    assert plugin.requires_fabric_backward() == (precision == "16-mixed")


def test_fsdp_precision_16_mixed_uses_a_sharded_scaler_on_the_strategys_device() -> None:
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    plugin = FSDPPrecision("16-mixed")
    plugin._set_device_type("cpu")
    assert isinstance(plugin.scaler, ShardedGradScaler) and plugin.scaler._device == "cpu"
    given = ShardedGradScaler(device="cpu", init_scale=8.0)
    assert FSDPPrecision("16-mixed", scaler=given).scaler is given


@pytest.mark.parametrize(
    ("args", "error", "fragment"),
    [
        (("64-true",), ValueError, "FSDPPrecision(precision='64-true') is not supported"),
        (("bf16-mixed", object()), ValueError, "`precision='bf16-mixed'` does not use a scaler, found scaler=<object"),
    ],
)
def test_fsdp_precision_rejects(args: tuple[Any, ...], error: type, fragment: str) -> None:
    with pytest.raises(error, match=fragment.replace("(", r"\(").replace(")", r"\)")):
        FSDPPrecision(*args)


def test_fabric_accepts_fsdp_precision_as_a_plugin() -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="fsdp", plugins=[FSDPPrecision("bf16-mixed")])
    flag = Fabric(accelerator="cpu", devices=2, strategy="fsdp", precision="bf16-mixed")
    assert isinstance(fabric.strategy.precision, FSDPPrecision)
    assert fabric.strategy.mixed_precision == flag.strategy.mixed_precision  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="conflicts with the precision plugin FSDPPrecision"):
        Fabric(
            accelerator="cpu", devices=2, strategy="fsdp", precision="16-true", plugins=[FSDPPrecision("bf16-mixed")]
        )
