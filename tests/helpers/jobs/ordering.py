"""rank_zero_first ordering (run by tests/distributed/test_ordering.py)."""

from __future__ import annotations

import time
from pathlib import Path


def rank_zero_first(fabric, path: str, local: bool) -> str:
    log = Path(path)
    with fabric.rank_zero_first(local=local):
        if fabric.global_rank == 0:
            time.sleep(0.5)  # the others must wait for this, not run alongside it
        with open(log, "a") as f:
            f.write(f"{fabric.global_rank}\n")
    fabric.barrier()
    return log.read_text()
