"""``AsyncCheckpointIO`` on two ranks (run by tests/distributed/test_async_checkpoint.py through
``tests.helpers.harness.spawn_job``): every check returns plain observations (or its traceback); the test asserts.

Rank 0 writes through a test double of the inner IO (:class:`GatedIO`) whose write waits until the check opens a
gate, or sleeps, and that counts how many writes run at once.
"""

from __future__ import annotations

import os
import threading
import time
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fabric_lite.plugins.io import AsyncCheckpointIO, TorchCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError
from tests.helpers.jobs.checks import record

SLOW_WRITE = 0.5  # seconds a slow write takes


class GatedIO(TorchCheckpointIO):
    """Writes like ``TorchCheckpointIO`` once ``gate`` is set (or after ``delay`` seconds); ``fail`` raises instead.
    Records the largest number of writes that ran at once, and when each write started and ended."""

    def __init__(self, delay: float = 0.0, gated: bool = False, fail: bool = False) -> None:
        self.delay, self.fail = delay, fail
        self.gate = threading.Event()
        if not gated:
            self.gate.set()
        self.running = 0
        self.max_running = 0
        self.spans: list[tuple[float, float]] = []
        self._lock = threading.Lock()

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
        with self._lock:
            self.running += 1
            self.max_running = max(self.max_running, self.running)
        started = time.monotonic()
        try:
            self.gate.wait(60)
            time.sleep(self.delay)
            if self.fail:
                raise OSError(f"the disk refused {path}")
            super().save_checkpoint(checkpoint, path, storage_options)
        finally:
            with self._lock:
                self.running -= 1
            self.spans.append((started, time.monotonic()))


def _model(fabric: Any) -> tuple[Any, Any, nn.Module]:
    torch.manual_seed(0)
    model = nn.Linear(16, 4)
    fmodel, foptimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    return fmodel, foptimizer, model


def _step(fabric: Any, fmodel: Any, foptimizer: Any) -> None:
    x = torch.arange(32, dtype=torch.float32).reshape(2, 16) / 32 + fabric.global_rank
    fabric.backward(fmodel(x).pow(2).sum())
    foptimizer.step()
    foptimizer.zero_grad()


def _flat(module: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in module.parameters()]).clone()


def _use(fabric: Any, io: GatedIO) -> AsyncCheckpointIO:
    plugin = AsyncCheckpointIO(io)
    fabric.strategy.checkpoint_io = plugin
    return plugin


def check_snapshot(fabric: Any, folder: str) -> dict[str, Any]:
    """The checkpoint holds the state at the moment of the call: in-place changes and 3 more steps made while the
    write waits do not leak into it."""
    io = GatedIO(gated=True)
    plugin = _use(fabric, io)
    fmodel, foptimizer, model = _model(fabric)
    _step(fabric, fmodel, foptimizer)
    at_save = _flat(model)
    path = Path(folder) / "snapshot.ckpt"
    fabric.save(path, {"model": fmodel, "optimizer": foptimizer, "step": 1})
    in_flight = plugin.in_flight if fabric.global_rank == 0 else None
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for _ in range(3):
        _step(fabric, fmodel, foptimizer)
    io.gate.set()
    after_steps = _flat(model)
    fabric.load(path, {"model": fmodel, "optimizer": foptimizer})
    return {
        "in_flight_after_save": in_flight,
        "loaded_equals_save_time": torch.equal(_flat(model), at_save),
        "changed_meanwhile": not torch.equal(after_steps, at_save),
    }


def check_at_most_one(fabric: Any, folder: str) -> dict[str, Any]:
    """Two saves back to back: the second call returns only after the first write has finished."""
    io = GatedIO(delay=SLOW_WRITE)
    plugin = _use(fabric, io)
    fmodel, foptimizer, _ = _model(fabric)
    first, second = Path(folder) / "first.ckpt", Path(folder) / "second.ckpt"
    started = time.monotonic()
    fabric.save(first, {"model": fmodel, "step": 1})
    first_call = time.monotonic() - started
    started = time.monotonic()
    fabric.save(second, {"model": fmodel, "step": 2})
    second_returned = time.monotonic()
    second_call = second_returned - started
    plugin.wait()
    fabric.barrier()
    return {
        "first_call": first_call,
        "second_call": second_call,
        "first_write_done_before_second_returned": bool(io.spans) and io.spans[0][1] <= second_returned,
        "max_running": io.max_running,
        "writes": len(io.spans),
        "steps": [torch.load(p, weights_only=True)["step"] for p in (first, second)],
    }


