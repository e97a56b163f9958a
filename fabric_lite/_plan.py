"""Decide how to run: ``Fabric(...)``'s arguments plus the environment and the machine, turned into a plan.

:func:`resolve_plan` is a pure function: it reads its arguments, an environment mapping and a :class:`Machine`
snapshot, and returns a :class:`Plan` or raises. It starts nothing, sets nothing, and never reads ``os.environ``
itself, so its tests are tables. Building objects from the plan is a separate step (:mod:`fabric_lite._build`).

Every bad value is rejected here, in the constructor, before any process starts or waits on another.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from fabric_lite.accelerators import (
    ACCELERATOR_REGISTRY,
    ACCELERATORS,
    Accelerator,
    CPUAccelerator,
    CUDAAccelerator,
    MPSAccelerator,
    XLAAccelerator,
)
from fabric_lite.accelerators import xla as _xla
from fabric_lite.accelerators.accelerator import accelerator_name
from fabric_lite.accelerators.cpu import _parse_cpu_cores
from fabric_lite.accelerators.xla import _xla_missing
from fabric_lite.plugins.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LightningEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
)
from fabric_lite.plugins.environments.horovod import HorovodEnvironment
from fabric_lite.plugins.environments.slurm import _note_not_started_by_srun
from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.precision import Precision
from fabric_lite.strategies.registry import STRATEGY_REGISTRY, StartMethod
from fabric_lite.strategies.strategy import Strategy
from fabric_lite.utilities._device_ids import parse_device_ids

AcceleratorName = Literal["cpu", "cuda", "mps"]
_ACCELERATOR_CHOICES = ("auto", "cpu", "cuda", "gpu", "mps")

#: canonical precision names
PRECISIONS = ("32-true", "64-true", "16-mixed", "bf16-mixed", "16-true", "bf16-true")
_LEGACY_PRECISIONS: dict[Any, str] = {
    32: "32-true",
    "32": "32-true",
    64: "64-true",
    "64": "64-true",
    16: "16-mixed",
    "16": "16-mixed",
    "bf16": "bf16-mixed",
}


@dataclass(frozen=True)
class Machine:
    """What the plan needs to know about the machine and the running program."""

    cuda_devices: int = 0
    mps_available: bool = False
    #: True in a notebook or REPL, where the script cannot be re-run
    interactive: bool = False
    #: whether processes can be forked here (not on Windows)
    can_fork: bool = True

    @classmethod
    def detect(cls) -> Machine:
        """Read the snapshot off this machine (without initialising CUDA), through the functions Lightning Fabric
        reads it with (``CUDAAccelerator.is_available``, ``accelerators.cuda.num_cuda_devices``,
        ``MPSAccelerator.is_available``, ``torch.multiprocessing.get_all_start_methods``)."""
        main = sys.modules.get("__main__")
        return cls(
            cuda_devices=CUDAAccelerator.auto_device_count() if CUDAAccelerator.is_available() else 0,
            mps_available=MPSAccelerator.is_available(),
            interactive=main is None or not hasattr(main, "__file__"),
            can_fork="fork" in torch.multiprocessing.get_all_start_methods(),
        )


@dataclass(frozen=True)
class Plan:
    """How a ``Fabric`` runs. Built by :func:`resolve_plan`; every field is already validated."""

    accelerator: AcceleratorName
    #: registry name of the strategy, or ``"instance"`` when the user passed a ``Strategy`` object
    strategy: str
    #: whether the strategy runs one process per device
    parallel: bool
    #: device indices on this node (for the CPU, ``0..n-1`` stand for ``n`` processes)
    devices: tuple[int, ...]
    num_nodes: int
    #: how fabric_lite starts the other processes; ``None`` when it starts none (one process, or an external
    #: launcher such as torchrun or SLURM started them all)
    start_method: StartMethod | None
    cluster_environment: ClusterEnvironment
    precision: str
    #: the default process-group backend for the accelerator
    backend: str
    #: messages for the caller to emit as warnings
    warnings: tuple[str, ...] = ()

    @property
    def num_processes(self) -> int:
        """Processes per node."""
        return len(self.devices) if self.parallel else 1

    @property
    def world_size(self) -> int:
        return self.num_processes * self.num_nodes


#: the built-in accelerators, in the order a subclass is matched to its device kind
_KINDS: tuple[tuple[AcceleratorName, type[Accelerator]], ...] = (
    ("cuda", CUDAAccelerator),
    ("mps", MPSAccelerator),
    ("cpu", CPUAccelerator),
)


def _invalid_accelerator(accelerator: Any) -> ValueError:
    registered = sorted(set(ACCELERATOR_REGISTRY.available_accelerators()) - set(_ACCELERATOR_CHOICES))
    also = f", a name registered in ACCELERATOR_REGISTRY ({', '.join(map(repr, registered))})" if registered else ""
    return ValueError(
        f"You selected an invalid accelerator name: `accelerator={accelerator!r}`."
        f" Choose one of {', '.join(repr(c) for c in _ACCELERATOR_CHOICES)}{also}, or pass an Accelerator instance."
    )


def _accelerator_class(accelerator: Any) -> type[Accelerator]:
    """The class an accelerator argument stands for: an instance's, a registered name's, a built-in name's."""
    if isinstance(accelerator, Accelerator):
        return type(accelerator)
    if isinstance(accelerator, str) and accelerator in ACCELERATOR_REGISTRY:
        cls = ACCELERATOR_REGISTRY[accelerator]["accelerator"]
        if not (isinstance(cls, type) and issubclass(cls, Accelerator)):
            raise ValueError(
                f"Fabric(accelerator={accelerator!r}): ACCELERATOR_REGISTRY has {cls!r} under that name, which is no"
                " Accelerator class. Register a subclass of fabric_lite.accelerators.Accelerator."
            )
        return cls
    if isinstance(accelerator, str) and accelerator.lower() in ACCELERATORS:
        return ACCELERATORS[accelerator.lower()]
    raise _invalid_accelerator(accelerator)


