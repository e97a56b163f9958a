"""A per-rank trail of the last collectives, in a small memory-mapped file that survives the rank's death.

A hung or dead rank cannot answer over the network, so every rank records each collective, before and after, in its own
file in the run folder: the call, its sequence number in its group (ranks in lockstep agree on it), the user's
``file:line``, and whether it waits, is done or failed. The file is ``mmap``-ed, so another process reads it even after
a SIGKILL (:mod:`fabric_lite.runtime.diagnostics.hang_report`). ``FABRIC_LITE_TRAIL=0`` turns it off.

Layout (little-endian int64 words)::

    header   [magic, version, rank, pid, start time, world size, slots, head, stack signal, strings used, wall0]
    records  SLOTS x [seq, group << 32 | descriptor id, site id, state, enter ns, exit ns]   (a ring, head = count)
    strings  an append-only table of (u32 id, u16 length, utf-8) entries

A record is complete before ``head`` passes it, and a reader reads at most ``SLOTS - 1`` records behind ``head``.
"""

from __future__ import annotations

import contextlib
import faulthandler
import mmap
import os
import signal
import struct
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAGIC = int.from_bytes(b"FLTRAIL1", "little")
VERSION = 1
SLOTS = 16
HEADER_WORDS = 16
RECORD_WORDS = 6
STRINGS_OFFSET = 4096
STRINGS_BYTES = 16384
FILE_BYTES = STRINGS_OFFSET + STRINGS_BYTES
# header words
H_MAGIC, H_VERSION, H_RANK, H_PID, H_START, H_WORLD, H_SLOTS, H_HEAD, H_SIGNAL, H_STRINGS, H_WALL0 = range(11)
# record states
WAITING, DONE, FAILED = 1, 2, 3
STATES = {WAITING: "waiting", DONE: "done", FAILED: "failed"}
#: the id every string gets when the table is full (shown as "?")
UNKNOWN = 0
_ENTRY = struct.Struct("<IH")

# bound once: the hot path saves a module attribute lookup per call
_now = time.monotonic_ns
_getframe = sys._getframe

ENV_TRAIL = "FABRIC_LITE_TRAIL"
ENV_STACK_SIGNAL = "FABRIC_LITE_STACK_SIGNAL"
# fabric_lite's own folder: frames of code under it are skipped to find the user's line
_PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))) + os.sep


def process_start_time(pid: int) -> int:
    """The start time of process ``pid`` in clock ticks since boot, -1 if gone: with the pid, it names a process for
    good."""
    fields = stat_fields(pid)
    return int(fields[19]) if len(fields) > 19 else -1  # field 22 of /proc/<pid>/stat


def stat_fields(pid: int) -> list[bytes]:
    """The fields of ``/proc/<pid>/stat`` after the ``)`` that ends the command name, from field 3 (the state) on;
    empty if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()
    except (OSError, IndexError):
        return []


def stack_signal() -> int:
    """The signal that makes a rank dump its Python stacks: ``SIGRTMIN+7`` (SIGUSR1 belongs to SLURM's requeue and
    SIGUSR2 is common in user code), or ``FABRIC_LITE_STACK_SIGNAL`` (a number or a name such as ``SIGUSR2``)."""
    chosen = os.environ.get(ENV_STACK_SIGNAL, "").strip()
    if chosen:
        return int(chosen) if chosen.isdigit() else int(getattr(signal.Signals, chosen.upper()))
    return int(signal.SIGRTMIN) + 7


def trail_enabled() -> bool:
    """Whether collectives are recorded (``FABRIC_LITE_TRAIL=0`` turns it off)."""
    return os.environ.get(ENV_TRAIL, "1").strip().lower() not in ("0", "false", "no", "off")


def make_run_dir() -> str:
    """A new, empty run folder for a job of fabric_lite's launchers (which remove it), after sweeping away abandoned
    ones: in ``/dev/shm`` (memory, never written to disk) when writable, else in the temp folder."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) else tempfile.gettempdir()
    sweep_run_dirs(base)
    return tempfile.mkdtemp(prefix=f"fabric_lite-{os.getuid()}-", dir=base)


