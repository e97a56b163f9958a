"""Jobs whose every process can be found and killed, however it was started.

torchrun's agent starts each worker in a session of its own, so the session-based orphan check of
tests/helpers/harness.py cannot see them, and killing the agent's session leaves them running. Here every process of a
job carries a tag in its environment (``FABRIC_LITE_TEST_TAG``, inherited by every descendant), found by reading
``/proc/<pid>/environ``: :func:`kill_tagged` ends them all, and a job that leaves one behind fails its test.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, Completed, base_env, run_python

TAG_VARIABLE = "FABRIC_LITE_TEST_TAG"


def new_tag(label: str = "job") -> str:
    return f"{label}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def tagged(tag: str) -> list[int]:
    """PIDs of the live processes whose environment carries ``tag`` (zombies have no environment: not listed)."""
    needle = f"{TAG_VARIABLE}={tag}\0".encode()
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if needle in Path(f"/proc/{entry}/environ").read_bytes():
                    found.append(int(entry))
            except OSError:
                continue  # gone, or not ours to read
    return found


def kill_tagged(tag: str, deadline_s: float = 10.0) -> list[int]:
    """SIGKILL every process tagged ``tag`` until none is left; return those that were alive."""
    killed: set[int] = set()
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        alive = tagged(tag)
        if not alive:
            break
        for pid in alive:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        time.sleep(0.05)
    return sorted(killed)


@contextlib.contextmanager
def no_leftovers(tag: str, what: str) -> Iterator[None]:
    """Kill every process tagged ``tag`` on the way out; fail the test if the job left one behind."""
    failed = True
    try:
        yield
        failed = False
    finally:
        # a moment for workers whose agent just exited to finish exiting themselves
        end = time.monotonic() + 3.0
        while tagged(tag) and time.monotonic() < end:
            time.sleep(0.05)
        leftovers = kill_tagged(tag)
        if leftovers and not failed:
            pytest.fail(f"{what} left processes {leftovers} running (killed now)")


def run_tagged(
    args: Sequence[str], timeout: float, env: dict[str, str] | None = None, python: str | None = None
) -> Completed:
    """:func:`tests.helpers.harness.run_python` (bounded, own session, no temp files left), plus: every process the
    command started, in any session, is gone when it returns, or the test fails."""
    tag = new_tag()
    full_env = dict(env if env is not None else base_env())
    full_env[TAG_VARIABLE] = tag
    with no_leftovers(tag, f"`{' '.join(args[:6])} ...`"):
        return run_python(list(args), timeout=timeout, env=full_env, python=python)


class Job:
    """A command running in the background in a session of its own, output to files, every process tagged.

    ``prefix`` runs the command through another (e.g. ``["ip", "netns", "exec", name]``), which must exec it.
    """

    def __init__(self, argv: Sequence[str], env: dict[str, str], label: str, prefix: Sequence[str] = ()) -> None:
        self.tag = new_tag(label)
        self.label = label
        self._folder = Path(tempfile.mkdtemp(prefix=f"fabric_lite_{label}_"))
        self._stdout = open(self._folder / "stdout", "w+")  # noqa: SIM115 - closed in close()
        self._stderr = open(self._folder / "stderr", "w+")  # noqa: SIM115
        (self._folder / "tmp").mkdir()  # a private TMPDIR: torchrun's agent writes its error files there
        self.argv = [*prefix, *argv]
        self.started = time.monotonic()
        try:
            self.process = subprocess.Popen(
                self.argv,
                stdout=self._stdout,
                stderr=self._stderr,
                env={**env, TAG_VARIABLE: self.tag, "TMPDIR": str(self._folder / "tmp")},
                cwd=REPO,
                start_new_session=True,
            )
        except BaseException:
            self._stdout.close()
            self._stderr.close()
            shutil.rmtree(self._folder, ignore_errors=True)
            raise

    def output(self) -> tuple[str, str]:
        return (self._folder / "stdout").read_text(), (self._folder / "stderr").read_text()

    def wait(self, timeout: float) -> Completed:
        """Wait for the command to end; kill the whole job and fail the test after ``timeout`` seconds."""
        try:
            self.process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            stdout, stderr = self.output()
            pytest.fail(
                f"{self.label}: `{' '.join(self.argv[:8])} ...` did not finish within {timeout} s (killed).\n"
                f"--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}"
            )
        stdout, stderr = self.output()
        return Completed(self.argv, self.process.returncode, stdout, stderr, time.monotonic() - self.started)

    def kill(self) -> list[int]:
        """SIGKILL every process of the job at once (the agent and its workers): what losing a host looks like."""
        killed = kill_tagged(self.tag)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.process.wait(timeout=5)
        return killed

    def close(self) -> list[int]:
        """Kill whatever is left and remove the output files; return the processes that were still alive."""
        leftovers = kill_tagged(self.tag)
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        self._stdout.close()
        self._stderr.close()
        shutil.rmtree(self._folder, ignore_errors=True)
        return leftovers
