"""Unit tests for the cluster environments: every getter reads an ``env=`` mapping, never ``os.environ``."""

from __future__ import annotations

import json
import signal
import socket
import sys
import threading
import types
from pathlib import Path
from typing import Any

import pytest

from fabric_lite._plan import Machine, _detect_environment, resolve_plan
from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.environments import mpi as mpi_module
from fabric_lite.plugins.environments.slurm import _note_not_started_by_srun, first_host
from tests.helpers.harness import base_env, lightning_python, run_python

TORCHRUN = {
    "TORCHELASTIC_RUN_ID": "run-1",
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "MASTER_ADDR": "10.1.2.3",
    "MASTER_PORT": "29400",
}

SLURM = {
    "SLURM_NTASKS": "8",
    "SLURM_PROCID": "6",
    "SLURM_LOCALID": "2",
    "SLURM_NODEID": "1",
    "SLURM_NTASKS_PER_NODE": "4",
    "SLURM_NNODES": "2",
    "SLURM_NODELIST": "gpu[007-008]",
    "SLURM_JOB_ID": "987654321",
}


def getters(environment: ClusterEnvironment) -> dict[str, Any]:
    return {
        "external": environment.creates_processes_externally,
        "world_size": environment.world_size(),
        "global_rank": environment.global_rank(),
        "local_rank": environment.local_rank(),
        "node_rank": environment.node_rank(),
        "main_address": environment.main_address,
        "main_port": environment.main_port,
    }


def without(env: dict[str, str], *names: str) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


# -------------------------------------------------------------------------------------------------- Lightning


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(
            {},
            {
                "external": False,
                "world_size": 1,
                "global_rank": 0,
                "local_rank": 0,
                "node_rank": 0,
                "main_address": "127.0.0.1",
                "main_port": 0,
            },
            id="defaults",
        ),
        pytest.param(
            {"MASTER_ADDR": "node0", "MASTER_PORT": "1234", "NODE_RANK": "2"},
            {
                "external": False,
                "world_size": 1,
                "global_rank": 0,
                "local_rank": 0,
                "node_rank": 2,
                "main_address": "node0",
                "main_port": 1234,
            },
            id="manual-multi-node",
        ),
        pytest.param(
            {"GROUP_RANK": "3"},
            {
                "external": False,
                "world_size": 1,
                "global_rank": 0,
                "local_rank": 0,
                "node_rank": 3,
                "main_address": "127.0.0.1",
                "main_port": 0,
            },
            id="GROUP_RANK",
        ),
        pytest.param(
            {"NODE_RANK": "1", "GROUP_RANK": "3"},
            {
                "external": False,
                "world_size": 1,
                "global_rank": 0,
                "local_rank": 0,
                "node_rank": 1,
                "main_address": "127.0.0.1",
                "main_port": 0,
            },
            id="NODE_RANK-wins-over-GROUP_RANK",
        ),
        pytest.param(
            {"LOCAL_RANK": "3", "WORLD_SIZE": "4", "MASTER_PORT": "5555"},
            {
                "external": True,
                "world_size": 4,
                "global_rank": 0,
                "local_rank": 3,
                "node_rank": 0,
                "main_address": "127.0.0.1",
                "main_port": 5555,
            },
            id="launcher-child",
        ),
    ],
)
def test_lightning_getters(env: dict[str, str], expected: dict[str, Any]) -> None:
    assert getters(LightningEnvironment(env=env)) == expected


def test_lightning_setters() -> None:
    environment = LightningEnvironment(env={"WORLD_SIZE": "2"})
    environment.set_world_size(6)
    environment.set_global_rank(5)
    assert (environment.world_size(), environment.global_rank()) == (6, 5)


def test_lightning_detects_always() -> None:
    assert LightningEnvironment.detect({}) is True
    assert LightningEnvironment.detect(TORCHRUN) is True


@pytest.mark.parametrize(
    ("env", "getter", "variable"),
    [
        pytest.param({"MASTER_PORT": "http"}, lambda e: e.main_port, "MASTER_PORT='http'", id="MASTER_PORT"),
        pytest.param({"LOCAL_RANK": "first"}, lambda e: e.local_rank(), "LOCAL_RANK='first'", id="LOCAL_RANK"),
        pytest.param({"NODE_RANK": "1.0"}, lambda e: e.node_rank(), "NODE_RANK='1.0'", id="NODE_RANK"),
        pytest.param({"GROUP_RANK": ""}, lambda e: e.node_rank(), "GROUP_RANK=''", id="GROUP_RANK-empty"),
    ],
)
def test_lightning_non_integer(env: dict[str, str], getter: Any, variable: str) -> None:
    environment = LightningEnvironment(env=env)
    with pytest.raises(ValueError) as excinfo:
        getter(environment)
    assert excinfo.type is ValueError
    assert f"The environment variable {variable} is not an integer." == str(excinfo.value)


def test_lightning_non_integer_world_size_fails_at_construction() -> None:
    with pytest.raises(ValueError, match=r"WORLD_SIZE='2x' is not an integer"):
        LightningEnvironment(env={"WORLD_SIZE": "2x"})


@pytest.mark.parametrize(
    ("env", "num_devices", "num_nodes"),
    [
        pytest.param({}, 4, 1, id="not-a-child"),
        pytest.param({"MASTER_ADDR": "node0", "MASTER_PORT": "29500"}, 4, 3, id="several-nodes-with-main-address"),
        pytest.param({"WORLD_SIZE": "2"}, 4, 1, id="WORLD_SIZE-without-LOCAL_RANK"),
        pytest.param({"LOCAL_RANK": "0"}, 4, 1, id="child-without-WORLD_SIZE"),
        pytest.param({"LOCAL_RANK": "0", "WORLD_SIZE": "4"}, 4, 1, id="child-4x1"),
        pytest.param({"LOCAL_RANK": "0", "WORLD_SIZE": "4"}, 2, 2, id="child-2x2"),
    ],
)
def test_lightning_validate_settings_accepts(env: dict[str, str], num_devices: int, num_nodes: int) -> None:
    assert LightningEnvironment(env=env).validate_settings(num_devices=num_devices, num_nodes=num_nodes) is None


@pytest.mark.parametrize(
    ("env", "missing"),
    [
        pytest.param({}, "MASTER_ADDR and MASTER_PORT", id="neither"),
        pytest.param({"MASTER_ADDR": "node0"}, "MASTER_PORT", id="no-port"),
        pytest.param({"MASTER_PORT": "29500", "NODE_RANK": "1"}, "MASTER_ADDR", id="no-address"),
    ],
)
def test_lightning_validate_settings_several_nodes_need_the_main_address_and_port(
    env: dict[str, str], missing: str
) -> None:
    # without them every node would wait on its own address for the others until the timeout
    with pytest.raises(ValueError) as excinfo:
        LightningEnvironment(env=env).validate_settings(num_devices=2, num_nodes=3)
    message = str(excinfo.value)
    assert f"Fabric(num_nodes=3) without torchrun or SLURM needs {missing}:" in message, message
    assert "NODE_RANK=0, 1, ..." in message


@pytest.mark.parametrize(
    ("world_size", "num_devices", "num_nodes"),
    [pytest.param("4", 2, 1, id="4-vs-2x1"), pytest.param("2", 2, 2, id="2-vs-2x2")],
)
def test_lightning_validate_settings_mismatch(world_size: str, num_devices: int, num_nodes: int) -> None:
    environment = LightningEnvironment(env={"LOCAL_RANK": "1", "WORLD_SIZE": world_size})
    with pytest.raises(ValueError) as excinfo:
        environment.validate_settings(num_devices=num_devices, num_nodes=num_nodes)
    message = str(excinfo.value)
    assert f"WORLD_SIZE={world_size}" in message
    assert f"Fabric(devices={num_devices}, num_nodes={num_nodes})" in message
    assert f"asks for {num_devices * num_nodes} processes" in message