def _kind_of(cls: type[Accelerator]) -> AcceleratorName | None:
    """The built-in device kind ``cls`` derives from; ``None`` for an accelerator of its own kind."""
    return next((kind for kind, base in _KINDS if issubclass(cls, base)), None)


def _label(accelerator: Any) -> str:
    """How the user named the accelerator, for messages."""
    return repr(accelerator_name(accelerator)) if isinstance(accelerator, Accelerator) else repr(accelerator)


def _available(machine: Machine) -> list[str]:
    return [name for name, ok in (("cuda", machine.cuda_devices > 0), ("mps", machine.mps_available)) if ok] + ["cpu"]


def _not_available(accelerator: Any, cls: type[Accelerator], detail: str, machine: Machine) -> RuntimeError:
    return RuntimeError(
        f"Fabric(accelerator={_label(accelerator)}): `{cls.__qualname__}` can not run on your system since the"
        f" accelerator is not available ({detail}). Available accelerators: {_available(machine)}."
        " Use accelerator='cpu' or 'auto'."
    )


def _resolve_accelerator(accelerator: Any, machine: Machine) -> tuple[AcceleratorName, type[Accelerator] | None]:
    """The device kind to run on, and the accelerator class when it is of a kind of its own (a custom accelerator
    whose devices its own ``get_parallel_devices`` names); ``None`` for the built-in kinds."""
    name = accelerator.lower() if isinstance(accelerator, str) else None
    available = _available(machine)  # CUDA before MPS, as Lightning's "gpu" prefers
    if name == "auto":
        return ("mps" if machine.mps_available else available[0]), None  # type: ignore[return-value]
    if name == "gpu":
        if available[0] != "cpu":
            return available[0], None  # type: ignore[return-value]
        raise RuntimeError(
            "No supported gpu backend found! accelerator='gpu' needs a CUDA or an MPS device, but this machine has"
            f" neither. Available accelerators: {available}. Use accelerator='cpu' or 'auto'."
        )
    cls = _accelerator_class(accelerator)
    if issubclass(cls, XLAAccelerator) and not _xla._XLA_AVAILABLE:
        _xla_missing(f"Fabric(accelerator={_label(accelerator)})")
    kind = _kind_of(cls)
    if kind == "cuda" and machine.cuda_devices == 0:
        raise _not_available(accelerator, cls, "torch sees no CUDA device on this machine", machine)
    if kind == "mps" and not machine.mps_available:
        raise _not_available(accelerator, cls, "MPS is not available on this machine", machine)
    if kind is None and not cls.is_available():
        raise _not_available(accelerator, cls, f"{cls.__qualname__}.is_available() is False", machine)
    if kind is None and issubclass(cls, XLAAccelerator):
        _xla_missing(f"Fabric(accelerator={_label(accelerator)})")
    return kind or "cpu", None if kind else cls


