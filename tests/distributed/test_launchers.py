"""Launchers, tested by launching: the script re-run launcher, spawn, fork, torchrun and a SLURM job.

Every test runs real processes with a real gloo process group inside a bounded session (tests/helpers/harness.py),
which also fails the test if any process outlives the job.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.harness import REPO, _kill_session, _session_members, base_env, run_python

pytestmark = pytest.mark.distributed
SCRIPT = "tests/helpers/scripts/launch_script.py"


def results(output: str, tag: str = "RESULT") -> list[dict]:
    rows = [json.loads(line.split(" ", 1)[1]) for line in output.splitlines() if line.startswith(tag + " ")]
    return sorted(rows, key=lambda row: row["rank"]) if rows and "rank" in rows[0] else rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# ---------------------------------------------------------------------------------------------------- success
@pytest.mark.parametrize("world", [2, 3])
def test_script_relaunch_runs_every_rank(world: int) -> None:
    done = run_python([SCRIPT, "--strategy", "ddp", "--devices", str(world)], timeout=90)
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    assert [r["rank"] for r in rows] == list(range(world))
    steps = 5
    for row in rows:
        assert row["world"] == world
        assert row["local_rank"] == row["rank"]
        assert row["total"] == steps * world * (world + 1) / 2
        assert row["gathered"] == list(range(world))
        assert row["strategy"] == "DDPStrategy"
    # rank 0 is the process we started; the others are its children, started with LOCAL_RANK set
    assert rows[0]["env_local_rank"] is None
    assert all(r["ppid"] == rows[0]["pid"] for r in rows[1:])
    assert [r["env_local_rank"] for r in rows[1:]] == [str(i) for i in range(1, world)]
    assert "terminate called" not in done.stderr
    # fabric.print prints on local rank 0 only (the ranks share the pipe: a line may run into another rank's)
    assert re.findall(r"PRINTED by rank \d+", done.stdout) == ["PRINTED by rank 0"]


def test_script_relaunch_as_module() -> None:
    """`python -m package.module` is re-run as a module, with the same arguments."""
    done = run_python(["-m", "tests.helpers.scripts.launch_script", "--strategy", "ddp", "--devices", "2"], timeout=90)
    assert done.returncode == 0, done.output
    assert [r["rank"] for r in results(done.stdout)] == [0, 1]


def test_later_fabrics_in_a_launched_script_join_its_processes() -> None:
    """A second Fabric in a ``ddp`` script joins the running job, in rank 0 too (Lightning's behaviour): rank 0
    started no second set of children, which would wait forever at exit on a rendezvous no rank joins."""
    done = run_python(["tests/helpers/scripts/later_fabrics.py"], timeout=150)
    assert done.returncode == 0, done.output
    rows = results(done.stdout, "ROUND")
    by_round: dict[str, list[dict]] = {}
    for row in rows:
        by_round.setdefault(row["round"], []).append(row)
    for name, values in by_round.items():
        by_round[name] = sorted(values, key=lambda row: row["rank"])
    assert list(by_round) == ["first", "joined", "formed again", "model parallel", "other devices"], done.output
    pids = {row["pid"] for row in rows}
    assert len(pids) == 2, done.output  # the same two processes in every round
    assert [r["total"] for r in by_round["first"]] == [3.0, 3.0]
    assert [r["total"] for r in by_round["joined"]] == [21.0, 21.0]
    assert all(r["group_kept"] for r in by_round["joined"])
    assert [r["total"] for r in by_round["formed again"]] == [201.0, 201.0]  # a new group over the same store
    assert [r["total"] for r in by_round["model parallel"]] == [1.0, 1.0]
    assert all(r["mesh"] == ["data_parallel", "tensor_parallel"] for r in by_round["model parallel"])
    rank0, rank1 = (r["error"] for r in by_round["other devices"])
    assert "launched a job of 2 process(es) per node" in rank0 and "asks for 3 per node" in rank0, rank0
    assert "rank 1 of 2" in rank1 and "rank 1 of 3" in rank1, rank1


@pytest.mark.parametrize("strategy", ["ddp_spawn", "ddp_fork"])
def test_spawn_and_fork_return_rank_zero_result(strategy: str) -> None:
    done = run_python([SCRIPT, "--strategy", strategy, "--devices", "2"], timeout=90)
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    assert [r["rank"] for r in rows] == [0, 1]
    launcher_result = results(done.stdout, "LAUNCHER")
    assert len(launcher_result) == 1 and launcher_result[0]["rank"] == 0  # rank 0's return value, in the parent
    assert launcher_result[0]["pid"] == rows[0]["pid"]


_FORK_BESIDE_NO_STORE = """
import os

import torch
import torch.multiprocessing as mp

from fabric_lite import Fabric


def threads():
    return sorted(open(f"/proc/self/task/{task}/comm").read().strip() for task in os.listdir("/proc/self/task"))


start_processes = mp.start_processes


def recording(*args, **kwargs):
    print("AT FORK", threads(), flush=True)
    return start_processes(*args, **kwargs)


mp.start_processes = recording
for _ in range(2):  # the second job forks after the first one's store is gone, too
    fabric = Fabric(accelerator="cpu", devices=3, strategy="ddp_fork")
    print("RESULT", fabric.launch(lambda fabric: fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the threads from /proc")
def test_fork_launcher_forks_before_the_store_has_a_server_thread() -> None:
    """The store's server thread looks up each client's address under the C library's resolver lock; a worker
    forked while it held that lock hung in its own first lookup, connecting to the store (a 3-rank job in CI: "2 of
    3 ranks joined"). The launcher now forks its workers first and hosts the store after."""
    done = run_python(["-c", _FORK_BESIDE_NO_STORE], timeout=90)
    assert done.returncode == 0, done.output
    at_fork = [line for line in done.stdout.splitlines() if line.startswith("AT FORK")]
    assert len(at_fork) == 2, done.output
    for line in at_fork:
        assert "pt_tcpstore" not in line, line  # torch names the server thread pt_tcpstore_uv
    assert done.stdout.count("RESULT 3.0") == 2, done.output


@pytest.mark.timeout(240)
@pytest.mark.parametrize("start_method", ["spawn", "forkserver"])
def test_new_interpreters_start_as_a_fork_would(start_method: str) -> None:
    """A module passed to spawned ranks is each rank's own (torch.multiprocessing puts it in shared memory, where an
    in-place update of one rank would reach every rank and the launching process), tied weights stay tied, and the
    ranks start with the launching process's random states and flags."""
    done = run_python(["tests/helpers/scripts/spawn_arguments.py", start_method], timeout=180)
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    parent = results(done.stdout, "PARENT")[0]
    assert [row["rank"] for row in rows] == [0, 1]
    for row in rows:
        assert row["tensor_shared"]  # a plain tensor travels through shared memory, as in torch
        assert not any(row["params_shared"]) and not row["buffer_shared"] and row["tied"]
        assert row["initial_seed"] == 123 and row["deterministic"] and row["cudnn_benchmark"]
        assert row["draws"] == parent["draws"]  # torch, numpy, random: what the launching process would draw next
    assert [row["weight_change"] for row in rows] == [1.0, 0.0]  # rank 0's in-place update stays in rank 0
    assert parent["weight_unchanged"]


@pytest.mark.timeout(180)
def test_torchrun_starts_the_processes_not_fabric_lite() -> None:
    done = run_python(
        [
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc-per-node",
            "2",
            SCRIPT,
            "--strategy",
            "ddp",
            "--devices",
            "auto",
        ],
        timeout=120,
    )
    assert done.returncode == 0, done.output
    rows = results(done.stdout)
    assert [r["rank"] for r in rows] == [0, 1]
    assert rows[0]["ppid"] == rows[1]["ppid"]  # both are children of torchrun's agent, not of each other
    assert all(r["total"] == 5 * 3 for r in rows)


@pytest.mark.timeout(180)
def test_torchrun_mismatch_ends_the_job_with_the_error() -> None:
    done = run_python(
        ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", SCRIPT, "--devices", "3"],
        timeout=120,
    )
    assert done.returncode != 0
    # the first rank to check ends the job: torchrun then stops the other, which may not have got that far
    assert "Fabric(devices=3) does not match torchrun's --nproc-per-node=2" in done.stderr, done.output
    assert "RESULT" not in done.stdout


@pytest.mark.parametrize("rank", [0, 1])
def test_torchrun_mismatch_is_an_error_on_each_rank_without_waiting_for_a_peer(rank: int) -> None:
    """Every rank fails before any collective, each naming both values: each is started alone, with the variables
    torchrun sets, so a rank that waited for its peer would hang to the timeout instead of failing."""
    torchrun = {"TORCHELASTIC_RUN_ID": "none", "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2"}
    torchrun |= {"LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}
    done = run_python([SCRIPT, "--devices", "3"], timeout=60, env=base_env(torchrun))
    assert done.returncode != 0
    assert done.stderr.count("Fabric(devices=3) does not match torchrun's --nproc-per-node=2") == 1, done.output
    assert "RESULT" not in done.stdout


def _slurm_env(rank: int, ntasks: int, port: int) -> dict[str, str]:
    return base_env(
        {
            "SLURM_NTASKS": str(ntasks),
            "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(rank),
            "SLURM_NODEID": "0",
            "SLURM_NTASKS_PER_NODE": str(ntasks),
            "SLURM_NNODES": "1",
            "SLURM_NODELIST": "localhost",
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NAME": "train",
            "MASTER_PORT": str(port),
        }
    )


def _run_slurm_tasks(ntasks: int, devices: str, timeout: float = 90) -> list[subprocess.CompletedProcess[str]]:
    """Start one process per task with the variables srun sets (what srun itself does is tested in the SLURM tier)."""
    port = free_port()
    procs = [
        subprocess.Popen(
            [sys.executable, SCRIPT, "--strategy", "ddp", "--devices", devices],
            env=_slurm_env(rank, ntasks, port),
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        for rank in range(ntasks)
    ]
    outputs = []
    try:
        for proc in procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            outputs.append(subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr))
    finally:
        for proc in procs:
            _kill_session(proc.pid)
    return outputs


def test_slurm_environment_runs_without_starting_processes() -> None:
    outputs = _run_slurm_tasks(2, "auto")
    for out in outputs:
        assert out.returncode == 0, out.stdout + out.stderr
    rows = sorted((results(o.stdout)[0] for o in outputs), key=lambda r: r["rank"])
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["world"] == 2 and r["gathered"] == [0, 1] for r in rows)
    assert rows[0]["ppid"] != rows[1]["pid"] and rows[1]["ppid"] != rows[0]["pid"]  # nobody spawned anybody


def test_slurm_mismatch_is_an_error_on_every_rank() -> None:
    outputs = _run_slurm_tasks(2, "3", timeout=60)
    for out in outputs:
        assert out.returncode != 0
        assert "Fabric(devices=3) does not match SLURM's 2 tasks per node" in out.stderr, out.stderr


# ---------------------------------------------------------------------------------------------------- failures
@pytest.mark.parametrize("fail_rank", [1, 0])
def test_a_raising_rank_ends_the_job_and_is_reported_as_root_cause(fail_rank: int, record_property: Any) -> None:
    done = run_python([SCRIPT, "--devices", "2", "--fail-rank", str(fail_rank), "--fail-mode", "raise"], timeout=60)
    assert done.returncode != 0
    assert f"Root cause: rank {fail_rank}" in done.stderr, done.output
    assert f"ValueError: boom on rank {fail_rank}" in done.stderr
    seconds = done.seconds_after("FAILING ")
    record_property("time_to_fail_s", round(seconds, 2))
    assert seconds < 20, f"took {seconds:.1f} s to fail"


def test_three_ranks_middle_rank_fails() -> None:
    done = run_python([SCRIPT, "--devices", "3", "--fail-rank", "1"], timeout=60)
    assert done.returncode != 0
    assert "Root cause: rank 1 (local rank 1" in done.stderr, done.output
    assert "ValueError: boom on rank 1" in done.stderr


_REPORTS_BEFORE_EXIT_HANDLERS = """
import atexit, sys, time
from fabric_lite.strategies.launchers._supervisor import record_child_errors

record_child_errors(int(sys.argv[1]))
atexit.register(time.sleep, 60)  # registered later, so it runs first: like destroying the process group
raise ValueError("boom")
"""


def test_a_child_reports_its_error_before_its_exit_handlers_run() -> None:
    """A failed rank's exit handlers close its connections (its peers then fail, secondarily) and may take seconds
    on a loaded machine: its own report must reach rank 0 first, so that the supervisor waits for it."""
    read_fd, write_fd = os.pipe()
    child = subprocess.Popen(
        [sys.executable, "-c", _REPORTS_BEFORE_EXIT_HANDLERS, str(write_fd)],
        pass_fds=(write_fd,),
        cwd=REPO,
        env=base_env(),
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    os.close(write_fd)
    try:
        deadline = time.monotonic() + 50  # the child's imports, on a busy machine
        report = b""
        while b"ValueError: boom" not in report and time.monotonic() < deadline:
            if select.select([read_fd], [], [], 1.0)[0]:
                report += os.read(read_fd, 65536)
        assert b"ValueError: boom" in report, report
        assert child.poll() is None  # still in its exit handler, which sleeps for a minute
    finally:
        _kill_session(child.pid)
        child.wait()
        os.close(read_fd)


@pytest.mark.parametrize(("mode", "signal_name"), [("sigkill", "SIGKILL"), ("segv", "SIGSEGV")])
def test_a_rank_killed_by_a_signal_is_named(mode: str, signal_name: str, record_property: Any) -> None:
    done = run_python([SCRIPT, "--devices", "2", "--fail-rank", "1", "--fail-mode", mode], timeout=60)
    assert done.returncode != 0
    assert "Root cause: rank 1 (local rank 1, pid" in done.stderr and f"was killed by {signal_name}" in done.stderr, (
        done.output
    )
    seconds = done.seconds_after("FAILING ")
    record_property("time_to_fail_s", round(seconds, 2))
    assert seconds < 20, f"took {seconds:.1f} s to fail"


def test_busy_rank_zero_is_stopped_after_a_child_fails() -> None:
    """Rank 0 is busy outside any collective when rank 1 fails: the launcher still ends the job."""
    done = run_python(
        [SCRIPT, "--devices", "2", "--fail-rank", "1", "--fail-step", "0", "--steps", "1", "--fail-mode", "raise"],
        timeout=60,
    )
    assert done.returncode != 0
    assert "Root cause: rank 1" in done.stderr, done.output


@pytest.mark.parametrize("strategy", ["ddp", "ddp_forkserver"])
def test_killing_the_launcher_leaves_no_orphans(strategy: str) -> None:
    """SIGKILL to the launcher (rank 0 under ddp): the kernel kills its children (parent-death signal). Under
    forkserver the ranks are the fork server's children, and the server ends with the launcher."""
    # the collective timeout outlasts the test: the job ends only by the SIGKILL, never before all three say READY
    args = ["--strategy", strategy, "--devices", "3", "--timeout", "600"]
    proc = _start_and_wait_ready([*args, "--fail-rank", "1", "--fail-mode", "sleep", "--fail-step", "0"], 3)
    try:
        members = _session_members(proc.pid)
        assert len(members) >= 3
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        deadline = time.monotonic() + 10
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session_members(proc.pid) == [], "children outlived a SIGKILLed launcher"
    finally:
        _kill_session(proc.pid)


def test_spawn_failure_reports_the_worker_traceback() -> None:
    done = run_python([SCRIPT, "--strategy", "ddp_spawn", "--devices", "2", "--fail-rank", "1"], timeout=60)
    assert done.returncode != 0
    assert "ValueError: boom on rank 1" in done.stderr, done.output
    assert "Process 1 terminated with the following error" in done.stderr


def test_spawn_without_main_guard_says_how_to_fix_it() -> None:
    done = run_python(["tests/helpers/scripts/no_main_guard.py"], timeout=60)
    assert done.returncode != 0
    assert 'if __name__ == "__main__":' in done.stderr, done.output


def test_busy_master_port_fails_at_once_naming_the_port(record_property: Any) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        done = run_python([SCRIPT, "--devices", "2"], env=base_env({"MASTER_PORT": str(port)}), timeout=60)
    assert done.returncode != 0
    assert f"127.0.0.1:{port}" in done.stderr, done.output
    record_property("time_to_fail_s", round(done.seconds, 2))
    assert done.seconds < 20


def test_process_group_timeout_ends_a_job_with_a_stuck_rank(record_property: Any) -> None:
    """RELIABILITY 4: rank 1 never enters its collective; rank 0 raises after the timeout (3 s) naming the
    collective and the rank it waited for, and the launcher ends the stuck rank."""
    done = run_python(
        [SCRIPT, "--devices", "2", "--fail-rank", "1", "--fail-mode", "sleep", "--timeout", "3"], timeout=60
    )
    assert done.returncode != 0
    assert "CollectiveTimeoutError: all_reduce on 2 ranks timed out after 0:00:03: rank(s) [1] never took part" in (
        done.stderr
    ), done.output
    assert "Root cause:" in done.stderr
    seconds = done.seconds_after("FAILING ")
    record_property("time_to_fail_s", round(seconds, 2))
    assert seconds < 25, f"took {seconds:.1f} s"


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_a_rank_that_exits_0_early_is_named_as_the_root_cause(strategy: str, record_property: Any) -> None:
    """Exiting 0 while the others still run collectives is a failure, and it is the cause (RELIABILITY 3)."""
    done = run_python(
        [SCRIPT, "--strategy", strategy, "--devices", "2", "--fail-rank", "1", "--fail-mode", "exit0"], timeout=60
    )
    assert done.returncode != 0, done.output
    if strategy == "ddp":
        assert "Root cause: rank 1 (local rank 1" in done.stderr and "exited with code 0 while the other ranks" in (
            done.stderr
        ), done.output
    else:
        assert "process 1 exited with code 0 while the other processes were still running" in done.stderr, done.output
    seconds = done.seconds_after("FAILING ")
    record_property("time_to_fail_s", round(seconds, 2))
    assert seconds < 20, f"took {seconds:.1f} s to fail"


def _communicate_or_explain(proc: subprocess.Popen[str], timeout: float) -> tuple[str, str]:
    """``proc.communicate(timeout)``; on timeout, fail with what every thread of the job was doing (a signal that
    was never acted on leaves the main thread asleep; /proc shows where)."""
    try:
        return proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        lines = []
        for pid in _session_members(proc.pid):
            for task in sorted(os.listdir(f"/proc/{pid}/task")):
                try:
                    with open(f"/proc/{pid}/task/{task}/wchan") as f:
                        wchan = f.read()
                    with open(f"/proc/{pid}/task/{task}/status") as f:
                        status = [
                            x for x in f.read().splitlines() if x.startswith(("Name", "SigPnd", "ShdPnd", "SigBlk"))
                        ]
                except OSError:
                    continue
                lines.append(f"pid {pid} task {task}: {wchan} {' | '.join(status)}")
        _kill_session(proc.pid)
        stdout, stderr = proc.communicate()
        pytest.fail(f"no exit within {timeout} s of the signal.\n" + "\n".join(lines) + f"\n{stdout}\n{stderr}")


def _default_sigint() -> None:
    # A job started from a background shell inherits SIGINT ignored (bash ignores it in asynchronous commands,
    # e.g. `.ci/run &`), and so would this test's launcher: then SIGINT is meant to do nothing, and Python leaves
    # it so. The test is about a launcher that can be interrupted, so it starts one with SIGINT at its default.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_and_wait_ready(args: list[str], ranks: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, SCRIPT, *args],
        preexec_fn=_default_sigint,
        env=base_env(),
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    ready = 0
    deadline = time.monotonic() + 120  # the slowest start of three processes on a loaded machine
    assert proc.stdout is not None
    try:
        while ready < ranks and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            ready += line.startswith("READY")
    except BaseException:  # the test's time bound fired in readline: the caller's cleanup has not started yet
        _kill_session(proc.pid)
        raise
    if ready != ranks:
        _kill_session(proc.pid)
        stdout, stderr = proc.communicate(timeout=30)
        raise AssertionError(f"{ready} of {ranks} ranks said READY.\nstdout:\n{stdout}\nstderr:\n{stderr}")
    return proc


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
def test_sigterm_to_the_launcher_reaches_every_rank(strategy: str, record_property: Any) -> None:
    """RELIABILITY 5: SIGTERM to the launcher is forwarded; the ranks can act on it; nothing is left behind.

    The ranks are busy outside any collective (a rank blocked inside a gloo collective runs no Python signal
    handler until the collective returns; it is then ended after the grace period).
    """
    args = [
        "--strategy",
        strategy,
        "--devices",
        "2",
        "--fail-rank",
        "-2",
        "--fail-mode",
        "sleep",
        "--fail-step",
        "0",
        "--trap-sigterm",
    ]
    proc = _start_and_wait_ready(args, 2)
    try:
        start = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = _communicate_or_explain(proc, 30)
        elapsed = time.monotonic() - start
        assert proc.returncode != 0
        assert "GOT SIGTERM rank=1" in stdout, stdout + stderr
        if strategy == "ddp_spawn":
            assert "GOT SIGTERM rank=0" in stdout, stdout + stderr
        record_property("time_to_fail_s", round(elapsed, 2))
        assert elapsed < 10
        deadline = time.monotonic() + 5
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session_members(proc.pid) == []
    finally:
        _kill_session(proc.pid)


def test_sigint_to_the_launcher_interrupts_every_rank() -> None:
    proc = _start_and_wait_ready(["--devices", "2", "--fail-rank", "-2", "--fail-mode", "sleep", "--fail-step", "0"], 2)
    try:
        os.kill(proc.pid, signal.SIGINT)
        stdout, stderr = _communicate_or_explain(proc, 30)
        assert proc.returncode != 0
        assert "received SIGINT; passing it on to the other ranks" in stderr, stdout + stderr
        deadline = time.monotonic() + 5
        while _session_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _session_members(proc.pid) == []
    finally:
        _kill_session(proc.pid)


def test_a_rank_that_never_starts_is_reported_with_how_many_joined(record_property: Any, tmp_path: Path) -> None:
    """RELIABILITY 28: a 3-process job where rank 2 never starts: the others raise within the timeout, saying
    how many ranks joined. The 3 s rendezvous timeout counts from when ranks 0 and 1 are both up (they wait for a
    `go` file): on a loaded machine one interpreter can start seconds after the other."""
    port = free_port()
    argv = [sys.executable, SCRIPT, "--devices", "3", "--timeout", "3", "--rendezvous-timeout", "3"]
    procs = []
    try:
        for rank in range(2):
            env = base_env(
                {
                    "LOCAL_RANK": str(rank),
                    "WORLD_SIZE": "3",
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "NODE_RANK": "0",
                }
            )
            procs.append(
                subprocess.Popen(
                    [*argv, "--start-after", str(tmp_path)],
                    env=env,
                    cwd=REPO,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.PIPE,
                    text=True,
                    start_new_session=True,
                )
            )
        deadline = time.monotonic() + 120  # the slowest start of a loaded machine
        while not all((tmp_path / f"started-{rank}").exists() for rank in range(2)):
            assert time.monotonic() < deadline and all(p.poll() is None for p in procs), "a rank did not start"
            time.sleep(0.05)
        (tmp_path / "go").touch()
        start = time.monotonic()
        outputs = [p.communicate(timeout=60) for p in procs]
        elapsed = time.monotonic() - start
    finally:
        for p in procs:
            _kill_session(p.pid)
    for p, (_stdout, stderr) in zip(procs, outputs, strict=True):
        assert p.returncode != 0
        assert "CollectiveTimeoutError: The process group did not form within 0:00:03: 2 of 3 ranks joined" in stderr, (
            stderr
        )
    record_property("time_to_fail_s", round(elapsed, 2))
    assert elapsed < 30
