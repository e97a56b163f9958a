"""Strategies: how training runs across devices and processes.

``DataParallelStrategy``, ``DeepSpeedStrategy``, ``FSDPStrategy``, ``HorovodStrategy`` and ``ModelParallelStrategy``
are imported on first use (they pull in ``torch.nn.DataParallel``, DeepSpeed, ``torch.distributed.fsdp``, Horovod and
``torch.distributed.tensor``), so that ``import fabric_lite`` stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fabric_lite.strategies.ddp import DDPStrategy
from fabric_lite.strategies.parallel import ParallelStrategy
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.strategies.registry import _StrategyRegistry as _StrategyRegistry  # Lightning's name, here too
from fabric_lite.strategies.single_device import SingleDeviceStrategy
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities._lazy import lazy_getattr

if TYPE_CHECKING:
    from fabric_lite.strategies.deepspeed import DeepSpeedStrategy
    from fabric_lite.strategies.dp import DataParallelStrategy
    from fabric_lite.strategies.fsdp import FSDPStrategy
    from fabric_lite.strategies.horovod import HorovodStrategy
    from fabric_lite.strategies.model_parallel import ModelParallelStrategy
    from fabric_lite.strategies.single_xla import SingleDeviceXLAStrategy
    from fabric_lite.strategies.xla import XLAStrategy
    from fabric_lite.strategies.xla_fsdp import XLAFSDPStrategy

__getattr__ = lazy_getattr(
    __name__,
    {
        "DataParallelStrategy": "fabric_lite.strategies.dp",
        "DeepSpeedStrategy": "fabric_lite.strategies.deepspeed",
        "FSDPStrategy": "fabric_lite.strategies.fsdp",
        "HorovodStrategy": "fabric_lite.strategies.horovod",
        "ModelParallelStrategy": "fabric_lite.strategies.model_parallel",
        "SingleDeviceXLAStrategy": "fabric_lite.strategies.single_xla",
        "SingleTPUStrategy": "fabric_lite.strategies.single_tpu",  # Lightning's former name, deprecated
        "XLAFSDPStrategy": "fabric_lite.strategies.xla_fsdp",
        "XLAStrategy": "fabric_lite.strategies.xla",
    },
)

__all__ = [
    "STRATEGY_REGISTRY",
    "DDPStrategy",
    "DataParallelStrategy",
    "DeepSpeedStrategy",
    "FSDPStrategy",
    "HorovodStrategy",
    "ModelParallelStrategy",
    "ParallelStrategy",
    "SingleDeviceStrategy",
    "SingleDeviceXLAStrategy",
    "Strategy",
    "XLAFSDPStrategy",
    "XLAStrategy",
]
