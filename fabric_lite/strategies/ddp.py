"""Distributed data parallel: one process per device, gradients averaged by ``DistributedDataParallel``."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from datetime import timedelta
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import Tensor
from torch.nn import Module
from torch.nn.parallel import DistributedDataParallel
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies._backward_sync import _BackwardSyncControl
from fabric_lite.strategies._sync_batchnorm import convert_sync_batchnorm
from fabric_lite.strategies.parallel import ParallelStrategy, default_pg_timeout
from fabric_lite.utilities.distributed import register_ddp_comm_hook
from fabric_lite.utilities.types import ReduceOp

# arguments of DistributedDataParallel that the strategy sets itself
_OWN_DDP_ARGS = ("module", "device_ids")
#: the registry names that fork the processes (Lightning Fabric's name for them)
_DDP_FORK_ALIASES = ("ddp_fork", "ddp_notebook")


def _ddp_arguments() -> tuple[str, ...]:
    # torch's class, whatever this module's name DistributedDataParallel refers to (a test may replace it)
    parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return tuple(name for name in parameters if name != "self" and name not in _OWN_DDP_ARGS)


def _is_post_local_sgd_state(state: object) -> bool:
    # checked by name first, so that no comm-hook module is imported unless a state is given
    if type(state).__name__ != "PostLocalSGDState":
        return False
    from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState

    return isinstance(state, PostLocalSGDState)


class _DDPBackwardSyncControl(_BackwardSyncControl):
    """``DistributedDataParallel.no_sync()``; both the forward and the backward must run inside it."""

    @override
    def no_backward_sync(self, module: Module, enabled: bool) -> AbstractContextManager[Any]:
        if not enabled:
            return nullcontext()
        if not isinstance(module, DistributedDataParallel):
            raise TypeError(
                "Blocking backward sync is only possible if the module passed to"
                f" `{type(self).__name__}.no_backward_sync` is wrapped in `DistributedDataParallel`."
                f" Got: {type(module).__name__}. Set the module up with fabric.setup(...) first."
            )
        return module.no_sync()


class DDPStrategy(ParallelStrategy):
    """Multi-process single-device training on one or several nodes, with ``DistributedDataParallel``.

    Args:
        accelerator, parallel_devices, cluster_environment, checkpoint_io, precision, process_group_backend, timeout:
            as for :class:`ParallelStrategy`.
        start_method: ``"popen"`` re-runs the script once per extra device; ``"spawn"``/``"fork"`` run
            ``launch(fn)`` in new processes.
        sync_batchnorm: at setup, replace BatchNorm layers by synchronised ones (``CPUSyncBatchNorm`` on the CPU),
            keeping parameters, buffers and optimizers.
        ddp_comm_state: the communication hook's state, or a zero-argument callable that builds it at setup (for
            ``ddp_spawn`` and states that hold subgroups, which need the process group).
        ddp_comm_hook: a DDP communication hook registered at setup, e.g. ``default_hooks.fp16_compress_hook``.
        ddp_comm_wrapper: wraps the hook, e.g. ``default_hooks.fp16_compress_wrapper``.
        model_averaging_period: required with a ``PostLocalSGDState``, and only then: average the parameters every
            this many optimizer steps once local SGD has started.
        **kwargs: passed to ``DistributedDataParallel``; a name it does not take raises here.

    Raises:
        ValueError, TypeError: an argument DDP does not take, a state or wrapper without a hook, a post-local SGD
            state without ``model_averaging_period`` (or the period without that state).

    Example::

        fabric = Fabric(strategy=DDPStrategy(find_unused_parameters=True), devices=2)
    """

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        sync_batchnorm: bool = False,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable[..., Any] | None = None,
        ddp_comm_wrapper: Callable[..., Any] | None = None,
        model_averaging_period: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision=precision,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self._set_start_method(start_method, ("popen", "spawn", "fork", "forkserver"))
        if not isinstance(sync_batchnorm, bool):
            raise TypeError(f"DDPStrategy(sync_batchnorm={sync_batchnorm!r}) must be True or False.")
        unknown = sorted(set(kwargs) - set(_ddp_arguments()))
        if unknown:
            own = [name for name in unknown if name in _OWN_DDP_ARGS]
            hint = (
                f" {own} are set by the strategy itself (the module and this process's device)."
                if own
                else f" DistributedDataParallel takes: {', '.join(_ddp_arguments())}."
            )
            raise TypeError(f"DDPStrategy got arguments that DistributedDataParallel does not take: {unknown}.{hint}")
        # the same validation as register_ddp_comm_hook, but now rather than at fabric.setup
        if ddp_comm_hook is None and (ddp_comm_state is not None or ddp_comm_wrapper is not None):
            given = "ddp_comm_state" if ddp_comm_state is not None else "ddp_comm_wrapper"
            raise ValueError(
                f"DDPStrategy got {given} but no ddp_comm_hook: the state and the wrapper only apply to a hook."
                " Pass ddp_comm_hook=..., e.g. powerSGD_hook.powerSGD_hook with a PowerSGDState."
            )
        if ddp_comm_hook is not None and not callable(ddp_comm_hook):
            raise TypeError(f"DDPStrategy(ddp_comm_hook={ddp_comm_hook!r}) must be a callable hook(state, bucket).")
        if ddp_comm_wrapper is not None and not callable(ddp_comm_wrapper):
            raise TypeError(f"DDPStrategy(ddp_comm_wrapper={ddp_comm_wrapper!r}) must be a callable wrapper(hook).")
        if model_averaging_period is not None and (
            isinstance(model_averaging_period, bool)
            or not isinstance(model_averaging_period, int)
            or model_averaging_period < 1
        ):
            raise ValueError(
                f"DDPStrategy(model_averaging_period={model_averaging_period!r}) must be a whole number of optimizer"
                " steps, at least 1."
            )
        if not callable(ddp_comm_state):
            self._check_model_averaging(ddp_comm_state, model_averaging_period)
        self._ddp_kwargs = kwargs  # find_unused_parameters: DDP's default, False, unless given
        self._sync_batchnorm = sync_batchnorm
        self._ddp_comm_state = ddp_comm_state
        self._ddp_comm_hook = ddp_comm_hook
        self._ddp_comm_wrapper = ddp_comm_wrapper
        self._model_averaging_period = model_averaging_period
        # post-local SGD: the state whose start_localSGD_iter is the averagers' warm-up, and one averager per optimizer
        self._post_local_sgd_state: Any = None
        self._model_averagers: dict[int, Any] = {}
        self._backward_sync_control = _DDPBackwardSyncControl()

    @staticmethod
    def _check_model_averaging(state: object, period: int | None) -> None:
        post_local = _is_post_local_sgd_state(state)
        if post_local and period is None:
            raise ValueError(
                "Post-local SGD (a PostLocalSGDState) needs DDPStrategy(model_averaging_period=N): after local SGD"
                " starts, nothing else keeps the processes' parameters together."
            )
        if period is not None and not post_local:
            raise ValueError(
                f"DDPStrategy(model_averaging_period={period}) only applies to post-local SGD, but ddp_comm_state is"
                f" {type(state).__name__}. Pass ddp_comm_state=PostLocalSGDState(...) and"
                " ddp_comm_hook=post_localSGD_hook, or drop model_averaging_period."
            )

    @property
    def ddp_kwargs(self) -> dict[str, Any]:
        """The keyword arguments passed to ``DistributedDataParallel``."""
        return dict(self._ddp_kwargs)

    @property
    def sync_batchnorm(self) -> bool:
        """Whether BatchNorm layers are replaced by synchronised ones at setup."""
        return self._sync_batchnorm

    @property
    def data_parallel_group(self) -> Any:
        """The process group gradients are averaged over: DDP's ``process_group`` argument, else all processes."""
        return self._ddp_kwargs.get("process_group") or dist.group.WORLD

    @override
    def setup_module(self, module: Module) -> DistributedDataParallel:
        """Wrap the module in ``DistributedDataParallel`` on this process's device (after ``sync_batchnorm``'s
        conversion) and register the communication hook, if any."""
        if self._sync_batchnorm:
            module = convert_sync_batchnorm(module, self.root_device.type)
        elif self.root_device.type == "cpu" and any(isinstance(m, torch.nn.SyncBatchNorm) for m in module.modules()):
            raise ValueError(
                f"{type(module).__name__} contains torch.nn.SyncBatchNorm layers, which only run on GPUs. To"
                " synchronise batch norm on the CPU, keep the BatchNorm layers and pass"
                " DDPStrategy(sync_batchnorm=True): fabric_lite converts them at setup (on any device)."
            )
        device_ids = [self.root_device.index] if self.root_device.type == "cuda" else None
        # build DDP on a side stream so its initial broadcast does not serialise with work on the default one
        context = torch.cuda.stream(torch.cuda.Stream()) if device_ids is not None else nullcontext()  # type: ignore[no-untyped-call]
        with context:
            ddp = DistributedDataParallel(module=module, device_ids=device_ids, **self._ddp_kwargs)
        if self._ddp_comm_hook is not None:
            self._register_ddp_hooks(ddp)
        return ddp

    @override
    def _unwrapped(self, module: Module) -> Module:
        # the module's name is read here, at the call, like every other use of DistributedDataParallel in this module
        return module.module if isinstance(module, DistributedDataParallel) else module

    def _register_ddp_hooks(self, ddp: DistributedDataParallel) -> None:
        state = self._ddp_comm_state
        if callable(state):  # a factory: build the state now that the process group exists, one per module
            state = state()
            self._check_model_averaging(state, self._model_averaging_period)
        register_ddp_comm_hook(
            ddp, ddp_comm_state=state, ddp_comm_hook=self._ddp_comm_hook, ddp_comm_wrapper=self._ddp_comm_wrapper
        )
        if _is_post_local_sgd_state(state):
            self._post_local_sgd_state = state

    @override
    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """Step the optimizer; with post-local SGD, then average the parameters across processes when due."""
        output = super().optimizer_step(optimizer, **kwargs)
        if self._post_local_sgd_state is not None:
            self._average_parameters(optimizer)
        return output

    def _average_parameters(self, optimizer: Optimizer) -> None:
        averager = self._model_averagers.get(id(optimizer))
        if averager is None:
            averager = self._model_averager(optimizer)
            self._model_averagers[id(optimizer)] = averager
        params = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        averager.average_parameters(iter(params))

    def _model_averager(self, optimizer: Optimizer) -> Any:
        from torch.distributed.algorithms.model_averaging.averagers import PeriodicModelAverager
        from torch.distributed.optim import PostLocalSGDOptimizer, ZeroRedundancyOptimizer

        if isinstance(optimizer, (PostLocalSGDOptimizer, ZeroRedundancyOptimizer)):
            raise ValueError(
                f"Post-local SGD model averaging cannot work with a {type(optimizer).__name__}: it averages (or shards)"
                " the parameters itself. Use a plain optimizer, e.g. torch.optim.SGD."
            )
        state = self._post_local_sgd_state
        return PeriodicModelAverager(
            period=self._model_averaging_period,
            warmup_steps=state.start_localSGD_iter,
            process_group=state.process_group,
        )

    @contextmanager
    def block_backward_sync(self, module: Module) -> Generator[None, None, None]:
        """Lightning's ``DDPPlugin`` name for :meth:`no_backward_sync`: both the forward and the backward must run
        inside the block; ``module`` is the DDP module or the one ``fabric.setup`` returned."""
        with self.no_backward_sync(getattr(module, "_strategy_module", module)):
            yield

    def reduce(
        self, tensor: Tensor | Any, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean"
    ) -> Tensor | Any:
        """Lightning's ``DDPPlugin`` name for :meth:`all_reduce` of a tensor; anything else is returned as is."""
        return self.all_reduce(tensor, group=group, reduce_op=reduce_op) if isinstance(tensor, Tensor) else tensor

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the strategy into each new process, before any process group exists there
        state = self._ddp_comm_state
        holds_group = any(getattr(state, name, None) is not None for name in ("process_group", "subgroup"))
        if type(state).__name__ == "PowerSGDState" or (_is_post_local_sgd_state(state) and holds_group):
            raise RuntimeError(
                f"DDPStrategy(ddp_comm_state={type(state).__name__}(...)) cannot be sent to processes started with"
                " start_method='spawn'/'forkserver': the state holds a process group, which only exists once the"
                " process has joined. Pass a factory instead, e.g. ddp_comm_state=functools.partial("
                f"{type(state).__name__}, process_group=None, ...): it is called in each process at fabric.setup."
            )
        return self.__dict__.copy()

    def __repr__(self) -> str:
        extras = "".join(
            f", {name}={value!r}"
            for name, value in (
                ("sync_batchnorm", self._sync_batchnorm or None),
                ("ddp_comm_hook", getattr(self._ddp_comm_hook, "__name__", self._ddp_comm_hook)),
                ("model_averaging_period", self._model_averaging_period),
            )
            if value is not None
        )
        return f"{type(self).__name__}(start_method={self._start_method!r}{extras}, kwargs={self._ddp_kwargs})"
