"""A script written against Lightning Fabric (only its imports: `lightning`, `lightning.fabric`), run on two CPU
processes under fabric_lite's import hook (tests/compat/test_as_lightning.py).

python -m fabric_lite.as_lightning tests/helpers/scripts/as_lightning_ddp.py {ddp|ddp_spawn|cli}
"""

from __future__ import annotations

import sys

import lightning as L
import torch
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.utilities.load import _lazy_load  # a private name real clients import


def run(fabric: L.Fabric) -> None:
    total = fabric.all_reduce(torch.tensor(fabric.global_rank + 1.0), reduce_op="sum")
    served_by = type(fabric).__module__.split(".")[0]
    assert isinstance(fabric.strategy, DDPStrategy)
    # one write per line: the two processes share the pipe
    sys.stdout.write(f"RANK {fabric.global_rank} {served_by} {type(fabric.strategy).__name__} {total.item()}\n")
    sys.stdout.flush()


def main() -> None:
    how = sys.argv[1]
    assert callable(_lazy_load)
    if how == "cli":  # started by `fabric-lite run --as-lightning`: Fabric() takes its settings from the command
        run(L.Fabric())
        return
    fabric = L.Fabric(accelerator="cpu", devices=2, strategy=how)
    if how == "ddp_spawn":
        fabric.launch(run)
    else:
        fabric.launch()
        run(fabric)


if __name__ == "__main__":
    main()
