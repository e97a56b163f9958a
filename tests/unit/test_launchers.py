"""The launchers' checks and helpers, in this process: what is refused before any process starts, the state a
spawned worker is given (:class:`_GlobalStateSnapshot`, modules unshared), and the CPU-thread share.

Launching for real is tested in tests/distributed/test_launchers.py.
"""

from __future__ import annotations

import os
import random
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

import fabric_lite.strategies.launchers.multiprocessing as spawn_module
from fabric_lite import Fabric
from fabric_lite.plugins.environments import KubeflowEnvironment, LightningEnvironment
from fabric_lite.strategies import DDPStrategy
from fabric_lite.strategies.launchers.multiprocessing import (
    MultiProcessingLauncher,
    _check_bad_cuda_fork,
    _GlobalStateSnapshot,
    _MultiProcessingLauncher,
    _unshare_modules,
)
from fabric_lite.strategies.launchers.subprocess_script import SubprocessScriptLauncher, _SubprocessScriptLauncher
from fabric_lite.utilities import distributed


def ddp(start_method: str, device: str = "cpu") -> DDPStrategy:
    return DDPStrategy(parallel_devices=[torch.device(device)] * 2, start_method=start_method)  # type: ignore[arg-type]


def test_lightnings_names_are_the_launchers() -> None:
    assert _MultiProcessingLauncher is MultiProcessingLauncher
    assert _SubprocessScriptLauncher is SubprocessScriptLauncher


# ---------------------------------------------------------------------------------------------- spawn launcher
def test_a_start_method_the_platform_lacks_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(spawn_module.mp, "get_all_start_methods", lambda: ["spawn"])
    with pytest.raises(ValueError, match=r"The start method 'fork' is not available on this platform.*: spawn"):
        MultiProcessingLauncher(ddp("fork"), start_method="fork")


@pytest.mark.parametrize(("start_method", "interactive"), [("fork", True), ("spawn", False), ("forkserver", False)])
def test_only_fork_works_in_a_notebook(start_method: str, interactive: bool) -> None:
    assert MultiProcessingLauncher(ddp(start_method), start_method).is_interactive_compatible is interactive


class Importing:
    _inheriting = True  # what multiprocessing sets while a new process imports the main script


@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_launching_while_the_script_is_imported_says_to_guard_it(
    monkeypatch: pytest.MonkeyPatch, start_method: str
) -> None:
    monkeypatch.setattr(spawn_module.mp, "current_process", Importing)
    with pytest.raises(RuntimeError, match=r'requires that your script guards the main code with `if __name__ == "__'):
        MultiProcessingLauncher(ddp(start_method), start_method).launch(print)


class Started(Exception):
    """Raised where the processes would start: every check before it passed."""


def start_instead(*args: Any, **kwargs: Any) -> None:
    raise Started


@pytest.mark.parametrize(
    ("in_bad_fork", "initialized", "match"),
    [
        (True, False, "Cannot re-initialize CUDA in forked subprocess.*strategy='ddp_spawn'"),
        (False, True, "Lightning can't create new processes if CUDA is already initialized.*strategy='ddp_spawn'"),
    ],
)
def test_forking_workers_that_would_use_cuda_is_refused(
    monkeypatch: pytest.MonkeyPatch, in_bad_fork: bool, initialized: bool, match: str
) -> None:
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: in_bad_fork)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: initialized)
    with pytest.raises(RuntimeError, match=match):
        _check_bad_cuda_fork(ddp("fork", "cuda"))
    _check_bad_cuda_fork(ddp("fork", "cpu"))  # workers on the CPU never touch CUDA: nothing to refuse


