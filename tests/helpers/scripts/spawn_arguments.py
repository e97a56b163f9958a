"""What a spawned worker receives from the launching process: its arguments and its global state.

python tests/helpers/scripts/spawn_arguments.py START_METHOD

The launching process seeds torch, numpy and Python, turns deterministic algorithms and cuDNN's benchmark flag on,
then launches 2 ranks with a module (two tied layers and a buffer) and a plain tensor as arguments. Each rank prints a
RESULT line: what it sees of the arguments (shared memory, ties), the flags, its first random numbers, and how much its
module's weight changed when rank 0 added 1 to its own in place. The launching process prints a PARENT line: the numbers
it would have drawn next, and whether its module's weight is unchanged.
"""

from __future__ import annotations

import json
import os
import random
import sys
from datetime import timedelta

import numpy as np
import torch
from torch import nn

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy


class Tied(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.tied = nn.Linear(2, 2)
        self.tied.weight = self.layer.weight
        self.register_buffer("buffer", torch.ones(3))


def draws() -> list[float]:
    return [torch.rand(1).item(), float(np.random.rand()), random.random()]


def worker(fabric: Fabric, model: Tied, tensor: torch.Tensor) -> None:
    seen = {
        "rank": fabric.global_rank,
        "tensor_shared": tensor.is_shared(),
        "params_shared": [p.is_shared() for p in model.parameters()],
        "buffer_shared": model.buffer.is_shared(),
        "tied": model.layer.weight is model.tied.weight,
        "initial_seed": torch.initial_seed(),
        "deterministic": torch.are_deterministic_algorithms_enabled(),
        "cudnn_benchmark": torch.backends.cudnn.benchmark,
        "draws": draws(),
    }
    before = model.layer.weight.detach().clone()
    if fabric.global_rank == 0:
        with torch.no_grad():
            model.layer.weight.add_(1.0)  # in place, as an optimizer step is
    fabric.barrier()
    seen["weight_change"] = (model.layer.weight - before).abs().max().item()
    fabric.barrier()  # rank 0 must not leave (and free its storage) before the others have read
    os.write(1, f"RESULT {json.dumps(seen)}\n".encode())


def main() -> None:
    torch.manual_seed(123)
    np.random.seed(123)
    random.seed(123)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = True
    model, tensor = Tied(), torch.rand(4)
    weight = model.layer.weight.detach().clone()
    # the numbers this process would draw next, with its generators put back: what each rank should draw first
    states = torch.get_rng_state(), np.random.get_state(), random.getstate()
    expected = draws()
    torch.set_rng_state(states[0])
    np.random.set_state(states[1])
    random.setstate(states[2])
    strategy = DDPStrategy(start_method=sys.argv[1], timeout=timedelta(seconds=60))
    Fabric(accelerator="cpu", devices=2, strategy=strategy).launch(worker, model, tensor)
    unchanged = torch.equal(model.layer.weight, weight)
    os.write(1, f"PARENT {json.dumps({'draws': expected, 'weight_unchanged': unchanged})}\n".encode())


if __name__ == "__main__":
    main()