# ----------------------------------------------------------------------------------------------- TorchElastic


def test_torchelastic_getters() -> None:
    environment = TorchElasticEnvironment(env=TORCHRUN)
    assert getters(environment) == {
        "external": True,
        "world_size": 8,
        "global_rank": 5,
        "local_rank": 1,
        "node_rank": 1,
        "main_address": "10.1.2.3",
        "main_port": 29400,
    }
    assert environment.local_world_size() == 4


def test_torchelastic_defaults() -> None:
    environment = TorchElasticEnvironment(
        env=without(TORCHRUN, "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")
    )
    assert (environment.node_rank(), environment.local_world_size()) == (0, None)
    # torchrun always sets the address and port: without them Lightning's defaults, with its warnings
    with pytest.warns(UserWarning, match="MASTER_ADDR environment variable is not defined"):
        assert environment.main_address == "127.0.0.1"
    with pytest.warns(UserWarning, match="MASTER_PORT environment variable is not defined"):
        assert environment.main_port == 12910


def test_torchelastic_setters_change_nothing() -> None:
    environment = TorchElasticEnvironment(env=TORCHRUN)
    environment.set_world_size(2)
    environment.set_global_rank(0)
    assert (environment.world_size(), environment.global_rank()) == (8, 5)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(TORCHRUN, True, id="torchrun"),
        pytest.param({"TORCHELASTIC_RUN_ID": ""}, True, id="empty-run-id"),
        pytest.param(without(TORCHRUN, "TORCHELASTIC_RUN_ID"), False, id="ranks-without-run-id"),
        pytest.param({}, False, id="empty"),
        pytest.param(SLURM, False, id="slurm"),
    ],
)
def test_torchelastic_detect(env: dict[str, str], expected: bool) -> None:
    assert TorchElasticEnvironment.detect(env) is expected


@pytest.mark.parametrize(
    ("missing", "getter"),
    [
        pytest.param("WORLD_SIZE", lambda e: e.world_size(), id="WORLD_SIZE"),
        pytest.param("RANK", lambda e: e.global_rank(), id="RANK"),
        pytest.param("LOCAL_RANK", lambda e: e.local_rank(), id="LOCAL_RANK"),
    ],
)
def test_torchelastic_missing_variable(missing: str, getter: Any) -> None:
    environment = TorchElasticEnvironment(env=without(TORCHRUN, missing))  # constructs: variables are read lazily
    with pytest.raises(RuntimeError) as excinfo:
        getter(environment)
    assert isinstance(excinfo.value, KeyError)  # Lightning's class for a missing variable
    message = str(excinfo.value)
    assert f"The environment variable {missing} is not set" in message
    assert "TorchElasticEnvironment needs it" in message
    assert f"set {missing} yourself" in message


@pytest.mark.parametrize(
    ("name", "getter"),
    [
        pytest.param("MASTER_PORT", lambda e: e.main_port, id="MASTER_PORT"),
        pytest.param("WORLD_SIZE", lambda e: e.world_size(), id="WORLD_SIZE"),
        pytest.param("RANK", lambda e: e.global_rank(), id="RANK"),
        pytest.param("LOCAL_RANK", lambda e: e.local_rank(), id="LOCAL_RANK"),
        pytest.param("GROUP_RANK", lambda e: e.node_rank(), id="GROUP_RANK"),
        pytest.param("LOCAL_WORLD_SIZE", lambda e: e.local_world_size(), id="LOCAL_WORLD_SIZE"),
    ],
)
def test_torchelastic_non_integer(name: str, getter: Any) -> None:
    environment = TorchElasticEnvironment(env={**TORCHRUN, name: "n/a"})
    with pytest.raises(ValueError) as excinfo:
        getter(environment)
    assert str(excinfo.value) == f"The environment variable {name}='n/a' is not an integer."


@pytest.mark.parametrize(
    ("num_devices", "num_nodes"),
    [pytest.param(4, 2, id="4x2")],
)
def test_torchelastic_validate_settings_accepts(num_devices: int, num_nodes: int) -> None:
    assert TorchElasticEnvironment(env=TORCHRUN).validate_settings(num_devices, num_nodes) is None


def test_torchelastic_validate_settings_without_local_world_size() -> None:
    environment = TorchElasticEnvironment(env=without(TORCHRUN, "LOCAL_WORLD_SIZE"))
    assert environment.validate_settings(num_devices=2, num_nodes=4) is None


@pytest.mark.parametrize(
    ("env", "num_devices", "num_nodes", "fragments"),
    [
        pytest.param(
            TORCHRUN,
            2,
            2,
            (
                "Fabric(devices=2)",
                "--nproc-per-node=4",
                "LOCAL_WORLD_SIZE",
                "Set devices=4",
                "start torchrun with --nproc-per-node=2",
            ),
            id="devices-2-vs-LOCAL_WORLD_SIZE-4",
        ),
        pytest.param(
            TORCHRUN,
            4,
            1,
            ("Fabric(devices=4, num_nodes=1)", "asks for 4 processes", "WORLD_SIZE=8", "Set num_nodes=2."),
            id="num_nodes-1-vs-WORLD_SIZE-8",
        ),
        pytest.param(
            without(TORCHRUN, "LOCAL_WORLD_SIZE"),
            3,
            1,
            ("Fabric(devices=3, num_nodes=1)", "asks for 3 processes", "WORLD_SIZE=8"),
            id="no-num_nodes-hint-when-it-does-not-divide",
        ),
    ],
)
def test_torchelastic_validate_settings_mismatch(
    env: dict[str, str], num_devices: int, num_nodes: int, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as excinfo:
        TorchElasticEnvironment(env=env).validate_settings(num_devices=num_devices, num_nodes=num_nodes)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message
    if num_devices == 3:
        assert "Set num_nodes" not in message


# ------------------------------------------------------------------------------------------------------ SLURM


def test_slurm_getters() -> None:
    environment = SLURMEnvironment(env=SLURM)
    assert getters(environment) == {
        "external": True,
        "world_size": 8,
        "global_rank": 6,
        "local_rank": 2,
        "node_rank": 1,
        "main_address": "gpu007",
        "main_port": 15000 + 4321,
    }
    assert environment.tasks_per_node() == 4


def test_slurm_setters_change_nothing() -> None:
    environment = SLURMEnvironment(env=SLURM)
    environment.set_world_size(2)
    environment.set_global_rank(0)
    assert (environment.world_size(), environment.global_rank()) == (8, 6)


def test_slurm_node_rank_needs_slurm_nodeid() -> None:
    # srun sets SLURM_NODEID in every task; as in Lightning, the node rank is not guessed without it
    environment = SLURMEnvironment(env=without(SLURM, "SLURM_NODEID"))
    with pytest.raises(KeyError, match="The environment variable SLURM_NODEID is not set"):
        environment.node_rank()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"MASTER_PORT": "4242", "SLURM_JOB_ID": "1234567"}, 4242, id="MASTER_PORT-wins"),
        pytest.param({"SLURM_JOB_ID": "1234567"}, 19567, id="last-4-digits"),
        pytest.param({"SLURM_JOB_ID": "98760000"}, 15000, id="last-4-digits-zero"),
        pytest.param({"SLURM_JOB_ID": "42"}, 15042, id="short-job-id"),
        pytest.param({"SLURM_JOB_ID": "9999"}, 24999, id="highest"),
        pytest.param({}, 12910, id="no-job-id"),
        pytest.param({"SLURM_JOB_ID": ""}, 12910, id="empty-job-id"),
    ],
)
def test_slurm_main_port(env: dict[str, str], expected: int) -> None:
    assert SLURMEnvironment(env={**without(SLURM, "SLURM_JOB_ID"), **env}).main_port == expected


