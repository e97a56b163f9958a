"""Every script in ``examples/`` runs for real, in its short mode, on two CPU processes (four for the tensor-parallel
one, eight with its pipeline), and shows what it claims.

One launch per example (two for the checkpoint-and-resume examples), each through the launcher its docstring
names: fabric_lite's own (``python examples/X.py``), ``torchrun --nproc-per-node 2`` and ``fabric-lite run``. The
scripts run in a temporary folder, so nothing they write lands in the repository; every launch fails the test if a
process outlives it (``tests.helpers.harness.run_python``).
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, Completed, run_python

pytestmark = pytest.mark.distributed
EXAMPLES = REPO / "examples"
TIMEOUT = 120  # seconds per launch: a few seconds on a quiet machine; generous for a loaded CI runner


def run_example(args: list[str], cwd: Path) -> Completed:
    done = run_python(args, timeout=TIMEOUT, cwd=cwd)
    assert done.returncode == 0, done.output
    return done


def torchrun(script: str, *args: str) -> list[str]:
    return ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(EXAMPLES / script), *args]


def lines_matching(pattern: str, text: str) -> list[re.Match[str]]:
    return [m for m in (re.fullmatch(pattern, line.strip()) for line in text.splitlines()) if m]


@pytest.mark.timeout(2 * TIMEOUT + 30)
def test_plain_loop_and_its_fabric_conversion_print_the_same_losses(tmp_path: Path) -> None:
    plain = run_example([str(EXAMPLES / "plain_loop.py"), "--epochs", "3"], tmp_path)
    converted = run_example([str(EXAMPLES / "fabric_loop.py"), "--epochs", "3", "--devices", "1"], tmp_path)
    plain_losses = lines_matching(r"epoch \d+ loss [\d.]+", plain.stdout)
    assert [m.group(0) for m in plain_losses] == [
        m.group(0) for m in lines_matching(r"epoch \d+ loss [\d.]+", converted.stdout)
    ], converted.output
    assert len(plain_losses) == 3, plain.output
    values = [float(m.group(0).split()[-1]) for m in plain_losses]
    assert values[-1] < values[0], plain.output  # it learns
    assert "training on 1 process(es)" in converted.stdout


@pytest.mark.timeout(TIMEOUT + 30)
def test_fabric_loop_on_two_processes_through_the_cli(tmp_path: Path) -> None:
    done = run_example(
        ["-m", "fabric_lite", "run", "--devices", "2", str(EXAMPLES / "fabric_loop.py"), "--epochs", "2"], tmp_path
    )
    assert "training on 2 process(es)" in done.stdout, done.output
    losses = [float(m.group(1)) for m in lines_matching(r"epoch \d+ loss ([\d.]+)", done.stdout)]
    assert len(losses) == 2 and losses[1] < losses[0], done.output  # printed once (rank 0), and it learns


@pytest.mark.timeout(TIMEOUT + 30)
def test_grad_accumulation_equals_the_big_batch_step(tmp_path: Path) -> None:
    done = run_example([str(EXAMPLES / "grad_accumulation.py"), "--steps", "3"], tmp_path)
    assert "2 process(es) x 4 micro-batches of 8 per optimizer step = 64 samples per step" in done.stdout, done.output
    # inside no_backward_sync each process keeps its own gradients: the sync really is skipped ...
    (inside,) = lines_matching(
        r"step 1: inside no_backward_sync the processes' gradients differ by up to (\S+)", done.stdout
    )
    assert float(inside.group(1)) > 1e-3, done.output
    # ... and the last backward, outside it, averages them
    (after,) = lines_matching(r"step 1: after the synchronising backward they differ by (\S+)", done.stdout)
    assert float(after.group(1)) == 0.0, done.output
    (final,) = lines_matching(r"after 3 steps the weights differ by at most (\S+) \(float rounding\)", done.stdout)
    assert float(final.group(1)) < 1e-6, done.output


@pytest.mark.timeout(TIMEOUT + 30)
def test_distributed_eval_counts_every_sample_once(tmp_path: Path) -> None:
    done = run_example([str(EXAMPLES / "distributed_eval.py"), "--epochs", "1"], tmp_path)
    pattern = r"(.+): (\d+) samples seen \((\d+) counted twice\)  accuracy ([\d.]+)  loss ([\d.]+)"
    rows = {m.group(1).strip(): m.groups()[1:] for m in lines_matching(pattern, done.stdout)}
    assert set(rows) == {"gather_for_metrics", "naive all_gather", "one process"}, done.output
    # 83 samples on 2 processes: the sampler repeats sample 0 to give each process 42
    assert rows["gather_for_metrics"][:2] == ("83", "0"), done.output
    assert rows["naive all_gather"][:2] == ("84", "1"), done.output
    exact, reference = rows["gather_for_metrics"], rows["one process"]
    assert exact[2] == reference[2], done.output  # the same accuracy as one process over the whole set
    assert abs(float(exact[3]) - float(reference[3])) <= 2e-4, done.output  # the same mean loss, up to rounding


@pytest.mark.timeout(2 * TIMEOUT + 30)
def test_char_gpt_resumes_from_its_last_checkpoint_with_the_same_losses(tmp_path: Path) -> None:
    flags = ["--steps", "20", "--save-every", "10", "--log-every", "5"]
    flags += ["--checkpoint-dir", str(tmp_path / "ckpt"), "--log-dir", str(tmp_path / "logs")]
    first = run_example([str(EXAMPLES / "char_gpt.py"), *flags], tmp_path)
    losses = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", first.stdout)}
    assert list(losses) == [5, 10, 15, 20], first.output
    assert float(losses[20]) < float(losses[5]), first.output
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-000010.ckpt", "step-000020.ckpt"]
    assert "sample:\nthe " in first.stdout, first.output
    assert "char_gpt: 20/20 (100%)" in first.stdout, first.output  # rank 0's progress line, printed once
    with open(tmp_path / "logs" / "char_gpt" / "version_0" / "metrics.csv") as f:
        logged = {int(row["step"]): float(row["loss"]) for row in csv.DictReader(f)}
    assert list(logged) == [5, 10, 15, 20] and f"{logged[15]:.4f}" == losses[15], logged

    # take the newest checkpoint away: --resume must pick step 10, and retrace steps 11..20 exactly (model,
    # optimizer and every process's random generator restored), here with the processes started by torchrun
    (tmp_path / "ckpt" / "step-000020.ckpt").unlink()
    second = run_example(torchrun("char_gpt.py", *flags, "--resume"), tmp_path)
    assert f"resumed from {tmp_path / 'ckpt' / 'step-000010.ckpt'} at step 10" in second.stdout, second.output
    assert "training steps 11..20 on 2 process(es)" in second.stdout, second.output
    resumed = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", second.stdout)}
    assert resumed == {15: losses[15], 20: losses[20]}, second.output
    assert (tmp_path / "ckpt" / "step-000020.ckpt").is_file()


@pytest.mark.timeout(TIMEOUT + 30)
def test_train_example_under_torchrun(tmp_path: Path) -> None:
    """``examples/train.py``, the script examples/slurm/train.sbatch runs, with the README's torchrun line."""
    done = run_example(torchrun("train.py", "--epochs", "2", "--checkpoint", str(tmp_path / "t.ckpt")), tmp_path)
    epochs = lines_matching(r"epoch +(\d+)/2  loss ([\d.]+)  accuracy ([\d.]+)  \(.*\)", done.stdout)
    assert [m.group(1) for m in epochs] == ["1", "2"], done.output
    assert float(epochs[1].group(2)) < float(epochs[0].group(2)), done.output
    assert "training on 2 process(es), strategy DDPStrategy" in done.stdout
    assert (tmp_path / "t.ckpt").is_file()


