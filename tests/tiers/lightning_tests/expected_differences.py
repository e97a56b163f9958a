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
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["private", "documented", "xla"]
KINDS: tuple[Kind, ...] = ("private", "documented", "xla")


@dataclass(frozen=True)
class Difference:
    kind: Kind
    reason: str
    #: for ``"documented"``: the heading in docs/migration.md that documents it
    section: str | None = None


#: tests that run Lightning's XLA code against a mocked torch_xla (the tpu_available/xla_available fixtures, a Mock
#: torch_xla runtime): fabric_lite's XLA classes only raise, naming torch_xla
_XLA_MOCKED = (
    "tests_fabric/accelerators/test_xla.py::test_get_parallel_devices",
    "tests_fabric/accelerators/test_xla.py::test_get_parallel_devices_raises",
    "tests_fabric/plugins/environments/test_xla.py::test_detect",
    "tests_fabric/plugins/environments/test_xla.py::test_global_rank_from_xla_runtime_greater_2_1",
    "tests_fabric/plugins/environments/test_xla.py::test_local_rank_from_xla_runtime_greater_2_1",
    "tests_fabric/plugins/environments/test_xla.py::test_setters_readonly_when_xla_runtime_greater_2_1",
    "tests_fabric/plugins/environments/test_xla.py::test_world_size_from_xla_runtime_greater_2_1",
    "tests_fabric/plugins/precision/test_xla.py::test_precision_input_validation",
    "tests_fabric/plugins/precision/test_xla.py::test_selected_dtype",
    "tests_fabric/plugins/precision/test_xla.py::test_teardown",
    "tests_fabric/strategies/test_xla.py::test_rank_properties_access",
    "tests_fabric/strategies/test_xla_fsdp.py",
)