def sweep_run_dirs(base: str, min_age_s: float = 60.0) -> list[str]:
    """Remove this user's run folders in ``base`` whose ranks are all dead and older than ``min_age_s`` (an empty one
    after an hour: a starting job may not have written its trails); returns them."""
    import shutil

    removed = []
    now = time.time()
    with contextlib.suppress(OSError):
        for entry in os.scandir(base):
            if not entry.name.startswith(f"fabric_lite-{os.getuid()}-") or not entry.is_dir(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                age = now - entry.stat(follow_symlinks=False).st_mtime
                views = read_trails(entry.path)
                if age < min_age_s or (not views and age < 3600):
                    continue
                if all(process_start_time(v.pid) != v.start_time for v in views.values()):
                    shutil.rmtree(entry.path, ignore_errors=True)
                    removed.append(entry.path)
    return removed


def derived_run_dir(environ: Any) -> str:
    """The run folder of a job started by another launcher (plain torchrun, srun, a user-made group): every local
    rank derives the same node-local name from the job's rendezvous settings, in the temp folder."""
    import hashlib

    parts = [
        environ.get(name, "")
        for name in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "TORCHELASTIC_RESTART_COUNT")
    ]
    digest = hashlib.blake2b("|".join(parts).encode(), digest_size=6).hexdigest()
    return os.path.join(tempfile.gettempdir(), f"fabric_lite-{os.getuid()}-run-{digest}")


#: stack signals this process set to ``SIG_IGN`` when it closed a trail: a later trail may register them again
_IGNORED_BY_US: set[int] = set()