#: the tensor-parallel example's short run
TP_FLAGS = ["--steps", "12", "--save-every", "6", "--log-every", "3", "--batch-size", "16"]


@pytest.fixture(scope="module")
def tensor_parallel_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Completed, Path]:
    """The tensor-parallel example's 12 steps on four processes, 2 tensor-parallel x 2 FSDP, and its folder."""
    tmp_path = tmp_path_factory.mktemp("tensor_parallel")
    return run_example(
        [str(EXAMPLES / "tensor_parallel.py"), *TP_FLAGS, "--checkpoint-dir", "ckpt"], tmp_path
    ), tmp_path


@pytest.mark.timeout(2 * TIMEOUT + 30)
def test_tensor_parallel_resumes_from_its_last_checkpoint_with_the_same_losses(
    tensor_parallel_run: tuple[Completed, Path],
) -> None:
    """Four processes, 2 tensor-parallel x 2 FSDP, then a resume through ``fabric-lite run`` from the step-6
    checkpoint (a sharded folder): mid-epoch, and across the epoch boundary at step 10 (batches of 16 windows)."""
    first, tmp_path = tensor_parallel_run
    flags = [*TP_FLAGS, "--checkpoint-dir", str(tmp_path / "ckpt")]
    assert "on a mesh of 2 data_parallel x 2 tensor_parallel" in first.stdout, first.output
    assert "wq.weight is (64, 64), each process holds (16, 64)" in first.stdout, first.output  # a quarter each
    losses = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", first.stdout)}
    assert list(losses) == [3, 6, 9, 12], first.output  # printed once, by rank 0
    assert float(losses[12]) < float(losses[3]), first.output
    checkpoints = tmp_path / "ckpt"
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000006", "step-000012"], first.output
    assert all(p.is_dir() for p in checkpoints.iterdir())  # torch.distributed.checkpoint folders

    # take the newest checkpoint away: --resume must pick step 6 and retrace steps 7..12 exactly (every process's
    # shards of the model and of AdamW's state restored, the data entered where it was)
    shutil.rmtree(checkpoints / "step-000012")
    launch = ["-m", "fabric_lite", "run", "--devices", "4", str(EXAMPLES / "tensor_parallel.py")]
    second = run_example([*launch, *flags, "--resume"], tmp_path)
    assert f"resumed from {checkpoints / 'step-000006'} at step 6" in second.stdout, second.output
    assert "training steps 7..12 on 4 processes" in second.stdout, second.output
    resumed = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", second.stdout)}
    assert resumed == {9: losses[9], 12: losses[12]}, second.output
    assert sorted(p.name for p in checkpoints.iterdir()) == ["step-000006", "step-000012"], second.output


