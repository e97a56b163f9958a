"""Every built-in strategy name in one visible table: the class it builds, with which keyword arguments, and how
its extra processes start (``popen``: the script is run again per extra local rank; ``spawn``/``fork``:
``launch(fn)`` starts them; ``None``: none, or an outside launcher does).

``STRATEGY_REGISTRY`` has Lightning Fabric's registry API and lists exactly Lightning's names; fabric_lite's own
names are *aliases*, resolved like entries but not listed, so a listing is the same under both libraries.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from fabric_lite.strategies.strategy import Strategy

StartMethod = Literal["popen", "spawn", "fork"]

#: what an entry holds under Lightning Fabric's keys
_KEYS = ("strategy", "strategy_name", "description", "init_params")


@dataclass(frozen=True)
class StrategyEntry(Mapping[str, Any]):
    """What a strategy name stands for; ``Fabric`` asks the class itself (:meth:`load`) everything else. It reads as
    Lightning's entry too (``entry["strategy"]``, ``["strategy_name"]``, ``["description"]``, ``["init_params"]``).

    Example::

        STRATEGY_REGISTRY["my_ddp"] = StrategyEntry("MyDDP", True, "popen", "DDP with my hooks", module="my.ddp")
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
    #: the name it is registered under (filled in by the registry)
    name: str = ""
    #: the class itself, for one registered as an object rather than by its module and name
    strategy_class: Callable[..., Any] | None = None

    def load(self) -> type[Strategy]:
        """The class the name builds, imported on first use."""
        if self.strategy_class is not None:
            return self.strategy_class  # type: ignore[return-value]
        cls: type[Strategy] = getattr(importlib.import_module(self.module), self.class_name)
        return cls

    def __getitem__(self, key: str) -> Any:
        if key == "strategy":
            return self.load()
        values = {"strategy_name": self.name, "description": self.description, "init_params": self.init_kwargs}
        if key not in values:
            raise KeyError(f"{key!r}: a strategy entry has {', '.join(map(repr, _KEYS))}")
        return values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(_KEYS)

    def __len__(self) -> int:
        return len(_KEYS)


def _start_method_of(strategy: Callable[..., Any], init_params: Mapping[str, Any]) -> StartMethod | None:
    """How a registered strategy starts its processes: its registered ``start_method``, else that parameter's default
    in the nearest class declaring one, else ``None``."""
    given = init_params.get("start_method")
    if isinstance(given, str):
        return given  # type: ignore[return-value]
    for owner in getattr(strategy, "__mro__", (strategy,)):
        init = owner.__dict__.get("__init__") if isinstance(owner, type) else owner
        if init is None:
            continue
        try:
            parameter = inspect.signature(init).parameters.get("start_method")
        except (TypeError, ValueError):  # a callable without a readable signature
            return None
        if parameter is not None:
            return parameter.default if isinstance(parameter.default, str) else None  # type: ignore[return-value]
    return None


