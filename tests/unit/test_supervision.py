"""The supervision policy (fabric_lite.runtime.supervision): which end of a rank is the root cause of a failed job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fabric_lite.runtime.supervision import (
    RankExit,
    RootCause,
    describe,
    from_torchrun,
    how_it_ended,
    is_secondary,
    signal_name,
)

LOST_PEER = "Traceback (most recent call last):\n  ...\nRuntimeError: Connection closed by peer [127.0.0.1]:1234"
RAISED = "Traceback (most recent call last):\n  ...\nValueError: boom on rank 1"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("error", "secondary"),
    [
        (LOST_PEER, True),
        ("RuntimeError: [gloo] Timed out waiting 30000ms for recv operation to complete", True),
        ("RuntimeError: NCCL communicator was aborted on rank 1", True),
        (RAISED, False),
        ("", False),
        ("Connection closed by peer\nValueError: the real error", False),  # only the last line counts
    ],
)
def test_is_secondary_reads_the_last_line(error: str, secondary: bool) -> None:
    assert is_secondary(error) is secondary


def test_a_primary_failure_is_the_root_cause_at_once() -> None:
    verdict = RootCause(window=1.0, clock=Clock())
    verdict.saw(RankExit(rank=1, code=1, error=RAISED))
    assert verdict.decide() == RankExit(rank=1, code=1, error=RAISED)


@pytest.mark.parametrize("primary", [RankExit(rank=2, code=-9), RankExit(rank=2, code=1)])
def test_a_secondary_failure_waits_for_the_rank_that_really_failed(primary: RankExit) -> None:
    clock = Clock()
    verdict = RootCause(window=1.0, clock=clock)
    verdict.saw(RankExit(rank=1, code=1, error=LOST_PEER))
    assert verdict.decide() is None and verdict.failed
    clock.now += 0.5
    verdict.saw(primary)  # a signal, or an exit that reported nothing: primary
    assert verdict.decide() == primary


def test_a_lone_secondary_failure_is_the_root_cause_after_the_window() -> None:
    clock = Clock()
    verdict = RootCause(window=1.0, clock=clock)
    lost = RankExit(rank=1, code=1, error=LOST_PEER)
    verdict.saw(lost)
    clock.now += 0.99
    assert verdict.decide() is None
    clock.now += 0.01
    assert verdict.decide() == lost


def test_a_secondary_failure_waits_longer_for_a_rank_that_has_reported_and_is_exiting() -> None:
    """The rank that really failed reports at once but may close its connections (failing the others) seconds
    before its process ends: the verdict waits for it up to ``patience``, not only ``window``, and no longer."""
    clock = Clock()
    verdict = RootCause(window=1.0, patience=30.0, clock=clock)
    lost = RankExit(rank=0, code=1, error=LOST_PEER)
    verdict.saw(lost)
    clock.now += 29.9
    assert verdict.decide(exiting=True) is None
    assert verdict.decide(exiting=False) == lost  # past the window, and nobody is exiting: the lost peer it is


@pytest.mark.parametrize("exiting", [True, False])
def test_the_wait_for_an_exiting_rank_is_bounded(exiting: bool) -> None:
    clock = Clock()
    verdict = RootCause(window=1.0, patience=30.0, clock=clock)
    lost = RankExit(rank=0, code=1, error=LOST_PEER)
    verdict.saw(lost)
    clock.now += 30.0
    assert verdict.decide(exiting=exiting) == lost


def test_the_launching_process_failing_stops_the_wait() -> None:
    verdict = RootCause(window=60.0, clock=Clock())
    lost = RankExit(rank=1, code=1, error=LOST_PEER)
    verdict.saw(lost)
    assert verdict.decide(waited=True) == lost


def test_a_rank_that_returned_early_is_the_cause_of_its_peers_lost_collectives() -> None:
    clock = Clock()
    verdict = RootCause(window=1.0, clock=clock)
    early = RankExit(rank=2, code=0)
    verdict.saw(early)
    assert verdict.decide() is None and not verdict.failed  # a rank may end first: nothing failed yet
    verdict.saw(RankExit(rank=1, code=1, error=LOST_PEER))
    clock.now += 1.0
    assert verdict.decide() == early


def test_ranks_that_end_with_the_job_are_not_early() -> None:
    clock = Clock()
    verdict = RootCause(window=1.0, clock=clock)
    verdict.saw(RankExit(rank=2, code=0), job_running=False)
    lost = RankExit(rank=1, code=1, error=LOST_PEER)
    verdict.saw(lost)
    clock.now += 1.0
    assert verdict.decide() == lost


def test_the_first_cause_stands() -> None:
    verdict = RootCause(window=1.0, clock=Clock())
    first = RankExit(rank=3, code=-11)
    verdict.saw(first)
    verdict.saw(RankExit(rank=1, code=1, error=RAISED))
    assert verdict.decide() == first


def test_no_failure_no_verdict() -> None:
    verdict = RootCause(window=1.0, clock=Clock())
    verdict.saw(RankExit(rank=1, code=0), job_running=False)
    assert verdict.decide() is None and not verdict.failed


@pytest.mark.parametrize(
    ("exit", "words"),
    [
        (RankExit(rank=1, code=-9, local_rank=1, pid=42), "rank 1 (local rank 1, pid 42) was killed by SIGKILL."),
        (RankExit(rank=1, code=-200), "rank 1 was killed by signal 200."),
        (RankExit(rank=2, code=3, pid=7), "rank 2 (pid 7) exited with code 3 (its own output above says why)."),
        (RankExit(rank=1, code=1, error=RAISED + "\n"), f"rank 1 failed with exit code 1. Its traceback:\n{RAISED}"),
        (RankExit(rank=2, code=0), "rank 2 exited with code 0 while the other ranks were still running"),
    ],
)
def test_describe(exit: RankExit, words: str) -> None:
    assert describe(exit).startswith(words)


def test_a_lost_peer_after_rank_0_finished_names_the_mismatch() -> None:
    text = describe(RankExit(rank=1, code=1, error=LOST_PEER), rank0_finished=True)
    assert text.endswith("Check that every rank calls the same collectives, the same number of times.)")
    assert "Rank 0 had already finished" not in describe(RankExit(rank=1, code=1, error=RAISED), rank0_finished=True)


def test_signal_words() -> None:
    assert signal_name(-9) == "SIGKILL" and signal_name(1) is None and signal_name(-200) is None
    assert how_it_ended(-15) == "killed by SIGTERM" and how_it_ended(2) == "exited with code 2"


def _torchrun_failure(tmp_path: Path, local_rank: int, code: int, error: str | None, timestamp: int) -> object:
    """A ``ProcessFailure`` as torchrun's agent builds it, from an error file in the format torch's recorder writes."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    path = tmp_path / f"error-{local_rank}.json"
    if error is not None:
        last = error.strip().splitlines()[-1]
        extra = {"py_callstack": error, "timestamp": str(timestamp)}
        path.write_text(json.dumps({"message": {"message": last, "extraInfo": extra}}))
    return ProcessFailure(local_rank=local_rank, pid=1000 + local_rank, exitcode=code, error_file=str(path))


