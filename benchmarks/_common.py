"""What the benchmark scripts share: where the interpreters are, the child environment, and the summary table.

A measurement reports *rows*: ``{"measure", "impl", "unit", "times": {"raw": [...], impl: [...]}}``, one value
per round for raw PyTorch and for the implementation, taken in the same (paired, interleaved) rounds. ``unit`` is
``"s"`` (seconds, the default) or ``"bytes"``. :func:`summarise` turns rows into table lines.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
#: what each implementation is called in the tables, and the module that provides it
IMPORTS = {"fabric_lite": "fabric_lite", "lightning": "lightning_fabric", "accelerate": "accelerate"}


@functools.cache
def lightning_python() -> str | None:
    """The interpreter of the venv with Lightning Fabric and Accelerate: ``$LIGHTNING_PYTHON``, or
    ``.venv-lightning`` (made by ``.ci/setup``); ``None`` when there is none that has both."""
    for candidate in (os.environ.get("LIGHTNING_PYTHON"), str(REPO / ".venv-lightning" / "bin" / "python")):
        if not candidate or not Path(candidate).is_file():
            continue
        code = "import importlib.util as u; print(all(u.find_spec(m) for m in ('lightning_fabric', 'accelerate')))"
        check = subprocess.run([candidate, "-c", code], capture_output=True, text=True, timeout=60)
        if check.stdout.strip() == "True":
            return candidate
    return None


def child_env() -> dict[str, str]:
    """The environment of every benchmark subprocess: this repository importable, one OpenMP thread, no launcher
    variables (a benchmark started from inside a job must start its own), and bytecode cached as on a user's machine
    (``PYTHONDONTWRITEBYTECODE``, set on some CI machines, would make every import of this source tree compile it
    again, 0.07 s here instead of 0.015 s, while the installed packages it is compared with were compiled when pip
    installed them)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    for name in (
        "PYTHONDONTWRITEBYTECODE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "LOCAL_RANK",
        "RANK",
        "WORLD_SIZE",
        "NODE_RANK",
    ):
        env.pop(name, None)
    return env


def result_rows(
    argv: list[str], what: str, timeout: float, env: dict[str, str] | None = None, need: int = 1
) -> list[dict[str, Any]]:
    """Run a benchmark child (``argv``, with :func:`child_env` unless ``env`` is given) and return the JSON of its
    ``RESULT {json}`` lines, in order.

    Raises ``RuntimeError`` naming ``what``, with everything the child printed, when it exits with an error, prints
    fewer than ``need`` rows, or runs past ``timeout`` seconds. The child runs in a session of its own, and a
    timeout kills that whole session: the ranks torchrun started as well as torchrun, which a plain
    ``subprocess.run(timeout=...)`` would leave behind."""
    process = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env or child_env(), start_new_session=True
    )
    try:
        stdout, stderr = process.communicate(timeout=timeout)
        failure = f"failed (exit code {process.returncode})"
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        stdout, stderr = process.communicate()
        failure = f"did not finish within {timeout:g} s (killed)"
    rows = [json.loads(line[7:]) for line in stdout.splitlines() if line.startswith("RESULT ")]
    if process.returncode != 0 or len(rows) < need:
        raise RuntimeError(f"{what} {failure}, {len(rows)} result rows:\n{stdout}\n{stderr}")
    return rows


def leave_process_group() -> None:
    """End a benchmark process's ``torch.distributed`` job: together (a barrier), then destroy the process group.

    Call it after the function that built the models has returned, never beside a live ``DistributedDataParallel``.
    DDP's reducer holds the process group, and whatever releases the group last runs gloo's destructor, which joins
    gloo's worker threads. The group's own Python binding releases the GIL for that; the reducer's does not. A
    worker thread still releasing DDP's last all-reduce needs the GIL (torch 2.13 keeps a Python object in every
    work started by a backward), so a reducer dropped after ``destroy_process_group`` can hang the process for
    good: one run of ``bench_gpu.py --quick`` in about ten did here on a busy machine. With the models gone first
    (``gc.collect`` for those in reference cycles), the group is released from Python, and nothing can wait on the
    GIL's holder."""
    import gc

    import torch.distributed as dist

    if not dist.is_initialized():
        return
    dist.barrier()
    gc.collect()
    dist.destroy_process_group()
    time.sleep(0.05)  # the GIL to gloo's worker threads before the interpreter finalises, as fabric_lite's teardown


def python_for(impl: str) -> str | None:
    """The interpreter that runs ``impl``: this one for raw PyTorch and fabric_lite, :func:`lightning_python` for
    Lightning Fabric and Accelerate."""
    return sys.executable if impl in ("raw", "fabric_lite") else lightning_python()


def compared_impls() -> list[str]:
    """fabric_lite, plus Lightning Fabric and Accelerate when :func:`lightning_python` finds them."""
    return ["fabric_lite"] + (["lightning", "accelerate"] if lightning_python() else [])


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """First quartile, median and third quartile (all three the value itself for a single value)."""
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def summarise(rows: list[dict]) -> list[dict]:
    """One table line per (measure, impl): medians, and the distribution of the per-round ratios to raw PyTorch
    (rank 0's rows only, for the multi-process measurements)."""
    table = []
    for row in rows:
        if row.get("rank", 0) != 0:
            continue
        impl = row["impl"]
        raw, mine = row["times"]["raw"], row["times"][impl]
        ratios = [m / r for m, r in zip(mine, raw, strict=True)]
        low, ratio, high = quartiles(ratios)
        table.append(
            {
                "measure": row["measure"],
                "impl": impl,
                "unit": row.get("unit", "s"),
                "median": statistics.median(mine),
                "raw": statistics.median(raw),
                "ratio": ratio,
                "low": low,
                "high": high,
                "spread": high - low,
            }
        )
    return table


def format_value(value: float | None, unit: str) -> str:
    """``1.234 s``, ``3.66 ms`` or ``172.0 us`` for seconds, ``123.4 MB`` for bytes, empty for ``None``."""
    if value is None:
        return ""
    if unit == "bytes":
        return f"{value / 1e6:.1f} MB"
    if value >= 0.1:
        return f"{value:.3f} s"
    return f"{value * 1e3:.2f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} us"


def print_table(table: list[dict]) -> None:
    width = max([len("measure"), *(len(row["measure"]) for row in table)]) + 1  # a name never runs into the next
    print(f"{'measure':<{width}}{'implementation':<16}{'median':>12}{'raw PyTorch':>14}{'ratio':>9}{'spread':>9}")
    for row in table:
        unit = row.get("unit", "s")
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}x"
        print(
            f"{row['measure']:<{width}}{row['impl']:<16}{format_value(row['median'], unit):>12}"
            f"{format_value(row['raw'], unit):>14}{ratio:>9}{row['spread']:>9.3f}"
        )
