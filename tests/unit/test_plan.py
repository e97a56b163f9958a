"""Unit tests for ``fabric_lite._plan.resolve_plan``: tables of inputs and the exact plan (or error) of each.

No processes, no process groups: ``resolve_plan`` is a pure function of its arguments, an environment
mapping and a ``Machine`` snapshot, so every case here is one row.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

import pytest
import torch

from fabric_lite._plan import PRECISIONS, Machine, Plan, resolve_plan
from fabric_lite.accelerators import Accelerator, CPUAccelerator, CUDAAccelerator, MPSAccelerator
from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.precision import DoublePrecision, Precision
from fabric_lite.strategies import DDPStrategy, SingleDeviceStrategy
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.utilities.exceptions import MisconfigurationException, MissingEnvironmentVariableError

CPU = Machine()
CUDA4 = Machine(cuda_devices=4)
CUDA1 = Machine(cuda_devices=1)
MPS = Machine(mps_available=True)
CUDA2_MPS = Machine(cuda_devices=2, mps_available=True)
NOTEBOOK = Machine(interactive=True)


# what a manual multi-node launch sets on every node (checked at launch for num_nodes > 1)
MAIN = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}


def plan(**kwargs: Any) -> Plan:
    """``resolve_plan`` with an empty environment (the main address and port when ``num_nodes > 1``) and a
    CPU-only, non-interactive machine unless told."""
    kwargs.setdefault("env", dict(MAIN) if str(kwargs.get("num_nodes", 1)).strip() not in ("1", "") else {})
    kwargs.setdefault("machine", CPU)
    return resolve_plan(**kwargs)


def raises(cls: type[Exception], *fragments: str, **kwargs: Any) -> str:
    """Resolve a plan that must fail with exactly ``cls`` and a message holding every fragment; return it."""
    with pytest.raises(Exception) as excinfo:
        plan(**kwargs)
    assert excinfo.type is cls, f"expected {cls.__name__}, got {excinfo.type.__name__}: {excinfo.value}"
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def refused_at_launch(cls: type[Exception], *fragments: str, **kwargs: Any) -> str:
    """Resolve a plan that must construct (as ``Fabric(...)`` does) and then fail the launch-time check against the
    launcher's environment (``Plan.validate_settings``, run by ``fabric.launch()``) with exactly ``cls`` and a message
    holding every fragment; return the message."""
    resolved = plan(**kwargs)
    with pytest.raises(Exception) as excinfo:
        resolved.validate_settings()
    assert excinfo.type is cls, f"expected {cls.__name__}, got {excinfo.type.__name__}: {excinfo.value}"
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def torchelastic_env(world_size: int = 4, local_world_size: int | None = 2, **extra: str) -> dict[str, str]:
    env = {
        "TORCHELASTIC_RUN_ID": "run-1",
        "RANK": "3",
        "LOCAL_RANK": "1",
        "WORLD_SIZE": str(world_size),
        "GROUP_RANK": "1",
        "MASTER_ADDR": "10.0.0.1",
        "MASTER_PORT": "29500",
    }
    if local_world_size is not None:
        env["LOCAL_WORLD_SIZE"] = str(local_world_size)
    env.update(extra)
    return env


def slurm_env(ntasks: int = 4, per_node: int | None = 2, nnodes: int | None = 2, **extra: str) -> dict[str, str]:
    env = {
        "SLURM_NTASKS": str(ntasks),
        "SLURM_PROCID": "1",
        "SLURM_LOCALID": "1",
        "SLURM_NODEID": "0",
        "SLURM_NODELIST": "node[1-2]",
        "SLURM_JOB_ID": "123456",
    }
    if per_node is not None:
        env["SLURM_NTASKS_PER_NODE"] = str(per_node)
    if nnodes is not None:
        env["SLURM_NNODES"] = str(nnodes)
    env.update(extra)
    return env


# ------------------------------------------------------------------------------------------------ accelerator


@pytest.mark.parametrize(
    ("accelerator", "machine", "expected"),
    [
        pytest.param("cpu", CUDA2_MPS, "cpu", id="cpu-on-a-gpu-machine"),
        pytest.param("CPU", CPU, "cpu", id="CPU-upper-case"),
        pytest.param("Cuda", CUDA4, "cuda", id="Cuda-mixed-case"),
        pytest.param("cuda", CUDA4, "cuda", id="cuda"),
        pytest.param("gpu", CUDA4, "cuda", id="gpu-means-cuda"),
        pytest.param("GPU", MPS, "mps", id="gpu-means-mps-without-cuda"),
        pytest.param("gpu", CUDA2_MPS, "cuda", id="gpu-prefers-cuda-over-mps"),
        pytest.param("mps", MPS, "mps", id="mps"),
        pytest.param("auto", CPU, "cpu", id="auto-cpu-only"),
        pytest.param("auto", CUDA4, "cuda", id="auto-cuda"),
        pytest.param("auto", MPS, "mps", id="auto-mps"),
        pytest.param("AUTO", CUDA2_MPS, "mps", id="auto-mps-before-cuda"),
        pytest.param(CPUAccelerator(), CUDA4, "cpu", id="CPUAccelerator-instance"),
        pytest.param(CUDAAccelerator(), CUDA4, "cuda", id="CUDAAccelerator-instance"),
        pytest.param(MPSAccelerator(), MPS, "mps", id="MPSAccelerator-instance"),
    ],
)
def test_accelerator(accelerator: Any, machine: Machine, expected: str) -> None:
    result = plan(accelerator=accelerator, devices=1, machine=machine)
    assert result.accelerator == expected
    assert result.backend == ("nccl" if expected == "cuda" else "gloo")


@pytest.mark.parametrize(
    ("accelerator", "machine", "available"),
    [
        pytest.param("cuda", CPU, "['cpu']", id="cuda-on-cpu-only"),
        pytest.param("cuda", MPS, "['mps', 'cpu']", id="cuda-on-mps"),
        pytest.param("mps", CPU, "['cpu']", id="mps-on-cpu-only"),
        pytest.param("mps", CUDA4, "['cuda', 'cpu']", id="mps-on-cuda"),
        pytest.param("gpu", CPU, "['cpu']", id="gpu-on-cpu-only"),
        pytest.param(CUDAAccelerator(), CPU, "['cpu']", id="CUDAAccelerator-on-cpu-only"),
        pytest.param(MPSAccelerator(), CUDA4, "['cuda', 'cpu']", id="MPSAccelerator-on-cuda"),
    ],
)
def test_accelerator_missing_on_this_machine(accelerator: Any, machine: Machine, available: str) -> None:
    name = accelerator if isinstance(accelerator, str) else type(accelerator).name
    raises(
        RuntimeError,
        f"accelerator={name!r}",
        f"Available accelerators: {available}",
        "Use accelerator='cpu' or 'auto'",
        accelerator=accelerator,
        machine=machine,
    )


@pytest.mark.parametrize(
    "accelerator",
    [
        pytest.param("xla", id="xla"),
        pytest.param("", id="empty"),
        pytest.param(" cpu", id="leading-space"),
        pytest.param(None, id="None"),
        pytest.param(1, id="int"),
        pytest.param(CPUAccelerator, id="class-not-instance"),
    ],
)
def test_accelerator_invalid_name(accelerator: Any) -> None:
    raises(
        ValueError,
        f"accelerator={accelerator!r}",
        "'auto', 'cpu', 'cuda', 'gpu', 'mps'",
        "Accelerator instance",
        accelerator=accelerator,
    )


# --------------------------------------------------------------------------------------------- devices on CPU


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(1, (0,), id="1"),
        pytest.param(3, (0, 1, 2), id="3"),
        pytest.param("2", (0, 1), id="digit-string-2"),
        pytest.param(" 2 ", (0, 1), id="digit-string-with-spaces"),
        pytest.param("auto", (0,), id="auto-is-one-process"),
    ],
)
def test_cpu_devices(devices: Any, expected: tuple[int, ...]) -> None:
    result = plan(accelerator="cpu", devices=devices)
    assert result.devices == expected
    assert result.num_processes == len(expected)
    assert result.world_size == len(expected)
    assert result.backend == "gloo"


@pytest.mark.parametrize(
    ("devices", "cls", "fragments"),
    [
        pytest.param(0, ValueError, ("Fabric(devices=0)", "at least one process", "devices=1"), id="0"),
        pytest.param("0", ValueError, ("Fabric(devices='0')", "at least one process"), id="digit-string-0"),
        pytest.param([], ValueError, ("Fabric(devices=[])", "at least one process"), id="empty-list"),
        pytest.param(-1, TypeError, ("Fabric(devices=-1)", "'every GPU'", "Example: devices=2"), id="-1"),
        pytest.param("-1", TypeError, ("Fabric(devices='-1')", "'every GPU'"), id="string--1"),
        pytest.param([0, 1], TypeError, ("Fabric(devices=[0, 1])", "on the CPU, give a count"), id="list"),
        pytest.param((0,), TypeError, ("Fabric(devices=(0,))", "on the CPU, give a count"), id="tuple"),
        pytest.param("0,1", TypeError, ("Fabric(devices='0,1')", "on the CPU, give a count"), id="index-string"),
        pytest.param("abc", TypeError, ("Fabric(devices='abc')", "int > 0", "Example: devices=2"), id="abc"),
        pytest.param(1.5, TypeError, ("Fabric(devices=1.5)", "int > 0"), id="float"),
        pytest.param(2.0, TypeError, ("Fabric(devices=2.0)", "int > 0"), id="integral-float"),
        pytest.param(True, TypeError, ("Fabric(devices=True)", "int > 0"), id="True"),
        pytest.param(False, TypeError, ("Fabric(devices=False)", "int > 0"), id="False"),
        pytest.param(-2, TypeError, ("Fabric(devices=-2)", "int > 0"), id="-2"),
        pytest.param(None, TypeError, ("Fabric(devices=None)", "int > 0"), id="None"),
        pytest.param("AUTO", TypeError, ("Fabric(devices='AUTO')", "'auto'"), id="AUTO-upper-case"),
    ],
)
def test_cpu_devices_invalid(devices: Any, cls: type[Exception], fragments: tuple[str, ...]) -> None:
    message = raises(cls, *fragments, accelerator="cpu", devices=devices)
    assert "CPU accelerator" in message


# -------------------------------------------------------------------------------------------- devices on CUDA


@pytest.mark.parametrize(
    ("devices", "expected"),
    [
        pytest.param(1, (0,), id="1"),
        pytest.param(3, (0, 1, 2), id="3"),
        pytest.param(4, (0, 1, 2, 3), id="4-all"),
        pytest.param(-1, (0, 1, 2, 3), id="-1-all"),
        pytest.param("-1", (0, 1, 2, 3), id="string--1-all"),
        pytest.param("auto", (0, 1, 2, 3), id="auto-all"),
        pytest.param([1, 3], (1, 3), id="list-1-3"),
        pytest.param((2,), (2,), id="tuple-2"),
        pytest.param([3, 0], (3, 0), id="list-keeps-order"),
        pytest.param("1,3", (1, 3), id="string-1,3"),
        pytest.param(" 1, 3 ", (1, 3), id="string-with-spaces"),
        pytest.param("1,", (1,), id="string-trailing-comma"),
        pytest.param("2", (0, 1), id="digit-string-is-a-count"),
    ],
)
def test_cuda_devices(devices: Any, expected: tuple[int, ...]) -> None:
    result = plan(accelerator="cuda", devices=devices, machine=CUDA4)
    assert result.devices == expected
    assert result.accelerator == "cuda"
    assert result.backend == "nccl"
    assert result.world_size == len(expected)


@pytest.mark.parametrize(
    ("devices", "cls", "fragments"),
    [
        pytest.param([0, 0], MisconfigurationException, ("Fabric(devices=[0, 0])", "twice"), id="duplicate"),
        pytest.param("1,1", MisconfigurationException, ("Fabric(devices='1,1')", "twice"), id="duplicate-string"),
        pytest.param(
            [7],
            MisconfigurationException,
            ("Fabric(devices=[7])", "You requested gpu: [7]", "machine only has: [0, 1, 2, 3]", "Use devices=1"),
            id="missing-index",
        ),
        pytest.param(
            [-1],
            MisconfigurationException,
            ("Fabric(devices=[-1])", "You requested gpu: [-1]", "([-1] missing)"),
            id="negative-index",
        ),
        pytest.param(
            5,
            MisconfigurationException,
            ("Fabric(devices=5)", "([4] missing)", "machine only has: [0, 1, 2, 3]", "Use devices=4"),
            id="count-too-large",
        ),
        pytest.param(0, ValueError, ("Fabric(devices=0)", "selects no device", "devices=1"), id="0"),
        pytest.param("0", ValueError, ("Fabric(devices='0')", "selects no device"), id="string-0"),
        pytest.param([], ValueError, ("Fabric(devices=[])", "selects no device"), id="empty-list"),
        pytest.param(-2, MisconfigurationException, ("Fabric(devices=-2)", "-1 for every GPU"), id="-2"),
        pytest.param(True, TypeError, ("Fabric(devices=True)",), id="True"),
        pytest.param(1.5, TypeError, ("Fabric(devices=1.5)", "'0,1'"), id="float"),
        pytest.param("abc", TypeError, ("Fabric(devices='abc')", "'0,1'"), id="abc"),
        pytest.param("0,x", TypeError, ("Fabric(devices='0,x')", "'0,1'"), id="bad-index-string"),
        pytest.param(["0"], TypeError, ("Fabric(devices=['0'])", "you passed a sequence of str"), id="list-of-strings"),
        pytest.param([True], TypeError, ("Fabric(devices=[True])", "you passed a sequence of bool"), id="list-of-bool"),
        pytest.param(None, TypeError, ("Fabric(devices=None)",), id="None"),
    ],
)
def test_cuda_devices_invalid(devices: Any, cls: type[Exception], fragments: tuple[str, ...]) -> None:
    raises(cls, *fragments, accelerator="cuda", devices=devices, machine=CUDA4)


def test_misconfiguration_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"devices=\[0, 0\]"):
        plan(accelerator="cuda", devices=[0, 0], machine=CUDA4)


@pytest.mark.parametrize(
    ("devices", "expected"),
    [pytest.param(1, (0,), id="1"), pytest.param(-1, (0,), id="-1"), pytest.param("auto", (0,), id="auto")],
)
def test_mps_devices(devices: Any, expected: tuple[int, ...]) -> None:
    result = plan(accelerator="mps", devices=devices, machine=MPS)
    assert (result.accelerator, result.devices, result.backend, result.strategy) == (
        "mps",
        expected,
        "gloo",
        "single_device",
    )


def test_mps_has_one_device() -> None:
    raises(
        MisconfigurationException,
        "Fabric(devices=2) for accelerator='mps'",
        "machine only has: [0] ([1] missing)",
        accelerator="mps",
        devices=2,
        machine=MPS,
    )


# ------------------------------------------------------------------------------------------------- num_nodes


@pytest.mark.parametrize(
    ("num_nodes", "expected"),
    [
        pytest.param(1, 1, id="1"),
        pytest.param(3, 3, id="3"),
        pytest.param("2", 2, id="digit-string"),
        pytest.param(" 4 ", 4, id="digit-string-with-spaces"),
    ],
)
def test_num_nodes(num_nodes: Any, expected: int) -> None:
    result = plan(devices=2, num_nodes=num_nodes)
    assert result.num_nodes == expected
    assert result.num_processes == 2
    assert result.world_size == 2 * expected


@pytest.mark.parametrize(
    ("num_nodes", "cls", "shown"),
    [
        pytest.param(0, ValueError, "got 0", id="0"),
        pytest.param("0", ValueError, "got 0", id="string-0"),
        pytest.param(-1, ValueError, "got -1", id="-1"),
        pytest.param(True, TypeError, "got True", id="True"),
        pytest.param(1.5, TypeError, "got 1.5", id="float"),
        pytest.param("-1", TypeError, "got '-1'", id="string--1"),
        pytest.param("two", TypeError, "got 'two'", id="word"),
        pytest.param(None, TypeError, "got None", id="None"),
    ],
)
def test_num_nodes_invalid(num_nodes: Any, cls: type[Exception], shown: str) -> None:
    raises(cls, "`num_nodes` must be a positive integer", shown, "Example: num_nodes=", num_nodes=num_nodes)


@pytest.mark.parametrize(
    ("argument", "value"),
    [pytest.param("num_nodes", "²", id="num_nodes"), pytest.param("devices", "²", id="devices-on-cpu")],
)
def test_unicode_digit_string_gets_a_clear_error(argument: str, value: str) -> None:
    message = raises(TypeError, repr(value), **{argument: value})
    assert argument in message


# -------------------------------------------------------------------------------------------------- strategy


@pytest.mark.parametrize(
    ("devices", "num_nodes", "machine", "expected_strategy", "expected_start"),
    [
        pytest.param(1, 1, CPU, "single_device", None, id="one-device"),
        pytest.param("auto", 1, CPU, "single_device", None, id="auto-devices-on-cpu"),
        pytest.param(2, 1, CPU, "ddp", "popen", id="two-devices"),
        pytest.param(1, 2, CPU, "ddp", "popen", id="two-nodes"),
        pytest.param(2, 1, NOTEBOOK, "ddp_fork", "fork", id="two-devices-interactive"),
        pytest.param(1, 2, NOTEBOOK, "ddp_fork", "fork", id="two-nodes-interactive"),
        pytest.param(1, 1, NOTEBOOK, "single_device", None, id="one-device-interactive"),
    ],
)
def test_auto_strategy(
    devices: Any, num_nodes: int, machine: Machine, expected_strategy: str, expected_start: str | None
) -> None:
    result = plan(devices=devices, num_nodes=num_nodes, machine=machine)
    assert result.strategy == expected_strategy
    assert result.start_method == expected_start
    assert result.parallel is (expected_strategy != "single_device")


def test_auto_strategy_on_cuda_uses_every_gpu() -> None:
    result = plan(machine=CUDA4)
    assert (result.strategy, result.devices, result.start_method, result.world_size) == (
        "ddp",
        (0, 1, 2, 3),
        "popen",
        4,
    )


# name -> (parallel, start_method): written out so that a registry change shows up here
REGISTRY_TABLE = {
    "single_device": (False, None),
    "ddp": (True, "popen"),
    "ddp_spawn": (True, "spawn"),
    "ddp_fork": (True, "fork"),
    "ddp_notebook": (True, "fork"),
    "ddp_find_unused_parameters_true": (True, "popen"),
    "ddp_find_unused_parameters_false": (True, "popen"),
    "ddp_spawn_find_unused_parameters_true": (True, "spawn"),
    "ddp_spawn_find_unused_parameters_false": (True, "spawn"),
    "ddp_fork_find_unused_parameters_true": (True, "fork"),
    "ddp_fork_find_unused_parameters_false": (True, "fork"),
    "ddp_notebook_find_unused_parameters_true": (True, "fork"),
    "ddp_notebook_find_unused_parameters_false": (True, "fork"),
    "dp": (False, None),
    "horovod": (True, None),
    "fsdp": (True, "popen"),
    "fsdp_cpu_offload": (True, "popen"),
    "deepspeed": (True, "popen"),
    "deepspeed_stage_1": (True, "popen"),
    "deepspeed_stage_1_offload": (True, "popen"),
    "deepspeed_stage_2": (True, "popen"),
    "deepspeed_stage_2_offload": (True, "popen"),
    "deepspeed_stage_3": (True, "popen"),
    "deepspeed_stage_3_offload": (True, "popen"),
    "deepspeed_stage_3_offload_nvme": (True, "popen"),
    "xla": (True, None),
    "xla_fsdp": (True, None),
    "single_xla": (False, None),
    "single_tpu": (False, None),
}
#: Lightning's XLA/TPU names: listed, and an error naming torch_xla when chosen (test_xla_names_need_torch_xla)
XLA_NAMES = ("xla", "xla_fsdp", "single_xla", "single_tpu")
# names whose plan depends on the machine or the launcher: tested in tests/unit/test_dp.py and
# tests/tiers/horovod/test_horovod.py
OWN_TESTS = ("dp", "horovod", *XLA_NAMES)


def test_registry_table_is_complete() -> None:
    assert sorted(REGISTRY_TABLE) == sorted([*STRATEGY_REGISTRY, *STRATEGY_REGISTRY.aliases])


@pytest.mark.parametrize(
    ("name", "expected"),
    [(name, expected) for name, expected in REGISTRY_TABLE.items() if name not in OWN_TESTS],
    ids=[name for name in REGISTRY_TABLE if name not in OWN_TESTS],
)
def test_every_registry_name(name: str, expected: tuple[bool, str | None]) -> None:
    parallel, start_method = expected
    devices = 2 if parallel else 1
    result = plan(strategy=name, devices=devices)
    assert (result.strategy, result.parallel, result.start_method) == (name, parallel, start_method)
    assert result.devices == tuple(range(devices))
    assert result.world_size == devices


@pytest.mark.parametrize("name", [n for n, (parallel, _) in REGISTRY_TABLE.items() if parallel and n not in XLA_NAMES])
def test_parallel_strategy_on_one_device(name: str) -> None:
    result = plan(strategy=name, devices=1)
    assert (result.strategy, result.parallel, result.devices, result.world_size) == (name, True, (0,), 1)


@pytest.mark.parametrize(
    "strategy",
    [
        pytest.param("foo", id="foo"),
        pytest.param("deepspeed_stage_4", id="no-such-deepspeed-stage"),
        pytest.param("", id="empty"),
        pytest.param(None, id="None"),
        pytest.param(DDPStrategy, id="class-not-instance"),
    ],
)
def test_strategy_invalid_name(strategy: Any) -> None:
    choices = ", ".join(repr(n) for n in ("auto", *STRATEGY_REGISTRY))  # registry order; the table checks the names
    raises(ValueError, f"strategy={strategy!r}", choices, "Strategy instance", strategy=strategy)


@pytest.mark.parametrize(
    "kwargs",
    [pytest.param({"accelerator": "tpu"}, id="accelerator-tpu")]
    + [pytest.param({"strategy": name}, id=f"strategy-{name}") for name in XLA_NAMES],
)
def test_xla_names_need_torch_xla(kwargs: dict[str, Any]) -> None:
    """Lightning's XLA/TPU names are known (its registries list them), and choosing one says what is missing."""
    ((name, value),) = kwargs.items()
    raises(ModuleNotFoundError, f"Fabric({name}={value!r})", "needs torch_xla", "pip install torch_xla", **kwargs)


