"""Loggers and progress bars used directly on every rank (no Fabric routing): only global rank 0 may write."""

from __future__ import annotations

import io
import os

from fabric_lite.loggers import CSVLogger, TensorBoardLogger
from fabric_lite.loggers.logger import _DummyExperiment
from fabric_lite.utilities import progress_bar


def standalone_loggers(fabric, root, tensorboard):
    rank = fabric.global_rank
    # explicit versions, so that every rank names the same folder without Fabric's help
    loggers = [CSVLogger(root, name="csv", version=0)]
    if tensorboard:
        loggers.append(TensorBoardLogger(root, name="tb", version=0))
    dummy_experiment = [isinstance(logger.experiment, _DummyExperiment) for logger in loggers]
    for logger in loggers:
        for step in range(2):
            logger.log_metrics({"value": float(10 * rank + step)}, step=step)
        logger.save()
        logger.finalize("success")
    fabric.barrier()  # rank 1 looks at the disk only once rank 0 is done writing
    return {
        "rank": rank,
        "dummy_experiment": dummy_experiment,
        "log_dirs": [logger.log_dir for logger in loggers],
        "files": sorted(os.path.relpath(os.path.join(d, n), root) for d, _, names in os.walk(root) for n in names),
    }


def progress_on_ranks(fabric, items):
    out = io.StringIO()
    bar = progress_bar(range(items), fabric=fabric, desc=f"rank {fabric.global_rank}", backend="plain", file=out)
    seen = []
    for item in bar:
        seen.append(item)
        bar.set_postfix(item=item)
    # without fabric, the bar asks torch.distributed for the rank
    out_dist = io.StringIO()
    seen_dist = list(progress_bar(range(items), backend="plain", file=out_dist))
    return {"seen": seen, "out": out.getvalue(), "seen_dist": seen_dist, "out_dist": out_dist.getvalue()}
