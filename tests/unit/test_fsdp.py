"""FSDPStrategy checks that start no process: argument validation, the strategy names, the mixed-precision table,
the wrap policy, and recognising sharded checkpoint folders.

The checks on real gloo process groups are in tests/distributed/test_fsdp.py.
"""

from __future__ import annotations

import warnings
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.distributed.fsdp import CPUOffload, CPUOffloadPolicy, MixedPrecisionPolicy, ShardingStrategy
from torch.distributed.fsdp import MixedPrecision as FSDP1MixedPrecision

from fabric_lite import Fabric
from fabric_lite.plugins.precision.fsdp import mixed_precision_policy
from fabric_lite.runtime.checkpoint.folders import check_sharded_checkpoint
from fabric_lite.strategies import FSDPStrategy
from fabric_lite.strategies._fsdp_options import mesh_shape
from fabric_lite.strategies._fsdp_setup import wrap_targets
from fabric_lite.utilities import CheckpointError, consolidate_checkpoint
from fabric_lite.utilities.rank_zero import LightningDeprecationWarning
from tests.helpers.jobs.fsdp_jobs import Block, Net


# ---------------------------------------------------------------------------------------------- arguments
@pytest.mark.parametrize(
    ("kwargs", "error", "fragment"),
    [
        ({"state_dict_type": "shards"}, ValueError, "state_dict_type='shards'"),
        ({"start_method": "thread"}, ValueError, "start_method='thread'"),
        ({"auto_wrap_policy": 0}, ValueError, "auto_wrap_policy=0"),
        ({"auto_wrap_policy": True}, TypeError, "auto_wrap_policy=True"),
        ({"auto_wrap_policy": "Block"}, TypeError, "auto_wrap_policy='Block'"),
        ({"auto_wrap_policy": [nn.Linear, 3]}, TypeError, "set of nn.Module subclasses"),
        ({"activation_checkpointing_policy": [int]}, TypeError, "activation_checkpointing_policy"),
        ({"reshard_after_forward": "yes"}, TypeError, "reshard_after_forward='yes'"),
        ({"cpu_offload": "yes"}, TypeError, "cpu_offload='yes'"),
        ({"mixed_precision": "bf16"}, TypeError, "MixedPrecisionPolicy"),
        ({"param_init_fn": 3}, TypeError, "param_init_fn=3"),
        ({"sharding_strategy": "FULL"}, ValueError, "sharding_strategy='FULL'"),
        (
            {"sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": True},
            ValueError,
            "reshard_after_forward=True",
        ),
        ({"device_mesh": (2, 2)}, ValueError, "HYBRID_SHARD"),
        ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": (2, 0)}, TypeError, "device_mesh=(2, 0)"),
        ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": [2, 2]}, TypeError, "device_mesh=[2, 2]"),
        ({"sharding_strategy": "NO_SHARD", "device_mesh": (2, 1)}, ValueError, "NO_SHARD takes none"),
        ({"activation_checkpointing": Block, "activation_checkpointing_policy": {Block}}, ValueError, "both"),
        ({"activation_checkpointing": "Block"}, TypeError, "activation_checkpointing='Block'"),
        ({"timeout": 5}, TypeError, "timedelta"),
    ],
)
def test_bad_arguments_raise_naming_the_value(kwargs: dict[str, Any], error: type, fragment: str) -> None:
    with pytest.raises(error) as info:
        FSDPStrategy(**kwargs)
    assert fragment in str(info.value)


def test_state_dict_type_is_settable_and_checked() -> None:
    strategy = FSDPStrategy()
    strategy.state_dict_type = "full"
    assert strategy.state_dict_type == "full"
    with pytest.raises(ValueError, match="'sharded', 'full'"):
        strategy.state_dict_type = "both"


