"""Asynchronous saves at the edges of a run (tests/distributed/test_async_checkpoint.py), on two CPU ranks:

    python tests/helpers/scripts/async_save.py MODE STRATEGY FOLDER

STRATEGY: ``ddp``, ``fsdp`` or ``model_parallel`` (``ModelParallelStrategy``, ``fully_shard`` over 2 data-parallel
ranks; this script is run again per rank, and goes on after ``launch()``), or ``ddp_spawn`` (``launch(run)``). MODE:

* ``end``: the last save is still being written when the run ends: the file must be complete afterwards.
* ``exit_error``: the last save fails in the background: the process prints the error and exits with code 1.
* ``training_error``: training raises while a save is written: the file is complete, the training error reported.
* ``kill``: a first checkpoint is saved; the second one's write stops half-way (the test kills the job then).
* ``checks`` (``fsdp``, ``model_parallel``): the checkpoint is the state at the call, one write at a time,
  ``fabric.load`` waits, a failed write raises at the next save and at load; each rank writes its observations to
  ``result<rank>.json``.

Slow and failing writes come from patching the one function that writes the bytes (``torch.save`` for one file,
``FileSystemWriter.write_data`` for a sharded folder).
"""

from __future__ import annotations

import io
import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.plugins.io import AsyncCheckpointIO
from fabric_lite.runtime.checkpoint import CheckpointError

WRITE_SECONDS = 1.0
SHARDED = ("fsdp", "model_parallel")


