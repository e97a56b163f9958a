"""What ``FSDPStrategy``, ``ModelParallelStrategy`` and ``FSDPPrecision`` take from Lightning, checked in one process
(a one-rank gloo group where a ``ProcessGroup`` or FSDP1 itself is needed): every argument of Lightning's
FSDP1-shaped ``FSDPStrategy``, FSDP1's wrap policies, Lightning's views of the settings, Lightning's error types and
wording where its tests pin them, and strict loading of full state dicts. The arguments' effects on two ranks are in
tests/distributed/test_fsdp.py.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest.mock import Mock

import pytest
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    CPUOffloadPolicy,
    FullyShardedDataParallel,
    MixedPrecisionPolicy,
    ShardingStrategy,
)
from torch.distributed.fsdp import MixedPrecision as FSDP1MixedPrecision
from torch.distributed.fsdp.wrap import (
    CustomPolicy,
    ModuleWrapPolicy,
    size_based_auto_wrap_policy,
    transformer_auto_wrap_policy,
)

from fabric_lite.plugins import FSDPPrecision
from fabric_lite.plugins.io import TorchCheckpointIO
from fabric_lite.runtime.checkpoint import sharded
from fabric_lite.runtime.checkpoint.files import CheckpointError
from fabric_lite.strategies import FSDPStrategy, ModelParallelStrategy
from fabric_lite.strategies import model_parallel as model_parallel_module
from fabric_lite.strategies._fsdp_options import FSDP1_ARGUMENTS, mesh_from_process_group
from fabric_lite.strategies._fsdp_setup import apply_activation_checkpointing, wrap_targets
from fabric_lite.strategies._model_parallel_ops import MeshSizeError, mesh_shape
from fabric_lite.strategies.fsdp import _FSDPBackwardSyncControl, _is_sharded_checkpoint
from fabric_lite.strategies.model_parallel import _load_raw_module_state, _ParallelBackwardSyncControl
from tests.helpers.jobs.fsdp_jobs import Block, Net


def _identity(module: nn.Module, mesh: Any) -> nn.Module:
    return module


@pytest.fixture
def one_rank_group() -> Iterator[Any]:
    """A one-rank gloo world in this process (a ``ProcessGroup`` to pass, and what FSDP1 needs to wrap)."""
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    try:
        yield dist.group.WORLD
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------------------------- FSDP1's arguments
def test_litgpts_fsdp_strategy_is_accepted() -> None:
    """What ``litgpt finetune_full``/``finetune_adapter`` build with two devices."""
    strategy = FSDPStrategy(
        auto_wrap_policy={Block},
        activation_checkpointing_policy={Block},
        state_dict_type="full",
        limit_all_gathers=True,
        cpu_offload=False,
    )
    assert strategy.state_dict_type == "full" and strategy.cpu_offload == CPUOffload(offload_params=False)
    assert strategy._checkpointing == {Block} and strategy._auto_wrap_policy == {Block}


def _lightning_kwargs() -> dict[str, Any]:
    """FSDP1's ``FullyShardedDataParallel`` arguments that Lightning's ``FSDPStrategy`` passes through ``**kwargs``
    (those it does not set itself nor name), with FSDP1's defaults."""
    own = set(inspect.signature(FSDPStrategy).parameters)
    set_by_lightning = {"self", "module", "device_id", "cpu_offload", "mixed_precision", "sharding_strategy"}
    parameters = inspect.signature(FullyShardedDataParallel.__init__).parameters.values()
    return {p.name: p.default for p in parameters if p.name not in own | set_by_lightning}


def test_every_argument_lightning_passes_to_fsdp1_is_accepted() -> None:
    kwargs = _lightning_kwargs()
    assert set(kwargs) == set(FSDP1_ARGUMENTS)  # the list follows torch's FSDP1 signature
    for name, default in kwargs.items():
        FSDPStrategy(**{name: default})  # no TypeError
    FSDPStrategy(**kwargs)