@pytest.mark.parametrize(
    ("devices", "num_nodes", "asked"),
    [pytest.param(2, 1, 2, id="two-devices"), pytest.param(1, 3, 3, id="three-nodes")],
)
def test_single_device_with_several_processes(devices: int, num_nodes: int, asked: int) -> None:
    raises(
        ValueError,
        "strategy='single_device'",
        f"devices={devices} and num_nodes={num_nodes} ask for {asked}",
        "Use strategy='ddp'",
        strategy="single_device",
        devices=devices,
        num_nodes=num_nodes,
    )


def test_single_device_instance_with_two_devices_runs_on_its_device_and_says_so() -> None:
    # as in Lightning, the instance runs on the device it was made with; the extra device is named in a warning
    result = plan(strategy=SingleDeviceStrategy(), devices=2)
    assert (result.strategy, result.parallel, result.devices, result.world_size) == ("instance", False, (0,), 1)
    (message,) = result.warnings
    for fragment in ("Fabric(devices=2) selects 2 devices", "SingleDeviceStrategy runs one process", "devices=1"):
        assert fragment in message, message
    # on several nodes it would still run once per node, each training alone
    raises(ValueError, "strategy='SingleDeviceStrategy'", "num_nodes=2", strategy=SingleDeviceStrategy(), num_nodes=2)


