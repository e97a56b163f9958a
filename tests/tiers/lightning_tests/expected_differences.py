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
    "tests_fabric/test_cli.py::test_consolidate": Difference(
        "private",
        "patches _process_cli_args, _load_distributed_checkpoint and torch.save inside Lightning's cli module and"
        " expects the command to be those three calls; fabric_lite's consolidate command checks its arguments and"
        " writes through consolidate_checkpoint (an atomic save; DeepSpeed folders and URLs too), which the mocks do"
        " not reach. Its first half (a missing folder: exit 2, 'Path ... does not exist') passes, held by"
        " tests/distributed/test_cli.py::test_lightnings_command_objects_run_the_cli_and_exit_with_its_status",
    ),
    "tests_fabric/test_cli.py::test_run_torchrun_defaults": Difference(
        "documented",
        "expects torchrun's command line with --master_addr=127.0.0.1 --master_port=29400; on one node fabric-lite run"
        " gives torchrun --standalone (a free port it binds itself) and runs the script through"
        " fabric_lite._run_script",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_cli.py::test_run_torchrun_num_processes_launched": Difference(
        "documented",
        "the same command line as test_run_torchrun_defaults (port 29400, 127.0.0.1); the number of processes is"
        " Lightning's (tests/distributed/test_cli.py::test_processes_launched_for_gpu_indices_as_lightnings_cli)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_cli.py::test_run_env_vars_num_nodes[2]": Difference(
        "documented",
        "--num-nodes 2 without --main-address: fabric-lite run requires the address of node 0 (Lightning defaults to"
        " 127.0.0.1, which hangs on a second machine)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_cli.py::test_run_env_vars_num_nodes[3]": Difference(
        "documented",
        "--num-nodes 3 without --main-address, as test_run_env_vars_num_nodes[2]",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_cli.py::test_run_get_supported_strategies": Difference(
        "documented",
        "expects Lightning's 8 names; by the same rule fabric_lite's registry gives 10 (also single_device and the"
        " ddp_find_unused_parameters_false alias)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/utilities/test_cloud_io.py::test_atomic_save_uses_write_for_azure": Difference(
        "private",
        "checks which fsspec call Lightning's _atomic_save makes for Azure (a file opened for writing, for adlfs's"
        " upload speed), with module_available and _is_object_storage patched in its cloud_io; fabric_lite uploads"
        " a checkpoint to any object store in one fs.pipe call of the complete bytes",
    ),
    "tests_fabric/utilities/test_load.py::test_lazy_load_tensor": Difference(
        "documented",
        "the file holds a tensor of a class of the test's own (ATensor), which _lazy_load's weights_only=True"
        " refuses unless weights_only=False is passed",
        section="Private names that clients import",
    ),
    "tests_fabric/utilities/test_load.py::test_lazy_load_mixed_state": Difference(
        "documented",
        "the file holds a pickled nn.Linear, which _lazy_load's weights_only=True refuses unless weights_only=False is"
        " passed",
        section="Private names that clients import",
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
