"""The ``Fabric`` object: a few lines that make a hand-written PyTorch loop run anywhere."""

from __future__ import annotations

import functools
import inspect
import os
from collections.abc import Callable, Generator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

from fabric_lite._build import plan_and_build
from fabric_lite._cli_env import launched_by_cli
from fabric_lite._compile import take_apart_compiled, uncompiled
from fabric_lite._hooks import call_hook, configure_callbacks, configure_loggers, finalize_loggers
from fabric_lite._metrics_gather import LoaderRegistry, gather_for_metrics
from fabric_lite._plan import Machine, resolve_debug
from fabric_lite.accelerators import Accelerator
from fabric_lite.loggers._folder import _agree_on_versions, _attach_rank
from fabric_lite.loggers._metrics import _check_metrics, _to_scalars
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.parallel import ParallelStrategy
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities._tree import flatten, unflatten
from fabric_lite.utilities.apply_func import convert_leaves, convert_to_tensors, move_data_to_device
from fabric_lite.utilities.data import (
    _replace_dunder_methods,
    add_worker_init_fn,
    distributed_sampler,
    has_iterable_dataset,
    replace_sampler,
)
from fabric_lite.utilities.device_dtype_mixin import _update_properties
from fabric_lite.utilities.distributed import _InfiniteBarrier
from fabric_lite.utilities.rank_zero import rank_zero_deprecation, rank_zero_warn
from fabric_lite.utilities.seed import seed_everything
from fabric_lite.utilities.types import _PATH, ReduceOp, TBroadcast
from fabric_lite.utilities.warnings import PossibleUserWarning
from fabric_lite.wrappers import (
    _FabricDataLoader,
    _FabricModule,
    _FabricOptimizer,
    _unwrap_objects,
    _unwrap_state,
    is_wrapped,
)


def _launch_only(fabric: Fabric) -> None:
    """What :meth:`Fabric.launch` runs when given no function: nothing beyond starting the processes. A default of
    its own, not ``None``, so that ``launch(train())`` (``None``, the result of calling ``train``) is caught."""


def _launches_processes(run: Callable[..., Any]) -> Callable[..., Any]:
    """Make a ``run`` method start the strategy's processes and run its body in each of them, as
    :meth:`Fabric.launch` does with a function. Applied once per class, when the class is created."""

    @functools.wraps(run)
    def launching_run(self: Fabric, *args: Any, **kwargs: Any) -> Any:
        if self._environment_ready:
            # already inside the processes (a `super().run(...)` call, or a script started by `fabric-lite run`)
            return run(self, *args, **kwargs)
        return self.launch(_RunBody(type(self)), *args, **kwargs)

    launching_run.__dict__["_fabric_lite_launches"] = True
    return launching_run


class _RunBody:
    """The ``run`` body of ``owner`` as a function of the Fabric object, for :meth:`Fabric.launch`.

    It holds the class, not the function, so that a spawn launcher can pickle it by the class's import path."""

    def __init__(self, owner: type[Fabric]) -> None:
        self.owner = owner

    def __call__(self, fabric: Fabric, *args: Any, **kwargs: Any) -> Any:
        return self.owner.run.__wrapped__(fabric, *args, **kwargs)  # type: ignore[attr-defined]


