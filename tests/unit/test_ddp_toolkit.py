"""The DDP toolkit in this process: DDP arguments, strategy aliases, hook settings, backward sync, sync batchnorm.

The strategy's validation (every bad argument is refused with the fix), the registry's ``find_unused_parameters``
aliases, the arguments that reach ``DistributedDataParallel`` (mocked), pickling a hook state for spawn,
``no_backward_sync``'s module check, and the CPU sync batchnorm layer alone: a plain BatchNorm without a process
group, converted in place with its parameters and state dict keys.

The checks that start processes are in tests/distributed/test_ddp_toolkit.py.
"""

from __future__ import annotations

import functools
import pickle
from typing import Any
from unittest import mock

import pytest
import torch
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, post_localSGD_hook, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from fabric_lite import Fabric
from fabric_lite.strategies import STRATEGY_REGISTRY, DDPStrategy
from fabric_lite.strategies._sync_batchnorm import CPUSyncBatchNorm, convert_sync_batchnorm
from fabric_lite.strategies.ddp import _DDPBackwardSyncControl

# ---------------------------------------------------------------------------------------------- unit: arguments
ALIASES = {
    "ddp_find_unused_parameters_true": ("popen", True),
    "ddp_find_unused_parameters_false": ("popen", False),
    "ddp_spawn_find_unused_parameters_true": ("spawn", True),
    "ddp_spawn_find_unused_parameters_false": ("spawn", False),
    "ddp_fork_find_unused_parameters_true": ("fork", True),
    "ddp_fork_find_unused_parameters_false": ("fork", False),
    "ddp_notebook_find_unused_parameters_true": ("fork", True),
    "ddp_notebook_find_unused_parameters_false": ("fork", False),
}


@pytest.mark.parametrize("name", list(ALIASES))
def test_find_unused_parameters_aliases(name: str) -> None:
    start_method, find_unused = ALIASES[name]
    assert STRATEGY_REGISTRY[name].start_method == start_method
    strategy = Fabric(accelerator="cpu", devices=2, strategy=name).strategy
    assert isinstance(strategy, DDPStrategy)
    assert strategy.start_method == start_method
    assert strategy.ddp_kwargs == {"find_unused_parameters": find_unused}


def test_ddp_arguments_pass_through_and_find_unused_parameters_is_left_to_ddp() -> None:
    # DDP's own default (False) applies: the strategy adds nothing of its own, as in Lightning; the job's
    # "default_find_unused_parameters" (test_ddp_arguments_reach_distributed_data_parallel) checks the built DDP
    assert DDPStrategy().ddp_kwargs == {}
    strategy = DDPStrategy(bucket_cap_mb=5, static_graph=True, gradient_as_bucket_view=True)
    assert strategy.ddp_kwargs == {"bucket_cap_mb": 5, "static_graph": True, "gradient_as_bucket_view": True}
    assert DDPStrategy(find_unused_parameters=True).ddp_kwargs == {"find_unused_parameters": True}


def test_setup_module_passes_ddp_only_the_module_the_device_and_the_given_arguments(monkeypatch) -> None:
    ddp = mock.Mock()
    monkeypatch.setattr("fabric_lite.strategies.ddp.DistributedDataParallel", ddp)
    module = nn.Linear(1, 1)
    DDPStrategy(parallel_devices=[torch.device("cpu")] * 2).setup_module(module)
    ddp.assert_called_once_with(module=module, device_ids=None)
    DDPStrategy(parallel_devices=[torch.device("cpu")] * 2, find_unused_parameters=True).setup_module(module)
    ddp.assert_called_with(module=module, device_ids=None, find_unused_parameters=True)


@pytest.mark.parametrize(
    ("backend", "device", "expected"), [(None, "cpu", "gloo"), (None, "cuda:0", "nccl"), ("foo", "cuda:0", "foo")]
)
def test_process_group_backend_under_lightnings_name_too(backend: str | None, device: str, expected: str) -> None:
    strategy = DDPStrategy(parallel_devices=[torch.device(device)], process_group_backend=backend)
    assert strategy.process_group_backend == strategy._get_process_group_backend() == expected


def test_unknown_ddp_argument_is_refused_with_the_accepted_names() -> None:
    with pytest.raises(TypeError, match=r"\['find_unused_parameter'\]") as info:
        DDPStrategy(find_unused_parameter=True)
    assert "find_unused_parameters" in str(info.value) and "bucket_cap_mb" in str(info.value)
    with pytest.raises(TypeError, match="set by the strategy itself"):
        DDPStrategy(device_ids=[0])


