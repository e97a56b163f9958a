"""``strategy="dp"`` on a machine without CUDA, under Lightning Fabric or fabric_lite (run by tests/unit/test_dp.py).

    python tests/helpers/scripts/dp_compat.py lightning|fabric_lite

Prints ``RESULT {json}``: what ``Fabric(strategy="dp")`` becomes and warns, and what an explicit
``DataParallelStrategy`` instance does on the CPU (wrapping, forward, state dict keys, collectives).
"""

from __future__ import annotations

import json
import os
import sys
import warnings

import torch
from torch import nn


def main() -> None:
    if sys.argv[1] == "lightning":
        from lightning_fabric import Fabric
        from lightning_fabric.strategies import DataParallelStrategy
    else:
        from fabric_lite import Fabric
        from fabric_lite.strategies import DataParallelStrategy
    result: dict = {}
    for name, kwargs in (
        ("cpu", {"accelerator": "cpu"}),
        ("auto", {}),
        ("cpu_two", {"accelerator": "cpu", "devices": 2}),
    ):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            fabric = Fabric(strategy="dp", **kwargs)
        result[name] = {
            "strategy": type(fabric.strategy).__name__,
            "world_size": fabric.world_size,
            "dp_warnings": [str(w.message) for w in caught if "'dp'" in str(w.message)],
        }
    fabric = Fabric(accelerator="cpu", strategy=DataParallelStrategy())
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    expected = model(x).detach()
    wrapped, optimizer = fabric.setup(model, optimizer)
    out = wrapped(x)  # without CUDA, DataParallel calls the module directly
    same_output = bool(torch.equal(out.detach(), expected))
    fabric.backward(out.sum())
    optimizer.step()
    result["instance"] = {
        "strategy": type(fabric.strategy).__name__,
        "device": str(fabric.device),
        "wrapper": type(wrapped._forward_module).__name__,
        "same_output": same_output,
        "stepped": not bool(torch.equal(wrapped(x).detach(), expected)),
        "state_keys": sorted(fabric.strategy.get_module_state_dict(wrapped._forward_module)),
        "mean": fabric.all_reduce(torch.tensor([1.0, 3.0])).tolist(),
        "gather": fabric.all_gather(torch.tensor([1.0, 3.0])).tolist(),
        "broadcast": fabric.broadcast({"a": 1}),
        "decision": fabric.strategy.reduce_boolean_decision(False),
        "sampler": fabric.strategy.distributed_sampler_kwargs,
    }
    os.write(1, ("RESULT " + json.dumps(result) + "\n").encode())


if __name__ == "__main__":
    main()
