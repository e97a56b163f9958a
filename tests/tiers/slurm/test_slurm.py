"""SLURM for real: fabric_lite jobs on a one-node SLURM cluster on localhost (tests/helpers/cluster/slurm_cluster.py).

The tier installs Debian's ``slurm-wlm`` and ``munge`` when they are missing (root and apt-get needed; about
15-30 s once), starts munged, slurmctld and slurmd with all their state in one temporary folder (about 1 s), runs
tests/helpers/scripts/slurm_train.py under ``srun``, ``sbatch`` and ``salloc``, and tears the cluster down at the end of
the session, failed tests included. Every trained model must equal, bit for bit, the same script run by
fabric_lite's own ``ddp`` launcher on 2 devices.

    .venv/bin/python -m pytest -q tests/tiers/slurm/test_slurm.py   # runs where it can, else skips with the first error
    FABRIC_LITE_SLURM=1 ...                                 # a cluster that cannot start is an error, not a skip
    FABRIC_LITE_SLURM=0 ...                                 # skip without trying
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.cluster import slurm_cluster as cluster_module
from tests.helpers.cluster.slurm_cluster import (
    ClusterUnavailable,
    SlurmCluster,
    _pids_with_env,
    _which,
    ensure_installed,
)
from tests.helpers.harness import REPO, base_env, run_python

pytestmark = [pytest.mark.slurm, pytest.mark.distributed]

SCRIPT = str(REPO / "tests" / "helpers" / "scripts" / "slurm_train.py")
PYTHON = sys.executable
SRUN = ["srun", "--kill-on-bad-exit=1"]  # a failed task ends the step at once (SLURM's default waits for the others)
JOB_TIMEOUT = 120  # seconds for one job; a 2-rank run takes a few seconds on an idle 2-core machine


def results(output: str) -> list[dict[str, Any]]:
    rows = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda row: int(row["rank"]))


@dataclass
class Done:
    """What a SLURM command (srun, sbatch --wait, salloc) returned, and how long it took."""

    returncode: int
    stdout: str
    stderr: str
    elapsed: float


def process_name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


# ------------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """The cluster for the whole session; stopped (daemons killed, folder removed) however the tests end."""
    wanted = os.environ.get("FABRIC_LITE_SLURM", "")
    if wanted == "0":
        pytest.skip("SLURM tier: FABRIC_LITE_SLURM=0")
    try:
        ensure_installed(timeout=180)
        cluster = SlurmCluster(base_env=base_env()).start()
    except ClusterUnavailable as error:
        message = (
            f"SLURM tier: no cluster: {error}. It needs Linux, root and apt-get (or slurm-wlm and munge already"
            " installed); FABRIC_LITE_SLURM=1 turns this skip into an error."
        )
        if wanted == "1":
            pytest.fail(message)
        pytest.skip(message)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def cluster(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The session's cluster, checked after each test: no job left in the queue, no task left running."""
    yield slurm_cluster
    emptied = slurm_cluster.wait_for_empty_queue(timeout=15)
    left = slurm_cluster.jobs()
    if not emptied:
        slurm_cluster.cancel_all()
    deadline = time.monotonic() + 5
    while (stray := slurm_cluster.task_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    names = {pid: process_name(pid) for pid in stray}
    for pid in stray:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert emptied, f"jobs {left} were still in the queue 15 s after the test\n{slurm_cluster.logs()}"
    assert not stray, f"processes {names} of the cluster outlived the test (killed)"


@pytest.fixture(scope="session")
def reference() -> list[float]:
    """The weights of the same training run started by fabric_lite's own `ddp` launcher on 2 devices."""
    done = run_python([SCRIPT, "--devices", "2"], timeout=JOB_TIMEOUT, env=base_env())
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    assert [row["rank"] for row in rows] == [0, 1], done.output
    assert rows[0]["environment"] == "LightningEnvironment"
    assert rows[0]["weights"] == rows[1]["weights"]
    return rows[0]["weights"]  # type: ignore[no-any-return]


def submit(
    cluster: SlurmCluster,
    argv: Sequence[str],
    cwd: Path,
    timeout: float = JOB_TIMEOUT,
    env: dict[str, str] | None = None,
) -> Done:
    """Run a SLURM command (srun, sbatch --wait, salloc) with a hard bound; on timeout fail with its output."""
    start = time.monotonic()
    try:
        done = cluster.run(argv, timeout=timeout, cwd=cwd, env=env)
    except subprocess.TimeoutExpired as expired:
        pytest.fail(
            f"`{' '.join(argv)}` did not finish within {timeout} s (killed, jobs cancelled).\n"
            f"--- stdout ---\n{expired.output}\n--- stderr ---\n{expired.stderr}\n{cluster.logs()}"
        )
    return Done(done.returncode, done.stdout, done.stderr, time.monotonic() - start)


def output(done: Done) -> str:
    return f"--- stdout ---\n{done.stdout}\n--- stderr ---\n{done.stderr}"


def check_training(rows: list[dict[str, Any]], reference: list[float], text: str, *, environment: str) -> None:
    """Two ranks, one world, exact collectives, and the reference run's weights."""
    assert [row["rank"] for row in rows] == [0, 1], text
    assert [row["local_rank"] for row in rows] == [0, 1], text
    assert {row["world"] for row in rows} == {2}
    assert {row["node_rank"] for row in rows} == {0}
    assert {row["environment"] for row in rows} == {environment}, text
    assert len({row["pid"] for row in rows}) == 2
    assert [row["all_reduce"] for row in rows] == [3.0, 3.0]
    assert [row["all_gather"] for row in rows] == [[0, 10], [0, 10]]
    for row in rows:
        assert row["weights"] == reference, f"rank {row['rank']} trained other weights than the reference run"


def batch_script(path: Path, directives: Sequence[str], body: Sequence[str]) -> Path:
    lines = ["#!/bin/bash", *(f"#SBATCH {d}" for d in directives), "#SBATCH --output=job-%j.out", "#SBATCH --time=3"]
    path.write_text("\n".join([*lines, "set -e", *body]) + "\n")
    return path


# --------------------------------------------------------------------------------------------------- srun, sbatch
@pytest.mark.timeout(180)
def test_srun_starts_both_ranks(cluster: SlurmCluster, reference: list[float], tmp_path: Path) -> None:
    done = submit(cluster, [*SRUN, "-n", "2", PYTHON, SCRIPT], tmp_path)
    assert done.returncode == 0, output(done)
    rows = results(done.stdout)
    check_training(rows, reference, output(done), environment="SLURMEnvironment")
    # SLURM started both processes; fabric_lite started none
    assert [row["parent"] for row in rows] == ["slurmstepd", "slurmstepd"], rows
    # the port every task derives from the job id, without MASTER_PORT
    job_id = rows[0]["job_id"]
    assert {row["main_port"] for row in rows} == {15000 + int(job_id[-4:])}


@pytest.mark.timeout(180)
def test_sbatch_with_ntasks_per_node(cluster: SlurmCluster, reference: list[float], tmp_path: Path) -> None:
    # two steps in one job: devices given, then devices="auto" taken from --ntasks-per-node; the second step
    # derives the same port from the job id after the first has released it
    script = batch_script(
        tmp_path / "train.sbatch",
        ["--job-name=train", "--nodes=1", "--ntasks-per-node=2"],
        [f"srun --kill-on-bad-exit=1 {PYTHON} {SCRIPT} --devices 2", f"srun --kill-on-bad-exit=1 {PYTHON} {SCRIPT}"],
    )
    done = submit(cluster, ["sbatch", "--wait", "--parsable", str(script)], tmp_path)
    job_id = done.stdout.strip().split(";")[0]
    log = (tmp_path / f"job-{job_id}.out").read_text() if job_id else ""
    assert done.returncode == 0, f"{output(done)}\n--- job output ---\n{log}"
    rows = results(log)
    assert len(rows) == 4, log
    assert sorted({row["step_id"] for row in rows}) == ["0", "1"]
    for step in ([row for row in rows if row["step_id"] == step_id] for step_id in ("0", "1")):
        check_training(step, reference, log, environment="SLURMEnvironment")
        assert {row["job_name"] for row in step} == {"train"}
        assert {row["parent"] for row in step} == {"slurmstepd"}


@pytest.mark.timeout(180)
def test_batch_script_without_srun_starts_its_own_processes(
    cluster: SlurmCluster, reference: list[float], tmp_path: Path
) -> None:
    # `python train.py` straight in the batch script: SLURM started one process (rank 0 of SLURM_NTASKS=2); waiting
    # for a rank 1 that nobody starts would hang until the process-group timeout (it did, as in Lightning)
    directives = ["--nodes=1", "--ntasks-per-node=2"]
    script = batch_script(tmp_path / "forgot_srun.sbatch", directives, [f"{PYTHON} {SCRIPT} --devices 2 --timeout 20"])
    done = submit(cluster, ["sbatch", "--wait", "--parsable", str(script)], tmp_path)
    job_id = done.stdout.strip().split(";")[0]
    log = (tmp_path / f"job-{job_id}.out").read_text() if job_id else ""
    assert done.returncode == 0, f"{output(done)}\n--- job output ---\n{log}"
    rows = results(log)
    check_training(rows, reference, log, environment="LightningEnvironment")
    assert rows[1]["parent"] == "python", "rank 1 should have been started by fabric_lite's launcher (rank 0)"
    assert f"This process runs in the batch script of SLURM job {job_id} (SLURM_NTASKS=2)" in log
    assert "srun --ntasks-per-node=2 python script.py" in log


@pytest.mark.timeout(180)
def test_example_batch_script(cluster: SlurmCluster, tmp_path: Path) -> None:
    # examples/slurm/train.sbatch as the README says to submit it (from the repository root); its output and the
    # checkpoint go to tmp_path
    checkpoint = tmp_path / "example.ckpt"
    argv = ["sbatch", "--wait", "--parsable", f"--output={tmp_path}/slurm-%j.out", "examples/slurm/train.sbatch"]
    argv += ["--epochs", "1", "--checkpoint", str(checkpoint)]
    done = submit(cluster, argv, REPO, env=base_env({"PYTHON": PYTHON}))
    job_id = done.stdout.strip().split(";")[0]
    log = (tmp_path / f"slurm-{job_id}.out").read_text() if job_id else ""
    assert done.returncode == 0, f"{output(done)}\n--- job output ---\n{log}"
    assert f"job {job_id} on localhost: 2 tasks, 2 per node" in log
    assert "0: training on 2 process(es), strategy DDPStrategy" in log, log
    assert "1: training on" not in log  # fabric.print: rank 0 only
    assert re.search(r"^0: epoch  1/1  loss \d+\.\d+  accuracy", log, re.MULTILINE), log
    assert checkpoint.is_file()


# ---------------------------------------------------------------------------------------- interactive job names
@pytest.mark.timeout(180)
def test_salloc_shell_starts_its_own_processes(cluster: SlurmCluster, reference: list[float], tmp_path: Path) -> None:
    # `salloc -n 2`, then `python train.py` in its shell: no srun task, the job is named "interactive"
    done = submit(cluster, ["salloc", "-n", "2", PYTHON, SCRIPT, "--devices", "2", "--timeout", "20"], tmp_path)
    assert done.returncode == 0, output(done)
    rows = results(done.stdout)
    check_training(rows, reference, output(done), environment="LightningEnvironment")
    assert {row["job_name"] for row in rows} == {"interactive"}
    assert rows[1]["parent"] == "python"
    assert "This process runs in an salloc shell of SLURM job" in done.stderr


@pytest.mark.timeout(180)
def test_srun_inside_salloc_is_slurm_despite_the_interactive_name(
    cluster: SlurmCluster, reference: list[float], tmp_path: Path
) -> None:
    # the tasks inherit SLURM_JOB_NAME=interactive from the allocation; Lightning ignores SLURM here and each task
    # starts processes of its own. A step of two tasks is SLURM's whatever the job's name.
    done = submit(cluster, ["salloc", "-n", "2", *SRUN, "-n", "2", PYTHON, SCRIPT, "--timeout", "20"], tmp_path)
    assert done.returncode == 0, output(done)
    rows = results(done.stdout)
    check_training(rows, reference, output(done), environment="SLURMEnvironment")
    assert {row["job_name"] for row in rows} == {"interactive"}
    assert {row["parent"] for row in rows} == {"slurmstepd"}


@pytest.mark.timeout(180)
def test_job_named_bash(cluster: SlurmCluster, reference: list[float], tmp_path: Path) -> None:
    # one task running a shell (as `srun --pty bash` does), then `python train.py` with devices=2 in it:
    # fabric_lite starts the two processes
    shell = f"{PYTHON} {SCRIPT} --devices 2 --timeout 20"
    done = submit(cluster, [*SRUN, "-n", "1", "-J", "bash", "bash", "-c", shell], tmp_path)
    assert done.returncode == 0, output(done)
    rows = results(done.stdout)
    check_training(rows, reference, output(done), environment="LightningEnvironment")
    assert {row["job_name"] for row in rows} == {"bash"}
    assert rows[1]["parent"] == "python", "rank 1 should have been started by fabric_lite's launcher (rank 0)"

    # two tasks of a job named bash: SLURM's ranks (exactly two processes, not two per task)
    done = submit(cluster, [*SRUN, "-n", "2", "-J", "bash", PYTHON, SCRIPT, "--timeout", "20"], tmp_path)
    assert done.returncode == 0, output(done)
    rows = results(done.stdout)
    check_training(rows, reference, output(done), environment="SLURMEnvironment")
    assert {row["parent"] for row in rows} == {"slurmstepd"}


# ----------------------------------------------------------------------------------------------------- failures
@pytest.mark.timeout(120)
def test_ntasks_per_node_disagreeing_with_devices_is_an_error(cluster: SlurmCluster, tmp_path: Path) -> None:
    # --kill-on-bad-exit=0: both tasks fail by themselves; with 1, srun may kill the second before it prints
    argv = ["srun", "--kill-on-bad-exit=0", "--ntasks-per-node=2", "-n", "2", PYTHON, SCRIPT, "--devices", "3"]
    done = submit(cluster, argv, tmp_path, timeout=90)
    assert done.returncode != 0, output(done)
    message = "Fabric(devices=3) does not match SLURM's 2 tasks per node (SLURM_STEP_TASKS_PER_NODE=2"
    assert done.stderr.count(message) == 2, output(done)  # every task says it, before any rendezvous
    assert "Set devices=2 (or 'auto'), or ask SLURM for --ntasks-per-node=3." in done.stderr
    assert "RESULT" not in done.stdout


@pytest.mark.timeout(180)
def test_failing_rank_ends_the_job_with_the_root_cause(cluster: SlurmCluster, tmp_path: Path) -> None:
    timeout = 100  # the process-group timeout: the job must end long before it
    argv = [*SRUN, "--label", "-n", "2", PYTHON, SCRIPT, "--fail-rank", "1", "--timeout", str(timeout)]
    done = submit(cluster, argv, tmp_path, timeout=timeout + 50)
    assert done.returncode != 0, output(done)
    assert done.elapsed < timeout, f"the job ended only after {done.elapsed:.0f} s\n{output(done)}"
    # --label prefixes every line with the task that printed it: rank 1's own exception is the root cause
    root_cause = r"^1: (\[rank1\]: )?RuntimeError: rank 1 fails on purpose in step 1$"
    assert re.search(root_cause, done.stderr, re.MULTILINE), output(done)
    assert re.search(r"srun: error: localhost: tasks? [0-9,-]*1[0-9,-]*: Exited with exit code 1", done.stderr)
    assert "RESULT" not in done.stdout
    # rank 0 never reports an error of its own: at most the consequence of losing its peer, or SLURM's kill
    final = re.compile(r"^0: (\[rank0\]: )?\w+(Error|Exception): ")  # the last line of a traceback
    rank0_errors = [line for line in done.stderr.splitlines() if final.match(line)]
    assert all("Connection closed by peer" in line or "Connection reset" in line for line in rank0_errors), output(done)


# ------------------------------------------------------------------------------------- the cluster's own failures
def test_a_daemon_that_fails_is_reported_with_its_first_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if _which("munged") is None or os.geteuid() != 0:
        pytest.skip("needs munged installed (the SLURM tier installs it) and root")
    fake = tmp_path / "bin" / "slurmctld"
    fake.parent.mkdir()
    fake.write_text(
        "#!/bin/sh\necho 'slurmctld: debug: starting'\necho 'slurmctld: fatal: no such partition'\nexit 3\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    cluster = SlurmCluster(base_env=base_env(), start_timeout=15)
    with pytest.raises(ClusterUnavailable) as excinfo:
        cluster.start()
    assert str(excinfo.value) == "slurmctld exited with code 3: slurmctld: fatal: no such partition"
    # what had started (munged) is stopped and the folder is gone
    assert not cluster.root.exists()
    assert cluster.task_processes() == []
    assert not [pid for pid in _pids_with_env("SLURM_CONF", str(cluster.conf))]


def test_an_apt_failure_is_reported_with_apt_first_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = tmp_path / "bin" / "apt-get"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\ncase "$*" in *update*) exit 0;; esac\n'
        "echo 'Reading package lists...'\necho 'E: Unable to locate package slurm-wlm' >&2\nexit 100\n"
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(cluster_module, "BINARIES", ("no-such-slurm-binary",))
    with pytest.raises(ClusterUnavailable) as excinfo:
        ensure_installed(timeout=30)
    if os.geteuid() != 0:
        assert "not installed and this is not root" in str(excinfo.value)
    else:
        assert "(exit code 100): E: Unable to locate package slurm-wlm" in str(excinfo.value)


# ------------------------------------------------------------------------------------------------- auto-requeue
REQUEUE_SCRIPT = str(REPO / "tests" / "helpers" / "scripts" / "requeue_job.py")


def wait_for_lines(path: Path, wanted: Sequence[str], timeout: float, cluster: SlurmCluster) -> list[str]:
    """The lines of ``path`` once every line of ``wanted`` is among them; fail with the log after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if all(line in lines for line in wanted):
            return lines
        if time.monotonic() > deadline:
            jobs = "".join(f"--- {out.name} ---\n{out.read_text()}\n" for out in sorted(path.parent.glob("job-*.out")))
            pytest.fail(f"{wanted} not all in {path} within {timeout} s: {lines}\n{jobs}{cluster.logs()}")
        time.sleep(0.2)


def job_info(cluster: SlurmCluster, job_id: str) -> str:
    return cluster._client("scontrol", "show", "job", job_id)


def restarts(cluster: SlurmCluster, job_id: str) -> int | None:
    """``Restarts=`` of ``scontrol show job`` (None once SLURM has forgotten the job)."""
    found = re.search(r"\bRestarts=(\d+)", job_info(cluster, job_id))
    return int(found.group(1)) if found else None


@pytest.mark.timeout(240)
@pytest.mark.parametrize("auto_requeue", [True, False], ids=["auto-requeue", "no-requeue"])
def test_requeue_signal_requeues_the_job(cluster: SlurmCluster, tmp_path: Path, auto_requeue: bool) -> None:
    # SLURM's USR1 (what `sbatch --signal=USR1@90` sends before the time limit), sent here at once with
    # `scancel --signal=USR1`: rank 0 runs `scontrol requeue`, SLURM ends the run and starts the job again
    log = tmp_path / "starts.txt"
    flag = "" if auto_requeue else " --no-requeue"
    directives = ["--job-name=requeue", "--nodes=1", "--ntasks-per-node=2", "--requeue"]
    body = [f"srun --kill-on-bad-exit=1 {PYTHON} {REQUEUE_SCRIPT} --log {log}{flag}"]
    script = batch_script(tmp_path / "requeue.sbatch", directives, body)
    done = submit(cluster, ["sbatch", "--parsable", str(script)], tmp_path, timeout=30)
    assert done.returncode == 0, output(done)
    job_id = done.stdout.strip().split(";")[0]
    first_run = ["start 0 0 2 SLURMEnvironment", "start 0 1 2 SLURMEnvironment", "ready"]
    wait_for_lines(log, first_run, JOB_TIMEOUT, cluster)
    assert restarts(cluster, job_id) == 0
    signalled = submit(cluster, ["scancel", "--signal=USR1", job_id], tmp_path, timeout=30)
    assert signalled.returncode == 0, output(signalled)
    if auto_requeue:
        # requeued: Restarts=1 and back in the queue (COMPLETING while the first run ends, then PENDING)
        deadline = time.monotonic() + 60
        while not (restarts(cluster, job_id) == 1 and "JobState=PENDING" in job_info(cluster, job_id)):
            if time.monotonic() > deadline:
                pytest.fail(f"job {job_id} was not requeued within 60 s: {job_info(cluster, job_id)}\n{cluster.logs()}")
            time.sleep(0.2)
        # SLURM holds a requeued job for about two minutes (EligibleTime); let it start again in 5 s instead. Not at
        # once: slurmd revokes the first run's credential with a one-second resolution, and a run started within
        # that second is killed ("Killing non-startable batch JobId=11: Job credential revoked", seen here)
        submit(cluster, ["scontrol", "update", f"JobId={job_id}", "StartTime=now+5"], tmp_path, timeout=30)
        lines = wait_for_lines(log, ["start 1 0 2 SLURMEnvironment", "start 1 1 2 SLURMEnvironment"], 90, cluster)
        lines = wait_for_lines(log, ["done 0", "done 1"], 60, cluster)
        assert sorted(lines) == sorted([*first_run, "start 1 0 2 SLURMEnvironment", "start 1 1 2 SLURMEnvironment",
                                        "done 0", "done 1"]), lines  # fmt: skip
        assert cluster.wait_for_empty_queue(timeout=30), cluster.jobs()
    else:
        # nothing handles USR1: its default action ends the tasks, and the job is not queued again
        assert cluster.wait_for_empty_queue(timeout=60), f"job {job_id} still queued\n{cluster.logs()}"
        lines = log.read_text().splitlines()
        assert lines == [line for line in lines if line in first_run] and len(lines) == 3, lines
        job_log = (tmp_path / f"job-{job_id}.out").read_text()
        assert re.search(r"tasks? 0-1: User defined signal 1", job_log), job_log
