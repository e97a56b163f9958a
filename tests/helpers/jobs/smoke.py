import torch


def ranks(fabric):
    return {
        "rank": fabric.global_rank,
        "world": fabric.world_size,
        "sum": fabric.all_reduce(torch.tensor(float(fabric.global_rank + 1)), reduce_op="sum").item(),
    }