def test_slurm_main_port_non_integer() -> None:
    with pytest.raises(ValueError) as excinfo:
        SLURMEnvironment(env={**SLURM, "MASTER_PORT": "auto"}).main_port  # noqa: B018
    assert str(excinfo.value) == "The environment variable MASTER_PORT='auto' is not an integer."


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"MASTER_ADDR": "10.0.0.9", "SLURM_NODELIST": "node[3-5]"}, "10.0.0.9", id="MASTER_ADDR-wins"),
        pytest.param({"SLURM_NODELIST": "node[3-5]"}, "node3", id="SLURM_NODELIST"),
        pytest.param({"SLURM_JOB_NODELIST": "cn[10-11]"}, "cn10", id="SLURM_JOB_NODELIST-fallback"),
        pytest.param(
            {"SLURM_NODELIST": "a1", "SLURM_JOB_NODELIST": "b1"},
            "a1",
            id="SLURM_NODELIST-before-JOB_NODELIST",
        ),
        pytest.param({}, "127.0.0.1", id="no-node-list"),
    ],
)
def test_slurm_main_address(env: dict[str, str], expected: str) -> None:
    assert SLURMEnvironment(env={**without(SLURM, "SLURM_NODELIST"), **env}).main_address == expected


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        pytest.param("node[3-5,9]", "node3", id="range-and-list"),
        pytest.param("gpu[007-009],cpu1", "gpu007", id="zero-padded-then-plain"),
        pytest.param("rack[1-2]-n[4,6]", "rack1-n4", id="two-bracket-groups"),
        pytest.param("a b", "a", id="space-separated"),
        pytest.param("a,b", "a", id="comma-separated"),
        pytest.param("n[5]", "n5", id="single-entry-range"),
        pytest.param("host0", "host0", id="single-host"),
        pytest.param("  node1,node2 ", "node1", id="surrounding-spaces"),
        pytest.param("node[12,3-4]", "node12", id="list-first"),
        pytest.param("cpu1,gpu[007-009]", "cpu1", id="plain-then-range"),
        pytest.param("10.0.0.1,10.0.0.2", "10.0.0.1", id="ip-addresses"),
    ],
)
def test_first_host(nodelist: str, expected: str) -> None:
    assert first_host(nodelist) == expected


@pytest.mark.parametrize("nodelist", [pytest.param("", id="empty"), pytest.param("   ", id="blank")])
def test_first_host_empty(nodelist: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        first_host(nodelist)
    assert "SLURM_NODELIST is empty" in str(excinfo.value)
    assert "Set MASTER_ADDR" in str(excinfo.value)


def test_slurm_main_address_empty_node_list() -> None:
    with pytest.raises(ValueError, match="SLURM_NODELIST is empty"):
        SLURMEnvironment(env={**SLURM, "SLURM_NODELIST": ""}).main_address  # noqa: B018


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(SLURM, True, id="srun"),
        # SLURM sets SLURM_PROCID for every task: without it, in a job, this is an salloc shell, not a task
        pytest.param({"SLURM_NTASKS": "2", "SLURM_JOB_ID": "7"}, False, id="NTASKS-in-a-job-without-a-task"),
        # variables set by hand, without a job: Lightning's rule (SLURM_NTASKS, and not an interactive job name)
        pytest.param({"SLURM_NTASKS": "2"}, True, id="only-NTASKS-by-hand"),
        pytest.param({"SLURM_NTASKS": "2", "SLURM_JOB_NAME": "bash"}, False, id="only-NTASKS-by-hand-bash"),
        pytest.param({"SLURM_NTASKS": "1", "SLURM_PROCID": "0"}, True, id="NTASKS-and-PROCID"),
        pytest.param({**SLURM, "SLURM_JOB_NAME": "train"}, True, id="batch-job-name"),
        pytest.param({**SLURM, "SLURM_JOB_NAME": "bash"}, False, id="job-name-bash"),
        pytest.param({**SLURM, "SLURM_JOB_NAME": "interactive"}, False, id="job-name-interactive"),
        pytest.param({**SLURM, "SLURM_JOB_NAME": "Bash"}, True, id="job-name-Bash-is-a-batch-job"),
        pytest.param(without(SLURM, "SLURM_NTASKS"), False, id="no-NTASKS"),
        pytest.param({}, False, id="empty"),
        pytest.param(TORCHRUN, False, id="torchrun"),
    ],
)
def test_slurm_detect(env: dict[str, str], expected: bool) -> None:
    assert SLURMEnvironment.detect(env) is expected


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param({"SLURM_NTASKS_PER_NODE": "4"}, 4, id="NTASKS_PER_NODE"),
        pytest.param({"SLURM_NTASKS_PER_NODE": "3", "SLURM_TASKS_PER_NODE": "2(x3)"}, 3, id="NTASKS_PER_NODE-wins"),
        pytest.param({"SLURM_TASKS_PER_NODE": "2(x3)"}, 2, id="2(x3)"),
        pytest.param({"SLURM_TASKS_PER_NODE": "4"}, 4, id="4"),
        pytest.param({"SLURM_TASKS_PER_NODE": "12(x2)"}, 12, id="12(x2)"),
        pytest.param({"SLURM_TASKS_PER_NODE": "2(x2),2"}, 2, id="uniform-2(x2),2"),
        pytest.param({"SLURM_TASKS_PER_NODE": "2,1"}, None, id="uneven-2,1"),
        pytest.param({"SLURM_TASKS_PER_NODE": "3(x2),1"}, None, id="uneven-3(x2),1"),
        pytest.param({"SLURM_TASKS_PER_NODE": ""}, None, id="empty"),
        pytest.param({}, None, id="absent"),
    ],
)
def test_slurm_tasks_per_node(env: dict[str, str], expected: int | None) -> None:
    base = without(SLURM, "SLURM_NTASKS_PER_NODE")
    assert SLURMEnvironment(env={**base, **env}).tasks_per_node() == expected


@pytest.mark.parametrize(
    ("missing", "getter"),
    [
        pytest.param("SLURM_NTASKS", lambda e: e.world_size(), id="SLURM_NTASKS"),
        pytest.param("SLURM_PROCID", lambda e: e.global_rank(), id="SLURM_PROCID"),
        pytest.param("SLURM_LOCALID", lambda e: e.local_rank(), id="SLURM_LOCALID"),
    ],
)
def test_slurm_missing_variable(missing: str, getter: Any) -> None:
    environment = SLURMEnvironment(env=without(SLURM, missing))
    with pytest.raises(RuntimeError) as excinfo:
        getter(environment)
    message = str(excinfo.value)
    assert f"The environment variable {missing} is not set" in message
    assert "SLURMEnvironment needs it" in message


@pytest.mark.parametrize(
    ("name", "getter"),
    [
        pytest.param("SLURM_NTASKS", lambda e: e.world_size(), id="SLURM_NTASKS"),
        pytest.param("SLURM_PROCID", lambda e: e.global_rank(), id="SLURM_PROCID"),
        pytest.param("SLURM_LOCALID", lambda e: e.local_rank(), id="SLURM_LOCALID"),
        pytest.param("SLURM_NODEID", lambda e: e.node_rank(), id="SLURM_NODEID"),
        pytest.param("SLURM_NTASKS_PER_NODE", lambda e: e.tasks_per_node(), id="SLURM_NTASKS_PER_NODE"),
        pytest.param("SLURM_NNODES", lambda e: e.validate_settings(4, 2), id="SLURM_NNODES"),
    ],
)
def test_slurm_non_integer(name: str, getter: Any) -> None:
    environment = SLURMEnvironment(env={**SLURM, name: "4(x2)"})
    with pytest.raises(ValueError) as excinfo:
        getter(environment)
    assert str(excinfo.value) == f"The environment variable {name}='4(x2)' is not an integer."


