"""Strategies: how training runs across devices and processes."""

from fabric_lite.strategies.ddp import DDPStrategy
from fabric_lite.strategies.dp import DataParallelStrategy
from fabric_lite.strategies.fsdp import FSDPStrategy
from fabric_lite.strategies.horovod import HorovodStrategy
from fabric_lite.strategies.parallel import ParallelStrategy
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.strategies.single_device import SingleDeviceStrategy
from fabric_lite.strategies.strategy import Strategy

__all__ = [
    "STRATEGY_REGISTRY",
    "DDPStrategy",
    "DataParallelStrategy",
    "FSDPStrategy",
    "HorovodStrategy",
    "ParallelStrategy",
    "SingleDeviceStrategy",
    "Strategy",
]