class Trail:
    """This rank's trail: the ring of its last :data:`SLOTS` collectives, in ``<run_dir>/rank-<rank>.trail``.

    Example::

        slot = trail.enter(group, trail.describe("all_reduce(sum)", [loss]), depth=1)  # before the collective
        trail.exit(slot, DONE)  # after it
    """

    __slots__ = (
        "_codes",
        "_descs",
        "_file",
        "_labels",
        "_mm",
        "_next_id",
        "_sites",
        "_stack_file",
        "_strings",
        "_used",
        "_words",
        "path",
        "rank",
        "run_dir",
    )

    def __init__(self, run_dir: str, rank: int, world_size: int) -> None:
        self.run_dir = run_dir
        self.rank = rank
        os.makedirs(run_dir, exist_ok=True)
        self.path = os.path.join(run_dir, f"rank-{rank}.trail")
        self._file = open(self.path, "w+b")  # noqa: SIM115 (held for as long as the trail)
        self._file.truncate(FILE_BYTES)
        self._mm = mmap.mmap(self._file.fileno(), FILE_BYTES)
        self._words = memoryview(self._mm)[:STRINGS_OFFSET].cast("q")
        self._strings: dict[str, int] = {}
        self._next_id = 1
        self._used = 0
        self._codes: dict[int, tuple[Any, bool]] = {}  # id(code) -> (code, whether it is fabric_lite's own)
        self._sites: dict[tuple[int, int], tuple[Any, int]] = {}  # (id(code), bytecode offset) -> (code, site id)
        self._descs: dict[Any, int] = {}  # what a call looks like -> descriptor id
        self._labels: list[str] = ["world"]  # the default group is group 0
        self._stack_file: Any = None
        words = self._words
        pid = os.getpid()
        words[H_VERSION] = VERSION
        words[H_RANK] = rank
        words[H_PID] = pid
        words[H_START] = process_start_time(pid)
        words[H_WORLD] = world_size
        words[H_SLOTS] = SLOTS
        words[H_WALL0] = time.time_ns() - time.monotonic_ns()
        words[H_MAGIC] = MAGIC  # last: a reader trusts the header once the magic is there

    # ------------------------------------------------------------------ hot path
    def enter(self, group: Any, desc: int, depth: int) -> int:
        """Record that this rank enters the next collective of ``group`` (incrementing its ``seq``), described by
        ``desc`` and called from the first frame outside fabric_lite at least ``depth`` frames up; the record's slot,
        for :meth:`exit`."""
        # code objects are looked up by id, and the entry checked to hold the same object: hashing a code object
        # hashes its bytecode
        frame: Any = _getframe(depth + 1)
        codes = self._codes
        while frame is not None:
            code = frame.f_code
            entry = codes.get(id(code))
            if entry is None or entry[0] is not code:
                entry = self._code(code)
            if not entry[1]:
                break
            frame = frame.f_back  # fabric_lite's own frame: the user's is further out
        site = UNKNOWN
        if frame is not None:
            # keyed by the bytecode offset: working out the line number from it is slower
            known = self._sites.get((id(code), frame.f_lasti))
            site = known[1] if known is not None and known[0] is code else self._site(frame)
        group.seq = seq = group.seq + 1
        words = self._words
        head = words[H_HEAD]
        base = HEADER_WORDS + (head % SLOTS) * RECORD_WORDS
        words[base] = seq
        words[base + 1] = group.trail_index << 32 | desc
        words[base + 2] = site
        words[base + 3] = WAITING
        words[base + 4] = _now()  # (the exit time is read only once the state says done or failed)
        words[H_HEAD] = head + 1  # last: the record is complete
        return base

    def exit(self, slot: int, state: int = DONE) -> None:
        """Record that the collective of record ``slot`` (from :meth:`enter`) ended, ``DONE`` or ``FAILED``."""
        words = self._words
        words[slot + 5] = _now()
        words[slot + 3] = state

    def seq_at(self, slot: int) -> int:
        """The sequence number of the record at ``slot``."""
        return int(self._words[slot])

    def describe(self, call: str, tensors: Sequence[Any] = (), key: Any = None) -> int:
        """The descriptor id of ``call`` on ``tensors`` (dtypes and shapes); ``key``: what identifies both, where the
        caller has it."""
        if key is None:
            key = (call, *[(t.dtype, t.shape) for t in tensors])
        desc = self._descs.get(key)
        if desc is None:
            desc = self._descs[key] = self.intern(_descriptor(call, tensors))
        return desc

    # ------------------------------------------------------------------ cold path
    def register_group(self, group: Any, label: str) -> None:
        """Give ``group`` (a ``CheckedGroup``) its index in this trail; its ``seq`` counts from 0."""
        if label not in self._labels:
            self._labels.append(label)
        group.trail_index = self._labels.index(label)
        group.seq = 0

    def _code(self, code: Any) -> tuple[Any, bool]:
        entry = self._codes[id(code)] = (code, code.co_filename.startswith(_PACKAGE_ROOT))
        return entry

    def _site(self, frame: Any) -> int:
        code = frame.f_code
        site = self.intern(f"{os.path.basename(code.co_filename)}:{frame.f_lineno} in {code.co_name}")
        self._sites[(id(code), frame.f_lasti)] = (code, site)
        return site

    def intern(self, text: str) -> int:
        """The id of ``text`` in the string table, written there the first time (:data:`UNKNOWN` once it is full)."""
        known = self._strings.get(text)
        if known is not None:
            return known
        data = text.encode(errors="replace")[:200]
        start = STRINGS_OFFSET + self._used
        if self._used + _ENTRY.size + len(data) > STRINGS_BYTES:
            self._strings[text] = UNKNOWN
            return UNKNOWN
        string_id = self._next_id
        self._next_id += 1
        _ENTRY.pack_into(self._mm, start, string_id, len(data))
        self._mm[start + _ENTRY.size : start + _ENTRY.size + len(data)] = data
        self._used += _ENTRY.size + len(data)
        self._words[H_STRINGS] = self._used  # last: the entry is complete
        self._strings[text] = string_id
        return string_id

    def register_stacks(self) -> bool:
        """Dump every thread's stack into ``<run_dir>/rank-<rank>.stacks`` on :func:`stack_signal`, and say so in the
        header; ``False`` where the signal has another handler or cannot be registered."""
        try:
            signum = stack_signal()
            handler = signal.getsignal(signum)
            if handler not in (signal.SIG_DFL, None) and not (handler == signal.SIG_IGN and signum in _IGNORED_BY_US):
                return False
            stack_file = open(os.path.join(self.run_dir, f"rank-{self.rank}.stacks"), "ab")  # noqa: SIM115
            faulthandler.register(signum, file=stack_file, all_threads=True, chain=False)
        except (ValueError, OSError, RuntimeError, AttributeError):
            return False
        self._stack_file = stack_file
        self._words[H_SIGNAL] = signum  # only now: a reporter signals this process only once it is handled
        return True

    def close(self, remove: bool) -> None:
        """Stop dumping stacks and release the file; ``remove`` deletes this rank's files too."""
        if self._stack_file is not None:
            with contextlib.suppress(Exception):
                self._words[H_SIGNAL] = 0
                # ignored from now on, in one step: a reporter that read the header just before may still send it,
                # and unregistering would bring back the default action of a real-time signal, which ends the process
                signum = int(stack_signal())
                signal.signal(signum, signal.SIG_IGN)
                _IGNORED_BY_US.add(signum)
            self._stack_file.close()
            self._stack_file = None
        with contextlib.suppress(Exception):
            self._words.release()
            self._mm.close()
        self._file.close()
        if remove:
            self._remove_files(self.rank)
            # the files of ranks that died (a SIGKILL leaves them): nobody else will remove them
            for view in read_trails(self.run_dir).values():
                if process_start_time(view.pid) != view.start_time:
                    self._remove_files(view.rank)
            if not read_trails(self.run_dir):  # the last rank out removes the folder
                with contextlib.suppress(OSError):
                    os.unlink(os.path.join(self.run_dir, "report"))
                with contextlib.suppress(OSError):
                    os.rmdir(self.run_dir)

    def _remove_files(self, rank: int) -> None:
        for name in (f"rank-{rank}.trail", f"rank-{rank}.stacks"):
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(self.run_dir, name))