def test_torchrun_failures_get_the_same_verdict_whatever_the_agent_saw_first(tmp_path: Path) -> None:
    # the agent orders by timestamp: rank 0 lost its peer a second before rank 1's own error was recorded
    failures = {
        0: _torchrun_failure(tmp_path, 0, 1, LOST_PEER, timestamp=10),
        1: _torchrun_failure(tmp_path, 1, 1, RAISED, timestamp=11),
    }
    cause = from_torchrun(failures)
    assert cause == RankExit(rank=1, code=1, error=RAISED, local_rank=1, pid=1001)
    assert describe(cause, traceback=False) == (
        "rank 1 (local rank 1, pid 1001) failed with exit code 1: ValueError: boom on rank 1"
    )


def test_a_rank_the_agent_stopped_with_sigterm_is_not_the_root_cause(tmp_path: Path) -> None:
    # rank 1 raised; the agent then sent SIGTERM to rank 0, within the same second (the timestamps are whole seconds)
    failures = {
        0: _torchrun_failure(tmp_path, 0, -15, LOST_PEER, timestamp=10),
        1: _torchrun_failure(tmp_path, 1, 1, RAISED, timestamp=10),
    }
    assert from_torchrun(failures) == RankExit(rank=1, code=1, error=RAISED, local_rank=1, pid=1001)
    # every rank ended by SIGTERM (sent to the job from outside): the first of them
    stopped = {r: _torchrun_failure(tmp_path, r, -15, None, timestamp=10) for r in (0, 1)}
    cause = from_torchrun(stopped)
    assert cause is not None and (cause.rank, cause.code) == (0, -15)


def test_torchrun_failures_without_error_files(tmp_path: Path) -> None:
    killed = {2: _torchrun_failure(tmp_path, 0, -9, None, timestamp=0)}
    assert from_torchrun(killed) == RankExit(rank=2, code=-9, error=None, local_rank=0, pid=1000)
    # a non-zero exit with no error file: the agent's own message is not a traceback of the rank's
    exited = from_torchrun({1: _torchrun_failure(tmp_path, 1, 3, None, timestamp=0)})
    assert exited is not None and exited.code == 3 and exited.rank == 1
    assert describe(exited) == "rank 1 (local rank 1, pid 1001) exited with code 3 (its own output above says why)."
    assert from_torchrun({}) is None
