"""litgpt's own test files that drive Fabric, run on one library, and the list of those that pass on Lightning.

The list (``passing_on_lightning.txt``) was computed once, by the command below, in ``.venv-litgpt`` (built by
``.ci/setup-litgpt``); every version there is pinned (torch 2.13.0, Lightning 2.6.6, litgpt 0.5.13), so it stays
valid until they change::

    python -m tests.tiers.litgpt.own_tests --write-reference

The tier then runs the files on fabric_lite only (tests/tiers/litgpt/test_litgpt.py).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

from tests.helpers.harness import REPO, base_env, run_python

VENV = REPO / ".venv-litgpt"
#: what litgpt's own tests import besides litgpt's run-time dependencies (built by .ci/setup-litgpt); only their runs
#: have it on the path, so that a ``litgpt`` command runs as after ``pip install litgpt``
OWN_SITE = VENV / "own-tests-site"
REFERENCE = Path(__file__).with_name("passing_on_lightning.txt")
#: litgpt's own test files that drive Fabric (tests/generate/* is not in litgpt's source distribution; the session
#: that added this tier ran it from litgpt's repository: 27 passed, 4 skipped and 1 xfailed on both libraries)
FILES = (
    "test_pretrain.py",
    "test_lora.py",
    "test_adapter.py",
    "test_adapter_v2.py",
    "test_full.py",
    "test_utils.py",
    "test_distributed.py",
    "test_merge_lora.py",
    "test_chat.py",
    "test_generate_speculatively.py",
    "test_api.py",
    "test_batch.py",
    "test_trainer_support.py",
)
#: the runs take minutes and time nothing: they leave the cores to the other test worker's timed jobs
NICE = 10


def env(impl: str) -> dict[str, str]:
    variables = {"OMP_NUM_THREADS": "1", "PATH": f"{VENV / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    out = base_env(variables)
    out["FABRIC_LITE_AS_LIGHTNING"] = "1" if impl == "fabric_lite" else "0"
    return out


def outcomes(junit: Path) -> dict[str, str]:
    """Each test case of a JUnit report by ``classname::name``: passed, failed or skipped."""
    found = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        result = "passed"
        for child in case:
            if child.tag in ("failure", "error"):
                result = "failed"
            elif child.tag == "skipped":
                result = "skipped"
        found[f"{case.get('classname')}::{case.get('name')}"] = result
    return found


def run(python: str, impl: str, folder: Path, timeout: float = 1400) -> tuple[dict[str, str], str]:
    """Run the files on ``impl`` (``"lightning"`` or ``"fabric_lite"``); their outcomes, and what pytest printed."""
    junit = folder / f"{impl}.xml"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "--timeout=900", f"--junitxml={junit}"]
    args.append(f"--basetemp={folder / impl}")  # its tmp_path folders, inside ours
    args += [f"tests/{name}" for name in FILES]
    variables = env(impl)
    variables["PYTHONPATH"] = os.pathsep.join([str(OWN_SITE), variables["PYTHONPATH"]])  # transformers, einops
    done = run_python(args, env=variables, cwd=VENV / "litgpt-tests", python=python, timeout=timeout, nice=NICE)
    if not junit.is_file():
        raise RuntimeError(f"litgpt's tests on {impl} wrote no report\n{done.output}")
    return outcomes(junit), done.output


def read_reference() -> list[str]:
    return [line for line in REFERENCE.read_text().splitlines() if line and not line.startswith("#")]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--write-reference", action="store_true", help="run on Lightning and write the list")
    args = parser.parse_args()
    if not args.write_reference:
        parser.print_help()
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        found, _ = run(str(VENV / "bin" / "python"), "lightning", Path(tmp))
    passed = sorted(test for test, outcome in found.items() if outcome == "passed")
    header = (
        "# litgpt 0.5.13's own tests (tests/tiers/litgpt/own_tests.py FILES) that pass on Lightning 2.6.6, torch"
        " 2.13.0, CPU,\n# written by: python -m tests.tiers.litgpt.own_tests --write-reference\n"
    )
    REFERENCE.write_text(header + "".join(f"{test}\n" for test in passed))
    print(f"{len(passed)} of {len(found)} pass on Lightning; wrote {REFERENCE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
