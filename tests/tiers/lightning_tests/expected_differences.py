"""The tests of Lightning's ``tests_fabric`` that pass on Lightning 2.6.6 and are expected not to pass on fabric_lite,
each with its kind and reason. Public behaviour is never one of them: a test of public behaviour that fails is a
bug to fix, not an entry here.

The three kinds:

* ``"private"``: the test patches or reads a private implementation detail of Lightning's that has no
  counterpart in fabric_lite's design (the reason names it);
* ``"documented"``: a deliberate difference, documented in ``docs/migration.md`` (``section`` names the heading);
* ``"xla"``: the test needs XLA/TPU hardware, or torch_xla mocked into Lightning's XLA implementation.

A key is a test's node id, a test function (every parametrization of it), a class, or a whole file.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["private", "documented", "xla"]
KINDS: tuple[Kind, ...] = ("private", "documented", "xla")


@dataclass(frozen=True)
class Difference:
    kind: Kind
    reason: str
    #: for ``"documented"``: the heading in docs/migration.md that documents it
    section: str | None = None


EXPECTED: dict[str, Difference] = {
    # --- XLA/TPU (kind xla) ---
    # --- connector, plan, registries, device parsing, accelerators ---
    # --- Fabric and its wrappers, device/dtype mixin ---
    # --- data loaders, CLI, consolidation, loading and cloud IO ---
    "tests_fabric/utilities/test_data.py::test_replace_dunder_methods_multiple_loaders_without_init": Difference(
        "private",
        "asserts `__old__init__`, the class attribute where Lightning's _replace_dunder_methods parks each original"
        " `__init__`; fabric_lite's keeps the originals inside the context manager and puts them back on exit"
        " (tests/unit/test_recreate_loader.py checks that every method is restored)",
    ),
    # --- cluster environments, seeds, ranks, loggers, throughput, spikes, warnings, imports ---
    # --- FSDP, ModelParallel, FSDP precision ---
    # --- DDP, DP, DeepSpeed, single device, the strategy base, precision plugins ---
    # --- launchers, collectives, distributed utilities, graveyard ---
}


def matches(key: str, test: str) -> bool:
    """Whether the entry ``key`` covers ``test``: the same id, one of its parametrizations, or a test in it."""
    return test == key or test.startswith((key + "[", key + "::"))


def difference_of(test: str, expected: Mapping[str, Difference] = EXPECTED) -> Difference | None:
    found = [key for key in expected if matches(key, test)]
    return expected[max(found, key=len)] if found else None  # the most specific entry wins


@dataclass(frozen=True)
class Comparison:
    """The tests that pass on Lightning (in the selection run), sorted by what they did on fabric_lite."""

    passed: list[str]
    expected: dict[str, Difference]
    #: not passed, not listed: each is a failure of the tier
    unexpected: dict[str, str]
    #: listed, but passed: each is a failure of the tier too (the entry is stale)
    stale: list[str]

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.expected) + len(self.unexpected)


def compare(reference: Iterable[str], outcomes: Mapping[str, str], selected: Sequence[str] = ()) -> Comparison:
    """Sort the tests of ``reference`` (those that pass on Lightning) by their ``outcomes`` on fabric_lite; with
    ``selected`` (test paths as given to pytest), only the tests under them."""
    prefixes = [path.rstrip("/") for path in selected]
    passed, expected, unexpected, stale = [], {}, {}, []
    for test in reference:
        if prefixes and not any(test == p or test.startswith((p + "/", p + "::")) for p in prefixes):
            continue
        outcome = outcomes.get(test, "not run")
        listed = difference_of(test)
        if outcome == "passed":
            passed.append(test)
            if listed is not None:
                stale.append(test)
        elif listed is not None:
            expected[test] = listed
        else:
            unexpected[test] = outcome
    return Comparison(passed, expected, unexpected, stale)


def report(reference: Iterable[str], outcomes: Mapping[str, str], selected: Sequence[str] = ()) -> str:
    result = compare(reference, outcomes, selected)
    kinds = Counter(d.kind for d in result.expected.values())
    share = len(result.passed) / result.total if result.total else 1.0
    lines = [
        f"of {result.total} tests that pass on Lightning: {len(result.passed)} pass on fabric_lite ({share:.1%}),"
        f" {len(result.expected)} expected differences ({', '.join(f'{kinds[k]} {k}' for k in KINDS)}),"
        f" {len(result.unexpected)} unexpected, {len(result.stale)} stale entries"
    ]
    lines += [f"  UNEXPECTED {outcome:8} {test}" for test, outcome in sorted(result.unexpected.items())]
    lines += [f"  STALE (passes; remove its entry) {test}" for test in result.stale]
    return "\n".join(lines)
