"""Every built-in strategy name, in one visible table.

``grep '"ddp_spawn"'`` lands here. Each entry says which class the name builds, with which keyword arguments,
whether it runs one process per device, and how the extra processes are started:

* ``popen``: the script is run again once per extra local rank (like ``torch.distributed.run``),
* ``spawn`` / ``fork``: ``Fabric.launch(fn)`` starts one process per device with that start method,
* ``None``: a single process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

StartMethod = Literal["popen", "spawn", "fork"]


@dataclass(frozen=True)
class StrategyEntry:
    """What a strategy name stands for."""

    class_name: str
    parallel: bool
    start_method: StartMethod | None
    description: str
    init_kwargs: dict[str, Any] = field(default_factory=dict)


STRATEGY_REGISTRY: dict[str, StrategyEntry] = {
    "single_device": StrategyEntry("SingleDeviceStrategy", False, None, "one process on one device"),
    "ddp": StrategyEntry(
        "DDPStrategy",
        True,
        "popen",
        "DistributedDataParallel; the script is re-run once per extra local rank",
        {"start_method": "popen"},
    ),
    "ddp_spawn": StrategyEntry(
        "DDPStrategy",
        True,
        "spawn",
        "DistributedDataParallel; launch(fn) spawns one process per device",
        {"start_method": "spawn"},
    ),
    "ddp_fork": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "DistributedDataParallel; launch(fn) forks one process per device",
        {"start_method": "fork"},
    ),
    "ddp_notebook": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "alias of ddp_fork, for notebooks",
        {"start_method": "fork"},
    ),
    "ddp_find_unused_parameters_true": StrategyEntry(
        "DDPStrategy",
        True,
        "popen",
        "ddp with find_unused_parameters=True",
        {"start_method": "popen", "find_unused_parameters": True},
    ),
}
