"""Every precision on two real gloo ranks with DistributedDataParallel."""

from __future__ import annotations

import warnings
from dataclasses import replace

import pytest
import torch
from torch import nn

from fabric_lite.plugins.precision import DoublePrecision, HalfPrecision, MixedPrecision, Precision
from fabric_lite.runtime.run import RunContext
from fabric_lite.strategies import DDPStrategy
from tests.helpers.harness import spawn_job

pytestmark = pytest.mark.distributed

EXPECTED_DTYPES = {
    "32-true": ("torch.float32", "torch.float32"),
    "64-true": ("torch.float64", "torch.float64"),
    "bf16-mixed": ("torch.float32", "torch.float32"),
    "16-mixed-scaler": ("torch.float32", "torch.float32"),
    "16-true": ("torch.float16", "torch.float16"),
    "bf16-true": ("torch.bfloat16", "torch.bfloat16"),
}


@pytest.fixture(scope="module")
def runs() -> list[dict]:
    return spawn_job("tests.distributed.test_precision_dist:all_precisions", 2, timeout=120)


PRECISIONS = ["32-true", "64-true", "bf16-mixed", "16-mixed-scaler", "16-true", "bf16-true"]


@pytest.mark.parametrize("name", PRECISIONS)
def test_dtypes_and_identical_weights_on_both_ranks(runs: list[dict], name: str) -> None:
    r0, r1 = runs[0][name], runs[1][name]
    assert (r0["param_dtype"], r0["grad_dtype"]) == EXPECTED_DTYPES[name]
    assert r0["params"] == r1["params"]  # DDP kept the replicas identical
    assert r0["losses"] != r1["losses"]  # the ranks saw different data


def test_an_overflow_on_one_rank_makes_every_rank_skip_the_step(runs: list[dict]) -> None:
    for rank in range(2):
        run = runs[rank]["16-mixed-scaler"]
        assert run["skipped"] == [False, True, False], f"rank {rank}"
        assert run["scale"] == 512.0, f"rank {rank}"


# ------------------------------------------------- the job: run on every rank by tests/helpers/jobs/_runner.py


def _plugin(name: str) -> Precision:
    if name == "16-mixed-scaler":
        return MixedPrecision("16-mixed", "cpu", scaler=torch.amp.GradScaler("cpu", init_scale=1024.0))
    if name == "bf16-mixed":
        return MixedPrecision("bf16-mixed", "cpu")
    if name in ("16-true", "bf16-true"):
        return HalfPrecision(name)
    return DoublePrecision() if name == "64-true" else Precision()


def run_precision(fabric, name: str) -> dict:
    """Train 3 steps with precision ``name`` on a DDP strategy sharing this job's process group."""
    strategy = DDPStrategy(start_method="popen")
    strategy.precision = _plugin(name)
    strategy.accelerator = fabric.accelerator
    strategy.parallel_devices = [torch.device("cpu")] * fabric.world_size
    strategy.cluster_environment = fabric.strategy.cluster_environment
    strategy.attach_run(replace(RunContext.from_environment(), local_rank=fabric.local_rank))
    strategy._set_world_ranks()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
    precision = strategy.precision
    net = precision.convert_module(net)
    model = strategy.setup_module(net)
    optimizer = torch.optim.SGD(net.parameters(), lr=0.1)
    rank = fabric.global_rank
    losses, skipped = [], []
    for step in range(3):
        x = torch.full((2, 4), float(rank + step + 1)) / 4
        with precision.forward_context():
            out = model(precision.convert_input(x))
        loss = precision.convert_output(out).pow(2).mean()
        if name == "16-mixed-scaler" and step == 1 and rank == 1:
            loss = loss * float("inf")  # an overflow on one rank only; DDP's all-reduce carries it to every rank
        optimizer.zero_grad()
        strategy.backward(loss, model)
        before = [p.detach().clone() for p in net.parameters()]
        strategy.optimizer_step(optimizer)
        skipped.append(all(torch.equal(a, b) for a, b in zip(before, net.parameters(), strict=True)))
        losses.append(loss.item())
    scaler = getattr(precision, "scaler", None)
    return {
        "param_dtype": str(next(net.parameters()).dtype),
        "grad_dtype": str(next(net.parameters()).grad.dtype),
        "params": [v for p in net.parameters() for v in p.detach().float().flatten().tolist()],
        "losses": losses,
        "skipped": skipped,
        "scale": scaler.get_scale() if scaler is not None else None,
    }


def all_precisions(fabric) -> dict:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return {name: run_precision(fabric, name) for name in PRECISIONS}