@pytest.mark.parametrize(
    ("strategy", "devices", "parallel", "start_method"),
    [
        pytest.param(DDPStrategy(start_method="spawn"), 2, True, "spawn", id="ddp-spawn"),
        pytest.param(DDPStrategy(start_method="fork"), 2, True, "fork", id="ddp-fork"),
        pytest.param(DDPStrategy(), 2, True, "popen", id="ddp-default-popen"),
        pytest.param(DDPStrategy(start_method="forkserver"), 3, True, "forkserver", id="ddp-forkserver"),
        pytest.param(SingleDeviceStrategy(), 1, False, None, id="single-device"),
    ],
)
def test_strategy_instance(strategy: Any, devices: int, parallel: bool, start_method: str | None) -> None:
    result = plan(strategy=strategy, devices=devices)
    assert (result.strategy, result.parallel, result.start_method) == ("instance", parallel, start_method)
    assert result.devices == tuple(range(devices))


@pytest.mark.parametrize("strategy", ["ddp", "ddp_find_unused_parameters_true", "ddp_spawn", "DDP"])
def test_popen_and_spawn_strategies_in_interactive_session(strategy: str) -> None:
    """Lightning's refusal (a RuntimeError): the script cannot be re-run, and a spawned process cannot import a
    function defined in a notebook."""
    raises(
        RuntimeError,
        f"`Fabric(strategy={strategy.lower()!r})` is not compatible with an interactive environment",
        "`Fabric(strategy='dp'|'ddp_notebook')` (or 'ddp_fork')",
        strategy=strategy,
        devices=2,
        machine=NOTEBOOK,
    )


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook"])
def test_fork_strategies_in_interactive_session(strategy: str) -> None:
    result = plan(strategy=strategy, devices=2, machine=NOTEBOOK)
    assert (result.strategy, result.start_method) == (strategy, REGISTRY_TABLE[strategy][1])