def _own_kind_devices(cls: type[Accelerator], devices: Any, label: str) -> tuple[AcceleratorName, tuple[int, ...]]:
    """The device kind and indices a custom accelerator's own ``parse_devices``/``get_parallel_devices`` select."""
    refused = ValueError(
        f"Fabric(accelerator={label}): {cls.__qualname__!r} does not say which CPU, CUDA or MPS devices it runs on,"
        " and fabric_lite can run on no other kind. A registered accelerator must subclass CPUAccelerator,"
        " CUDAAccelerator or MPSAccelerator (and may override their methods), or define parse_devices() and"
        " get_parallel_devices() returning torch.device('cpu'/'cuda'/'mps', ...) devices."
    )
    try:
        wanted = cls.auto_device_count() if devices == "auto" else devices
        parallel = [torch.device(d) for d in cls.get_parallel_devices(cls.parse_devices(wanted))]
    except (NotImplementedError, RuntimeError, TypeError) as error:
        raise refused from error
    kinds = {d.type for d in parallel}
    if not parallel or len(kinds) != 1 or not kinds <= {"cpu", "cuda", "mps"}:
        raise refused
    kind: AcceleratorName = kinds.pop()  # type: ignore[assignment]
    indices = tuple(range(len(parallel))) if kind == "cpu" else tuple(d.index or 0 for d in parallel)
    return kind, indices


def _parse_num_nodes(num_nodes: Any) -> int:
    if isinstance(num_nodes, str) and _is_ascii_int(num_nodes):
        num_nodes = int(num_nodes)  # Lightning accepts strings (e.g. straight from argparse)
    if type(num_nodes) is not int:
        raise TypeError(f"`num_nodes` must be a positive integer, but got {num_nodes!r}. Example: num_nodes=2.")
    if num_nodes < 1:
        raise ValueError(f"`num_nodes` must be a positive integer, but got {num_nodes}. Example: num_nodes=1.")
    return num_nodes


def _is_ascii_int(text: str) -> bool:
    stripped = text.strip()
    return stripped.isascii() and stripped.isdigit()


def _canonical_precision(precision: Any) -> tuple[str, list[str]]:
    if precision is None:
        return "32-true", []
    if isinstance(precision, str) and precision in PRECISIONS:
        return precision, []
    if type(precision) in (int, str) and precision in _LEGACY_PRECISIONS:
        canonical = _LEGACY_PRECISIONS[precision]
        warnings = []
        if canonical.endswith("mixed"):
            warnings.append(
                f"`precision={precision}` is supported for historical reasons but its usage is discouraged."
                f" Please set your precision to {canonical} instead! (Fabric(precision={precision!r}) means"
                f" {canonical!r}: write precision={canonical!r}.)"
            )
        return canonical, warnings
    allowed = list(PRECISIONS) + [repr(k) for k in _LEGACY_PRECISIONS]
    raise ValueError(f"Precision {precision!r} is invalid. Allowed precision values: {', '.join(allowed)}.")


def _selects_nothing(devices: Any) -> bool:
    """``0``, ``"0"`` or an empty list: a value that selects no device with any accelerator."""
    if isinstance(devices, (list, tuple)):
        return len(devices) == 0
    return (type(devices) is int and devices == 0) or (isinstance(devices, str) and devices.strip() == "0")


def _cpu_devices(devices: Any) -> int:
    """``devices`` for the CPU: a number of processes. Error classes follow Lightning Fabric."""
    if devices == "auto":
        return 1
    try:
        return _parse_cpu_cores(devices)
    except TypeError as error:
        hint = ""
        if isinstance(devices, (list, tuple)) or (isinstance(devices, str) and "," in devices):
            hint = " A list of indices selects GPUs; on the CPU, give a count."
        elif devices == -1 or devices == "-1":
            hint = " devices=-1 means 'every GPU'; on the CPU, give the number of processes you want."
        raise TypeError(
            f"Fabric(devices={devices!r}) is not valid with the CPU accelerator: {error} Use an int > 0 or"
            f" 'auto'.{hint} Example: devices=2."
        ) from None