def _descriptor(call: str, tensors: Sequence[Any]) -> str:
    call = call.replace("reduce_op=", "")
    if not tensors:
        return call
    parts = [f"{str(t.dtype).replace('torch.', '')}[{','.join(str(s) for s in t.shape)}]" for t in tensors[:3]]
    more = f" +{len(tensors) - 3} more" if len(tensors) > 3 else ""
    return f"{call} {', '.join(parts)}{more}"


# ---------------------------------------------------------------------------------------------- reading
@dataclass
class Record:
    """One collective as a trail recorded it."""

    seq: int
    group: int
    desc: str
    site: str
    state: int
    entered_ns: int
    exited_ns: int

    @property
    def op(self) -> str:
        """The collective's name: ``all_reduce``, ``barrier``, ..."""
        return self.desc.split("(", 1)[0].split(" ", 1)[0]

    @property
    def where(self) -> str:
        """The user's ``file:line``."""
        return self.site.split(" in ", 1)[0]


@dataclass
class TrailView:
    """A trail as another process reads it."""

    rank: int
    pid: int
    start_time: int
    world_size: int
    stack_signal: int
    records: list[Record] = field(default_factory=list)  # oldest first
    path: str = ""


def read_strings(raw: bytes, used: int) -> dict[int, str]:
    """The string table's entries, up to ``used`` bytes (a torn last entry is dropped)."""
    strings: dict[int, str] = {}
    offset = 0
    used = min(used, len(raw))
    while offset + _ENTRY.size <= used:
        string_id, size = _ENTRY.unpack_from(raw, offset)
        end = offset + _ENTRY.size + size
        if end > used or string_id == 0:
            break
        strings[string_id] = raw[offset + _ENTRY.size : end].decode(errors="replace")
        offset = end
    return strings


def read_trails(run_dir: str) -> dict[int, TrailView]:
    """Every rank's trail in ``run_dir``, by rank."""
    views: dict[int, TrailView] = {}
    with contextlib.suppress(OSError):
        for path in sorted(Path(run_dir).glob("rank-*.trail")):
            view = read_trail(path)
            if view is not None:
                views[view.rank] = view
    return views


def read_trail(path: str | os.PathLike[str]) -> TrailView | None:
    """Read a trail file written by :class:`Trail` (by any process, live or dead); ``None`` if it is not one."""
    try:
        raw = Path(path).read_bytes()
    except OSError:
        return None
    if len(raw) < FILE_BYTES:
        return None
    words = memoryview(raw)[:STRINGS_OFFSET].cast("q")
    if words[H_MAGIC] != MAGIC or words[H_VERSION] != VERSION:
        return None
    strings = read_strings(raw[STRINGS_OFFSET:], words[H_STRINGS])
    head, slots = words[H_HEAD], words[H_SLOTS]
    records: list[Record] = []
    last_seq: dict[int, int] = {}
    # the slot at head may be half-overwritten by a writer that was interrupted: read at most slots - 1 records
    for index in range(max(0, head - (slots - 1)), head):
        base = HEADER_WORDS + (index % slots) * RECORD_WORDS
        seq, ids, site, state, entered, exited = words[base : base + RECORD_WORDS]
        group, desc = ids >> 32, ids & 0xFFFFFFFF
        if state not in STATES or seq <= last_seq.get(group, 0):
            continue  # torn or out of order: not trusted
        last_seq[group] = seq
        records.append(Record(seq, group, strings.get(desc, "?"), strings.get(site, "?"), state, entered, exited))
    return TrailView(
        rank=words[H_RANK],
        pid=words[H_PID],
        start_time=words[H_START],
        world_size=words[H_WORLD],
        stack_signal=words[H_SIGNAL],
        records=records,
        path=str(path),
    )
