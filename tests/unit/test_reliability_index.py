"""The reliability tier's index (tests/reliability_cases.py) covers every case, and names only real tests."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.reliability_cases import CASES

REPO = Path(__file__).resolve().parents[2]
RELIABILITY = Path("/work/shared/RELIABILITY.md")


def _test_functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in tree.body if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


def test_every_case_has_tests():
    assert sorted(CASES) == list(range(1, 30))
    for case, (what, tests) in CASES.items():
        assert what and tests, f"case {case} has no tests"


def test_every_listed_test_exists():
    for case, (_, tests) in CASES.items():
        for test in tests:
            file, _, prefix = test.partition("::")
            path = REPO / file
            assert path.is_file(), f"case {case}: {file} does not exist"
            names = _test_functions(path)
            assert any(name.startswith(prefix) for name in names), f"case {case}: no test {test}"


def test_the_index_matches_reliability_md_when_present():
    if not RELIABILITY.is_file():
        return  # the document lives beside the checkout, not in it
    numbered = [int(n) for n in re.findall(r"^(\d+)\. ", RELIABILITY.read_text(), flags=re.MULTILINE)]
    assert numbered == sorted(CASES)
