"""Distributed data parallel: one process per device, gradients averaged by ``DistributedDataParallel``."""

from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any, Literal

import torch
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.parallel import ParallelStrategy, default_pg_timeout

_START_METHODS = ("popen", "spawn", "fork", "forkserver")


class DDPStrategy(ParallelStrategy):
    """Multi-process single-device training on one or several nodes, with ``DistributedDataParallel``.

    Every keyword argument that is not listed below goes to ``DistributedDataParallel`` unchanged
    (``find_unused_parameters`` is ``False`` unless you say otherwise, as in raw PyTorch).

    Args:
        accelerator, parallel_devices, cluster_environment, precision: filled in by ``Fabric`` when not given.
        process_group_backend: ``"gloo"`` or ``"nccl"``; defaults to NCCL on CUDA and gloo otherwise.
        timeout: how long collectives wait for the other processes before raising.
        start_method: how ``fabric.launch()`` starts the other local processes: ``"popen"`` re-runs the script
            once per extra device (``strategy="ddp"``), ``"spawn"``/``"fork"`` start ``launch(fn)`` in new processes.
        **kwargs: passed to ``torch.nn.parallel.DistributedDataParallel``.

    Example::

        fabric = Fabric(strategy=DDPStrategy(find_unused_parameters=True, timeout=timedelta(minutes=5)), devices=2)
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        if start_method not in _START_METHODS:
            raise ValueError(f"DDPStrategy(start_method={start_method!r}) is not one of {_START_METHODS}.")
        self._start_method = start_method
        self._ddp_kwargs = kwargs

    @property
    def start_method(self) -> str:
        return self._start_method

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments passed to ``DistributedDataParallel``."""
        return dict(self._ddp_kwargs)

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        """Wrap the module in ``DistributedDataParallel`` (on this process's device)."""
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        # build DDP on a side stream so its initial broadcast does not serialise with work on the default one
        context = torch.cuda.stream(torch.cuda.Stream()) if device_ids is not None else nullcontext()  # type: ignore[no-untyped-call]
        with context:
            return DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)

    @override
    def no_backward_sync(self, module: Module, enabled: bool = True) -> AbstractContextManager[Any]:
        """``DistributedDataParallel.no_sync()``: gradients accumulate locally until a step outside the context.

        Both the forward and the backward must run inside the context.
        """
        if not enabled:
            return nullcontext()
        if not isinstance(module, DistributedDataParallel):
            raise TypeError(
                "Blocking backward sync is only possible for a module wrapped in DistributedDataParallel, got"
                f" {type(module).__name__}. Set the module up with fabric.setup(...) first."
            )
        return module.no_sync()

    @override
    def get_module_state_dict(self, module: Module) -> dict[str, Any]:
        if isinstance(module, DistributedDataParallel):
            module = module.module
        return module.state_dict()

    @override
    def load_module_state_dict(self, module: Module, state_dict: dict[str, Any], strict: bool = True) -> None:
        if isinstance(module, DistributedDataParallel):
            module = module.module
        module.load_state_dict(state_dict, strict=strict)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(start_method={self._start_method!r}, kwargs={self._ddp_kwargs})"