def test_accepted_policies() -> None:
    assert FSDPStrategy(auto_wrap_policy=Block)._auto_wrap_policy == {Block}
    assert FSDPStrategy(auto_wrap_policy=[Block, nn.Linear])._auto_wrap_policy == {Block, nn.Linear}
    assert FSDPStrategy(auto_wrap_policy=10_000)._auto_wrap_policy == 10_000
    FSDPStrategy(shard_placement_fn=None, cpu_offload=True, reshard_after_forward=False)  # passed to fully_shard


# Lightning's (FSDP1-shaped) arguments, mapped onto fully_shard
def test_lightning_positional_order_is_accepted() -> None:
    strategy = FSDPStrategy(
        None, None, None, None, "gloo", timedelta(seconds=5), True, None, {Block}, None, {Block}, "SHARD_GRAD_OP",
        "full", None,
    )  # fmt: skip
    assert strategy._cpu_offload is True and strategy._auto_wrap_policy == {Block}
    assert strategy._checkpointing == {Block} and strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert strategy.state_dict_type == "full" and strategy._reshard_after_forward is False


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, False), (False, False), (True, True), (CPUOffload(), False), (CPUOffload(offload_params=True), True)],
)
def test_cpu_offload_accepts_none_and_fsdp1_objects(value: Any, expected: bool) -> None:
    assert FSDPStrategy(cpu_offload=value)._cpu_offload is expected
    policy = CPUOffloadPolicy(pin_memory=False)
    assert FSDPStrategy(cpu_offload=policy)._cpu_offload is policy


def test_fsdp1_mixed_precision_maps_to_a_policy_and_warns_about_what_is_dropped() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # nothing is dropped: no warning
        policy = FSDPStrategy(mixed_precision=FSDP1MixedPrecision(torch.bfloat16, torch.float32)).mixed_precision
    assert policy == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    mp = FSDP1MixedPrecision(param_dtype=torch.float16, buffer_dtype=torch.float16, keep_low_precision_grads=True)
    with pytest.warns(UserWarning, match=r"buffer_dtype=torch.float16, keep_low_precision_grads=True") as record:
        policy = FSDPStrategy(mixed_precision=mp).mixed_precision
    assert record[0].filename == __file__  # points at the FSDPStrategy(...) call
    assert policy == MixedPrecisionPolicy(param_dtype=torch.float16, reduce_dtype=None, cast_forward_inputs=True)
    no_cast = FSDP1MixedPrecision(param_dtype=torch.float16, cast_root_forward_inputs=False)
    assert FSDPStrategy(mixed_precision=no_cast).mixed_precision.cast_forward_inputs is False
    given = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    assert FSDPStrategy(mixed_precision=given).mixed_precision is given


@pytest.mark.parametrize(("value", "classes"), [(Block, {Block}), ([Block, nn.Linear], {Block, nn.Linear})])
def test_deprecated_activation_checkpointing_warns_as_lightning_does(value: Any, classes: set[type]) -> None:
    expected = (
        f"`FSDPStrategy(activation_checkpointing={value})` is deprecated, use"
        f" `FSDPStrategy(activation_checkpointing_policy={set(classes)})` instead."
    )
    with pytest.warns(LightningDeprecationWarning) as record:
        strategy = FSDPStrategy(activation_checkpointing=value)
    assert [str(w.message) for w in record] == [expected] and record[0].filename == __file__
    assert strategy._checkpointing == classes


@pytest.mark.parametrize(
    ("sharding_strategy", "reshard_after_forward", "name", "reshard"),
    [
        ("FULL_SHARD", None, "FULL_SHARD", None),  # torch's default: every unit but the root, as FSDP1
        ("full_shard", True, "FULL_SHARD", True),
        ("FULL_SHARD", False, "FULL_SHARD", False),
        ("Shard_Grad_Op", None, "SHARD_GRAD_OP", False),
        ("SHARD_GRAD_OP", False, "SHARD_GRAD_OP", False),
        ("NO_SHARD", None, "NO_SHARD", False),
        ("hybrid_shard", None, "HYBRID_SHARD", None),
        ("_HYBRID_SHARD_ZERO2", None, "_HYBRID_SHARD_ZERO2", False),
        (ShardingStrategy.SHARD_GRAD_OP, None, "SHARD_GRAD_OP", False),
        (ShardingStrategy.HYBRID_SHARD, None, "HYBRID_SHARD", None),
    ],
)
def test_sharding_strategy_maps_to_reshard_after_forward(
    sharding_strategy: Any, reshard_after_forward: bool | None, name: str, reshard: bool | None
) -> None:
    strategy = FSDPStrategy(sharding_strategy=sharding_strategy, reshard_after_forward=reshard_after_forward)
    assert strategy.sharding_strategy == ShardingStrategy[name]  # Lightning's attribute: FSDP1's enum member
    assert strategy._reshard_after_forward is reshard


