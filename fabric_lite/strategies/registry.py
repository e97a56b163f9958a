"""Every built-in strategy name, in one visible table.

``grep '"ddp_spawn"'`` lands here. Each entry says which class the name builds, with which keyword arguments,
whether it runs one process per device, and how the extra processes are started:

* ``popen``: the script is run again once per extra local rank (like ``torch.distributed.run``),
* ``spawn`` / ``fork``: ``Fabric.launch(fn)`` starts one process per device with that start method,
* ``None``: a single process (``dp`` drives several devices from it), or processes that an outside launcher
  starts (``horovodrun`` for ``horovod``).

The ``deepspeed*`` names are Lightning Fabric's; their keyword arguments are ``DeepSpeedStrategy``'s.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from fabric_lite.strategies.strategy import Strategy

StartMethod = Literal["popen", "spawn", "fork"]


@dataclass(frozen=True)
class StrategyEntry:
    """What a strategy name stands for. ``Fabric`` asks the class itself (:meth:`load`) everything else: whether it
    runs one process per device, drives several devices, shards parameters, ... (see :class:`Strategy`), so a new
    strategy plugs in with an entry of its own.

    Example::

        STRATEGY_REGISTRY["my_ddp"] = StrategyEntry(
            "MyDDPStrategy", True, "popen", "DDP with my hooks", {"start_method": "popen"}, module="my_project.ddp"
        )
        Fabric(strategy="my_ddp", devices=2)
    """

    class_name: str
    parallel: bool
    start_method: StartMethod | None
    description: str
    init_kwargs: dict[str, Any] = field(default_factory=dict)
    #: one process drives every selected device (``DataParallel``), so several devices need no extra process
    multi_device: bool = False
    #: the module that defines ``class_name`` (fabric_lite's strategies load theirs on first use)
    module: str = "fabric_lite.strategies"

    def load(self) -> type[Strategy]:
        """The class the name builds, imported on first use.

        Example::

            STRATEGY_REGISTRY["fsdp"].load()  # <class 'fabric_lite.strategies.fsdp.FSDPStrategy'>
        """
        cls: type[Strategy] = getattr(importlib.import_module(self.module), self.class_name)
        return cls


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
    # Lightning's other spellings of find_unused_parameters, one per start method
    "ddp_find_unused_parameters_false": StrategyEntry(
        "DDPStrategy",
        True,
        "popen",
        "ddp with find_unused_parameters=False (the default)",
        {"start_method": "popen", "find_unused_parameters": False},
    ),
    "ddp_spawn_find_unused_parameters_true": StrategyEntry(
        "DDPStrategy",
        True,
        "spawn",
        "ddp_spawn with find_unused_parameters=True",
        {"start_method": "spawn", "find_unused_parameters": True},
    ),
    "ddp_spawn_find_unused_parameters_false": StrategyEntry(
        "DDPStrategy",
        True,
        "spawn",
        "ddp_spawn with find_unused_parameters=False (the default)",
        {"start_method": "spawn", "find_unused_parameters": False},
    ),
    "ddp_fork_find_unused_parameters_true": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "ddp_fork with find_unused_parameters=True",
        {"start_method": "fork", "find_unused_parameters": True},
    ),
    "ddp_fork_find_unused_parameters_false": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "ddp_fork with find_unused_parameters=False (the default)",
        {"start_method": "fork", "find_unused_parameters": False},
    ),
    "ddp_notebook_find_unused_parameters_true": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "ddp_notebook with find_unused_parameters=True",
        {"start_method": "fork", "find_unused_parameters": True},
    ),
    "ddp_notebook_find_unused_parameters_false": StrategyEntry(
        "DDPStrategy",
        True,
        "fork",
        "ddp_notebook with find_unused_parameters=False (the default)",
        {"start_method": "fork", "find_unused_parameters": False},
    ),
    "dp": StrategyEntry(
        "DataParallelStrategy",
        False,
        None,
        "torch.nn.DataParallel: one process, the module replicated on every selected CUDA device"
        " (on a machine without CUDA, Fabric warns and runs 'ddp', as Lightning Fabric does)",
        multi_device=True,
    ),
    "fsdp": StrategyEntry(
        "FSDPStrategy",
        True,
        "popen",
        "fully sharded data parallel on torch's fully_shard (FSDP2); the script is re-run once per extra local rank",
        {"start_method": "popen"},
    ),
    "fsdp_cpu_offload": StrategyEntry(
        "FSDPStrategy",
        True,
        "popen",
        "fsdp with the sharded parameters, gradients and optimizer step kept on the CPU",
        {"start_method": "popen", "cpu_offload": True},
    ),
    "horovod": StrategyEntry(
        "HorovodStrategy",
        True,
        None,
        "Horovod (optional dependency): horovodrun starts one process per device, fabric_lite starts none",
    ),
    "deepspeed": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed (optional dependency), ZeRO stage 2; the script is re-run once per extra local rank",
    ),
    "deepspeed_stage_1": StrategyEntry(
        "DeepSpeedStrategy", True, "popen", "DeepSpeed with ZeRO stage 1 (optimizer state sharded)", {"stage": 1}
    ),
    "deepspeed_stage_1_offload": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 1 and the optimizer offloaded to the CPU",
        {"stage": 1, "offload_optimizer": True},
    ),
    "deepspeed_stage_2": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 2 (optimizer state and gradients sharded)",
        {"stage": 2},
    ),
    "deepspeed_stage_2_offload": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 2 and the optimizer offloaded to the CPU",
        {"stage": 2, "offload_optimizer": True},
    ),
    "deepspeed_stage_3": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 3 (optimizer state, gradients and parameters sharded)",
        {"stage": 3},
    ),
    "deepspeed_stage_3_offload": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 3, the optimizer and the parameters offloaded to the CPU",
        {"stage": 3, "offload_optimizer": True, "offload_parameters": True},
    ),
    "deepspeed_stage_3_offload_nvme": StrategyEntry(
        "DeepSpeedStrategy",
        True,
        "popen",
        "DeepSpeed with ZeRO stage 3, the optimizer and the parameters offloaded to NVMe (nvme_path)",
        {
            "stage": 3,
            "offload_optimizer": True,
            "offload_parameters": True,
            "remote_device": "nvme",
            "offload_params_device": "nvme",
            "offload_optimizer_device": "nvme",
        },
    ),
}