def _post_local_state() -> Any:
    return post_localSGD_hook.PostLocalSGDState(process_group=None, subgroup=None, start_localSGD_iter=4)


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"ddp_comm_state": object()}, ValueError, "ddp_comm_state but no ddp_comm_hook"),
        (
            {"ddp_comm_wrapper": default_hooks.fp16_compress_wrapper},
            ValueError,
            "ddp_comm_wrapper but no ddp_comm_hook",
        ),
        ({"ddp_comm_hook": "fp16"}, TypeError, "must be a callable hook"),
        (
            {"ddp_comm_hook": default_hooks.allreduce_hook, "ddp_comm_wrapper": 3},
            TypeError,
            "must be a callable wrapper",
        ),
        ({"sync_batchnorm": "yes"}, TypeError, "sync_batchnorm='yes'"),
        (
            {"ddp_comm_state": "STATE", "ddp_comm_hook": post_localSGD_hook.post_localSGD_hook},
            ValueError,
            "needs DDPStrategy\\(model_averaging_period=N\\)",
        ),
        (
            {"ddp_comm_hook": default_hooks.fp16_compress_hook, "model_averaging_period": 4},
            ValueError,
            "only applies to post-local SGD",
        ),
        (
            {
                "ddp_comm_state": "STATE",
                "ddp_comm_hook": post_localSGD_hook.post_localSGD_hook,
                "model_averaging_period": 0,
            },
            ValueError,
            "at least 1",
        ),
    ],
    ids=[
        "state-without-hook",
        "wrapper-without-hook",
        "hook-not-callable",
        "wrapper-not-callable",
        "sync-batchnorm-not-bool",
        "post-local-without-period",
        "period-without-post-local",
        "period-zero",
    ],
)
def test_strategy_argument_errors(kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    if kwargs.get("ddp_comm_state") == "STATE":
        kwargs = {**kwargs, "ddp_comm_state": _post_local_state()}
    with pytest.raises(error, match=match):
        DDPStrategy(**kwargs)


def test_hook_arguments_are_kept() -> None:
    factory = functools.partial(powerSGD_hook.PowerSGDState, process_group=None, start_powerSGD_iter=2)
    strategy = DDPStrategy(
        ddp_comm_state=factory,
        ddp_comm_hook=powerSGD_hook.powerSGD_hook,
        ddp_comm_wrapper=default_hooks.fp16_compress_wrapper,
    )
    assert "ddp_comm_hook='powerSGD_hook'" in repr(strategy)
    # a factory is only called at setup (after the process group exists): the period is checked then
    DDPStrategy(
        ddp_comm_state=_post_local_state, ddp_comm_hook=post_localSGD_hook.post_localSGD_hook, model_averaging_period=2
    )
    assert DDPStrategy(sync_batchnorm=True).sync_batchnorm


def test_block_backward_sync_needs_a_ddp_module() -> None:
    with (
        pytest.raises(TypeError, match=r"is wrapped in `DistributedDataParallel`\. Got: Linear"),
        DDPStrategy().block_backward_sync(nn.Linear(2, 2)),
    ):
        pass


def test_no_backward_sync_goes_through_lightnings_ddp_control() -> None:
    strategy = DDPStrategy()
    control = strategy._backward_sync_control
    assert isinstance(control, _DDPBackwardSyncControl)
    with pytest.raises(TypeError, match=r"is only possible if the module passed to .* is wrapped in"):
        strategy.no_backward_sync(nn.Linear(2, 2))
    module = mock.MagicMock(spec=DistributedDataParallel)
    with strategy.no_backward_sync(module, enabled=False):
        module.no_sync.assert_not_called()
    with strategy.no_backward_sync(module):
        module.no_sync.assert_called_once()


# ---------------------------------------------------------------------------------------------- unit: batchnorm
def test_cpu_sync_batchnorm_without_process_group_is_a_batchnorm() -> None:
    torch.manual_seed(0)
    plain = nn.BatchNorm1d(3, momentum=None)
    synced = convert_sync_batchnorm(nn.BatchNorm1d(3, momentum=None), "cpu")
    assert isinstance(synced, CPUSyncBatchNorm)
    for _ in range(2):
        x = torch.randn(5, 3)
        torch.testing.assert_close(synced(x), plain(x))
    torch.testing.assert_close(synced.running_var, plain.running_var)
    synced.eval(), plain.eval()
    x = torch.randn(4, 3)
    torch.testing.assert_close(synced(x), plain(x))


def test_conversion_keeps_parameters_buffers_and_state_dict_keys() -> None:
    model = nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3), nn.Sequential(nn.SyncBatchNorm(3)))
    model.eval()
    weight, running_mean, keys = model[1].weight, model[1].running_mean, list(model.state_dict())
    converted = convert_sync_batchnorm(model, "cpu")
    assert converted is model
    assert [type(m).__name__ for m in converted.modules() if "BatchNorm" in type(m).__name__] == [
        "CPUSyncBatchNorm"
    ] * 2
    assert converted[1].weight is weight and converted[1].running_mean is running_mean
    assert list(converted.state_dict()) == keys
    assert not converted[1].training  # the layer keeps its mode
    # off the CPU, torch's own SyncBatchNorm (the conversion itself needs no GPU)
    assert isinstance(convert_sync_batchnorm(nn.BatchNorm2d(3), "cuda"), nn.SyncBatchNorm)


def test_a_state_holding_a_process_group_cannot_be_pickled_for_spawn() -> None:
    state = powerSGD_hook.PowerSGDState(process_group=None, start_powerSGD_iter=2)
    strategy = DDPStrategy(start_method="spawn", ddp_comm_state=state, ddp_comm_hook=powerSGD_hook.powerSGD_hook)
    with pytest.raises(RuntimeError, match=r"functools\.partial\(PowerSGDState"):
        pickle.dumps(strategy)
    # a factory, or a post-local SGD state without groups, travels
    factory = functools.partial(powerSGD_hook.PowerSGDState, process_group=None, start_powerSGD_iter=2)
    pickle.dumps(DDPStrategy(ddp_comm_state=factory, ddp_comm_hook=powerSGD_hook.powerSGD_hook))
    pickle.dumps(
        DDPStrategy(
            ddp_comm_state=_post_local_state(),
            ddp_comm_hook=post_localSGD_hook.post_localSGD_hook,
            model_averaging_period=2,
        )
    )


def test_torch_sync_batchnorm_on_the_cpu_points_to_sync_batchnorm_true() -> None:
    strategy = DDPStrategy(parallel_devices=[torch.device("cpu")])
    model = nn.SyncBatchNorm.convert_sync_batchnorm(nn.Sequential(nn.Linear(2, 3), nn.BatchNorm1d(3)))
    with pytest.raises(ValueError, match=r"DDPStrategy\(sync_batchnorm=True\)"):
        strategy.setup_module(model)
