"""``strategy="horovod"``: what needs no Horovod (plan, environment, the missing-library error) runs everywhere; the
``horovod`` tier runs real jobs under ``horovodrun -np 2`` with the ``.venv-horovod`` interpreter.

Like the other optional tiers it runs when asked for (``-m horovod``, this file named, or ``FABRIC_LITE_HOROVOD=1``,
which ``.ci/run`` sets): it then builds that venv with ``.ci/setup-horovod`` on first use (about 8 minutes on 2
cores), or uses ``$HOROVOD_PYTHON``, a Python with ``horovod.torch``. With the variable set a failed build fails the
tier; otherwise it skips and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from fabric_lite import Fabric
from fabric_lite._plan import Machine, resolve_plan
from fabric_lite.plugins.environments.horovod import HorovodEnvironment
from fabric_lite.strategies.horovod import HOROVOD_INSTALL
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from tests.helpers.harness import REPO, Completed, base_env, optional_venv, run_python

SCRIPT = "tests/helpers/scripts/horovod_checks.py"


def horovod_env(rank: int = 1, size: int = 4, local_rank: int = 1, local_size: int = 2, **extra: str) -> dict[str, str]:
    """What ``horovodrun`` (Gloo) sets in each process it starts."""
    env = {
        "HOROVOD_RANK": str(rank),
        "HOROVOD_SIZE": str(size),
        "HOROVOD_LOCAL_RANK": str(local_rank),
        "HOROVOD_LOCAL_SIZE": str(local_size),
        "HOROVOD_CROSS_RANK": str(rank // local_size),
        "HOROVOD_CROSS_SIZE": str(size // local_size),
        "HOROVOD_GLOO_RENDEZVOUS_ADDR": "10.0.0.1",
        "HOROVOD_GLOO_RENDEZVOUS_PORT": "8552",
        "HOROVOD_CONTROLLER": "gloo",
    }
    env.update(extra)
    return env


def plan(**kwargs: Any) -> Any:
    kwargs.setdefault("env", {})
    kwargs.setdefault("machine", Machine())
    kwargs.setdefault("strategy", "horovod")
    return resolve_plan(**kwargs)


# ------------------------------------------------------------------------------------ no Horovod needed


def test_registry_entry() -> None:
    entry = STRATEGY_REGISTRY["horovod"]
    assert (entry.class_name, entry.parallel, entry.start_method, entry.multi_device) == (
        "HorovodStrategy",
        True,
        None,
        False,
    )


@pytest.mark.parametrize("devices", ["auto", 1, "1"])
def test_plan_without_horovodrun_is_one_process(devices: Any) -> None:
    result = plan(devices=devices)
    assert (result.strategy, result.parallel, result.start_method) == ("horovod", True, None)
    assert (result.devices, result.world_size) == ((0,), 1)
    assert isinstance(result.cluster_environment, HorovodEnvironment)
    assert not result.cluster_environment.creates_processes_externally


@pytest.mark.parametrize("devices", [2, 3])
def test_plan_without_horovodrun_refuses_several_processes(devices: int) -> None:
    planned = plan(devices=devices)  # Fabric(...) constructs; fabric.launch() checks against the environment
    with pytest.raises(ValueError) as excinfo:
        planned.validate_settings()
    message = str(excinfo.value)
    assert f"asks for {devices} processes" in message and "not started by horovodrun" in message
    assert f"horovodrun -np {devices} -H localhost:{devices} python train.py" in message


def test_plan_without_horovodrun_on_every_gpu_names_the_count() -> None:
    planned = plan(accelerator="cuda", machine=Machine(cuda_devices=4))
    with pytest.raises(ValueError, match="horovodrun -np 4 -H localhost:4"):
        planned.validate_settings()


def test_plan_under_horovodrun_takes_its_local_size() -> None:
    result = plan(env=horovod_env(rank=3, size=4, local_rank=1, local_size=2))
    assert (result.devices, result.start_method, result.parallel) == ((0, 1), None, True)
    environment = result.cluster_environment
    assert isinstance(environment, HorovodEnvironment) and environment.creates_processes_externally
    ranks = (environment.global_rank(), environment.world_size(), environment.local_rank(), environment.node_rank())
    assert ranks == (3, 4, 1, 1)
    assert (environment.main_address, environment.main_port) == ("10.0.0.1", 8552)


def test_plan_under_horovodrun_with_matching_devices() -> None:
    assert plan(env=horovod_env(local_size=2), devices=2).devices == (0, 1)


@pytest.mark.parametrize("devices", [1, 3])
def test_plan_under_horovodrun_with_other_devices(devices: int) -> None:
    planned = plan(env=horovod_env(local_size=2), devices=devices)
    with pytest.raises(ValueError) as excinfo:
        planned.validate_settings()
    message = str(excinfo.value)
    assert f"asks for {devices} process(es)" in message and "horovodrun started 2" in message
    assert "HOROVOD_LOCAL_SIZE=2" in message and "devices='auto'" in message


@pytest.mark.parametrize("env", [{}, horovod_env()], ids=["alone", "under-horovodrun"])
def test_plan_refuses_num_nodes(env: dict[str, str]) -> None:
    planned = plan(env={**env, "MASTER_ADDR": "a", "MASTER_PORT": "1"}, num_nodes=2)
    with pytest.raises(ValueError, match=r"num_nodes=2\): horovodrun decides the nodes.*Leave num_nodes=1"):
        planned.validate_settings()


def test_plan_under_horovodrun_on_gpus() -> None:
    # every GPU visible to every process: process i takes cuda:i
    assert plan(env=horovod_env(local_size=2), accelerator="cuda", machine=Machine(cuda_devices=2)).devices == (0, 1)
    # one GPU per process (CUDA_VISIBLE_DEVICES set per rank): it is cuda:0 in each
    one = plan(env=horovod_env(local_size=2), accelerator="cuda", machine=Machine(cuda_devices=1))
    assert one.devices == (0, 0)


def test_plan_ignores_torchrun_and_slurm_variables_for_horovod() -> None:
    env = horovod_env(local_size=2, LOCAL_RANK="0", WORLD_SIZE="7", SLURM_NTASKS="5", SLURM_JOB_NAME="job")
    result = plan(env=env)
    assert isinstance(result.cluster_environment, HorovodEnvironment) and result.devices == (0, 1)


def test_open_mpi_variables() -> None:
    env = {
        "OMPI_COMM_WORLD_RANK": "2",
        "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "0",
        "OMPI_COMM_WORLD_LOCAL_SIZE": "2",
    }
    environment = HorovodEnvironment(env)
    assert HorovodEnvironment.detect(env) and not HorovodEnvironment.detect({})
    assert (environment.global_rank(), environment.world_size(), environment.local_rank()) == (2, 4, 0)
    assert environment.local_world_size() == 2


def test_environment_alone_is_rank_zero_of_one() -> None:
    environment = HorovodEnvironment({})
    assert (environment.global_rank(), environment.world_size(), environment.local_rank()) == (0, 1, 0)
    assert (environment.local_world_size(), environment.node_rank(), environment.main_port) == (1, 0, 0)
    environment.set_global_rank(5)  # horovodrun decides: nothing changes
    environment.set_world_size(9)
    assert (environment.global_rank(), environment.world_size()) == (0, 1)


def test_missing_horovod_gives_the_install_command(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail here even where Horovod is installed
    monkeypatch.setitem(sys.modules, "horovod", None)
    monkeypatch.setitem(sys.modules, "horovod.torch", None)
    with pytest.raises(ModuleNotFoundError) as excinfo:
        Fabric(accelerator="cpu", strategy="horovod")
    message = str(excinfo.value)
    assert "strategy='horovod' needs Horovod" in message and sys.executable in message
    assert HOROVOD_INSTALL in message
    assert "README" in message and "Horovod (optional)" in message and ".ci/setup-horovod" in message
    assert isinstance(excinfo.value.__cause__, ImportError)


def test_the_readme_section_the_error_points_to_exists() -> None:
    readme = (REPO / "README.md").read_text()
    assert "## Horovod (optional)" in readme or "### Horovod (optional)" in readme
    assert ".ci/setup-horovod" in readme and "FABRIC_LITE_HOROVOD=1" in readme


def test_horovod_is_optional_in_the_package_metadata() -> None:
    text = (REPO / "pyproject.toml").read_text()
    dependencies = text.split("dependencies = [", 1)[1].split("]", 1)[0]
    assert "horovod" not in dependencies.lower()


# ------------------------------------------------------------------------------------ the horovod tier

#: seconds: the build takes about 8 minutes on a quiet 2-core machine, much more beside the suite
HOROVOD_BUILD_TIMEOUT = 1800


@pytest.fixture(scope="module")
def hvd_python(request: pytest.FixtureRequest) -> str:
    """A Python that can import ``horovod.torch``: ``$HOROVOD_PYTHON``, or ``.venv-horovod``, built by
    ``.ci/setup-horovod`` on first use when the tier is asked for (``-m horovod``, this file named, or
    ``FABRIC_LITE_HOROVOD=1``, which also makes a failed build an error instead of a skip)."""
    given = os.environ.get("HOROVOD_PYTHON")
    if given:
        check = subprocess.run([given, "-c", "import horovod.torch, fabric_lite"], capture_output=True, timeout=180)
        if check.returncode != 0:
            pytest.fail(f"HOROVOD_PYTHON={given} cannot import horovod.torch and fabric_lite: {check.stderr[-400:]!r}")
        return given
    return optional_venv(
        request.config,
        marker="horovod",
        variable="FABRIC_LITE_HOROVOD",
        module_file="test_horovod.py",
        venv=REPO / ".venv-horovod",
        setup=".ci/setup-horovod",
        probe="import horovod.torch, fabric_lite, pytest",
        timeout=HOROVOD_BUILD_TIMEOUT,
    )


def _token_processes(token: str) -> list[int]:
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if token.encode() in Path(f"/proc/{entry}/cmdline").read_bytes():
                    pids.append(int(entry))
            except OSError:
                continue
    return pids


def run_checks(python: str, mode: str, nprocs: int | None, timeout: float) -> tuple[Completed, list[dict[str, Any]]]:
    """Run the check script (under ``horovodrun -np nprocs`` unless ``nprocs`` is None) and every rank's RESULT.

    horovodrun puts each worker in a session of its own (its middleman kills the worker when horovodrun dies), so
    besides the harness's session check, any process still carrying this run's token afterwards fails the test.
    """
    token = f"fabric_lite_hvd_{uuid.uuid4().hex}"
    command = [SCRIPT, mode, token]
    if nprocs is not None:
        horovodrun = str(Path(python).parent / "horovodrun")
        command = [horovodrun, "-np", str(nprocs), "-H", f"localhost:{nprocs}", python, *command]
    try:
        done = run_python(command, timeout=timeout, env=base_env(), python=python)
    finally:
        deadline = time.monotonic() + 10
        while _token_processes(token) and time.monotonic() < deadline:
            time.sleep(0.2)
        leftovers = _token_processes(token)
        for pid in leftovers:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    assert not leftovers, f"worker processes {leftovers} outlived the horovodrun job"
    rows = [json.loads(line.split("RESULT ", 1)[1]) for line in done.stdout.splitlines() if "RESULT " in line]
    return done, sorted(rows, key=lambda row: row["rank"])


@pytest.mark.horovod
@pytest.mark.timeout(150)
def test_two_processes_under_horovodrun(hvd_python: str) -> None:
    done, rows = run_checks(hvd_python, "all", nprocs=2, timeout=120)
    assert done.returncode == 0, done.output
    assert [row["rank"] for row in rows] == [0, 1], done.output
    for rank, row in enumerate(rows):
        assert row["strategy"] == "HorovodStrategy" and row["device"] == "cpu"
        # the ranks are known before launch (from horovodrun's variables) and agree with Horovod's after it
        assert row["before_launch"] == row["after_launch"] == [rank, 2, rank]
        assert row["sampler"] == {"num_replicas": 2, "rank": rank}
        assert row["mean"] == [1.5, 15.0] and row["mean_in_place"]
        assert row["int_mean"] == [2] and row["int_mean_dtype"] == "torch.int32"  # (1 + 4) / 2, truncated
        assert row["sum"] == [3.0] and row["none_is_sum"] == [3.0]
        assert (row["max"], row["min"], row["product"]) == ([2, 0], [1, -1], [6.0])
        assert row["bool_any"] == [True, True, False] and row["bool_all"] == [False, True, False]
        assert row["collection"] == [3.0, 7, "torch.int32", "x"]
        assert row["gather"] == [[2, 3], [[0, 1, 2], [10, 11, 12]]]
        assert row["gather_collection"] == [[0, 1], [[0.0, 0.0], [1.0, 1.0]]]
        assert row["sync_grads"] == [3.0 * (rank + 1)]  # the sum over ranks of the gradients of its slice
        assert row["broadcast_obj"] == {"from": 1}
        assert row["broadcast_tensor"] == [[0, 1, 2, 3], "cpu"]
        assert (row["all_true"], row["any_true"]) == (False, True)
        assert row["reduce_alias"] == [1.0]
        assert "Pass group=None" in row["group_error"]
        # training: rank 0's weights and optimizer state reach rank 1, gradients are averaged at every step
        assert row["optimizer_type"] == "horovod.torch.optimizer"
        assert row["start_same"] and row["end_same"]
        assert row["local_grads_differ"]  # inside no_backward_sync nothing was all-reduced
        assert row["max_diff_to_reference"] < 1e-6, row
        assert row["step_count"] == [5.0, 5.0]  # rank 0's pre-step + 4 steps: no zero-gradient step was added
        assert row["checkpoint_visible"] and row["checkpoint_equal"]
        assert row["loader"] == list(range(rank, 10, 2))
    # the pair where every rank had its own state: everyone ends with rank 0's lr, moments and weights
    assert rows[0]["other_state"] == rows[1]["other_state"] and rows[0]["other_state"][0] == pytest.approx(0.1)


@pytest.mark.horovod
@pytest.mark.timeout(120)
def test_a_failing_rank_ends_the_horovodrun_job(hvd_python: str) -> None:
    start = time.monotonic()
    done, rows = run_checks(hvd_python, "fail", nprocs=2, timeout=90)
    assert done.returncode != 0, done.output
    assert rows == [], done.output  # rank 0 waited in a barrier for rank 1: it must not have finished
    assert "RuntimeError: rank 1 fails on purpose" in done.output
    assert "exited with non-zero status" in done.output
    assert time.monotonic() - start < 60, done.output


@pytest.mark.horovod
@pytest.mark.timeout(90)
def test_one_process_without_horovodrun(hvd_python: str) -> None:
    done, rows = run_checks(hvd_python, "single", nprocs=None, timeout=60)
    assert done.returncode == 0, done.output
    (row,) = rows
    assert row["before_launch"] == row["after_launch"] == [0, 1, 0]
    assert row["mean"] == [1.0, 10.0] and row["gather"] == [[3], [0, 1, 2]]  # world size 1: nothing added
    assert row["broadcast_obj"] == {"from": 0} and (row["all_true"], row["any_true"]) == (True, True)
    assert row["end_same"] and row["max_diff_to_reference"] < 1e-6 and row["step_count"] == [5.0, 5.0]
    assert row["loader"] == list(range(10))
    assert row["instance"] == ["HorovodStrategy", "cpu", 1]


@pytest.mark.horovod
def test_importing_fabric_lite_does_not_import_horovod(hvd_python: str) -> None:
    probe = (
        "import sys, fabric_lite, fabric_lite.strategies\n"
        "from fabric_lite.strategies import HorovodStrategy\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'horovod'))"
    )
    done = run_python(["-c", probe], python=hvd_python, timeout=60)
    assert done.returncode == 0, done.output
    assert done.stdout.strip() == "[]"
