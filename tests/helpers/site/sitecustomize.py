"""Every Python process the suite starts skips the interpreter's last garbage collections.

The suite puts this folder on ``PYTHONPATH`` (``tests/conftest.py``), so Python imports this module at the start of
every process the tests launch: the test workers, the jobs' ranks, the launchers, the tiers' commands. At exit, after
every ``atexit`` handler of the program (this one is registered first, so it runs last), it moves the objects left
into the garbage collector's permanent generation (``gc.freeze``). The shutdown then frees them by reference counting
as before, but its full collections no longer walk the millions of objects that ``import torch`` leaves behind, the
most costly step of ending a process that trained (the README's "Tests" section has the figures).

What the programs under test do at exit is unchanged: their ``atexit`` handlers, ``weakref.finalize`` callbacks and
non-daemon threads all run before this. Only objects in unreachable reference cycles at that point are no longer
collected, which CPython does not promise at exit anyway. The exits of failing ranks are what the reliability tests
examine, so a process that ends in an unhandled exception is left its whole shutdown; and a test that checks how a
job ends sets ``TESTS_FULL_EXIT=1`` (``tests.helpers.harness.FULL_EXIT``).

The module shadows the distribution's own ``sitecustomize`` (Debian installs one), which it then runs.
"""

import atexit
import gc
import os
import sys


def _freeze_unless_failed() -> None:
    if getattr(sys, "last_value", None) is None:  # an unhandled exception's process ends as outside the suite
        gc.freeze()


if os.environ.get("TESTS_FULL_EXIT") != "1":
    atexit.register(_freeze_unless_failed)


def _run_the_shadowed_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        folder = os.path.abspath(entry or os.getcwd())
        candidate = os.path.join(folder, "sitecustomize.py")
        if folder != here and os.path.isfile(candidate):
            with open(candidate, encoding="utf-8") as source:
                code = compile(source.read(), candidate, "exec")
            exec(code, {"__name__": "sitecustomize", "__file__": candidate})
            return


_run_the_shadowed_sitecustomize()
