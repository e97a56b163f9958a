"""The cluster environments built as Lightning's are (without ``env=``): they read this process's ``os.environ`` when
a value is asked for, construct where variables are missing, and keep Lightning's errors, warnings and debug log."""

from __future__ import annotations

import logging
import os
import sys
import warnings
from unittest import mock

import pytest

from fabric_lite.plugins.environments import (
    KubeflowEnvironment,
    LightningEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.environments import mpi as mpi_module
from fabric_lite.plugins.environments import slurm as slurm_module
from fabric_lite.utilities.warnings import PossibleUserWarning


@pytest.fixture
def clean_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    """An ``os.environ`` without any launcher's variables (restored afterwards)."""
    for name in list(os.environ):
        if name.startswith(("SLURM_", "MASTER_", "TORCHELASTIC_", "LSB_", "JSM_")) or name in (
            "RANK",
            "LOCAL_RANK",
            "WORLD_SIZE",
            "GROUP_RANK",
            "NODE_RANK",
            "LOCAL_WORLD_SIZE",
        ):
            monkeypatch.delenv(name)


@pytest.mark.parametrize(
    ("cls", "getters"),
    [
        pytest.param(SLURMEnvironment, ("world_size", "global_rank", "local_rank", "node_rank"), id="SLURM"),
        pytest.param(TorchElasticEnvironment, ("world_size", "global_rank", "local_rank"), id="TorchElastic"),
        pytest.param(KubeflowEnvironment, ("world_size", "global_rank"), id="Kubeflow"),
    ],
)
def test_constructs_without_variables_and_raises_key_error_when_read(
    clean_environ: None, cls: type, getters: tuple[str, ...]
) -> None:
    environment = cls()
    assert environment.creates_processes_externally
    for getter in getters:
        with pytest.raises(KeyError, match=f"{cls.__name__} needs it"):
            getattr(environment, getter)()


def test_kubeflow_needs_the_operators_address_and_port(clean_environ: None) -> None:
    environment = KubeflowEnvironment()
    with pytest.raises(KeyError, match="MASTER_ADDR is not set"):
        environment.main_address  # noqa: B018
    with pytest.raises(KeyError, match="MASTER_PORT is not set"):
        environment.main_port  # noqa: B018
    assert environment.local_rank() == 0


def test_slurm_defaults_without_variables(clean_environ: None) -> None:
    environment = SLURMEnvironment()
    assert (environment.main_address, environment.main_port) == ("127.0.0.1", 12910)
    assert (environment.job_name(), environment.job_id()) == (None, None)


def test_slurm_honours_master_addr_and_port_set_after_construction(
    clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("SLURM_NODELIST", "node[3-5]")
    monkeypatch.setenv("SLURM_JOB_ID", "1234")
    environment = SLURMEnvironment()
    assert (environment.main_address, environment.main_port) == ("node3", 15000 + 1234)
    monkeypatch.setenv("MASTER_ADDR", "1.2.3.4")
    monkeypatch.setenv("MASTER_PORT", "1234")
    assert (environment.main_address, environment.main_port) == ("1.2.3.4", 1234)


def test_slurm_detect_without_env_reads_os_environ(clean_environ: None, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not SLURMEnvironment.detect()
    monkeypatch.setenv("SLURM_NTASKS", "2")
    assert SLURMEnvironment.detect()
    for name in ("bash", "interactive"):
        monkeypatch.setenv("SLURM_JOB_NAME", name)
        assert not SLURMEnvironment.detect()


def test_slurm_warns_when_srun_is_available_but_not_used(clean_environ: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["train.py", "--lr", "0.01"])
    expected = r"`srun` command is available .* but is not used\. HINT: .* srun \S*python\S* train.py --lr 0.01"
    with mock.patch.object(slurm_module.shutil, "which", return_value="/usr/bin/srun"):
        with pytest.warns(PossibleUserWarning, match=expected):
            SLURMEnvironment()
        with pytest.warns(PossibleUserWarning, match=expected):
            assert not SLURMEnvironment.detect()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            SLURMEnvironment.detect({})  # the planner passes its mapping: no probing of the machine
            SLURMEnvironment(env={})
        monkeypatch.setenv("SLURM_NTASKS", "2")
        monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "2")
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert SLURMEnvironment.detect()  # started by srun: nothing to say
    with mock.patch.object(slurm_module.shutil, "which", return_value=None), warnings.catch_warnings():
        warnings.simplefilter("error")
        SLURMEnvironment()


def test_slurm_validate_settings_in_lightnings_words(clean_environ: None, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURM_NNODES", "2")
    environment = SLURMEnvironment()
    environment.validate_settings(num_devices=4, num_nodes=2)  # SLURM_NTASKS unset: not checked
    with pytest.raises(ValueError, match=r"the number of tasks per node configured .* does not match"):
        environment.validate_settings(num_devices=2, num_nodes=2)
    with pytest.raises(ValueError, match=r"the number of nodes configured in SLURM .* does not match"):
        environment.validate_settings(num_devices=4, num_nodes=1)


@pytest.mark.parametrize("name", ["bash", "interactive"])
def test_slurm_validate_settings_skipped_in_an_interactive_job(
    clean_environ: None, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    # the processes of a shell in an interactive job are fabric_lite's to start: SLURM's counts do not apply
    monkeypatch.setenv("SLURM_NTASKS_PER_NODE", "4")
    monkeypatch.setenv("SLURM_NNODES", "2")
    monkeypatch.setenv("SLURM_JOB_NAME", name)
    SLURMEnvironment().validate_settings(num_devices=4, num_nodes=1)
    # a step of several tasks that srun started is SLURM's, whatever the job is called
    monkeypatch.setenv("SLURM_NTASKS", "8")
    monkeypatch.setenv("SLURM_STEP_ID", "0")
    with pytest.raises(ValueError, match="the number of nodes configured in SLURM"):
        SLURMEnvironment().validate_settings(num_devices=4, num_nodes=1)


def test_torchelastic_in_lightnings_words(clean_environ: None, monkeypatch: pytest.MonkeyPatch) -> None:
    environment = TorchElasticEnvironment()
    assert environment.node_rank() == 0
    with pytest.warns(UserWarning, match="MASTER_ADDR environment variable is not defined"):
        assert environment.main_address == "127.0.0.1"
    with pytest.warns(UserWarning, match="MASTER_PORT environment variable is not defined"):
        assert environment.main_port == 12910
    monkeypatch.setenv("WORLD_SIZE", "8")
    environment.validate_settings(num_devices=4, num_nodes=2)
    with pytest.raises(ValueError, match=r"the product \(2 \* 2\) does not match the world size \(8\)"):
        environment.validate_settings(num_devices=2, num_nodes=2)


@pytest.mark.parametrize(
    ("cls", "env"),
    [
        pytest.param(
            SLURMEnvironment, {"SLURM_NTASKS": "20", "SLURM_NTASKS_PER_NODE": "4", "SLURM_PROCID": "1"}, id="SLURM"
        ),
        pytest.param(TorchElasticEnvironment, {"WORLD_SIZE": "20", "RANK": "1"}, id="TorchElastic"),
        pytest.param(KubeflowEnvironment, {"WORLD_SIZE": "20", "RANK": "1"}, id="Kubeflow"),
    ],
)
def test_setters_of_launcher_environments_log_and_change_nothing(
    clean_environ: None,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    cls: type,
    env: dict[str, str],
) -> None:
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    environment = cls()
    with caplog.at_level(logging.DEBUG, logger="fabric_lite.plugins.environments"):
        environment.set_global_rank(100)
        environment.set_world_size(100)
    assert (environment.global_rank(), environment.world_size()) == (1, 20)
    assert "setting global rank is not allowed" in caplog.text
    assert "setting world size is not allowed" in caplog.text


def test_lightning_environment_reads_os_environ_at_each_call(
    clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    environment = LightningEnvironment()
    assert not environment.creates_processes_externally
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setenv("GROUP_RANK", "1")
    assert environment.creates_processes_externally
    assert (environment.local_rank(), environment.node_rank()) == (2, 1)


def test_mpi_environment_needs_mpi4py(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", False)
    with pytest.raises(ModuleNotFoundError, match="needs the mpi4py package"):
        MPIEnvironment()


def test_mpi_environment_takes_ranks_from_comm_world(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(mpi_module, "_MPI4PY_AVAILABLE", True)
    mpi4py = mock.MagicMock()
    mpi4py.MPI.COMM_WORLD.Get_size.return_value = 8
    mpi4py.MPI.COMM_WORLD.Get_rank.return_value = 3
    with mock.patch.dict(sys.modules, {"mpi4py": mpi4py}):
        environment = MPIEnvironment()
    assert environment.creates_processes_externally
    assert (environment.world_size(), environment.global_rank()) == (8, 3)


@pytest.mark.parametrize("cls", [LightningEnvironment, SLURMEnvironment, TorchElasticEnvironment, KubeflowEnvironment])
def test_an_environment_reading_os_environ_pickles_and_reads_the_receivers(
    cls: type, clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A strategy sent to a spawned process carries its environment: one that reads ``os.environ`` must pickle (the
    ``os.environ`` object does not) and read the variables of the process it arrives in."""
    import pickle

    environment = cls()
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.7")
    arrived = pickle.loads(pickle.dumps(environment))
    assert arrived._env is os.environ and arrived._env["MASTER_ADDR"] == "10.0.0.7"
    given = pickle.loads(pickle.dumps(cls(env={"MASTER_ADDR": "10.0.0.8"})))
    assert given._env == {"MASTER_ADDR": "10.0.0.8"}  # a mapping passed in travels as it is


def test_lightning_environment_teardown_removes_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """As Lightning's: a later ``Fabric`` in the process does not take the launcher's ``WORLD_SIZE`` for its own."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    LightningEnvironment().teardown()
    assert "WORLD_SIZE" not in os.environ
    LightningEnvironment().teardown()  # nothing to remove: no error
    given = LightningEnvironment({"WORLD_SIZE": "2"})
    monkeypatch.setenv("WORLD_SIZE", "2")
    given.teardown()  # an environment given its variables removes it from those, never from os.environ
    assert os.environ["WORLD_SIZE"] == "2" and "WORLD_SIZE" not in given._env


def test_slurm_ntasks_without_a_count_per_node_is_refused_at_construction(
    clean_environ: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Lightning's check: ``--ntasks=2`` and no variable that says how many tasks run on each node."""
    monkeypatch.setenv("SLURM_NTASKS", "1")
    SLURMEnvironment()
    monkeypatch.setenv("SLURM_NTASKS", "2")
    with pytest.raises(RuntimeError, match=r"You set `--ntasks=2` in your SLURM.*HINT: Use `--ntasks-per-node=2`"):
        SLURMEnvironment()
    for name in ("SLURM_NTASKS_PER_NODE", "SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE"):
        monkeypatch.setenv(name, "2")  # what sbatch, salloc and srun (-n 2 too) set
        SLURMEnvironment()
        monkeypatch.delenv(name)
    SLURMEnvironment(env={"SLURM_NTASKS": "2"})  # variables given explicitly are read lazily, as ever
