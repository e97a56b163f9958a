"""fabric_lite's own cost per call, with the communication taken out.

    .venv/bin/python benchmarks/overhead.py

On a small, busy machine the time of a collective swings by tens of percent between runs, which hides what
fabric_lite itself adds. This script measures exactly that: it joins a one-process gloo group, replaces the
``torch.distributed`` calls that move data by no-ops, and times the fabric_lite calls against nothing; it also
times each piece of a training step against the same piece in raw PyTorch. The figures are microseconds of
host work per call, which is what fabric_lite adds to any collective or step, on any backend.
"""

from __future__ import annotations

import os
import socket
import tempfile
import timeit
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from fabric_lite import Fabric
from fabric_lite.runtime.collectives import broadcasts, checked, gather, ops, predicted
from fabric_lite.runtime.diagnostics import trail as _trail

#: the collectives' modules that call torch.distributed
_MODULES = (ops, checked, gather, predicted, broadcasts)


class _NoCommunication:
    """Stands in for ``torch.distributed`` inside fabric_lite's collectives: every data-moving call does nothing."""

    def __init__(self) -> None:
        def nothing(*_: Any, **__: Any) -> None:
            return None

        for name in ("all_reduce", "broadcast", "all_gather_single", "all_gather_into_tensor", "all_gather_object"):
            setattr(self, name, nothing)

    def __getattr__(self, name: str) -> Any:
        return getattr(dist, name)


def best_of(stmt: Callable[[], Any], number: int = 2000, repeat: int = 7) -> float:
    """Microseconds per call: the best of ``repeat`` runs of ``number`` calls (the least disturbed one)."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e6


# what a collective does for the trail, called as from Fabric (one frame of fabric_lite's above the strategy's, which
# the site lookup walks past), and the same calls without it; compiled under fabric_lite's folder for that walk
_TRAIL_CALLS = """
def strategy_call(trail, group, tensors, key):
    slot = trail.enter(group, trail.describe("all_reduce(reduce_op=sum)", tensors, key), 1)
    trail.exit(slot)

def fabric_call(trail, group, tensors, key):
    strategy_call(trail, group, tensors, key)

def strategy_bare(trail, group, tensors, key):
    pass

def fabric_bare(trail, group, tensors, key):
    strategy_bare(trail, group, tensors, key)
"""


def trail_cost(number: int = 100_000) -> tuple[float, float]:
    """Microseconds per collective with the trail's enter and exit, and without (the calls around them only)."""
    calls: dict[str, Any] = {}
    exec(compile(_TRAIL_CALLS, os.path.join(_trail._PACKAGE_ROOT, "_overhead_calls.py"), "exec"), calls)
    with tempfile.TemporaryDirectory() as folder:
        trail = _trail.Trail(folder, rank=0, world_size=2)
        group = checked.GroupState.__new__(checked.GroupState)
        group.seq, group.trail_index = 0, 0
        tensors = [torch.tensor(1.0)]
        key = checked.call_key("all_reduce(reduce_op=sum)", tensors)  # worked out for the checked core anyway
        fabric_call, fabric_bare = calls["fabric_call"], calls["fabric_bare"]
        mine = best_of(lambda: fabric_call(trail, group, tensors, key), number, 5)
        theirs = best_of(lambda: fabric_bare(trail, group, tensors, key), number, 5)
        trail.close(remove=True)
    return mine, theirs


def main() -> None:
    torch.set_num_threads(1)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    fabric = Fabric(accelerator="cpu", devices=1, strategy="ddp")
    fabric.launch()

    rows: list[tuple[str, float, float | None]] = []
    stand_in = _NoCommunication()
    for module in _MODULES:
        module.dist = stand_in  # type: ignore[assignment]
    try:
        scalar = torch.tensor(1.0)
        dict64 = {f"m{i}": torch.tensor(float(i)) for i in range(64)}
        metrics = {"loss": torch.tensor(0.5), "accuracy": torch.tensor(0.9), "count": 64}
        vector = torch.zeros(1024)
        rows += [
            ("all_reduce(scalar, 'sum')", best_of(lambda: fabric.all_reduce(scalar, reduce_op="sum")), None),
            ("all_reduce(scalar, 'mean')", best_of(lambda: fabric.all_reduce(scalar)), None),
            ("all_reduce(3 metrics, one an int)", best_of(lambda: fabric.all_reduce(metrics)), None),
            ("all_reduce(dict of 64 scalars)", best_of(lambda: fabric.all_reduce(dict64, reduce_op="sum"), 500), None),
            ("broadcast(1024 floats), sender", best_of(lambda: fabric.broadcast(vector, src=0)), None),
        ]
    finally:
        for module in _MODULES:
            module.dist = dist

    torch.manual_seed(0)
    raw = nn.Linear(32, 32)
    plain = nn.Linear(32, 32)
    plain.load_state_dict(raw.state_dict())
    raw_opt = torch.optim.SGD(raw.parameters(), lr=1e-3)
    model, optimizer = Fabric(accelerator="cpu", devices=1).setup(plain, torch.optim.SGD(plain.parameters(), lr=1e-3))
    single = model._strategy
    x, y = torch.randn(64, 32), torch.randn(64, 32)

    def raw_backward() -> None:
        nn.functional.mse_loss(raw(x), y).backward()

    def fabric_backward() -> None:
        single.backward(nn.functional.mse_loss(model(x), y), None)

    rows += [
        ("forward (Linear 32)", best_of(lambda: model(x), 20000), best_of(lambda: raw(x), 20000)),
        ("forward + backward", best_of(fabric_backward, 5000), best_of(raw_backward, 5000)),
        ("optimizer.step()", best_of(optimizer.step, 20000), best_of(raw_opt.step, 20000)),
        ("optimizer.zero_grad()", best_of(optimizer.zero_grad, 20000), best_of(raw_opt.zero_grad, 20000)),
    ]
    fabric.strategy.teardown()
    rows.append(("trail of collectives (enter + exit)", *trail_cost()))

    print(f"{'call':<36}{'fabric_lite':>13}{'raw PyTorch':>13}{'added':>10}")
    for name, mine, theirs in rows:
        if theirs is None:
            print(f"{name:<36}{mine:>10.1f} us{'(no comm.)':>13}{mine:>7.1f} us")
        else:
            print(f"{name:<36}{mine:>10.1f} us{theirs:>10.1f} us{mine - theirs:>7.1f} us")


if __name__ == "__main__":
    main()
