"""``fabric_lite.connector._Connector``: Lightning's connector as an adapter over the plan and the build step, which
must resolve every argument as ``Fabric(...)`` does; and ``utilities.registry``'s entry-point callbacks."""

from __future__ import annotations

import inspect
import warnings
from typing import Any
from unittest import mock

import pytest
import torch

from fabric_lite import Fabric, connector
from fabric_lite.accelerators import CPUAccelerator, CUDAAccelerator
from fabric_lite.accelerators import cuda as cuda_module
from fabric_lite.connector import _Connector, _is_using_cli
from fabric_lite.plugins.environments import LightningEnvironment, SLURMEnvironment
from fabric_lite.plugins.precision import DoublePrecision, MixedPrecision, Precision
from fabric_lite.strategies import DDPStrategy, SingleDeviceStrategy
from fabric_lite.utilities import registry


@pytest.mark.parametrize(
    "kwargs",
    [
        pytest.param({}, id="defaults"),
        pytest.param({"accelerator": "cpu", "devices": 2}, id="two-processes"),
        pytest.param({"strategy": "ddp_spawn", "devices": 3, "precision": "64-true"}, id="spawn-double"),
        pytest.param({"strategy": "DDP", "devices": 2, "num_nodes": 1}, id="upper-case-name"),
        pytest.param({"plugins": DoublePrecision()}, id="one-plugin-not-a-list"),
        pytest.param({"strategy": DDPStrategy(), "devices": 2}, id="instance"),
    ],
)
def test_the_connector_resolves_as_fabric_does(kwargs: dict[str, Any]) -> None:
    fabric = Fabric(**kwargs)
    resolved = _Connector(**kwargs)
    assert type(resolved.strategy) is type(fabric.strategy)
    assert type(resolved.accelerator) is type(fabric.accelerator)
    assert type(resolved.precision) is type(fabric.strategy.precision)
    assert resolved.precision.precision == fabric.strategy.precision.precision
    environment = getattr(fabric.strategy, "cluster_environment", None)
    assert environment is None or type(resolved.cluster_environment) is type(environment)
    devices = getattr(fabric.strategy, "parallel_devices", None) or [fabric.device]
    assert resolved._parallel_devices == devices
    assert resolved.strategy.start_method == fabric.strategy.start_method
    assert resolved._num_nodes_flag == 1 and resolved._accelerator_flag == "cpu"


def test_the_connector_flags() -> None:
    with pytest.warns(UserWarning) as record:
        resolved = _Connector(accelerator="cpu", strategy="ddp_fork", devices="2", precision=16)
    messages = [str(w.message) for w in record]
    assert (
        "`precision=16` is supported for historical reasons" in messages[0]
        and "Using `precision='bf16-mixed'`" in messages[1]
    )
    assert (resolved._strategy_flag, resolved._devices_flag, resolved._precision_input) == ("ddp_fork", 2, "bf16-mixed")
    assert isinstance(resolved.precision, MixedPrecision) and resolved.precision.device == "cpu"
    assert resolved.checkpoint_io is None
    instance = DDPStrategy()
    assert _Connector(strategy=instance, devices=2)._strategy_flag is instance


def test_the_connector_has_fabrics_defaults() -> None:
    ours = inspect.signature(_Connector).parameters
    fabric = inspect.signature(Fabric).parameters
    assert {name: p.default for name, p in ours.items()} == {name: fabric[name].default for name in ours}


def test_the_connector_warns_as_fabric_does() -> None:
    with pytest.warns(UserWarning, match="'dp' is not supported on CPUs, hence setting `strategy='ddp'`"):
        resolved = _Connector(accelerator="cpu", strategy="dp", devices=2)
    assert type(resolved.strategy) is DDPStrategy
    with pytest.warns(UserWarning, match="AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'`"):
        _Connector(accelerator="cpu", precision="16-mixed")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _Connector(accelerator="cpu", precision="bf16-mixed")


