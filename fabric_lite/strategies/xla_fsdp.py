"""Lightning Fabric's ``XLAFSDPStrategy`` and its module's helpers: importable, an error when used."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal, NoReturn

import torch
from torch.nn import Module

from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.accelerators.xla import _XLA_AVAILABLE as _XLA_AVAILABLE  # Lightning's name here (tests patch it)
from fabric_lite.accelerators.xla import _NeedsXLA, _xla_missing
from fabric_lite.plugins.io.xla import XLACheckpointIO
from fabric_lite.plugins.precision.xla import XLAPrecision
from fabric_lite.strategies.parallel import ParallelStrategy
from fabric_lite.strategies.strategy import _Sharded

_POLICY = set[type[Module]] | Callable[[Module, bool, int], bool]


class XLAFSDPStrategy(_NeedsXLA, _Sharded, ParallelStrategy):
    """Fully sharded data parallel on XLA devices (TPUs), which fabric_lite does not run on; ``FSDPStrategy``
    shards on CPU and CUDA devices.

    Example::

        XLAFSDPStrategy()  # ModuleNotFoundError: XLAFSDPStrategy needs torch_xla and an XLA device ...
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        checkpoint_io: XLACheckpointIO | None = None,
        precision: XLAPrecision | None = None,
        auto_wrap_policy: _POLICY | None = None,
        activation_checkpointing_policy: set[type[Module]] | None = None,
        state_dict_type: Literal["full", "sharded"] = "sharded",
        sequential_save: bool = False,
        **kwargs: Any,
    ) -> None:
        """Lightning's signature; building one raises (``__new__``)."""


def _activation_checkpointing_auto_wrapper(
    policy: set[type[Module]], module: Module, *args: Any, **kwargs: Any
) -> NoReturn:
    """Lightning's XLA activation-checkpointing wrapper (litgpt's TPU code imports it); raises when called."""
    _xla_missing("XLA's activation checkpointing")


__all__ = ["XLAFSDPStrategy"]
