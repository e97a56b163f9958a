"""The raw-PyTorch reference for the parity test: the same 10 steps with DistributedDataParallel by hand.

python tests/helpers/scripts/raw_ddp.py OUT_PATH
"""

from __future__ import annotations

import gc
import os
import pickle
import random
import sys
import tempfile
import time
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler

from tests.helpers.jobs.training import BATCH, STEPS, flat_grads, flat_params, make_dataset, make_model


def worker(rank: int, world: int, store_path: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo", init_method=f"file://{store_path}", rank=rank, world_size=world, timeout=timedelta(seconds=30)
    )
    train(rank, world, out_dir)
    # DDP is gone now: the group is released from Python, never by DDP's reducer (which can hang the process; see
    # benchmarks/_common.py's leave_process_group)
    gc.collect()
    dist.destroy_process_group()
    # raw PyTorch aborts now and then at exit here (gloo worker threads still releasing DDP's last all-reduce
    # when the interpreter finalises); give them the GIL first, as fabric_lite's teardown does
    time.sleep(0.05)


def train(rank: int, world: int, out_dir: str) -> None:
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    model = make_model()
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
    dataset = make_dataset()
    sampler = DistributedSampler(dataset, num_replicas=world, rank=rank, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=BATCH, sampler=sampler)
    losses, grads = [], []
    epoch = step = 0
    while step < STEPS:
        sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(ddp(x), y)
            optimizer.zero_grad()
            loss.backward()
            grads.append(flat_grads(model))
            optimizer.step()
            losses.append(loss.item())
            step += 1
            if step == STEPS:
                break
        epoch += 1
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump({"losses": losses, "grads": grads, "params": flat_params(model)}, f)


def main() -> None:
    out_path = sys.argv[1]
    world = 2
    with tempfile.TemporaryDirectory() as tmp:
        mp.start_processes(worker, args=(world, os.path.join(tmp, "store"), tmp), nprocs=world, start_method="spawn")
        results = []
        for rank in range(world):
            with open(os.path.join(tmp, f"rank{rank}.pkl"), "rb") as f:
                results.append(pickle.load(f))
    with open(out_path, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main()