def test_fsdp1_arguments_are_kept_as_fsdp2_uses_them() -> None:
    layer = nn.Linear(2, 2)
    weight = nn.Parameter(torch.ones(2))
    strategy = FSDPStrategy(
        sync_module_states=True,
        forward_prefetch=True,
        ignored_modules=[layer],
        ignored_states=[weight],
        limit_all_gathers=False,  # no effect: FSDP2 has no rate limiter
        use_orig_params=False,  # no effect: FSDP2 always keeps the original parameters
        backward_prefetch=None,  # no effect: FSDP2 always prefetches as BACKWARD_PRE
    )
    options = strategy._fsdp1
    assert options.sync_module_states and options.forward_prefetch and options.process_group is None
    assert options.ignored_params() == {layer.weight, layer.bias, weight}
    assert strategy._fully_shard_extra == {}  # nothing of FSDP1's reaches fully_shard as is
    assert strategy._fsdp_kwargs["use_orig_params"] is False  # Lightning's view: FSDP1's arguments as given
    assert FSDPStrategy()._fsdp_kwargs == {"use_orig_params": True}  # Lightning's default
    FSDPStrategy(backward_prefetch=BackwardPrefetch.BACKWARD_POST, shard_placement_fn=None)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        ({"limit_all_gathers": "yes"}, "limit_all_gathers='yes'): expected True or False"),
        ({"sync_module_states": 1}, "sync_module_states=1"),
        ({"backward_prefetch": "BACKWARD_PRE"}, "backward_prefetch='BACKWARD_PRE'): expected a"),
        ({"ignored_modules": nn.Linear(1, 1)}, "ignored_modules=Linear"),
        ({"ignored_modules": [torch.ones(1)]}, "expected an iterable of modules"),
        ({"ignored_states": [3]}, "expected an iterable of parameters or modules"),
        ({"process_group": "world"}, "process_group='world'): expected a torch.distributed.ProcessGroup"),
        ({"device_id": 0}, "unexpected keyword argument(s) ['device_id']"),
    ],
)
def test_fsdp1_argument_values_are_checked(kwargs: dict[str, Any], fragment: str) -> None:
    with pytest.raises(TypeError) as info:
        FSDPStrategy(**kwargs)
    assert fragment in str(info.value)


def test_process_group_is_made_into_the_mesh(one_rank_group: Any) -> None:
    assert FSDPStrategy(process_group=one_rank_group)._fsdp1.process_group is one_rank_group
    mesh = mesh_from_process_group(one_rank_group, "cpu")
    assert mesh.mesh_dim_names == ("shard",) and mesh.size() == 1
    pair = mesh_from_process_group((one_rank_group, one_rank_group), "cpu")
    assert pair.mesh_dim_names == ("replicate", "shard") and tuple(pair.shape) == (1, 1)


@pytest.mark.parametrize(
    ("kwargs", "fragment"),
    [
        (
            {"sharding_strategy": "HYBRID_SHARD", "device_mesh": (1, 1)},
            "`FSDPStrategy(process_group=..., device_mesh=...)` are mutually exclusive",
        ),
        ({"sharding_strategy": "HYBRID_SHARD"}, "a hybrid strategy takes a tuple of two groups"),
        ({"pair": True}, "a tuple of two groups needs sharding_strategy='HYBRID_SHARD'"),
        ({"sharding_strategy": "NO_SHARD"}, "use DDPStrategy(process_group=...)"),
    ],
)
def test_process_group_must_fit_the_sharding_strategy(
    one_rank_group: Any, kwargs: dict[str, Any], fragment: str
) -> None:
    kwargs = dict(kwargs)
    group = (one_rank_group, one_rank_group) if kwargs.pop("pair", False) else one_rank_group
    with pytest.raises(ValueError) as info:
        FSDPStrategy(process_group=group, **kwargs)
    assert fragment in str(info.value)


