"""Lightning Fabric's own test suite (``tests_fabric`` of Lightning 2.6.5, kept beside the checkout in
``../shared/lightning-tests``), run on fabric_lite through the import hook, and compared with Lightning.

The suite is copied into a folder of the caller's (its ``leave_no_artifacts_behind`` fixture fails a test that leaves
a file in the folder above ``tests_fabric``, so that folder holds nothing else, and the shared copy is read-only),
with two files of ours beside it:

* ``conftest.py`` one level up (:mod:`._outcomes_conftest`) records each test's outcome by node id, as JSON;
* ``tests_fabric/conftest.py`` is Lightning's, with its imports of two private names that fabric_lite has no
  counterpart of made tolerant, the same on both libraries (:data:`CONFTEST_TOLERANCE`).

``REFERENCE`` lists the tests that pass on Lightning 2.6.6 here (torch 2.13.0 on the CPU). It was computed once,
by the command ``python -m tests.tiers.lightning_tests.suite --on lightning --write-reference`` (with
``.venv-lightning-tests`` built by ``.ci/setup-lightning-tests``); the versions are pinned, so it stays valid until
they change.

Run by hand (``--on fabric_lite`` is the default; test paths narrow the run)::

    python -m tests.tiers.lightning_tests.suite tests_fabric/utilities/test_seed.py
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.helpers.harness import SITE

REPO = Path(__file__).resolve().parents[3]
#: where the suite lives: where ``$LIGHTNING_TESTS_DIR`` says, else beside the checkout (``../shared``), else in
#: this workplace's shared folder
_CANDIDATES = [REPO.parent / "shared" / "lightning-tests", Path("/work/shared/lightning-tests")]
SUITE = (
    Path(os.environ["LIGHTNING_TESTS_DIR"])
    if "LIGHTNING_TESTS_DIR" in os.environ
    else next((c for c in _CANDIDATES if c.is_dir()), _CANDIDATES[0])
) / "tests_fabric"
VENV = REPO / ".venv-lightning-tests"
REFERENCE = Path(__file__).with_name("passing_on_lightning.txt")
IMPLS = ("lightning", "fabric_lite")

#: Lightning's conftest.py imports these two private names at module level for its thread check (a launcher's
#: observer thread to join; torch.distributed torn down after each test) and asserts a third exists: fabric_lite's
#: launcher has no observer thread and its backward flag lives on the precision plugin, not in ``wrappers``. Each
#: line is replaced by a tolerant one, on both libraries alike, so that the suite's own fixtures still run.
CONFTEST_TOLERANCE = {
    "from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver\n": (
        "try:\n"
        "    from lightning.fabric.strategies.launchers.subprocess_script import _ChildProcessObserver\n"
        "except ImportError:  # fabric_lite: no observer thread to join\n"
        "    class _ChildProcessObserver: ...\n"
    ),
    '    assert hasattr(wrappers, "_in_fabric_backward")\n': (
        '    if not hasattr(wrappers, "_in_fabric_backward"):  # fabric_lite: the flag is on the precision plugin\n'
        "        yield\n"
        "        return\n"
    ),
}


def prepare(folder: Path) -> Path:
    """Copy the suite into ``folder/suite/tests_fabric`` with our two conftest files; return ``folder/suite``, where
    the inner pytest runs (its temporary folders and the outcomes go beside it, in ``folder``)."""
    if not SUITE.is_dir():
        raise FileNotFoundError(
            f"Lightning's test suite is not at {SUITE}: it lives beside the checkout in ../shared/lightning-tests,"
            " or set LIGHTNING_TESTS_DIR to the folder that holds tests_fabric"
        )
    suite = folder / "suite"
    target = suite / "tests_fabric"
    shutil.copytree(SUITE, target, ignore=shutil.ignore_patterns("__pycache__"))
    for path in [target, *target.rglob("*")]:
        path.chmod(path.stat().st_mode | 0o200)  # the shared copy is read-only
    conftest = target / "conftest.py"
    text = conftest.read_text()
    for line, tolerant in CONFTEST_TOLERANCE.items():
        if line not in text:
            raise ValueError(f"Lightning's conftest.py no longer has the line this tier makes tolerant: {line!r}")
        text = text.replace(line, tolerant)
    conftest.write_text(text)
    shutil.copy(Path(__file__).with_name("_outcomes_conftest.py"), suite / "conftest.py")
    # its helper modules' bytecode, once: where PYTHONDONTWRITEBYTECODE is set, every process the suite starts would
    # compile them again
    compileall.compile_dir(suite, quiet=1, workers=0)
    return suite


def environment(impl: str, outcomes: Path) -> dict[str, str]:
    """The inner pytest's environment: the hook on or off, nothing of the caller's run leaking in."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FABRIC_LITE_", "PYTEST_", "SLURM_"))}
    for name in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "RANK", "WORLD_SIZE", "NODE_RANK", "PYTHONPATH"):
        env.pop(name, None)
    # fabric_lite from this checkout, whatever the venv's editable install points at; and the suite's fast exit
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(SITE)])
    env["FABRIC_LITE_AS_LIGHTNING"] = "1" if impl == "fabric_lite" else "0"
    env["LIGHTNING_TESTS_OUTCOMES"] = str(outcomes)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def command(python: str, folder: Path, paths: Iterable[str], workers: int) -> list[str]:
    argv = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors"]
    argv += ["--timeout=300", f"--basetemp={folder / 'basetemp'}"]
    if workers > 1:
        argv += ["-n", str(workers)]
    return [*argv, *(list(paths) or ["tests_fabric"])]


