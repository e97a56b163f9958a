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
    # --- cluster environments, seeds, ranks, loggers, throughput, spikes, warnings, imports ---
    "tests_fabric/plugins/environments/test_kubeflow.py::test_attributes_from_environment_variables": Difference(
        "documented",
        "reads the setters' debug records from Lightning's logger lightning.fabric.plugins.environments; fabric_lite"
        " logs the same words to fabric_lite.plugins.environments (its getters and no-op setters pass)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_slurm.py::test_attributes_from_environment_variables": Difference(
        "documented",
        "reads the setters' debug records from Lightning's logger lightning.fabric.plugins.environments; fabric_lite"
        " logs the same words to fabric_lite.plugins.environments (its getters and no-op setters pass)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_torchelastic.py::test_attributes_from_environment_variables": Difference(
        "documented",
        "reads the setters' debug records from Lightning's logger lightning.fabric.plugins.environments; fabric_lite"
        " logs the same words to fabric_lite.plugins.environments (its getters and no-op setters pass)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_mpi.py::test_setters": Difference(
        "documented",
        "reads the setters' debug records from Lightning's logger lightning.fabric.plugins.environments; fabric_lite"
        " logs the same words to fabric_lite.plugins.environments",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/utilities/test_seed.py::test_reset_seed_non_verbose": Difference(
        "documented",
        "counts seed_everything's INFO record with caplog's default level, which Lightning's import makes visible by"
        " setting its lightning.fabric logger to INFO; importing fabric_lite sets no logger level",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/utilities/test_warnings.py::test_disable_possible_user_warnings_from_environment": Difference(
        "documented",
        "POSSIBLE_USER_WARNINGS=0/off read by reloading lightning.fabric, which then installs a global warning filter;"
        " importing fabric_lite reads no such variable and changes no filter (disable_possible_user_warnings() does)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_lightning.py::test_teardown": Difference(
        "documented",
        "teardown() deletes WORLD_SIZE from os.environ, where Lightning's launcher wrote it; fabric_lite's launcher"
        " writes no variable into its own process, so its teardown removes nothing",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_slurm.py::test_srun_variable_validation": Difference(
        "documented",
        "SLURM_NTASKS=2 without SLURM_NTASKS_PER_NODE must raise at construction; fabric_lite runs `srun -n 2` jobs,"
        " taking the tasks per node from the step's variables",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/environments/test_mpi.py::test_detect": Difference(
        "documented",
        "expects detection from mpi4py's COMM_WORLD alone (mocked); fabric_lite asks mpi4py only when an MPI"
        " launcher's variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE, ...) are set, which the test does not set",
        section="Beyond the loop: where the other names differ",
    ),
    # its other parametrizations (no variable, or rank 0) pass
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_known_environment_variables[env_vars5-None]": Difference(
        "private",
        "deletes Lightning's rank_zero modules from sys.modules to read the rank variables at a second import; under"
        " the hook that leads back to fabric_lite's loaded module, which read them at its own import (held in fresh"
        " processes by tests/unit/test_utilities_lightning.py::test_rank_at_import_comes_from_the_environment)",
    ),
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_known_environment_variables[env_vars6-None]": Difference(
        "private",
        "deletes Lightning's rank_zero modules from sys.modules to read the rank variables at a second import; under"
        " the hook that leads back to fabric_lite's loaded module, which read them at its own import (held in fresh"
        " processes by tests/unit/test_utilities_lightning.py::test_rank_at_import_comes_from_the_environment)",
    ),
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_known_environment_variables[env_vars7-None]": Difference(
        "private",
        "deletes Lightning's rank_zero modules from sys.modules to read the rank variables at a second import; under"
        " the hook that leads back to fabric_lite's loaded module, which read them at its own import (held in fresh"
        " processes by tests/unit/test_utilities_lightning.py::test_rank_at_import_comes_from_the_environment)",
    ),
    "tests_fabric/utilities/test_rank_zero.py::test_rank_zero_known_environment_variables[env_vars8-None]": Difference(
        "private",
        "deletes Lightning's rank_zero modules from sys.modules to read the rank variables at a second import; under"
        " the hook that leads back to fabric_lite's loaded module, which read them at its own import (held in fresh"
        " processes by tests/unit/test_utilities_lightning.py::test_rank_at_import_comes_from_the_environment)",
    ),
    "tests_fabric/utilities/test_throughput.py::test_get_available_flops": Difference(
        "xla",
        "its xla_available fixture patches Lightning's XLA environment (_XLA_AVAILABLE) and mocks torch_xla for TPU"
        " FLOPs; the CUDA half is held by tests/unit/test_utilities_lightning.py::test_get_available_flops",
    ),
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