class Fabric:
    """Run a hand-written PyTorch loop on one device or many, with a few added lines.

    Args:
        accelerator: ``"cpu"``, ``"cuda"``, ``"gpu"``, ``"mps"`` or ``"auto"`` (the best available), or an
            ``Accelerator`` instance.
        strategy: ``"auto"``, ``"single_device"``, ``"ddp"`` (re-runs the script once per extra device),
            ``"ddp_spawn"``, ``"ddp_fork"``, ``"dp"`` (``torch.nn.DataParallel`` in one process; ``"ddp"`` with a
            warning on a machine without CUDA), ``"horovod"`` (optional; under ``horovodrun``), ``"fsdp"``
            (parameters, gradients and optimizer state sharded with ``fully_shard``; see ``FSDPStrategy``), or a
            ``Strategy`` instance such as ``DDPStrategy(...)``.
        devices: devices per node: a count (``2``), ``-1`` for every GPU, GPU indices (``[0, 1]`` or ``"0,1"``),
            or ``"auto"``. On the CPU, the number of processes.
        num_nodes: how many machines take part.
        precision: ``"32-true"`` (default), ``"64-true"``, ``"16-mixed"``, ``"bf16-mixed"``, ``"16-true"`` or
            ``"bf16-true"``; Lightning's legacy ``32``, ``64``, ``16`` and ``"bf16"`` are accepted too.
        plugins: a ``Precision``, ``ClusterEnvironment`` or ``CheckpointIO`` instance (at most one of each kind),
            or a list of them. A ``CheckpointIO`` is what :meth:`save` and :meth:`load` write and read through, with
            the strategies that write one file (``FSDPStrategy`` refuses one, as in Lightning).
        callbacks: objects whose methods :meth:`call` invokes by name.
        loggers: objects with a ``log_metrics(metrics, step)`` method, used by :meth:`log` and :meth:`log_dict`.
        debug: check every collective across ranks before running it (``all_reduce`` and ``all_gather`` are always
            checked): ranks that call different collectives, or pass tensors of different shapes or dtypes, raise
            on every rank with a per-rank table instead of hanging until the timeout. Costs one small collective
            per call. ``None`` (default) reads the ``FABRIC_LITE_DEBUG`` environment variable (``1`` or ``0``).

    Raises:
        ValueError, TypeError: an argument that is not accepted; the message names the value and the fix.
        RuntimeError: an accelerator this machine does not have.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
        fabric.launch()
        model, optimizer = fabric.setup(model, optimizer)
        loader = fabric.setup_dataloaders(loader)
        for x, y in loader:
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)
            optimizer.step()
    """

    def __init__(
        self,
        *,
        accelerator: str | Accelerator = "auto",
        strategy: str | Strategy = "auto",
        devices: list[int] | str | int = "auto",
        num_nodes: int = 1,
        precision: str | int | None = "32-true",
        plugins: Any | list[Any] | None = None,
        callbacks: Any | list[Any] | None = None,
        loggers: Any | list[Any] | None = None,
        debug: bool | None = None,
    ) -> None:
        self._plan, self._strategy = plan_and_build(
            accelerator, strategy, devices, num_nodes, precision, plugins, Machine.detect()
        )
        if resolve_debug(debug, os.environ) and isinstance(self._strategy, ParallelStrategy):
            self._strategy.debug_collectives = True
        self._callbacks = configure_callbacks(callbacks)
        self._loggers = configure_loggers(loggers)
        _attach_rank(self._loggers, self.global_rank)
        self._models_setup = 0
        self._launched = False
        self._environment_ready = False
        self._dataloaders = LoaderRegistry()  # for gather_for_metrics
        cli = launched_by_cli(os.environ)
        if cli or not _trait(self._strategy, "is_parallel"):
            # this process is set up here, not by launch(): `fabric-lite run` started it and its peers, or it runs
            # alone (a one-process strategy needs no launch()); so what the launcher says is checked here, first
            self._plan.validate_settings(self._cluster_environment())
        if cli:
            # join the peers now (as Lightning does), so that the script needs no launch() call and every method
            # works right after Fabric()
            self._launched = True
            self._setup_environment()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        """A subclass that overrides :meth:`run` gets a ``run`` that starts the processes first, like the base's."""
        super().__init_subclass__(**kwargs)
        run = cls.__dict__.get("run")
        if callable(run) and not getattr(run, "_fabric_lite_launches", False):
            cls.run = _launches_processes(run)  # type: ignore[method-assign]

    # ------------------------------------------------------------------ properties
    @property
    def accelerator(self) -> Accelerator:
        """The accelerator (the kind of device) this Fabric runs on, e.g. ``CPUAccelerator``."""
        assert self._strategy.accelerator is not None  # always filled in by the build step
        return self._strategy.accelerator

    @property
    def strategy(self) -> Strategy:
        """The strategy that runs the loop across devices and processes, e.g. ``DDPStrategy``."""
        return self._strategy

    @property
    def _precision(self) -> Precision:
        """The strategy's precision plugin (Lightning Fabric's attribute of this name)."""
        return self._strategy.precision

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._strategy.root_device

    @property
    def global_rank(self) -> int:
        """The index of this process among all processes, across nodes."""
        return self._strategy.global_rank

    @property
    def local_rank(self) -> int:
        """The index of this process among the processes on its node."""
        return self._strategy.local_rank

    @property
    def node_rank(self) -> int:
        """The index of this process's node."""
        return self._strategy.node_rank

    @property
    def world_size(self) -> int:
        """The number of processes across all nodes."""
        return self._strategy.world_size

    @property
    def is_global_zero(self) -> bool:
        """Whether this is the process with global rank 0."""
        return self._strategy.is_global_zero

    @property
    def loggers(self) -> list[Any]:
        """The loggers given as ``Fabric(loggers=...)``, as a list (empty without loggers)."""
        return self._loggers

    @property
    def logger(self) -> Any:
        """The first logger."""
        if not self._loggers:
            raise IndexError("Fabric has no logger: pass Fabric(loggers=...) first.")
        return self._loggers[0]

    # ------------------------------------------------------------------ launching
    @_launches_processes
    def run(self, *args: Any, **kwargs: Any) -> Any:
        """Override this method with the training code; calling it starts the processes and runs it in each.

        ``MyFabric(...).run(*args, **kwargs)`` is ``launch(fn, *args, **kwargs)`` with ``fn`` the body of ``run``
        (see :meth:`launch` for which processes run it and whose result is returned). Inside the processes (and in
        a script started by ``fabric-lite run``) it is a plain method call. The base method does nothing and returns
        ``None``.

        Example::

            class MyFabric(Fabric):
                def run(self, epochs):
                    model, optimizer = self.setup(MyModel(), torch.optim.SGD(...))
                    ...
                    return self.global_rank

            if __name__ == "__main__":
                MyFabric(accelerator="cpu", devices=2, strategy="ddp_spawn").run(epochs=3)  # 0, from rank 0
        """
        return None

    def launch(self, function: Callable[..., Any] = _launch_only, *args: Any, **kwargs: Any) -> Any:
        """Start the processes the strategy needs and join them in a process group.

        * ``strategy="ddp"``: this process is local rank 0; the script is started again once per extra device,
          every process continues after ``launch()`` (call it near the top of the script), and ``launch(fn)``
          runs ``fn(fabric, *args, **kwargs)`` in every process and returns each process's own result.
        * ``"ddp_spawn"``/``"ddp_fork"``: ``launch(fn, ...)`` runs ``fn(fabric, ...)`` in one new process per device
          and returns the result of global rank 0 (the script must be guarded by ``if __name__ == "__main__":``).
        * under torchrun or SLURM no process is started; the process group is joined.
        * in a script started by ``fabric-lite run``, ``Fabric()`` has joined the process group already:
          ``launch()`` does nothing and ``launch(fn)`` runs ``fn(fabric)`` here (Lightning raises instead).
        * one device: nothing to start; ``launch(fn)`` runs ``fn(fabric)`` here.

        A failing rank ends the whole job, and its traceback is reported as the cause. Calling ``launch()`` again
        without a function does nothing; a later ``Fabric`` in a ``ddp`` script joins the processes already running
        (it must ask for the same ``devices`` and ``num_nodes``).

        Raises:
            TypeError: ``function`` is not callable (e.g. ``launch(train())`` instead of ``launch(train)``), takes no
                argument, or is missing for a spawn/fork strategy.

        Example::

            fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp")
            fabric.launch()  # near the top of the script: two processes run the rest of it

            def train(fabric):
                ...
                return fabric.global_rank

            if __name__ == "__main__":
                fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
                result = fabric.launch(train)  # runs train(fabric) in 2 new processes; rank 0's result: 0
        """
        if function is not _launch_only:
            if not callable(function):
                raise TypeError(
                    f"`Fabric.launch(...)` needs to be a callable, but got {function!r}. HINT: write"
                    " .launch(your_fn), not .launch(your_fn())."
                )
            if not inspect.signature(function).parameters:
                raise TypeError(
                    f"`Fabric.launch(function={getattr(function, '__name__', function)})` needs to take at least one"
                    " argument: the launcher passes it the Fabric object. Example: def train(fabric): ..."
                )
        elif _trait(self._strategy.launcher, "requires_function"):
            raise TypeError(
                f"To spawn processes with the `{type(self._strategy).__name__}` strategy (start method spawn/fork),"
                " `.launch()` needs to be called with a function that holds the code to run in them:"
                " fabric.launch(train)."
            )
        body = None if function is _launch_only else function
        if self._launched and body is None:
            return None
        # devices/num_nodes against what the launcher says (SLURM, torchrun, ...): in every process, before this one
        # starts another or waits on one
        self._plan.validate_settings(self._cluster_environment())
        self._launched = True
        to_run = partial(self._run_with_setup, body)
        launcher = self._strategy.launcher
        if launcher is not None and not (self._environment_ready and body is not None):
            return launcher.launch(to_run, *args, **kwargs)
        return to_run(*args, **kwargs)

    def _setup_environment(self) -> None:
        if not self._environment_ready:
            self._strategy.setup_environment()
            self._environment_ready = True
            # e.g. SLURM's auto-requeue signal handler, now that the global rank is known
            self._cluster_environment()._on_setup(self.global_rank)
            # now that the ranks are known: only rank 0 writes, and every rank uses the version folder rank 0 chose
            _attach_rank(self._loggers, self.global_rank)
            if self.world_size > 1:
                _agree_on_versions(self._loggers, self.global_rank, partial(self._strategy.broadcast, src=0))

    def _cluster_environment(self) -> ClusterEnvironment:
        """The environment the processes come from: the strategy's (its own, or the plan's that the build step gave
        it), or the plan's for a strategy that holds none (one device)."""
        environment: ClusterEnvironment | None = getattr(self._strategy, "cluster_environment", None)
        return environment if environment is not None else self._plan.cluster_environment

    def _run_with_setup(self, function: Callable[..., Any] | None, *args: Any, **kwargs: Any) -> Any:
        self._setup_environment()
        if function is None:
            return None
        # the end of the launched function is the end of the run: write what the loggers buffered (under
        # ddp_fork the process then ends with os._exit, which skips the loggers' exit hooks)
        try:
            # loaders made in the function record their constructor's arguments, so that setup_dataloaders can make a
            # DataLoader subclass again around a DistributedSampler whatever its __init__ takes (as in Lightning)
            with _replace_dunder_methods(DataLoader, "dataset"), _replace_dunder_methods(BatchSampler):
                result = function(self, *args, **kwargs)
        except BaseException:
            # a checkpoint still being written is finished (or its error printed); the training error is raised
            self._strategy._finish_saves_after_failure()
            if self.is_global_zero:
                finalize_loggers(self._loggers, "failed")
            raise
        self._strategy._wait_for_saves()  # the run ends once its last checkpoint is published; a failed one raises
        if self.is_global_zero:
            finalize_loggers(self._loggers, "success")
        return result

    def _validate_launched(self) -> None:
        if not self._launched and _trait(self._strategy, "is_parallel"):
            raise RuntimeError(
                f"To use Fabric with more than one process ({type(self._strategy).__name__}, world size"
                f" {self.world_size}), you must call `.launch()`: call fabric.launch() first (or fabric.launch(fn) for"
                " spawn/fork strategies), or start the script with `fabric-lite run`."
            )

    # ------------------------------------------------------------------ setup
    def setup(
        self,
        module: nn.Module,
        *optimizers: Optimizer,
        scheduler: Any = None,
        move_to_device: bool = True,
        _reapply_compile: bool = True,
    ) -> Any:
        """Set up a module and its optimizers: move the module to the device, wrap it for the strategy (e.g. in
        ``DistributedDataParallel``) and wrap the optimizers so that ``step`` goes through the strategy.

        A module compiled with ``torch.compile`` is set up uncompiled, then the strategy's module (e.g. the DDP
        wrapper) is compiled again with the same settings, so that DDP's hooks run inside the compiled graph; FSDP
        compiles each sharded block instead. ``_reapply_compile=False`` sets up the compiled module as it is.
        State dicts never carry the ``_orig_mod.`` of the compiled wrapper.

        Returns:
            The wrapped module if no optimizer is given, else ``(module, *optimizers)``, plus ``scheduler`` last
            when one is passed (returned unchanged).

        Raises:
            ValueError: the module or an optimizer was set up already, or an optimizer updates parameters that
                are not the module's.

        Example::

            model = torch.nn.Linear(4, 1)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            model, optimizer = fabric.setup(model, optimizer)  # use these from now on
            model.module  # your Linear, without the DistributedDataParallel around it
        """
        fabric_module, wrapped, scheduler = self._setup_module(
            "setup", module, optimizers, move_to_device, _reapply_compile, scheduler
        )
        fabric_optimizers = [_FabricOptimizer(opt, self._strategy, self._callbacks) for opt in wrapped]
        self._attach_lightning_module(uncompiled(fabric_module._original_module), fabric_optimizers)
        self.call("on_after_setup", fabric=self, module=fabric_module)
        if scheduler is not None:
            return (fabric_module, *fabric_optimizers, scheduler)
        return (fabric_module, *fabric_optimizers) if fabric_optimizers else fabric_module

    def setup_module(
        self, module: nn.Module, move_to_device: bool = True, _reapply_compile: bool = True
    ) -> _FabricModule:
        """Set up a module alone (create its optimizer afterwards and pass it to :meth:`setup_optimizers`); a
        compiled module as in :meth:`setup`.

        Example::

            model = fabric.setup_module(MyModel())
            optimizer = fabric.setup_optimizers(torch.optim.AdamW(model.parameters()))
        """
        fabric_module, _, _ = self._setup_module("setup_module", module, (), move_to_device, _reapply_compile)
        self._attach_lightning_module(uncompiled(fabric_module._original_module), None)
        return fabric_module

    def _setup_module(
        self,
        method: str,
        module: nn.Module,
        optimizers: Sequence[Optimizer],
        move_to_device: bool,
        reapply: bool,
        scheduler: Any = None,
    ) -> tuple[_FabricModule, list[Optimizer], Any]:
        """What :meth:`setup` and :meth:`setup_module` share: the module set up and the strategy's optimizers."""
        self._validate_launched()
        if is_wrapped(module):
            raise ValueError(f"A model should be passed only once to the `{method}` method. It is already set up.")
        if any(isinstance(opt, _FabricOptimizer) for opt in optimizers):
            raise ValueError("An optimizer should be passed only once to the `setup` method. It is already set up.")
        _check_optimizers_own_parameters(module, optimizers)
        module, compiler = take_apart_compiled(module, reapply)
        original = module
        module = self._strategy.precision.convert_module(module)
        if move_to_device:
            self._strategy.module_to_device(module)
        if optimizers:
            module, wrapped, scheduler = self._strategy.setup_module_and_optimizers(module, list(optimizers), scheduler)
        else:
            module, wrapped = self._strategy.setup_module(module), []
        if compiler is not None:
            module = self._strategy.compile_module(module, compiler)  # e.g. torch.compile(DDP(module))
        if self._strategy.pipeline(module) is not None:
            original = module  # the model was split: this rank's stages are what it holds of it
        fabric_module = _FabricModule(module, self._strategy, original_module=original)
        # where the model is now, for fabric_model.device (a sharded model has no one device but the process's)
        moved = self.device if move_to_device else next(fabric_module.parameters(), torch.empty(0)).device
        _update_properties(fabric_module, device=moved)
        self._models_setup += 1
        return fabric_module, wrapped, scheduler

    def _attach_lightning_module(self, module: nn.Module, optimizers: list[_FabricOptimizer] | None) -> None:
        """Point a ``LightningModule`` (known by its ``_fabric`` attribute) at this Fabric, as Lightning does, so
        that its ``log``, ``optimizers()`` etc. work, and make it a callback that ``fabric.call`` reaches."""
        if not hasattr(module, "_fabric"):
            return
        # setattr: a LightningModule's attributes are not known to nn.Module's typing
        setattr(module, "_fabric", self)  # noqa: B010
        if optimizers is not None:
            setattr(module, "_fabric_optimizers", optimizers)  # noqa: B010
        if not any(callback is module for callback in self._callbacks):
            self._callbacks.append(module)

    def setup_optimizers(self, *optimizers: Optimizer) -> _FabricOptimizer | tuple[_FabricOptimizer, ...]:
        """Set up one or more optimizers; returns one wrapped optimizer, or a tuple for several.

        Raises:
            NotImplementedError: (a ``RuntimeError``) the strategy sets up a module and its optimizers together
                (DeepSpeed): pass them to :meth:`setup` instead.
            ValueError, TypeError: no optimizer, one set up already, or an object that is not an optimizer.

        Example::

            optimizer = fabric.setup_optimizers(torch.optim.SGD(model.parameters(), lr=0.1))
            opt_g, opt_d = fabric.setup_optimizers(opt_g, opt_d)  # several: a tuple, in the same order
        """
        self._validate_launched()
        if _trait(self._strategy, "requires_joint_setup"):
            # the strategy's own refusal, a RuntimeError as Lightning's Fabric raises, before the strategy is asked
            raise NotImplementedError(
                f"The `{self._strategy.__class__.__name__}` requires the model and optimizer(s) to be set up jointly"
                " through `.setup(model, optimizer, ...)`. Create the optimizers from the model's parameters and call"
                " model, optimizer = fabric.setup(model, optimizer) instead of fabric.setup_optimizers(...)."
            )
        if not optimizers:
            raise ValueError("`setup_optimizers` requires at least one optimizer as input.")
        if any(isinstance(opt, _FabricOptimizer) for opt in optimizers):
            raise ValueError("An optimizer should be passed only once to the `setup_optimizers` method.")
        for opt in optimizers:
            if not isinstance(opt, Optimizer):
                raise TypeError(f"setup_optimizers expects torch.optim.Optimizer instances, got {type(opt).__name__}.")
        wrapped = [
            _FabricOptimizer(self._strategy.setup_optimizer(opt), self._strategy, self._callbacks) for opt in optimizers
        ]
        return wrapped[0] if len(wrapped) == 1 else tuple(wrapped)

    def setup_dataloaders(
        self, *dataloaders: DataLoader[Any], use_distributed_sampler: bool = True, move_to_device: bool = True
    ) -> Any:
        """Set up dataloaders: split the data across processes and move batches to the device.

        With several processes, each loader gets a ``DistributedSampler`` that keeps its shuffling and seed (see
        :func:`fabric_lite.utilities.data.distributed_sampler`); ``set_epoch`` is called at every new iteration,
        so the order changes each epoch. Iterable datasets and loaders that already use a ``DistributedSampler``
        are left as they are.

        Returns:
            One wrapped loader, or a list for several.

        Example::

            train_loader, val_loader = fabric.setup_dataloaders(train_loader, val_loader)
            for epoch in range(3):
                for x, y in train_loader:  # this process's share of the samples, already on fabric.device
                    ...
        """
        self._validate_launched()
        if not dataloaders:
            raise ValueError("`setup_dataloaders` requires at least one dataloader as input.")
        if any(isinstance(dl, _FabricDataLoader) for dl in dataloaders):
            raise ValueError("A dataloader should be passed only once to the `setup_dataloaders` method.")
        for dl in dataloaders:
            if not isinstance(dl, DataLoader):
                raise TypeError(
                    f"Only PyTorch DataLoader are currently supported in `setup_dataloaders`, got {type(dl).__name__}."
                    " Wrap your data in torch.utils.data.DataLoader."
                )
        sampler_kwargs = self._strategy.distributed_sampler_kwargs
        wrapped = []
        for dl in dataloaders:
            needs_sampler = not isinstance(dl.sampler, DistributedSampler) and not has_iterable_dataset(dl)
            if use_distributed_sampler and sampler_kwargs is not None and needs_sampler:
                dl = replace_sampler(dl, distributed_sampler(dl, **sampler_kwargs))
            add_worker_init_fn(dl, self.global_rank)
            wrapped.append(_FabricDataLoader(dl, device=self.device if move_to_device else None))
        if sampler_kwargs is not None and self.world_size > 1 and dist.is_initialized():
            self._check_even_batches([w._dataloader for w in wrapped])
        self._dataloaders.add(wrapped)
        return wrapped[0] if len(wrapped) == 1 else wrapped

    def _check_even_batches(self, loaders: list[DataLoader[Any]]) -> None:
        """Raise on every rank when loaders whose sampler is not a ``DistributedSampler`` give the ranks different
        numbers of batches: the rank with more batches would wait at epoch end, in a collective no other rank
        joins, until the timeout. (A ``DistributedSampler`` pads, so its ranks always agree.)"""
        unchecked = [dl for dl in loaders if not isinstance(dl.sampler, DistributedSampler) and _sized(dl)]
        if not unchecked:
            return
        gathered = self._strategy.all_gather(torch.tensor([len(dl) for dl in unchecked], dtype=torch.int64))
        if bool((gathered == gathered[0]).all()):
            return
        table = "\n".join(f"  rank {r}: {row.tolist()} batches" for r, row in enumerate(gathered))
        raise ValueError(
            "The dataloaders give the ranks different numbers of batches:\n"
            f"{table}\nThe ranks with more batches would wait at the end of the epoch for a collective the others"
            " never join. Let fabric.setup_dataloaders install a DistributedSampler (use_distributed_sampler=True,"
            " the default, with the loader's default sampler), or make your sampler give every rank the same"
            " number of samples (e.g. DistributedSampler(..., drop_last=True))."
        )

    # ------------------------------------------------------------------ training helpers
    def backward(self, tensor: Tensor, *args: Any, model: _FabricModule | None = None, **kwargs: Any) -> None:
        """Replaces ``loss.backward()``: back-propagates through the strategy and precision.

        Raises:
            RuntimeError: with several processes, no model was set up yet (the gradients would not be
                synchronised). With one process a module not set up back-propagates as with ``loss.backward()``.

        Example::

            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            fabric.backward(loss)  # instead of loss.backward()
            optimizer.step()
        """
        if self._models_setup == 0 and _trait(self._strategy, "is_parallel"):
            raise RuntimeError(
                f"No models were set up for backward with {type(self._strategy).__name__}: the gradients would not be"
                " synchronised across the processes. Did you forget to call `fabric.setup()`? Set up the model"
                " first: model, optimizer = fabric.setup(model, optimizer)."
            )
        model = uncompiled(model)  # torch.compile(fabric_model) is accepted too
        module = model._strategy_module if isinstance(model, _FabricModule) else model
        self._strategy.backward(tensor, module, *args, **kwargs)

    def pipeline_step(
        self,
        model: _FabricModule,
        *args: Any,
        target: Any,
        loss_fn: Callable[[Any, Any], Tensor],
        **kwargs: Any,
    ) -> Tensor:
        """One step's forward and backward: ``loss_fn(model(*args, **kwargs), target)`` and :meth:`backward`, or,
        where the strategy pipelines the model, its schedule over micro-batches (``ModelParallelStrategy(...,
        pipeline_parallel_size=...)``). Under ``torch.no_grad()`` only the forward and the loss run (with a pipeline,
        under a single-stage schedule). The same loop then trains with and without a pipeline.

        Returns:
            The loss, detached; with a pipeline the mean over the micro-batches, the same on every rank of it.

        Raises:
            TypeError: the model was not set up with Fabric.
            ValueError: with a pipeline, a batch that the micro-batches do not divide.
            RuntimeError: with a pipeline, a forward-only step under a multi-stage schedule.

        Example::

            loss = fabric.pipeline_step(model, tokens, target=labels, loss_fn=cross_entropy)
            optimizer.step()  # no fabric.backward: the step ran it
            optimizer.zero_grad()
        """
        model = uncompiled(model)
        if not isinstance(model, _FabricModule):
            raise TypeError(
                "fabric.pipeline_step(model, ...) takes the model that fabric.setup returned: `model ="
                f" fabric.setup_module(model)`. Got {type(model).__name__}."
            )
        pipeline = self._strategy.pipeline(model._strategy_module)
        if pipeline is not None:
            precision = self._strategy.precision
            args, kwargs = precision.convert_input((args, kwargs))  # as the module wrapper's forward does
            with precision.forward_context():
                return pipeline.step(args, kwargs, target, loss_fn)  # type: ignore[no-any-return]
        loss = loss_fn(model(*args, **kwargs), target)
        if torch.is_grad_enabled():
            self.backward(loss, model=model)
        return loss.detach()

    def clip_gradients(
        self,
        module: nn.Module,
        optimizer: Optimizer,
        clip_val: float | None = None,
        max_norm: float | None = None,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor | None:
        """Clip gradients by value (``clip_val``) or by total norm (``max_norm``); give exactly one of them.

        Returns:
            The total norm of the gradients before clipping with ``max_norm``, else ``None``.

        Example::

            fabric.backward(loss)
            norm = fabric.clip_gradients(model, optimizer, max_norm=1.0)  # the total norm before clipping
            # or: fabric.clip_gradients(model, optimizer, clip_val=0.5)  # clamp every value; returns None
            optimizer.step()
        """
        if clip_val is not None and max_norm is not None:
            raise ValueError(
                f"Only one of `clip_val` ({clip_val}) or `max_norm` ({max_norm}) can be set, as this specifies the"
                " clipping algorithm. Pass clip_val= to clip each gradient value, or max_norm= to clip the total norm."
            )
        module = _unwrap_objects(module)
        optimizer = _unwrap_objects(optimizer)
        if clip_val is not None:
            self._strategy.clip_gradients_value(module, optimizer, clip_val=clip_val)
            return None
        if max_norm is not None:
            return self._strategy.clip_gradients_norm(
                module, optimizer, max_norm=max_norm, norm_type=norm_type, error_if_nonfinite=error_if_nonfinite
            )
        raise ValueError(
            "You have to specify either `clip_val` or `max_norm` to do gradient clipping! E.g. max_norm=1.0."
        )

    def autocast(self) -> AbstractContextManager[Any]:
        """The precision's forward context, for code outside the module's forward (a no-op in full precision).

        Example::

            fabric = Fabric(precision="bf16-mixed")
            ...
            with fabric.autocast():  # e.g. a loss computed outside the model's forward
                loss = criterion(outputs, targets)
        """
        return self._strategy.precision.forward_context()

    def to_device(self, obj: Any) -> Any:
        """Move a module (in place) or a tensor or collection of tensors to :attr:`device`.

        Example::

            batch = fabric.to_device({"x": torch.zeros(2, 3), "ids": [torch.arange(2)]})  # every tensor moved
            fabric.to_device(model)  # a module moves in place and is returned
        """
        if isinstance(obj, nn.Module):
            self._strategy.module_to_device(obj)
            return obj
        return move_data_to_device(obj, self.device)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on the process with local rank 0 of each node only.

        Example::

            fabric.print(f"epoch {epoch}: loss {loss.item():.4f}")  # once per node, not once per process
        """
        if self.local_rank == 0:
            print(*args, **kwargs)

    def no_backward_sync(self, module: _FabricModule, enabled: bool = True) -> AbstractContextManager[Any]:
        """Skip the gradient synchronisation while accumulating gradients (DDP's ``no_sync``).

        Both the forward and ``fabric.backward`` must run inside the context; the next backward outside it
        synchronises the accumulated gradients. A no-op on a single device.

        Raises:
            TypeError: the module was not set up with Fabric.

        Example::

            for i, (x, y) in enumerate(loader):
                accumulating = (i + 1) % 4 != 0
                with fabric.no_backward_sync(model, enabled=accumulating):
                    loss = loss_fn(model(x), y)
                    fabric.backward(loss)  # no all-reduce while accumulating
                if not accumulating:
                    optimizer.step()  # the gradients of 4 batches, synchronised by the last backward
                    optimizer.zero_grad()
        """
        module = uncompiled(module)  # torch.compile(fabric_model) is accepted too
        if not isinstance(module, _FabricModule):
            raise TypeError(
                "You need to set up the model first before you can call `fabric.no_backward_sync()`:"
                f" `model = fabric.setup(model, ...)`. Got {type(module).__name__}."
            )
        from fabric_lite.strategies.single_device import SingleDeviceStrategy
        from fabric_lite.strategies.xla import XLAStrategy

        strategy = self._strategy
        if isinstance(strategy, (SingleDeviceStrategy, XLAStrategy)):
            return nullcontext()  # nothing to synchronise (XLA synchronises in optimizer.step)
        own = getattr(type(strategy), "no_backward_sync", None)
        if own is not None and own is not Strategy.no_backward_sync:  # a strategy's own, fabric_lite's hook
            return strategy.no_backward_sync(module._strategy_module, enabled)
        control = getattr(strategy, "_backward_sync_control", None)
        if control is None:
            rank_zero_warn(
                f"The `{strategy.__class__.__name__}` does not support skipping the gradient synchronization."
                " Remove `.no_backward_sync()` from your code or choose a different strategy.",
                category=PossibleUserWarning,
            )
            return nullcontext()
        return control.no_backward_sync(module._strategy_module, enabled)  # type: ignore[no-any-return]

    def sharded_model(self) -> AbstractContextManager[Any]:
        """Deprecated (as in Lightning): use :meth:`init_module`.

        Returns the strategy's ``module_sharded_context()`` where it has one, else a context that does nothing.
        Warns with ``LightningDeprecationWarning`` (a ``DeprecationWarning``) on global rank 0.

        Example::

            with fabric.init_module():  # instead of: with fabric.sharded_model():
                model = GPT(config)
        """
        rank_zero_deprecation("`Fabric.sharded_model()` is deprecated in favor of `Fabric.init_module()`.")
        # read through __class__, as the strategy's traits are: a strategy without the method has no such context
        if getattr(self._strategy.__class__, "module_sharded_context", None) is None:
            return nullcontext()
        return self._strategy.module_sharded_context()  # type: ignore[attr-defined,no-any-return]

    def init_tensor(self) -> AbstractContextManager[Any]:
        """Tensors created inside are created on :attr:`device`, in the precision's dtype.

        Example::

            fabric = Fabric(precision="bf16-true")
            with fabric.init_tensor():
                mask = torch.ones(4, 4)  # on fabric.device, dtype torch.bfloat16
        """
        return self._strategy.tensor_init_context()

    def init_module(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Modules created inside get their parameters on :attr:`device` in the precision's dtype, directly.

        Args:
            empty_init: skip the parameters' initialisation (for weights about to be loaded from a checkpoint).

        Example::

            with fabric.init_module():
                model = GPT(config)  # parameters created on fabric.device, in the precision's dtype
            with fabric.init_module(empty_init=True):
                model = GPT(config)  # not initialised: the weights are loaded next
            fabric.load_raw("gpt.pt", model)
        """
        self._validate_launched()
        return self._strategy.module_init_context(empty_init=empty_init)

    @contextmanager
    def rank_zero_first(self, local: bool = False) -> Generator[None, None, None]:
        """Run the block on rank 0 first (e.g. a download), then on the other processes.

        The waiting is not subject to the process-group timeout. Every process must enter the block.

        Args:
            local: let local rank 0 of every node go first instead of global rank 0.

        Example::

            with fabric.rank_zero_first(local=True):  # one download per node; the others then read the files
                dataset = torchvision.datasets.MNIST("data", download=True)
        """
        rank = self.local_rank if local else self.global_rank
        if self.world_size == 1:
            yield
            return
        # processes without a torch.distributed group (Horovod): the strategy's own barrier orders them
        with _InfiniteBarrier(fallback=partial(self._strategy.barrier, "rank_zero_first")) as barrier:
            if rank > 0:
                barrier()
            yield
            if rank == 0:
                barrier()

    # ------------------------------------------------------------------ collectives
    def barrier(self, name: str | None = None) -> None:
        """Wait until every process has entered the barrier. Every process must call it; a no-op on one device.

        With NCCL the processes meet on a gloo group beside it: the host does not wait for the GPU's queued work.

        Example::

            if fabric.global_rank == 0:
                prepare_data("data/")  # one process writes the files
            fabric.barrier()  # the others wait here until it is done
        """
        self._validate_launched()
        self._strategy.barrier(name=name)

    def broadcast(self, obj: TBroadcast, src: int = 0) -> TBroadcast:
        """Send ``obj`` from global rank ``src`` to every process; returns it on every process.

        Not in place. Tensors travel as tensors and arrive on each process's device; any other picklable object
        is pickled. Every process must call it; what the other processes pass is ignored.

        Example::

            # rank 0: obj = {"lr": 0.1}   rank 1: obj = None
            obj = fabric.broadcast(obj, src=0)
            # rank 0: {"lr": 0.1}        rank 1: {"lr": 0.1}
        """
        self._validate_launched()
        return self._strategy.broadcast(obj, src=src)

    def all_gather(self, data: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather a tensor, a number, or every tensor/number in a (nested) collection from all processes.

        Not in place: new tensors of shape ``(world_size, *shape)`` are returned, in the same collection
        structure; numbers are turned into tensors first (int32/float32/uint8, as in Lightning). With a world size
        of 1 no dimension is added, as Lightning documents. Every process must call it with the same shapes and
        dtypes; otherwise every process raises ``ValueError`` naming each rank's shapes instead of hanging. On CUDA
        this adds no host-device synchronisation.

        Args:
            sync_grads: make the result differentiable; each process's input receives the gradient of its slice.

        Example::

            # rank 0: data = torch.tensor([1, 2])   rank 1: data = torch.tensor([3, 4])
            fabric.all_gather(data)  # every rank: tensor([[1, 2], [3, 4]])
        """
        self._validate_launched()
        if isinstance(data, Tensor):
            return self._strategy.all_gather(convert_to_tensors(data, self.device), group=group, sync_grads=sync_grads)
        return _on_tensors(data, self.device, self._strategy, "all_gather", group=group, sync_grads=sync_grads)

    def gather_for_metrics(self, data: Any, dataloader: Any | None = None) -> Any:
        """Gather per-sample results (e.g. predictions and targets) from every process, for a metric over exactly
        the dataset: the samples that ``DistributedSampler`` repeats to give every process as many are dropped.

        Call it for each batch inside the loop over a loader from :meth:`setup_dataloaders`, or once after the loop
        with the epoch's per-sample results concatenated in order. Every tensor of ``data`` must have the batch as
        its first dimension and the same other dimensions on every process; other leaves are returned as they are.
        The result holds every process's rows in the sampler's order (the dataset's order unless the loader
        shuffles); a loader without a ``DistributedSampler`` pads nothing, and its rows are concatenated rank after
        rank. With one process ``data`` is returned as is. Every process must call it.

        Args:
            data: a tensor, or a collection of tensors, with one row per sample of the batch (or of the epoch).
            dataloader: the loader the data comes from; by default the one set up by this Fabric that is being
                iterated.

        Raises:
            ValueError: the loader cannot be told, a tensor has no batch dimension, or the rows do not match the
                batch being processed; the message says what to pass.

        Example::

            # 5 samples on 2 processes, batch_size=2: rank 0 sees samples [0, 2], [4]; rank 1 sees [1, 3], [0]
            for x, y in val_loader:
                preds, targets = fabric.gather_for_metrics((model(x).argmax(-1), y))
                metric.update(preds, targets)  # every rank: samples 0, 1, 2, 3, then 4 (not 0 again)
        """
        self._validate_launched()
        return gather_for_metrics(data, self._strategy, dataloader, self._dataloaders)

    def all_reduce(self, data: Any, group: Any | None = None, reduce_op: str | ReduceOp | None = "mean") -> Any:
        """Reduce a tensor, a number, or every tensor/number in a (nested) collection across all processes.

        In place: each tensor on :attr:`device` is overwritten with the result and returned (numbers become tensors
        first, and CUDA data see no host-device synchronisation, as in :meth:`all_gather`). ``reduce_op`` is
        ``"mean"`` (default; ``"avg"``), ``"sum"``, ``"max"``, ``"min"``, ``"product"`` or a
        ``torch.distributed.ReduceOp``; an integer ``mean`` stays an integer, truncated toward zero. A collection is
        reduced with one collective per dtype (a strategy of your own whose ``all_reduce`` overrides fabric_lite's is
        called once per tensor, as in Lightning). Every process must call it with the same shapes, dtypes and order.
        With one process the data comes back as is, except with ``strategy="dp"``, which reduces the elements of
        each tensor (the values ``DataParallel`` gathered from its replicas) into a new 0-dim tensor.

        Example::

            # rank 0: {"loss": tensor(1.), "n": 3}   rank 1: {"loss": tensor(3.), "n": 5}
            fabric.all_reduce({"loss": loss, "n": n})  # every rank: {"loss": tensor(2.), "n": tensor(4, dtype=int32)}
        """
        self._validate_launched()
        if isinstance(data, Tensor):
            device = self.device
            return self._strategy.all_reduce(
                data if data.device == device else convert_to_tensors(data, device), group=group, reduce_op=reduce_op
            )
        # the strategy returns the list it was given, reduced in place, or (DataParallel) a list of new tensors; the
        # result is a new collection holding them, as in Lightning
        return _on_tensors(data, self.device, self._strategy, "all_reduce", group=group, reduce_op=reduce_op)

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:
        """``all`` of the processes' decisions (``any`` with ``all=False``), in one collective.

        Every process must call it; every process gets the same answer.

        Example::

            # rank 0: stop = True   rank 1: stop = False
            fabric.reduce_boolean_decision(stop)  # every rank: False (all of them)
            fabric.reduce_boolean_decision(stop, all=False)  # every rank: True (any of them)
        """
        self._validate_launched()
        return self._strategy.reduce_boolean_decision(decision, all=all)

    # ------------------------------------------------------------------ checkpoints
    def save(
        self, path: _PATH, state: dict[str, Any], filter: dict[str, Callable[[str, Any], bool]] | None = None
    ) -> None:
        """Save ``state`` to ``path``: modules and optimizers by their state dicts, objects with ``state_dict()``
        by it, other values as they are.

        Rank 0 writes the file atomically (the previous file survives any failure); every process returns once
        the file is complete, and if writing fails every process raises with the path in the message. Every
        process must call it.

        Args:
            filter: per key of ``state``, a function ``(name, value) -> bool`` choosing the entries of its state
                dict to keep.

        Example::

            fabric.save("checkpoints/last.ckpt", {"model": model, "optimizer": optimizer, "step": step})
            # only the weights, not the biases:
            fabric.save("weights.ckpt", {"model": model}, filter={"model": lambda name, value: "weight" in name})
        """
        if not isinstance(state, Mapping):
            raise TypeError(f"Fabric.save(state=...) expects a dict, got {type(state).__name__}: {{'model': model}}.")
        if filter is not None:
            if not isinstance(filter, dict):
                raise TypeError(f"Filter should be a dictionary, given {filter!r}")
            if not set(filter).issubset(state):
                raise ValueError(
                    f"The filter keys {set(filter) - set(state)} are not present in the state keys {set(state)}."
                )
            for key, fn in filter.items():
                if not callable(fn):
                    raise TypeError(
                        f"Expected `fabric.save(filter=...)` for key {key!r} to be a callable, given {fn!r}"
                    )
        self._strategy.save_checkpoint(path=path, state=_unwrap_state(state), filter=filter)

    def load(
        self, path: _PATH, state: dict[str, Any] | None = None, strict: bool = True, *, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Restore ``state`` in place from the checkpoint at ``path`` and return the entries it did not restore.

        Modules, optimizers and stateful objects are loaded in place; plain values are written back into
        ``state``. With ``state=None`` the whole checkpoint is returned.

        Args:
            strict: a key of ``state`` missing from the checkpoint raises ``KeyError`` naming it.
            weights_only: ``None``/``True`` (default) refuses files that would run code when unpickled; pass
                ``False`` only for files you trust. fabric_lite never falls back to ``False`` by itself.

        Example::

            state = {"model": model, "optimizer": optimizer, "step": 0}
            remainder = fabric.load("checkpoints/last.ckpt", state)  # model and optimizer restored in place
            step = state["step"]  # plain values are written back into state
            checkpoint = fabric.load("checkpoints/last.ckpt")  # no state: the whole checkpoint, as a dict
        """
        unwrapped = _unwrap_state(state) if state is not None else None
        remainder = self._strategy.load_checkpoint(path=path, state=unwrapped, strict=strict, weights_only=weights_only)
        if state is not None and unwrapped is not None:
            for key, value in unwrapped.items():
                if not is_wrapped(state[key]):
                    state[key] = value
        return remainder

    def load_raw(
        self, path: _PATH, obj: nn.Module | Optimizer, strict: bool = True, *, weights_only: bool | None = None
    ) -> None:
        """Load a raw state dict (e.g. from ``torch.save(model.state_dict())``) into a module or optimizer.

        Example::

            torch.save(model.state_dict(), "weights.pt")  # a plain state dict, saved without Fabric
            fabric.load_raw("weights.pt", model)  # into a module (set up or not) or an optimizer
        """
        self._strategy.load_checkpoint(path=path, state=_unwrap_objects(obj), strict=strict, weights_only=weights_only)

    # ------------------------------------------------------------------ callbacks and loggers
    def call(self, hook_name: str, *args: Any, **kwargs: Any) -> None:
        """Call the method ``hook_name`` of every callback that has one (``Fabric(callbacks=...)``, in order).

        Each method gets ``*args`` and, of ``**kwargs``, only the names its signature takes (all of them if it has
        ``**kwargs``), so callbacks can declare just what they use. Callbacks without the method are skipped; one
        whose attribute is not callable is skipped with a warning (on rank 0). Runs on every process that calls it.

        Raises:
            TypeError: a method cannot take the positional arguments or misses a required one; the message names
                the callback and its signature.

        Example::

            class PrintLoss:
                def on_train_epoch_end(self, loss):
                    print(loss)

            fabric = Fabric(callbacks=[PrintLoss()])
            fabric.call("on_train_epoch_end", loss=0.5, epoch=3)  # PrintLoss gets loss=0.5 only
        """
        call_hook(self._callbacks, hook_name, args, kwargs, warn=self.is_global_zero)

    def log(self, name: str, value: Any, step: int | None = None) -> None:
        """Log one scalar to every logger: ``log_dict({name: value}, step)``.

        Example::

            fabric.log("train/loss", loss, step=global_step)
        """
        if not isinstance(name, str):
            raise TypeError(f"fabric.log(name, value) expects a str name, got {name!r} ({type(name).__name__}).")
        self.log_dict({name: value}, step=step)

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Log several scalars to every logger (``logger.log_metrics(metrics, step)``), from global rank 0 only.

        One-element tensors become numbers (nested dicts too, for loggers that group scalars). Every process may
        call it; on the others it only checks the values, so a wrong value fails on every rank alike.

        Raises:
            TypeError: ``metrics`` is not a dict of names to values.
            ValueError: a tensor with more than one element; the message names the metric and its shape.

        Example::

            fabric = Fabric(loggers=CSVLogger("logs"))
            fabric.log_dict({"loss": loss, "acc": 0.75}, step=10)  # rank 0 writes logs/lightning_logs/version_0
        """
        _check_metrics(metrics, "fabric.log_dict")
        if not self._loggers or not self.is_global_zero:
            return
        converted = _to_scalars(metrics)
        for logger in self._loggers:
            logger.log_metrics(metrics=converted, step=step)

    @staticmethod
    def seed_everything(seed: int | None = None, workers: bool | None = None, verbose: bool = True) -> int:
        """:func:`fabric_lite.seed_everything`, with ``workers=True`` unless told otherwise (as in Lightning).

        Example::

            fabric.seed_everything(42)  # random, NumPy and torch, and every dataloader worker set up afterwards
        """
        return seed_everything(seed=seed, workers=True if workers is None else workers, verbose=verbose)


def _trait(obj: object, name: str) -> bool:
    """Whether the class of ``obj`` declares the trait ``name`` ``True`` (``False`` for ``None``). Read through
    ``__class__``, so that a stand-in (a proxy, a ``Mock(spec=DDPStrategy)``) answers for the class it stands for."""
    return getattr(obj.__class__, name, False) is True


def _on_tensors(data: Any, device: torch.device, strategy: Strategy, collective: str, **kwargs: Any) -> Any:
    """``data`` (a nested collection) with its numbers made tensors on ``device`` and its tensors replaced by the
    results of the strategy's ``collective(..., **kwargs)``. fabric_lite's strategies take all tensors in one list;
    another strategy gets one tensor per call, as in Lightning
    (:func:`fabric_lite.strategies.strategy._takes_collections`)."""
    leaves, spec = flatten(data)
    converted = convert_leaves(leaves, device)
    tensors = [x for x in converted if isinstance(x, Tensor)]
    method = getattr(strategy, collective)
    takes_list = getattr(getattr(type(strategy), collective, None), "_takes_collections", False) is True
    results = iter(method(tensors, **kwargs) if takes_list else [method(tensor, **kwargs) for tensor in tensors])
    return unflatten(spec, [next(results) if isinstance(leaf, Tensor) else leaf for leaf in converted])


def _check_optimizers_own_parameters(module: nn.Module, optimizers: Sequence[Optimizer]) -> None:
    owned = {id(p) for p in module.parameters()}
    for index, optimizer in enumerate(optimizers):
        if not isinstance(optimizer, Optimizer):
            raise TypeError(f"fabric.setup expects optimizers after the module, got {type(optimizer).__name__}.")
        foreign = sum(1 for group in optimizer.param_groups for p in group["params"] if id(p) not in owned)
        if foreign:
            raise ValueError(
                f"Optimizer {index} ({type(optimizer).__name__}) updates {foreign} parameter(s) that are not"
                f" parameters of the {type(module).__name__} passed to setup. Create the optimizer from this"
                " module's parameters, e.g. torch.optim.SGD(model.parameters(), lr=0.1)."
            )


def _sized(loader: DataLoader[Any]) -> bool:
    try:
        len(loader)
    except TypeError:
        return False
    return True
