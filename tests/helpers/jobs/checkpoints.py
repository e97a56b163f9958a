"""``Fabric.save``/``load`` on two ranks (run by tests/distributed/test_checkpoints.py through
``tests.helpers.harness.spawn_job``).

:func:`observe` returns plain observations per check (or the traceback of a failed check); the test asserts.
"""

from __future__ import annotations

import os
import time
import traceback
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fabric_lite.runtime.checkpoint import CheckpointError

WRITE_DELAY = 0.5  # seconds rank 0 spends before writing: a rank that returned early would find no file


class Unpicklable:
    def __reduce__(self):  # type: ignore[no-untyped-def]
        raise RuntimeError("this object refuses to be pickled")


def _flat_parameters(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()])


def _model_and_optimizer(fabric: Any) -> tuple[Any, Any, nn.Module]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2))
    fmodel, foptimizer = fabric.setup(model, torch.optim.Adam(model.parameters(), lr=0.05))
    # one step on rank-dependent data, so that the optimizer has state
    x = torch.arange(8, dtype=torch.float32).reshape(2, 4) + fabric.global_rank
    fabric.backward(fmodel(x).pow(2).sum())
    foptimizer.step()
    foptimizer.zero_grad()
    return fmodel, foptimizer, model


def check_save_then_load(fabric: Any, folder: str) -> dict[str, Any]:
    rank = fabric.global_rank
    path = Path(folder) / "two_ranks.ckpt"
    fmodel, foptimizer, model = _model_and_optimizer(fabric)
    saved_parameters = _flat_parameters(model).clone()

    writers: list[int] = []
    real_save = torch.save

    def recording_save(obj, f, *args, **kwargs):  # type: ignore[no-untyped-def]
        writers.append(rank)
        time.sleep(WRITE_DELAY)
        return real_save(obj, f, *args, **kwargs)

    torch.save = recording_save
    try:
        started = time.monotonic()
        fabric.save(path, {"model": fmodel, "optimizer": foptimizer, "step": 3})
        save_seconds = time.monotonic() - started
    finally:
        torch.save = real_save
    # checked before any other collective: the file must be complete the moment save returns, on every rank
    exists_on_return = path.is_file()
    content = torch.load(path, weights_only=True) if exists_on_return else {}
    file_matches = exists_on_return and torch.equal(
        torch.cat([v.reshape(-1) for v in content["model"].values()]), saved_parameters
    )
    leftovers = sorted(name for name in os.listdir(folder) if name != path.name)

    # make every rank's parameters and optimizer state different, then load
    with torch.no_grad():
        for p in model.parameters():
            p.add_(rank + 1.0)
    for state in foptimizer.optimizer.state.values():
        state["exp_avg"].fill_(rank + 5.0)
    loaded_state = {"model": fmodel, "optimizer": foptimizer, "step": 0}
    remainder = fabric.load(path, loaded_state)
    parameters = _flat_parameters(model)
    exp_avg = torch.cat([s["exp_avg"].reshape(-1) for s in foptimizer.optimizer.state.values()])
    gathered_parameters = fabric.all_gather(parameters)
    gathered_exp_avg = fabric.all_gather(exp_avg)
    return {
        "writers": writers,
        "save_seconds": save_seconds,
        "exists_on_return": exists_on_return,
        "file_matches": bool(file_matches),
        "file_keys": sorted(content),
        "model_keys": sorted(content.get("model", {})),
        "expected_model_keys": sorted(model.state_dict()),
        "leftovers": leftovers,
        "loaded_equals_saved": torch.equal(parameters, saved_parameters),
        "ranks_identical": torch.equal(gathered_parameters[0], gathered_parameters[1]),
        "exp_avg_identical": torch.equal(gathered_exp_avg[0], gathered_exp_avg[1]),
        "exp_avg_restored": not bool((exp_avg == rank + 5.0).all()),
        "step": loaded_state["step"],
        "remainder": sorted(remainder),
    }


def _save_error(fabric: Any, path: Path, state: dict[str, Any]) -> dict[str, Any]:
    try:
        fabric.save(path, state)
    except CheckpointError as err:
        outcome = {"error": "CheckpointError", "message": str(err)}
    except Exception as err:
        outcome = {"error": type(err).__name__, "message": str(err)}
    else:
        outcome = {"error": None, "message": ""}
    # both ranks must still be in step: a collective after the failure must not hang
    outcome["after"] = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()
    return outcome


def check_failed_save(fabric: Any, folder: str) -> dict[str, Any]:
    fmodel, _, _ = _model_and_optimizer(fabric)
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    before = path.read_bytes()
    outcome = _save_error(fabric, path, {"model": fmodel, "bad": Unpicklable()})
    outcome["previous_intact"] = path.read_bytes() == before
    outcome["path"] = str(path)
    outcome["leftovers"] = sorted(name for name in os.listdir(folder) if name.endswith(".tmp"))
    return outcome


def check_unwritable_path(fabric: Any, folder: str) -> dict[str, Any]:
    fmodel, _, _ = _model_and_optimizer(fabric)
    blocker = Path(folder) / "a_file.txt"
    if fabric.global_rank == 0:
        blocker.write_text("not a folder")
    fabric.barrier()
    path = blocker / "ckpt.pt"
    outcome = _save_error(fabric, path, {"model": fmodel})
    outcome["path"] = str(path)
    return outcome


CHECKS = {
    "save_then_load": check_save_then_load,
    "failed_save": check_failed_save,
    "unwritable_path": check_unwritable_path,
}


def observe(fabric: Any, folder: str) -> dict[str, Any]:
    results: dict[str, Any] = {"rank": fabric.global_rank}
    for name, check in CHECKS.items():
        subfolder = Path(folder) / name
        if fabric.global_rank == 0:
            subfolder.mkdir(parents=True, exist_ok=True)
        fabric.barrier()
        try:
            results[name] = check(fabric, str(subfolder))
        except Exception:
            results[name] = {"traceback": traceback.format_exc()}
    return results
