"""Run code in fresh processes with a hard time bound, and check that nothing is left behind.

Every multi-process test goes through :func:`run_python` (a script or ``-c`` code, in a new session) or
:func:`spawn_job` (a function run on N ranks by fabric_lite's own ``ddp_fork`` launcher, inside such a
subprocess); a job that pickles its ranks' results to a file, :func:`spawn_job` among them, runs through
:func:`run_job`. On timeout the whole session is killed and the test fails with everything the processes printed.
After the command ends, any process still alive in its session is an orphan: it is killed and the test fails.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
#: on ``PYTHONPATH`` in every process the suite starts (``tests/conftest.py``): its ``sitecustomize`` skips the
#: interpreter's last garbage collections at exit
SITE = Path(__file__).resolve().with_name("site")
#: in a job's environment, for the interpreter's whole shutdown (a test that checks how a job ends)
FULL_EXIT = {"TESTS_FULL_EXIT": "1"}


@dataclass
class Completed:
    argv: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    #: wall-clock time (``time.time()``) when the process had exited, to compare with timestamps it printed
    ended_at: float = 0.0

    @property
    def output(self) -> str:
        return f"--- stdout ---\n{self.stdout}\n--- stderr ---\n{self.stderr}"

    def seconds_after(self, line_start: str) -> float:
        """From the time on the first stdout line that starts with ``line_start`` (ending ``at=<time.time()>``) to
        the process's exit: how fast a job ended after that moment, whatever its processes took to start."""
        found = re.search(rf"^{re.escape(line_start)}.*?\bat=([0-9.]+)$", self.stdout, re.MULTILINE)
        assert found, f"no line starting {line_start!r}\n{self.output}"
        return self.ended_at - float(found.group(1))


def _session_members(sid: int) -> list[int]:
    """PIDs of live processes in session ``sid`` (Linux /proc)."""
    members = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # fields after the ")" that ends the command name: state ppid pgrp session ...
        fields = stat.rsplit(")", 1)[1].split()
        if len(fields) > 3 and int(fields[3]) == sid and fields[0] != "Z":
            members.append(int(entry))
    return members


