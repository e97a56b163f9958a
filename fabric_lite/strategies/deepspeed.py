"""DeepSpeed: ZeRO stages 0 to 3, with optimizer and parameter offload, on CUDA or on the CPU. DeepSpeed is
optional and imported only when a :class:`DeepSpeedStrategy` is created."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from torch import Tensor
from torch.nn import Module
from torch.optim import Optimizer
from typing_extensions import override

from fabric_lite.accelerators import Accelerator
from fabric_lite.plugins.environments import ClusterEnvironment
from fabric_lite.plugins.precision import Precision
from fabric_lite.plugins.precision.deepspeed import DEEPSPEED_PRECISIONS, DeepSpeedPrecision
from fabric_lite.runtime.checkpoint import deepspeed as _deepspeed_checkpoint
from fabric_lite.strategies import _deepspeed_config, _deepspeed_runtime
from fabric_lite.strategies._backward_sync import _NestedSyncSwitch
from fabric_lite.strategies.parallel import ParallelStrategy, default_pg_timeout
from fabric_lite.utilities.imports import import_deepspeed
from fabric_lite.utilities.rank_zero import rank_zero_info
from fabric_lite.utilities.types import _PATH


class DeepSpeedStrategy(ParallelStrategy):
    """Train with DeepSpeed's ZeRO: optimizer state (stage 1), gradients (2) and parameters (3) sharded across the
    processes, optionally offloaded to the CPU or NVMe; on CUDA with NCCL, or on the CPU with gloo.

    The arguments are Lightning Fabric's and build a DeepSpeed config unless ``config`` is given. DeepSpeed builds
    one engine of model and optimizer, so they are set up together (``fabric.setup(model, optimizer)``);
    ``fabric.backward`` and ``optimizer.step()`` are the engine's. Clipping is the config's ``"gradient_clipping"``
    (``fabric.clip_gradients`` is refused). Under ZeRO 1 and 2, where DeepSpeed keeps only the last backward's
    gradients, accumulate inside ``fabric.no_backward_sync(model)``.

    Args:
        accelerator, parallel_devices, cluster_environment, precision: filled in by ``Fabric`` when not given.
        zero_optimization: write a ``zero_optimization`` section (with ``stage`` and the ZeRO arguments below).
        stage: 0 (data parallel), 1 (optimizer state sharded), 2 (and gradients), 3 (and parameters).
        remote_device: where ZeRO-3's ``init_module`` creates parameters: ``None`` (the device), ``"cpu"``, ``"nvme"``.
        offload_optimizer, offload_parameters: move the optimizer state or the ZeRO-3 parameters to
            ``offload_optimizer_device``/``offload_params_device`` (``"cpu"`` or ``"nvme"``). A torch optimizer with
            offload needs ``"zero_force_ds_cpu_optimizer": false`` in the config.
        nvme_path, params_buffer_count, params_buffer_size, max_in_cpu, optimizer_buffer_count, block_size,
            queue_depth, single_submit, overlap_events, thread_count, pin_memory: DeepSpeed's offload and AIO
            settings.
        sub_group_size, contiguous_gradients, overlap_comm, allgather_partitions, reduce_scatter,
            allgather_bucket_size, reduce_bucket_size: DeepSpeed's ``zero_optimization`` settings.
        zero_allow_untested_optimizer: allow optimizers other than DeepSpeed's own with ZeRO.
        logging_batch_size_per_gpu: ``train_micro_batch_size_per_gpu`` for DeepSpeed's throughput log (1 if unset).
        config: a DeepSpeed config dict or JSON file path, replacing every config argument above; with ``None``,
            ``$PL_DEEPSPEED_CONFIG_PATH`` names the file when set.
        logging_level: the level of DeepSpeed's logger.
        loss_scale, initial_scale_power, loss_scale_window, hysteresis, min_loss_scale: float16's loss scaling.
        partition_activations, cpu_checkpointing, contiguous_memory_optimization, synchronize_checkpoint_boundary:
            DeepSpeed's activation checkpointing settings.
        load_full_weights: kept for Lightning: a single checkpoint file is recognised by itself.
        process_group_backend, timeout: as for :class:`ParallelStrategy`.
        exclude_frozen_parameters: leave parameters without gradients out of checkpoints.

    Raises:
        ModuleNotFoundError: DeepSpeed is not installed; the message gives the install command.
        ImportError: the installed DeepSpeed and torch do not work together.
        ValueError, TypeError, FileNotFoundError: an argument that is not accepted, or a missing config file.

    Example::

        fabric = Fabric(accelerator="cpu", devices=2, strategy="deepspeed_stage_2", precision="bf16-mixed")
    """

    #: where Lightning reads a config file from when ``config`` is not given
    DEEPSPEED_ENV_VAR = "PL_DEEPSPEED_CONFIG_PATH"
    requires_joint_setup = True
    accepts_checkpoint_io = False
    _own_checkpoints = "DeepSpeed's engine writes every rank's partitions into its checkpoint folders itself"

    def __init__(
        self,
        accelerator: Accelerator | None = None,
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: str | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        nvme_path: str = "/local_nvme",
        params_buffer_count: int = 5,
        params_buffer_size: int = 100_000_000,
        max_in_cpu: int = 1_000_000_000,
        offload_optimizer_device: str = "cpu",
        optimizer_buffer_count: int = 4,
        block_size: int = 1048576,
        queue_depth: int = 8,
        single_submit: bool = False,
        overlap_events: bool = True,
        thread_count: int = 1,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: int | None = None,
        config: _PATH | dict[str, Any] | None = None,
        logging_level: int = logging.WARN,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        load_full_weights: bool = False,
        precision: Precision | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        exclude_frozen_parameters: bool = False,
    ) -> None:
        arguments = locals()  # the arguments as passed (first, before any other local): the default config's
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            precision=_deepspeed_runtime.deepspeed_precision(precision),
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self._start_method = "popen"  # fabric.launch() runs the script again once per extra local device
        # the arguments are checked before DeepSpeed is imported, so that a typo fails at once, DeepSpeed or not
        _deepspeed_config.check_arguments(
            stage=stage,
            remote_device=remote_device,
            offload_params_device=offload_params_device,
            offload_optimizer_device=offload_optimizer_device,
            logging_batch_size_per_gpu=logging_batch_size_per_gpu,
        )
        # Lightning reads this variable too; it names a file, and only when no config is passed
        env_path = os.environ.get(self.DEEPSPEED_ENV_VAR) if config is None else None
        loaded = _deepspeed_config.load_config(config, env_path)
        if env_path:
            rank_zero_info(f"Loading DeepSpeed config from set {self.DEEPSPEED_ENV_VAR} environment variable")
        if loaded is None:
            loaded = _deepspeed_config.default_config_from(arguments)
        #: the DeepSpeed config handed to ``deepspeed.initialize`` (the precision is added at ``fabric.launch()``)
        self.config: dict[str, Any] = loaded
        self._deepspeed = import_deepspeed()
        self._deepspeed.utils.logging.logger.setLevel(logging_level)
        self._config_initialized = False
        self.remote_device = remote_device
        self.load_full_weights = load_full_weights
        self.exclude_frozen_parameters = exclude_frozen_parameters
        self.loss_scale = loss_scale
        self.initial_scale_power = initial_scale_power
        self.loss_scale_window = loss_scale_window
        self.hysteresis = hysteresis
        self.min_loss_scale = min_loss_scale
        # the engines set up by this strategy (the last one is ``model``), and their accumulation bookkeeping
        self._engines: list[Any] = []
        # no_backward_sync holds DeepSpeed's accumulation boundary off until the outermost block ends
        self._backward_sync_control: _NestedSyncSwitch = _NestedSyncSwitch(self._sync_target, _set_boundary)
        self._synchronised: set[int] = set()
        self._inference_engines: set[int] = set()  # set up without an optimizer (setup_module)

    # ------------------------------------------------------------------ configuration
    @property
    @override
    def precision(self) -> Precision:
        """The :class:`DeepSpeedPrecision` (``"32-true"`` unless ``Fabric(precision=...)`` says otherwise)."""
        return self._precision if self._precision is not None else DeepSpeedPrecision("32-true")

    @precision.setter
    def precision(self, precision: Precision | None) -> None:
        self._precision = _deepspeed_runtime.deepspeed_precision(precision)

    @classmethod
    @override
    def _check_choices(cls, *, label: str, accelerator: str, precision: str) -> None:
        """DeepSpeed runs five precisions, on CUDA or the CPU, and has no float16 on the CPU."""
        if accelerator == "mps":
            raise ValueError(
                f"strategy={label!r} runs on CUDA GPUs or on the CPU, not on accelerator='mps'. Choose"
                " accelerator='cuda' or 'cpu', or another strategy."
            )
        if precision not in DEEPSPEED_PRECISIONS:
            raise ValueError(
                f"precision={precision!r} is not supported with strategy={label!r}: DeepSpeed runs one of"
                f" {', '.join(map(repr, DEEPSPEED_PRECISIONS))}."
            )
        if accelerator == "cpu" and precision.startswith("16-"):
            raise ValueError(
                f"precision={precision!r} with strategy={label!r} needs float16, which DeepSpeed's CPU accelerator"
                " does not run ('Type fp16 is not supported on your device'). On the CPU choose"
                " precision='bf16-mixed' or 'bf16-true'; float16 needs accelerator='cuda'."
            )

    @property
    def zero_stage_3(self) -> bool:
        """Whether the config asks for ZeRO stage 3 (parameters partitioned)."""
        return _deepspeed_config.zero_stage(self.config) == 3

    @property
    def model(self) -> Any:
        """The last ``DeepSpeedEngine`` set up by this strategy (``None`` before ``fabric.setup``)."""
        return self._engines[-1] if self._engines else None

    # ------------------------------------------------------------------ process group
    @override
    def _setup_distributed(self) -> None:
        super()._setup_distributed()
        _deepspeed_runtime.join_process_group(
            self._deepspeed,
            device=self.root_device,
            ranks=(self.global_rank, self.local_rank, self.world_size),
            main_address=self.cluster_environment.main_address,
            main_port=getattr(self._store, "port", None) or self.cluster_environment.main_port,
            backend=self.process_group_backend,
            timeout=self.timeout,
        )
        if not self._config_initialized:
            _deepspeed_config.format_config(
                self.config,
                self.precision.precision,
                loss_scale=self.loss_scale,
                loss_scale_window=self.loss_scale_window,
                min_loss_scale=self.min_loss_scale,
                initial_scale_power=self.initial_scale_power,
                hysteresis=self.hysteresis,
            )
            self._config_initialized = True

    # ------------------------------------------------------------------ modules and optimizers
    def _check_launched(self, what: str) -> None:
        if not self._config_initialized:
            raise RuntimeError(
                f"DeepSpeedStrategy.{what} needs DeepSpeed's process group and final config: call fabric.launch()"
                " first."
            )

    def _initialize_engine(self, module: Module, optimizer: Optimizer | None) -> tuple[Any, Any]:
        self._check_launched("setup")
        parameters = [p for p in module.parameters() if p.requires_grad]
        device_rank = self.root_device.index if self.root_device.type == "cuda" else self.local_rank
        engine, ds_optimizer, _, _ = self._deepspeed.initialize(
            # a real, non-negative device rank: with -1 (or Lightning's None on the CPU) DeepSpeed assumes one process
            args=argparse.Namespace(device_rank=device_rank),
            config=self.config,
            model=module,
            model_parameters=parameters,
            optimizer=optimizer,
            dist_init_required=False,
        )
        if engine.world_size != self.world_size:
            raise RuntimeError(
                f"DeepSpeed's engine sees a world size of {engine.world_size}, but this job has {self.world_size}"
                f" processes (rank {self.global_rank}). Its data-parallel groups would not match the other ranks'."
            )
        self._engines.append(engine)
        activation_config = self.config.get("activation_checkpointing")
        if activation_config:
            self._deepspeed.checkpointing.configure(
                mpu_=None,
                partition_activations=activation_config.get("partition_activations"),
                contiguous_checkpointing=activation_config.get("contiguous_memory_optimization"),
                checkpoint_in_cpu=activation_config.get("cpu_checkpointing"),
                profile=activation_config.get("profile"),
            )
        return engine, ds_optimizer

    @override
    def setup_module_and_optimizers(
        self, module: Module, optimizers: list[Optimizer], scheduler: Any = None
    ) -> tuple[Module, list[Optimizer], Any]:
        """``deepspeed.initialize(model, optimizer)``: the ``DeepSpeedEngine`` and DeepSpeed's optimizer.

        Raises:
            ValueError: not exactly one optimizer.
            RuntimeError: DeepSpeed's engine sees another world size than this job's.
        """
        if len(optimizers) != 1:
            raise ValueError(
                f"Currently only one optimizer is supported with DeepSpeed. Got {len(optimizers)} optimizers instead."
                " Put the parameters in several param groups of one optimizer, or use another strategy."
            )
        engine, ds_optimizer = self._initialize_engine(module, optimizers[0])
        return engine, [ds_optimizer], scheduler  # the scheduler stays yours to step

    @override
    def setup_module(self, module: Module) -> Module:
        """An engine without optimizer, for inference; ``RuntimeError`` under ZeRO stage 1 or 2, which shard an
        optimizer's state."""
        stage = _deepspeed_config.zero_stage(self.config)
        if stage in (1, 2):
            raise RuntimeError(
                f"DeepSpeed's ZeRO stage {stage} partitions an optimizer's state, so it cannot set up"
                f" {type(module).__name__} without one (fabric.setup_module). Set it up with its optimizer,"
                " model, optimizer = fabric.setup(model, optimizer), or use stage 3 (or 0) for a model without"
                " optimizer (inference)."
            )
        engine, _ = self._initialize_engine(module, None)
        self._inference_engines.add(id(engine))
        return engine  # type: ignore[no-any-return]

    @override
    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Refused: DeepSpeed sets up the model and its optimizer together (``fabric.setup(model, optimizer)``)."""
        raise NotImplementedError(
            f"The `{type(self).__name__}` requires the model and optimizer(s) to be set up jointly through"
            f" `.setup(model, optimizer, ...)`: got fabric.setup_optimizers({type(optimizer).__name__}). Create the"
            " optimizer from the model's parameters and call model, optimizer = fabric.setup(model, optimizer)."
        )

    @override
    def module_to_device(self, module: Module) -> None:
        """Move the module to the device, except under ZeRO stage 3, where DeepSpeed places the partitions."""
        if not self.zero_stage_3:
            super().module_to_device(module)

    @override
    def module_init_context(self, empty_init: bool | None = None) -> AbstractContextManager[Any]:
        """Under ZeRO stage 3, ``deepspeed.zero.Init`` (parameters partitioned as created); else as the base class's.

        Raises:
            NotImplementedError: ``empty_init=False`` under stage 3.
            RuntimeError: before ``fabric.launch()``.
        """
        if self.zero_stage_3 and empty_init is False:
            raise NotImplementedError(
                f"`{empty_init=}` is not a valid choice with `DeepSpeedStrategy` when ZeRO stage 3 is enabled: the"
                " parameters are partitioned (and initialised) as they are created. Use fabric.init_module() or"
                " init_module(empty_init=True)."
            )
        stack = ExitStack()
        if not self.zero_stage_3:
            stack.enter_context(super().module_init_context(empty_init=empty_init))
        stack.enter_context(self.module_sharded_context())
        return stack

    def module_sharded_context(self) -> AbstractContextManager[Any]:
        """``deepspeed.zero.Init`` with this strategy's config: enabled under stage 3, a no-op otherwise."""
        self._check_launched("init_module")
        return self._deepspeed.zero.Init(  # type: ignore[no-any-return]
            enabled=self.zero_stage_3, remote_device=self.remote_device, config_dict_or_path=self.config
        )

    # ------------------------------------------------------------------ backward and step
    def _engine_of(self, module: Module | None, action: str) -> Any:
        if module is None:
            if not self._engines:
                raise RuntimeError("No models were set up for backward. Did you forget to call `fabric.setup()`?")
            if len(self._engines) > 1:
                raise ValueError(
                    "When using multiple models + deepspeed, please provide the model used to perform the"
                    " optimization: `fabric.backward(loss, model=model)`."
                )
            return self._engines[-1]
        if not any(module is engine for engine in self._engines):
            raise TypeError(
                f"{action} needs a model set up by DeepSpeedStrategy, got {type(module).__name__}: use the model"
                " returned by fabric.setup(model, optimizer)."
            )
        return module

    @override
    def backward(self, tensor: Tensor, module: Module | None, *args: Any, **kwargs: Any) -> None:
        """``engine.backward(tensor)`` for the model's engine (the only one, when ``module`` is ``None``).

        Raises:
            RuntimeError: the engine has no optimizer, or (ZeRO stages 1 and 2) a second synchronising backward
                comes before ``optimizer.step()``.
        """
        engine = self._engine_of(module, "fabric.backward")
        if id(engine) in self._inference_engines:
            raise RuntimeError(
                "This model was set up without an optimizer (fabric.setup_module), so DeepSpeed cannot run its"
                " backward. Set it up for training with model, optimizer = fabric.setup(model, optimizer)."
            )
        key = id(engine)
        synchronising = not self._backward_sync_control.is_off(engine)
        stage = _deepspeed_config.zero_stage(self.config)
        repeated = synchronising and key in self._synchronised
        if repeated and stage in (1, 2) and engine.gradient_accumulation_steps() == 1:
            # ZeRO 1/2 replace, not add to, the reduced gradients at every boundary: the first backward would be lost
            raise RuntimeError(
                f"fabric.backward ran twice without optimizer.step() in between: with ZeRO stage {stage} DeepSpeed"
                " keeps only the gradients of the last backward. To accumulate gradients, run the earlier backward"
                " passes inside `with fabric.no_backward_sync(model):`, or set 'gradient_accumulation_steps' in the"
                " DeepSpeed config and call optimizer.step() after every backward."
            )
        super().backward(tensor, engine, *args, **kwargs)
        if synchronising:
            self._synchronised.add(key)

    @override
    def optimizer_step(self, optimizer: Optimizer, **kwargs: Any) -> Any:
        """``engine.step()`` for the engine of ``optimizer`` (which also zeroes the gradients).

        Raises:
            RuntimeError: inside ``fabric.no_backward_sync``, where the step would silently do nothing.
            ValueError: a closure (DeepSpeed's step takes none).
        """
        engine = next((e for e in self._engines if e.optimizer is optimizer), None)
        if engine is None:
            raise ValueError(
                f"The {type(optimizer).__name__} optimizer was not set up with this DeepSpeedStrategy: use the"
                " optimizer returned by fabric.setup(model, optimizer)."
            )
        if kwargs.get("closure") is not None:
            raise ValueError("DeepSpeed's optimizer step takes no closure: call optimizer.step() without one.")
        if self._backward_sync_control.is_off(engine):
            raise RuntimeError(
                "optimizer.step() was called inside fabric.no_backward_sync(model): DeepSpeed would not step there."
                " Step after the backward outside the context, which synchronises the accumulated gradients."
            )
        self._synchronised.discard(id(engine))
        return engine.step()

    def _sync_target(self, module: Module) -> Any:
        """The engine of ``module`` for ``no_backward_sync``; ``TypeError`` unless this strategy set it up."""
        return self._engine_of(module, "fabric.no_backward_sync")

    @override
    def clip_gradients_norm(
        self,
        module: Module,
        optimizer: Optimizer,
        max_norm: float,
        norm_type: float = 2.0,
        error_if_nonfinite: bool = True,
    ) -> Tensor:
        """Refused: DeepSpeed clips inside ``optimizer.step()``, by its config's ``gradient_clipping``."""
        raise NotImplementedError(_clipping_message(f"max_norm={max_norm!r}", max_norm))

    @override
    def clip_gradients_value(self, module: Module, optimizer: Optimizer, clip_val: float) -> None:
        """Refused: DeepSpeed clips inside ``optimizer.step()``, by its config's ``gradient_clipping``."""
        raise NotImplementedError(_clipping_message(f"clip_val={clip_val!r}", None))

    # ------------------------------------------------------------------ checkpoints
    @override
    def save_checkpoint(
        self,
        path: _PATH,
        state: dict[str, Any],
        storage_options: Any | None = None,
        filter: dict[str, Callable[[str, Any], bool]] | None = None,
    ) -> None:
        """Save ``state`` (one DeepSpeed engine, its optimizer, other entries) as DeepSpeed's checkpoint folder at
        ``path``, swapped into place once every rank has written (on several nodes, a shared filesystem). Every
        rank must call it.

        Raises:
            TypeError: ``storage_options`` or ``filter`` (DeepSpeed serialises the state itself).
            ValueError: no DeepSpeed model in ``state``, several, or a remote ``path``.
            CheckpointError: a rank failed to write; the previous checkpoint is kept.
        """
        if storage_options is not None:
            raise TypeError(
                "`DeepSpeedStrategy.save_checkpoint(..., storage_options=...)` is not supported because"
                " `DeepSpeedStrategy` does not use the `CheckpointIO`: pass storage_options=None."
            )
        if filter is not None:
            raise TypeError(
                "`DeepSpeedStrategy.save_checkpoint(..., filter=...)` is not supported because `DeepSpeedStrategy`"
                " manages the state serialization internally: save without filter."
            )
        path = self.broadcast(path)  # rank 0's path: every rank writes into the same folder
        ranks = (self.global_rank, self.world_size, self.broadcast)
        _deepspeed_checkpoint.save(path, state, self.exclude_frozen_parameters, ranks)

    @override
    def load_checkpoint(
        self,
        path: _PATH,
        state: Module | Optimizer | dict[str, Any] | None = None,
        strict: bool = True,
        weights_only: bool | None = True,
    ) -> dict[str, Any]:
        """Restore ``state`` in place and return the checkpoint's entries that were not restored. Every rank must
        call it.

        From a DeepSpeed folder, ``state`` must hold this strategy's model; ZeRO's optimizer state loads only at the
        saving world size (DeepSpeed cannot re-partition it). From one file (``fabric-lite consolidate``'s output or
        another strategy's checkpoint) modules are loaded whole, optimizers not at all.

        Raises:
            ValueError: no state, no DeepSpeed model in it, several, or an optimizer with a single file.
            KeyError: with ``strict``, an entry the checkpoint lacks.
            FileNotFoundError: ``path`` is neither a checkpoint folder nor a file.
            CheckpointError: DeepSpeed could not load the folder, or the world size changed with the optimizer in
                ``state``.
        """
        path = self.broadcast(path)
        if not _deepspeed_checkpoint.is_deepspeed_checkpoint(path) and Path(str(path)).is_file():
            return _deepspeed_checkpoint.load_full(path, state, strict, weights_only)
        if not state:
            raise ValueError(
                f"Got DeepSpeedStrategy.load_checkpoint(..., state={state!r}) but a state with at least a model"
                " instance to reload is required. Pass it in like so: fabric.load(path, {'model': model, ...}), or"
                " consolidate the folder into one file first (fabric-lite consolidate FOLDER)."
            )
        if isinstance(state, Module):
            state = {"model": state}
        elif isinstance(state, Optimizer) or not isinstance(state, dict):
            raise ValueError(
                f"DeepSpeedStrategy.load_checkpoint(state={type(state).__name__}): ZeRO's optimizer state is loaded"
                " together with its model. Pass both: fabric.load(path, {'model': model, 'optimizer': optimizer})."
            )
        return _deepspeed_checkpoint.load(path, state, strict)

    # ------------------------------------------------------------------ teardown
    @override
    def teardown(self) -> None:
        self._engines.clear()
        self._backward_sync_control.clear()
        self._synchronised.clear()
        self._inference_engines.clear()
        super().teardown()

    def __repr__(self) -> str:
        stage = _deepspeed_config.zero_stage(self.config)
        return f"{type(self).__name__}(stage={stage}, precision={self.precision.precision!r})"


def _set_boundary(engine: Any, enabled: bool) -> None:
    """Hold DeepSpeed's gradient accumulation boundary off, or give it back to DeepSpeed's own counting."""
    engine.set_gradient_accumulation_boundary(None if enabled else False)


def _clipping_message(given: str, max_norm: float | None) -> str:
    value = max_norm if max_norm is not None else 1.0
    return (
        f"DeepSpeed handles gradient clipping automatically within the optimizer (got fabric.clip_gradients({given}))."
        f" Make sure to set the `gradient_clipping` value in your Config: DeepSpeedStrategy(config={{...,"
        f' "gradient_clipping": {value}}}) clips the total gradient norm to {value} at every optimizer.step(). It'
        " clips by norm only."
    )