class _StrategyRegistry(dict[str, StrategyEntry]):
    """Strategy names mapped to :class:`StrategyEntry` (Lightning's ``_StrategyRegistry``): :meth:`register` adds
    one (also as a decorator), :meth:`get` builds an instance.

    Example::

        STRATEGY_REGISTRY.register("my_ddp", MyDDPStrategy, description="DDP with my hooks", bucket_cap_mb=50)
    """

    def __init__(self, aliases: Mapping[str, StrategyEntry] | None = None) -> None:
        super().__init__()
        #: names that resolve like entries but are not listed; a registered name takes precedence over an alias
        self.aliases: Mapping[str, StrategyEntry] = MappingProxyType(
            {name: replace(entry, name=name) for name, entry in (aliases or {}).items()}
        )

    def __setitem__(self, name: str, entry: StrategyEntry) -> None:
        super().__setitem__(name, entry if entry.name == name else replace(entry, name=name))

    def __missing__(self, name: str) -> StrategyEntry:
        if isinstance(name, str) and name in self.aliases:
            return self.aliases[name]
        raise KeyError(name)

    def __contains__(self, name: object) -> bool:
        return super().__contains__(name) or (isinstance(name, str) and name in self.aliases)

    def register(
        self,
        name: str,
        strategy: Callable[..., Any] | None = None,
        description: str | None = None,
        override: bool = False,
        **init_params: Any,
    ) -> Callable[..., Any]:
        """Register ``strategy`` (a class, or any callable that builds one) under ``name``, to be built with
        ``init_params``; without ``strategy``, return a decorator that registers the class it decorates.

        Raises:
            TypeError: ``name`` is not a string.
            ValueError: ``name`` is taken and ``override`` is ``False``.
        """
        if not isinstance(name, str):
            raise TypeError(f"`name` must be a str, found {name!r}")
        if name in self and not override:
            raise ValueError(f"'{name}' is already present in the registry. HINT: Use `override=True`.")

        def do_register(strategy: Callable[..., Any]) -> Callable[..., Any]:
            self[name] = StrategyEntry(
                class_name=getattr(strategy, "__name__", type(strategy).__name__),
                parallel=bool(getattr(strategy, "is_parallel", False)),
                start_method=_start_method_of(strategy, init_params),
                description=description if description is not None else "",
                init_kwargs=init_params,
                multi_device=bool(getattr(strategy, "drives_several_devices", False)),
                module=getattr(strategy, "__module__", ""),
                strategy_class=strategy,
            )
            return strategy

        return do_register(strategy) if strategy is not None else do_register

    def get(self, name: str, default: Any | None = None) -> Any:
        """A new instance of the strategy registered under ``name``, built with its ``init_params``, else ``default``;
        ``KeyError``, listing the names, when there is neither."""
        if name in self:
            entry = self[name]
            return entry.load()(**entry.init_kwargs)
        if default is not None:
            return default
        raise KeyError(f"'{name}' not found in registry. Available names: {', '.join(sorted(self)) or 'none'}")

    def remove(self, name: str) -> None:
        """Unregister ``name``; ``KeyError`` if it is not registered."""
        self.pop(name)

    def available_strategies(self) -> list[str]:
        """The registered names, in registration order (the aliases aside)."""
        return list(self)

    def __str__(self) -> str:
        return "Registered Strategies: {}".format(", ".join(self))


def _launched(class_name: str, start_method: StartMethod, description: str, **init_kwargs: Any) -> StrategyEntry:
    """One process per device, started by ``start_method``, which the class is given too (``start_method=``)."""
    return StrategyEntry(class_name, True, start_method, description, {"start_method": start_method, **init_kwargs})


def _find_unused(base: str, start_method: StartMethod, value: bool) -> StrategyEntry:
    """The DDP name ``base`` with ``find_unused_parameters=value`` (Lightning's spellings of that argument)."""
    default = "" if value else " (the default)"
    description = f"{base} with find_unused_parameters={value}{default}"
    return _launched("DDPStrategy", start_method, description, find_unused_parameters=value)


def _xla(class_name: str, parallel: bool, module: str) -> StrategyEntry:
    """A Lightning Fabric XLA (TPU) name: listed as in Lightning, an error that names torch_xla when chosen."""
    return StrategyEntry(
        class_name,
        parallel,
        None,
        "XLA/TPU (Lightning Fabric's; fabric_lite does not run on XLA)",
        module=f"fabric_lite.strategies.{module}",
    )


def _deepspeed(description: str, **init_kwargs: Any) -> StrategyEntry:
    """A ``DeepSpeedStrategy`` name: one process per device, the script re-run once per extra local rank."""
    return StrategyEntry("DeepSpeedStrategy", True, "popen", description, init_kwargs)


