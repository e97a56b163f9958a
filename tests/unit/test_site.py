"""The suite's ``sitecustomize`` (``tests/helpers/site``): in every process the tests start, it freezes the garbage
collector's objects after the program's own ``atexit`` handlers, unless the test asks for the whole shutdown, and it
still runs the ``sitecustomize`` it shadows."""

from __future__ import annotations

import os
from pathlib import Path

from tests.helpers.harness import FULL_EXIT, SITE, base_env, run_python

# the program's own handler is registered after the site's, so it runs first: it sees nothing frozen yet
PROBE = r"""
import atexit, gc, sys
atexit.register(lambda: print("own handler, frozen:", gc.get_freeze_count(), flush=True))
print("site:", sys.modules["sitecustomize"].__file__)
atexit._run_exitfuncs()
print("after every handler, frozen:", gc.get_freeze_count() > 0)
"""


def test_every_process_freezes_after_its_own_atexit_handlers() -> None:
    done = run_python(["-c", PROBE], timeout=60)
    assert done.returncode == 0, done.output
    assert str(SITE) in os.environ["PYTHONPATH"].split(os.pathsep)  # what every child inherits
    assert f"site: {SITE / 'sitecustomize.py'}" in done.stdout, done.output
    assert "own handler, frozen: 0" in done.stdout and "after every handler, frozen: True" in done.stdout, done.output


def test_a_process_ending_in_an_unhandled_exception_is_left_its_whole_shutdown() -> None:
    # Python sets sys.last_value as it prints an unhandled exception, before the exit handlers
    unhandled = "sys.last_value = ValueError('unhandled')\natexit._run_exitfuncs()"
    probe = PROBE.replace("atexit._run_exitfuncs()", unhandled)
    done = run_python(["-c", probe], timeout=60)
    assert done.returncode == 0, done.output
    assert "after every handler, frozen: False" in done.stdout, done.output


def test_full_exit_leaves_the_shutdown_alone() -> None:
    done = run_python(["-c", PROBE], env=base_env(FULL_EXIT), timeout=60)
    assert done.returncode == 0, done.output
    assert "after every handler, frozen: False" in done.stdout, done.output


def test_the_shadowed_sitecustomize_still_runs(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text("print('the shadowed one ran', __name__)\n")
    env = base_env({"PYTHONPATH": os.pathsep.join([str(SITE), str(tmp_path)])})
    done = run_python(["-c", "print('main')"], env=env, timeout=60)
    assert done.returncode == 0, done.output
    assert done.stdout.splitlines() == ["the shadowed one ran sitecustomize", "main"], done.output
