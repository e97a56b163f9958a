"""Decide how to run: :func:`resolve_plan` turns ``Fabric(...)``'s arguments, an environment mapping and a
:class:`Machine` snapshot into a :class:`Plan`. It is pure (it never reads ``os.environ``), so its tests are tables;
every bad value is rejected here, before any process starts. :mod:`fabric_lite._build` builds from the plan."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fabric_lite._plan_devices import _ACCELERATOR_CHOICES as _ACCELERATOR_CHOICES
from fabric_lite._plan_devices import (
    AcceleratorName,
    accelerator_label,
    check_selects_a_device,
    resolve_accelerator,
    select_devices,
)
from fabric_lite._plan_devices import Machine as Machine
from fabric_lite._plan_settings import _LEGACY_PRECISIONS as _LEGACY_PRECISIONS
from fabric_lite._plan_settings import CLI_ENV_VARS as CLI_ENV_VARS
from fabric_lite._plan_settings import PRECISIONS as PRECISIONS
from fabric_lite._plan_settings import canonical_precision, parse_num_nodes, with_cli_settings
from fabric_lite.accelerators import Accelerator
from fabric_lite.accelerators.accelerator import accelerator_name
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
from fabric_lite.strategies.single_device import SingleDeviceStrategy
from fabric_lite.strategies.strategy import Strategy


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

    def validate_settings(self, environment: ClusterEnvironment | None = None) -> None:
        """Check the processes per node and the nodes against what the launcher says (``environment``, default
        :attr:`cluster_environment`). Called in every process before it starts or waits on another, so that every
        rank raises the same error.

        Raises:
            ValueError: a setting that disagrees with the environment, naming both values and the fix.
        """
        environment = environment if environment is not None else self.cluster_environment
        environment.validate_settings(num_devices=self.num_processes, num_nodes=self.num_nodes)


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
    """``(accelerator, devices)`` to plan with: those a strategy instance brings, checked against the arguments and
    plugins that would set the same thing."""
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
                f" Fabric(accelerator={accelerator_label(accelerator)}), choose one."
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

    Command-line flags arrive through ``env`` (:func:`~fabric_lite._plan_settings.with_cli_settings`); what a
    strategy instance sets itself counts as given to ``Fabric``, and given twice is an error.

    Raises:
        ValueError, TypeError: a value that is not accepted, with the value, the choices and a fix.
        RuntimeError: an accelerator this machine lacks, or a start method an interactive session cannot use.
        MisconfigurationException: devices that do not exist on this machine.
    """
    warnings: list[str] = []
    cli = with_cli_settings(
        env, accelerator=accelerator, strategy=strategy, devices=devices, num_nodes=num_nodes, precision=precision
    )
    accelerator, strategy, devices, precision = cli["accelerator"], cli["strategy"], cli["devices"], cli["precision"]
    num_nodes = parse_num_nodes(cli["num_nodes"])
    strategy_name = _strategy_choice(strategy)
    precision_name, precision_warnings = canonical_precision(precision)
    warnings += precision_warnings
    _check_plugins(plugins)
    check_selects_a_device(devices, accelerator)  # before the accelerator is looked at, as Lightning does
    accelerator, devices = _from_strategy_instance(strategy, accelerator, devices, plugins)
    precision_name, has_precision_plugin = _precision_of_plugins(precision_name, precision, strategy, plugins)
    device_kind, own_kind = resolve_accelerator(accelerator, machine)
    strategy_name = _strategy_for_device(strategy_name, device_kind, warnings)
    environment = _environment(strategy, strategy_name, env, plugins)
    external = environment.creates_processes_externally
    local = _external_local_count(environment) if external else None
    if devices == "auto" and local is not None:
        devices = local
    device_kind, device_indices, device_warnings = select_devices(
        devices, device_kind, own_kind, accelerator_label(accelerator), machine, external=external, local=local
    )
    warnings += device_warnings
    _check_instance_devices(strategy, devices, device_indices)
    strategy_name, kind, parallel, start_method, device_indices = _strategy(
        strategy, strategy_name, devices, device_indices, num_nodes, device_kind, external, machine, warnings
    )
    label = type(strategy).__name__ if strategy_name == "instance" else strategy_name
    if external:
        start_method = None
        _check_started_externally(parallel, environment, env, plugins)
    elif parallel:
        _check_start_method(start_method, label, machine)
    if not external:  # inside a SLURM job but not one of its srun tasks: say that fabric_lite starts the processes
        slurm_note = _note_not_started_by_srun(env, len(device_indices) if parallel else 1)
        if slurm_note:
            warnings.append(slurm_note)
    # before the 16-mixed fallback below: DeepSpeed refuses float16 on the CPU instead
    kind._check_choices(label=label, accelerator=device_kind, precision=precision_name)
    if precision_name == "16-mixed" and device_kind == "cpu" and not has_precision_plugin:
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


def _precision_of_plugins(
    precision_name: str, precision: Any, strategy: Any, plugins: Sequence[Any]
) -> tuple[str, bool]:
    """``(precision, whether a plugin sets it)``: a plugin's (or the strategy's own), which ``precision=`` may only
    repeat."""
    precision_plugins = [p for p in plugins if isinstance(p, Precision)]
    if isinstance(strategy, Strategy) and strategy._precision is not None:
        precision_plugins.append(strategy._precision)
    if not precision_plugins:
        return precision_name, False
    plugin = precision_plugins[0]
    if precision_name not in ("32-true", plugin.precision):
        raise ValueError(
            f"Received both `precision={precision_name}` and `plugins={plugin!r}`: Fabric(precision={precision!r})"
            f" conflicts with the precision plugin {type(plugin).__name__} (precision={plugin.precision!r}) in"
            " plugins. Pass only one of them."
        )
    return plugin.precision, True