@pytest.mark.parametrize(
    ("env", "num_devices", "num_nodes"),
    [
        pytest.param(SLURM, 4, 2, id="4x2"),
        pytest.param(without(SLURM, "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"), 8, 1, id="NTASKS-only-8x1"),
        pytest.param(without(SLURM, "SLURM_NTASKS_PER_NODE", "SLURM_NNODES"), 2, 4, id="NTASKS-only-2x4"),
        pytest.param(
            {**without(SLURM, "SLURM_NTASKS_PER_NODE"), "SLURM_TASKS_PER_NODE": "4(x2)"},
            4,
            2,
            id="TASKS_PER_NODE",
        ),
    ],
)
def test_slurm_validate_settings_accepts(env: dict[str, str], num_devices: int, num_nodes: int) -> None:
    assert SLURMEnvironment(env=env).validate_settings(num_devices=num_devices, num_nodes=num_nodes) is None


@pytest.mark.parametrize(
    ("env", "num_devices", "num_nodes", "fragments"),
    [
        pytest.param(
            SLURM,
            2,
            2,
            (
                "Fabric(devices=2)",
                "SLURM's 4 tasks per node",
                "SLURM_NTASKS_PER_NODE=4",
                "Set devices=4",
                "ask SLURM for --ntasks-per-node=2",
            ),
            id="devices-2-vs-per-node-4",
        ),
        pytest.param(
            SLURM,
            4,
            1,
            ("Fabric(num_nodes=1)", "SLURM's --nodes=2", "SLURM_NNODES", "Set num_nodes=2", "--nodes=1"),
            id="num_nodes-1-vs-NNODES-2",
        ),
        pytest.param(
            without(SLURM, "SLURM_NTASKS_PER_NODE"),
            2,
            2,
            (
                "Fabric(devices=2, num_nodes=2)",
                "asks for 4 processes",
                "SLURM started 8 tasks",
                "SLURM_NTASKS",
                "srun --ntasks-per-node=2 --nodes=2",
            ),
            id="processes-4-vs-NTASKS-8",
        ),
        pytest.param(
            {**without(SLURM, "SLURM_NTASKS_PER_NODE"), "SLURM_TASKS_PER_NODE": "4(x2)"},
            3,
            2,
            ("Fabric(devices=3)", "SLURM's 4 tasks per node"),
            id="devices-3-vs-TASKS_PER_NODE-4(x2)",
        ),
    ],
)
def test_slurm_validate_settings_mismatch(
    env: dict[str, str], num_devices: int, num_nodes: int, fragments: tuple[str, ...]
) -> None:
    with pytest.raises(ValueError) as excinfo:
        SLURMEnvironment(env=env).validate_settings(num_devices=num_devices, num_nodes=num_nodes)
    message = str(excinfo.value)
    for fragment in fragments:
        assert fragment in message


# The variables that SLURM 22.05 really sets (recorded on the one-node cluster of tests/tiers/slurm/test_slurm.py; only
# the ones fabric_lite reads, plus the markers that tell the contexts apart).
SRUN_TASK = {  # `srun -n 2 python train.py`, task 1
    "SLURM_JOB_ID": "11",
    "SLURM_JOB_NAME": "python",
    "SLURM_NTASKS": "2",
    "SLURM_NNODES": "1",
    "SLURM_NODELIST": "localhost",
    "SLURM_TASKS_PER_NODE": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "1",
    "SLURM_NODEID": "0",
    "SLURM_STEP_ID": "0",
    "SLURM_STEPID": "0",
    "SLURM_STEP_NUM_TASKS": "2",
    "SLURM_STEP_NUM_NODES": "1",
    "SLURM_STEP_TASKS_PER_NODE": "2",
}
STEP_KEYS = ("SLURM_STEP_ID", "SLURM_STEPID", "SLURM_STEP_NUM_TASKS", "SLURM_STEP_NUM_NODES")
STEP_KEYS += ("SLURM_STEP_TASKS_PER_NODE",)
# `sbatch -n 2` running `python train.py` without srun: one process, rank-0 variables, no step
BATCH_SCRIPT = {**without(SRUN_TASK, *STEP_KEYS), "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "ENVIRONMENT": "BATCH"}
# `srun -n 2 python train.py` inside that batch script: the step's variables, and the batch marker inherited
BATCH_STEP = {**SRUN_TASK, "ENVIRONMENT": "BATCH", "SLURM_JOB_NAME": "train"}
# `salloc -n 2`: the shell runs on the submit host; no task, no step; salloc names the job "interactive"
SALLOC_SHELL = {
    **without(SRUN_TASK, *STEP_KEYS, "SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID"),
    "SLURM_JOB_NAME": "interactive",
}
# `srun -n 2 python train.py` typed in that salloc shell: the tasks inherit the job name
SALLOC_STEP = {**SRUN_TASK, "SLURM_JOB_NAME": "interactive"}
# `srun --pty bash` (one task, job named "bash"), then `python train.py` typed in that shell
PTY_BASH = {
    **SRUN_TASK,
    "SLURM_JOB_NAME": "bash",
    "SLURM_NTASKS": "1",
    "SLURM_TASKS_PER_NODE": "1",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
    "SLURM_STEP_NUM_TASKS": "1",
    "SLURM_STEP_TASKS_PER_NODE": "1",
}


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        pytest.param(SRUN_TASK, True, id="srun-task"),
        pytest.param(BATCH_STEP, True, id="srun-task-in-batch-script"),
        pytest.param(BATCH_SCRIPT, False, id="batch-script-without-srun"),
        pytest.param({**BATCH_SCRIPT, "SLURM_JOB_NAME": "bash"}, False, id="batch-script-named-bash"),
        pytest.param(SALLOC_SHELL, False, id="salloc-shell"),
        pytest.param({**SALLOC_SHELL, "SLURM_JOB_NAME": "train"}, False, id="salloc-shell-named-train"),
        pytest.param(SALLOC_STEP, True, id="srun-n2-in-salloc-named-interactive"),
        pytest.param({**SRUN_TASK, "SLURM_JOB_NAME": "bash"}, True, id="srun-n2-job-named-bash"),
        pytest.param(PTY_BASH, False, id="srun-pty-bash-shell"),
        pytest.param({**PTY_BASH, "SLURM_JOB_NAME": "train"}, True, id="one-task-step-named-train"),
        pytest.param({**PTY_BASH, "SLURM_STEP_NUM_TASKS": "?"}, False, id="unreadable-step-count-uses-job-name"),
    ],
)
def test_slurm_detect_real_contexts(env: dict[str, str], expected: bool) -> None:
    assert SLURMEnvironment.detect(env) is expected