# ---------------------------------------------------------------------------------------------- FSDP1's policies
@pytest.mark.parametrize(
    "policy",
    [
        functools.partial(size_based_auto_wrap_policy, min_num_params=500),
        functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block}),
        ModuleWrapPolicy({Block, nn.LayerNorm}),
        CustomPolicy(lambda module: isinstance(module, nn.Linear)),
    ],
    ids=["size_based", "transformer", "module_wrap", "custom"],
)
def test_fsdp1_policies_choose_the_units_fsdp1_chooses(one_rank_group: Any, policy: Any) -> None:
    model = Net(depth=3)
    names = {id(m): name for name, m in model.named_modules()}
    ours = wrap_targets(model, FSDPStrategy(auto_wrap_policy=policy)._auto_wrap_policy)
    wrapped = FullyShardedDataParallel(Net(depth=3), auto_wrap_policy=policy, device_id=torch.device("cpu"))
    fsdp1 = [n.replace("_fsdp_wrapped_module.", "") for n, m in wrapped.named_modules() if isinstance(m, type(wrapped))]
    assert sorted(names[id(m)] for m in ours) == sorted(name for name in fsdp1 if name)
    for position, unit in enumerate(ours):  # children before the units that hold them, as fully_shard needs
        assert all(ours.index(m) < position for m in unit.modules() if m is not unit and m in ours)


def test_activation_checkpointing_takes_fsdp1_policies() -> None:
    strategy = FSDPStrategy(activation_checkpointing_policy=ModuleWrapPolicy({Block}))
    assert apply_activation_checkpointing(Net(depth=3), strategy._checkpointing) == 3
    size_based = functools.partial(size_based_auto_wrap_policy, min_num_params=1000)
    assert (
        apply_activation_checkpointing(
            Net(depth=2), FSDPStrategy(activation_checkpointing_policy=size_based)._checkpointing
        )
        == 2
    )
    with pytest.raises(TypeError, match=r"activation_checkpointing_policy=\[<class 'int'>\]"):
        FSDPStrategy(activation_checkpointing_policy=[int])


# ---------------------------------------------------------------------------------------------- Lightning's views
def test_settings_read_as_lightning_shows_them() -> None:
    assert FSDPStrategy().sharding_strategy == ShardingStrategy.FULL_SHARD
    assert FSDPStrategy(sharding_strategy="no_shard").sharding_strategy == ShardingStrategy.NO_SHARD
    assert FSDPStrategy(sharding_strategy="_HYBRID_SHARD_ZERO2").sharding_strategy.name == "_HYBRID_SHARD_ZERO2"
    assert FSDPStrategy(cpu_offload=True).cpu_offload == CPUOffload(offload_params=True)
    assert FSDPStrategy(cpu_offload=CPUOffload()).cpu_offload == CPUOffload()
    policy = CPUOffloadPolicy(pin_memory=False)
    assert FSDPStrategy(cpu_offload=policy).cpu_offload is policy
    config = FSDP1MixedPrecision()
    strategy = FSDPStrategy(mixed_precision=config)
    assert strategy.mixed_precision_config is config  # as given; fully_shard gets the policy
    assert isinstance(strategy.mixed_precision, MixedPrecisionPolicy)
    plain = FSDPStrategy(precision=FSDPPrecision("bf16-mixed"))
    assert plain.mixed_precision_config == FSDP1MixedPrecision(torch.bfloat16, torch.bfloat16, torch.bfloat16)
    assert plain.mixed_precision == MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.bfloat16)


def test_backward_sync_controls_have_lightnings_names() -> None:
    strategy = FSDPStrategy()
    assert isinstance(strategy._backward_sync_control, _FSDPBackwardSyncControl)
    with pytest.raises(TypeError, match=r"only possible if the module passed to `FSDPStrategy.no_backward_sync`"):
        strategy._backward_sync_control.no_backward_sync(nn.Linear(2, 2), True)
    control = ModelParallelStrategy(_identity)._backward_sync_control
    assert isinstance(control, _ParallelBackwardSyncControl)


def test_clip_gradients_refuses_a_module_that_is_not_sharded() -> None:
    module = nn.Linear(2, 2)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    with pytest.raises(TypeError) as info:
        FSDPStrategy().clip_gradients_norm(module, optimizer, max_norm=1.0)
    message = str(info.value)
    assert "Gradient clipping with FSDP is only possible if the module passed to" in message
    assert "`FSDPStrategy.clip_gradients_norm` is sharded by it" in message and "Got: Linear" in message


