"""The hang report: where every rank was when a collective timed out or a rank died while the others waited.

Built from the ranks' trails and the live ranks' Python stacks (dumped from C by ``faulthandler`` on the stack signal,
so a rank blocked in gloo answers too), by the rank whose collective timed out or the launcher that saw a rank die; the
first to create ``<run_dir>/report`` prints it, once per node::

    fabric_lite: where every rank was — all_reduce #4312 timed out after 0:00:05 on rank 0
      rank 1: all_reduce #4311 at train.py:57 (done 5.1 s ago); rank 0: all_reduce #4312 at train.py:57 (waiting 5.0 s)
      rank 0 (pid 81234, alive): waiting 5.0 s in all_reduce(sum) float32[4] #4312 at train.py:57 in step
      rank 1 (pid 81240, alive): not in a collective for 5.1 s; last: all_reduce(sum) float32[4] #4311 at train.py:57
      diagnosis: rank 1 is behind (last #4311 while rank 0 waits in #4312)
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import pickle
import re
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping

from fabric_lite.runtime.diagnostics.trail import (
    FAILED,
    STATES,
    WAITING,
    Record,
    TrailView,
    read_trails,
    stat_fields,
)
from fabric_lite.runtime.supervision import how_it_ended

#: the first words of a report block (what re-printers strip, see :func:`without_block`)
BLOCK_START = "fabric_lite: where every rank was"
_BLOCK = re.compile(rf"^{re.escape(BLOCK_START)}.*(?:\n  .*)*\n?", re.MULTILINE)
_MAX_LINE = 120
_STACK_FRAMES = 8
_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ \(most recent call first\):$")
_FRAME = re.compile(r'^  File "(.*)", line (\d+) in (.*)$')
_PACKAGE_PARENT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))) + os.sep


#: what stands for the block in a message when the block was printed before it
SEE_ABOVE = "(where every rank was: see the report above)"


def without_block(text: str, replacement: str = SEE_ABOVE) -> str:
    """``text`` with the report block taken out, for a message repeated where the block was printed already."""
    return _BLOCK.sub(replacement + "\n" if replacement else "", text)


def find_block(text: str) -> str | None:
    """The report block in ``text`` (a rank's traceback, say), if there is one."""
    found = _BLOCK.search(text)
    return found.group(0).rstrip("\n") if found else None


def claim(run_dir: str) -> bool:
    """Whether this process is the first to report for this run folder (one report per node); the claim file holds its
    pid."""
    try:
        fd = os.open(os.path.join(run_dir, "report"), os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    except FileExistsError:
        return False
    except OSError:
        return True  # no folder to decide in: report
    try:
        os.write(fd, str(os.getpid()).encode())
    finally:
        os.close(fd)
    return True


#: how long a launcher lets the rank that claimed the report finish it before stopping that rank (the store's
#: diagnosis and the stacks wait up to 1 s each; the rest covers a loaded machine)
REPORT_GRACE_S = 10.0


def wait_for_reporter(run_dir: str | None, processes: Mapping[int, Callable[[float], object]]) -> None:
    """Before a launcher stops its ranks (``processes``: pid -> ``join(timeout)``), let the rank that claimed the report
    end by itself, for :data:`REPORT_GRACE_S` at most, so that its block is not lost with it."""
    if run_dir is None:
        return
    deadline = time.monotonic() + REPORT_GRACE_S
    text = b""
    while time.monotonic() < deadline:  # created empty, its pid written next
        try:
            with open(os.path.join(run_dir, "report"), "rb") as f:
                text = f.read()
        except OSError:
            return  # nobody claimed it
        if text:
            break
        time.sleep(0.01)
    join = processes.get(int(text)) if text.isdigit() else None
    if join is not None:
        join(max(0.0, deadline - time.monotonic()))


def collect(
    run_dir: str,
    *,
    reason: str,
    exit_codes: Mapping[int, int] | None = None,
    pids: Mapping[int, int] | None = None,
    world_size: int | None = None,
    own_rank: int | None = None,
    stacks: bool = True,
    deadline_s: float = 1.0,
) -> str | None:
    """Read every trail in ``run_dir``, fetch the live ranks' stacks (with ``stacks``, for ``deadline_s`` at most;
    ``own_rank``'s dumped here) and format the report for ``reason``; ``None`` when another process of this node
    reports, or no rank has a trail. ``exit_codes`` (negative: the signal) and ``pids``: what a launcher knows of its
    ranks; ``world_size``: read from the trails when not given."""
    views = read_trails(run_dir)
    if not views or not claim(run_dir):
        return None
    now = time.monotonic_ns()
    dumped = fetch_stacks(run_dir, views, own_rank, deadline_s) if stacks else {}
    return format_report(
        reason,
        views,
        now_ns=now,
        exit_codes=exit_codes or {},
        pids=pids or {},
        stacks=dumped,
        world_size=world_size,
        flight=read_flight_recorder(run_dir),
    )


#: where NCCL ranks have torch's flight recorder dump its entries on a timeout (``<run_dir>/fr_rank_<rank>``)
FLIGHT_RECORDER_PREFIX = "fr_rank_"


class _PlainUnpickler(pickle.Unpickler):
    """Unpickles dicts, lists, strings and numbers only: a dump is data, and nothing in it may run code."""

    def find_class(self, module: str, name: str) -> object:
        raise pickle.UnpicklingError(f"{module}.{name} is not plain data")


def read_flight_recorder(run_dir: str) -> dict[int, str]:
    """The last entry of each rank's NCCL flight-recorder dump in ``run_dir``, as
    ``"nccl:all_reduce #12 (started), 3 entries"``; ranks without a readable dump are left out."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(run_dir)
    except OSError:
        return found
    for name in names:
        if not (name.startswith(FLIGHT_RECORDER_PREFIX) and name[len(FLIGHT_RECORDER_PREFIX) :].isdigit()):
            continue
        try:
            with open(os.path.join(run_dir, name), "rb") as f:
                dump = _PlainUnpickler(f).load()
            entries = dump["entries"]
            last = entries[-1]
            text = f"{last['profiling_name']} #{last['collective_seq_id']} ({last['state']}), {len(entries)} entries"
        except (OSError, pickle.UnpicklingError, EOFError, KeyError, IndexError, TypeError, ValueError):
            continue
        found[int(name[len(FLIGHT_RECORDER_PREFIX) :])] = text
    return found


def _alive(view: TrailView) -> bool:
    """Whether the process that wrote ``view`` still runs (its pid not reused, not a zombie)."""
    fields = stat_fields(view.pid)
    return len(fields) > 19 and int(fields[19]) == view.start_time and fields[0] not in (b"Z", b"X")


def fetch_stacks(
    run_dir: str, views: Mapping[int, TrailView], own_rank: int | None, deadline_s: float
) -> dict[int, list[list[tuple[str, int, str]]]]:
    """The threads' stacks of every live rank, by rank, outermost frame first: this process's dumped here, the others'
    on their stack signal where their trail says they handle it."""
    sizes: dict[int, tuple[str, int]] = {}
    for rank, view in views.items():
        path = os.path.join(run_dir, f"rank-{rank}.stacks")
        try:
            size = os.path.getsize(path)
        except OSError:
            size = 0
        if rank == own_rank and view.pid == os.getpid():
            with contextlib.suppress(OSError), open(path, "ab") as f:
                faulthandler.dump_traceback(file=f, all_threads=True)
            sizes[rank] = (path, size)
        elif view.stack_signal and _alive(view):
            try:
                os.kill(view.pid, view.stack_signal)
            except OSError:
                continue
            sizes[rank] = (path, size)
    # a dump is complete when its file has grown and then stayed the same for 50 ms
    deadline = time.monotonic() + deadline_s
    seen: dict[int, tuple[int, float]] = {}
    pending = set(sizes)
    while pending and time.monotonic() < deadline:
        time.sleep(0.01)
        for rank in list(pending):
            path, before = sizes[rank]
            try:
                now_size = os.path.getsize(path)
            except OSError:
                continue
            if now_size <= before:
                continue
            last = seen.get(rank)
            if last is None or last[0] != now_size:
                seen[rank] = (now_size, time.monotonic())
            elif time.monotonic() - last[1] >= 0.05:
                pending.discard(rank)
    result: dict[int, list[list[tuple[str, int, str]]]] = {}
    for rank, (path, before) in sizes.items():
        try:
            with open(path, "rb") as f:
                f.seek(before)
                text = f.read().decode(errors="replace")
        except OSError:
            continue
        if text:
            result[rank] = parse_stacks(text)
    return result


def parse_stacks(text: str) -> list[list[tuple[str, int, str]]]:
    """faulthandler's dump as a list of threads, each a list of ``(file, line, function)`` outermost first."""
    threads: list[list[tuple[str, int, str]]] = []
    for line in text.splitlines():
        if _THREAD.match(line):
            threads.append([])
            continue
        frame = _FRAME.match(line)
        if frame and threads:
            threads[-1].insert(0, (frame.group(1), int(frame.group(2)), frame.group(3)))
    return threads


def _main_thread(threads: list[list[tuple[str, int, str]]]) -> list[tuple[str, int, str]] | None:
    """The main thread's stack: the one not started by ``threading`` (whose outermost frame is its bootstrap)."""
    for frames in threads:
        if frames and not (frames[0][0].endswith("threading.py") and frames[0][2].startswith("_bootstrap")):
            return frames
    return None


def _user_end(frames: list[tuple[str, int, str]]) -> list[tuple[str, int, str]]:
    """``frames`` up to the user's innermost frame and the first of fabric_lite's below it."""
    own = _PACKAGE_PARENT + "fabric_lite" + os.sep
    user = [
        i for i, (path, _, _) in enumerate(frames) if not path.startswith(own) and os.sep + "torch" + os.sep not in path
    ]
    return frames[: user[-1] + 2] if user else frames


def _short_path(path: str) -> str:
    if path.startswith(_PACKAGE_PARENT + "fabric_lite" + os.sep):
        return path[len(_PACKAGE_PARENT) :]
    return os.path.basename(path)


class ReportOnTerm:
    """Under a launcher that ends a death's survivors with SIGTERM (torchrun's agent): on SIGTERM, when another rank of
    this node has died, print the report ``build`` returns, call ``on_exit(remove=True)`` if every other rank is dead,
    and exit with 128 + SIGTERM. A rank blocked in a collective never runs a Python handler, so a :class:`WakeupWatch`
    thread acts; the main thread holds :attr:`lock` while it reports itself, so the two never report at once."""

    def __init__(
        self,
        run_dir: str,
        own_rank: int,
        build: Callable[[], str | None],
        on_exit: Callable[..., None] | None = None,
    ) -> None:
        self.run_dir = run_dir
        self.own_rank = own_rank
        self.build = build
        self.on_exit = on_exit
        self.lock = threading.Lock()
        self._watch = WakeupWatch()

    def _on_term(self, signum: int, frame: object) -> None:
        """The Python-level handler: nothing (the watching thread acts, whatever the main thread is doing)."""

    def install(self) -> bool:
        """Start watching, from the main thread; ``False`` where SIGTERM or the wake-up fd is someone else's."""
        if threading.current_thread() is not threading.main_thread():
            return False
        if signal.getsignal(signal.SIGTERM) != signal.SIG_DFL:
            return False
        if not self._watch.start(self._on_signal, "fabric_lite-hang-report"):
            return False
        signal.signal(signal.SIGTERM, self._on_term)
        return True

    def _on_signal(self, signum: int) -> None:
        if signum != signal.SIGTERM or signal.getsignal(signal.SIGTERM) != self._on_term:
            return
        with self.lock:
            if any(rank != self.own_rank and not _alive(view) for rank, view in read_trails(self.run_dir).items()):
                print_report(self.build, lambda block: sys.stderr.write(block + "\n"))
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            if self.on_exit is not None:
                with contextlib.suppress(Exception):
                    # only as the last rank alive: a live one may still be reading the trails for its own report
                    if all(
                        not _alive(view) for rank, view in read_trails(self.run_dir).items() if rank != self.own_rank
                    ):
                        self.on_exit(remove=True)
            os._exit(128 + signal.SIGTERM)

    def uninstall(self) -> None:
        """Stop watching and give SIGTERM its default action back (from the main thread)."""
        if not self._watch.active or threading.current_thread() is not threading.main_thread():
            return
        if signal.getsignal(signal.SIGTERM) == self._on_term:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        self._watch.stop(timeout=5.0)


class WakeupWatch:
    """A daemon thread that reads Python's signal wake-up fd and calls a handler for every signal that reached a Python
    handler, even while the main thread is blocked in C. Start and stop it from the main thread."""

    def __init__(self) -> None:
        self._write_fd: int | None = None
        self._thread: threading.Thread | None = None

    @property
    def active(self) -> bool:
        """Whether the wake-up fd is ours (from :meth:`start` to :meth:`stop`)."""
        return self._write_fd is not None

    def start(self, handle: Callable[[int], None], name: str) -> bool:
        """Make a pipe the wake-up fd and start the thread ``name``, calling ``handle(signum)``; ``False``, nothing
        changed, where the program has a wake-up fd of its own."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        previous = signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        if previous != -1:  # the program's own: put it back
            signal.set_wakeup_fd(previous)
            os.close(read_fd)
            os.close(write_fd)
            return False
        self._write_fd = write_fd
        # the handler goes to the thread only, which drops it when it ends: held here, it would keep its owner alive
        self._thread = threading.Thread(target=self._run, args=(read_fd, handle), name=name, daemon=True)
        self._thread.start()
        return True

    @staticmethod
    def _run(read_fd: int, handle: Callable[[int], None]) -> None:
        try:
            while data := os.read(read_fd, 64):
                for signum in data:
                    handle(signum)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                os.close(read_fd)

    def stop(self, timeout: float) -> None:
        """Give the wake-up fd back, and wait up to ``timeout`` seconds for the thread to end."""
        if self._write_fd is not None:
            write_fd, self._write_fd = self._write_fd, None
            current = signal.set_wakeup_fd(-1)
            if current not in (-1, write_fd):  # replaced meanwhile: leave the new one
                signal.set_wakeup_fd(current)
            os.close(write_fd)  # the thread reads EOF and ends
        if self._thread is not None:
            self._thread.join(timeout=timeout)
            self._thread = None


def print_report(build: Callable[[], str | None], write: Callable[[str], object]) -> None:
    """``write`` the block ``build`` returns, or why there is none: a diagnosis aid never stands in the way of stopping
    the job."""
    try:
        block = build()
    except Exception as err:
        block = f"fabric_lite: no hang report ({type(err).__name__}: {err})"
    if block:
        write(block)


# ---------------------------------------------------------------------------------------------- formatting
def _seconds(ns: int) -> str:
    return f"{max(ns, 0) / 1e9:.1f} s"


def _status(rank: int, view: TrailView | None, exit_codes: Mapping[int, int]) -> str:
    code = exit_codes.get(rank)
    if code is not None:
        return how_it_ended(code)
    if view is not None and _alive(view):
        return "alive"
    return "gone"


def _fit(line: str) -> str:
    return line if len(line) <= _MAX_LINE else line[: _MAX_LINE - 1] + "…"


def _state_words(record: Record, alive: bool, now_ns: int) -> str:
    if record.state == WAITING:
        return f"waiting {_seconds(now_ns - record.entered_ns)}" if alive else "waiting when it died"
    return f"{STATES[record.state]} {_seconds(now_ns - record.exited_ns)} ago"


def format_report(
    reason: str,
    views: Mapping[int, TrailView],
    *,
    now_ns: int,
    exit_codes: Mapping[int, int],
    pids: Mapping[int, int],
    stacks: Mapping[int, list[list[tuple[str, int, str]]]],
    world_size: int | None = None,
    flight: Mapping[int, str] | None = None,
) -> str:
    """The report block (see the module docstring) from trails read already: pure, so tests feed it synthetic ones."""
    if world_size is None:
        world_size = max([v.world_size for v in views.values()] + [max(views, default=-1) + 1, len(pids)])
    ranks = range(world_size)
    statuses = {r: _status(r, views.get(r), exit_codes) for r in ranks}
    last = {r: views[r].records[-1] for r in ranks if r in views and views[r].records}
    summary = "; ".join(
        f"rank {r}: {last[r].op} #{last[r].seq} at {last[r].where}"
        f" ({_state_words(last[r], statuses[r] == 'alive', now_ns)})"
        for r in sorted(last, key=lambda r: (last[r].seq, r))
    )
    lines = [f"{BLOCK_START} — {reason}", f"  {summary or 'no rank recorded a collective'}"]
    for r in ranks:
        view = views.get(r)
        pid = view.pid if view is not None else pids.get(r, 0)
        alive = statuses[r] == "alive"
        head = f"  rank {r} (pid {pid}, {statuses[r]}): "
        record = last.get(r)
        if view is None:
            what = "no trail (FABRIC_LITE_TRAIL=0, or it never joined the process group)"
        elif record is None:
            what = "no collective yet"
        elif record.state == WAITING and alive:
            what = f"waiting {_seconds(now_ns - record.entered_ns)} in {record.desc} #{record.seq} at {record.site}"
        elif alive:
            what = (
                f"not in a collective for {_seconds(now_ns - record.exited_ns)}; last: {record.desc} #{record.seq}"
                f" at {record.where} ({STATES[record.state]})"
            )
        else:
            state = "waiting when it died" if record.state == WAITING else STATES[record.state]
            what = f"last: {record.desc} #{record.seq} at {record.where} ({state})"
        lines.append(_fit(head + what))
        if flight and r in flight:
            lines.append(_fit(f"    NCCL flight recorder: last {flight[r]}"))
        if view is not None and len(view.records) > 1:
            earlier = " · ".join(f"{x.op} #{x.seq} {x.where}" for x in reversed(view.records[-4:-1]))
            lines.append(_fit(f"    earlier: {earlier}"))
        frames = _user_end(_main_thread(stacks.get(r, [])) or [])
        if frames:
            lines.append("    stack (main thread, most recent last):")
            lines += [_fit(f"      {_short_path(f)}:{n} in {fn}") for f, n, fn in frames[-_STACK_FRAMES:]]
        elif alive and view is not None and view.stack_signal == 0:
            lines.append("    stack unavailable (the stack signal is not handled by this rank)")
    lines.append(_fit(f"  diagnosis: {diagnose(last, statuses)}"))
    return "\n".join(lines)


def diagnose(last: Mapping[int, Record], statuses: Mapping[int, str]) -> str:
    """One sentence on what went wrong, from each rank's last collective and whether it is alive."""
    dead = [r for r, s in statuses.items() if s != "alive"]
    died = "; ".join(f"rank {r} died ({statuses[r]})" if statuses[r] != "gone" else f"rank {r} is gone" for r in dead)
    parts: list[str] = []  # the cause first: a death is often only how the launcher ended a rank that waited
    waiting = {r: x for r, x in last.items() if x.state == WAITING and statuses.get(r) == "alive"}
    live = {r: x for r, x in last.items() if statuses.get(r) == "alive"}
    if waiting:
        top = max(x.seq for x in waiting.values())
        waiter = min(r for r, x in waiting.items() if x.seq == top)
        behind = [r for r, x in live.items() if x.seq < top]
        # a rank that died inside its collective, or ended after it failed there, still says which one it called
        same = {r: x for r, x in last.items() if x.seq == top and (r in live or x.state in (WAITING, FAILED))}
        if len({(x.op, x.where) for x in same.values()}) > 1:
            calls = ", ".join(f"rank {r} {x.op} at {x.where}" for r, x in sorted(same.items()))
            parts.append(f"ranks called different collectives at #{top} ({calls})")
        for r in behind:
            x = live[r]
            if x.state == WAITING:
                parts.append(
                    f"rank {r} skipped a collective or called one more (it waits in #{x.seq}, rank {waiter} in #{top})"
                )
            else:
                parts.append(f"rank {r} is behind (last #{x.seq} while rank {waiter} waits in #{top})")
        if not parts and not died:
            parts.append(f"every live rank waits in #{top}: a rank of another node, or the backend, is stuck")
    elif not died:
        parts.append("no rank is waiting in a collective")
    return "; ".join([*parts, died] if died else parts)
