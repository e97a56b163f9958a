"""Run every benchmark and print one table of side-by-side ratios.

    .venv/bin/python benchmarks/run.py            # full run (a few minutes on 2 cores)
    .venv/bin/python benchmarks/run.py --quick    # smoke run: the benchmarks work; the figures mean little

fabric_lite runs from this interpreter; Lightning Fabric and Accelerate run from ``.venv-lightning`` (made by
``.ci/setup``) when it exists, and are skipped with a note when not. Each figure is a ratio to raw PyTorch
measured in the same process in paired, interleaved rounds: ``ratio`` is the median over rounds of
(implementation time / raw time), ``spread`` the interquartile range of those per-round ratios. The results,
with the machine, the torch version and the date, are also written to ``benchmarks/out/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CORE = str(REPO / "benchmarks" / "bench_core.py")
LIGHTNING_PYTHON = REPO / ".venv-lightning" / "bin" / "python"
IMPORTS = {"fabric_lite": "fabric_lite", "lightning": "lightning_fabric", "accelerate": "accelerate"}


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    return env


def _python(impl: str) -> str | None:
    if impl == "fabric_lite":
        return sys.executable
    return str(LIGHTNING_PYTHON) if LIGHTNING_PYTHON.is_file() else None


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=4)
    return q[0], statistics.median(values), q[2]


def import_times(impls: list[str], runs: int) -> list[dict]:
    """Seconds that ``import X`` adds to ``import torch``, in interleaved fresh interpreters."""
    code = "import time; import torch; t = time.perf_counter(); import {module}; print(time.perf_counter() - t)"
    samples: dict[str, list[float]] = {impl: [] for impl in impls}
    for _ in range(runs):
        for impl in impls:
            out = subprocess.run(
                [_python(impl), "-c", code.format(module=IMPORTS[impl])],  # type: ignore[list-item]
                capture_output=True,
                text=True,
                env=_env(),
                timeout=120,
                check=True,
            )
            samples[impl].append(float(out.stdout.strip().splitlines()[-1]))
    return [
        {
            "measure": "import (s over torch)",
            "impl": impl,
            "median": statistics.median(s),
            "raw": None,
            "ratio": None,
            "spread": _quartiles(s)[2] - _quartiles(s)[0],
        }
        for impl, s in samples.items()
    ]


def _core(python: str, args: list[str], torchrun: bool) -> list[dict]:
    command = (
        [python, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", CORE]
        if torchrun
        else [python, CORE]
    )
    done = subprocess.run([*command, *args], capture_output=True, text=True, env=_env(), timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(command + args)} failed:\n{done.stdout}\n{done.stderr}")
    return [json.loads(line[7:]) for line in done.stdout.splitlines() if line.startswith("RESULT ")]


def summarise(rows: list[dict]) -> list[dict]:
    """One line per (measure, impl): medians and the distribution of per-round ratios (rank 0 for DDP)."""
    table = []
    for row in rows:
        if row.get("rank", 0) != 0:
            continue
        impl = row["impl"]
        raw, mine = row["times"]["raw"], row["times"][impl]
        ratios = [m / r for m, r in zip(mine, raw, strict=True)]
        low, ratio, high = _quartiles(ratios)
        table.append(
            {
                "measure": row["measure"],
                "impl": impl,
                "median": statistics.median(mine),
                "raw": statistics.median(raw),
                "ratio": ratio,
                "spread": high - low,
            }
        )
    return table


def print_table(table: list[dict]) -> None:
    print(f"{'measure':<24}{'implementation':<16}{'median':>12}{'raw PyTorch':>14}{'ratio':>9}{'spread':>9}")
    for row in table:
        unit = 1.0 if row["measure"].startswith("import") else 1e6
        suffix = " s" if unit == 1.0 else " us"
        median = f"{row['median'] * unit:.3f}{suffix}" if unit == 1.0 else f"{row['median'] * unit:.1f}{suffix}"
        raw = "" if row["raw"] is None else f"{row['raw'] * unit:.1f}{suffix}"
        ratio = "" if row["ratio"] is None else f"{row['ratio']:.3f}x"
        print(f"{row['measure']:<24}{row['impl']:<16}{median:>12}{raw:>14}{ratio:>9}{row['spread']:>9.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a short smoke run")
    parser.add_argument("--out", default=str(REPO / "benchmarks" / "out" / "results.json"))
    args = parser.parse_args()
    quick = ["--quick"] if args.quick else []
    impls = ["fabric_lite"] + (["lightning", "accelerate"] if LIGHTNING_PYTHON.is_file() else [])
    if len(impls) == 1:
        print("note: .venv-lightning is missing (run .ci/setup): Lightning Fabric and Accelerate are skipped")
    started = time.time()
    table = import_times(impls, 3 if args.quick else 15)
    for impl in impls:
        table += summarise(_core(_python(impl), ["step", impl, *quick], torchrun=False))  # type: ignore[arg-type]
    for impl in [i for i in impls if i != "accelerate"]:
        table += summarise(_core(_python(impl), ["ddp", impl, *quick], torchrun=True))  # type: ignore[arg-type]
    table.sort(key=lambda row: (row["measure"], row["impl"] != "fabric_lite", row["impl"]))
    print_table(table)
    import torch

    record = {
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
        },
        "torch": torch.__version__,
        "quick": args.quick,
        "seconds": round(time.time() - started, 1),
        "results": table,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(record, indent=2))
    print(f"\nwritten to {out} ({record['seconds']} s, torch {torch.__version__}, {record['machine']['cpus']} CPUs)")


if __name__ == "__main__":
    main()