def test_slurm_step_tasks_per_node_wins_over_inherited_ntasks_per_node() -> None:
    # `sbatch --ntasks-per-node=2` job, then `srun -n 1` in it: the step inherits SLURM_NTASKS_PER_NODE=2
    step = {**PTY_BASH, "SLURM_JOB_NAME": "train", "SLURM_NTASKS_PER_NODE": "2"}
    environment = SLURMEnvironment(env=step)
    assert environment.tasks_per_node() == 1
    environment.validate_settings(num_devices=1, num_nodes=1)
    with pytest.raises(ValueError) as excinfo:
        environment.validate_settings(num_devices=2, num_nodes=1)
    message = str(excinfo.value)
    for fragment in ("Fabric(devices=2)", "SLURM's 1 tasks per node", "SLURM_STEP_TASKS_PER_NODE=1", "Set devices=1"):
        assert fragment in message


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        pytest.param("2(x3)", 2, id="2(x3)"),
        pytest.param("2,1", None, id="uneven"),
        pytest.param("", None, id="empty"),
    ],
)
def test_slurm_step_tasks_per_node_spec(spec: str, expected: int | None) -> None:
    # an uneven step says None even where the job-wide SLURM_NTASKS_PER_NODE would give a number
    env = {**SRUN_TASK, "SLURM_STEP_TASKS_PER_NODE": spec, "SLURM_NTASKS_PER_NODE": "2"}
    assert SLURMEnvironment(env=env).tasks_per_node() == expected


@pytest.mark.parametrize(
    ("env", "expected", "variable"),
    [
        pytest.param(SRUN_TASK, 1, "SLURM_STEP_NUM_NODES", id="step"),
        pytest.param(
            {**SRUN_TASK, "SLURM_STEP_NUM_NODES": "1", "SLURM_NNODES": "3"}, 1, "SLURM_STEP_NUM_NODES", id="step-wins"
        ),
        pytest.param(without(SRUN_TASK, "SLURM_STEP_NUM_NODES"), 1, "SLURM_NNODES", id="job"),
        pytest.param(without(SRUN_TASK, "SLURM_STEP_NUM_NODES", "SLURM_NNODES"), None, None, id="absent"),
    ],
)
def test_slurm_num_nodes(env: dict[str, str], expected: int | None, variable: str | None) -> None:
    environment = SLURMEnvironment(env=env)
    assert environment.num_nodes() == expected
    if variable is not None:
        with pytest.raises(ValueError) as excinfo:
            environment.validate_settings(num_devices=2, num_nodes=2)
        assert f"({variable})" in str(excinfo.value)
        assert "Set num_nodes=1" in str(excinfo.value)


@pytest.mark.parametrize(
    ("env", "where"),
    [
        pytest.param(BATCH_SCRIPT, "the batch script of SLURM job 11", id="batch-script"),
        pytest.param(SALLOC_SHELL, "an salloc shell of SLURM job 11", id="salloc-shell"),
        pytest.param(
            {**without(SRUN_TASK, *STEP_KEYS), "SLURM_JOB_NAME": "bash"},
            "an interactive job (SLURM_JOB_NAME='bash')",
            id="hand-set-job-named-bash",
        ),
    ],
)
def test_slurm_note_when_srun_did_not_start_the_process(env: dict[str, str], where: str) -> None:
    note = _note_not_started_by_srun(env, 2)
    assert note is not None
    for fragment in (where, "SLURM_NTASKS=2", "fabric_lite runs 2 process(es)", "srun --ntasks-per-node=2"):
        assert fragment in note


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="outside-SLURM"),
        pytest.param(SRUN_TASK, id="srun-task"),
        pytest.param(SALLOC_STEP, id="srun-task-in-salloc"),
        pytest.param(PTY_BASH, id="one-task-shell"),
        pytest.param({**BATCH_SCRIPT, "SLURM_NTASKS": "1"}, id="one-task-batch-job"),
        pytest.param({**SALLOC_SHELL, "SLURM_NTASKS": "n/a"}, id="unreadable-NTASKS"),
    ],
)
def test_slurm_no_note(env: dict[str, str]) -> None:
    assert _note_not_started_by_srun(env, 2) is None


@pytest.mark.parametrize(
    ("env", "kwargs", "environment", "start_method", "world_size", "noted"),
    [
        pytest.param(SRUN_TASK, {}, SLURMEnvironment, None, 2, False, id="srun-task-auto-devices"),
        pytest.param(SALLOC_STEP, {}, SLURMEnvironment, None, 2, False, id="srun-task-in-salloc"),
        pytest.param(BATCH_SCRIPT, {"devices": 2}, LightningEnvironment, "popen", 2, True, id="batch-script"),
        pytest.param(BATCH_SCRIPT, {}, LightningEnvironment, None, 1, True, id="batch-script-one-process"),
        pytest.param(SALLOC_SHELL, {"devices": 2}, LightningEnvironment, "popen", 2, True, id="salloc-shell"),
        pytest.param(PTY_BASH, {"devices": 2}, LightningEnvironment, "popen", 2, False, id="srun-pty-bash"),
    ],
)
def test_slurm_contexts_in_the_plan(
    env: dict[str, str],
    kwargs: dict[str, Any],
    environment: type[ClusterEnvironment],
    start_method: str | None,
    world_size: int,
    noted: bool,
) -> None:
    plan = resolve_plan(accelerator="cpu", env=env, machine=Machine(), **kwargs)
    assert type(plan.cluster_environment) is environment
    assert (plan.start_method, plan.world_size) == (start_method, world_size)
    assert any("srun did not start it" in warning for warning in plan.warnings) is noted, plan.warnings


# -------------------------------------------------------------------------------------------- common contract


@pytest.mark.parametrize(
    "cls", [LightningEnvironment, TorchElasticEnvironment, SLURMEnvironment], ids=lambda c: c.__name__
)
def test_env_mapping_is_copied(cls: type[ClusterEnvironment]) -> None:
    env = {**TORCHRUN, **SLURM}
    environment = cls(env=env)
    before = environment.global_rank()
    env["RANK"] = env["SLURM_PROCID"] = "0"
    assert environment.global_rank() == before


@pytest.mark.parametrize(
    ("cls", "variable", "getter", "expected"),
    [
        pytest.param(LightningEnvironment, "NODE_RANK", lambda e: e.node_rank(), 3, id="Lightning"),
        pytest.param(TorchElasticEnvironment, "RANK", lambda e: e.global_rank(), 3, id="TorchElastic"),
        pytest.param(SLURMEnvironment, "SLURM_PROCID", lambda e: e.global_rank(), 3, id="SLURM"),
    ],
)
def test_default_env_is_os_environ_read_at_each_call(
    monkeypatch: pytest.MonkeyPatch, cls: type[ClusterEnvironment], variable: str, getter: Any, expected: int
) -> None:
    # as in Lightning: a variable set (or changed) after the environment was created counts
    monkeypatch.setenv(variable, "7")
    environment = cls()
    monkeypatch.setenv(variable, str(expected))
    assert getter(environment) == expected


@pytest.mark.parametrize(
    ("cls", "variables"),
    [
        pytest.param(TorchElasticEnvironment, ("TORCHELASTIC_RUN_ID",), id="TorchElastic"),
        pytest.param(SLURMEnvironment, ("SLURM_NTASKS", "SLURM_PROCID"), id="SLURM"),
    ],
)
def test_detect_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch, cls: Any, variables: tuple[str, ...]) -> None:
    for name in ("SLURM_JOB_NAME", "SLURM_STEP_ID", "SLURM_STEPID", "ENVIRONMENT"):
        monkeypatch.delenv(name, raising=False)
    for name in variables:
        monkeypatch.setenv(name, "1")
    assert cls.detect() is True
    assert cls.detect({}) is False
    monkeypatch.delenv(variables[0])
    assert cls.detect() is False


def test_teardown_does_nothing_by_default() -> None:
    environment = TorchElasticEnvironment(env=TORCHRUN)
    assert environment.teardown() is None
    assert environment.world_size() == 8