def outcomes_of(path: Path) -> dict[str, str]:
    return json.loads(path.read_text()) if path.is_file() else {}  # type: ignore[no-any-return]


def read_reference() -> list[str]:
    return [line for line in REFERENCE.read_text().splitlines() if line and not line.startswith("#")]


def write_reference(outcomes: Mapping[str, str]) -> None:
    passed = sorted(test for test, outcome in outcomes.items() if outcome == "passed")
    header = (
        "# Tests of Lightning's tests_fabric (tag 2.6.5) that pass on Lightning 2.6.6 with torch 2.13.0 on the CPU,\n"
        "# written by: python -m tests.tiers.lightning_tests.suite --on lightning --write-reference\n"
    )
    REFERENCE.write_text(header + "".join(f"{test}\n" for test in passed))


def summary(outcomes: Mapping[str, str]) -> str:
    counts = Counter(outcomes.values())
    return ", ".join(f"{counts[k]} {k}" for k in ("passed", "failed", "error", "skipped", "xfailed", "xpassed"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--on", choices=IMPLS, default="fabric_lite", help="the library under test")
    parser.add_argument("--python", default=str(VENV / "bin" / "python"), help="a venv with Lightning 2.6.6")
    parser.add_argument("-n", "--workers", type=int, default=2)
    parser.add_argument("--write-reference", action="store_true", help="write the tests that pass to REFERENCE")
    parser.add_argument("--keep", help="run in this folder and keep it (default: a temporary one)")
    parser.add_argument("paths", nargs="*", help="test paths under tests_fabric (default: all of it)")
    args = parser.parse_args(argv)
    folder = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="lightning_tests_"))
    try:
        suite = prepare(folder)
        outcomes_file = folder / "outcomes.json"
        argv_ = command(args.python, folder, args.paths, args.workers)
        subprocess.run(argv_, cwd=suite, env=environment(args.on, outcomes_file), check=False)
        outcomes = outcomes_of(outcomes_file)
        print(f"on {args.on}: {summary(outcomes)}")
        if args.write_reference:
            write_reference(outcomes)
            print(f"wrote {REFERENCE}")
        elif args.on == "fabric_lite" and REFERENCE.is_file():
            from tests.tiers.lightning_tests.expected_differences import report

            print(report(read_reference(), outcomes, selected=args.paths))
        return 0
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
