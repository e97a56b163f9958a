"""Only global rank 0 builds a logger (a common pattern in public scripts); the job must not hang.

Started by ``fabric-lite run`` (``Fabric()`` joins the process group) or by torchrun (``launch()`` does). Writes
``result_rank{R}.json`` into ROOT with the all-reduced value and the logger's folder.

python tests/helpers/scripts/logger_on_rank_zero_only.py ROOT {cli|torchrun}
"""

from __future__ import annotations

import json
import os
import sys

import torch

from fabric_lite import Fabric
from fabric_lite.loggers import CSVLogger

root, runner = sys.argv[1], sys.argv[2]
rank = int(os.environ["RANK"])
fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp", loggers=CSVLogger(root) if rank == 0 else None)
if runner == "torchrun":
    fabric.launch()
total = fabric.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum")
fabric.log("total", total, step=0)
log_dir = fabric.logger.log_dir if fabric.loggers else None
with open(os.path.join(root, f"result_rank{rank}.json"), "w") as f:
    json.dump({"rank": fabric.global_rank, "total": total.item(), "log_dir": log_dir}, f)
