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

from fabric_lite.accelerators import ACCELERATOR_REGISTRY, Accelerator, XLAAccelerator
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
from fabric_lite.utilities.exceptions import MisconfigurationException

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

    @classmethod
    def detect(cls) -> Machine:
        """Read the snapshot off this machine (without initialising CUDA)."""
        from fabric_lite.accelerators import CUDAAccelerator, MPSAccelerator

        main = sys.modules.get("__main__")
        return cls(
            cuda_devices=CUDAAccelerator.auto_device_count(),
            mps_available=MPSAccelerator.is_available(),
            interactive=main is None or not hasattr(main, "__file__"),
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


def _accelerator_name(accelerator: Any) -> str:
    if isinstance(accelerator, Accelerator):
        return type(accelerator).name
    if isinstance(accelerator, str) and accelerator.lower() in _ACCELERATOR_CHOICES:
        return accelerator.lower()
    if isinstance(accelerator, str) and accelerator in ACCELERATOR_REGISTRY:
        return registered_accelerator_kind(accelerator)
    registered = sorted(set(ACCELERATOR_REGISTRY.available_accelerators()) - set(_ACCELERATOR_CHOICES))
    also = f", a name registered in ACCELERATOR_REGISTRY ({', '.join(map(repr, registered))})" if registered else ""
    raise ValueError(
        f"You selected an invalid accelerator name: accelerator={accelerator!r}."
        f" Choose one of {', '.join(repr(c) for c in _ACCELERATOR_CHOICES)}{also}, or pass an Accelerator instance."
    )


def registered_accelerator_kind(name: str) -> str:
    """The device kind (``"cpu"``, ``"cuda"`` or ``"mps"``) of the accelerator a user registered under ``name`` in
    ``ACCELERATOR_REGISTRY``: it must derive from one of the built-in accelerators, whose devices fabric_lite knows
    how to count, select and launch on."""
    cls = ACCELERATOR_REGISTRY[name]["accelerator"]
    kind = getattr(cls, "name", "")
    if isinstance(cls, type) and issubclass(cls, XLAAccelerator):
        _xla_missing(f"Fabric(accelerator={name!r})")
    if kind not in ("cpu", "cuda", "mps"):
        raise ValueError(
            f"Fabric(accelerator={name!r}): ACCELERATOR_REGISTRY has {getattr(cls, '__name__', cls)!r} under that"
            f" name, whose device kind {kind!r} fabric_lite cannot run on. A registered accelerator must subclass"
            " CPUAccelerator, CUDAAccelerator or MPSAccelerator (and may override their methods)."
        )
    return str(kind)


def _available(machine: Machine) -> list[str]:
    return [name for name, ok in (("cuda", machine.cuda_devices > 0), ("mps", machine.mps_available)) if ok] + ["cpu"]


def _resolve_accelerator(name: str, machine: Machine) -> AcceleratorName:
    available = _available(machine)  # CUDA before MPS, as Lightning's "gpu" prefers
    if name == "auto":
        return "mps" if machine.mps_available else available[0]  # type: ignore[return-value]
    if name == "gpu" and available[0] != "cpu":
        return available[0]  # type: ignore[return-value]
    missing = {
        "gpu": "accelerator='gpu' needs a CUDA or an MPS device, but this machine has neither.",
        "cuda": "accelerator='cuda' was requested, but torch sees no CUDA device on this machine.",
        "mps": "accelerator='mps' was requested, but MPS is not available on this machine.",
    }
    if name in available or name not in missing:
        return name  # type: ignore[return-value]
    raise RuntimeError(f"{missing[name]} Available accelerators: {available}. Use accelerator='cpu' or 'auto'.")


def _is_ascii_int(text: str) -> bool:
    stripped = text.strip()
    return stripped.isascii() and stripped.isdigit()


def _parse_num_nodes(num_nodes: Any) -> int:
    if isinstance(num_nodes, str) and _is_ascii_int(num_nodes):
        num_nodes = int(num_nodes)  # Lightning accepts strings (e.g. straight from argparse)
    if type(num_nodes) is not int:
        raise TypeError(f"num_nodes must be a positive integer, but got {num_nodes!r}. Example: num_nodes=2.")
    if num_nodes < 1:
        raise ValueError(f"num_nodes must be a positive integer, but got {num_nodes}. Example: num_nodes=1.")
    return num_nodes


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
                f"precision={precision!r} is supported for historical reasons but means {canonical!r};"
                f" write precision={canonical!r}."
            )
        return canonical, warnings
    allowed = list(PRECISIONS) + [repr(k) for k in _LEGACY_PRECISIONS]
    raise ValueError(f"Precision {precision!r} is invalid. Allowed precision values: {', '.join(allowed)}.")


