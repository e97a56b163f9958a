"""DDP training: fabric_lite matches raw DistributedDataParallel bit for bit, and gradient accumulation works."""

from __future__ import annotations

import pickle

import pytest
import torch
from torch import nn

from tests.helpers.harness import run_python, spawn_job
from tests.helpers.jobs.training import make_model, micro_batch

pytestmark = pytest.mark.distributed


def _load_flat(model: nn.Module, values: list[float]) -> None:
    with torch.no_grad():
        offset = 0
        for p in model.parameters():
            n = p.numel()
            p.copy_(torch.tensor(values[offset : offset + n]).view_as(p))
            offset += n


@pytest.fixture(scope="module")
def fabric_run() -> list[dict]:
    return spawn_job("tests.helpers.jobs.training:fabric_ddp_train", 2)


@pytest.fixture(scope="module")
def raw_run(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    out = tmp_path_factory.mktemp("raw") / "raw.pkl"
    done = run_python(["tests/helpers/scripts/raw_ddp.py", str(out)], timeout=90)
    assert done.returncode == 0, done.output
    return pickle.loads(out.read_bytes())  # type: ignore[no-any-return]


def test_ten_steps_equal_raw_ddp_bit_for_bit(fabric_run: list[dict], raw_run: list[dict]) -> None:
    for rank in range(2):
        assert fabric_run[rank]["losses"] == raw_run[rank]["losses"]
        assert fabric_run[rank]["grads"] == raw_run[rank]["grads"]
        assert fabric_run[rank]["params"] == raw_run[rank]["params"]


def test_gradients_identical_across_ranks(fabric_run: list[dict]) -> None:
    for step in range(10):
        assert fabric_run[0]["grads"][step] == fabric_run[1]["grads"][step]
    assert fabric_run[0]["params"] == fabric_run[1]["params"]


def test_ranks_see_different_batches(fabric_run: list[dict]) -> None:
    assert fabric_run[0]["batches"][0] != fabric_run[1]["batches"][0]


def test_gradients_match_single_process_on_the_global_batch(fabric_run: list[dict]) -> None:
    model = make_model()
    _load_flat(model, fabric_run[0]["initial"])
    x = torch.cat([torch.tensor(fabric_run[r]["batches"][0][0]) for r in range(2)])
    y = torch.cat([torch.tensor(fabric_run[r]["batches"][0][1]) for r in range(2)])
    nn.functional.mse_loss(model(x), y).backward()
    expected = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
    torch.testing.assert_close(torch.tensor(fabric_run[0]["grads"][0]), expected, rtol=0, atol=1e-6)


def test_no_backward_sync_accumulates_locally_then_syncs() -> None:
    runs = spawn_job("tests.helpers.jobs.training:fabric_accumulate", 2)
    # inside the context the gradients are each rank's own
    assert runs[0]["inside"][0] != runs[1]["inside"][0]
    assert runs[0]["final"] == runs[1]["final"]
    # after the synchronised step: the mean over ranks of each rank's gradient summed over its micro-batches
    model = make_model()
    _load_flat(model, runs[0]["initial"])
    total = None
    for rank in range(2):
        model.zero_grad()
        for micro in range(3):
            x, y = micro_batch(rank, micro)
            nn.functional.mse_loss(model(x), y).backward()
        grads = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        total = grads if total is None else total + grads
    torch.testing.assert_close(torch.tensor(runs[0]["final"]), total / 2, rtol=0, atol=1e-6)
    # and the local gradient after the first micro-batch is that rank's own
    model.zero_grad()
    x, y = micro_batch(1, 0)
    nn.functional.mse_loss(model(x), y).backward()
    torch.testing.assert_close(
        torch.tensor(runs[1]["inside"][0]),
        torch.cat([p.grad.reshape(-1) for p in model.parameters()]),
        rtol=0,
        atol=1e-7,
    )