EXPECTED: dict[str, Difference] = {
    # --- XLA/TPU (kind xla) ---
    **{
        test: Difference(
            "xla", "runs Lightning's XLA code against a mocked torch_xla; fabric_lite's XLA classes only raise"
        )
        for test in _XLA_MOCKED
    },
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
    # --- Fabric and its wrappers, device/dtype mixin ---
    "tests_fabric/test_fabric.py::test_backward_required": Difference(
        "private",
        "reads wrappers._in_fabric_backward, Lightning's module-global flag (fabric_lite keeps it on the precision"
        " plugin), and asserts a backward hook on every output also where the precision needs none (32-true,"
        " bf16-true); the error for a plain loss.backward() under a loss-scaling precision is the same",
    ),
    "tests_fabric/test_fabric.py::test_backward_required[setup-auto-bf16-mixed-True]": Difference(
        "documented",
        "besides the private flag and hooks above: a plain loss.backward() under bf16-mixed (no loss scaler) is not"
        " refused",
        section="What differs, and why",
    ),
    "tests_fabric/test_fabric.py::test_backward_required[setup_module-auto-bf16-mixed-True]": Difference(
        "documented",
        "besides the private flag and hooks above: a plain loss.backward() under bf16-mixed (no loss scaler) is not"
        " refused",
        section="What differs, and why",
    ),
    "tests_fabric/test_fabric.py::test_launch_and_strategies_unsupported_combinations[xla]": Difference(
        "xla", "builds Fabric(strategy='xla') with torch_xla mocked into Lightning's XLA implementation"
    ),
    "tests_fabric/test_fabric.py::test_launch_and_cli_not_allowed": Difference(
        "documented",
        "in a script the CLI started, launch() does nothing (Lightning: 'Calling `.launch()` again is not allowed')",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_fabric.py::test_overridden_run_and_cli_not_allowed": Difference(
        "documented",
        "in a script the CLI started, an overridden Fabric.run runs (Lightning raises TypeError)",
        section="Beyond the loop: where the other names differ",
    ),
    "tests_fabric/test_wrappers.py::test_fabric_optimizer_steps": Difference(
        "private",
        "its last part gives the strategy an Optimizable `model`, which Lightning's optimizer wrapper steps instead of"
        " the optimizer (its DeepSpeed special case); fabric_lite's wrapper passes the optimizer, and"
        " DeepSpeedStrategy.optimizer_step steps its engine",
    ),
    "tests_fabric/test_wrappers.py::test_unwrap_compiled": Difference(
        "documented",
        "torch.compile is not patched at import (no __wrapped__, no _compile_kwargs); _unwrap_compiled returns the"
        " settings read from the compiled module, not Lightning's keyword arguments",
        section="What differs, and why",
    ),
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
        " tests/unit/test_cli.py::test_lightnings_command_objects_run_the_cli_and_exit_with_its_status",
    ),
    "tests_fabric/test_cli.py::test_run_env_vars_unsupported_strategy[deepspeed_stage_3_offload]": Difference(
        "documented",
        "fabric-lite run takes the offloading strategy names (their names say everything the strategy needs), which"
        " Lightning's fabric run refuses; _get_supported_strategies() is Lightning's list",
        section="Beyond the loop: where the other names differ",
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
        " Lightning's (tests/unit/test_cli.py::test_processes_launched_for_gpu_indices_as_lightnings_cli)",
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
    # its other parametrizations (no variable, or rank 0) pass
    "tests_fabric/utilities/test_throughput.py::test_get_available_flops": Difference(
        "xla",
        "its xla_available fixture patches Lightning's XLA environment (_XLA_AVAILABLE) and mocks torch_xla for TPU"
        " FLOPs; the CUDA half is held by tests/unit/test_utilities_lightning.py::test_get_available_flops",
    ),
    # --- FSDP, ModelParallel, FSDP precision ---
    "tests_fabric/strategies/test_fsdp.py::test_activation_checkpointing": Difference(
        "private",
        (
            "reads Lightning's _activation_checkpointing_kwargs (FSDP1 wrap-policy kwargs) and mocks FSDP1's "
            "FullyShardedDataParallel and checkpoint_wrapper; fabric_lite applies torch's composable checkpoint "
            "to the modules the policy picks (ModuleWrapPolicy included) before fully_shard"
        ),
    ),
    "tests_fabric/strategies/test_fsdp.py::test_get_full_state_dict_context_offload": Difference(
        "private",
        (
            "patches FSDP1's FullyShardedDataParallel.set_state_dict_type, which fabric_lite's FSDP2 "
            "_get_full_state_dict_context (a state-dict hook that gathers each DTensor) never calls"
        ),
    ),
    "tests_fabric/strategies/test_fsdp.py::test_hybrid_shard_configuration": Difference(
        "documented",
        (
            "HYBRID_SHARD needs no auto_wrap_policy, process_group or device_mesh with FSDP2 (a 2-D mesh of nodes"
            " x devices by default; Lightning's FSDP1 raises RuntimeError); the test then passes Mock objects as "
            "process groups and device meshes, which FSDPStrategy(...) checks, and patches Lightning's "
            "fsdp._TORCH_GREATER_EQUAL_2_2 (fabric_lite needs torch >= 2.6)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_load_checkpoint_no_state": Difference(
        "documented",
        (
            "fabric.load(path) with state=None or {} returns the whole checkpoint, as Fabric.load documents "
            "(Lightning's sharded strategies raise ValueError)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_load_checkpoint_one_fsdp_module_required": Difference(
        "documented",
        (
            "a checkpoint's state may hold any modules, sharded or not, several or none (Lightning: 'Could not "
            "find a FSDP model' / 'Found multiple FSDP models'); the test also patches Lightning's "
            "model_parallel._lazy_load"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_load_raw_checkpoint_optimizer_unsupported": Difference(
        "documented",
        "an optimizer loads alone from a sharded or full checkpoint (Lightning: NotImplementedError)",
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_no_backward_sync": Difference(
        "documented",
        (
            "no_backward_sync switches FSDP2's gradient reduction off (set_requires_gradient_sync) on a module "
            "sharded with fully_shard; the test expects FSDP1's no_sync() on a mocked FullyShardedDataParallel"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_save_checkpoint_one_fsdp_module_required": Difference(
        "documented",
        (
            "a checkpoint's state may hold any modules, sharded or not, several or none (Lightning: 'Could not "
            "find a FSDP model' / 'Found multiple FSDP models')"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_save_checkpoint_path_exists": Difference(
        "private",
        (
            "patches shutil, torch.save, _get_full_state_dict_context and _get_sharded_state_dict_context in "
            "Lightning's fsdp module and saves Mock(spec=FullyShardedDataParallel) models; fabric_lite saves "
            "through torch.distributed.checkpoint's state-dict API into a temporary folder that it swaps in"
        ),
    ),
    "tests_fabric/strategies/test_fsdp.py::test_save_checkpoint_unknown_state_dict_type": Difference(
        "documented",
        (
            "an unknown state_dict_type is refused at FSDPStrategy(...), naming the choices (Lightning accepts it"
            " and raises at the first save)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_fsdp.py::test_set_timeout": Difference(
        "private",
        (
            "mocks torch.distributed.init_process_group, so no process group exists when FSDPStrategy's "
            "setup_environment builds the device mesh (every rank builds it there, together), and then pins "
            "Lightning's exact env:// init_process_group call, which fabric_lite makes with its own store= (see "
            "test_ddp.py::test_set_timeout)"
        ),
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_load_checkpoint_no_state": Difference(
        "documented",
        (
            "fabric.load(path) with state=None or {} returns the whole checkpoint, as Fabric.load documents "
            "(Lightning's sharded strategies raise ValueError)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_load_checkpoint_one_dist_module_required": Difference(
        "documented",
        (
            "a checkpoint's state may hold any modules, parallelised or not, several or none (Lightning: 'Could "
            "not find a distributed model' / 'Found multiple distributed models')"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_load_raw_checkpoint_optimizer_unsupported": Difference(
        "documented",
        "an optimizer loads alone from a sharded or full checkpoint (Lightning: NotImplementedError)",
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_load_unknown_checkpoint_type": Difference(
        "private",
        (
            "patches Lightning's model_parallel._has_dtensor_modules, which fabric_lite does not have (a state "
            "may hold any modules); the refusal it checks passes in "
            "test_fsdp.py::test_load_unknown_checkpoint_type"
        ),
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_no_backward_sync": Difference(
        "documented",
        (
            "no_backward_sync(model, enabled=False) leaves gradient synchronisation on and a module not set up by"
            " the strategy is a TypeError (Lightning's switches synchronisation off when a disabled block ends, "
            "and takes a Mock module)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_parallelize_fn_call": Difference(
        "documented",
        (
            "its parallelize_fn returns a Mock holding no parameters while the optimizer holds the model's two: "
            "fabric_lite points a jointly set-up optimizer at the returned module's parameters by name and refuses "
            "one whose parameters that module does not have (Lightning returns it unchanged, over parameters the "
            "model no longer uses, which would train nothing)"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_save_checkpoint_one_dist_module_required": Difference(
        "documented",
        (
            "a checkpoint's state may hold any modules, parallelised or not, several or none (Lightning: 'Could "
            "not find a distributed model' / 'Found multiple distributed models')"
        ),
        section="What differs, and why",
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_save_checkpoint_path_exists": Difference(
        "private",
        (
            "patches shutil, torch.save and _has_dtensor_modules in Lightning's model_parallel module; "
            "fabric_lite saves through torch.distributed.checkpoint's state-dict API into a temporary folder that"
            " it swaps in"
        ),
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_set_timeout": Difference(
        "private",
        (
            "pins Lightning's exact env:// init_process_group call: fabric_lite makes it with its own store= (see "
            "test_ddp.py::test_set_timeout)"
        ),
    ),
    "tests_fabric/strategies/test_model_parallel.py::test_torch_greater_equal_2_4": Difference(
        "private",
        (
            "patches Lightning's model_parallel._TORCH_GREATER_EQUAL_2_4; fabric_lite needs torch >= 2.6 and "
            "checks by importing fully_shard"
        ),
    ),
    # --- DDP, DP, DeepSpeed, single device, the strategy base, precision plugins ---
    "tests_fabric/strategies/test_ddp.py::test_set_timeout": Difference(
        "private",
        "pins Lightning's exact call torch.distributed.init_process_group(backend, rank=, world_size=, timeout=,"
        " device_id=) of its env:// rendezvous: fabric_lite creates the rendezvous store itself and passes store="
        " (device_id for CUDA devices only); the timeout reaches the group as in Lightning (the hang and rendezvous"
        " timeouts of tests/distributed/test_reliability.py and test_launchers.py hold it)",
    ),
    "tests_fabric/strategies/test_ddp.py::test_device_id_passed_for_cuda_devices": Difference(
        "private",
        "pins the same exact init_process_group call as test_set_timeout (Lightning's env:// rendezvous, device_id=None"
        " on the CPU): fabric_lite passes its own store= and device_id only for a CUDA device",
    ),
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
    "tests_fabric/plugins/collectives/test_torch_collective.py::test_default_process_group": Difference(
        "private",
        "runs TorchCollective.setup()'s env:// rendezvous in workers of Lightning's spawn launcher, which writes"
        " MASTER_PORT into the launching process's environment for the workers' rank 0 to host the store there (and"
        " calls DDPStrategy._get_process_group_backend); fabric_lite's spawn launcher holds the job's store in the"
        " launching process and hands it to the strategy, so the workers have no MASTER_PORT for a second rendezvous",
    ),
}


#: tests that Lightning's suite itself skips on some machines (a ``skipif`` on what is installed there), which the
#: reference run did not skip: where one is skipped on fabric_lite it is not compared (left out of the total), since
#: Lightning would skip it on that machine too. Only a skip counts so; a failure is a failure.
MACHINE_DEPENDENT: dict[str, str] = {
    "tests_fabric/plugins/environments/test_slurm.py::test_srun_available_and_not_used": (
        "skipped where `srun` is on the PATH (the slurm tier installs slurm-wlm, on CI too)"
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
    #: skipped where Lightning's suite skips them too (:data:`MACHINE_DEPENDENT`): not compared, not in the total
    not_compared: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.passed) + len(self.expected) + len(self.unexpected)


def compare(
    reference: Iterable[str],
    outcomes: Mapping[str, str],
    selected: Sequence[str] = (),
    expected: Mapping[str, Difference] = EXPECTED,
) -> Comparison:
    """Sort the tests of ``reference`` (those that pass on Lightning) by their ``outcomes`` on fabric_lite and the
    ``expected`` differences; with ``selected`` (test paths as given to pytest), only the tests under them."""
    prefixes = [path.rstrip("/") for path in selected]
    passed: list[str] = []
    listed_tests: dict[str, Difference] = {}
    unexpected: dict[str, str] = {}
    stale: list[str] = []
    not_compared: list[str] = []
    for test in reference:
        if prefixes and not any(test == p or test.startswith((p + "/", p + "::")) for p in prefixes):
            continue
        outcome = outcomes.get(test, "not run")
        listed = difference_of(test, expected)
        if outcome == "skipped" and test in MACHINE_DEPENDENT:
            not_compared.append(test)
        elif outcome == "passed":
            passed.append(test)
            if listed is not None:
                stale.append(test)
        elif listed is not None:
            listed_tests[test] = listed
        else:
            unexpected[test] = outcome
    return Comparison(passed, listed_tests, unexpected, stale, not_compared)


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
    lines += [f"  NOT COMPARED ({MACHINE_DEPENDENT[test]}) {test}" for test in result.not_compared]
    return "\n".join(lines)
