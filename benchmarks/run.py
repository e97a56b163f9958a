"""Run every benchmark and print one table of medians, spreads and ratios to raw PyTorch.

    .venv/bin/python benchmarks/run.py            # full run (several minutes on 2 cores)
    .venv/bin/python benchmarks/run.py --quick    # smoke run (CI): the benchmarks work; the figures mean little

fabric_lite runs from this interpreter; Lightning Fabric and Accelerate run from ``$LIGHTNING_PYTHON`` or
``.venv-lightning`` (made by ``.ci/setup``) when it has both, and are skipped with a note when not. A quick run
takes two measurements at a time to stay short, and leaves Lightning's two-process figures (start-up, DDP steps)
out; a full run never overlaps two. Each figure is a ratio to raw PyTorch
measured in paired, interleaved rounds, so that machine noise hits every variant alike: ``ratio`` is the median
over rounds of (implementation / raw), ``spread`` the interquartile range of those per-round ratios (for import
time, which has no raw counterpart, the interquartile range in seconds). The figures:

* ``import``: seconds that ``import fabric_lite`` (``lightning_fabric``, ``accelerate``) adds to ``import torch``.
* ``step/*``: a single-process training step (``bench_core.py step``).
* ``ddp_step/*``, ``all_reduce/*``, ``all_gather/*``, ``broadcast/*``: two ranks under torchrun, gloo
  (``bench_core.py ddp``).
* ``sweep/*`` (2 ranks) and ``sweep3/*`` (3 ranks): ``all_reduce`` (sum) of one float32 tensor of 4 B to 64 MiB
  (``--quick``: up to 64 KiB) against ``dist.all_reduce`` of it; ``ops/*``: every reduce op and dtype group at
  1 KiB and 1 MiB, and int64 sums of 64 KiB to 64 MiB, 2 ranks (fabric_lite only). The floors of any wrapper's
  figures on this machine, where a rank that arrives late costs the other more than its lateness, measured raw
  against raw: ``control/1MiB_plus_40us`` (1 MiB all-reduces with 40 us of host time between them),
  ``control/bcast1k_plus_12us`` (broadcasts of 1024 floats, each after 12 us of host time: about what
  fabric_lite's predicted broadcast costs the host) and ``control/int4MiB_plus_flag`` (a 4 MiB int64
  all-reduce with a one-element all-reduce beside it: what an integer sum's flag costs).
* ``startup/first_all_reduce``: from before the launch of two processes until the parent holds the result of their
  first ``all_reduce`` (``bench_startup.py``).
* ``memory/*``: peak memory of training a 34M-parameter MLP (``bench_memory.py``).
* ``async_save/*``: ``AsyncCheckpointIO`` against blocking saves of a 268 MB model (``--quick``: 17 MB), two ranks,
  DDP and FSDP (``bench_async_checkpoint.py``): the time ``fabric.save`` blocks, and the time of a step during the
  background write; here "raw PyTorch" is the blocking save (the step without a write).

The results, with the machine, the torch version and the date, are written as JSON (``--out``, by default
``benchmarks/out/results.json``), and their ratios as a chart next to it (the same name, ``.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from functools import partial
from pathlib import Path

import bench_memory
import bench_startup
import torch
from _chart import write_chart
from _common import IMPORTS, REPO, child_env, compared_impls, print_table, python_for, quartiles, result_rows, summarise

CORE = str(REPO / "benchmarks" / "bench_core.py")
ASYNC_SAVE = str(REPO / "benchmarks" / "bench_async_checkpoint.py")
#: the order of the table: by the part of a figure's name before the "/"
FIGURES = [
    "import",
    "startup",
    "step",
    "ddp_step",
    "all_reduce",
    "all_gather",
    "broadcast",
    "sweep",
    "sweep3",
    "ops",
    "control",
    "memory",
    "async_save",
]


def import_times(impls: list[str], runs: int) -> list[dict]:
    """Seconds that ``import X`` adds to ``import torch``, in interleaved fresh interpreters."""
    code = "import time; import torch; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    samples: dict[str, list[float]] = {impl: [] for impl in impls}
    for _ in range(runs):
        for impl in impls:
            out = subprocess.run(
                [python_for(impl), "-c", code.format(module=IMPORTS[impl])],  # type: ignore[list-item]
                capture_output=True,
                text=True,
                env=child_env(),
                timeout=120,
                check=True,
            )
            samples[impl].append(float(out.stdout.strip().splitlines()[-1]))
    table = []
    for impl, s in samples.items():
        low, median, high = quartiles(s)
        row = {"measure": "import", "impl": impl, "unit": "s", "median": median, "raw": None, "ratio": None}
        table.append({**row, "low": None, "high": None, "spread": high - low})
    return table


def _core(python: str, args: list[str], torchrun: bool, nproc: int = 2) -> list[dict]:
    command = (
        [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc), CORE]
        if torchrun
        else [python, CORE]
    )
    return result_rows([*command, *args], " ".join(command + args), 1800, need=0)


def _core_table(impl: str, args: list[str], torchrun: bool, nproc: int = 2) -> list[dict]:
    return summarise(_core(python_for(impl), args, torchrun, nproc))  # type: ignore[arg-type]


def _async_save_table(quick: bool) -> list[dict]:
    """``async_save/*``: asynchronous saves against blocking ones, two ranks, DDP and FSDP
    (``bench_async_checkpoint.py``; ``raw`` is the blocking save there)."""
    return summarise(
        result_rows([sys.executable, ASYNC_SAVE, *(["--quick"] if quick else [])], ASYNC_SAVE, 1800, need=0)
    )


def machine() -> dict:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }


def sections(impls: list[str], quick: bool) -> list[Callable[[], list[dict]]]:
    """The measurements, each a function that returns its table lines; the longest first."""
    flag = ["--quick"] if quick else []
    memory = {"rounds": 1, "size": "quick", "steps": 2} if quick else {"rounds": 3, "size": "full", "steps": 5}
    # a quick run leaves Lightning's two-process figures out (they cost more than all of fabric_lite's, and the quick
    # run only shows that the measurements work): its start-up here, its DDP steps below
    two_process = [i for i in impls if not (quick and i == "lightning")]
    found: list[Callable[[], list[dict]]] = [
        lambda: summarise(bench_startup.measure(two_process, runs=1 if quick else 7)),
        lambda: summarise(bench_memory.measure(impls, **memory)),  # type: ignore[arg-type]
        partial(_async_save_table, quick),
    ]
    # Accelerate is compared single-process only
    for impl in [i for i in two_process if i in ("fabric_lite", "lightning")]:
        found.append(partial(_core_table, impl, ["ddp", impl, *flag], torchrun=True))
    # the payload sweep on 3 ranks too (fabric_lite against raw torch.distributed)
    found.append(partial(_core_table, "fabric_lite", ["sweep", "fabric_lite", *flag], torchrun=True, nproc=3))
    for impl in impls:
        found.append(partial(_core_table, impl, ["step", impl, *flag], torchrun=False))
    found.append(partial(import_times, impls, 1 if quick else 15))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "results.json"), help="the JSON file")
    args = parser.parse_args()
    impls = compared_impls()
    if len(impls) == 1:
        print(
            "note: Lightning Fabric and Accelerate are skipped: no .venv-lightning with both (run .ci/setup) and no"
            " $LIGHTNING_PYTHON"
        )
    started = time.time()
    # A quick run asserts nothing about speed, so two measurements at a time keep it short; a full run never
    # overlaps two measurements.
    with ThreadPoolExecutor(max_workers=2 if args.quick else 1) as pool:
        table = [row for rows in pool.map(lambda measure: measure(), sections(impls, args.quick)) for row in rows]
    impl_order = list(IMPORTS)
    table.sort(
        key=lambda row: (FIGURES.index(row["measure"].split("/")[0]), row["measure"], impl_order.index(row["impl"]))
    )
    print_table(table)

    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": machine(),
        "torch": torch.__version__,
        "quick": args.quick,
        "seconds": round(time.time() - started, 1),
        "results": table,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    chart = out.with_suffix(".png")
    m = record["machine"]
    drawn_by = write_chart(
        chart,
        table,
        "fabric_lite" + (", Lightning Fabric and Accelerate" if len(impls) > 1 else "") + " against raw PyTorch",
        [
            f"{m['processor']}, {m['cpus']} CPUs, {m['platform']}",
            f"torch {torch.__version__}, Python {m['python']}, {record['date']}"
            + (" (a quick run: the figures mean little)" if args.quick else ""),
        ],
    )
    print(f"\nwritten to {out} and {chart} (drawn with {drawn_by})")
    print(f"{record['seconds']} s, torch {torch.__version__}, {m['cpus']} CPUs, Python {m['python']}")


if __name__ == "__main__":
    main()