def test_checkpoint_io_is_refused_in_lightnings_words() -> None:
    for strategy in (FSDPStrategy(), ModelParallelStrategy(_identity)):
        with pytest.raises(NotImplementedError, match="does not use the `CheckpointIO` plugin interface"):
            _ = strategy.checkpoint_io
        with pytest.raises(NotImplementedError, match="does not support setting a `CheckpointIO` plugin"):
            strategy.checkpoint_io = TorchCheckpointIO()


def test_storage_options_for_a_local_path_are_refused(tmp_path: Path) -> None:
    for strategy in (FSDPStrategy(), ModelParallelStrategy(_identity)):
        with pytest.raises(TypeError) as info:
            strategy.save_checkpoint(tmp_path / "ckpt", {}, storage_options={"anon": True})
        name = type(strategy).__name__
        assert f"`{name}.save_checkpoint(..., storage_options=...)` is not supported for the local path" in str(
            info.value
        )
        assert "{'anon': True}" in str(info.value)


# ---------------------------------------------------------------------------------------------- checkpoints
def test_is_sharded_checkpoint(tmp_path: Path) -> None:
    (tmp_path / "file.pt").touch()
    for name, marker in (("dcp", ".metadata"), ("lightning", "meta.pt"), ("other", "notes.txt")):
        (tmp_path / name).mkdir()
        (tmp_path / name / marker).touch()
    assert _is_sharded_checkpoint(tmp_path / "dcp") and _is_sharded_checkpoint(tmp_path / "lightning")
    assert not _is_sharded_checkpoint(tmp_path / "other") and not _is_sharded_checkpoint(tmp_path / "file.pt")
    assert not _is_sharded_checkpoint(tmp_path / "missing")


@pytest.mark.parametrize("strategy", [FSDPStrategy, functools.partial(ModelParallelStrategy, _identity)])
def test_a_folder_without_a_checkpoint_is_refused_naming_it(tmp_path: Path, strategy: Any) -> None:
    folder = tmp_path / "empty"
    folder.mkdir()
    with pytest.raises(sharded.NotACheckpointError) as info:
        strategy().load_checkpoint(folder, {"model": nn.Linear(2, 2)})
    assert isinstance(info.value, ValueError) and isinstance(info.value, CheckpointError)
    assert f"The path {str(folder)!r} does not point to a valid checkpoint" in str(info.value)
    with pytest.raises(ValueError, match="The given path must be a single file containing the full state dict, or a"):
        strategy().load_checkpoint(folder, nn.Linear(2, 2))


def test_strict_full_state_dict_loads_name_what_differs(tmp_path: Path) -> None:
    """torch's ``set_model_state_dict`` keeps a missing entry's current value silently when given a full state dict;
    a strict load raises instead, as Lightning's does."""
    path = tmp_path / "full.pt"
    torch.save({"model": {"weight": torch.zeros(2, 2)}, "step": 3}, path)
    module = nn.Linear(2, 2)
    with pytest.raises(KeyError, match=r"missing from the checkpoint \['bias'\], not in the module \[\]"):
        FSDPStrategy().load_checkpoint(path, {"model": module})
    with pytest.raises(KeyError, match=r"missing from the checkpoint \['bias'\]"):
        _load_raw_module_state({"weight": torch.zeros(2, 2)}, module)
    with pytest.raises(KeyError, match=r"not in the module \['extra'\]"):
        _load_raw_module_state({**module.state_dict(), "extra": torch.ones(1)}, module)
    remainder = FSDPStrategy().load_checkpoint(path, {"model": module}, strict=False)
    assert remainder == {"step": 3} and torch.equal(module.weight, torch.zeros(2, 2))
    bias = module.bias.detach().clone()
    _load_raw_module_state({"weight": torch.ones(2, 2)}, module, strict=False)
    assert torch.equal(module.weight, torch.ones(2, 2)) and torch.equal(module.bias, bias)


