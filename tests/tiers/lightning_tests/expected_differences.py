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
    "tests_fabric/test_connector.py::test_accelerator_choice_tpu": Difference(
        "xla",
        "mocks torch_xla as available (tpu_available) and expects XLAAccelerator and the XLA strategies",
    ),
    "tests_fabric/test_connector.py::test_connector_auto_selection": Difference(
        "xla",
        (
            "its TPU steps mock torch_xla as available (mock_tpu_available) and expect XLAAccelerator and "
            "XLAStrategy to be chosen"
        ),
    ),
    "tests_fabric/test_connector.py::test_connector_with_tpu_accelerator_instance": Difference(
        "xla",
        "builds XLAAccelerator() with torch_xla mocked as available (tpu_available)",
    ),
    "tests_fabric/test_connector.py::test_unsupported_tpu_choice": Difference(
        "xla",
        ("builds XLAAccelerator, XLAStrategy and XLAPrecision with torch_xla mocked as available (tpu_available)"),
    ),
    "tests_fabric/test_connector.py::test_xla_fsdp_automatic_strategy_selection": Difference(
        "xla",
        "expects strategy='fsdp' on a TPU mocked as available (tpu_available) to become XLAFSDPStrategy",
    ),
    "tests_fabric/test_connector.py::test_fallback_from_ddp_spawn_to_ddp_on_cluster[env_vars1-LSFEnvironment]": Difference(  # noqa: E501
        "private",
        (
            "patches Lightning's LSFEnvironment._get_node_rank and _read_hosts, helpers that fabric_lite's "
            "LSFEnvironment does not have (it reads the rank file itself)"
        ),
    ),
    "tests_fabric/test_connector.py::test_fallback_from_ddp_spawn_to_ddp_on_cluster[env_vars0-SLURMEnvironment]": Difference(  # noqa: E501
        "documented",
        (
            "devices=2 in a SLURM task with SLURM_NTASKS_PER_NODE=1: fabric_lite refuses the mismatch at "
            "Fabric(...), Lightning at launch()"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_cpu_slurm": Difference(
        "documented",
        (
            "devices=2 in a SLURM task with SLURM_NTASKS_PER_NODE=1: fabric_lite refuses the mismatch at "
            "Fabric(...), Lightning at launch()"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_slurm[DDPStrategy-some_name-SLURMEnvironment]": Difference(  # noqa: E501
        "documented",
        (
            "devices=2 in a SLURM task with SLURM_NTASKS_PER_NODE=1: fabric_lite refuses the mismatch at "
            "Fabric(...), Lightning at launch()"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_slurm[auto-some_name-SLURMEnvironment]": Difference(
        "documented",
        (
            "devices=2 in a SLURM task with SLURM_NTASKS_PER_NODE=1: fabric_lite refuses the mismatch at "
            "Fabric(...), Lightning at launch()"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_slurm[ddp-some_name-SLURMEnvironment]": Difference(
        "documented",
        (
            "devices=2 in a SLURM task with SLURM_NTASKS_PER_NODE=1: fabric_lite refuses the mismatch at "
            "Fabric(...), Lightning at launch()"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_multi_node_gpu": Difference(
        "documented",
        (
            "Fabric(num_nodes=2) without a launcher, MASTER_ADDR or MASTER_PORT is refused at construction (under"
            " Lightning the nodes' processes would wait for each other until the timeout)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_devices_from_environment": Difference(
        "documented",
        ("num_nodes=3 (from LT_NUM_NODES) without a launcher, MASTER_ADDR or MASTER_PORT is refused at construction"),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_custom_accelerator": Difference(
        "documented",
        (
            "a SingleDeviceStrategy instance with devices=2 is an error, and so is devices=2 in a SLURM task with"
            " SLURM_NTASKS_PER_NODE=1, at Fabric(...); its custom accelerator (name(), parse_devices, ...) works"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_torchelastic_priority_over_slurm": Difference(
        "documented",
        (
            "asserts SLURMEnvironment.detect() with SLURM_NTASKS set but no srun task (no SLURM_PROCID): "
            "fabric_lite uses SLURM's variables only in a task srun started"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_fsdp_unsupported_on_cpu": Difference(
        "documented",
        "strategy='fsdp' runs on the CPU with gloo in fabric_lite; Lightning refuses it",
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_bitsandbytes_precision_cuda_required": Difference(
        "documented",
        "BitsandbytesPrecision runs on the CPU too in fabric_lite; Lightning requires CUDA",
        section="What differs, and why",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_kubeflow": Difference(
        "documented",
        (
            "KubeflowEnvironment with devices=2 and WORLD_SIZE=20: fabric_lite checks one process per pod "
            "(devices=1, num_nodes=WORLD_SIZE)"
        ),
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_connector.py::test_strategy_choice_ddp_cpu_kubeflow": Difference(
        "documented",
        (
            "KubeflowEnvironment with devices=2 and WORLD_SIZE=20: fabric_lite checks one process per pod "
            "(devices=1, num_nodes=WORLD_SIZE)"
        ),
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/accelerators/test_cuda.py::test_force_nvml_based_cuda_check": Difference(
        "documented",
        "importing fabric_lite sets no environment variable (Lightning sets PYTORCH_NVML_BASED_CUDA_CHECK=1)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/strategies/test_registry.py::test_available_strategies_in_registry": Difference(
        "documented",
        "STRATEGY_REGISTRY also holds fabric_lite's single_device, horovod and find_unused_parameters aliases",
        section="What fabric_lite adds",
    ),
    "tests_fabric/plugins/precision/test_transformer_engine.py": Difference(
        "documented",
        (
            "TransformerEnginePrecision ('transformer-engine') is not in fabric_lite; the tests mock "
            "transformer_engine as installed"
        ),
        section="What fabric_lite does not have",
    ),
    # --- Fabric and its wrappers, device/dtype mixin ---
    # --- data loaders, CLI, consolidation, loading and cloud IO ---
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
