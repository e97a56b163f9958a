"""What ``torch.compile`` costs and gains with fabric_lite, on one CPU process: compile time and step time of a small
MLP, compiled (inductor, set up by ``fabric.setup``) against eager, with a cold and then a warm compile cache, and
the same compiled MLP in a raw PyTorch loop (no Fabric) beside it.

    .venv/bin/python benchmarks/compile.py [--steps 50] [--width 256]

Each measurement runs in a fresh process (a warm cache is only worth something to a new process); the cache is a
temporary folder (``TORCHINDUCTOR_CACHE_DIR``), empty for the cold run and filled by it for the warm one.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]


def _child(steps: int, width: int, compiled: bool, raw: bool) -> dict[str, float]:
    import torch
    from torch import nn

    from fabric_lite import Fabric

    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width), nn.GELU(), nn.Linear(width, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01)
    if raw:
        model: Any = torch.compile(net) if compiled else net
        backward = torch.Tensor.backward
    else:
        fabric = Fabric(accelerator="cpu", devices=1)
        model, optimizer = fabric.setup(torch.compile(net) if compiled else net, optimizer)
        backward = fabric.backward
    x, y = torch.randn(64, width), torch.randn(64, 1)

    def step() -> None:
        loss = nn.functional.mse_loss(model(x), y)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()

    start = time.perf_counter()
    step()  # compiles forward and backward when compiled
    first = time.perf_counter() - start
    step()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return {"first_step_s": first, "step_ms": statistics.median(times) * 1e3}


def _run(args: argparse.Namespace, compiled: bool, cache: str, raw: bool = False) -> dict[str, float]:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, PYTHONPATH=str(REPO))
    argv = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--width", str(args.width)]
    argv += ["--compiled"] if compiled else []
    argv += ["--raw"] if raw else []
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise SystemExit(f"child failed:\n{done.stdout}\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--compiled", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--raw", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(_child(args.steps, args.width, args.compiled, args.raw)))
        return
    with tempfile.TemporaryDirectory(prefix="fabric_lite_inductor_") as cache:
        eager = _run(args, compiled=False, cache=cache)
        cold = _run(args, compiled=True, cache=cache)
        warm = _run(args, compiled=True, cache=cache)
        raw = _run(args, compiled=True, cache=cache, raw=True)  # warm too: the same graphs
    print(f"MLP width {args.width}, batch 64, {args.steps} timed steps, one process, {os.cpu_count()} CPU(s)")
    print(f"{'run':<24}{'first step (s)':>16}{'step (ms)':>12}{'step vs eager':>16}")
    rows = (("eager", eager), ("compiled, cold", cold), ("compiled, warm", warm), ("raw torch compiled, warm", raw))
    for name, row in rows:
        ratio = row["step_ms"] / eager["step_ms"]
        print(f"{name:<24}{row['first_step_s']:>16.2f}{row['step_ms']:>12.3f}{ratio:>15.2f}x")
    print(f"fabric_lite compiled step vs raw torch compiled step: {warm['step_ms'] / raw['step_ms']:.2f}x")
    print(f"warm cache: first step {cold['first_step_s'] / warm['first_step_s']:.1f}x faster than cold")


if __name__ == "__main__":
    main()