@pytest.mark.parametrize(
    ("env", "rank", "hosts", "prefix"),
    [
        pytest.param({"TORCHELASTIC_USE_AGENT_STORE": "True"}, 0, False, "fabric_lite/attempt_0", id="agent-store"),
        pytest.param({"TORCHELASTIC_USE_AGENT_STORE": "False"}, 0, True, "fabric_lite/attempt_0", id="rank0-hosts"),
        pytest.param({}, 1, False, "fabric_lite/attempt_0", id="rank1-never-hosts"),
        pytest.param({"TORCHELASTIC_RESTART_COUNT": "2"}, 0, True, "fabric_lite/attempt_2", id="third-attempt"),
    ],
)
def test_torchelastic_store_host_and_attempt_prefix(env: dict, rank: int, hosts: bool, prefix: str) -> None:
    """A restarted torchrun attempt must not read the keys of the attempt that died (stale gloo addresses)."""
    environment = TorchElasticEnvironment({"TORCHELASTIC_RUN_ID": "x", **env})
    assert environment.hosts_store(rank) is hosts
    assert environment.store_prefix() == prefix


@pytest.mark.parametrize("cls", [LightningEnvironment, SLURMEnvironment])
def test_other_environments_host_on_rank_zero_without_prefix(cls: type) -> None:
    environment = cls(env={})
    assert environment.hosts_store(0) is True and environment.hosts_store(1) is False
    assert environment.store_prefix() == ""


# ----------------------------------------------------------------------------------- Kubeflow and LSF vs Lightning

KUBEFLOW = {
    "KUBERNETES_PORT": "tcp://10.0.0.1:443",
    "MASTER_ADDR": "job-master-0",
    "MASTER_PORT": "23456",
    "WORLD_SIZE": "4",
    "RANK": "2",
}
HOST = socket.gethostname()


def lsf_env(rankfile: Path, lines: list[str], **extra: str) -> dict[str, str]:
    rankfile.write_text("".join(f"{line}\n" for line in lines))
    env = {
        "LSB_JOBID": "123456",
        "LSB_DJOB_RANKFILE": str(rankfile),
        "JSM_NAMESPACE_RANK": "3",
        "JSM_NAMESPACE_LOCAL_RANK": "1",
        "JSM_NAMESPACE_SIZE": "4",
    }
    return {**env, **extra}


def comparison_cases(tmp: Path) -> list[tuple[str, str, dict[str, str], dict[str, Any]]]:
    """(id, class, env, what fabric_lite must report): the same variables are given to Lightning's class."""
    kubeflow = {
        "creates_processes_externally": True,
        "main_address": "job-master-0",
        "main_port": 23456,
        "world_size": 4,
        "global_rank": 2,
        "local_rank": 0,
        "node_rank": 2,
    }
    lsf_first = {
        "creates_processes_externally": True,
        "main_address": HOST,
        "main_port": 10456,  # 10000 + 123456 % 1000
        "world_size": 4,
        "global_rank": 3,
        "local_rank": 1,
        "node_rank": 0,
    }
    # launcher environments constructed where nothing is set: every rank is an error when read
    missing = {"creates_processes_externally": True, "world_size": "error", "global_rank": "error"}
    missing |= {"local_rank": "error", "node_rank": "error"}
    getters_of_torchrun = {"creates_processes_externally": True, "main_address": "10.1.2.3", "main_port": 29400}
    getters_of_torchrun |= {"world_size": 8, "global_rank": 5, "local_rank": 1, "node_rank": 1}
    return [
        ("kubeflow", "KubeflowEnvironment", KUBEFLOW, {"detect": "NotImplementedError", **kubeflow}),
        (
            "kubeflow-rank0",
            "KubeflowEnvironment",
            {**KUBEFLOW, "RANK": "0", "WORLD_SIZE": "1"},
            {"detect": "NotImplementedError", **kubeflow, "world_size": 1, "global_rank": 0, "node_rank": 0},
        ),
        (
            "kubeflow-no-rank",
            "KubeflowEnvironment",
            without(KUBEFLOW, "RANK"),
            {"detect": "NotImplementedError", **kubeflow, "global_rank": "error", "node_rank": "error"},
        ),
        (
            "lsf-first-host",
            "LSFEnvironment",
            lsf_env(tmp / "a", ["batch1", HOST, HOST, "other7", "other7"]),
            {"detect": True, **lsf_first},
        ),
        (
            "lsf-second-host-master-port",
            "LSFEnvironment",
            lsf_env(tmp / "b", ["batch1", "nodeA", "nodeA", HOST, HOST], MASTER_PORT="29400"),
            {"detect": True, **lsf_first, "main_address": "nodeA", "main_port": 29400, "node_rank": 1},
        ),
        (
            "lsf-third-host",
            "LSFEnvironment",
            lsf_env(tmp / "c", ["launch", "n1", "n2", "n2", HOST], LSB_JOBID="7"),
            {"detect": True, **lsf_first, "main_address": "n1", "main_port": 10007, "node_rank": 2},
        ),
        (
            "lsf-no-size",
            "LSFEnvironment",
            without(lsf_env(tmp / "d", ["batch1", HOST]), "JSM_NAMESPACE_SIZE"),
            {"detect": False, **lsf_first, "world_size": "error"},
        ),
        (
            "lsf-empty-rankfile-variable",
            "LSFEnvironment",
            {**lsf_env(tmp / "e", ["batch1", HOST]), "LSB_DJOB_RANKFILE": ""},
            {"detect": True, "construct": "error"},
        ),
        (
            "slurm-task",
            "SLURMEnvironment",
            SLURM,
            {
                "detect": True,
                **kubeflow,
                "main_address": "gpu007",
                "main_port": 15000 + 4321,
                "world_size": 8,
                "global_rank": 6,
                "local_rank": 2,
                "node_rank": 1,
            },
        ),
        (
            "slurm-nothing-set",
            "SLURMEnvironment",
            {},
            {"detect": False, **missing, "main_address": "127.0.0.1", "main_port": 12910},
        ),
        ("torchelastic", "TorchElasticEnvironment", TORCHRUN, {"detect": True, **getters_of_torchrun}),
        (
            "torchelastic-nothing-set",
            "TorchElasticEnvironment",
            {},
            {"detect": False, **missing, "main_address": "127.0.0.1", "main_port": 12910, "node_rank": 0},
        ),
    ]


def observe(python: str | None, impl: str, cases: list[dict[str, Any]], tmp: Path) -> list[dict[str, Any]]:
    path = tmp / f"cases-{impl}.json"
    path.write_text(json.dumps(cases))
    done = run_python(["tests/helpers/scripts/environment_observer.py", impl, str(path)], timeout=120, python=python)
    assert done.returncode == 0, done.output
    line = next(line for line in done.stdout.splitlines() if line.startswith("OBS "))
    return json.loads(line[4:])  # type: ignore[no-any-return]


@pytest.mark.timeout(240)
def test_launcher_environments_report_what_lightning_reports(tmp_path: Path) -> None:
    cases = comparison_cases(tmp_path)
    payload = [{"cls": cls, "env": env} for _, cls, env, _ in cases]
    ours = observe(None, "fabric_lite", payload, tmp_path)
    for (case_id, _, _, expected), row in zip(cases, ours):
        assert {key: row[key] for key in expected if key in row} == expected, (case_id, row)
        assert row["construct"] == expected.get("construct", "ok"), (case_id, row)
    python = lightning_python()
    if python is None:
        pytest.skip("no Lightning Fabric venv to compare with: run .ci/setup (or set LIGHTNING_PYTHON)")
    theirs = observe(python, "lightning", payload, tmp_path)
    for (case_id, *_), mine, lightning in zip(cases, ours, theirs):
        assert mine == lightning, f"{case_id}: fabric_lite {mine} != Lightning {lightning}"


