"""Run a job function on N CPU ranks with fabric_lite's ddp_fork launcher; pickle every rank's result.

python -m tests.helpers.jobs._runner tests.helpers.jobs.module:function NPROCS '{"kwarg": 1}' OUT_PATH

Forked, not spawned: the ranks inherit the imported torch and fabric_lite instead of importing them again (about
3 s of CPU a rank, over a hundred job runs in the suite). The spawn launcher has tests of its own
(tests/distributed/test_launchers.py, tests/compat/test_compat.py, tests/distributed/test_fabric_run.py).
"""

from __future__ import annotations

import importlib
import json
import pickle
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from fabric_lite import Fabric
from fabric_lite.strategies import DDPStrategy


def _run(fabric: Fabric, target: str, kwargs: dict[str, Any]) -> list[Any]:
    module, name = target.split(":")
    result = getattr(importlib.import_module(module), name)(fabric, **kwargs)
    results: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(results, result)  # torch's own object gather, independent of fabric_lite
    return results


def dump_all_ranks(fabric: Fabric, result: Any, out: str) -> None:
    """Gather every rank's ``result`` (torch's own object gather) and have rank 0 pickle the list to ``out``."""
    results: list[Any] = [None] * fabric.world_size
    dist.all_gather_object(results, result)
    if fabric.global_rank == 0:
        with open(out, "wb") as f:
            pickle.dump(results, f)


def serve(make_fabric: Callable[[int, dict[str, Any]], Fabric], run: Callable[[Fabric, dict[str, Any]], Any]) -> None:
    """The ``main()`` of a job module started by Fabric's script launcher, from its command line:

    * ``JOB NPROCS OPTIONS_JSON OUT``: ``make_fabric(NPROCS, options)``, launched; every rank's ``run(fabric,
      options)`` (options with ``"job": JOB``) pickled to ``OUT`` as a list;
    * ``series NPROCS '[OPTIONS, ...]' OUT``: each entry in turn, each with a Fabric of its own (which joins the
      processes the first one started: a process costs seconds of CPU to start); every rank's results as a dict by
      each entry's ``"name"``.
    """
    job, nprocs, options_json, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    series = job == "series"
    entries = json.loads(options_json) if series else [{**json.loads(options_json), "job": job, "name": job}]
    results = {}
    for entry in entries:
        fabric = make_fabric(nprocs, entry)
        fabric.launch()
        results[entry["name"]] = run(fabric, entry)
    dump_all_ranks(fabric, results if series else results[job], out)


def main() -> None:
    target, nprocs, kwargs, out = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), sys.argv[4]
    # the process group must form within a minute: forked ranks need no imports; the minute covers a loaded 2-core
    # machine (the other test worker running its own jobs)
    strategy = DDPStrategy(start_method="fork", timeout=timedelta(seconds=60))
    fabric = Fabric(accelerator="cpu", devices=nprocs, strategy=strategy)
    importlib.import_module(target.split(":")[0])  # here, once: the forked ranks inherit it (a test module, often)
    results = fabric.launch(_run, target, kwargs)
    with open(out, "wb") as f:
        pickle.dump(results, f)


if __name__ == "__main__":
    main()