def _gpu_indices(devices: Any, accelerator: str, available: int) -> tuple[int, ...]:
    """``devices`` for CUDA/MPS: an int count, -1, a list of indices, a string such as ``"0,1"``, or ``"auto"``."""
    value = -1 if isinstance(devices, str) and devices.strip() == "auto" else devices
    try:
        indices = parse_device_ids(value, range(available))
    except (TypeError, ValueError) as error:
        raise type(error)(f"Fabric(devices={devices!r}) for accelerator={accelerator!r}: {error}") from None
    if not indices:
        raise ValueError(
            f"Fabric(devices={devices!r}) selects no device for accelerator={accelerator!r}."
            " Example: devices=1, or accelerator='cpu'."
        )
    return tuple(indices)


def _detect_environment(env: Mapping[str, str], plugins: Sequence[Any]) -> ClusterEnvironment:
    for plugin in plugins:
        if isinstance(plugin, ClusterEnvironment):
            return plugin
    # Lightning Fabric's order. torchrun first: a torchrun inside a SLURM allocation started these processes, not
    # srun. MPI last: its check imports mpi4py (which initialises MPI), and only when a launcher's variable is set.
    # Kubeflow is never detected (its variables are torchrun's and anyone's): it is passed as a plugin.
    if TorchElasticEnvironment.detect(env):
        return TorchElasticEnvironment(env)
    if SLURMEnvironment.detect(env):
        return SLURMEnvironment(env=env)
    if LSFEnvironment.detect(env):
        return LSFEnvironment(env)
    if MPIEnvironment.detect(env):
        return MPIEnvironment(env)
    return LightningEnvironment(env)


def _external_local_count(environment: ClusterEnvironment) -> int | None:
    """How many processes the external launcher started on this node, where it says."""
    if isinstance(environment, (TorchElasticEnvironment, HorovodEnvironment, MPIEnvironment)):
        return environment.local_world_size()
    if isinstance(environment, SLURMEnvironment):
        per_node = environment.tasks_per_node()
        if per_node is None and environment.num_nodes() is None:
            return environment.world_size()
        return per_node
    if isinstance(environment, KubeflowEnvironment):
        return 1  # one process per pod
    return None  # LSF: jsrun does not say how many tasks it started on this node


def _strategy_choice(strategy: Any) -> str:
    if isinstance(strategy, Strategy):
        return "instance"
    if isinstance(strategy, str) and (strategy.lower() == "auto" or strategy.lower() in STRATEGY_REGISTRY):
        return strategy.lower()  # Lightning's names are case-insensitive
    choices = ", ".join(repr(n) for n in ("auto", *STRATEGY_REGISTRY))
    raise ValueError(
        f"You selected an invalid strategy name: `strategy={strategy!r}`. Choose one of {choices},"
        " or pass a fabric_lite.strategies.Strategy instance."
    )


#: how ``fabric-lite run`` hands its flags to ``Fabric(...)`` in the script: argument name -> environment variable
CLI_ENV_VARS = {
    "accelerator": "FABRIC_LITE_ACCELERATOR",
    "strategy": "FABRIC_LITE_STRATEGY",
    "devices": "FABRIC_LITE_DEVICES",
    "num_nodes": "FABRIC_LITE_NUM_NODES",
    "precision": "FABRIC_LITE_PRECISION",
}
#: the variables Lightning Fabric's ``fabric run`` sets for the same purpose, and its mark that it ran
LIGHTNING_CLI_ENV_VARS = {name: "LT_" + name.upper() for name in CLI_ENV_VARS}
LIGHTNING_CLI_USED = "LT_CLI_USED"


def _same_setting(name: str, given: Any, from_cli: str) -> bool:
    """Whether ``Fabric(name=given)`` says the same as the CLI's ``from_cli`` (spellings differ: 2 and "2")."""
    cli = from_cli.strip()
    if name == "accelerator":
        label = accelerator_name(given) if isinstance(given, Accelerator) else str(given).lower()
        return label == cli.lower() or (cli.lower() == "gpu" and label in ("cuda", "mps"))
    if name == "strategy":
        return isinstance(given, str) and given.lower() == cli.lower()
    if name == "devices":
        if isinstance(given, (list, tuple)):
            given = ",".join(str(v) for v in given)
        return str(given).replace(" ", "") == cli.replace(" ", "")
    if name == "precision":
        try:
            return _canonical_precision(given)[0] == _canonical_precision(cli)[0]
        except ValueError:
            return str(given) == cli
    return str(given).strip() == cli