def _cpu_devices(devices: Any) -> int:
    """``devices`` for the CPU: a number of processes. Error classes follow Lightning Fabric."""
    if devices == "auto":
        return 1
    value: Any = devices
    if isinstance(devices, str) and _is_ascii_int(devices):
        value = int(devices)
    if type(value) is int and value > 0:
        return value
    if (type(value) is int and value == 0) or (isinstance(value, (list, tuple)) and len(value) == 0):
        raise ValueError(
            f"Fabric(devices={devices!r}) is not valid with the CPU accelerator: at least one process is needed."
            " Example: devices=1, or devices=2 for two processes."
        )
    hint = ""
    if isinstance(devices, (list, tuple)) or (isinstance(devices, str) and "," in devices):
        hint = " A list of indices selects GPUs; on the CPU, give a count."
    elif devices == -1 or devices == "-1":
        hint = " devices=-1 means 'every GPU'; on the CPU, give the number of processes you want."
    raise TypeError(
        f"Fabric(devices={devices!r}) is not valid with the CPU accelerator: devices must be an int > 0 (the"
        f" number of processes) or 'auto'.{hint} Example: devices=2."
    )


def _gpu_indices(devices: Any, accelerator: str, available: int) -> tuple[int, ...]:
    """``devices`` for CUDA/MPS: an int count, -1, a list of indices, a string such as ``"0,1"``, or ``"auto"``."""
    value: Any = devices
    if isinstance(value, str):
        text = value.strip()
        try:
            if text == "auto" or text == "-1":
                value = -1
            elif "," in text:
                value = [int(x) for x in text.split(",") if x.strip()]
            else:
                value = int(text)
        except ValueError:
            value = None  # not a number: the TypeError below
    if isinstance(value, (list, tuple)):
        if any(type(v) is not int for v in value):
            raise TypeError(f"Fabric(devices={devices!r}): GPU indices must be ints, e.g. devices=[0, 1].")
        indices = list(value)
    elif type(value) is int:
        if value == -1:
            indices = list(range(available))
        elif value >= 0:
            indices = list(range(value))  # none for 0: the ValueError below
        else:
            raise ValueError(f"Fabric(devices={devices!r}) is not valid: a count must be > 0, or -1 for every GPU.")
    else:
        raise TypeError(
            f"Fabric(devices={devices!r}) is not valid: use an int, -1, a list of GPU indices, a string such as"
            " '0,1', or 'auto'."
        )
    if not indices:
        raise ValueError(
            f"Fabric(devices={devices!r}) selects no device for accelerator={accelerator!r}."
            " Example: devices=1, or accelerator='cpu'."
        )
    if len(set(indices)) != len(indices):
        raise MisconfigurationException(
            f"Fabric(devices={devices!r}) lists a device twice; each device can be used once. Example: [0, 1]."
        )
    missing = [i for i in indices if not 0 <= i < available]
    if missing:
        raise MisconfigurationException(
            f"Fabric(devices={devices!r}) asks for {accelerator} device(s) {missing}, but this machine has"
            f" {available} ({list(range(available))}). Use devices={min(len(indices), available) or 1} or"
            " indices from that list."
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
    if isinstance(strategy, str) and (strategy == "auto" or strategy in STRATEGY_REGISTRY):
        return strategy
    choices = ", ".join(repr(n) for n in ("auto", *STRATEGY_REGISTRY))
    raise ValueError(
        f"You selected an invalid strategy name: strategy={strategy!r}. Choose one of {choices},"
        " or pass a fabric_lite.strategies.Strategy instance."
    )


#: how ``fabric-lite run`` hands its flags to ``Fabric(...)`` in the script: argument name -> environment variable
CLI_ENV_VARS = {
    "accelerator": "LT_ACCELERATOR",
    "strategy": "LT_STRATEGY",
    "devices": "LT_DEVICES",
    "num_nodes": "LT_NUM_NODES",
    "precision": "LT_PRECISION",
}


def _same_setting(name: str, given: Any, from_cli: str) -> bool:
    """Whether ``Fabric(name=given)`` says the same as the CLI's ``from_cli`` (spellings differ: 2 and "2")."""
    cli = from_cli.strip()
    if name == "accelerator":
        label = type(given).name if isinstance(given, Accelerator) else str(given).lower()
        return label == cli.lower() or (cli.lower() == "gpu" and label in ("cuda", "mps"))
    if name == "strategy":
        return isinstance(given, str) and given == cli
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
    """``Fabric(...)``'s arguments with the values ``fabric-lite run`` put in ``env`` filled in.

    A CLI value replaces an argument left at its default; an argument given in the script that disagrees with it
    is an error naming both, because silently preferring either would run a different job than one of them says.
    """
    settings = dict(given)
    for name, variable in CLI_ENV_VARS.items():
        from_cli = env.get(variable)
        if from_cli is None:
            continue
        current = given[name]
        if _is_default(name, current):
            settings[name] = from_cli
        elif not _same_setting(name, current, from_cli):
            shown = f"{type(current).__name__}(...)" if isinstance(current, (Strategy, Accelerator)) else repr(current)
            raise ValueError(
                f"Fabric({name}={shown}) in the script conflicts with `fabric-lite run --{name.replace('_', '-')}"
                f" {from_cli}` ({variable}={from_cli!r} in the environment). Give the value in one place only:"
                f" remove {name}= from Fabric(...), or change the command-line flag to agree with it."
            )
    return settings


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
    its default, and one that disagrees with an argument given in the script is an error naming both.

    Raises:
        ValueError, TypeError: a value that is not accepted, with the value, the choices and a fix.
        RuntimeError: an accelerator this machine does not have.
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
    precision_plugins = [p for p in plugins if isinstance(p, Precision)]
    environment_plugins = [p for p in plugins if isinstance(p, ClusterEnvironment)]
    io_plugins = [p for p in plugins if isinstance(p, CheckpointIO)]
    for plugin in plugins:
        if not isinstance(plugin, (Precision, ClusterEnvironment, CheckpointIO)):
            raise TypeError(
                f"Fabric(plugins=...) got {plugin!r} of type {type(plugin).__name__}. Accepted plugins are"
                " fabric_lite.plugins.Precision, fabric_lite.plugins.environments.ClusterEnvironment and"
                " fabric_lite.plugins.io.CheckpointIO instances."
            )
    if io_plugins and isinstance(strategy, Strategy) and strategy._checkpoint_io is not None:
        raise ValueError(
            f"Fabric(plugins=[{type(io_plugins[0]).__name__}(...)]) and {type(strategy).__name__}(checkpoint_io="
            f"{type(strategy._checkpoint_io).__name__}(...)) both set the checkpoint IO: choose one."
        )
    for kind_name, found in (
        ("Precision", precision_plugins),
        ("ClusterEnvironment", environment_plugins),
        ("CheckpointIO", io_plugins),
    ):
        if len(found) > 1:
            raise ValueError(
                f"Fabric(plugins=...) got multiple {kind_name} plugins ({', '.join(type(p).__name__ for p in found)});"
                " pass at most one of each kind."
            )
    if precision_plugins:
        plugin = precision_plugins[0]
        if precision_name not in ("32-true", plugin.precision):
            raise ValueError(
                f"Fabric(precision={precision!r}) conflicts with the precision plugin {type(plugin).__name__}"
                f" (precision={plugin.precision!r}) in plugins. Pass only one of them."
            )
        precision_name = plugin.precision

    accelerator_name = _resolve_accelerator(_accelerator_name(accelerator), machine)
    if strategy_name == "dp" and accelerator_name == "cpu":
        # DataParallel needs CUDA devices; Lightning Fabric runs the same devices as processes instead, and so do we
        warnings.append(
            "strategy='dp' is not supported on CPUs, hence setting `strategy='ddp'` (as Lightning Fabric does)."
            " DataParallel replicates the module on CUDA devices; on the CPU, devices= is a number of processes."
        )
        strategy_name = "ddp"
    if strategy_name == "dp" and accelerator_name == "mps":
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
    if accelerator_name == "cpu":
        device_indices = tuple(range(_cpu_devices(devices)))
    else:
        if isinstance(devices, bool):
            raise TypeError(f"Fabric(devices={devices!r}) is not valid: use an int, a list of indices, or 'auto'.")
        if external and accelerator_name == "cuda" and machine.cuda_devices == 1:
            # the launcher gave every process one GPU of its own (CUDA_VISIBLE_DEVICES per rank): it is index 0
            # in every process, and `devices` only says how many processes there are per node
            every = devices in (-1, "-1")
            wanted = _gpu_indices(devices, accelerator_name, (local or 1) if every else 1 << 16)
            device_indices = (0,) * len(wanted)
        else:
            available = machine.cuda_devices if accelerator_name == "cuda" else 1
            device_indices = _gpu_indices(devices, accelerator_name, available)

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
    multi_device = kind.drives_several_devices and accelerator_name != "cpu"

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
        if parallel and isinstance(environment, LightningEnvironment):
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
        if start_method == "popen" and machine.interactive:
            raise ValueError(
                f"strategy={label!r} re-runs the script once per device, which is impossible in an interactive session"
                " (notebook or REPL). Use strategy='ddp_notebook' (or 'ddp_fork'), or run a script."
            )
        if start_method == "fork" and sys.platform == "win32":
            raise ValueError(f"strategy={strategy_name!r} needs fork, which Windows does not have. Use 'ddp_spawn'.")

    if not external:  # inside a SLURM job but not one of its srun tasks: say that fabric_lite starts the processes
        slurm_note = _note_not_started_by_srun(env, len(device_indices) if parallel else 1)
        if slurm_note:
            warnings.append(slurm_note)

    # before the 16-mixed fallback below: DeepSpeed refuses float16 on the CPU instead
    kind._check_choices(label=label, accelerator=accelerator_name, precision=precision_name)

    if precision_name == "16-mixed" and accelerator_name == "cpu" and not precision_plugins:
        warnings.append(
            "precision='16-mixed' on the CPU runs as precision='bf16-mixed', as in Lightning Fabric (so that results"
            " match). For float16 with a loss scaler on the CPU, pass plugins=[MixedPrecision('16-mixed', 'cpu')]."
        )
        precision_name = "bf16-mixed"

    return Plan(
        accelerator=accelerator_name,
        strategy=strategy_name,
        parallel=parallel,
        devices=device_indices,
        num_nodes=num_nodes,
        start_method=start_method,
        cluster_environment=environment,
        precision=precision_name,
        backend="nccl" if accelerator_name == "cuda" else "gloo",
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