def test_lightnings_interactive_flag_makes_the_connector_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(connector, "_IS_INTERACTIVE", True)
    forked = _Connector(accelerator="cpu", devices=2)
    assert (forked._strategy_flag, forked.strategy.start_method) == ("ddp_fork", "fork")
    assert forked.strategy.launcher is not None and forked.strategy.launcher.is_interactive_compatible
    with pytest.raises(RuntimeError, match=r"`Fabric\(strategy='ddp'\)` is not compatible with an interactive"):
        _Connector(accelerator="cpu", strategy="ddp", devices=2)


def test_the_connector_reads_the_machine_through_lightnings_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cuda_module, "num_cuda_devices", lambda: 2)
    on_gpus = _Connector(accelerator="gpu", strategy="ddp", devices=-1)
    assert isinstance(on_gpus.accelerator, CUDAAccelerator) and on_gpus._accelerator_flag == "cuda"
    assert on_gpus._parallel_devices == [torch.device("cuda", 0), torch.device("cuda", 1)]
    assert on_gpus._devices_flag == [0, 1]
    with (
        mock.patch.object(torch.multiprocessing, "get_all_start_methods", return_value=["spawn"]),
        pytest.raises(ValueError, match="process forking is not supported on this platform"),
    ):
        _Connector(strategy="ddp_notebook")


def test_the_connector_keeps_a_strategys_own_parts() -> None:
    precision, environment = Precision(), LightningEnvironment()
    strategy = DDPStrategy(accelerator=CPUAccelerator(), precision=precision, cluster_environment=environment)
    resolved = _Connector(strategy=strategy, devices=2)
    assert resolved.strategy is strategy and resolved.precision is precision
    assert resolved.cluster_environment is environment and resolved.strategy.world_size == 2
    single = _Connector(strategy=SingleDeviceStrategy(device="cpu", accelerator=CPUAccelerator()))
    assert single._parallel_devices == [torch.device("cpu")]


def test_lightnings_cli_variables_through_the_connector(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LT_PRECISION", "64-true")
    monkeypatch.setenv("LT_DEVICES", "2")
    assert not _is_using_cli()
    resolved = _Connector(accelerator="cpu")
    assert isinstance(resolved.precision, DoublePrecision) and resolved._devices_flag == 2
    monkeypatch.setenv("LT_CLI_USED", "1")
    assert _is_using_cli()
    with pytest.raises(
        ValueError, match=r"`Fabric\(devices=3, \.\.\.\)` but it conflicts with the value `--devices=2`"
    ):
        _Connector(accelerator="cpu", devices=3)


def test_a_slurm_task_through_the_connector(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {
        "SLURM_NTASKS": "2",
        "SLURM_NTASKS_PER_NODE": "2",
        "SLURM_PROCID": "1",
        "SLURM_NODEID": "0",
    }.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("SLURM_LOCALID", "1")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    resolved = _Connector(accelerator="cpu", strategy="ddp_spawn", devices=2)
    assert isinstance(resolved.cluster_environment, SLURMEnvironment)
    assert resolved.strategy.launcher is None  # SLURM started the processes: nothing to spawn
    assert (resolved.strategy.local_rank, resolved.strategy.global_rank) == (1, 1)


# -------------------------------------------------------------------------------------------- entry-point callbacks
class _Callback:
    pass


@pytest.mark.parametrize(
    ("made", "expected"),
    [([], 0), (_Callback(), 1), ([_Callback()], 1), ([_Callback(), _Callback()], 2)],
)
def test_external_callbacks_from_entry_points(monkeypatch: pytest.MonkeyPatch, made: Any, expected: int) -> None:
    entry_point = mock.Mock()
    entry_point.name = "factory"
    entry_point.load.return_value = lambda: made
    query = mock.Mock(return_value=[entry_point])
    monkeypatch.setattr(registry, "entry_points", query)
    callbacks = registry._load_external_callbacks("lightning.pytorch.callbacks_factory")
    query.assert_called_once_with(group="lightning.pytorch.callbacks_factory")
    assert len(callbacks) == expected and all(isinstance(c, _Callback) for c in callbacks)


def test_no_external_callbacks_where_no_package_offers_any() -> None:
    assert registry._load_external_callbacks("fabric_lite.tests.no_such_group") == []
