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
    # --- FSDP, ModelParallel, FSDP precision ---
    # --- DDP, DP, DeepSpeed, single device, the strategy base, precision plugins ---
    # --- launchers, collectives, distributed utilities, graveyard ---
    "tests_fabric/strategies/launchers/test_multiprocessing.py::test_start_method": Difference(
        "private",
        "mocks torch.multiprocessing and pins Lightning's call mp.start_processes(fn, args=, nprocs=, start_method=),"
        " which blocks until the workers end (join=True); fabric_lite starts them with join=False and supervises them"
        " itself (the first failure as the root cause, the hang report, forwarded signals)",
    ),
    "tests_fabric/strategies/launchers/test_multiprocessing.py::test_check_for_bad_cuda_fork[forkserver]": Difference(
        "documented",
        "forkserver after CUDA was initialised: Lightning refuses it as it refuses fork; fabric_lite starts the"
        " processes (the fork server is a new interpreter, in which CUDA works)",
        section="Beyond the loop: where the other names differ",
    ),
    (
        "tests_fabric/strategies/launchers/test_multiprocessing.py::"
        "test_check_for_bad_cuda_fork_with_is_in_bad_fork[forkserver]"
    ): Difference(
        "documented",
        "forkserver in a process forked after CUDA was initialised: Lightning refuses it as it refuses fork;"
        " fabric_lite starts the processes (the fork server is a new interpreter, in which CUDA works)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/strategies/launchers/test_subprocess_script.py": Difference(
        "private",
        "builds Lightning's _SubprocessScriptLauncher(cluster_environment, num_processes, num_nodes), mocks its"
        " _ChildProcessObserver and reads the WORLD_SIZE/LOCAL_RANK it writes into the launching process's own"
        " environment (the file also imports _HYDRA_AVAILABLE): fabric_lite's launcher of that name is built from the"
        " strategy, which holds the rendezvous store, and supervises with its ProcessSupervisor; what these tests"
        " check of it (the function run directly where processes are created externally, the children's"
        " environment, the errors for local_rank > 0 and for a second launch, validate_settings, at Fabric(...)) is"
        " held by tests/unit/test_launchers.py, tests/distributed/test_launchers.py and tests/unit/test_plan.py",
    ),
    "tests_fabric/strategies/launchers/test_subprocess_script.py::test_child_process_observer": Difference(
        "documented",
        "Lightning's _ChildProcessObserver, a thread that polls the children every 5 s and SIGKILLs every process, the"
        " launcher too, when one fails; fabric_lite's script launcher reports the first failure as the root cause"
        " and stops the others (SIGTERM, then SIGKILL)",
        section="What differs, and why",
    ),
    (
        "tests_fabric/plugins/collectives/test_torch_collective.py::"
        "test_collective_calls_with_created_group[gather-kwargs6-gather_list]"
    ): Difference(
        "documented",
        "the list of gather is passed to torch on the destination rank only, so fabric_lite asks for this process's"
        " rank, which the test's mocked, never-initialised torch.distributed cannot answer",
        section="Beyond the loop: where the other names differ",
    ),
    (
        "tests_fabric/plugins/collectives/test_torch_collective.py::"
        "test_collective_calls_with_created_group[scatter-kwargs7-tensor]"
    ): Difference(
        "documented",
        "the list of scatter is passed to torch on the source rank only, so fabric_lite asks for this process's"
        " rank, which the test's mocked, never-initialised torch.distributed cannot answer",
        section="Beyond the loop: where the other names differ",
    ),
    (
        "tests_fabric/plugins/collectives/test_torch_collective.py::test_collective_calls_with_created_group"
        "[gather_object-kwargs13-object_gather_list]"
    ): Difference(
        "documented",
        "the list of gather_object is passed to torch on the destination rank only, so fabric_lite asks for this"
        " process's rank, which the test's mocked, never-initialised torch.distributed cannot answer",
        section="Beyond the loop: where the other names differ",
    ),
    (
        "tests_fabric/plugins/collectives/test_torch_collective.py::test_collective_calls_with_created_group"
        "[scatter_object_list-kwargs14-scatter_object_output_list]"
    ): Difference(
        "documented",
        "the input list of scatter_object_list is passed to torch on the source rank only, so fabric_lite asks for"
        " this process's rank, which the test's mocked, never-initialised torch.distributed cannot answer",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/plugins/collectives/test_torch_collective.py::test_default_process_group": Difference(
        "private",
        "runs TorchCollective.setup()'s env:// rendezvous in workers of Lightning's spawn launcher, which writes"
        " MASTER_PORT into the launching process's environment for the workers' rank 0 to host the store there (and"
        " calls DDPStrategy._get_process_group_backend); fabric_lite's spawn launcher holds the job's store in the"
        " launching process and hands it to the strategy, so the workers have no MASTER_PORT for a second rendezvous",
    ),
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