def test_forkserver_and_spawn_start_new_interpreters_whatever_cuda_did_here(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(spawn_module.mp, "start_processes", start_instead)
    for start_method in ("forkserver", "spawn"):
        strategy = ddp(start_method, "cuda")
        strategy.cluster_environment = LightningEnvironment({})
        with pytest.raises(Started):
            MultiProcessingLauncher(strategy, start_method).launch(print)


def test_the_snapshot_carries_seeds_and_flags_into_a_new_interpreter() -> None:
    deterministic = torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled()
    benchmark = torch.backends.cudnn.benchmark
    try:
        torch.manual_seed(123)
        np.random.seed(4)
        random.seed(5)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = True
        snapshot = _GlobalStateSnapshot.capture()
        expected = torch.rand(2), np.random.rand(), random.random()

        torch.manual_seed(321)
        np.random.seed(0)
        random.seed(0)
        torch.use_deterministic_algorithms(False)
        torch.backends.cudnn.benchmark = False
        snapshot.restore()
        assert torch.initial_seed() == 123
        assert torch.are_deterministic_algorithms_enabled() and torch.is_deterministic_algorithms_warn_only_enabled()
        assert torch.backends.cudnn.benchmark
        assert torch.equal(torch.rand(2), expected[0])
        assert (np.random.rand(), random.random()) == expected[1:]
        if not torch.cuda.is_initialized():
            assert "torch.cuda" not in snapshot.rng_states  # capturing must not initialise CUDA here
    finally:
        torch.use_deterministic_algorithms(deterministic[0], warn_only=deterministic[1])
        torch.backends.cudnn.benchmark = benchmark


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.tied = nn.Linear(2, 2)
        self.tied.weight = self.layer.weight
        self.register_buffer("buffer", torch.ones(3))


def test_modules_in_the_arguments_get_their_own_storage_and_stay_tied() -> None:
    model, other = Tied().share_memory(), nn.Linear(1, 1)
    tensor = torch.ones(2).share_memory_()
    weight = model.layer.weight
    _unshare_modules(((tensor, [model]), {"other": other}))
    assert not any(t.is_shared() for t in [*model.parameters(), *model.buffers()])
    assert model.layer.weight is weight and model.tied.weight is weight  # the same parameter, with new storage
    assert tensor.is_shared()  # a plain tensor is left as torch.multiprocessing passed it


# ---------------------------------------------------------------------------------------------- script launcher
class StartedElsewhere(LightningEnvironment):
    """An environment that says it does not start processes, in a process that is not local rank 0."""

    @property
    def creates_processes_externally(self) -> bool:
        return False

    def local_rank(self) -> int:
        return 1


def test_the_script_launcher_starts_processes_from_local_rank_zero_only() -> None:
    strategy = DDPStrategy(parallel_devices=[torch.device("cpu")] * 2, cluster_environment=StartedElsewhere({}))
    launcher = SubprocessScriptLauncher(strategy)
    with pytest.raises(RuntimeError, match=r"attempted to launch new distributed processes with `local_rank > 0`"):
        launcher.launch(print)
    assert launcher.children == []


def test_the_script_launcher_starts_its_processes_once() -> None:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
    launcher = fabric.strategy.launcher
    assert isinstance(launcher, SubprocessScriptLauncher)
    launcher.children = [object()]  # type: ignore[list-item]
    with pytest.raises(RuntimeError, match="The launcher can only create subprocesses once"):
        launcher.launch(print)


# ------------------------------------------------------------------- settings against the launcher's environment
_LAUNCH_VARIABLES = ("SLURM_", "TORCHELASTIC_", "LT_", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "WORLD_SIZE", "RANK",
                     "GROUP_RANK", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT", "KUBERNETES_PORT")  # fmt: skip


@pytest.fixture
def launch_environment(monkeypatch: pytest.MonkeyPatch) -> Any:
    """This process's environment without any launcher's variables; returns a function that sets some."""
    for name in list(os.environ):
        if name.startswith(_LAUNCH_VARIABLES):
            monkeypatch.delenv(name)

    def set_variables(**variables: str) -> None:
        for name, value in variables.items():
            monkeypatch.setenv(name, value)

    return set_variables


def _never(*args: Any, **kwargs: Any) -> Any:
    raise AssertionError("a process was started although the settings disagree with the environment")


def test_slurm_task_count_is_checked_at_launch_not_at_construction(launch_environment: Any) -> None:
    # one task per node (srun --ntasks-per-node=1) but devices=2: Fabric(...) constructs, as Lightning's does
    launch_environment(
        SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="1", SLURM_NNODES="2", SLURM_JOB_NAME="train", SLURM_NODEID="0",
        SLURM_PROCID="0", SLURM_LOCALID="0", SLURM_JOB_ID="42", SLURM_NODELIST="n[0-1]",
    )  # fmt: skip
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2)
    assert type(fabric.strategy.cluster_environment).__name__ == "SLURMEnvironment"  # type: ignore[attr-defined]
    for _ in range(2):  # refused again: a failed launch() launches nothing
        with pytest.raises(ValueError) as excinfo:
            fabric.launch()
        message = str(excinfo.value)
        for fragment in ("Fabric(devices=2) does not match SLURM's 1 tasks per node", "Set devices=1"):
            assert fragment in message, message
    assert not torch.distributed.is_initialized()  # raised before this process waited on another


def test_several_nodes_without_a_main_address_are_refused_before_the_script_launcher_starts_a_process(
    launch_environment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    fabric = Fabric(accelerator="cpu", strategy="ddp", devices=2, num_nodes=2)  # constructs, as in Lightning
    launcher = fabric.strategy.launcher
    assert isinstance(launcher, SubprocessScriptLauncher)
    monkeypatch.setattr("fabric_lite.strategies.launchers.subprocess_script.subprocess.Popen", _never)
    with pytest.raises(ValueError, match=r"Fabric\(num_nodes=2\) without torchrun or SLURM needs MASTER_ADDR and"):
        fabric.launch()
    assert launcher.children == [] and not torch.distributed.is_initialized()


def test_several_nodes_without_a_main_port_are_refused_before_the_spawn_launcher_starts_a_process(
    launch_environment: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    launch_environment(MASTER_ADDR="10.0.0.1", NODE_RANK="1")
    fabric = Fabric(accelerator="cpu", strategy="ddp_spawn", devices=2, num_nodes=3)
    monkeypatch.setattr(spawn_module.mp, "start_processes", _never)
    with pytest.raises(ValueError, match=r"Fabric\(num_nodes=3\) without torchrun or SLURM needs MASTER_PORT:"):
        fabric.launch(print)


def test_kubeflow_one_process_per_pod_is_checked_at_launch(launch_environment: Any) -> None:
    launch_environment(
        KUBERNETES_PORT="tcp://127.0.0.1:443", MASTER_ADDR="1.2.3.4", MASTER_PORT="500", WORLD_SIZE="20", RANK="1"
    )
    fabric = Fabric(accelerator="cpu", devices=2, plugins=[KubeflowEnvironment()])
    assert isinstance(fabric.strategy, DDPStrategy) and fabric.local_rank == 0
    with pytest.raises(ValueError, match=r"Fabric\(devices=2, num_nodes=1\) does not match the PyTorchJob.*Set"
                       r" devices=1, num_nodes=20"):  # fmt: skip
        fabric.launch()


def test_a_one_process_strategy_is_checked_at_construction_it_needs_no_launch(launch_environment: Any) -> None:
    # torchrun started 2 processes, but each would train alone on its one device: refused before setup, since such a
    # script need not call launch()
    launch_environment(
        TORCHELASTIC_RUN_ID="run", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", RANK="1", LOCAL_RANK="1", GROUP_RANK="0",
        MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"Fabric\(devices=1\) does not match torchrun's --nproc-per-node=2"):
        Fabric(accelerator="cpu", devices=1)


def test_under_the_cli_fabric_checks_at_construction_where_it_sets_the_process_up(launch_environment: Any) -> None:
    # `fabric-lite run` (and Lightning's `fabric run`) started this process: Fabric() joins the others at once, so it
    # checks first, before waiting on any of them
    launch_environment(
        LT_CLI_USED="1", LT_ACCELERATOR="cpu", LT_DEVICES="2", TORCHELASTIC_RUN_ID="run", WORLD_SIZE="3",
        LOCAL_WORLD_SIZE="3", RANK="0", LOCAL_RANK="0", GROUP_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT="1",
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"Fabric\(devices=2\) does not match torchrun's --nproc-per-node=3"):
        Fabric()
    assert not torch.distributed.is_initialized()


# ---------------------------------------------------------------------------------------------- threads
@pytest.mark.parametrize("num_processes", [0, -1])
def test_a_share_of_the_cores_needs_a_process(num_processes: int) -> None:
    with pytest.raises(ValueError, match=f"`num_processes` should be >= 1, got {num_processes}"):
        distributed._suggested_max_num_threads(num_processes)


@pytest.mark.parametrize(("num_processes", "expected"), [(1, 4), (3, 1), (8, 1)])
def test_each_process_gets_its_share_of_the_cores(
    monkeypatch: pytest.MonkeyPatch, num_processes: int, expected: int
) -> None:
    monkeypatch.setattr(distributed, "_num_cpus_available", lambda: 4)
    calls: list[int] = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    distributed._set_num_threads_if_needed(num_processes)
    assert calls == [expected] and os.environ["OMP_NUM_THREADS"] == str(expected)  # the processes it starts, too
    distributed._set_num_threads_if_needed(1)  # set already: the user's (or the launcher's) choice stays
    assert calls == [expected] and os.environ["OMP_NUM_THREADS"] == str(expected)
