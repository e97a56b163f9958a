"""Start to first collective: two CPU processes, from before the launch until the parent holds the result.

    python benchmarks/bench_startup.py [--quick]

What is timed, in a fresh parent interpreter that has already imported torch and the implementation (import time
is a figure of its own): from just before the launch until the first ``all_reduce`` has completed on both ranks,
both ranks have exited, and the parent holds rank 0's result. That is:

* raw PyTorch: ``torch.multiprocessing.start_processes(..., nprocs=2, start_method="spawn")``; each worker joins
  the group with ``init_process_group("gloo", init_method="file://...")`` (a file store in a temporary folder),
  does one ``all_reduce``, sends rank 0's result back through a queue and destroys the group.
* fabric_lite: ``Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn").launch(fn)``, where ``fn`` does one
  ``fabric.all_reduce`` and returns the value (the launcher hands rank 0's return value to the parent).
* Lightning Fabric: the same two lines with ``lightning_fabric.Fabric``, from ``.venv-lightning`` (when present).

Each run is a fresh parent process, so that no variant profits from what an earlier one imported or warmed up;
the variants take turns, run after run, and each implementation's run is paired with the raw run of the same
round. The spawned workers start fresh interpreters that import torch, this script and whatever the launcher's
pickled objects need, exactly as a user's script would.
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from _common import compared_impls, print_table, python_for, result_rows, summarise

MEASURE = "startup/first_all_reduce"
WORLD_SIZE = 2


def _raw_worker(rank: int, store_path: str, results: Any) -> None:
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=WORLD_SIZE)
    value = torch.tensor(float(rank + 1))
    dist.all_reduce(value)
    if rank == 0:
        results.put(value.item())
    dist.destroy_process_group()


def _fabric_fn(fabric: Any) -> float:
    value = torch.tensor(float(fabric.global_rank + 1))
    fabric.all_reduce(value, reduce_op="sum")
    return value.item()


def _lightning_fn(fabric: Any) -> float:
    value = _fabric_fn(fabric)
    # Lightning Fabric leaves its process group to the interpreter's exit, where gloo's threads can abort the worker
    # ("terminate called without an active exception"; seen here on a busy machine): destroy it, as the raw
    # workers and fabric_lite's launcher do, so that every variant does the same work and none crashes.
    dist.destroy_process_group()
    return value


def run_once(impl: str) -> tuple[float, float]:
    """In this (fresh) process: seconds from before the launch until the parent holds the result, and the result."""
    if impl == "raw":
        folder = tempfile.mkdtemp(prefix="bench_startup_")
        try:
            start = time.perf_counter()
            results = mp.get_context("spawn").SimpleQueue()
            mp.start_processes(
                _raw_worker, args=(str(Path(folder) / "store"), results), nprocs=WORLD_SIZE, start_method="spawn"
            )
            value = results.get()
            seconds = time.perf_counter() - start
            results.close()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
        return seconds, value
    if impl == "fabric_lite":
        from fabric_lite import Fabric

        function = _fabric_fn
    elif impl == "lightning":
        from lightning_fabric import Fabric

        function = _lightning_fn
    else:
        raise ValueError(f"no start-up variant for {impl!r}: choose raw, fabric_lite or lightning")
    start = time.perf_counter()
    value = Fabric(accelerator="cpu", devices=WORLD_SIZE, strategy="ddp_spawn").launch(function)
    return time.perf_counter() - start, value


def measure(impls: list[str], runs: int) -> list[dict]:
    """``runs`` paired rounds; in each, raw PyTorch and every implementation in ``impls`` take a fresh process."""
    variants = ["raw", *[impl for impl in impls if impl in ("fabric_lite", "lightning")]]
    times: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(runs):
        for name in variants if r % 2 == 0 else variants[::-1]:
            argv = [python_for(name), __file__, "--child", name]
            result = result_rows(argv, f"start-up run of {name}", 300)[-1]  # type: ignore[arg-type]
            if result["value"] != sum(range(1, WORLD_SIZE + 1)):
                raise RuntimeError(f"start-up run of {name} reduced to {result['value']}, not 3.0")
            times[name].append(result["seconds"])
    return [
        {"measure": MEASURE, "impl": impl, "times": {"raw": times["raw"], impl: times[impl]}} for impl in variants[1:]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="2 runs per variant instead of 7")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        seconds, value = run_once(args.child)
        print("RESULT " + json.dumps({"seconds": seconds, "value": value}), flush=True)
        return
    print_table(summarise(measure(compared_impls(), 2 if args.quick else 7)))


if __name__ == "__main__":
    main()