def test_kubeflow_reads_the_mapping_not_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "9")
    environment = KubeflowEnvironment(env=KUBEFLOW)
    assert (environment.global_rank(), environment.node_rank(), environment.local_rank()) == (2, 2, 0)
    environment.set_global_rank(5)
    environment.set_world_size(9)
    assert (environment.global_rank(), environment.world_size()) == (2, 4)
    with pytest.raises(NotImplementedError, match="pass Fabric\\(plugins=\\[KubeflowEnvironment\\(\\)\\]\\)"):
        KubeflowEnvironment.detect(KUBEFLOW)
    with pytest.raises(RuntimeError, match="MASTER_ADDR is not set"):
        KubeflowEnvironment(env=without(KUBEFLOW, "MASTER_ADDR")).main_address  # noqa: B018


def test_kubeflow_in_the_plan() -> None:
    plan = resolve_plan(accelerator="cpu", num_nodes=4, plugins=[KubeflowEnvironment(env=KUBEFLOW)], env=KUBEFLOW,
                        machine=Machine())  # fmt: skip
    assert (plan.strategy, plan.devices, plan.world_size, plan.start_method) == ("ddp", (0,), 4, None)
    # never detected from its variables (as in Lightning): torchrun and people set the same ones
    assert type(resolve_plan(accelerator="cpu", env=KUBEFLOW, machine=Machine()).cluster_environment) is (
        LightningEnvironment
    )
    # one process per pod, checked at launch (Fabric(...) constructs, as in Lightning)
    one_node = resolve_plan(accelerator="cpu", plugins=[KubeflowEnvironment(env=KUBEFLOW)], env=KUBEFLOW,
                            machine=Machine())  # fmt: skip
    with pytest.raises(ValueError, match="Set devices=1, num_nodes=4"):
        one_node.validate_settings()


def test_lsf_hosts_from_lsb_hosts_without_a_rankfile() -> None:
    env = {"LSB_JOBID": "42", "LSB_HOSTS": f"batch1 {HOST} {HOST} n2", "JSM_NAMESPACE_RANK": "0",
           "JSM_NAMESPACE_LOCAL_RANK": "0", "JSM_NAMESPACE_SIZE": "3"}  # fmt: skip
    environment = LSFEnvironment(env=env)
    assert (environment.main_address, environment.main_port, environment.node_rank()) == (HOST, 10042, 0)
    assert LSFEnvironment.detect(env) is False  # detection needs jsrun's rank file, as in Lightning


@pytest.mark.parametrize(
    ("lines", "extra", "message"),
    [
        pytest.param(["batch1"], {}, "lists no compute host after the launch node", id="launch-node-only"),
        pytest.param(["batch1", "n1"], {"LSB_JOBID": "x"}, "LSB_JOBID='x' is not an integer", id="bad-job-id"),
        pytest.param(["b", "n1", "n2"], {"LSB_DJOB_RANKFILE": "/nonexistent/rankfile"}, "Cannot read", id="no-file"),
    ],
)
def test_lsf_errors_at_construction(tmp_path: Path, lines: list[str], extra: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        LSFEnvironment(env={**lsf_env(tmp_path / "rankfile", lines), **extra})


def test_lsf_host_not_in_the_rankfile(tmp_path: Path) -> None:
    environment = LSFEnvironment(env=lsf_env(tmp_path / "rankfile", ["batch1", "n1", "n2"]))
    assert environment.main_address == "n1"
    with pytest.raises(RuntimeError, match=f"host name {HOST!r} is not among the LSF job's compute hosts"):
        environment.node_rank()


def test_lsf_in_the_plan(tmp_path: Path) -> None:
    env = lsf_env(tmp_path / "rankfile", ["batch1", HOST, HOST], JSM_NAMESPACE_SIZE="2", JSM_NAMESPACE_RANK="1")
    plan = resolve_plan(accelerator="cpu", devices=2, env=env, machine=Machine())
    assert type(plan.cluster_environment) is LSFEnvironment
    assert (plan.strategy, plan.world_size, plan.start_method) == ("ddp", 2, None)
    assert plan.cluster_environment.global_rank() == 1


# ------------------------------------------------------------------------------------------------------------ MPI


class _ImportRecorder:
    """A meta-path finder that records every attempt to import mpi4py and finds nothing."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> None:
        if name.split(".")[0] == "mpi4py":
            self.names.append(name)


@pytest.fixture
def mpi4py_imports(monkeypatch: pytest.MonkeyPatch) -> _ImportRecorder:
    for name in ("mpi4py", "mpi4py.MPI"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    recorder = _ImportRecorder()
    monkeypatch.setattr(sys, "meta_path", [recorder, *sys.meta_path])
    return recorder


@pytest.mark.parametrize(
    "env",
    [
        pytest.param({}, id="plain-run"),
        pytest.param(TORCHRUN, id="torchrun"),
        pytest.param({"OMPI_COMM_WORLD_SIZE": "1", "OMPI_COMM_WORLD_RANK": "0"}, id="mpirun-np-1"),
        pytest.param({"PMI_SIZE": "1"}, id="hydra-np-1"),
    ],
)
def test_mpi_detect_imports_nothing_without_an_mpi_launcher(
    mpi4py_imports: _ImportRecorder, env: dict[str, str]
) -> None:
    assert MPIEnvironment.detect(env) is False
    assert type(_detect_environment(env, ())) is not MPIEnvironment
    assert mpi4py_imports.names == []


def test_mpi_detect_under_a_launcher_without_mpi4py(mpi4py_imports: _ImportRecorder) -> None:
    env = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_RANK": "1"}
    if "mpi4py" in {m.name for m in __import__("pkgutil").iter_modules()}:
        pytest.skip("mpi4py is installed in this interpreter")
    assert MPIEnvironment.detect(env) is False  # as Lightning: without mpi4py, not MPI
    assert mpi4py_imports.names == ["mpi4py"]
    assert type(resolve_plan(accelerator="cpu", env=env, machine=Machine()).cluster_environment) is (
        LightningEnvironment
    )


def test_mpi_environment_without_mpi4py_says_how_to_install_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "mpi4py", None)  # as if not installed, even where it is
    with pytest.raises(ModuleNotFoundError, match=r"needs the mpi4py package.*`pip install mpi4py`"):
        MPIEnvironment()


class _FakeWorld:
    """``COMM_WORLD`` of one rank of a job whose ranks run on ``hosts``: rank 0 gathers, and records what it
    broadcasts in ``sent``; another rank receives those values in order (so rank 0 runs first)."""

    def __init__(self, rank: int, hosts: list[str], sent: list[Any]) -> None:
        self.rank, self.hosts, self.sent, self.received = rank, hosts, sent, 0

    def Get_rank(self) -> int:  # mpi4py's names
        return self.rank

    def Get_size(self) -> int:
        return len(self.hosts)

    def gather(self, obj: Any, root: int = 0) -> list[Any] | None:
        assert obj == self.hosts[self.rank]
        return list(self.hosts) if self.rank == root else None

    def bcast(self, obj: Any, root: int = 0) -> Any:
        if self.rank == root:
            self.sent.append(obj)
            return obj
        self.received += 1
        return self.sent[self.received - 1]

    def Split(self, color: int, key: int) -> Any:
        local = [r for r, host in enumerate(self.hosts) if host == self.hosts[self.rank]]
        return type("Local", (), {"Get_rank": lambda _: local.index(key), "Get_size": lambda _: len(local)})()


@pytest.mark.parametrize("asked_first", ["main_address", "main_port"])
def test_mpi_ranks_and_nodes_from_host_names(monkeypatch: pytest.MonkeyPatch, asked_first: str) -> None:
    hosts = ["b-host", "b-host", "a-host", "a-host", "a-host"]  # node indices follow the sorted names
    expected = {0: (1, 0), 1: (1, 1), 2: (0, 0), 3: (0, 1), 4: (0, 2)}  # (node rank, local rank)
    sent: list[Any] = []
    mains = set()
    monkeypatch.setattr("fabric_lite.plugins.environments.mpi._MPI4PY_AVAILABLE", True)
    for rank in range(len(hosts)):  # rank 0 first: the others receive what it broadcast
        mpi4py = type(sys)("mpi4py")
        mpi4py.MPI = type("MPI", (), {"COMM_WORLD": _FakeWorld(rank, hosts, sent)})  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "mpi4py", mpi4py)
        monkeypatch.setattr("socket.gethostname", lambda rank=rank: hosts[rank])
        environment = MPIEnvironment()
        assert (environment.node_rank(), environment.local_rank()) == expected[rank]
        assert (environment.num_nodes(), environment.local_world_size()) == (2, 2 if hosts[rank] == "b-host" else 3)
        getattr(environment, asked_first)  # whichever a rank asks for first, it is the same broadcast
        mains.add((environment.main_address, environment.main_port))
    assert len(sent) == 2 and len(mains) == 1 and next(iter(mains))[0] == "b-host"


# -------------------------------------------------------------------------------------------- detection order


def test_detection_order_follows_lightning(tmp_path: Path) -> None:
    lsf = lsf_env(tmp_path / "rankfile", ["batch1", HOST, HOST], JSM_NAMESPACE_SIZE="2", JSM_NAMESPACE_RANK="1")
    slurm = {"SLURM_NTASKS": "2", "SLURM_PROCID": "1", "SLURM_LOCALID": "1", "SLURM_STEP_ID": "0"}

    def detected(env: dict[str, str]) -> type[ClusterEnvironment]:
        return type(resolve_plan(accelerator="cpu", devices=2, env=env, machine=Machine()).cluster_environment)

    assert detected({**TORCHRUN, "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2", **slurm, **lsf}) is TorchElasticEnvironment
    assert detected({**slurm, **lsf}) is SLURMEnvironment
    assert detected({**lsf, **KUBEFLOW, "OMPI_COMM_WORLD_SIZE": "2"}) is LSFEnvironment
    # an explicit plugin always wins
    plugin = KubeflowEnvironment(env={**KUBEFLOW, "WORLD_SIZE": "2"})
    plan = resolve_plan(accelerator="cpu", num_nodes=2, plugins=[plugin], env={**slurm, **lsf}, machine=Machine())
    assert plan.cluster_environment is plugin


# ------------------------------------------------------------------------------------------ SLURM auto-requeue


def test_slurm_signature_matches_lightning() -> None:
    environment = SLURMEnvironment(env=SLURM)
    assert environment.auto_requeue is True
    assert environment.requeue_signal is signal.SIGUSR1
    environment = SLURMEnvironment(False, signal.SIGUSR2, env=SLURM)
    assert (environment.auto_requeue, environment.requeue_signal) == (False, signal.SIGUSR2)
    assert SLURMEnvironment(requeue_signal=signal.SIGHUP, env=SLURM).requeue_signal is signal.SIGHUP
    with pytest.raises(TypeError, match=r"auto_requeue=\{.*must be True or False.*SLURMEnvironment\(env="):
        SLURMEnvironment(SLURM)  # type: ignore[arg-type]  # the old positional mapping
    with pytest.raises(ValueError, match=r"requeue_signal=12345.* is not a signal"):
        SLURMEnvironment(requeue_signal=12345, env=SLURM)  # type: ignore[arg-type]


def test_slurm_static_helpers_match_lightning(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    assert (SLURMEnvironment.job_name(), SLURMEnvironment.job_id()) == ("train", 4242)
    monkeypatch.setenv("SLURM_JOB_NAME", "interactive")
    assert SLURMEnvironment.job_id() is None
    monkeypatch.delenv("SLURM_JOB_ID")
    monkeypatch.setenv("SLURM_JOB_NAME", "train")
    assert SLURMEnvironment.job_id() is None
    assert SLURMEnvironment.resolve_root_node_address("node[3-5,9] other") == "node3"


@pytest.fixture
def fake_scontrol(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An ``scontrol`` first on PATH that appends its arguments to a file (SLURM itself:
    tests/tiers/slurm/test_slurm.py)."""
    calls = tmp_path / "calls"
    tool = tmp_path / "bin" / "scontrol"
    tool.parent.mkdir()
    tool.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    tool.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tool.parent}:{base_env()['PATH']}")
    return calls