@pytest.mark.timeout(2 * TIMEOUT + 30)
def test_tensor_parallel_example_with_a_pipeline_prints_the_same_losses(
    tensor_parallel_run: tuple[Completed, Path], tmp_path: Path
) -> None:
    """Eight processes, 2 pipeline stages x 2 FSDP x 2 tensor-parallel (1F1B, a micro-batch per stage): the losses
    of the four-process run without a pipeline, to the printed digits."""
    flags = ["--steps", "6", *TP_FLAGS[2:], "--pipeline-parallel-size", "2", "--checkpoint-dir", "ckpt"]
    done = run_example([str(EXAMPLES / "tensor_parallel.py"), *flags], tmp_path)
    assert "on a mesh of 2 pipeline_parallel x 2 data_parallel x 2 tensor_parallel" in done.stdout, done.output
    assert "training steps 1..6 on 8 processes" in done.stdout, done.output
    losses = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", done.stdout)}
    first = tensor_parallel_run[0]
    expected = {int(m.group(1)): m.group(2) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", first.stdout)}
    assert losses == {3: expected[3], 6: expected[6]}, done.output
    assert (tmp_path / "ckpt" / "step-000006").is_dir()


@pytest.mark.timeout(TIMEOUT + 30)
def test_tensor_parallel_example_on_one_process(tmp_path: Path) -> None:
    """A 1 x 1 mesh parallelises nothing: the parameters stay plain tensors, and the example still trains and saves
    (it once assumed DTensor parameters and failed on one process and on one GPU)."""
    flags = ["--devices", "1", "--data-parallel-size", "1", "--tensor-parallel-size", "1", "--steps", "2"]
    flags += ["--save-every", "2", "--log-every", "1", "--checkpoint-dir", str(tmp_path / "ckpt")]
    done = run_example([str(EXAMPLES / "tensor_parallel.py"), *flags], tmp_path)
    assert "on a mesh of 1 data_parallel x 1 tensor_parallel" in done.stdout, done.output
    assert "wq.weight is (64, 64), each process holds (64, 64)" in done.stdout, done.output
    assert [m.group(1) for m in lines_matching(r"step +(\d+)  loss ([\d.]+)", done.stdout)] == ["1", "2"]
    assert (tmp_path / "ckpt" / "step-000002").is_dir()