def _is_default(name: str, given: Any) -> bool:
    if name == "precision":
        return given is None or (isinstance(given, (str, int)) and given in ("32-true", "32", 32))
    if name == "num_nodes":
        return type(given) is int and given == 1
    return isinstance(given, str) and given == "auto"


def _with_cli_settings(env: Mapping[str, str], **given: Any) -> dict[str, Any]:
    """``Fabric(...)``'s arguments with the values a command-line launcher put in ``env`` filled in.

    ``fabric-lite run``'s values (:data:`CLI_ENV_VARS`) replace arguments left at their default; an argument given
    in the script that disagrees with one is an error naming both, because silently preferring either would run a
    different job than one of them says. Lightning Fabric's ``fabric run`` variables (:data:`LIGHTNING_CLI_ENV_VARS`)
    are read as Lightning reads them: they replace the argument, and a disagreement is an error when
    ``LT_CLI_USED`` says that command set them.
    """
    settings = dict(given)
    lightning_cli = env.get(LIGHTNING_CLI_USED, "0").strip() not in ("", "0")
    for name in CLI_ENV_VARS:
        current = given[name]
        shown = f"{type(current).__name__}(...)" if isinstance(current, (Strategy, Accelerator)) else repr(current)
        from_cli = env.get(CLI_ENV_VARS[name])
        if from_cli is not None:
            if _is_default(name, current):
                settings[name] = from_cli
            elif not _same_setting(name, current, from_cli):
                raise ValueError(
                    f"Fabric({name}={shown}) in the script conflicts with `fabric-lite run"
                    f" --{name.replace('_', '-')} {from_cli}` ({CLI_ENV_VARS[name]}={from_cli!r} in the environment)."
                    f" Give the value in one place only: remove {name}= from Fabric(...), or change the command-line"
                    " flag to agree with it."
                )
        from_lightning = env.get(LIGHTNING_CLI_ENV_VARS[name])
        if from_lightning is not None:
            if lightning_cli and not _is_default(name, current) and not _same_setting(name, current, from_lightning):
                raise ValueError(
                    f"Your code has `Fabric({name}={shown}, ...)` but it conflicts with the value"
                    f" `--{name}={from_lightning}` set through the CLI ({LIGHTNING_CLI_ENV_VARS[name]}="
                    f"{from_lightning!r} in the environment). Give the value in one place only: remove {name}= from"
                    " Fabric(...), or change the command-line flag to agree with it."
                )
            settings[name] = from_lightning
    return settings


def _check_plugins(plugins: Sequence[Any]) -> None:
    """At most one plugin of each kind, and nothing else (Lightning's messages)."""
    kinds: dict[str, list[str]] = {}
    for plugin in plugins:
        kind = next(
            (cls.__name__ for cls in (Precision, CheckpointIO, ClusterEnvironment) if isinstance(plugin, cls)), ""
        )
        if not kind:
            raise TypeError(
                f"Fabric(plugins=...) got {plugin!r} of type {type(plugin).__name__}. Accepted plugins are"
                " fabric_lite.plugins.Precision, fabric_lite.plugins.environments.ClusterEnvironment and"
                " fabric_lite.plugins.io.CheckpointIO instances."
            )
        kinds.setdefault(kind, []).append(type(plugin).__name__)
    repeated = {kind: names for kind, names in kinds.items() if len(names) > 1}
    if repeated:
        given = "; ".join(f"{kind}: {', '.join(names)}" for kind, names in repeated.items())
        raise ValueError(
            f"Received multiple values for {', '.join(repeated)} flags in `plugins` ({given}). Expected one value for"
            " each type at most: pass at most one plugin of each kind."
        )


