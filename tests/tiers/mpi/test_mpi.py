"""MPI for real: fabric_lite jobs started by Open MPI's ``mpirun``, ranks told by mpi4py (MPIEnvironment).

The tier installs Open MPI with apt-get and mpi4py into ``.venv-mpi/site`` when they are missing
(tests/helpers/cluster/mpi_setup.py; about 10 s once), then runs tests/helpers/scripts/slurm_train.py (a generic tiny
DDP run that prints one RESULT line per rank) under ``mpirun -np 2`` and ``-np 3``. Every rank must detect
MPIEnvironment with MPI's ranks, and train exactly the weights of the same script run by fabric_lite's own ``ddp``
launcher on as many CPU processes.

    .venv/bin/python -m pytest -q tests/tiers/mpi/test_mpi.py       # runs where it can, else skips with the first error
    .venv/bin/python -m pytest -q -m mpi                  # the same (the whole suite skips it unless FABRIC_LITE_MPI=1)
    FABRIC_LITE_MPI=1 ...                                 # MPI that cannot be set up is an error, not a skip
    FABRIC_LITE_MPI=0 ...                                 # skip without trying
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster.mpi_setup import MPIRUN, MPIUnavailable, ensure_installed, mpi_env
from tests.helpers.harness import REPO, Completed, base_env, optional_tier_skipped, run_python

pytestmark = [pytest.mark.mpi, pytest.mark.distributed]

SCRIPT = str(REPO / "tests" / "helpers" / "scripts" / "slurm_train.py")
JOB_TIMEOUT = 120  # seconds for one job; three ranks take about 20 s on a busy 2-core machine
#: runs the command in place of this Python process (same pid, same session), so that run_python's time bound
#: and its orphan check cover mpirun and every rank it starts
EXEC = "import os, sys; os.execvp(sys.argv[1], sys.argv[1:])"


def results(output: str) -> list[dict[str, Any]]:
    rows = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda row: int(row["rank"]))


@pytest.fixture(scope="session")
def mpi(request: pytest.FixtureRequest) -> Path:
    """Open MPI and mpi4py, installed when missing; skips (or fails with FABRIC_LITE_MPI=1) with the first error."""
    reason = optional_tier_skipped(request.config, "mpi", "FABRIC_LITE_MPI", "test_mpi.py")
    if reason:
        pytest.skip(reason)
    wanted = os.environ.get("FABRIC_LITE_MPI", "")
    try:
        return ensure_installed(timeout=180)
    except MPIUnavailable as error:
        message = (
            f"MPI tier: no Open MPI/mpi4py: {error}. It needs Linux, root and apt-get (or Open MPI installed) and"
            " pip access to mpi4py; FABRIC_LITE_MPI=1 turns this skip into an error."
        )
        if wanted == "1":
            pytest.fail(message)
        pytest.skip(message)


def mpirun(nprocs: int, *args: str, timeout: float = JOB_TIMEOUT) -> Completed:
    argv = ["-c", EXEC, *MPIRUN, "-np", str(nprocs), sys.executable, SCRIPT, *args]
    return run_python(argv, timeout=timeout, env=mpi_env(base_env()))


_REFERENCES: dict[int, list[float]] = {}


def reference(nprocs: int) -> list[float]:
    """The weights of the same run started by fabric_lite's own ``ddp`` launcher on ``nprocs`` CPU processes."""
    if nprocs not in _REFERENCES:
        done = run_python([SCRIPT, "--devices", str(nprocs)], timeout=JOB_TIMEOUT, env=base_env())
        assert done.returncode == 0, done.output
        rows = results(done.stdout)
        assert [row["rank"] for row in rows] == list(range(nprocs)), done.output
        assert {row["environment"] for row in rows} == {"LightningEnvironment"}
        assert all(row["weights"] == rows[0]["weights"] for row in rows)
        _REFERENCES[nprocs] = rows[0]["weights"]
    return _REFERENCES[nprocs]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("nprocs", [2, 3])
def test_mpirun_ranks_train_like_fabric_lite_ddp(mpi: Path, nprocs: int) -> None:
    done = mpirun(nprocs)  # devices="auto": the processes mpirun started on this node
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    assert [row["rank"] for row in rows] == list(range(nprocs)), done.output
    assert {row["environment"] for row in rows} == {"MPIEnvironment"}, done.output
    assert [row["local_rank"] for row in rows] == list(range(nprocs))
    assert {row["world"] for row in rows} == {nprocs}
    assert {row["node_rank"] for row in rows} == {0}
    # mpirun started every process; fabric_lite started none
    assert {row["parent"] for row in rows} == {"mpirun"}, rows
    assert len({row["pid"] for row in rows}) == nprocs
    # the port rank 0 found free reached every rank
    assert len({row["main_port"] for row in rows}) == 1 and rows[0]["main_port"] > 0
    # exact collectives with rank-dependent inputs
    assert {row["all_reduce"] for row in rows} == {float(sum(range(1, nprocs + 1)))}
    assert all(row["all_gather"] == [10 * r for r in range(nprocs)] for row in rows)
    expected = reference(nprocs)
    for row in rows:
        assert row["weights"] == expected, f"rank {row['rank']} trained other weights than fabric_lite's ddp run"


@pytest.mark.timeout(180)
def test_devices_that_disagree_with_mpirun_are_an_error_on_every_rank(mpi: Path) -> None:
    done = mpirun(2, "--devices", "3", timeout=90)
    assert done.returncode != 0, done.output
    message = "Fabric(devices=3, num_nodes=1) does not match the MPI job: 2 processes on 1 node(s), 2 on this one."
    assert done.stderr.count(message) == 2, done.output  # every rank says it, before any rendezvous
    assert "RESULT" not in done.stdout


@pytest.mark.timeout(180)
def test_a_failing_rank_ends_the_mpi_job(mpi: Path) -> None:
    timeout = 100  # the process-group timeout: the job must end long before it
    done = mpirun(2, "--fail-rank", "1", "--timeout", str(timeout), timeout=timeout + 50)
    assert done.returncode != 0, done.output
    assert done.seconds < timeout / 2, f"the job ended only after {done.seconds:.0f} s\n{done.output}"
    assert re.search(r"RuntimeError: rank 1 fails on purpose in step 1$", done.stderr, re.MULTILINE), done.output
    assert "mpirun detected that one or more processes exited with non-zero status" in done.stderr, done.output
    assert "RESULT" not in done.stdout