def test_popen_strategy_instance_in_interactive_session_names_the_class() -> None:
    message = raises(
        RuntimeError, "DDPStrategy", "interactive environment", strategy=DDPStrategy(), devices=2, machine=NOTEBOOK
    )
    assert "'instance'" not in message


@pytest.mark.parametrize("strategy", ["ddp_fork", "ddp_notebook", DDPStrategy(start_method="fork")])
def test_fork_where_the_platform_cannot(strategy: Any) -> None:
    raises(
        ValueError,
        "process forking is not supported on this platform",
        "`Fabric(strategy='ddp_spawn')`",
        strategy=strategy,
        machine=Machine(can_fork=False),
    )


@pytest.mark.parametrize("strategy", ["DDP", "Ddp", "DDP_Spawn"])
def test_strategy_names_are_case_insensitive(strategy: str) -> None:
    assert plan(strategy=strategy, devices=2).strategy == strategy.lower()


# ------------------------------------------------------------------------------------------------- precision


@pytest.mark.parametrize("precision", PRECISIONS)
def test_canonical_precision_on_cuda(precision: str) -> None:
    result = plan(precision=precision, accelerator="cuda", devices=1, machine=CUDA4)
    assert result.precision == precision
    assert result.warnings == ()


def test_precision_names() -> None:
    assert PRECISIONS == (
        "32-true",
        "64-true",
        "16-mixed",
        "bf16-mixed",
        "16-true",
        "bf16-true",
        "transformer-engine",
        "transformer-engine-float16",
    )


@pytest.mark.parametrize("precision", ["transformer-engine", "transformer-engine-float16"])
def test_transformer_engine_precision_names_on_the_cpu(precision: str) -> None:
    # Lightning does not refuse them on the CPU at Fabric(...): the plugin needs transformer_engine, not a device
    assert plan(precision=precision).precision == precision


@pytest.mark.parametrize(
    ("precision", "expected", "warns"),
    [
        pytest.param(None, "32-true", False, id="None"),
        pytest.param(32, "32-true", False, id="32"),
        pytest.param("32", "32-true", False, id="str-32"),
        pytest.param(64, "64-true", False, id="64"),
        pytest.param("64", "64-true", False, id="str-64"),
        pytest.param(16, "16-mixed", True, id="16"),
        pytest.param("16", "16-mixed", True, id="str-16"),
        pytest.param("bf16", "bf16-mixed", True, id="bf16"),
    ],
)
def test_legacy_precision(precision: Any, expected: str, warns: bool) -> None:
    result = plan(precision=precision, accelerator="cuda", devices=1, machine=CUDA4)
    assert result.precision == expected
    if warns:
        assert len(result.warnings) == 1
        assert f"precision={precision!r}" in result.warnings[0]
        assert f"write precision={expected!r}" in result.warnings[0]
        assert f"Please set your precision to {expected} instead!" in result.warnings[0]  # Lightning's words
    else:
        assert result.warnings == ()


@pytest.mark.parametrize(
    ("precision", "expected", "n_warnings"),
    [
        pytest.param("16-mixed", "bf16-mixed", 1, id="16-mixed"),
        pytest.param(16, "bf16-mixed", 2, id="legacy-16"),
        pytest.param("bf16-mixed", "bf16-mixed", 0, id="bf16-mixed-stays"),
        pytest.param("16-true", "16-true", 0, id="16-true-stays"),
    ],
)
def test_precision_16_mixed_on_cpu_becomes_bf16(precision: Any, expected: str, n_warnings: int) -> None:
    result = plan(precision=precision, accelerator="cpu")
    assert result.precision == expected
    assert len(result.warnings) == n_warnings
    if n_warnings:
        assert "AMP with fp16 is not supported on CPU. Using `precision='bf16-mixed'`" in result.warnings[-1]
        assert "plugins=[MixedPrecision('16-mixed', 'cpu')]" in result.warnings[-1]


def test_a_16_mixed_plugin_on_cpu_is_used_as_given() -> None:
    from fabric_lite.plugins.precision import MixedPrecision

    result = plan(accelerator="cpu", plugins=[MixedPrecision("16-mixed", "cpu")])
    assert (result.precision, result.warnings) == ("16-mixed", ())


def test_precision_16_mixed_stays_on_mps() -> None:
    result = plan(precision="16-mixed", machine=MPS)
    assert (result.accelerator, result.precision, result.warnings) == ("mps", "16-mixed", ())


@pytest.mark.parametrize(
    "precision",
    [
        pytest.param("fp16", id="fp16"),
        pytest.param("16-MIXED", id="upper-case"),
        pytest.param("bf16-mixed ", id="trailing-space"),
        pytest.param(8, id="8"),
        pytest.param(16.0, id="float-16"),
        pytest.param(True, id="True"),
        pytest.param("", id="empty"),
        pytest.param("transformer_engine", id="underscore-transformer-engine"),
    ],
)
def test_precision_invalid(precision: Any) -> None:
    raises(
        ValueError,
        f"Precision {precision!r} is invalid",
        "Allowed precision values: 32-true, 64-true, 16-mixed, bf16-mixed, 16-true, bf16-true, transformer-engine,"
        " transformer-engine-float16, 32, '32',",
        "'bf16'",
        precision=precision,
    )


class _HalfPrecision(Precision):
    precision = "16-true"


@pytest.mark.parametrize(
    ("precision", "plugin", "expected"),
    [
        pytest.param("32-true", DoublePrecision(), "64-true", id="default-precision-and-DoublePrecision"),
        pytest.param(None, DoublePrecision(), "64-true", id="None-and-DoublePrecision"),
        pytest.param("64-true", DoublePrecision(), "64-true", id="same-precision-and-DoublePrecision"),
        pytest.param("32-true", Precision(), "32-true", id="base-Precision"),
        pytest.param("16-true", _HalfPrecision(), "16-true", id="custom-subclass"),
    ],
)
def test_precision_plugin(precision: Any, plugin: Precision, expected: str) -> None:
    result = plan(precision=precision, plugins=[plugin])
    assert result.precision == expected


@pytest.mark.parametrize("precision", [pytest.param(64, id="64"), pytest.param("64", id="str-64")])
def test_legacy_precision_that_agrees_with_the_plugin(precision: Any) -> None:
    assert plan(precision=precision, plugins=[DoublePrecision()]).precision == "64-true"


@pytest.mark.parametrize(
    ("precision", "plugin"),
    [
        pytest.param("16-mixed", DoublePrecision(), id="16-mixed-vs-DoublePrecision"),
        pytest.param("bf16-true", DoublePrecision(), id="bf16-true-vs-DoublePrecision"),
        pytest.param("64-true", Precision(), id="64-true-vs-Precision"),
        pytest.param("bf16", _HalfPrecision(), id="legacy-bf16-vs-custom"),
    ],
)
def test_precision_conflicts_with_plugin(precision: Any, plugin: Precision) -> None:
    raises(
        ValueError,
        f"Fabric(precision={precision!r})",
        f"{type(plugin).__name__} (precision={plugin.precision!r})",
        "Pass only one of them",
        precision=precision,
        plugins=[plugin],
    )


