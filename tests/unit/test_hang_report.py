"""The trail of collectives and the hang report, in this process: a trail written and read back, torn records, a full
string table, the report's format and diagnosis from synthetic trails, and stacks fetched from a live process.

The jobs that really hang are in tests/distributed/test_hang_report.py.
"""

from __future__ import annotations

import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from fabric_lite.runtime.diagnostics import hang_report as _hang_report
from fabric_lite.runtime.diagnostics import trail as _trail
from fabric_lite.runtime.diagnostics.trail import DONE, FAILED, WAITING, Record, Trail, TrailView, read_trail

LINE = re.compile(r"^  rank (\d+) \(pid (\d+), (alive|killed by SIG\w+|exited with code -?\d+|gone)\): (.+)$")


def group() -> SimpleNamespace:
    return SimpleNamespace(seq=0, trail_index=0)


def test_round_trip_names_the_callers_line(tmp_path: Path) -> None:
    trail = Trail(str(tmp_path), rank=1, world_size=2)
    world = group()
    desc = trail.describe("all_reduce(reduce_op=sum)", [torch.zeros(4)])
    line = sys._getframe().f_lineno + 1
    slot = trail.enter(world, desc, 0)
    trail.exit(slot, DONE)
    slot = trail.enter(world, trail.describe("barrier"), 0)
    view = read_trail(trail.path)
    assert view is not None
    assert (view.rank, view.pid, view.world_size) == (1, os.getpid(), 2)
    assert view.start_time == _trail.process_start_time(os.getpid()) > 0
    first, second = view.records
    assert (first.seq, first.desc, first.state, first.op) == (1, "all_reduce(sum) float32[4]", DONE, "all_reduce")
    assert first.site == f"test_hang_report.py:{line} in test_round_trip_names_the_callers_line"
    assert first.where == f"test_hang_report.py:{line}"
    assert first.exited_ns >= first.entered_ns > 0
    assert (second.seq, second.desc, second.state, second.exited_ns) == (2, "barrier", WAITING, 0)
    trail.exit(slot, FAILED)
    assert read_trail(trail.path).records[-1].state == FAILED  # type: ignore[union-attr]
    trail.close(remove=True)
    assert not tmp_path.exists() or not list(tmp_path.iterdir())


def test_the_ring_keeps_the_last_records_and_sequence_numbers_are_per_group(tmp_path: Path) -> None:
    trail = Trail(str(tmp_path), rank=0, world_size=2)
    world, sub = group(), group()
    trail.register_group(sub, "ranks [0, 1]")
    assert sub.trail_index == 1
    for _ in range(40):
        trail.exit(trail.enter(world, trail.describe("barrier"), 0))
    trail.exit(trail.enter(sub, trail.describe("barrier"), 0))
    records = read_trail(trail.path).records  # type: ignore[union-attr]
    assert len(records) == _trail.SLOTS - 1  # the slot at head is never trusted
    assert [r.seq for r in records if r.group == 0] == list(range(27, 41))
    assert [(r.group, r.seq) for r in records if r.group == 1] == [(1, 1)]
    trail.close(remove=True)


def test_torn_records_are_dropped(tmp_path: Path) -> None:
    trail = Trail(str(tmp_path), rank=0, world_size=2)
    world = group()
    for _ in range(5):
        trail.exit(trail.enter(world, trail.describe("barrier"), 0))
    words = trail._words
    base = _trail.HEADER_WORDS + 2 * _trail.RECORD_WORDS
    words[base + 3] = 7  # a state no writer stores: half-written
    words[base + _trail.RECORD_WORDS] = 1  # a sequence number that goes back
    assert [r.seq for r in read_trail(trail.path).records] == [1, 2, 5]  # type: ignore[union-attr]
    # a file that is not a trail, or is cut short, is no trail
    Path(tmp_path / "rank-9.trail").write_bytes(b"\0" * _trail.FILE_BYTES)
    assert read_trail(tmp_path / "rank-9.trail") is None
    Path(tmp_path / "rank-8.trail").write_bytes(Path(trail.path).read_bytes()[:100])
    assert read_trail(tmp_path / "rank-8.trail") is None
    trail.close(remove=True)