def _patch_writes(mode: str) -> None:
    real_save = torch.save

    def file_save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        if mode == "exit_error":
            raise OSError("no space left on the test's disk")
        if mode == "kill":  # half the bytes reach the temporary file, then the write stalls until the job is killed
            buffer = io.BytesIO()
            real_save(obj, buffer, *args, **kwargs)
            data = buffer.getvalue()
            with open(f, "wb") if isinstance(f, (str, Path)) else _keep_open(f) as out:
                out.write(data[: len(data) // 2])
                out.flush()
            print("STALLED", flush=True)
            time.sleep(600)
        time.sleep(WRITE_SECONDS)
        real_save(obj, f, *args, **kwargs)

    torch.save = file_save
    try:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter
    except ImportError:
        return
    real_write = FileSystemWriter.write_data

    def write_data(self: Any, plan: Any, planner: Any) -> Any:
        if mode == "exit_error":
            raise OSError("no space left on the test's disk")
        if mode == "kill":
            print("STALLED", flush=True)
            time.sleep(600)
        time.sleep(WRITE_SECONDS)
        return real_write(self, plan, planner)

    FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


class _keep_open:
    def __init__(self, f: Any) -> None:
        self.f = f

    def __enter__(self) -> Any:
        return self.f

    def __exit__(self, *exc: Any) -> None:
        return None


def _path(folder: Path, strategy: str, name: str) -> Path:
    return folder / (name if strategy in SHARDED else f"{name}.ckpt")


def _shard(model: nn.Module, device_mesh: Any) -> nn.Module:
    """``ModelParallelStrategy``'s parallelize function: FSDP2 over the data-parallel ranks, layer by layer."""
    from torch.distributed.fsdp import fully_shard

    mesh = device_mesh["data_parallel"]
    for layer in model:
        fully_shard(layer, mesh=mesh)
    return fully_shard(model, mesh=mesh)


def run(fabric: Fabric, mode: str, strategy: str, folder: Path) -> None:
    torch.manual_seed(0)
    width = 2048 if mode == "kill" else 16  # kill: a 16 MiB layer, so the stalled write is a real partial file
    model = nn.Sequential(nn.Linear(width, width), nn.Linear(width, 4))
    if strategy in SHARDED:
        model = fabric.setup_module(model)
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
    else:
        model, optimizer = fabric.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
    state = {"model": model, "optimizer": optimizer, "step": 1}
    if mode == "kill":
        fabric.save(_path(folder, strategy, "last"), state)
        fabric.strategy._wait_for_saves()
        fabric.barrier()
        print("SAVED", flush=True)
        _patch_writes(mode)
        state["step"] = 2
        fabric.save(_path(folder, strategy, "last"), state)
        time.sleep(600)  # training goes on; the test kills the job
        return
    _patch_writes(mode)
    state["step"] = 2
    fabric.save(_path(folder, strategy, "last"), state)
    os.write(1, f"SAVE RETURNED rank={fabric.global_rank} at={time.time()}\n".encode())  # one write: ranks share stdout
    if mode == "training_error":
        raise ValueError("training failed while the checkpoint was written")


class _Writes:
    """Patches DCP's ``FileSystemWriter.write_data``: each write sleeps ``delay`` seconds first, or raises when
    ``fail``; ``max_running`` is the most writes seen at once."""

    def __init__(self) -> None:
        from torch.distributed.checkpoint.filesystem import FileSystemWriter

        self.delay, self.fail, self.running, self.max_running = 0.0, False, 0, 0
        self.lock = threading.Lock()
        real_write = FileSystemWriter.write_data

        def write_data(writer: Any, plan: Any, planner: Any) -> Any:
            with self.lock:
                self.running += 1
                self.max_running = max(self.max_running, self.running)
            try:
                time.sleep(self.delay)
                if self.fail:
                    raise OSError("the disk refused the shards")
                return real_write(writer, plan, planner)
            finally:
                with self.lock:
                    self.running -= 1

        FileSystemWriter.write_data = write_data  # type: ignore[method-assign]


def _local(model: nn.Module) -> torch.Tensor:
    return torch.cat([getattr(p, "_local_tensor", p).detach().reshape(-1) for p in model.parameters()]).clone()


def _error_of(call: Any) -> str:
    try:
        call()
    except CheckpointError as err:
        return f"CheckpointError: {err}"
    return "none"


def checks(fabric: Fabric, folder: Path) -> dict[str, Any]:
    writes = _Writes()
    torch.manual_seed(0)
    model = fabric.setup_module(nn.Sequential(nn.Linear(16, 16), nn.Linear(16, 4)))
    optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))

    def step() -> None:
        fabric.backward(model(torch.ones(2, 16) + fabric.global_rank).pow(2).sum())
        optimizer.step()
        optimizer.zero_grad()

    result: dict[str, Any] = {}
    # the checkpoint is the state at the call: an in-place change and 3 steps during the write do not leak into it
    writes.delay = 1.0
    at_save = _local(model)
    fabric.save(folder / "snapshot", {"model": model, "optimizer": optimizer, "step": 1})
    result["in_flight_after_save"] = fabric.strategy._async_io().in_flight  # type: ignore[union-attr]
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    for _ in range(3):
        step()
    changed = not torch.equal(_local(model), at_save)
    fabric.load(folder / "snapshot", {"model": model, "optimizer": optimizer})
    result["snapshot"] = changed and torch.equal(_local(model), at_save)
    # one write at a time: the second save returns only once the first write is done
    writes.delay = 0.5
    started = time.monotonic()
    fabric.save(folder / "first", {"model": model, "step": 1})
    result["first_call"] = time.monotonic() - started
    started = time.monotonic()
    fabric.save(folder / "second", {"model": model, "step": 2})
    result["second_call"] = time.monotonic() - started
    # fabric.load waits for the write in flight
    result["loaded_steps"] = [fabric.load(folder / name)["step"] for name in ("first", "second")]
    result["max_running"] = writes.max_running
    # a failed write raises at the next save, and at load, on every rank
    writes.delay, writes.fail = 0.2, True
    fabric.save(folder / "failing", {"model": model, "step": 3})
    fabric.strategy._async_io()._join()  # type: ignore[union-attr]  # (its error stays for the next save)
    writes.fail = False
    result["error_at_next_save"] = _error_of(lambda: fabric.save(folder / "next", {"model": model, "step": 4}))
    writes.fail = True
    fabric.save(folder / "failing", {"model": model, "step": 5})
    result["error_at_load"] = _error_of(lambda: fabric.load(folder / "snapshot", {"model": model}))
    writes.fail = False
    result["leftovers"] = sorted(p.name for p in folder.iterdir() if p.name.startswith("."))
    result["published"] = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    return result


def main() -> None:
    mode, strategy, folder = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    chosen: Any = strategy
    if strategy == "model_parallel":
        from fabric_lite.strategies import ModelParallelStrategy

        chosen = ModelParallelStrategy(_shard, data_parallel_size=2, tensor_parallel_size=1)
    fabric = Fabric(accelerator="cpu", devices=2, strategy=chosen, plugins=[AsyncCheckpointIO()])
    if strategy == "ddp_spawn":
        fabric.launch(run, mode, strategy, folder)
        return
    fabric.launch()
    if mode == "checks":  # checkpoints in FOLDER/ckpts, each rank's results in FOLDER/result<rank>.json
        (folder / "ckpts").mkdir(exist_ok=True)
        result = checks(fabric, folder / "ckpts")
        (folder / f"result{fabric.global_rank}.json").write_text(json.dumps(result))
        return
    run(fabric, mode, strategy, folder)


if __name__ == "__main__":
    main()
