"""The lightning_tests tier's lists (tests/tiers/lightning_tests/): the reference of tests that pass on Lightning,
the expected differences with their kinds and reasons, and the comparison that the tier fails on."""

from __future__ import annotations

import re

import pytest

from tests.helpers.harness import REPO
from tests.tiers.lightning_tests import expected_differences as ed
from tests.tiers.lightning_tests.suite import read_reference

REFERENCE = read_reference()
MIGRATION_HEADINGS = set(re.findall(r"^#+ (.+)$", (REPO / "docs" / "migration.md").read_text(), flags=re.MULTILINE))


def test_the_reference_is_sorted_unique_tests_of_tests_fabric() -> None:
    assert sorted(set(REFERENCE)) == REFERENCE and len(REFERENCE) > 800
    assert all(test.startswith("tests_fabric/") and ".py::" in test for test in REFERENCE)


@pytest.mark.parametrize("key", sorted(ed.EXPECTED) or ["(none)"])
def test_every_expected_difference_is_a_real_test_with_a_kind_and_a_reason(key: str) -> None:
    if key == "(none)":
        return
    difference = ed.EXPECTED[key]
    assert any(ed.matches(key, test) for test in REFERENCE), f"{key} matches no test that passes on Lightning"
    assert difference.kind in ed.KINDS, difference
    assert len(difference.reason) > 20, f"{key}: say why, specifically"
    if difference.kind == "documented":
        assert difference.section in MIGRATION_HEADINGS, (
            f"{key}: docs/migration.md has no section {difference.section!r}"
        )
    else:
        assert difference.section is None, f"{key}: only a documented difference names a section"


def test_the_comparison_sorts_every_reference_test_once() -> None:
    reference = ["t/a.py::x", "t/a.py::y[1]", "t/a.py::y[2]", "t/b.py::z", "t/b.py::w"]
    expected = {"t/a.py::y": ed.Difference("private", "reads a private detail"), "t/b.py::w": ed.Difference("xla", "x")}
    outcomes = {"t/a.py::x": "passed", "t/a.py::y[1]": "failed", "t/a.py::y[2]": "passed", "t/b.py::w": "error"}
    result = ed.compare(reference, outcomes, expected=expected)
    assert result.passed == ["t/a.py::x", "t/a.py::y[2]"]
    assert list(result.expected) == ["t/a.py::y[1]", "t/b.py::w"]
    assert result.unexpected == {"t/b.py::z": "not run"}  # a test that never ran (its module failed) is a failure
    assert result.stale == ["t/a.py::y[2]"]  # listed, yet passes: the entry must go
    assert result.total == len(reference)
    only_b = ed.compare(reference, outcomes, selected=["t/b.py"], expected=expected)
    assert (only_b.passed, list(only_b.expected), only_b.unexpected) == ([], ["t/b.py::w"], {"t/b.py::z": "not run"})


def test_the_most_specific_entry_wins() -> None:
    expected = {"t/a.py": ed.Difference("xla", "a"), "t/a.py::f": ed.Difference("private", "f")}
    assert ed.difference_of("t/a.py::f[3]", expected) == expected["t/a.py::f"]
    assert ed.difference_of("t/a.py::g", expected) == expected["t/a.py"]
    assert ed.difference_of("t/a.py::ff", {"t/a.py::f": expected["t/a.py::f"]}) is None


def test_a_machine_dependent_skip_is_left_out_of_the_comparison_and_a_failure_is_not() -> None:
    test = next(iter(ed.MACHINE_DEPENDENT))
    assert test in REFERENCE and ed.difference_of(test) is None
    skipped = ed.compare([test, "t/a.py::x"], {test: "skipped", "t/a.py::x": "passed"}, expected={})
    assert (skipped.not_compared, skipped.unexpected, skipped.total) == ([test], {}, 1)
    assert "NOT COMPARED" in ed.report([test], {test: "skipped"})
    failed = ed.compare([test], {test: "failed"}, expected={})
    assert (failed.not_compared, failed.unexpected) == ([], {test: "failed"})