def test_a_full_string_table_shows_question_marks(tmp_path: Path) -> None:
    trail = Trail(str(tmp_path), rank=0, world_size=2)
    ids = [trail.intern(f"descriptor number {i} " + "x" * 150) for i in range(200)]
    ids += [trail.intern(str(i)) for i in range(3000)]  # until not even a short one fits
    assert ids[0] > 0 and ids[-1] == _trail.UNKNOWN
    trail.exit(trail.enter(group(), trail.describe("a call never seen before"), 0))
    record = read_trail(trail.path).records[-1]  # type: ignore[union-attr]
    assert record.desc == "?"
    strings = _trail.read_strings(Path(trail.path).read_bytes()[_trail.STRINGS_OFFSET :], trail._used)
    assert strings[ids[0]].startswith("descriptor number 0 ")
    # a torn last entry is dropped
    assert len(_trail.read_strings(Path(trail.path).read_bytes()[_trail.STRINGS_OFFSET :], trail._used - 1)) == (
        len(strings) - 1
    )
    trail.close(remove=True)


def test_trail_can_be_turned_off(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(_trail.ENV_TRAIL, "0")
    assert not _trail.trail_enabled()
    monkeypatch.setenv(_trail.ENV_TRAIL, "1")
    assert _trail.trail_enabled()


def test_ranks_of_one_job_derive_the_same_run_folder() -> None:
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "abc"}
    assert _trail.derived_run_dir(env) == _trail.derived_run_dir(dict(env))
    assert _trail.derived_run_dir(env) != _trail.derived_run_dir({**env, "MASTER_PORT": "29501"})


# ---------------------------------------------------------------------------------------------- the report
S = 1_000_000_000


def record(seq: int, desc: str, site: str, state: int, entered: float, exited: float = 0.0) -> Record:
    return Record(seq, 0, desc, site, state, int(entered * S), int(exited * S))


def view(rank: int, pid: int, *records: Record) -> TrailView:
    return TrailView(
        rank=rank, pid=pid, start_time=-2, world_size=len(records) and 2, stack_signal=0, records=list(records)
    )


def report(views: dict[int, TrailView], **kwargs: object) -> str:
    args: dict[str, object] = {"now_ns": 100 * S, "exit_codes": {}, "pids": {}, "stacks": {}, "world_size": 2}
    args.update(kwargs)
    return _hang_report.format_report("all_reduce #12 timed out after 0:00:05 on rank 0", views, **args)  # type: ignore[arg-type]


def lines_by_rank(text: str) -> dict[int, tuple[int, str, str]]:
    found = {}
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            found[int(m.group(1))] = (int(m.group(2)), m.group(3), m.group(4))
    return found


def test_a_rank_that_is_behind(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hang_report, "_alive", lambda view: True)
    views = {
        0: view(
            0,
            11,
            record(11, "barrier", "train.py:61 in step", DONE, 80, 81),
            record(12, "all_reduce(sum) float32[4]", "train.py:57 in step", WAITING, 95),
        ),
        1: view(1, 12, record(11, "barrier", "train.py:61 in step", DONE, 80, 81)),
    }
    stacks = {
        1: [
            [("/x/train.py", 80, "main"), ("/x/train.py", 40, "slow")],
            [("/usr/lib/python3.11/threading.py", 1002, "_bootstrap"), ("/x/t.py", 3, "worker")],
        ]
    }
    text = report(views, stacks=stacks)
    lines = text.splitlines()
    assert lines[0] == f"{_hang_report.BLOCK_START} — all_reduce #12 timed out after 0:00:05 on rank 0"
    assert lines[1] == (
        "  rank 1: barrier #11 at train.py:61 (done 19.0 s ago); rank 0: all_reduce #12 at train.py:57 (waiting 5.0 s)"
    )
    ranks = lines_by_rank(text)
    assert ranks[0] == (11, "alive", "waiting 5.0 s in all_reduce(sum) float32[4] #12 at train.py:57 in step")
    assert ranks[1] == (12, "alive", "not in a collective for 19.0 s; last: barrier #11 at train.py:61 (done)")
    assert "    earlier: barrier #11 train.py:61" in lines
    assert lines[lines.index("    stack (main thread, most recent last):") + 1 :][:2] == [
        "      train.py:80 in main",
        "      train.py:40 in slow",
    ]
    assert lines[-1] == "  diagnosis: rank 1 is behind (last #11 while rank 0 waits in #12)"
    assert all(len(line) <= 120 for line in lines)


def test_ranks_that_called_different_collectives(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hang_report, "_alive", lambda view: True)
    views = {
        0: view(0, 11, record(7, "barrier", "train.py:61 in step", WAITING, 95)),
        1: view(1, 12, record(7, "broadcast(src=0) float32[]", "train.py:62 in step", WAITING, 95)),
    }
    diagnosis = report(views).splitlines()[-1]
    assert diagnosis == (
        "  diagnosis: ranks called different collectives at #7 (rank 0 barrier at train.py:61, rank 1 broadcast at"
        " train.py:62)"
    )


