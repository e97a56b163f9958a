"""RELIABILITY 27: many launch-train-teardown cycles in one process leak no process, thread, file or port.

python tests/helpers/scripts/cycles.py CYCLES  ->  prints one JSON line per cycle with what this process holds.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from datetime import timedelta
from typing import Any

import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy


def train(fabric: Fabric, cycle: int) -> list[float]:
    fabric.seed_everything(cycle)
    module = nn.Linear(4, 2)
    model, optimizer = fabric.setup(module, torch.optim.SGD(module.parameters(), lr=0.1))
    for _ in range(3):
        x = torch.randn(8, 4)
        optimizer.zero_grad()
        fabric.backward(model(x).pow(2).mean())
        optimizer.step()
    total = fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum")
    assert total.item() == 3.0, total
    return [p.detach().sum().item() for p in model.parameters()]


def holdings(baseline: int) -> dict[str, Any]:
    """What this process holds now. A thread that has finished its work may still be on its way out when the launch
    returns (seen once in many runs: 1 -> 2 threads): wait for it, up to 5 s, so that only a thread that stays is
    reported, by name."""
    deadline = time.monotonic() + 5.0
    while threading.active_count() > baseline and time.monotonic() < deadline:
        time.sleep(0.01)
    children = 0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children += ppid == os.getpid()
    names = sorted(thread.name for thread in threading.enumerate())
    return {"threads": len(names), "thread_names": names, "fds": len(os.listdir("/proc/self/fd")), "children": children}


def main() -> None:
    cycles = int(sys.argv[1])
    # DistributedDataParallel imports torch._dynamo when it is built (2 s of CPU here): import it once, here, rather
    # than in every forked rank of every cycle (what is measured is what the launches leave behind)
    import torch._dynamo  # noqa: F401

    baseline = threading.active_count()
    for cycle in range(cycles):
        strategy = DDPStrategy(start_method="fork", timeout=timedelta(seconds=30))
        fabric = Fabric(accelerator="cpu", devices=2, strategy=strategy)
        params = fabric.launch(train, cycle)
        print(json.dumps({"cycle": cycle, "params": params, **holdings(baseline)}), flush=True)


if __name__ == "__main__":
    main()