@pytest.mark.parametrize("name", ["SHARD_GRAD_OP", "_HYBRID_SHARD_ZERO2", "NO_SHARD"])
def test_keeping_parameters_gathered_conflicts_with_resharding(name: str) -> None:
    with pytest.raises(ValueError, match=rf"sharding_strategy='{name}', reshard_after_forward=True\) conflict"):
        FSDPStrategy(sharding_strategy=name, reshard_after_forward=True)


@pytest.mark.parametrize(
    ("name", "device_mesh", "world_size", "num_nodes", "shape"),
    [
        ("FULL_SHARD", None, 4, 1, (4,)),
        ("SHARD_GRAD_OP", None, 4, 2, (4,)),
        ("NO_SHARD", None, 3, 1, (3, 1)),
        ("HYBRID_SHARD", None, 8, 2, (2, 4)),
        ("HYBRID_SHARD", (2, 2), 4, 1, (2, 2)),
        ("_HYBRID_SHARD_ZERO2", (4, 1), 4, 1, (4, 1)),
    ],
)
def test_mesh_shapes(
    name: str, device_mesh: tuple[int, int] | None, world_size: int, num_nodes: int, shape: tuple[int, ...]
) -> None:
    assert mesh_shape(name, device_mesh, world_size, num_nodes) == shape


def test_mesh_sizes_must_cover_the_world() -> None:
    with pytest.raises(ValueError, match=r"device_mesh=\(2, 3\)\): 2 x 3 = 6 devices, but the world size is 4"):
        mesh_shape("HYBRID_SHARD", (2, 3), world_size=4, num_nodes=1)
    with pytest.raises(ValueError, match="world size 6 is not a multiple of num_nodes=4"):
        mesh_shape("HYBRID_SHARD", None, world_size=6, num_nodes=4)


@pytest.mark.parametrize(("name", "offload"), [("fsdp", False), ("fsdp_cpu_offload", True)])
def test_strategy_names_build_fsdp_with_the_script_launcher(name: str, offload: bool) -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy=name)
    strategy = fabric.strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.start_method == "popen" and type(strategy.launcher).__name__ == "SubprocessScriptLauncher"
    assert strategy.world_size == 2
    assert strategy._cpu_offload is offload


@pytest.mark.parametrize(
    ("precision", "param_dtype", "reduce_dtype"),
    [
        ("32-true", None, None),
        ("64-true", None, None),
        ("bf16-mixed", torch.bfloat16, torch.bfloat16),  # Lightning's FSDPPrecision: gradients reduced in bfloat16
        ("16-mixed", torch.float16, torch.float16),
        ("bf16-true", torch.bfloat16, torch.bfloat16),
        ("16-true", torch.float16, torch.float16),
    ],
)
def test_mixed_precision_policy_follows_precision(precision: str, param_dtype: Any, reduce_dtype: Any) -> None:
    policy = mixed_precision_policy(precision)
    assert (policy.param_dtype, policy.reduce_dtype) == (param_dtype, reduce_dtype)


def test_strategy_takes_its_policy_from_the_precision_plugin_unless_given_one() -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy

    from fabric_lite.plugins import FSDPPrecision

    assert FSDPStrategy(precision=FSDPPrecision("bf16-true")).mixed_precision.param_dtype == torch.bfloat16
    assert FSDPStrategy(precision=FSDPPrecision("bf16-mixed")).mixed_precision.reduce_dtype == torch.bfloat16
    assert FSDPStrategy().mixed_precision.param_dtype is None
    given = MixedPrecisionPolicy(param_dtype=torch.float16)
    assert FSDPStrategy(precision=FSDPPrecision("bf16-true"), mixed_precision=given).mixed_precision is given