def _requeue_signal_received(environment: SLURMEnvironment, rank: int) -> None:
    previous = signal.getsignal(signal.SIGUSR1)
    try:
        environment._on_setup(rank)
        signal.raise_signal(signal.SIGUSR1)  # the handler runs before raise_signal returns (main thread)
    finally:
        environment.teardown()
        assert signal.getsignal(signal.SIGUSR1) == previous


@pytest.mark.parametrize(
    ("env", "rank", "auto_requeue", "expected"),
    [
        pytest.param(SLURM, 0, True, "requeue 987654321\n", id="rank0-requeues"),
        pytest.param(SLURM, 1, True, None, id="rank1-does-not"),
        pytest.param(SLURM, 0, False, None, id="auto-requeue-off"),
        pytest.param(
            {**SLURM, "SLURM_ARRAY_JOB_ID": "77", "SLURM_ARRAY_TASK_ID": "3"},
            0,
            True,
            "requeue 77_3\n",
            id="array-task",
        ),
    ],
)
def test_slurm_requeue_handler(
    fake_scontrol: Path, env: dict[str, str], rank: int, auto_requeue: bool, expected: str | None
) -> None:
    seen: list[int] = []
    previous = signal.signal(signal.SIGUSR1, lambda signum, frame: seen.append(signum))
    try:
        _requeue_signal_received(SLURMEnvironment(auto_requeue, env=env), rank)
    finally:
        signal.signal(signal.SIGUSR1, previous)
    assert (fake_scontrol.read_text() if fake_scontrol.exists() else None) == expected
    assert seen == [signal.SIGUSR1]  # the handler that was there before still runs


def test_slurm_requeue_handler_only_from_the_main_thread(fake_scontrol: Path) -> None:
    environment = SLURMEnvironment(env=SLURM)
    before = signal.getsignal(signal.SIGUSR1)
    worker = threading.Thread(target=environment._on_setup, args=(0,))
    worker.start()
    worker.join()
    assert signal.getsignal(signal.SIGUSR1) == before


class _FakeCommWorld:
    def __init__(self, size: int) -> None:
        self.size = size

    def Get_size(self) -> int:
        return self.size


@pytest.mark.parametrize(("size", "detected"), [(1, False), (2, True)])
def test_mpi_detect_asks_an_mpi4py_the_program_imported(
    mpi4py_imports: _ImportRecorder, monkeypatch: pytest.MonkeyPatch, size: int, detected: bool
) -> None:
    """Where the program imported mpi4py.MPI itself (MPI is initialised), COMM_WORLD decides, as in Lightning, with
    no launcher variable; nothing more is imported."""
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", types.SimpleNamespace(COMM_WORLD=_FakeCommWorld(size)))
    monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", True)
    assert MPIEnvironment.detect({}) is detected
    monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", False)  # as Lightning's tests patch it
    assert MPIEnvironment.detect({}) is False
    assert mpi4py_imports.names == []