@pytest.mark.parametrize(
    "plugin",
    [
        pytest.param("bf16-mixed", id="string"),
        pytest.param(object(), id="object"),
        pytest.param(DoublePrecision, id="Precision-class-not-instance"),
        pytest.param(42, id="int"),
    ],
)
def test_unknown_plugin_type(plugin: Any) -> None:
    raises(
        TypeError,
        f"got {plugin!r} of type {type(plugin).__name__}",
        "fabric_lite.plugins.Precision",
        "ClusterEnvironment",
        plugins=[plugin],
    )


@pytest.mark.parametrize(
    ("plugins", "kind"),
    [
        pytest.param([DoublePrecision(), Precision()], "Precision", id="two-precision-plugins"),
        pytest.param(
            [LightningEnvironment({}), LightningEnvironment({"MASTER_PORT": "1234"})],
            "ClusterEnvironment",
            id="two-cluster-environments",
        ),
    ],
)
def test_duplicate_plugins_are_rejected(plugins: list[Any], kind: str) -> None:
    raises(ValueError, kind, "multiple", plugins=plugins)


# ---------------------------------------------------------------------------------------------- environments


def test_no_environment_is_lightning() -> None:
    result = plan(devices=2)
    assert type(result.cluster_environment) is LightningEnvironment
    assert result.cluster_environment.creates_processes_externally is False
    assert (result.strategy, result.start_method) == ("ddp", "popen")


@pytest.mark.parametrize(
    ("kwargs", "devices", "strategy"),
    [
        pytest.param({"num_nodes": 2}, (0, 1), "ddp", id="devices-auto-from-LOCAL_WORLD_SIZE"),
        pytest.param({"devices": 2, "num_nodes": 2}, (0, 1), "ddp", id="devices-2"),
        pytest.param({"devices": "2", "num_nodes": "2"}, (0, 1), "ddp", id="strings"),
        pytest.param({"num_nodes": 2, "strategy": "ddp_spawn"}, (0, 1), "ddp_spawn", id="ddp_spawn-starts-nothing"),
        pytest.param({"num_nodes": 2, "machine": NOTEBOOK}, (0, 1), "ddp", id="interactive-stays-ddp"),
        pytest.param(
            {"num_nodes": 2, "machine": NOTEBOOK, "strategy": "ddp"},
            (0, 1),
            "ddp",
            id="interactive-ddp-allowed",
        ),
        pytest.param({"num_nodes": 2, "machine": CUDA4}, (0, 1), "ddp", id="cuda-devices-from-LOCAL_WORLD_SIZE"),
    ],
)
def test_torchelastic(kwargs: dict[str, Any], devices: tuple[int, ...], strategy: str) -> None:
    result = plan(env=torchelastic_env(), **kwargs)
    assert type(result.cluster_environment) is TorchElasticEnvironment
    assert result.cluster_environment.creates_processes_externally is True
    assert result.start_method is None
    assert (result.strategy, result.devices, result.num_nodes, result.world_size) == (strategy, devices, 2, 4)
    assert result.cluster_environment.global_rank() == 3
    assert result.cluster_environment.local_rank() == 1
    assert result.cluster_environment.node_rank() == 1


def test_torchelastic_single_process() -> None:
    result = plan(env=torchelastic_env(world_size=1, local_world_size=1))
    assert (result.strategy, result.devices, result.start_method, result.world_size) == (
        "single_device",
        (0,),
        None,
        1,
    )


@pytest.mark.parametrize(
    ("env", "kwargs", "fragments"),
    [
        pytest.param(
            torchelastic_env(),
            {"devices": 3, "num_nodes": 2},
            ("Fabric(devices=3)", "--nproc-per-node=2", "LOCAL_WORLD_SIZE", "Set devices=2"),
            id="devices-3-vs-LOCAL_WORLD_SIZE-2",
        ),
        pytest.param(
            torchelastic_env(),
            {"devices": 1, "num_nodes": 2},
            ("Fabric(devices=1)", "--nproc-per-node=2"),
            id="devices-1-vs-LOCAL_WORLD_SIZE-2",
        ),
        pytest.param(
            torchelastic_env(),
            {"num_nodes": 1},
            ("Fabric(devices=2, num_nodes=1)", "asks for 2 processes", "WORLD_SIZE=4", "Set num_nodes=2"),
            id="num_nodes-1-vs-WORLD_SIZE-4",
        ),
        pytest.param(
            torchelastic_env(),
            {"num_nodes": 3},
            ("num_nodes=3)", "asks for 6 processes", "WORLD_SIZE=4", "Set num_nodes=2"),
            id="num_nodes-3-vs-WORLD_SIZE-4",
        ),
        pytest.param(
            torchelastic_env(world_size=3, local_world_size=None),
            {"devices": 2},
            ("Fabric(devices=2, num_nodes=1)", "WORLD_SIZE=3"),
            id="no-LOCAL_WORLD_SIZE-world-size-mismatch",
        ),
        pytest.param(
            torchelastic_env(world_size=4),
            {"devices": 3, "num_nodes": 2, "machine": CUDA4},
            ("Fabric(devices=3)", "--nproc-per-node=2"),
            id="cuda-devices-mismatch",
        ),
    ],
)
def test_torchelastic_mismatch(env: dict[str, str], kwargs: dict[str, Any], fragments: tuple[str, ...]) -> None:
    refused_at_launch(ValueError, *fragments, env=env, **kwargs)


def test_torchelastic_without_world_size_names_the_variable() -> None:
    env = torchelastic_env()
    del env["WORLD_SIZE"]
    # a RuntimeError, and the KeyError Lightning raises
    refused_at_launch(MissingEnvironmentVariableError, "WORLD_SIZE", "TorchElasticEnvironment", env=env, num_nodes=2)


@pytest.mark.parametrize("devices", [pytest.param([0], id="list-0"), pytest.param(-1, id="-1")])
def test_torchelastic_one_visible_gpu_per_process(devices: Any) -> None:
    result = plan(
        accelerator="cuda",
        devices=devices,
        env=torchelastic_env(world_size=1, local_world_size=1),
        machine=CUDA1,
    )
    assert (result.devices, result.accelerator, result.start_method) == ((0,), "cuda", None)


def test_torchelastic_one_visible_gpu_per_process_with_a_count() -> None:
    result = plan(accelerator="cuda", num_nodes=2, env=torchelastic_env(), machine=CUDA1)
    # each of the two local processes sees its own GPU as cuda:0
    assert (result.devices, result.world_size, result.backend) == ((0, 0), 4, "nccl")


@pytest.mark.parametrize(
    ("env", "kwargs", "devices", "strategy", "world_size"),
    [
        pytest.param(slurm_env(), {"num_nodes": 2}, (0, 1), "ddp", 4, id="auto-devices-from-NTASKS_PER_NODE"),
        pytest.param(slurm_env(), {"num_nodes": 2, "devices": 2}, (0, 1), "ddp", 4, id="explicit-devices"),
        pytest.param(
            slurm_env(),
            {"num_nodes": 2, "strategy": "ddp_spawn"},
            (0, 1),
            "ddp_spawn",
            4,
            id="ddp_spawn-starts-none",
        ),
        pytest.param(
            slurm_env(per_node=None, SLURM_TASKS_PER_NODE="2(x2)"),
            {"num_nodes": 2},
            (0, 1),
            "ddp",
            4,
            id="auto-devices-from-TASKS_PER_NODE",
        ),
        pytest.param(
            slurm_env(ntasks=3, per_node=None, nnodes=None),
            {},
            (0, 1, 2),
            "ddp",
            3,
            id="auto-devices-from-NTASKS-without-node-info",
        ),
        pytest.param(slurm_env(ntasks=1, per_node=1, nnodes=1), {}, (0,), "single_device", 1, id="one-task"),
        pytest.param(
            slurm_env(),
            {"num_nodes": 2, "machine": CUDA4},
            (0, 1),
            "ddp",
            4,
            id="cuda-devices-from-NTASKS_PER_NODE",
        ),
        pytest.param(slurm_env(), {"num_nodes": 2, "machine": NOTEBOOK}, (0, 1), "ddp", 4, id="interactive-stays-ddp"),
    ],
)
def test_slurm(
    env: dict[str, str], kwargs: dict[str, Any], devices: tuple[int, ...], strategy: str, world_size: int
) -> None:
    result = plan(env=env, **kwargs)
    assert type(result.cluster_environment) is SLURMEnvironment
    assert result.cluster_environment.creates_processes_externally is True
    assert result.start_method is None
    assert (result.strategy, result.devices, result.world_size) == (strategy, devices, world_size)


