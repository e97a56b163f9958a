"""Lightning Fabric's ``_Connector``, for code written against it: a thin adapter with Lightning's names over the
plan and build steps ``Fabric(...)`` runs (:func:`fabric_lite._build.plan_and_build`); it decides nothing itself."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import replace

import torch

from fabric_lite._build import plan_and_build
from fabric_lite._cli_env import launched_by_cli
from fabric_lite._plan import Machine
from fabric_lite.accelerators.accelerator import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities.imports import _IS_INTERACTIVE

#: what ``Fabric(plugins=...)`` takes, one of them or an iterable of them
_PLUGIN_INPUT = Precision | ClusterEnvironment | CheckpointIO


class _Connector:
    """``Fabric(...)``'s arguments resolved (and refused) as ``Fabric`` does, the results under Lightning's names
    (``strategy``, ``accelerator``, ``_parallel_devices``, ...); ``_IS_INTERACTIVE`` also marks a session interactive.

    Example::

        _Connector(accelerator="cpu", devices=2).strategy  # DDPStrategy(...)
    """

    def __init__(
        self,
        accelerator: str | Accelerator = "auto",
        strategy: str | Strategy = "auto",
        devices: list[int] | str | int = "auto",
        num_nodes: int = 1,
        precision: str | int | None = "32-true",
        plugins: _PLUGIN_INPUT | Iterable[_PLUGIN_INPUT] | None = None,
    ) -> None:
        detected = Machine.detect()
        machine = replace(detected, interactive=_IS_INTERACTIVE or detected.interactive)
        plan, self.strategy = plan_and_build(accelerator, strategy, devices, num_nodes, precision, plugins, machine)
        assert self.strategy.accelerator is not None  # the build step always sets it
        self.accelerator: Accelerator = self.strategy.accelerator
        self.precision: Precision = self.strategy.precision
        self.cluster_environment: ClusterEnvironment = getattr(
            self.strategy, "cluster_environment", plan.cluster_environment
        )
        self.checkpoint_io: CheckpointIO | None = self.strategy._checkpoint_io
        self._accelerator_flag: str | Accelerator = plan.accelerator
        self._strategy_flag: str | Strategy = strategy if isinstance(strategy, Strategy) else plan.strategy
        self._devices_flag: int | list[int] = len(plan.devices) if plan.accelerator == "cpu" else list(plan.devices)
        self._num_nodes_flag: int = plan.num_nodes
        self._precision_input: str = plan.precision
        parallel_devices = getattr(self.strategy, "parallel_devices", None)
        self._parallel_devices: list[torch.device] = list(parallel_devices or [self.strategy.root_device])


def _is_using_cli() -> bool:
    """Whether ``fabric-lite run`` or Lightning's ``fabric run`` started this process (``LT_CLI_USED``)."""
    return launched_by_cli(os.environ)


__all__ = ["_Connector"]