def test_a_rank_that_died_inside_a_different_collective_still_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """torchrun's agent may stop a rank before its collective fails: what it called is still the cause."""
    monkeypatch.setattr(_hang_report, "_alive", lambda view: view.rank == 0)
    views = {
        0: view(0, 11, record(7, "barrier", "train.py:61 in step", WAITING, 95)),
        1: view(1, 12, record(7, "broadcast(src=0) float32[]", "train.py:62 in step", WAITING, 95)),
    }
    text = report(views)
    assert text.splitlines()[-1].startswith(
        "  diagnosis: ranks called different collectives at #7 (rank 0 barrier at train.py:61, rank 1 broadcast at"
    )
    assert lines_by_rank(text)[1][1] == "gone"


def test_a_rank_that_ended_after_a_different_collective_failed_still_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank whose mismatched collective failed (gloo saw the mismatch) and which then exited: the mismatch is the
    cause, its exit only what followed."""
    monkeypatch.setattr(_hang_report, "_alive", lambda view: view.rank == 0)
    views = {
        0: view(0, 11, record(7, "barrier", "train.py:61 in step", WAITING, 95)),
        1: view(1, 12, record(7, "broadcast(src=0) float32[]", "train.py:62 in step", FAILED, 95, 99)),
    }
    text = report(views)
    assert text.splitlines()[-1].startswith(
        "  diagnosis: ranks called different collectives at #7 (rank 0 barrier at train.py:61, rank 1 broadcast at"
        " train.py:62)"
    )
    assert lines_by_rank(text)[1][1] == "gone"


def test_a_rank_that_skipped_a_collective(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hang_report, "_alive", lambda view: True)
    views = {
        0: view(0, 11, record(8, "barrier", "train.py:61 in step", WAITING, 95)),
        1: view(1, 12, record(7, "barrier", "train.py:61 in step", WAITING, 95)),
    }
    assert "rank 1 skipped a collective or called one more (it waits in #7, rank 0 in #8)" in report(views)


def test_a_rank_that_died_and_one_without_a_trail(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_hang_report, "_alive", lambda view: view.rank == 0)
    views = {
        0: view(0, 11, record(12, "all_reduce(sum) float32[4]", "train.py:57 in step", WAITING, 95)),
        1: view(1, 12, record(12, "all_reduce(sum) float32[4]", "train.py:57 in step", WAITING, 94)),
    }
    text = report(views, exit_codes={1: -9}, world_size=3, pids={2: 13})
    ranks = lines_by_rank(text)
    assert ranks[1] == (
        12,
        "killed by SIGKILL",
        "last: all_reduce(sum) float32[4] #12 at train.py:57 (waiting when it died)",
    )
    assert ranks[2][:2] == (13, "gone") and ranks[2][2].startswith("no trail")
    assert "rank 1 died (killed by SIGKILL)" in text.splitlines()[-1]
    assert "rank 1: all_reduce #12 at train.py:57 (waiting when it died)" in text.splitlines()[1]


def test_the_block_is_taken_out_of_repeated_messages() -> None:
    block = report({})
    message = f"CollectiveTimeoutError: all_reduce timed out\n{block}\n"
    assert _hang_report.without_block(message, "") == "CollectiveTimeoutError: all_reduce timed out\n"
    traceback = f"Traceback ...\nCollectiveTimeoutError: all_reduce timed out\n{block}"
    assert _hang_report.without_block(traceback).endswith("timed out\n(where every rank was: see the report above)\n")


def test_one_report_per_run_folder(tmp_path: Path) -> None:
    assert _hang_report.claim(str(tmp_path))
    assert not _hang_report.claim(str(tmp_path))
    assert (tmp_path / "report").read_text() == str(os.getpid())  # who reports, for the launchers


@pytest.mark.timeout(60)
def test_a_launcher_lets_the_rank_that_reports_finish_first(tmp_path: Path) -> None:
    """Before stopping its ranks, a launcher waits for the one that claimed the report to end by itself (bounded), and
    not at all when nobody claimed it or a process outside ``processes`` did."""
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(1.5)"])
    try:
        waited: list[float] = []

        def join(timeout: float) -> None:
            waited.append(timeout)
            child.wait(timeout=timeout)

        started = time.monotonic()
        _hang_report.wait_for_reporter(str(tmp_path), {child.pid: join})  # nobody claimed it
        (tmp_path / "report").write_text(str(os.getpid()))  # claimed by a process the launcher does not stop
        _hang_report.wait_for_reporter(str(tmp_path), {child.pid: join})
        assert not waited and time.monotonic() - started < 1.0
        (tmp_path / "report").write_text(str(child.pid))  # claimed by the child: it is let end by itself
        _hang_report.wait_for_reporter(str(tmp_path), {child.pid: join})
        assert child.returncode == 0 and 0 < waited[0] <= _hang_report.REPORT_GRACE_S
    finally:
        child.kill()
        child.wait()


@pytest.mark.timeout(60)
def test_stacks_of_a_live_process_through_the_stack_signal(tmp_path: Path) -> None:
    """A process blocked in C (``time.sleep``) dumps its stack on the signal; the report reads it from the file."""
    code = (
        "import sys, time\n"
        "from fabric_lite.runtime.diagnostics.trail import Trail\n"
        f"t = Trail({str(tmp_path)!r}, rank=1, world_size=2)\n"
        "assert t.register_stacks()\n"
        "print('ready', flush=True)\n"
        "def sleeper():\n"
        "    time.sleep(60)\n"
        "sleeper()\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=env)
    try:
        assert child.stdout is not None and child.stdout.readline().strip() == "ready"
        views = _hang_report.read_trails(str(tmp_path))
        assert views[1].stack_signal == _trail.stack_signal() and _hang_report._alive(views[1])
        for _ in range(20):  # "ready" is printed just before the sleep starts
            started = time.monotonic()
            stacks = _hang_report.fetch_stacks(str(tmp_path), views, None, deadline_s=5.0)
            assert time.monotonic() - started < 5.0
            main = _hang_report._main_thread(stacks[1])
            assert main is not None, stacks
            if main[-1][1:] == (7, "sleeper"):
                break
            time.sleep(0.1)
        assert main[-1][1:] == (7, "sleeper"), stacks
        assert child.poll() is None  # the signal did not end it
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()


def test_the_last_entry_of_a_flight_recorder_dump_is_shown(tmp_path: Path) -> None:
    """NCCL ranks have torch's watchdog dump its flight recorder into the run folder on a timeout (``fr_rank_<r>``,
    a pickle of plain data, as ``torch.distributed.flight_recorder`` reads it); the report shows each rank's last
    entry beside its trail. A dump that is not plain data is never unpickled."""
    trail = Trail(str(tmp_path), rank=0, world_size=2)
    trail.exit(trail.enter(group(), trail.describe("barrier"), 0))
    entry = {
        "record_id": 7,
        "pg_id": 0,
        "process_group": ("0", "default_pg"),
        "collective_seq_id": 12,
        "p2p_seq_id": 0,
        "op_id": 12,
        "profiling_name": "nccl:all_reduce",
        "time_created_ns": 1,
        "input_sizes": [[4]],
        "input_dtypes": ["Float"],
        "output_sizes": [[4]],
        "state": "started",
        "frames": [],
    }
    dump = {"version": "2.9", "pg_config": {}, "entries": [dict(entry, collective_seq_id=11, state="completed"), entry]}
    (tmp_path / "fr_rank_0").write_bytes(pickle.dumps(dump))
    (tmp_path / "fr_rank_1").write_bytes(pickle.dumps({"entries": [Path("x")]}))  # not plain data: skipped
    assert _hang_report.read_flight_recorder(str(tmp_path)) == {0: "nccl:all_reduce #12 (started), 2 entries"}
    text = _hang_report.collect(str(tmp_path), reason="test", world_size=2, stacks=False)
    assert text is not None and "    NCCL flight recorder: last nccl:all_reduce #12 (started), 2 entries" in text
    trail.close(remove=False)


def test_run_folders_of_dead_jobs_are_swept(tmp_path: Path) -> None:
    """A launcher killed with SIGKILL leaves its run folder: the next job's launcher removes it, and only it."""
    uid = os.getuid()
    dead, live, young = (tmp_path / f"fabric_lite-{uid}-{name}" for name in ("dead", "live", "young"))
    trails = [Trail(str(live), rank=0, world_size=2), Trail(str(young), rank=0, world_size=2)]  # this process's
    dead.mkdir()
    raw = bytearray((live / "rank-0.trail").read_bytes())
    raw[_trail.H_PID * 8 : _trail.H_PID * 8 + 8] = (2**22 + 7).to_bytes(8, "little")  # no such process
    (dead / "rank-0.trail").write_bytes(raw)
    other = tmp_path / "someone-else"
    other.mkdir()
    old = time.time() - 120
    for folder in (dead, live, other):
        os.utime(folder, (old, old))
    assert _trail.sweep_run_dirs(str(tmp_path)) == [str(dead)]
    assert live.exists() and young.exists() and other.exists() and not dead.exists()
    for trail in trails:
        trail.close(remove=True)