#: Lightning Fabric's names: what ``STRATEGY_REGISTRY`` lists
_BUILT_IN: dict[str, StrategyEntry] = {
    "ddp": _launched("DDPStrategy", "popen", "DistributedDataParallel; the script is re-run once per extra local rank"),
    "ddp_spawn": _launched("DDPStrategy", "spawn", "DistributedDataParallel; launch(fn) spawns one process per device"),
    "ddp_fork": _launched("DDPStrategy", "fork", "DistributedDataParallel; launch(fn) forks one process per device"),
    "ddp_notebook": _launched("DDPStrategy", "fork", "alias of ddp_fork, for notebooks"),
    "ddp_find_unused_parameters_true": _find_unused("ddp", "popen", True),
    "dp": StrategyEntry(
        "DataParallelStrategy",
        False,
        None,
        "torch.nn.DataParallel: one process, the module replicated on every selected CUDA device"
        " (on a machine without CUDA, Fabric warns and runs 'ddp', as Lightning Fabric does)",
        multi_device=True,
    ),
    "fsdp": _launched(
        "FSDPStrategy",
        "popen",
        "fully sharded data parallel on torch's fully_shard (FSDP2); the script is re-run once per extra local rank",
    ),
    "fsdp_cpu_offload": _launched(
        "FSDPStrategy",
        "popen",
        "fsdp with the sharded parameters, gradients and optimizer step kept on the CPU",
        cpu_offload=True,
    ),
    "deepspeed": _deepspeed(
        "DeepSpeed (optional dependency), ZeRO stage 2; the script is re-run once per extra local rank"
    ),
    "deepspeed_stage_1": _deepspeed("DeepSpeed with ZeRO stage 1 (optimizer state sharded)", stage=1),
    "deepspeed_stage_1_offload": _deepspeed(
        "DeepSpeed with ZeRO stage 1 and the optimizer offloaded to the CPU", stage=1, offload_optimizer=True
    ),
    "deepspeed_stage_2": _deepspeed("DeepSpeed with ZeRO stage 2 (optimizer state and gradients sharded)", stage=2),
    "deepspeed_stage_2_offload": _deepspeed(
        "DeepSpeed with ZeRO stage 2 and the optimizer offloaded to the CPU", stage=2, offload_optimizer=True
    ),
    "deepspeed_stage_3": _deepspeed(
        "DeepSpeed with ZeRO stage 3 (optimizer state, gradients and parameters sharded)", stage=3
    ),
    "deepspeed_stage_3_offload": _deepspeed(
        "DeepSpeed with ZeRO stage 3, the optimizer and the parameters offloaded to the CPU",
        stage=3,
        offload_optimizer=True,
        offload_parameters=True,
    ),
    "deepspeed_stage_3_offload_nvme": _deepspeed(
        "DeepSpeed with ZeRO stage 3, the optimizer and the parameters offloaded to NVMe (nvme_path)",
        stage=3,
        offload_optimizer=True,
        offload_parameters=True,
        remote_device="nvme",
        offload_params_device="nvme",
        offload_optimizer_device="nvme",
    ),
    "xla": _xla("XLAStrategy", True, "xla"),
    "xla_fsdp": _xla("XLAFSDPStrategy", True, "xla_fsdp"),
    "single_xla": _xla("SingleDeviceXLAStrategy", False, "single_xla"),
    "single_tpu": _xla("SingleDeviceXLAStrategy", False, "single_xla"),
}

#: fabric_lite's own names: ``STRATEGY_REGISTRY``'s aliases, built like its entries but not listed
_FABRIC_LITE_NAMES: dict[str, StrategyEntry] = {
    "single_device": StrategyEntry("SingleDeviceStrategy", False, None, "one process on one device"),
    # Lightning's other spellings of find_unused_parameters, one per start method
    "ddp_find_unused_parameters_false": _find_unused("ddp", "popen", False),
    "ddp_spawn_find_unused_parameters_true": _find_unused("ddp_spawn", "spawn", True),
    "ddp_spawn_find_unused_parameters_false": _find_unused("ddp_spawn", "spawn", False),
    "ddp_fork_find_unused_parameters_true": _find_unused("ddp_fork", "fork", True),
    "ddp_fork_find_unused_parameters_false": _find_unused("ddp_fork", "fork", False),
    "ddp_notebook_find_unused_parameters_true": _find_unused("ddp_notebook", "fork", True),
    "ddp_notebook_find_unused_parameters_false": _find_unused("ddp_notebook", "fork", False),
    "horovod": StrategyEntry(
        "HorovodStrategy",
        True,
        None,
        "Horovod (optional dependency): horovodrun starts one process per device, fabric_lite starts none",
    ),
}

STRATEGY_REGISTRY = _StrategyRegistry(aliases=_FABRIC_LITE_NAMES)
for _name, _entry in _BUILT_IN.items():
    STRATEGY_REGISTRY[_name] = _entry
