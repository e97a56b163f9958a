"""`fabric-lite run`: real launches through torch's elastic agent.

The console script and `python -m fabric_lite` start 2 CPU ranks that run collectives and train; a failing rank ends
the job with the root cause; `--max-restarts 1` after a killed rank resumes from the last checkpoint and ends with
the weights of an uninterrupted run. Every launch is bounded, and every process it started (torchrun's workers live
in sessions of their own) must be gone when it returns.

The checks that start no process (the parser, flag validation, the settings table) are in tests/unit/test_cli.py.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from fabric_lite.cli import (
    build_parser,
    main,
)
from tests.helpers.cluster.processes import run_tagged
from tests.helpers.harness import Completed, base_env, lightning_python, run_python
from tests.helpers.scripts.cli_train import GLOBAL_BATCH, model_optimizer_data
from tests.unit.test_cli import ABS_SCRIPT, LIGHTNING_ORDER, SCRIPT

STEPS = 6


CONSOLE_SCRIPT = Path(sys.executable).parent / "fabric-lite"


def results(done: Completed) -> list[dict[str, Any]]:
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    return sorted(rows, key=lambda row: (row["attempt"], row["rank"]))


def fabric_lite_run(*args: str, timeout: float = 120) -> Completed:
    """`python -m fabric_lite run ARGS` in the repository, bounded, leaving no process behind."""
    return run_tagged(["-m", "fabric_lite", "run", *args], timeout=timeout)


def plain_pytorch_weights(steps: int) -> dict[str, torch.Tensor]:
    """The script's training in one process on the whole global batch, without fabric_lite."""
    model, optimizer, data = model_optimizer_data()
    for step in range(steps):
        start = (step % (len(data) // GLOBAL_BATCH)) * GLOBAL_BATCH
        x, y = data[start : start + GLOBAL_BATCH]
        loss = nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def load(path: Path) -> dict[str, torch.Tensor]:
    return torch.load(path, weights_only=True)  # type: ignore[no-any-return]


@pytest.mark.compat
@pytest.mark.timeout(180)
def test_lightning_parses_the_same_command_lines(tmp_path: Path) -> None:
    python = lightning_python()
    if python is None:
        pytest.skip("no Lightning Fabric venv: run .ci/setup (or set LIGHTNING_PYTHON)")
    code = (
        "import json, sys; from lightning_fabric.cli import _run\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    params = _run.make_context('run', argv).params\n"
        "    print(json.dumps({**params, 'script_args': list(params['script_args'])}))\n"
    )
    argvs = [[ABS_SCRIPT if a == "S" else a for a in argv] for argv, _, _ in LIGHTNING_ORDER]
    done = run_python(["-c", code, json.dumps(argvs)], timeout=120, python=python)
    assert done.returncode == 0, done.output
    for argv, line in zip(argvs, done.stdout.splitlines(), strict=True):
        lightning, ours = json.loads(line), vars(build_parser().parse_args(["run", *argv]))
        names = ["accelerator", "strategy", "devices", "num_nodes", "node_rank", "precision", "script", "script_args"]
        assert {n: ours[n] for n in names} == {n: lightning[n] for n in names}, argv
        given = [a.split("=")[0] for a in argv if a.startswith("--main")]
        for name in ("main_address", "main_port"):  # ours default to a free port; compare what was given
            if f"--{name}" in given or f"--{name.replace('_', '-')}" in given:
                assert ours[name] == lightning[name], (argv, name)


# -------------------------------------------------------------------------------------------------- launch tier
@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> tuple[Completed, Path]:
    """One uninterrupted 2-rank run through the console script, checkpointing every step."""
    folder = tmp_path_factory.mktemp("two_ranks")
    if not CONSOLE_SCRIPT.is_file():
        pytest.fail(f"{CONSOLE_SCRIPT} is missing: reinstall fabric_lite (`pip install -e .`, as .ci/setup does)")
    args = ["run", "--accelerator", "cpu", "--devices", "2", SCRIPT]
    args += ["--out", str(folder / "final.pt"), "--checkpoint", str(folder / "last.ckpt"), "--steps", str(STEPS)]
    env = base_env()
    env.pop("OMP_NUM_THREADS", None)  # the workers' share of the cores (test_workers_share_the_cores_...)
    done = run_tagged(args, timeout=150, env=env, python=str(CONSOLE_SCRIPT))
    return done, folder / "final.pt"


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_console_script_runs_two_ranks_that_train(two_ranks: tuple[Completed, Path]) -> None:
    done, final = two_ranks
    assert done.returncode == 0, done.output
    rows = results(done)
    assert [r["rank"] for r in rows] == [0, 1]
    for row in rows:
        assert (row["world"], row["local_rank"], row["node_rank"]) == (2, row["rank"], 0)
        assert row["total"] == 3.0 and row["gathered"] == [0, 1]
        assert (row["strategy"], row["accelerator"]) == ("DDPStrategy", "CPUAccelerator")
        assert row["torchelastic"] and row["start_step"] == 0
    # torchrun's agent started both ranks: fabric.launch() started no process of its own
    assert rows[0]["ppid"] == rows[1]["ppid"] and rows[1]["ppid"] != rows[0]["pid"]
    # DDP over two halves of the global batch ends where one process on the whole batch does
    trained, reference = load(final), plain_pytorch_weights(STEPS)
    assert trained.keys() == reference.keys()
    for key in trained:
        torch.testing.assert_close(trained[key], reference[key], rtol=0, atol=1e-6)
    assert not torch.equal(trained["0.weight"], model_optimizer_data()[0].state_dict()["0.weight"])


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_python_dash_m_passes_precision_to_fabric(tmp_path: Path) -> None:
    done = fabric_lite_run("--accelerator", "cpu", "--devices", "2", "--precision", "64-true", SCRIPT, "--steps", "1")
    assert done.returncode == 0, done.output
    rows = results(done)
    assert [r["rank"] for r in rows] == [0, 1]
    assert all(r["precision"] == "DoublePrecision" and r["dtype"] == "torch.float64" for r in rows), rows
    assert all(r["total"] == 3.0 and r["gathered"] == [0, 1] for r in rows)
    assert all(r["threads"] == ["1", 1] for r in rows), rows  # OMP_NUM_THREADS=1 from the test's environment, kept


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_fabric_argument_that_disagrees_with_the_cli_ends_the_job() -> None:
    done = fabric_lite_run("--accelerator", "cpu", "--devices", "2", SCRIPT, "--fabric-devices", "3")
    assert done.returncode == 1, done.output
    expected = "Your code has `Fabric(devices=3, ...)` but it conflicts with the value `--devices=2` set through"
    assert expected in done.stderr, done.output
    assert "Root Cause" in done.stderr and "RESULT" not in done.stdout


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_failing_rank_ends_the_job_and_is_reported_as_the_root_cause() -> None:
    done = fabric_lite_run("--accelerator", "cpu", "--devices", "2", SCRIPT, "--fail-rank", "1")
    assert done.returncode == 1, done.output
    report = done.stderr.split("Root Cause (first observed failure):", 1)
    assert len(report) == 2, done.output
    assert "rank      : 1 (local_rank: 1)" in report[1], done.output
    assert "RuntimeError: rank 1 fails on purpose at step 1" in report[1], done.output
    assert "fabric-lite run: the job failed." in done.stderr
    # the same verdict, in the same words, as fabric_lite's own launchers give
    expected = "fabric-lite run: root cause: rank 1 (local rank 1, pid "
    assert expected in done.stderr and "failed with exit code 1: RuntimeError: rank 1 fails on purpose" in done.stderr
    assert "RESULT" not in done.stdout


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_max_restarts_resumes_from_the_last_checkpoint_to_the_same_weights(
    two_ranks: tuple[Completed, Path], tmp_path: Path
) -> None:
    uninterrupted_run, uninterrupted = two_ranks
    assert uninterrupted_run.returncode == 0, uninterrupted_run.output
    kill_step = 3
    args = ["--accelerator", "cpu", "--devices", "2", "--max-restarts", "1", SCRIPT, "--steps", str(STEPS)]
    args += ["--out", str(tmp_path / "final.pt"), "--checkpoint", str(tmp_path / "last.ckpt")]
    done = fabric_lite_run(*args, "--kill-rank", "1", "--kill-step", str(kill_step), timeout=200)
    assert done.returncode == 0, done.output
    rows = results(done)
    # only the second attempt finished, on both ranks, from a checkpoint the first attempt wrote
    assert [(r["attempt"], r["rank"]) for r in rows] == [(1, 0), (1, 1)], done.output
    start = rows[0]["start_step"]
    assert 0 < start <= kill_step and rows[1]["start_step"] == start, rows
    resumed, reference = load(tmp_path / "final.pt"), load(uninterrupted)
    assert resumed.keys() == reference.keys()
    for key in resumed:
        assert torch.equal(resumed[key], reference[key]), key


# ------------------------------------------------------------------- Lightning's launch semantics: no launch() call
NO_LAUNCH = "tests/helpers/scripts/cli_no_launch.py"


def check_trained_two_ranks(done: Completed, final: Path) -> list[dict[str, Any]]:
    """Both ranks joined one group of 2 right after Fabric(), ran rank-dependent collectives, got their halves of
    the data from a DistributedSampler, and trained to the weights of one process on the whole global batch."""
    assert done.returncode == 0, done.output
    rows = [json.loads(line.split(" ", 1)[1]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    rows.sort(key=lambda row: row["rank"])
    assert [r["rank"] for r in rows] == [0, 1], done.output
    for row in rows:
        assert (row["world"], row["initialized"], row["group_world"]) == (2, True, 2)
        assert row["total"] == 3.0 and row["gathered"] == [10, 20]
        assert row["sampler"] == "DistributedSampler" and row["loader_sampler_is_distributed"]
    assert rows[0]["indices"] == [0, 2, 4, 6, 8, 10] and rows[1]["indices"] == [1, 3, 5, 7, 9, 11]
    trained, reference = load(final), plain_pytorch_weights(STEPS)
    for key in reference:
        torch.testing.assert_close(trained[key], reference[key], rtol=0, atol=1e-6)
    return rows


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_script_without_launch_runs_under_the_console_script(tmp_path: Path) -> None:
    if not CONSOLE_SCRIPT.is_file():
        pytest.fail(f"{CONSOLE_SCRIPT} is missing: reinstall fabric_lite (`pip install -e .`, as .ci/setup does)")
    # Lightning's order: the flags after SCRIPT, with `=`; --out and --steps are the script's
    args = ["run", NO_LAUNCH, "--accelerator=cpu", "--devices=2", "--strategy=ddp"]
    args += ["--out", str(tmp_path / "final.pt"), "--steps", str(STEPS)]
    done = run_tagged(args, timeout=150, python=str(CONSOLE_SCRIPT))
    check_trained_two_ranks(done, tmp_path / "final.pt")


@pytest.fixture(scope="module")
def subclass_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """A Fabric subclass's ``run`` under the CLI, then ``launch()`` and ``launch(fn)`` on that object: one run."""
    final = tmp_path_factory.mktemp("subclass_run") / "final.pt"
    done = fabric_lite_run(
        "--accelerator=cpu", "--devices=2", "--strategy=ddp", NO_LAUNCH,
        "--out", str(final), "--steps", str(STEPS), "--run-method", "--then-launch",
    )  # fmt: skip
    return check_trained_two_ranks(done, final)


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_launch_in_a_script_started_by_the_cli_is_harmless(subclass_run: list[dict[str, Any]]) -> None:
    for row in subclass_run:
        # launch() returns at once; launch(fn, 5) runs fn(fabric, 5) in this process, in the same process group
        assert row["launch_returns"] is None and row["launch_fn_returns"] == 5 * (1 + 2)
        assert row["same_group"]


@pytest.mark.distributed
@pytest.mark.timeout(180)
def test_fabric_subclass_run_under_the_cli(subclass_run: list[dict[str, Any]]) -> None:
    assert [row["via"] for row in subclass_run] == ["run", "run"]


# ------------------------------------------------------------------------------------- fabric-lite consolidate
@pytest.fixture(scope="module")
def sharded_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A sharded checkpoint folder that 2 FSDP ranks wrote, started by `fabric-lite run --strategy=fsdp`."""
    folder = tmp_path_factory.mktemp("fsdp")
    done = fabric_lite_run(
        "--accelerator=cpu",
        "--devices=2",
        "--strategy=fsdp",
        "tests/helpers/scripts/fsdp_save.py",
        str(folder),
        timeout=200,
    )
    assert done.returncode == 0, done.output
    return folder


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_consolidate_a_two_rank_fsdp_checkpoint_into_a_file_torch_loads(sharded_checkpoint: Path) -> None:
    target = sharded_checkpoint / "whole.ckpt"
    done = run_python(["-m", "fabric_lite", "consolidate", str(sharded_checkpoint / "sharded"),
                       f"--output_file={target}"], timeout=60)  # fmt: skip
    assert done.returncode == 0, done.output
    assert f"wrote {target}" in done.stdout
    checkpoint = torch.load(target, weights_only=True)
    assert sorted(checkpoint) == ["model", "optimizer", "step"] and checkpoint["step"] == 3
    expected = torch.load(sharded_checkpoint / "expected.pt", weights_only=True)
    assert checkpoint["model"].keys() == expected.keys()
    for key in expected:
        assert torch.equal(checkpoint["model"][key], expected[key]), key
    # the whole weights load into the plain model, without fabric_lite
    plain = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
    plain.load_state_dict(checkpoint["model"])
    assert torch.equal(plain[2].weight, expected["2.weight"])
    # an existing output file is never overwritten (as in Lightning)
    again = run_python(["-m", "fabric_lite", "consolidate", str(sharded_checkpoint / "sharded"),
                        "--output_file", str(target)], timeout=60)  # fmt: skip
    assert again.returncode == 1 and str(target) in again.stderr
    assert "The path for the converted checkpoint already exists" in again.stderr  # Lightning's wording


@pytest.mark.distributed
@pytest.mark.timeout(240)
def test_consolidate_writes_beside_the_folder_by_default(sharded_checkpoint: Path) -> None:
    assert main(["consolidate", str(sharded_checkpoint / "sharded")]) == 0
    written = sharded_checkpoint / "sharded.consolidated"  # Lightning's default name
    expected = torch.load(sharded_checkpoint / "expected.pt", weights_only=True)
    model = torch.load(written, weights_only=True)["model"]
    assert all(torch.equal(model[key], expected[key]) for key in expected)


@pytest.mark.distributed
@pytest.mark.timeout(150)
def test_workers_share_the_cores_when_omp_num_threads_is_unset(
    two_ranks: tuple[Completed, Path], tmp_path: Path
) -> None:
    """torchrun would give every worker one thread (and warn); Lightning's CLI gives each all the cores. (A value
    the user set is kept: test_python_dash_m_passes_precision_to_fabric.)"""
    cores = len(os.sched_getaffinity(0))
    two_ranks_run = two_ranks[0]  # started without OMP_NUM_THREADS
    assert two_ranks_run.returncode == 0, two_ranks_run.output
    share = max(1, cores // 2)
    assert [row["threads"] for row in results(two_ranks_run)] == [[str(share), share]] * 2, two_ranks_run.output
    assert "Setting OMP_NUM_THREADS" not in two_ranks_run.stderr
    script = tmp_path / "threads.py"
    script.write_text(
        "import os, torch\n"
        "print('THREADS', os.environ['RANK'], os.environ['OMP_NUM_THREADS'], torch.get_num_threads(), flush=True)\n"
    )
    env = base_env()
    env.pop("OMP_NUM_THREADS", None)
    done = run_python(["-m", "fabric_lite", "run", "--accelerator=cpu", "--devices=1", str(script)], env=env)
    assert done.returncode == 0, done.output
    rows = [line.split()[1:] for line in done.stdout.splitlines() if line.startswith("THREADS")]
    assert rows == [["0", str(cores), str(cores)]], done.output
    assert "Setting OMP_NUM_THREADS" not in done.stderr
