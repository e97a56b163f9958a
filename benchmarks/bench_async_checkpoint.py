"""Saving without stopping: ``AsyncCheckpointIO`` against blocking saves, side by side in one run, on two CPU ranks.

    python benchmarks/bench_async_checkpoint.py            # 4 x Linear(4096, 4096): 268 MB (several minutes)
    python benchmarks/bench_async_checkpoint.py --quick    # 4 x Linear(1024, 1024): 17 MB, one repeat (smoke run)

Two strategies, each in one pair of processes (``OMP_NUM_THREADS=1``): ``ddp`` (``ddp_spawn``) saves one file, rank 0
writes it; ``fsdp`` (``FSDPStrategy(start_method="fork")``: its spawn cannot pickle the strategy) a sharded folder,
every rank its half, through DCP's ``async_save`` in the asynchronous mode. SGD without momentum, so the checkpoint
is the model and the step. The checkpoint folder is on the local disk (``benchmarks/out``), not a tmpfs, where a
write is only a memory copy.

The same processes run both modes in alternating blocks (blocking, asynchronous, blocking, ...; 3 repeats): a block
is 14 training steps with a save after steps 3 and 9 (an FSDP step of this model takes seconds here). Every rank
times every ``fabric.save`` call and every step; after each block the ranks take the larger of their figures (one
``all_reduce``). The figures (rows of
``benchmarks/run.py``'s table, as ratios of the asynchronous mode to the blocking one, medians over repeats):

* ``async_save/<strategy>_blocked``: how long ``fabric.save`` blocks the step that calls it, asynchronous over
  blocking. Target: <= 0.10.
* ``async_save/<strategy>_step_during_write``: the time of a step that overlaps a background write (one in flight
  when the step starts) over the time of a step of the blocking blocks without a save. Target: <= 1.25x (the steps
  run at >= 0.8x of their speed while the checkpoint is written).

Also printed: the blocking save's time and the background write's (call to the end of the write).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import nn

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fabric_lite import Fabric  # noqa: E402
from fabric_lite.plugins.io import AsyncCheckpointIO, TorchCheckpointIO  # noqa: E402
from fabric_lite.strategies import FSDPStrategy  # noqa: E402

SAVE_AT = (3, 9)


def _model(width: int, depth: int) -> nn.Module:
    return nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)])


def _use(fabric: Fabric, io: Any) -> None:
    # the mode of the next block: the plugin itself is kept, so that its staging copy is reused across blocks
    fabric.strategy._checkpoint_io = io


def _block(fabric: Fabric, model: Any, optimizer: Any, x: torch.Tensor, steps: int, path: Path, io: Any) -> dict:
    _use(fabric, io)
    is_async = isinstance(io, AsyncCheckpointIO)
    blocked: list[float] = []
    writes: list[float] = []
    quiet: list[float] = []  # steps with no save in the step and no write in flight
    overlapped: list[float] = []  # steps that ran while a background write was in flight
    calls: list[float] = []
    fabric.barrier()
    for step in range(steps):
        writing = is_async and io.in_flight  # a write in flight when the step starts overlaps (part of) it
        started = time.perf_counter()
        fabric.backward(model(x).square().mean())
        optimizer.step()
        optimizer.zero_grad(set_to_none=False)
        saving = step in SAVE_AT
        if saving:
            call = time.perf_counter()
            fabric.save(path, {"model": model, "optimizer": optimizer, "step": step})
            blocked.append(time.perf_counter() - call)
            calls.append(time.monotonic())
        elapsed = time.perf_counter() - started
        in_flight = is_async and io.in_flight
        if writing and not saving:
            overlapped.append(elapsed)
        elif not saving and not is_async:
            quiet.append(elapsed)
        if is_async and calls and not in_flight and len(writes) < len(calls):
            writes.append(io._background.finished_at - calls[len(writes)])
    if is_async:
        io.wait()
        while len(writes) < len(calls):
            writes.append(io._background.finished_at - calls[len(writes)])
    # every rank's figures, the larger of the two (one all_reduce of a few numbers)
    figures = torch.tensor([max(blocked), statistics.median(blocked), max(writes, default=0.0)], dtype=torch.float64)
    figures = fabric.all_reduce(figures, reduce_op="max")
    return {
        "blocked": float(figures[1]),
        "write": float(figures[2]) if is_async else float(figures[1]),
        "quiet_step": statistics.median(quiet) if quiet else None,
        "overlapped_step": statistics.median(overlapped) if overlapped else None,
        "overlapped_steps": len(overlapped),
    }


def run(fabric: Fabric, strategy: str, width: int, depth: int, steps: int, repeats: int, batch: int, out: str) -> Any:
    torch.manual_seed(0)
    if strategy == "fsdp":
        model = fabric.setup_module(_model(width, depth))
        optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=1e-6))
        blocking: Any = None  # a sharding strategy's own synchronous folders
        path = Path(out) / "fsdp_ckpt"
    else:
        module = _model(width, depth)
        model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=1e-6))
        blocking = TorchCheckpointIO()
        path = Path(out) / "ddp.ckpt"
    x = torch.randn(batch, width)
    io = AsyncCheckpointIO()
    # warm-up: imports, the stager's buffers, the checkpoint group, the page cache of the target folder
    _block(fabric, model, optimizer, x, SAVE_AT[0] + 2, path, io)
    _block(fabric, model, optimizer, x, SAVE_AT[0] + 2, path, blocking)
    results = []
    for _ in range(repeats):
        for mode, plugin in (("blocking", blocking), ("async", io)):
            results.append({"mode": mode, **_block(fabric, model, optimizer, x, steps, path, plugin)})
    _use(fabric, io)
    io.teardown()
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 17 MB model, one repeat (smoke run)")
    parser.add_argument("--strategies", default="ddp,fsdp")
    parser.add_argument("--out", default=None, help="also write the rows as JSON to this file")
    args = parser.parse_args()
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)
    width, depth, steps, repeats, batch = (1024, 4, 12, 1, 8) if args.quick else (4096, 4, 14, 3, 8)
    folder = REPO / "benchmarks" / "out" / "async_checkpoint"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rows = []
    try:
        for name in args.strategies.split(","):
            strategy: Any = (
                FSDPStrategy(start_method="fork", timeout=timedelta(minutes=5)) if name == "fsdp" else "ddp_spawn"
            )
            fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
            blocks = fabric.launch(run, name, width, depth, steps, repeats, batch, str(folder))
            rows.extend(_rows(name, blocks, width * width * depth * 4 + width * depth * 4))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for row in rows:
        print("RESULT " + json.dumps(row), flush=True)
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2))


def _rows(name: str, blocks: list[dict], nbytes: int) -> list[dict]:
    blocking = [b for b in blocks if b["mode"] == "blocking"]
    asynchronous = [b for b in blocks if b["mode"] == "async"]
    blocked = {"raw": [b["blocked"] for b in blocking], "fabric_lite": [b["blocked"] for b in asynchronous]}
    steps = {
        "raw": [b["quiet_step"] for b in blocking],
        "fabric_lite": [b["overlapped_step"] or float("nan") for b in asynchronous],
    }
    ratio = statistics.median(blocked["fabric_lite"]) / statistics.median(blocked["raw"])
    speed = statistics.median(steps["raw"]) / statistics.median(steps["fabric_lite"])
    median = statistics.median
    print(
        f"{name}: {nbytes / 1e6:.0f} MB model; blocking save {median(blocked['raw']):.3f} s, asynchronous save blocks"
        f" {median(blocked['fabric_lite']):.3f} s ({ratio:.3f}x, target <= 0.10), background write"
        f" {median(b['write'] for b in asynchronous):.3f} s; step {median(steps['raw']):.3f} s without a write,"
        f" {median(steps['fabric_lite']):.3f} s during one (speed {speed:.2f}x, target >= 0.8;"
        f" {sum(b['overlapped_steps'] for b in asynchronous)} steps overlapped a write)",
        flush=True,
    )
    return [
        {"measure": f"async_save/{name}_blocked", "impl": "fabric_lite", "times": blocked},
        {"measure": f"async_save/{name}_step_during_write", "impl": "fabric_lite", "times": steps},
    ]


if __name__ == "__main__":
    main()