def check_load_waits(fabric: Any, folder: str) -> dict[str, Any]:
    """``fabric.load`` during a slow write returns the new checkpoint, on every rank."""
    io = GatedIO(delay=SLOW_WRITE)
    _use(fabric, io)
    fmodel, foptimizer, _ = _model(fabric)
    path = Path(folder) / "load.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    fabric.barrier()
    fabric.save(path, {"model": fmodel, "step": 2})
    state = {"model": fmodel, "step": 0}
    fabric.load(path, state)
    return {"step": state["step"], "leftovers": sorted(n for n in os.listdir(folder) if n.endswith(".tmp"))}


def _outcome(call: Any) -> dict[str, Any]:
    try:
        call()
    except CheckpointError as err:
        return {"error": "CheckpointError", "message": str(err)}
    except Exception as err:
        return {"error": type(err).__name__, "message": str(err)}
    return {"error": None, "message": ""}


def check_error_at_next_save(fabric: Any, folder: str) -> dict[str, Any]:
    """A failed background write raises at the next save on every rank, naming the path; the save after that works."""
    io = GatedIO(fail=True)
    _use(fabric, io)
    fmodel, _, _ = _model(fabric)
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})  # returns: the write fails in the background
    outcome = _outcome(lambda: fabric.save(Path(folder) / "next.ckpt", {"model": fmodel, "step": 2}))
    outcome["after"] = fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()  # still in step
    io.fail = False
    fabric.save(path, {"model": fmodel, "step": 3})
    fabric.strategy._wait_for_saves()
    outcome["retry_step"] = torch.load(path, weights_only=True)["step"]
    outcome["path"] = str(path)
    outcome["next_exists"] = (Path(folder) / "next.ckpt").exists()  # the save that raised was not started
    return outcome


def check_error_at_load(fabric: Any, folder: str) -> dict[str, Any]:
    """A failed background write raises at ``fabric.load`` on every rank, naming the path."""
    io = GatedIO(delay=0.2)
    _use(fabric, io)
    fmodel, _, _ = _model(fabric)
    fabric.save(Path(folder) / "previous.ckpt", {"model": fmodel, "step": 0})
    fabric.strategy._wait_for_saves()
    io.fail = True
    path = Path(folder) / "failing.ckpt"
    fabric.save(path, {"model": fmodel, "step": 1})
    outcome = _outcome(lambda: fabric.load(path, {"model": fmodel}))
    return {**outcome, "path": str(path), "after": fabric.all_reduce(torch.tensor(1.0), reduce_op="sum").item()}


CHECKS = {
    "snapshot": check_snapshot,
    "at_most_one": check_at_most_one,
    "load_waits": check_load_waits,
    "error_at_next_save": check_error_at_next_save,
    "error_at_load": check_error_at_load,
}


def _in_subfolder(fabric: Any, folder: str, name: str) -> Any:
    subfolder = Path(folder) / name
    subfolder.mkdir(parents=True, exist_ok=True)  # by every rank: none writes into it before its own mkdir
    try:
        return CHECKS[name](fabric, str(subfolder))
    finally:
        # each check brings its own IO: the next one starts with no write in flight and no error pending
        io = fabric.strategy._async_io()
        if io is not None:
            io._join(60)
            io._take_error()


def observe(fabric: Any, folder: str) -> dict[str, Any]:
    results = record({name: partial(_in_subfolder, fabric, folder, name) for name in CHECKS})
    fabric.strategy.checkpoint_io = TorchCheckpointIO()
    return results