@pytest.mark.parametrize(
    ("env", "kwargs", "fragments"),
    [
        pytest.param(
            slurm_env(),
            {"devices": 3, "num_nodes": 2},
            ("Fabric(devices=3)", "SLURM's 2 tasks per node", "Set devices=2", "--ntasks-per-node=3"),
            id="devices-3-vs-NTASKS_PER_NODE-2",
        ),
        pytest.param(
            slurm_env(),
            {"num_nodes": 1},
            ("Fabric(num_nodes=1)", "--nodes=2", "SLURM_NNODES", "Set num_nodes=2"),
            id="num_nodes-1-vs-NNODES-2",
        ),
        pytest.param(
            slurm_env(per_node=None),
            {"devices": 1, "num_nodes": 2},
            ("Fabric(devices=1, num_nodes=2)", "asks for 2 processes", "SLURM started 4 tasks", "srun"),
            id="processes-2-vs-NTASKS-4",
        ),
        pytest.param(
            slurm_env(per_node=None, SLURM_TASKS_PER_NODE="2(x2)"),
            {"devices": 4, "num_nodes": 2},
            ("Fabric(devices=4)", "SLURM's 2 tasks per node"),
            id="devices-4-vs-TASKS_PER_NODE-2(x2)",
        ),
        pytest.param(
            slurm_env(ntasks=2, per_node=None, nnodes=None),
            {"devices": 3},
            ("Fabric(devices=3, num_nodes=1)", "SLURM started 2 tasks"),
            id="devices-3-vs-NTASKS-2",
        ),
    ],
)
def test_slurm_mismatch(env: dict[str, str], kwargs: dict[str, Any], fragments: tuple[str, ...]) -> None:
    refused_at_launch(ValueError, *fragments, env=env, **kwargs)


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_slurm_interactive_job_is_not_slurm(job_name: str) -> None:
    result = plan(env=slurm_env(SLURM_JOB_NAME=job_name), devices=2)
    assert type(result.cluster_environment) is LightningEnvironment
    assert (result.strategy, result.start_method, result.world_size) == ("ddp", "popen", 2)


def test_slurm_batch_job_name_is_slurm() -> None:
    result = plan(env=slurm_env(SLURM_JOB_NAME="train"), num_nodes=2)
    assert type(result.cluster_environment) is SLURMEnvironment


def test_torchrun_inside_slurm_is_torchelastic() -> None:
    env = {**slurm_env(ntasks=1, per_node=1, nnodes=1), **torchelastic_env()}
    result = plan(env=env, num_nodes=2)
    assert type(result.cluster_environment) is TorchElasticEnvironment
    assert (result.devices, result.world_size, result.start_method) == ((0, 1), 4, None)


@pytest.mark.parametrize(
    ("make_plugin", "env", "kwargs", "external", "start_method"),
    [
        pytest.param(
            lambda: LightningEnvironment({}),
            torchelastic_env(),
            {"devices": 2},
            False,
            "popen",
            id="LightningEnvironment-wins-over-torchrun-env",
        ),
        pytest.param(
            lambda: TorchElasticEnvironment(torchelastic_env()),
            {},
            {"num_nodes": 2},
            True,
            None,
            id="TorchElasticEnvironment-in-empty-env",
        ),
        pytest.param(
            lambda: SLURMEnvironment(env=slurm_env()),
            {},
            {"num_nodes": 2},
            True,
            None,
            id="SLURMEnvironment-in-empty-env",
        ),
    ],
)
def test_cluster_environment_plugin_is_used_as_is(
    make_plugin: Any, env: dict[str, str], kwargs: dict[str, Any], external: bool, start_method: str | None
) -> None:
    plugin = make_plugin()
    result = plan(env=env, plugins=[plugin], **kwargs)
    assert result.cluster_environment is plugin
    assert result.cluster_environment.creates_processes_externally is external
    assert (result.devices, result.start_method) == ((0, 1), start_method)


def test_cluster_environment_plugin_is_validated() -> None:
    refused_at_launch(
        ValueError,
        "Fabric(devices=3)",
        "--nproc-per-node=2",
        plugins=[TorchElasticEnvironment(torchelastic_env())],
        devices=3,
        num_nodes=2,
    )


class _FixedEnvironment(ClusterEnvironment):
    """A user-defined environment: two processes per node started by someone else."""

    creates_processes_externally = True  # type: ignore[assignment]
    main_address = "host0"  # type: ignore[assignment]
    main_port = 1234  # type: ignore[assignment]

    @staticmethod
    def detect(env: Mapping[str, str] | None = None) -> bool:
        return True

    def world_size(self) -> int:
        return 2

    def set_world_size(self, size: int) -> None:
        pass

    def global_rank(self) -> int:
        return 1

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return 1

    def node_rank(self) -> int:
        return 0


def test_custom_cluster_environment() -> None:
    plugin = _FixedEnvironment({})
    result = plan(plugins=[plugin], devices=2, strategy="ddp_spawn", precision=None)
    assert result.cluster_environment is plugin
    assert (result.strategy, result.devices, result.start_method, result.precision) == (
        "ddp_spawn",
        (0, 1),
        None,
        "32-true",
    )


@pytest.mark.parametrize(
    ("env", "kwargs", "world_size"),
    [
        pytest.param({"LOCAL_RANK": "1", "WORLD_SIZE": "2", **MAIN}, {"devices": 2}, 2, id="child-of-two"),
        pytest.param(
            {"LOCAL_RANK": "0", "WORLD_SIZE": "4", "NODE_RANK": "1", **MAIN},
            {"devices": 2, "num_nodes": 2},
            4,
            id="child-on-second-node",
        ),
        pytest.param(
            {"LOCAL_RANK": "1", "WORLD_SIZE": "2", **MAIN},
            {"devices": 2, "strategy": "ddp_spawn"},
            2,
            id="spawned-child",
        ),
        pytest.param(
            {"LOCAL_RANK": "1", "WORLD_SIZE": "2", **MAIN},
            {"devices": 2, "machine": NOTEBOOK, "strategy": "ddp"},
            2,
            id="child-in-interactive-is-not-a-notebook",
        ),
    ],
)
def test_own_launcher_child(env: dict[str, str], kwargs: dict[str, Any], world_size: int) -> None:
    result = plan(env=env, **kwargs)
    assert type(result.cluster_environment) is LightningEnvironment
    assert result.cluster_environment.creates_processes_externally is True
    assert result.start_method is None
    assert result.world_size == world_size


@pytest.mark.parametrize(
    ("env", "kwargs", "fragments"),
    [
        pytest.param(
            {"LOCAL_RANK": "1", "WORLD_SIZE": "4", **MAIN},
            {"devices": 2},
            ("WORLD_SIZE=4", "Fabric(devices=2, num_nodes=1)", "asks for 2 processes", "unset LOCAL_RANK"),
            id="WORLD_SIZE-4-vs-2",
        ),
        pytest.param(
            {"LOCAL_RANK": "0", "WORLD_SIZE": "2", **MAIN},
            {"devices": 2, "num_nodes": 2},
            ("WORLD_SIZE=2", "Fabric(devices=2, num_nodes=2)", "asks for 4 processes"),
            id="WORLD_SIZE-2-vs-4",
        ),
        pytest.param(
            {"LOCAL_RANK": "0", "WORLD_SIZE": "2"},
            {},
            ("WORLD_SIZE=2", "Fabric(devices=1, num_nodes=1)"),
            id="WORLD_SIZE-2-vs-auto",
        ),
    ],
)
def test_own_launcher_child_mismatch(env: dict[str, str], kwargs: dict[str, Any], fragments: tuple[str, ...]) -> None:
    refused_at_launch(ValueError, *fragments, env=env, **kwargs)


