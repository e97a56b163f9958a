"""``torch.compile`` with Fabric under inductor, the default backend, on two processes, and against Lightning Fabric.

* One process: a model compiled with inductor trains to the losses of the eager one.
* Two processes: compiled DDP (inductor) trains as eager DDP, DDP itself is what gets compiled, and the backend,
  ``no_backward_sync``, ``mark_forward_method`` and checkpoints work; FSDP (``aot_eager``) compiles each sharded
  block, not the root.
* Side by side with Lightning Fabric (skipped without its venv: run ``.ci/setup``): the same losses, graphs and
  checkpoint keys.

Inductor compiles with a cache in the session's temporary folder.

The checks that start no process are in tests/unit/test_compile.py.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch

from fabric_lite import Fabric
from tests.helpers.harness import base_env, lightning_python, per_rank, run_job, run_python, spawn_job
from tests.helpers.jobs.compile_jobs import STEPS, Net, train

TOLERANCE = 1e-5


@pytest.fixture
def fabric() -> Fabric:
    return Fabric(accelerator="cpu", devices=1)


@pytest.fixture(scope="session")
def inductor_cache(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(tmp_path_factory.mktemp("inductor_cache"))


def test_inductor_losses_equal_eager(fabric: Fabric, inductor_cache: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", inductor_cache)
    torch.manual_seed(0)
    template = Net()
    runs = {}
    for compiled in (False, True):
        net = copy.deepcopy(template)
        model, optimizer = fabric.setup(
            torch.compile(net) if compiled else net, torch.optim.SGD(net.parameters(), lr=0.1)
        )
        runs[compiled] = train(fabric, model, optimizer)
    assert len(runs[True]) == STEPS
    torch.testing.assert_close(runs[True], runs[False], rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.timeout(300)
def test_ddp_compiled_on_two_processes(inductor_cache: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Compiled DDP (inductor) trains as eager DDP; DDP is what gets compiled; the backend, no_backward_sync,
    mark_forward_method and checkpoints work."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", inductor_cache)  # the ranks inherit the environment
    results = spawn_job(
        "tests.helpers.jobs.compile_jobs:ddp_compile", 2, timeout=240, backend=None, folder=str(tmp_path)
    )
    losses = per_rank(results, "losses")
    for rank in losses:
        assert rank["call"] == "OptimizedModule" and rank["call_wraps_ddp"]
        assert rank["strategy_module"] == "DistributedDataParallel" and rank["inner"] == "Net"
        torch.testing.assert_close(rank["compiled"], rank["eager"], rtol=TOLERANCE, atol=TOLERANCE)
    assert losses[0]["compiled"] != losses[1]["compiled"]  # rank-dependent data
    assert losses[0]["weights"] == losses[1]["weights"]  # gradients averaged
    for rank in per_rank(results, "options_survive"):
        assert rank == {"graphs": 1, "wraps_ddp": True}
    sync = per_rank(results, "no_backward_sync")
    assert sync[0]["local"] != sync[1]["local"] and sync[0]["synced"] == sync[1]["synced"]
    marked = per_rank(results, "marked_method")
    for rank in marked:
        torch.testing.assert_close(rank["score"], rank["eager_score"])
        assert rank["compiled_graphs"] == 1
    assert marked[0]["grad"] == marked[1]["grad"]  # the marked method's backward went through DDP
    expected = sorted(Net().state_dict())
    for rank in per_rank(results, "checkpoint_keys"):
        assert rank == {"True": expected, "True_loaded": True, "False": expected, "False_loaded": True}


@pytest.mark.timeout(300)
def test_fsdp_compiled_block_by_block_on_two_processes(tmp_path: Path) -> None:
    results: list[Any] = run_job(["-m", "tests.helpers.jobs.compile_jobs", "2"], timeout=240)
    ranks = per_rank(results, "losses")
    for rank in ranks:
        assert rank["compiled_modules"] == ["blocks.0", "blocks.1"]  # each sharded block, not the root
        assert rank["call_is_root"]
        assert not any("_orig_mod" in key for key in rank["keys"]) and len(rank["keys"]) == 12
        torch.testing.assert_close(rank["compiled"], rank["eager"], rtol=TOLERANCE, atol=TOLERANCE)
    assert ranks[0]["eager"] != ranks[1]["eager"]


SIDE_BY_SIDE = """
import json, os, tempfile
import torch
from torch import nn
if os.environ["COMPAT_IMPL"] == "lightning":
    from lightning_fabric import Fabric
else:
    from fabric_lite import Fabric

graphs = []
def counting(gm, inputs):
    graphs.append(1)
    return gm.forward

torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 3))
fabric = Fabric(accelerator="cpu", devices=1)
model, optimizer = fabric.setup(torch.compile(net, backend=counting), torch.optim.SGD(net.parameters(), lr=0.1))
losses = []
for step in range(3):
    g = torch.Generator().manual_seed(step)
    x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
    loss = nn.functional.mse_loss(model(x), y)
    fabric.backward(loss)
    optimizer.step()
    optimizer.zero_grad()
    losses.append(loss.item())
with tempfile.TemporaryDirectory() as folder:
    fabric.save(os.path.join(folder, "ckpt"), {"model": model})
    saved = sorted(torch.load(os.path.join(folder, "ckpt"), weights_only=True)["model"])
print("OBS " + json.dumps({"losses": losses, "graphs": len(graphs), "saved": saved,
                           "state_dict": sorted(model.state_dict()), "module": type(model.module).__name__}))
"""


@pytest.mark.compat
@pytest.mark.skipif(lightning_python() is None, reason="no Lightning Fabric venv: run .ci/setup")
@pytest.mark.timeout(180)
def test_same_as_lightning() -> None:
    observed = {}
    for impl, python in (("fabric_lite", None), ("lightning", lightning_python())):
        done = run_python(["-c", SIDE_BY_SIDE], timeout=120, env=base_env({"COMPAT_IMPL": impl}), python=python)
        assert done.returncode == 0, done.output
        observed[impl] = json.loads(next(line[4:] for line in done.stdout.splitlines() if line.startswith("OBS ")))
    assert observed["fabric_lite"] == observed["lightning"]
    assert observed["fabric_lite"]["graphs"] == 1 and observed["fabric_lite"]["module"] == "Sequential"