def _strategy_for_device(strategy_name: str, device_kind: str, warnings: list[str]) -> str:
    """``dp`` becomes ``ddp`` on the CPU (with a warning, as in Lightning) and is refused on MPS."""
    if strategy_name == "dp" and device_kind == "cpu":
        # DataParallel needs CUDA devices; Lightning Fabric runs the same devices as processes instead, and so do we
        warnings.append(
            "strategy='dp' is not supported on CPUs, hence setting `strategy='ddp'` (as Lightning Fabric does)."
            " DataParallel replicates the module on CUDA devices; on the CPU, devices= is a number of processes."
        )
        return "ddp"
    if strategy_name == "dp" and device_kind == "mps":
        raise ValueError(
            "strategy='dp' replicates the module on CUDA devices (torch.nn.DataParallel), but accelerator='mps' was"
            " selected. Use strategy='auto' on MPS, or accelerator='cuda' on a machine with GPUs."
        )
    return strategy_name


def _environment(
    strategy: Any, strategy_name: str, env: Mapping[str, str], plugins: Sequence[Any]
) -> ClusterEnvironment:
    """Where the processes come from: a plugin, the strategy's own launcher (horovodrun), or the environment's."""
    # the class a name stands for, or the user's instance ("auto" is decided once the devices are known)
    kind: Strategy | type[Strategy] | None = strategy if isinstance(strategy, Strategy) else None
    if kind is None and strategy_name != "auto":
        kind = STRATEGY_REGISTRY[strategy_name].load()
    own = kind.own_environment if kind is not None else None
    if own is not None and not any(isinstance(p, ClusterEnvironment) for p in plugins):
        return own(env=env)
    return _detect_environment(env, plugins)


def _check_instance_devices(strategy: Any, devices: Any, device_indices: Sequence[int]) -> None:
    given = getattr(strategy, "parallel_devices", None) if isinstance(strategy, Strategy) else None
    if given and len(given) != len(device_indices):
        raise ValueError(
            f"Fabric(devices={devices!r}) selects {len(device_indices)} device(s), but {type(strategy).__name__}"
            f"(parallel_devices=...) has {len(given)}: give the devices in one place only."
        )


def _strategy(
    strategy: Any,
    strategy_name: str,
    devices: Any,
    device_indices: tuple[int, ...],
    num_nodes: int,
    device_kind: str,
    external: bool,
    machine: Machine,
    warnings: list[str],
) -> tuple[str, Strategy | type[Strategy], bool, Any, tuple[int, ...]]:
    """The strategy for these devices (``auto`` decided, a one-process one checked against the devices): its name,
    class (or instance), whether it is parallel, its start method and its devices."""
    if strategy_name == "auto":
        many = len(device_indices) > 1 or num_nodes > 1
        strategy_name = ("ddp_fork" if machine.interactive and not external else "ddp") if many else "single_device"
    label = type(strategy).__name__ if strategy_name == "instance" else strategy_name
    kind: Strategy | type[Strategy]
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
        if not (isinstance(strategy, SingleDeviceStrategy) and num_nodes == 1):
            raise ValueError(
                f"strategy={label!r} runs one process on one device, but devices={devices!r} and"
                f" num_nodes={num_nodes} ask for {len(device_indices) * num_nodes}. Use strategy='ddp' (or 'auto'),"
                " or devices=1."
            )
        # the instance was made for one device of its choosing, which it runs on (as in Lightning Fabric)
        warnings.append(
            f"Fabric(devices={devices!r}) selects {len(device_indices)} devices, but {label} runs one process on"
            f" one device: only the device it was made with is used. Pass devices=1, or"
            " strategy='ddp' to train on every device."
        )
        device_indices = device_indices[:1]
    return strategy_name, kind, parallel, start_method, device_indices


def _check_started_externally(
    parallel: bool, environment: ClusterEnvironment, env: Mapping[str, str], plugins: Sequence[Any]
) -> None:
    """A process with ``LOCAL_RANK`` set must have the rest of a launcher's variables."""
    if not parallel or not isinstance(environment, LightningEnvironment):
        return
    if any(isinstance(p, ClusterEnvironment) for p in plugins):
        return
    missing = [name for name in ("WORLD_SIZE", "MASTER_PORT") if name not in env]
    if missing:
        raise ValueError(
            f"LOCAL_RANK={env.get('LOCAL_RANK')!r} is set, so this process expects to have been started by a"
            f" launcher, but {' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not set. Unset"
            " LOCAL_RANK to let fabric_lite start the processes, or use a launcher such as torchrun."
        )


def _check_start_method(start_method: Any, label: str, machine: Machine) -> None:
    """Refuse a start method this session cannot use: fork where the platform cannot, popen or spawn in a REPL."""
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


ENV_DEBUG = "FABRIC_LITE_DEBUG"
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("", "0", "false", "no", "off")


def resolve_debug(debug: bool | None, env: Mapping[str, str]) -> bool:
    """``Fabric(debug=...)``, or ``FABRIC_LITE_DEBUG`` in the environment when it is ``None``.

    Raises:
        TypeError, ValueError: ``debug`` is not a bool or None; the variable holds no yes/no value.
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