# ---------------------------------------------------------------------------------------------- setup(model, optimizer)
def test_joint_setup_points_the_optimizer_at_the_sharded_parameters(one_rank_group: Any) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor

    model = Net()
    optimizer = torch.optim.SGD([{"params": model.inp.parameters()}, {"params": model.blocks.parameters()}], lr=0.1)
    strategy = FSDPStrategy(parallel_devices=[torch.device("cpu")])
    strategy._device_mesh = init_device_mesh("cpu", (1,))
    module, [same], _ = strategy.setup_module_and_optimizers(model, [optimizer])
    assert module is model and same is optimizer
    held = [p for group in optimizer.param_groups for p in group["params"]]
    assert all(isinstance(p, DTensor) for p in held)
    sharded = dict(model.named_parameters())
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(sharded["inp.weight"]), id(sharded["inp.bias"])]
    assert len(optimizer.param_groups[1]["params"]) == len(list(model.blocks.parameters()))
    assert strategy.setup_optimizer(optimizer) is optimizer  # the ownership check agrees


def test_joint_setup_with_use_orig_params_false_is_refused_in_lightnings_words() -> None:
    model = nn.Linear(2, 2)
    weight = model.weight
    with pytest.raises(ValueError, match=r"`FSDPStrategy\(use_orig_params=False\)` but this is not supported"):
        FSDPStrategy(use_orig_params=False).setup_module_and_optimizers(model, [torch.optim.SGD([weight], lr=0.1)])
    assert model.weight is weight  # refused before anything was sharded


