"""How a failed or hung run is explained: each rank's trail of collectives (:mod:`.trail`), the hang report
(:mod:`.hang_report`), and :class:`RankDiagnostics`, which a strategy holds for its process group."""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TypeVar

from fabric_lite._log import get_logger
from fabric_lite.runtime.diagnostics import trail as _trail
from fabric_lite.runtime.run import RunContext
from fabric_lite.runtime.supervision import is_secondary

if TYPE_CHECKING:
    from fabric_lite.runtime.collectives import CheckedGroup

log = get_logger(__name__)
_T = TypeVar("_T")


class CollectiveTimeoutError(RuntimeError):
    """A collective (or the rendezvous) waited longer than the process-group timeout for the other ranks."""


def is_timeout(err: BaseException) -> bool:
    """Whether a backend error says that the operation timed out (gloo and NCCL word it differently)."""
    text = str(err)
    return "Timed out" in text or "timed out" in text or "Timeout" in text or "timeout" in text


def arm_nccl_flight_recorder(run_dir: str) -> None:
    """Have torch's NCCL flight recorder dump into ``run_dir`` on a timeout, for the hang report; settings the user made
    stay."""
    from fabric_lite.runtime.diagnostics.hang_report import FLIGHT_RECORDER_PREFIX

    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.setdefault("TORCH_NCCL_DUMP_ON_TIMEOUT", "1")
    os.environ.setdefault("TORCH_FR_DUMP_TEMP_FILE", os.path.join(run_dir, FLIGHT_RECORDER_PREFIX))
    os.makedirs(run_dir, exist_ok=True)