def _from_strategy_instance(strategy: Any, accelerator: Any, devices: Any, plugins: Sequence[Any]) -> tuple[Any, Any]:
    """The accelerator and devices a strategy instance brings (its ``accelerator=``, ``parallel_devices=``), checked
    against the arguments and plugins that would set the same thing; ``(accelerator, devices)`` to plan with."""
    if not isinstance(strategy, Strategy):
        return accelerator, devices
    name = type(strategy).__name__
    owned = (
        ("precision", strategy._precision, Precision),
        ("checkpoint IO", strategy._checkpoint_io, CheckpointIO),
        ("cluster environment", getattr(strategy, "_cluster_environment", None), ClusterEnvironment),
    )
    for what, own, cls in owned:
        plugin = next((p for p in plugins if isinstance(p, cls)), None)
        if own is not None and plugin is not None:
            raise ValueError(
                f"Fabric(plugins=[{type(plugin).__name__}(...)]) and {name}(...) with its own"
                f" {type(own).__name__}(...) both set the {what}: choose one."
            )
    if strategy._accelerator is not None:
        if not (isinstance(accelerator, str) and accelerator.lower() == "auto"):
            raise ValueError(
                f"accelerator set through both {name}(accelerator={type(strategy._accelerator).__name__}()) and"
                f" Fabric(accelerator={_label(accelerator)}), choose one."
            )
        accelerator = strategy._accelerator
    parallel_devices = getattr(strategy, "parallel_devices", None)
    if parallel_devices:
        kind = parallel_devices[0].type
        agrees = {"cpu": ("auto", "cpu"), "cuda": ("auto", "cuda", "gpu"), "mps": ("auto", "mps", "gpu")}.get(kind, ())
        label = accelerator_name(accelerator) if isinstance(accelerator, Accelerator) else str(accelerator).lower()
        if label not in agrees:
            raise ValueError(
                f"{kind.upper()} parallel_devices set through {name} class, but accelerator set to {label}, please"
                f" choose one device type: Fabric(accelerator={kind!r}) or parallel_devices on {label} devices."
            )
        accelerator = kind if label in ("auto", "gpu") else accelerator
        if devices == "auto":
            devices = len(parallel_devices) if kind == "cpu" else [d.index or 0 for d in parallel_devices]
    return accelerator, devices