def test_bad_world_size_names_the_variable() -> None:
    raises(ValueError, "WORLD_SIZE='two'", "not an integer", env={"WORLD_SIZE": "two"})


# ------------------------------------------------------------------------------------ plan arithmetic, purity


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        pytest.param({}, ("cpu", (0,), 1, 1, 1, "gloo"), id="defaults"),
        pytest.param({"devices": 3, "num_nodes": 2}, ("cpu", (0, 1, 2), 2, 3, 6, "gloo"), id="cpu-3x2"),
        pytest.param(
            {"devices": [1, 3], "num_nodes": 4, "machine": CUDA4},
            ("cuda", (1, 3), 4, 2, 8, "nccl"),
            id="cuda-2x4",
        ),
        pytest.param({"machine": CUDA4}, ("cuda", (0, 1, 2, 3), 1, 4, 4, "nccl"), id="cuda-auto"),
        pytest.param(
            {"accelerator": "cpu", "machine": CUDA4}, ("cpu", (0,), 1, 1, 1, "gloo"), id="cpu-on-cuda-machine"
        ),
        pytest.param({"machine": MPS}, ("mps", (0,), 1, 1, 1, "gloo"), id="mps"),
    ],
)
def test_plan_arithmetic(kwargs: dict[str, Any], expected: tuple[Any, ...]) -> None:
    result = plan(**kwargs)
    got = (
        result.accelerator,
        result.devices,
        result.num_nodes,
        result.num_processes,
        result.world_size,
        result.backend,
    )
    assert got == expected


def test_single_device_plan_has_one_process_per_node() -> None:
    result = Plan(
        accelerator="cuda",
        strategy="single_device",
        parallel=False,
        devices=(2,),
        num_nodes=1,
        start_method=None,
        cluster_environment=LightningEnvironment({}),
        precision="32-true",
        backend="nccl",
    )
    assert (result.num_processes, result.world_size, result.warnings) == (1, 1, ())


def test_default_arguments() -> None:
    result = resolve_plan(env={}, machine=CPU)
    assert (result.accelerator, result.strategy, result.devices, result.num_nodes, result.precision) == (
        "cpu",
        "single_device",
        (0,),
        1,
        "32-true",
    )
    assert (result.start_method, result.warnings, result.parallel) == (None, (), False)


class _NoAccess(Mapping[str, str]):
    """Stands in for ``os.environ``: any read fails the test."""

    def __getitem__(self, key: str) -> str:
        raise AssertionError(f"resolve_plan read os.environ[{key!r}]")

    def __iter__(self) -> Iterator[str]:
        raise AssertionError("resolve_plan iterated os.environ")

    def __len__(self) -> int:
        raise AssertionError("resolve_plan took len(os.environ)")

    def __contains__(self, key: object) -> bool:
        raise AssertionError(f"resolve_plan asked whether {key!r} is in os.environ")


CONFLICTING_ENV = {
    **slurm_env(ntasks=8, per_node=8, nnodes=1),
    **torchelastic_env(world_size=16, local_world_size=8),
    "NODE_RANK": "5",
}


@pytest.mark.parametrize(
    ("env", "environment", "start_method", "world_size"),
    [
        pytest.param(dict(MAIN), LightningEnvironment, "popen", 4, id="main-address-only"),
        pytest.param(torchelastic_env(), TorchElasticEnvironment, None, 4, id="torchelastic-env"),
        pytest.param(slurm_env(), SLURMEnvironment, None, 4, id="slurm-env"),
    ],
)
def test_resolve_plan_never_reads_os_environ(
    monkeypatch: pytest.MonkeyPatch,
    env: dict[str, str],
    environment: type[ClusterEnvironment],
    start_method: str | None,
    world_size: int,
) -> None:
    # os.environ says torchrun with 16 processes; only the env argument may count
    for key, value in CONFLICTING_ENV.items():
        monkeypatch.setenv(key, value)
    given = dict(env)
    result = resolve_plan(devices=2, num_nodes=2, env=env, machine=CPU)
    assert type(result.cluster_environment) is environment
    assert (result.start_method, result.world_size) == (start_method, world_size)
    assert env == given  # not modified either

    # and no read at all: swap os.environ for a mapping that fails on any access, for this one call only
    # (pytest itself writes os.environ between test phases, so the swap must not outlive the call)
    real_environ = os.environ
    os.environ = _NoAccess()  # type: ignore[assignment]  # noqa: B003
    try:
        again = resolve_plan(devices=2, num_nodes=2, env=env, machine=CPU)
    finally:
        os.environ = real_environ  # noqa: B003
    assert type(again.cluster_environment) is environment
    assert (again.start_method, again.world_size) == (start_method, world_size)


def test_environment_does_not_see_later_changes_to_env() -> None:
    env = torchelastic_env()
    result = plan(env=env, num_nodes=2)
    env["RANK"] = "0"
    assert result.cluster_environment.global_rank() == 3


def test_plan_and_machine_are_frozen() -> None:
    result = plan()
    with pytest.raises(AttributeError):
        result.devices = (0, 1)  # type: ignore[misc]
    with pytest.raises(AttributeError):
        CPU.cuda_devices = 2  # type: ignore[misc]
    assert Machine() == Machine(cuda_devices=0, mps_available=False, interactive=False)