class _Replaced(nn.Module):
    """Stands for a sharded module: ``replace()`` swaps every parameter for a new one of the same name, as
    ``fully_shard`` and ``parallelize_module`` do."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(2, 2)
        self.b = nn.Linear(2, 2)

    def replace(self) -> None:
        for module in (self.a, self.b):
            for name, param in list(module.named_parameters(recurse=False)):
                setattr(module, name, nn.Parameter(param.detach() + 1))


def test_rebinding_replaces_each_parameter_by_name_in_place() -> None:
    from fabric_lite.strategies._fsdp_setup import optimizer_parameter_names, rebind_optimizer

    module = _Replaced()
    optimizer = torch.optim.LBFGS(module.parameters())  # keeps a reference to its group's list
    names = optimizer_parameter_names(module, [optimizer], "FSDPStrategy")
    module.replace()
    rebind_optimizer(optimizer, names, dict(module.named_parameters()))
    assert [id(p) for p in optimizer.param_groups[0]["params"]] == [id(p) for p in module.parameters()]
    assert optimizer._params is optimizer.param_groups[0]["params"]  # LBFGS sees the new parameters too


def test_rebinding_refuses_what_it_cannot_rebind() -> None:
    from fabric_lite.strategies._fsdp_setup import optimizer_parameter_names, rebind_optimizer

    module = _Replaced()
    stepped = torch.optim.Adam(module.parameters())
    module.a(torch.ones(1, 2)).sum().backward()
    stepped.step()
    with pytest.raises(ValueError, match=r"Adam optimizer passed to fabric.setup\(\) with FSDPStrategy already holds"):
        optimizer_parameter_names(module, [stepped], "FSDPStrategy")
    eager = torch.optim.Adagrad(module.parameters())  # creates its state when constructed
    with pytest.raises(ValueError, match="holds state for 4 parameter"):
        optimizer_parameter_names(module, [eager], "ModelParallelStrategy")
    foreign = torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1)
    with pytest.raises(ValueError, match=r"holds 1 parameter\(s\) that are not parameters of the _Replaced"):
        optimizer_parameter_names(module, [foreign], "FSDPStrategy")
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    names = optimizer_parameter_names(module, [optimizer], "FSDPStrategy")
    with pytest.raises(ValueError, match=r"updates the parameter 'a\.weight', which the set-up module no longer has"):
        rebind_optimizer(optimizer, names, {"renamed": torch.ones(1)})


# ---------------------------------------------------------------------------------------------- FSDPPrecision
def test_fsdp_precision_scaler_is_settable_and_used() -> None:
    precision = FSDPPrecision("16-mixed")
    scaler = Mock()
    scaler.scale = Mock(side_effect=lambda loss: loss * 2)
    precision.scaler = scaler
    assert precision.scaler is scaler
    loss = torch.tensor(1.5, requires_grad=True)
    precision.backward(loss, None)
    scaler.scale.assert_called_once_with(loss)
    assert loss.grad == 2.0
    optimizer = Mock()
    precision.optimizer_step(optimizer, closure=None)
    scaler.step.assert_called_once_with(optimizer, closure=None)
    scaler.update.assert_called_once()


def test_fsdp_precision_refuses_a_scaler_it_would_not_use() -> None:
    with pytest.raises(ValueError, match=r"`precision='bf16-mixed'` does not use a scaler, found scaler=<Mock"):
        FSDPPrecision("bf16-mixed", scaler=Mock())
    precision = FSDPPrecision("bf16-true")
    with pytest.raises(ValueError, match=r"`precision='bf16-true'` does not use a scaler"):
        precision.scaler = Mock()
    precision.scaler = None  # nothing to set
    assert precision.scaler is None
    with pytest.raises(ValueError, match=r"FSDPPrecision\(precision='64-true'\) is not supported in FSDP. `precision`"):
        FSDPPrecision("64-true")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("precision", "dtype"),
    [
        ("32-true", torch.float32),
        ("16-mixed", torch.float16),
        ("bf16-mixed", torch.bfloat16),
        ("16-true", torch.float16),
        ("bf16-true", torch.bfloat16),
    ],
)
def test_fsdp_precision_config_is_lightnings_and_fully_shard_follows_it(precision: str, dtype: torch.dtype) -> None:
    import warnings

    from fabric_lite.utilities.throughput import _plugin_to_compute_dtype

    plugin = FSDPPrecision(precision)  # type: ignore[arg-type]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        config = plugin.mixed_precision_config
    assert config == FSDP1MixedPrecision(param_dtype=dtype, reduce_dtype=dtype, buffer_dtype=dtype)
    assert [str(w.message).split(":")[0] for w in caught] == (
        [f"FSDP with `{precision}` enables computation in lower precision"]
        if precision.endswith("-true") and dtype is not torch.float32
        else []
    )
    policy = FSDPStrategy(precision=plugin).mixed_precision  # what fully_shard gets: gathered and reduced in dtype
    expected = (None, None) if dtype is torch.float32 else (dtype, dtype)
    assert (policy.param_dtype, policy.reduce_dtype) == expected
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert _plugin_to_compute_dtype(plugin) == dtype  # the throughput monitor counts FLOPs of the compute dtype


# ---------------------------------------------------------------------------------------------- ModelParallelStrategy
def test_mesh_sizes_that_do_not_multiply_raise_value_and_runtime_error() -> None:
    with pytest.raises(MeshSizeError) as info:
        mesh_shape(2, 3, 1, 4, 1)
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    assert "multiplied should equal the world size (4 = 1 node(s) x 4 device(s)), not 6" in str(info.value)


def test_mesh_shape_follows_the_configured_world(monkeypatch: pytest.MonkeyPatch) -> None:
    """The sizes are checked against ``num_nodes`` x the devices of a node, before any process group exists; the
    mesh is built by ``_setup_device_mesh`` (Lightning's name for the step)."""
    strategy = ModelParallelStrategy(_identity, data_parallel_size=2, tensor_parallel_size=4)
    strategy.parallel_devices = [torch.device("cpu")] * 4
    strategy.num_nodes = 2
    assert strategy.mesh_shape == (2, 4)
    built = []
    monkeypatch.setattr(model_parallel_module, "_setup_device_mesh", lambda shape, device: built.append(shape))
    strategy._build_mesh()
    assert built == [(2, 4)]
    strategy.num_nodes = 3
    with pytest.raises(
        RuntimeError,
        match=r"data_parallel_size \(2\) and tensor_parallel_size \(4\) multiplied should equal the world size \(12",
    ):
        strategy._build_mesh()


def test_model_parallel_refuses_fsdp1_modules_and_an_early_mesh() -> None:
    module = Mock(modules=Mock(return_value=[Mock(spec=FullyShardedDataParallel)]))
    with pytest.raises(TypeError, match=r"only supports the new FSDP2 APIs in PyTorch >= 2\.4"):
        ModelParallelStrategy(_identity).setup_module(module)
    with pytest.raises(RuntimeError, match="Accessing the device mesh before the processes have initialized"):
        _ = ModelParallelStrategy(_identity).device_mesh