def _kill_session(sid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(sid, signal.SIGKILL)
    for pid in _session_members(sid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def base_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_LITE_", "SLURM_", "TORCHELASTIC_"))}
    for name in (
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "NODE_RANK",
        "GROUP_RANK",
        "LOCAL_WORLD_SIZE",
    ):
        env.pop(name, None)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["PYTHONUNBUFFERED"] = "1"
    env.setdefault("OMP_NUM_THREADS", "1")
    if extra:
        env.update(extra)
    return env


def run_python(
    args: list[str],
    timeout: float = 60,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike[str] | None = None,
    expect_orphans: bool = False,
    python: str | None = None,
    nice: int = 0,
) -> Completed:
    """Run ``python *args`` in a new session; kill the session and fail the test after ``timeout`` seconds.

    The processes get a private ``TMPDIR``; anything they leave in it is reported as a leaked temporary file.
    ``python`` is another interpreter to use (e.g. the Lightning venv's), this one by default. ``nice`` lowers the
    processes' CPU priority: long runs that time nothing (the litgpt tier) then leave the cores to the other test
    worker's timed jobs.
    """
    argv = [python or sys.executable, *args]
    env = dict(env if env is not None else base_env())
    private_tmp = tempfile.mkdtemp(prefix="fabric_lite_test_tmp_")
    env["TMPDIR"] = private_tmp
    try:
        done = _run_bounded(argv, timeout, env, cwd, expect_orphans, nice)
        # torch's own compile cache (Adam.step imports torch._inductor) and torchrun's own log folder are not ours
        leftovers = sorted(
            name for name in os.listdir(private_tmp) if not name.startswith(("torchinductor_", "torchelastic_"))
        )
        if leftovers:
            pytest.fail(f"`{' '.join(argv[:4])} ...` left temporary files behind: {leftovers}\n{done.output}")
        return done
    finally:
        shutil.rmtree(private_tmp, ignore_errors=True)


def _run_bounded(
    argv: list[str],
    timeout: float,
    env: dict[str, str],
    cwd: str | os.PathLike[str] | None,
    expect_orphans: bool,
    nice: int = 0,
) -> Completed:
    start = time.monotonic()
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        cwd=cwd or REPO,
        start_new_session=True,
        text=True,
        preexec_fn=(lambda: os.nice(nice)) if nice else None,
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
    except BaseException as err:  # the bound, or the test's own time bound (conftest) interrupting the wait
        _kill_session(process.pid)
        stdout, stderr = process.communicate()
        if not isinstance(err, subprocess.TimeoutExpired):
            raise
        pytest.fail(
            f"`{' '.join(argv[:4])} ...` did not finish within {timeout} s (killed).\n"
            f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
        )
    elapsed = time.monotonic() - start
    ended_at = time.time()
    # give exiting grandchildren a moment, then treat whatever is left in the session as an orphan
    deadline = time.monotonic() + 2.0
    while _session_members(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    leftovers = _session_members(process.pid)
    if leftovers:
        _kill_session(process.pid)
        if not expect_orphans:
            pytest.fail(
                f"processes {leftovers} outlived `{' '.join(argv[:4])} ...` (orphans).\n"
                f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            )
    return Completed(argv, process.returncode, stdout, stderr, elapsed, ended_at)


def run_job(args: list[str], timeout: float, env: dict[str, str] | None = None, python: str | None = None) -> Any:
    """Run ``python *args OUT`` as :func:`run_python` does, for a job that pickles its ranks' results to its last
    argument ``OUT`` (a temporary file), and return what it pickled. The test fails, with everything the job
    printed, when the job exits non-zero or writes nothing."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.pkl"
        done = run_python([*args, str(out)], timeout=timeout, env=env, python=python)
        if done.returncode != 0 or not out.is_file():
            pytest.fail(f"job `{' '.join(args)}` failed with exit code {done.returncode}.\n{done.output}")
        return pickle.loads(out.read_bytes())


def series_job(module: str, nprocs: int, jobs: dict[str, dict[str, Any]], timeout: float) -> dict[str, list[Any]]:
    """Run several jobs of a job module (name: its options, with the ``"job"`` to run) one after another in one launch
    of ``nprocs`` ranks, each with a Fabric of its own (``tests.helpers.jobs._runner.serve``); every rank's result of
    each job, by name. ``timeout`` bounds the whole launch."""
    entries = [{"name": name, **options} for name, options in jobs.items()]
    runs = run_job(["-m", module, "series", str(nprocs), json.dumps(entries)], timeout)
    return {name: [run[name] for run in runs] for name in jobs}


def spawn_job(target: str, nprocs: int, timeout: float = 90, **kwargs: Any) -> list[Any]:
    """Run ``target(fabric, **kwargs)`` (``"tests.helpers.jobs.module:function"``) on ``nprocs`` CPU ranks with
    ``ddp_fork`` and return the list of per-rank return values (gathered by the job runner)."""
    return run_job(["-m", "tests.helpers.jobs._runner", target, str(nprocs), json.dumps(kwargs)], timeout)  # type: ignore[no-any-return]


def per_rank(job_results: list[dict[str, Any]], check: str) -> list[Any]:
    """Each rank's observation for ``check`` from a job that records checks; a check that crashed on a rank
    fails the test with that rank's traceback."""
    results = [rank_result[check] for rank_result in job_results]
    for rank, result in enumerate(results):
        assert "traceback" not in result, f"rank {rank}:\n{result['traceback']}"
    return results


_LIGHTNING_PYTHON: list[str | None] = []


def lightning_python() -> str | None:
    """The Python of a venv with Lightning Fabric (``.venv-lightning``, made by ``.ci/setup``, or
    ``$LIGHTNING_PYTHON``), for the side-by-side checks; ``None`` when there is none."""
    if not _LIGHTNING_PYTHON:
        found = None
        for candidate in (os.environ.get("LIGHTNING_PYTHON"), str(REPO / ".venv-lightning" / "bin" / "python")):
            if candidate and Path(candidate).is_file():
                # found, not imported: an import would cost an interpreter's torch import in every worker
                probe = "import importlib.util, sys; sys.exit(importlib.util.find_spec('lightning_fabric') is None)"
                check = subprocess.run([candidate, "-c", probe], capture_output=True, timeout=120)
                if check.returncode == 0:
                    found = candidate
                    break
        _LIGHTNING_PYTHON.append(found)
    return _LIGHTNING_PYTHON[0]


def optional_tier_skipped(config: pytest.Config, marker: str, variable: str, module_file: str) -> str | None:
    """Why an optional tier (``s3``, ``mpi``, ``benchmark``) does not run in this session, or ``None`` when it does.

    The tier runs when it is asked for: its marker in ``-m`` (``pytest -m s3``), its test file named on the command
    line, or ``$variable`` set to ``1`` (an error instead of a skip when it cannot be set up; ``.ci/run`` sets it for
    every tier). The whole suite run without it leaves the tier out, with this reason; ``$variable=0`` always skips it.
    """
    wanted = os.environ.get(variable, "")
    if wanted == "0":
        return f"{marker} tier: {variable}=0"
    if wanted == "1" or marker in (config.option.markexpr or ""):
        return None
    if any(Path(arg.split("::", 1)[0]).name == module_file for arg in config.args):
        return None
    return (
        f"{marker} tier: optional, not asked for (run it with `pytest -m {marker}`, or {variable}=1 in the whole suite)"
    )


def optional_venv(
    config: pytest.Config,
    *,
    marker: str,
    variable: str,
    module_file: str,
    venv: Path,
    setup: str,
    probe: str,
    timeout: float = 900,
) -> str:
    """The Python of an optional tier's own venv (``.venv-deepspeed``, ``.venv-litgpt``), built by its ``setup``
    script (``.ci/setup-...``) when ``probe`` does not import there; skips the tier when it is not asked for (see
    :func:`optional_tier_skipped`), and when the venv cannot be built, unless ``$variable=1`` (then it fails, with the
    script's last lines)."""
    reason = optional_tier_skipped(config, marker, variable, module_file)
    if reason:
        pytest.skip(reason)
    python = venv / "bin" / "python"

    def usable() -> bool:
        if not python.is_file():
            return False
        return (
            subprocess.run([str(python), "-c", probe], capture_output=True, timeout=180, env=base_env()).returncode == 0
        )

    if not usable():
        logging.getLogger(__name__).warning("building %s with %s", venv.name, setup)
        try:
            done = subprocess.run([str(REPO / setup)], capture_output=True, text=True, timeout=timeout, cwd=REPO)
            failure = None if done.returncode == 0 else (done.stderr or done.stdout).strip().splitlines()[-5:]
        except subprocess.TimeoutExpired:
            failure = [f"{setup} did not finish within {timeout} s"]
        if failure is not None or not usable():
            message = f"{marker} tier: {setup} could not build {venv.name}: {' | '.join(failure or [])}"
            if os.environ.get(variable) == "1":
                pytest.fail(message)
            pytest.skip(f"{message} ({variable}=1 makes this a failure)")
    return str(python)