class RankDiagnostics:
    """This rank's diagnosis aids for one process group: its trail of collectives (two or more ranks, unless
    ``FABRIC_LITE_TRAIL`` is off), the rendezvous ``store`` that names the ranks missing from a timed-out collective,
    and, where no launcher of ours supervises, the watcher that reports on SIGTERM. A diagnosis that fails never hides
    the real error."""

    def __init__(self, context: RunContext, rank: int, world_size: int, store: Any, timeout: timedelta) -> None:
        self.context = context
        self.rank = rank
        self.world_size = world_size
        self.store = store
        self.timeout = timeout
        self.trail: _trail.Trail | None = None
        self._report_on_term: Any = None  # a hang_report.ReportOnTerm, where no launcher of ours supervises
        self._timeouts = 0

    # ------------------------------------------------------------------ the trail's lifecycle
    def open(self, run_dir: str) -> None:
        """Start this rank's trail in ``run_dir`` (a diagnosis aid: an unwritable folder only logs a warning)."""
        if self.world_size < 2 or not _trail.trail_enabled():  # one rank cannot wait for another
            return
        try:
            self.trail = _trail.Trail(run_dir, self.rank, self.world_size)
        except OSError as err:
            log.warning("fabric_lite: no trail of collectives for the hang report (%s)", err)
            return
        self.trail.register_stacks()
        if not self.context.supervised:
            # torchrun's agent ends the survivors of a death with SIGTERM, often before their collective fails
            from fabric_lite.runtime.diagnostics.hang_report import ReportOnTerm

            watch = ReportOnTerm(
                run_dir,
                self.rank,
                lambda: self.collect_report(f"rank {self.rank} was stopped (SIGTERM) after another rank ended"),
                # no launcher of ours removes the run folder: the last rank out does, as at a clean exit
                on_exit=None if self.context.launcher_removes_run_dir else self.trail.close,
            )
            self._report_on_term = watch if watch.install() else None

    def close(self, remove: bool | None = None) -> None:
        """Close the trail; ``remove`` its files (by default unless the launcher removes the whole run folder)."""
        if remove is None:
            remove = not self.context.launcher_removes_run_dir
        watch, self._report_on_term = self._report_on_term, None
        if watch is not None:
            watch.uninstall()
        trail, self.trail = self.trail, None
        if trail is not None:
            trail.close(remove=remove)

    def register_group(self, checked: CheckedGroup, label: str) -> None:
        """Name a process group other than the world's in the trail (the world is the trail's group 0)."""
        if self.trail is not None:
            self.trail.register_group(checked, label)

    # ------------------------------------------------------------------ collectives
    def traced(
        self,
        checked: CheckedGroup,
        name: str,
        run: Callable[[], _T],
        describe: tuple[Any, ...],
        debug: bool = False,
    ) -> _T:
        """``run()``, a collective on ``checked``'s group, recorded in the trail (``describe``: :meth:`Trail.describe`'s
        arguments); if it raises, :meth:`failed` handles the error before it propagates."""
        trail = self.trail
        slot = trail.enter(checked, trail.describe(*describe), 3) if trail is not None else -1
        try:
            result = run()
        except BaseException as err:
            self.failed(slot, name, err, debug)
            raise
        self.exit(slot)
        return result

    def enter(self, checked: CheckedGroup, description: str) -> int:
        """Record the start of a collective run outside :meth:`traced` (DDP's gradient all-reduce); the slot for
        :meth:`exit`, or -1."""
        trail = self.trail
        return trail.enter(checked, trail.describe(description), 2) if trail is not None else -1

    def exit(self, slot: int, state: int = _trail.DONE) -> None:
        if self.trail is not None and slot >= 0:
            self.trail.exit(slot, state)

    def failed(self, slot: int, name: str, err: BaseException, debug: bool = False) -> None:
        """A collective raised ``err``: mark its record failed, raise :class:`CollectiveTimeoutError` if it timed out,
        and print the report when a peer went away under a launcher that does not watch the ranks; else return, for the
        caller to re-raise."""
        trail = self.trail
        seq = trail.seq_at(slot) if trail is not None and slot >= 0 else None
        try:  # the report shows this rank waiting, as it was: the record is marked failed after it
            self.raise_if_timed_out(name, err, seq=seq, debug=debug)
            if trail is not None and not self.context.supervised:
                # fabric_lite's own launchers see a death themselves, and report it; under the others, this rank does
                self._report_lost_peer(name, seq, err)
        finally:
            self.exit(slot, _trail.FAILED)

    def raise_if_timed_out(self, name: str, err: BaseException, seq: int | None = None, debug: bool = False) -> None:
        """If ``err`` is a timeout, raise :class:`CollectiveTimeoutError` naming the collective (``seq``: its number in
        the trail), the ranks that never took part (those that did not mark their own timeout in the store) and the hang
        report; else return."""
        if not is_timeout(err):
            return
        self._timeouts += 1
        missing = self._missing_ranks(f"fabric_lite/timed_out/{self._timeouts}", name)
        who = f"rank(s) {missing} never took part in it" if missing else "not every rank took part in it"
        hint = (
            ""
            if debug
            else " To see what every rank calls, run again with FABRIC_LITE_DEBUG=1 (or Fabric(debug=True)): ranks"
            " calling different collectives then raise at once with a per-rank table."
        )
        number = f" #{seq}" if seq is not None else ""
        block = self.hang_report(f"{name}{number} timed out after {self.timeout} on rank {self.rank}")
        if block is None and self.trail is not None:
            block = "(where every rank was: in the report of another rank of this node)"
        raise CollectiveTimeoutError(
            f"{name} on {self.world_size} ranks timed out after {self.timeout}: {who} (stuck elsewhere, dead, or"
            f" calling a different collective). Every rank must call the same collectives in the same order.{hint}"
            f" (backend: {str(err).splitlines()[0] if str(err) else type(err).__name__})"
            + (f"\n{block}" if block else "")
        ) from err

    def _missing_ranks(self, key: str, name: str) -> list[int] | None:
        store = self.store
        if store is None:
            return None
        found: list[list[int]] = []
        pause = min(1.0, self.timeout.total_seconds())

        def diagnose() -> None:
            try:
                store.set(f"{key}/{self.rank}", name)
                time.sleep(pause)
                found.append([r for r in range(self.world_size) if not store.check([f"{key}/{r}"])])
            except Exception:  # the store may be gone too; the diagnosis is a bonus
                pass

        # in a thread with a bounded wait: cut off from the store's host (a network split), a store call can block
        # for as long as the kernel keeps the TCP connection, many minutes, with no timeout of its own
        thread = threading.Thread(target=diagnose, name="fabric_lite-timeout-diagnosis", daemon=True)
        thread.start()
        thread.join(pause + 2.0)
        return found[0] if found else None

    def _report_lost_peer(self, name: str, seq: int | None, err: BaseException) -> None:
        if not (isinstance(err, Exception) and is_secondary(err)):
            return
        what = f"{name}{f' #{seq}' if seq is not None else ''} failed on rank {self.rank}: a peer went away"
        self.hang_report(what, print_block=True)
        if self._report_on_term is not None:
            # the agent stops this rank in a moment: wait for that rather than race it with writing the error file
            time.sleep(2.0)

    # ------------------------------------------------------------------ the hang report
    def hang_report(self, reason: str, *, print_block: bool = False) -> str | None:
        """The hang report for this rank's error, or ``None`` when another process of this node reports. With
        ``print_block``, or under a SIGTERM watcher, it is printed here and ``SEE_ABOVE`` returned: the agent may stop
        this rank before its error is printed."""
        watch = self._report_on_term
        with watch.lock if watch is not None else contextlib.nullcontext():
            block = self.collect_report(reason)
            if not block or not (print_block or watch is not None):
                return block
            sys.stderr.write(block + "\n")
            sys.stderr.flush()
        from fabric_lite.runtime.diagnostics.hang_report import SEE_ABOVE

        return SEE_ABOVE

    def collect_report(self, reason: str) -> str | None:
        trail = self.trail
        if trail is None:
            return None
        from fabric_lite.runtime.diagnostics import hang_report

        try:
            return hang_report.collect(trail.run_dir, reason=reason, world_size=self.world_size, own_rank=self.rank)
        except Exception as err:  # a diagnosis aid: never in the way of the real error
            log.warning("fabric_lite: could not build the hang report (%s)", err)
            return None