def test_manual_multi_node_needs_the_main_address_and_port() -> None:
    refused_at_launch(
        ValueError, "Fabric(num_nodes=2)", "MASTER_ADDR and MASTER_PORT", accelerator="cpu", devices=2, num_nodes=2,
        env={},
    )  # fmt: skip
    refused_at_launch(
        ValueError, "needs MASTER_PORT:", devices=2, num_nodes=3, strategy="ddp_spawn", env={"MASTER_ADDR": "n0"}
    )
    plan = resolve_plan(
        accelerator="cpu",
        devices=2,
        num_nodes=2,
        env={"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "NODE_RANK": "1"},
        machine=Machine(),
    )
    assert plan.world_size == 4 and plan.start_method == "popen" and plan.cluster_environment.node_rank() == 1


def test_a_stray_local_rank_is_an_error_not_a_hang() -> None:
    with pytest.raises(ValueError, match=r"LOCAL_RANK='0' is set.*WORLD_SIZE and MASTER_PORT are not set"):
        resolve_plan(accelerator="cpu", devices=2, env={"LOCAL_RANK": "0"}, machine=Machine())


def test_a_cluster_environment_plugin_that_started_the_processes_needs_no_launcher_variables() -> None:
    class Started(LightningEnvironment):
        @property
        def creates_processes_externally(self) -> bool:
            return True

    result = plan(accelerator="cpu", strategy="ddp", devices=2, plugins=[Started()], env={"LOCAL_RANK": "0"})
    assert type(result.cluster_environment) is Started and result.start_method is None and result.world_size == 2


# ------------------------------------------------------------------------- Lightning's resolution, as Lightning


@pytest.mark.parametrize(
    ("accelerator", "devices"),
    [("cuda", 0), ("mps", "0"), ("cpu", []), ("tpu", 0), (CUDAAccelerator(), 0), ("gpu", [])],
)
def test_devices_selecting_nothing_are_refused_before_the_accelerator_is_looked_at(
    accelerator: Any, devices: Any
) -> None:
    raises(
        ValueError,
        f"`Fabric(devices={devices!r})` value is not a valid input using",
        accelerator=accelerator,
        devices=devices,
    )


def test_an_accelerator_this_machine_lacks_is_named_as_lightning_names_it() -> None:
    raises(
        RuntimeError,
        "`CUDAAccelerator` can not run on your system since the accelerator is not available",
        accelerator="cuda",
    )
    raises(RuntimeError, "No supported gpu backend found!", "Available accelerators: ['cpu']", accelerator="gpu")


def test_tpu_with_torch_xla_installed_is_an_accelerator_this_machine_lacks(monkeypatch: pytest.MonkeyPatch) -> None:
    from fabric_lite.accelerators import xla

    monkeypatch.setattr(xla, "_XLA_AVAILABLE", True)
    raises(RuntimeError, "Fabric(accelerator='tpu'): `XLAAccelerator` can not run on your system", accelerator="tpu")


def test_several_gpus_in_a_notebook_use_one_unless_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    notebook = Machine(cuda_devices=4, interactive=True)
    result = plan(accelerator="cuda", machine=notebook)
    assert (result.devices, result.strategy) == ((0,), "single_device")
    (warning,) = result.warnings
    assert "only 1 of 4 GPUs" in warning and "devices=4" in warning
    asked = plan(accelerator="cuda", devices=4, machine=notebook)
    assert (asked.devices, asked.strategy) == ((0, 1, 2, 3), "ddp_fork")


def test_a_strategy_instance_brings_its_accelerator() -> None:
    result = plan(strategy=DDPStrategy(accelerator=CUDAAccelerator()), devices=2, machine=CUDA4)
    assert (result.accelerator, result.devices) == ("cuda", (0, 1))
    raises(
        ValueError,
        "accelerator set through both DDPStrategy(accelerator=CUDAAccelerator()) and Fabric(accelerator='cpu')",
        strategy=DDPStrategy(accelerator=CUDAAccelerator()),
        accelerator="cpu",
    )


def test_a_strategy_instance_brings_its_parallel_devices() -> None:
    on_cpu = plan(strategy=DDPStrategy(parallel_devices=[torch.device("cpu")] * 3))
    assert (on_cpu.accelerator, on_cpu.devices, on_cpu.world_size) == ("cpu", (0, 1, 2), 3)
    on_gpus = plan(strategy=DDPStrategy(parallel_devices=[torch.device("cuda", 2)]), machine=CUDA4)
    assert (on_gpus.accelerator, on_gpus.devices) == ("cuda", (2,))
    raises(
        ValueError,
        "Fabric(devices=3) selects 3 device(s), but DDPStrategy(parallel_devices=...) has 2",
        strategy=DDPStrategy(parallel_devices=[torch.device("cpu")] * 2),
        devices=3,
    )
    for accelerator in ("cuda", "tpu"):
        raises(
            ValueError,
            f"CPU parallel_devices set through DDPStrategy class, but accelerator set to {accelerator}",
            strategy=DDPStrategy(parallel_devices=[torch.device("cpu")]),
            accelerator=accelerator,
            machine=CUDA4,
        )


def test_a_strategy_instance_and_a_plugin_setting_the_same_thing_is_an_error() -> None:
    raises(
        ValueError,
        "Fabric(plugins=[DoublePrecision(...)]) and SingleDeviceStrategy(...) with its own Precision(...) both set the"
        " precision: choose one.",
        strategy=SingleDeviceStrategy(precision=Precision()),
        plugins=[DoublePrecision()],
    )
    raises(
        ValueError,
        "both set the cluster environment",
        strategy=DDPStrategy(cluster_environment=LightningEnvironment()),
        plugins=[LightningEnvironment()],
        devices=2,
    )
    assert plan(strategy=SingleDeviceStrategy(precision=DoublePrecision())).precision == "64-true"


def test_several_plugins_of_a_kind_are_named_in_lightnings_words() -> None:
    raises(
        ValueError,
        "Received multiple values for Precision, ClusterEnvironment flags in `plugins`",
        "(Precision: Precision, DoublePrecision; ClusterEnvironment: LightningEnvironment, SLURMEnvironment)",
        plugins=[Precision(), DoublePrecision(), LightningEnvironment(), SLURMEnvironment(env={})],
    )


def test_model_parallel_refuses_16_mixed_before_the_cpu_would_run_it_as_bf16() -> None:
    from fabric_lite.strategies import ModelParallelStrategy

    raises(
        ValueError,
        "ModelParallelStrategy does not support Fabric(..., precision='16-mixed')",
        strategy=ModelParallelStrategy(lambda model, mesh: model),
        precision="16-mixed",
    )
    assert plan(strategy=ModelParallelStrategy(lambda model, mesh: model), precision="bf16-mixed").precision == (
        "bf16-mixed"
    )


class _OwnKind(Accelerator):
    """A custom accelerator as written for Lightning Fabric: ``name()`` a static method, its own device parsing."""

    @staticmethod
    def name() -> str:  # type: ignore[override]
        return "own_kind"

    @staticmethod
    def parse_devices(devices: Any) -> int:
        return int(devices)

    @staticmethod
    def get_parallel_devices(devices: Any) -> list[torch.device]:
        return [torch.device("cpu")] * devices

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def auto_device_count() -> int:
        return 3


def test_a_custom_accelerator_of_its_own_kind_runs_on_the_devices_it_names() -> None:
    result = plan(accelerator=_OwnKind(), devices=2)
    assert (result.accelerator, result.devices, result.strategy, result.world_size) == ("cpu", (0, 1), "ddp", 2)
    assert plan(accelerator=_OwnKind()).devices == (0, 1, 2)  # its auto_device_count
    held = plan(strategy=SingleDeviceStrategy(accelerator=_OwnKind()), devices=1)
    assert (held.accelerator, held.devices) == ("cpu", (0,))


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"LT_ACCELERATOR": "cpu", "LT_DEVICES": "2"}, ("cpu", (0, 1), "ddp"), id="fill-defaults"),
        pytest.param({"LT_STRATEGY": "ddp_spawn", "LT_CLI_USED": "1"}, ("cpu", (0,), "ddp_spawn"), id="strategy"),
        pytest.param({"LT_ACCELERATOR": "cpu", "LT_CLI_USED": "0"}, ("cpu", (0,), "single_device"), id="not-cli"),
    ],
)
def test_lightnings_cli_variables_are_read(env: dict[str, str], expected: tuple[str, tuple[int, ...], str]) -> None:
    result = plan(env=env)
    assert (result.accelerator, result.devices, result.strategy) == expected


def test_lightnings_cli_variables_win_unless_its_cli_set_them_and_the_script_disagrees() -> None:
    # Lightning's rule: the variable replaces the argument; a disagreement is an error only under its CLI
    assert plan(accelerator="cuda", env={"LT_ACCELERATOR": "cpu"}).accelerator == "cpu"
    raises(
        ValueError,
        "Your code has `Fabric(accelerator='cuda', ...)` but it conflicts with the value `--accelerator=cpu`",
        "LT_ACCELERATOR='cpu'",
        accelerator="cuda",
        env={"LT_ACCELERATOR": "cpu", "LT_CLI_USED": "1"},
    )
    raises(ValueError, "`--num_nodes=3`", num_nodes=2, env={"LT_NUM_NODES": "3", "LT_CLI_USED": "1", **MAIN})
    assert plan(precision="64", env={"LT_PRECISION": "64-true", "LT_CLI_USED": "1"}).precision == "64-true"


def test_machine_detect_reads_through_lightnings_functions(monkeypatch: pytest.MonkeyPatch) -> None:
    from fabric_lite.accelerators import cuda

    monkeypatch.setattr(cuda, "num_cuda_devices", lambda: 3)
    monkeypatch.setattr(MPSAccelerator, "is_available", staticmethod(lambda: True))
    monkeypatch.setattr(torch.multiprocessing, "get_all_start_methods", lambda: ["spawn"])
    assert Machine.detect() == Machine(cuda_devices=3, mps_available=True, interactive=False, can_fork=False)
    monkeypatch.setattr(CUDAAccelerator, "is_available", staticmethod(lambda: False))
    assert Machine.detect().cuda_devices == 0


def test_a_spawned_child_importing_its_script_is_not_interactive(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    bootstrap, script = types.ModuleType("__main__"), types.ModuleType("__mp_main__")
    script.__file__ = "train.py"
    monkeypatch.setitem(sys.modules, "__main__", bootstrap)  # `python -c` or a notebook: no file
    monkeypatch.delitem(sys.modules, "__mp_main__", raising=False)
    assert Machine.detect().interactive
    monkeypatch.setitem(sys.modules, "__mp_main__", script)  # multiprocessing's spawn runs the script under this name
    assert not Machine.detect().interactive