def resolve_plan(
    *,
    accelerator: str | Accelerator = "auto",
    strategy: str | Strategy = "auto",
    devices: list[int] | str | int = "auto",
    num_nodes: int = 1,
    precision: str | int | None = "32-true",
    plugins: Sequence[Any] = (),
    env: Mapping[str, str],
    machine: Machine,
) -> Plan:
    """Validate ``Fabric(...)``'s arguments against the environment and the machine and decide how to run.

    The flags of ``fabric-lite run`` arrive through ``env`` (:data:`CLI_ENV_VARS`): each fills an argument left at
    its default, and one that disagrees with an argument given in the script is an error naming both (Lightning
    Fabric's ``fabric run`` variables too, :data:`LIGHTNING_CLI_ENV_VARS`). A strategy instance's own accelerator,
    devices, precision, checkpoint IO and cluster environment count as if given to ``Fabric``; given twice, they are
    an error.

    Raises:
        ValueError, TypeError: a value that is not accepted, with the value, the choices and a fix.
        RuntimeError: an accelerator this machine does not have, or a strategy that cannot start its processes
            in an interactive session.
        MisconfigurationException: devices that do not exist on this machine.
    """
    warnings: list[str] = []
    cli = _with_cli_settings(
        env, accelerator=accelerator, strategy=strategy, devices=devices, num_nodes=num_nodes, precision=precision
    )
    accelerator, strategy, devices, precision = cli["accelerator"], cli["strategy"], cli["devices"], cli["precision"]
    num_nodes = _parse_num_nodes(cli["num_nodes"])
    strategy_name = _strategy_choice(strategy)
    precision_name, precision_warnings = _canonical_precision(precision)
    warnings += precision_warnings
    _check_plugins(plugins)
    if _selects_nothing(devices):
        shown = accelerator_name(accelerator) if isinstance(accelerator, Accelerator) else accelerator
        need = " (with the CPU accelerator, at least one process is needed)" if str(shown).lower() == "cpu" else ""
        raise ValueError(
            f"`Fabric(devices={devices!r})` value is not a valid input using {shown} accelerator: it selects no"
            f" device{need}. Example: devices=1."
        )
    accelerator, devices = _from_strategy_instance(strategy, accelerator, devices, plugins)
    precision_plugins = [p for p in plugins if isinstance(p, Precision)]
    if isinstance(strategy, Strategy) and strategy._precision is not None:
        precision_plugins.append(strategy._precision)
    environment_plugins = [p for p in plugins if isinstance(p, ClusterEnvironment)]
    if precision_plugins:
        plugin = precision_plugins[0]
        if precision_name not in ("32-true", plugin.precision):
            raise ValueError(
                f"Received both `precision={precision_name}` and `plugins={plugin!r}`: Fabric(precision={precision!r})"
                f" conflicts with the precision plugin {type(plugin).__name__} (precision={plugin.precision!r}) in"
                " plugins. Pass only one of them."
            )
        precision_name = plugin.precision

    device_kind, own_kind = _resolve_accelerator(accelerator, machine)
    if strategy_name == "dp" and device_kind == "cpu":
        # DataParallel needs CUDA devices; Lightning Fabric runs the same devices as processes instead, and so do we
        warnings.append(
            "strategy='dp' is not supported on CPUs, hence setting `strategy='ddp'` (as Lightning Fabric does)."
            " DataParallel replicates the module on CUDA devices; on the CPU, devices= is a number of processes."
        )
        strategy_name = "ddp"
    if strategy_name == "dp" and device_kind == "mps":
        raise ValueError(
            "strategy='dp' replicates the module on CUDA devices (torch.nn.DataParallel), but accelerator='mps' was"
            " selected. Use strategy='auto' on MPS, or accelerator='cuda' on a machine with GPUs."
        )
    # what the strategy says about itself: the class a name stands for, or the user's instance ("auto" is decided
    # below, once the devices are known)
    kind: Strategy | type[Strategy] | None = strategy if isinstance(strategy, Strategy) else None
    if kind is None and strategy_name != "auto":
        kind = STRATEGY_REGISTRY[strategy_name].load()
    own = kind.own_environment if kind is not None else None
    # the launcher of such a strategy (horovodrun for Horovod), not fabric_lite, torchrun or SLURM, started the
    # processes: its variables count
    environment = own(env=env) if own is not None and not environment_plugins else _detect_environment(env, plugins)
    external = environment.creates_processes_externally

    local = _external_local_count(environment) if external else None
    if devices == "auto" and local is not None:
        devices = local
    if own_kind is not None:
        device_kind, device_indices = _own_kind_devices(own_kind, devices, _label(accelerator))
    elif device_kind == "cpu":
        device_indices = tuple(range(_cpu_devices(devices)))
    else:
        if isinstance(devices, bool):
            raise TypeError(f"Fabric(devices={devices!r}) is not valid: use an int, a list of indices, or 'auto'.")
        if external and device_kind == "cuda" and machine.cuda_devices == 1:
            # the launcher gave every process one GPU of its own (CUDA_VISIBLE_DEVICES per rank): it is index 0
            # in every process, and `devices` only says how many processes there are per node
            every = devices in (-1, "-1")
            wanted = _gpu_indices(devices, device_kind, (local or 1) if every else 1 << 16)
            device_indices = (0,) * len(wanted)
        else:
            if devices == "auto" and device_kind == "cuda" and machine.interactive and machine.cuda_devices > 1:
                devices = 1
                warnings.append(
                    f"Fabric will use only 1 of {machine.cuda_devices} GPUs because it is running inside an"
                    f" interactive / notebook environment. Pass devices={machine.cuda_devices} (with"
                    " strategy='ddp_notebook') to use them all; several GPUs in a notebook is experimental."
                )
            available = machine.cuda_devices if device_kind == "cuda" else 1
            device_indices = _gpu_indices(devices, device_kind, available)

    if strategy_name == "auto":
        many = len(device_indices) > 1 or num_nodes > 1
        strategy_name = ("ddp_fork" if machine.interactive and not external else "ddp") if many else "single_device"
    label = type(strategy).__name__ if strategy_name == "instance" else strategy_name

    start_method: Any
    if isinstance(strategy, Strategy):
        kind, parallel = strategy, bool(strategy.is_parallel)
        start_method = strategy.start_method if parallel else None
    else:
        entry = STRATEGY_REGISTRY[strategy_name]
        kind = entry.load()
        parallel, start_method = kind.is_parallel, entry.start_method
    multi_device = kind.drives_several_devices and device_kind != "cpu"

    if multi_device and num_nodes > 1:
        raise ValueError(
            f"strategy={label!r} runs one process on one machine, but"
            f" num_nodes={num_nodes}. Use strategy='ddp' to train on several nodes."
        )
    if not parallel and not multi_device and (len(device_indices) > 1 or num_nodes > 1):
        raise ValueError(
            f"strategy={label!r} runs one process on one device, but devices={devices!r} and num_nodes={num_nodes}"
            f" ask for"
            f" {len(device_indices) * num_nodes}. Use strategy='ddp' (or 'auto'), or devices=1."
        )
    if external:
        environment.validate_settings(num_devices=len(device_indices), num_nodes=num_nodes)
        start_method = None
        if parallel and isinstance(environment, LightningEnvironment) and not environment_plugins:
            missing = [name for name in ("WORLD_SIZE", "MASTER_PORT") if name not in env]
            if missing:
                raise ValueError(
                    f"LOCAL_RANK={env.get('LOCAL_RANK')!r} is set, so this process expects to have been started by a"
                    f" launcher, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. Unset"
                    " LOCAL_RANK to let fabric_lite start the processes, or use a launcher such as torchrun."
                )
    elif parallel:
        environment.validate_settings(num_devices=len(device_indices), num_nodes=num_nodes)
        if num_nodes > 1 and isinstance(environment, LightningEnvironment):
            missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if name not in env]
            if missing:
                raise ValueError(
                    f"Fabric(num_nodes={num_nodes}) without torchrun or SLURM needs {' and '.join(missing)}: start the"
                    " script on every node with the same MASTER_ADDR (the first node's address) and MASTER_PORT, and"
                    " NODE_RANK=0, 1, ... (or launch with torchrun or srun)."
                )
        if start_method == "fork" and not machine.can_fork:
            raise ValueError(
                f"You selected `Fabric(strategy={label!r})` but process forking is not supported on this platform."
                " We recommend `Fabric(strategy='ddp_spawn')` instead."
            )
        if start_method in ("popen", "spawn") and machine.interactive:
            how = "re-runs the script" if start_method == "popen" else "spawns fresh interpreters that cannot import"
            how += " once per device" if start_method == "popen" else " functions defined in the session"
            raise RuntimeError(
                f"`Fabric(strategy={label!r})` is not compatible with an interactive environment (notebook or REPL):"
                f" it {how}. Run your code as a script, or choose one of the compatible strategies:"
                " `Fabric(strategy='dp'|'ddp_notebook')` (or 'ddp_fork')."
            )

    if not external:  # inside a SLURM job but not one of its srun tasks: say that fabric_lite starts the processes
        slurm_note = _note_not_started_by_srun(env, len(device_indices) if parallel else 1)
        if slurm_note:
            warnings.append(slurm_note)

    # before the 16-mixed fallback below: DeepSpeed refuses float16 on the CPU instead
    kind._check_choices(label=label, accelerator=device_kind, precision=precision_name)

    if precision_name == "16-mixed" and device_kind == "cpu" and not precision_plugins:
        warnings.append(
            "You passed `Fabric(accelerator='cpu', precision='16-mixed')` but AMP with fp16 is not supported on CPU."
            " Using `precision='bf16-mixed'` instead, as Lightning Fabric does (so that results match). For float16"
            " with a loss scaler on the CPU, pass plugins=[MixedPrecision('16-mixed', 'cpu')]."
        )
        precision_name = "bf16-mixed"

    return Plan(
        accelerator=device_kind,
        strategy=strategy_name,
        parallel=parallel,
        devices=device_indices,
        num_nodes=num_nodes,
        start_method=start_method,
        cluster_environment=environment,
        precision=precision_name,
        backend="nccl" if device_kind == "cuda" else "gloo",
        warnings=tuple(warnings),
    )


ENV_DEBUG = "FABRIC_LITE_DEBUG"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def resolve_debug(debug: bool | None, env: Mapping[str, str]) -> bool:
    """``Fabric(debug=...)``, or ``FABRIC_LITE_DEBUG`` in the environment when it is ``None``.

    Raises:
        TypeError: ``debug`` is not a bool or None.
        ValueError: the environment variable holds something other than a yes/no value.
    """
    if debug is not None:
        if not isinstance(debug, bool):
            raise TypeError(f"Fabric(debug={debug!r}) must be True, False or None (None reads ${ENV_DEBUG}).")
        return debug
    value = env.get(ENV_DEBUG, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(
        f"{ENV_DEBUG}={env[ENV_DEBUG]!r} is not understood: set it to 1 (check every collective across ranks) or 0."
    )