@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed", "16-true", "bf16-true"])
def test_fabric_runs_fsdp_precision_by_name(precision: str) -> None:
    from fabric_lite.plugins import FSDPPrecision

    fabric = Fabric(accelerator="cpu", devices=2, strategy="fsdp", precision=precision)  # type: ignore[arg-type]
    assert type(fabric.strategy.precision) is FSDPPrecision and fabric.strategy.precision.precision == precision
    user_instance = Fabric(accelerator="cpu", devices=2, strategy=FSDPStrategy(), precision=precision)  # type: ignore[arg-type]
    assert type(user_instance.strategy.precision) is FSDPPrecision


def test_other_precision_plugins_are_refused_in_lightnings_words() -> None:
    from fabric_lite.plugins import DoublePrecision, HalfPrecision, MixedPrecision

    with pytest.raises(TypeError, match=r"can only work with the `FSDPPrecision` plugin, found HalfPrecision"):
        FSDPStrategy(precision=HalfPrecision("bf16-true"))
    strategy = FSDPStrategy()
    with pytest.raises(TypeError, match=r"found MixedPrecision\(precision='bf16-mixed'\)"):
        strategy.precision = MixedPrecision("bf16-mixed", "cpu")
    with pytest.raises(ValueError, match=r"precision='64-true' is not supported with strategy='fsdp': FSDPPrecision"):
        Fabric(accelerator="cpu", devices=2, strategy="fsdp", plugins=[DoublePrecision()])  # refused by the plan
    with pytest.raises(ValueError, match=r"precision='64-true' is not supported with strategy='fsdp': FSDPPrecision"):
        Fabric(accelerator="cpu", devices=2, strategy="fsdp", precision="64-true")


def test_wrap_targets_children_first() -> None:
    model = Net(depth=2)
    assert wrap_targets(model, {Block}) == [model.blocks[1], model.blocks[0]]
    assert wrap_targets(model, lambda m: isinstance(m, nn.Linear) and m.out_features == 3) == [model.out]
    assert wrap_targets(model, None) == []
    # 1104 parameters per block: a block is a unit, its linears (544, 528) are not, and the root never is
    assert wrap_targets(model, 1000) == [model.blocks[0], model.blocks[1]]
    every = wrap_targets(model, 1)  # every module holding a parameter, and every container above them
    assert model not in every
    for position, unit in enumerate(every):
        inner = [m for m in unit.modules() if m is not unit and m in every]
        assert all(every.index(m) < position for m in inner)  # fully_shard must see the children first


def test_recognising_sharded_checkpoints(tmp_path: Path) -> None:
    plain = tmp_path / "plain.ckpt"
    torch.save({"model": {}}, plain)
    folder = tmp_path / "folder"
    folder.mkdir()
    (folder / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match="is a file") as info:
        check_sharded_checkpoint(plain)
    assert str(plain) in str(info.value)
    with pytest.raises(CheckpointError, match=r"not a sharded checkpoint.*holds notes.txt"):
        check_sharded_checkpoint(folder)
    (folder / ".metadata").write_bytes(b"")
    assert check_sharded_checkpoint(folder) == folder
    with pytest.raises(CheckpointError, match="one file of a sharded checkpoint, not the checkpoint: pass its folder"):
        check_sharded_checkpoint(folder / ".metadata")
    with pytest.raises(FileNotFoundError, match="missing"):
        check_sharded_checkpoint(tmp_path / "missing")
    with pytest.raises(CheckpointError, match="is a file") as info:
        consolidate_checkpoint(plain, tmp_path / "out.pt")  # a non-FSDP checkpoint cannot be consolidated
    assert not (tmp_path / "out.pt").exists()
