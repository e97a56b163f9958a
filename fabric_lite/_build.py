"""Build the objects a :class:`~fabric_lite._plan.Plan` describes: accelerator, precision, strategy, launcher."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from typing import Any

import torch

from fabric_lite._hooks import as_list
from fabric_lite._plan import Machine, Plan, resolve_plan
from fabric_lite.accelerators import ACCELERATOR_REGISTRY, ACCELERATORS, Accelerator
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import (
    DoublePrecision,
    HalfPrecision,
    MixedPrecision,
    Precision,
    TransformerEnginePrecision,
)
from fabric_lite.strategies.registry import STRATEGY_REGISTRY
from fabric_lite.strategies.strategy import Strategy


def _precision(plan: Plan, plugins: Sequence[Any], kind: type[Strategy]) -> Precision:
    for plugin in plugins:
        if isinstance(plugin, Precision):
            return plugin
    name = plan.precision
    own = kind._named_precision(name)
    if own is not None:
        return own
    if name in ("16-mixed", "bf16-mixed"):
        return MixedPrecision(name, device=plan.accelerator)  # type: ignore[arg-type]
    if name in ("16-true", "bf16-true"):
        return HalfPrecision(name)  # type: ignore[arg-type]
    if name == "64-true":
        return DoublePrecision()
    if name in ("transformer-engine", "transformer-engine-float16"):
        dtype = torch.float16 if name == "transformer-engine-float16" else torch.bfloat16
        return TransformerEnginePrecision(weights_dtype=dtype)
    return Precision()


def _check_bitsandbytes(precision: Precision, plan: Plan, strategy: str | Strategy, kind: type[Strategy]) -> None:
    """Quantised layers run on the CPU and CUDA, and cannot be sharded (Lightning: CUDA only, FSDP refuses)."""
    module = sys.modules.get("fabric_lite.plugins.precision.bitsandbytes")  # not loaded: no such precision exists
    if module is None or not isinstance(precision, module.BitsandbytesPrecision):
        return
    if plan.accelerator not in ("cpu", "cuda"):
        raise RuntimeError(
            f"{precision!r} runs on the CPU and on CUDA GPUs, not on accelerator={plan.accelerator!r}:"
            " choose Fabric(accelerator='cpu') or Fabric(accelerator='cuda')."
        )
    if kind.shards_parameters:
        name = type(strategy).__name__ if isinstance(strategy, Strategy) else plan.strategy
        raise TypeError(
            f"{precision!r} cannot be used with the FSDP strategy, or any other that shards parameters ({name!r}):"
            " 8/4-bit quantised weights cannot be sharded. Use strategy='auto' (one device)."
        )


def _devices(plan: Plan) -> list[torch.device]:
    if plan.accelerator == "cpu":
        return [torch.device("cpu")] * len(plan.devices)
    return [torch.device(plan.accelerator, index) for index in plan.devices]


def build_strategy(
    plan: Plan, strategy: str | Strategy, accelerator: str | Accelerator, plugins: Sequence[Any]
) -> Strategy:
    """Create (or complete, for a user's instance) the strategy the plan describes, with its launcher."""
    if isinstance(accelerator, Accelerator):
        accelerator_obj = accelerator
    elif isinstance(accelerator, str) and accelerator in ACCELERATOR_REGISTRY:
        # a name the registry knows, a built-in's or a user's (the plan checked its kind): built from its entry
        accelerator_obj = ACCELERATOR_REGISTRY.get(accelerator)
    else:
        accelerator_obj = ACCELERATORS[plan.accelerator]()
    kind = type(strategy) if isinstance(strategy, Strategy) else STRATEGY_REGISTRY[plan.strategy].load()
    precision = _precision(plan, plugins, kind)
    _check_bitsandbytes(precision, plan, strategy, kind)
    devices = _devices(plan)
    if isinstance(strategy, Strategy):
        instance = strategy
        if instance.accelerator is None:
            instance.accelerator = accelerator_obj
        if instance._precision is None:
            instance.precision = precision
    else:
        init_kwargs = STRATEGY_REGISTRY[plan.strategy].init_kwargs
        instance = kind._create(devices, accelerator=accelerator_obj, precision=precision, **init_kwargs)
    for plugin in plugins:
        if isinstance(plugin, CheckpointIO):
            instance.checkpoint_io = plugin  # strategies that write their own checkpoints (FSDP) refuse it here
    instance._complete(
        devices, environment=plan.cluster_environment, num_nodes=plan.num_nodes, start_method=plan.start_method
    )
    return instance


def plan_and_build(
    accelerator: str | Accelerator,
    strategy: str | Strategy,
    devices: list[int] | str | int,
    num_nodes: int,
    precision: str | int | None,
    plugins: Any,
    machine: Machine,
) -> tuple[Plan, Strategy]:
    """``Fabric(...)``'s arguments planned (over ``os.environ`` and ``machine``) and built into the strategy; the
    plan's warnings are shown on global rank 0, pointing at the caller's line."""
    plugin_list = as_list(plugins)
    plan = resolve_plan(
        accelerator=accelerator,
        strategy=strategy,
        devices=devices,
        num_nodes=num_nodes,
        precision=precision,
        plugins=plugin_list,
        env=os.environ,
        machine=machine,
    )
    built = build_strategy(plan, strategy, accelerator, plugin_list)
    if built.global_rank == 0:
        for message in plan.warnings:
            warnings.warn(message, UserWarning, stacklevel=3)  # the caller of Fabric(...) or _Connector(...)
    return plan, built
