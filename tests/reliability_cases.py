"""Where each case of RELIABILITY.md is tested: the index behind the reliability tier.

``tests/conftest.py`` marks every test listed here with ``reliability`` (so ``pytest -m reliability`` runs the
whole tier) and, with ``--reliability-report``, prints one row per case: its tests' results, their longest run and
the time to fail that tests record with ``record_property("time_to_fail_s", ...)``. A test id here is matched as a
prefix of the test's node id (so it covers every parametrisation); ``tests/unit/test_reliability_index.py`` checks that
every case has tests and that every id names a test that exists.
"""

from __future__ import annotations

CASES: dict[int, tuple[str, tuple[str, ...]]] = {
    1: (
        "a rank raises mid-training: the job ends fast, the failing rank's traceback is the root cause",
        (
            "tests/distributed/test_launchers.py::test_a_raising_rank_ends_the_job_and_is_reported_as_root_cause",
            "tests/distributed/test_launchers.py::test_three_ranks_middle_rank_fails",
            "tests/distributed/test_launchers.py::test_a_child_reports_its_error_before_its_exit_handlers_run",
            "tests/distributed/test_launchers.py::test_spawn_failure_reports_the_worker_traceback",
        ),
    ),
    2: (
        "rank 0 (the launcher) raises: no orphans",
        (
            "tests/distributed/test_launchers.py::test_a_raising_rank_ends_the_job_and_is_reported_as_root_cause",
            "tests/distributed/test_launchers.py::test_killing_the_launcher_leaves_no_orphans",
        ),
    ),
    3: (
        "a rank dies by SIGKILL, segfault, or exits 0 early: named, the others fail fast",
        (
            "tests/distributed/test_launchers.py::test_a_rank_killed_by_a_signal_is_named",
            "tests/distributed/test_launchers.py::test_a_rank_that_exits_0_early_is_named_as_the_root_cause",
            "tests/distributed/test_launchers.py::test_busy_rank_zero_is_stopped_after_a_child_fails",
            "tests/distributed/test_reliability.py::test_sigkill_of_a_rank_is_reported_within_seconds",
        ),
    ),
    4: (
        "a rank alive but stuck: the others raise within T naming the collective and the missing rank",
        ("tests/distributed/test_launchers.py::test_process_group_timeout_ends_a_job_with_a_stuck_rank",),
    ),
    5: (
        "SIGTERM/SIGINT to the launcher are forwarded; SIGKILL to it leaves no orphan",
        (
            "tests/distributed/test_launchers.py::test_sigterm_to_the_launcher_reaches_every_rank",
            "tests/distributed/test_launchers.py::test_sigint_to_the_launcher_interrupts_every_rank",
            "tests/distributed/test_launchers.py::test_killing_the_launcher_leaves_no_orphans",
        ),
    ),
    6: (
        "torchrun/SLURM settings disagree with Fabric(...): an error naming both, on every rank; no spawning",
        (
            "tests/distributed/test_launchers.py::test_torchrun_mismatch_ends_the_job_with_the_error",
            "tests/distributed/test_launchers.py::test_torchrun_mismatch_is_an_error_on_each_rank_without_waiting_for_a_peer",
            "tests/distributed/test_launchers.py::test_slurm_mismatch_is_an_error_on_every_rank",
            "tests/distributed/test_launchers.py::test_torchrun_starts_the_processes_not_fabric_lite",
            "tests/distributed/test_launchers.py::test_slurm_environment_runs_without_starting_processes",
            "tests/unit/test_plan.py::test_torchelastic_mismatch",
            "tests/unit/test_plan.py::test_slurm_mismatch",
        ),
    ),
    7: (
        "torchrun --max-restarts: a rank killed once, resumed from the checkpoint to the same weights",
        ("tests/distributed/test_resume.py::test_torchrun_restart_after_a_killed_rank_resumes_to_identical_weights",),
    ),
    8: (
        "every reduce op and dtype, all_gather, broadcast from any source, barrier, reduce_boolean_decision",
        (
            "tests/distributed/test_collectives_dist.py::test_all_reduce_every_op_and_dtype",
            "tests/distributed/test_collectives_dist.py::test_all_gather_adds_a_leading_world_dimension",
            "tests/distributed/test_collectives_dist.py::test_broadcast_tensor_from_every_source",
            "tests/distributed/test_collectives_dist.py::test_broadcast_object_from_every_source",
            "tests/distributed/test_collectives_dist.py::test_barrier",
            "tests/distributed/test_collectives_dist.py::test_reduce_boolean_decision",
        ),
    ),
    9: (
        "uneven shapes in a gather: correct per-rank results or a clear error, never wrong data",
        (
            "tests/distributed/test_collectives_dist.py::test_all_gather_mismatch_raises_on_every_rank_with_a_table",
            "tests/distributed/test_distributed_utils.py::test_gather_all_tensors_of_different_shapes",
            "tests/distributed/test_distributed_utils.py::test_gather_all_tensors_ndim_mismatch_names_every_rank",
            "tests/distributed/test_distributed_utils.py::test_all_gather_ddp_shape_mismatch_raises_on_every_rank",
        ),
    ),
    10: (
        "mismatched shapes/dtypes/collectives: an error on every rank naming them, never an abort or a hang",
        (
            "tests/distributed/test_collectives_dist.py::test_all_reduce_mismatch_raises_on_every_rank_with_a_table",
            "tests/distributed/test_collectives_dist.py::test_debug_mode_",
            "tests/distributed/test_reliability.py::test_mismatched_collectives_fail_on_every_rank_naming_them",
        ),
    ),
    11: (
        "an unpicklable object to broadcast: an error naming the type; nobody waits forever",
        ("tests/distributed/test_collectives_dist.py::test_broadcast_unpicklable",),
    ),
    12: (
        "collectives before launch(): a RuntimeError saying to launch; one device: identity, barrier a no-op",
        (
            "tests/unit/test_collectives_single.py::test_collectives_before_launch_raise",
            "tests/unit/test_collectives_single.py::test_single_",
            "tests/unit/test_misuse.py::test_collectives_and_setup_before_launch",
        ),
    ),
    13: (
        "unknown accelerator, strategy, precision, devices, num_nodes: the value and the accepted forms",
        (
            "tests/unit/test_plan.py::test_accelerator_invalid_name",
            "tests/unit/test_plan.py::test_accelerator_missing_on_this_machine",
            "tests/unit/test_plan.py::test_cpu_devices_invalid",
            "tests/unit/test_plan.py::test_cuda_devices_invalid",
            "tests/unit/test_plan.py::test_num_nodes_invalid",
            "tests/unit/test_plan.py::test_strategy_invalid_name",
            "tests/unit/test_plan.py::test_precision_invalid",
        ),
    ),
    14: (
        "misuse of the API: a precise error before any process waits",
        ("tests/unit/test_misuse.py::test_", "tests/distributed/test_misuse.py::test_"),
    ),
    15: (
        "a save that fails mid-way (pickling error, interrupt, SIGKILL): the previous checkpoint intact, no temp",
        (
            "tests/unit/test_checkpoints.py::test_failed_pickling_leaves_the_previous_checkpoint",
            "tests/unit/test_checkpoints.py::test_interrupted_save_leaves_the_previous_checkpoint",
            "tests/distributed/test_checkpoints.py::test_sigkill_mid_write_leaves_the_previous_checkpoint",
            "tests/distributed/test_checkpoints.py::test_a_live_writers_temporary_file_is_left_alone",
            "tests/unit/test_checkpoints.py::test_first_failed_save_leaves_nothing",
        ),
    ),
    16: (
        "a save that cannot be written raises on every rank with the path",
        (
            "tests/unit/test_checkpoints.py::test_path_under_a_regular_file",
            "tests/unit/test_checkpoints.py::test_path_that_is_a_folder",
            "tests/unit/test_checkpoints.py::test_disk_full_leaves_the_previous_checkpoint",
            "tests/distributed/test_checkpoints.py::test_really_full_filesystem",
            "tests/distributed/test_checkpoints.py::test_two_ranks_a_failed_save_raises_on_both",
        ),
    ),
    17: (
        "loading a truncated, empty or foreign file: an error naming the path",
        (
            "tests/unit/test_checkpoints.py::test_corrupt_file_raises_naming_the_path",
            "tests/unit/test_checkpoints.py::test_foreign_file_raises_naming_the_path",
            "tests/unit/test_checkpoints.py::test_folder_instead_of_a_file",
            "tests/unit/test_checkpoints.py::test_missing_file",
        ),
    ),
    18: (
        "a malicious pickle is refused, its payload never runs, no silent retry",
        (
            "tests/unit/test_checkpoints.py::test_malicious_file_is_refused_and_its_payload_never_runs",
            "tests/unit/test_checkpoints.py::test_weights_only_false_loads_a_trusted_file",
        ),
    ),
    19: (
        "strict loading names the missing keys; strict=False returns the remainder",
        (
            "tests/unit/test_checkpoints.py::test_strict_load_names_every_missing_key",
            "tests/unit/test_checkpoints.py::test_non_strict_load_restores_what_is_there",
        ),
    ),
    20: (
        "two-rank save and load: one writer, complete before anyone returns, identical parameters",
        (
            "tests/distributed/test_checkpoints.py::test_two_ranks_exactly_one_writer",
            "tests/distributed/test_checkpoints.py::test_two_ranks_return_only_after_the_file_is_complete",
            "tests/distributed/test_checkpoints.py::test_two_ranks_hold_identical_state_after_loading",
        ),
    ),
    21: (
        "train 10, or 5 + save + restart + load + 5: identical weights (RNG and sampler state included)",
        (
            "tests/distributed/test_resume.py::test_stop_and_resume_ends_with_identical_weights",
            "tests/distributed/test_resume.py::test_without_the_random_state_the_resumed_run_differs",
            "tests/distributed/test_resume_anywhere.py::test_sigkill_at_a_random_step_then_resume_gives_identical_weights",
        ),
    ),
    22: (
        "DDP gradients identical across ranks, equal to single-process; 10 steps equal raw DDP bit for bit",
        (
            "tests/distributed/test_ddp_training.py::test_ten_steps_equal_raw_ddp_bit_for_bit",
            "tests/distributed/test_ddp_training.py::test_gradients_identical_across_ranks",
            "tests/distributed/test_ddp_training.py::test_gradients_match_single_process_on_the_global_batch",
        ),
    ),
    23: (
        "no_backward_sync: local gradients inside, big-batch gradients after the synced step",
        ("tests/distributed/test_ddp_training.py::test_no_backward_sync_accumulates_locally_then_syncs",),
    ),
    24: (
        "distributed evaluation over 5 or 82 samples: exactly N samples, no duplicates",
        ("tests/distributed/test_distributed_utils.py::test_gather_for_metrics_sees_every_sample_once_in_order",),
    ),
    25: (
        "ranks with different numbers of batches: equalised, or a clear error at setup, never a hang",
        ("tests/distributed/test_reliability.py::test_uneven_data_is_equalised_or_refused",),
    ),
    26: (
        "soak: 10k all_reduce, 5k all_gather, 2k broadcast, 5k barrier; values checked, memory flat",
        ("tests/distributed/test_reliability.py::test_soak_thousands_of_collectives_values_checked_memory_flat",),
    ),
    27: (
        "20 launch-train-teardown cycles in one process; 4 two-rank jobs at once without a port",
        (
            "tests/distributed/test_reliability.py::test_twenty_launch_train_teardown_cycles_in_one_process",
            "tests/distributed/test_reliability.py::test_four_two_rank_jobs_started_at_once_without_a_port",
        ),
    ),
    28: (
        "MASTER_PORT busy: fails at once naming it; a rank that never starts: how many joined",
        (
            "tests/distributed/test_launchers.py::test_busy_master_port_fails_at_once_naming_the_port",
            "tests/distributed/test_launchers.py::test_a_rank_that_never_starts_is_reported_with_how_many_joined",
            "tests/distributed/test_launchers.py::test_fork_launcher_forks_before_the_store_has_a_server_thread",
        ),
    ),
    29: (
        "a job that ends normally exits 0 on every rank, every time (no gloo abort at exit)",
        ("tests/distributed/test_reliability.py::test_jobs_that_end_normally_exit_0_on_every_rank_every_time",),
    ),
}


def cases_of(nodeid: str) -> list[int]:
    """The cases a test (by node id) belongs to."""
    return [case for case, (_, tests) in CASES.items() if any(nodeid.startswith(test) for test in tests)]
