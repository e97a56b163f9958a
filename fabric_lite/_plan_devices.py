"""The device side of the plan: the kind of device ``accelerator=`` computes on and the devices ``devices=``
selects, over a :class:`Machine` snapshot. Pure functions, called by :func:`fabric_lite._plan.resolve_plan`."""

from __future__ import annotations

import sys
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
from fabric_lite.utilities._device_ids import parse_device_ids

AcceleratorName = Literal["cpu", "cuda", "mps"]
_ACCELERATOR_CHOICES = ("auto", "cpu", "cuda", "gpu", "mps")


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
        """Read the snapshot off this machine without initialising CUDA, through Lightning's functions."""
        # a spawned process runs the script as __mp_main__ while its __main__ is still multiprocessing's bootstrap,
        # which has no file: the script is what counts
        main = sys.modules.get("__mp_main__", sys.modules.get("__main__"))
        return cls(
            cuda_devices=CUDAAccelerator.auto_device_count() if CUDAAccelerator.is_available() else 0,
            mps_available=MPSAccelerator.is_available(),
            interactive=main is None or not hasattr(main, "__file__"),
            can_fork="fork" in torch.multiprocessing.get_all_start_methods(),
        )


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


def accelerator_label(accelerator: Any) -> str:
    """How the user named the accelerator, for messages."""
    return repr(accelerator_name(accelerator)) if isinstance(accelerator, Accelerator) else repr(accelerator)


def _available(machine: Machine) -> list[str]:
    return [name for name, ok in (("cuda", machine.cuda_devices > 0), ("mps", machine.mps_available)) if ok] + ["cpu"]


def _not_available(accelerator: Any, cls: type[Accelerator], detail: str, machine: Machine) -> RuntimeError:
    return RuntimeError(
        f"Fabric(accelerator={accelerator_label(accelerator)}): `{cls.__qualname__}` can not run on your system"
        f" since the accelerator is not available ({detail}). Available accelerators: {_available(machine)}."
        " Use accelerator='cpu' or 'auto'."
    )


def resolve_accelerator(accelerator: Any, machine: Machine) -> tuple[AcceleratorName, type[Accelerator] | None]:
    """The device kind to run on, and the accelerator class where it names its own devices (else ``None``)."""
    name = accelerator.lower() if isinstance(accelerator, str) else None
    available = _available(machine)  # for "gpu", CUDA before MPS (a machine has one or the other)
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
        _xla_missing(f"Fabric(accelerator={accelerator_label(accelerator)})")
    # the built-in device kind the class derives from; None for an accelerator of its own kind
    kind = next((kind for kind, base in _KINDS if issubclass(cls, base)), None)
    if kind == "cuda" and machine.cuda_devices == 0:
        raise _not_available(accelerator, cls, "torch sees no CUDA device on this machine", machine)
    if kind == "mps" and not machine.mps_available:
        raise _not_available(accelerator, cls, "MPS is not available on this machine", machine)
    if kind is None and not cls.is_available():
        raise _not_available(accelerator, cls, f"{cls.__qualname__}.is_available() is False", machine)
    if kind is None and issubclass(cls, XLAAccelerator):
        _xla_missing(f"Fabric(accelerator={accelerator_label(accelerator)})")
    return kind or "cpu", None if kind else cls


def own_kind_devices(cls: type[Accelerator], devices: Any, label: str) -> tuple[AcceleratorName, tuple[int, ...]]:
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


def check_selects_a_device(devices: Any, accelerator: Any) -> None:
    """Raise ``ValueError`` for ``0``, ``"0"`` or an empty list, which select no device with any accelerator."""
    if isinstance(devices, (list, tuple)):
        nothing = len(devices) == 0
    else:
        nothing = (type(devices) is int and devices == 0) or (isinstance(devices, str) and devices.strip() == "0")
    if nothing:
        shown = accelerator_name(accelerator) if isinstance(accelerator, Accelerator) else accelerator
        need = " (with the CPU accelerator, at least one process is needed)" if str(shown).lower() == "cpu" else ""
        raise ValueError(
            f"`Fabric(devices={devices!r})` value is not a valid input using {shown} accelerator: it selects no"
            f" device{need}. Example: devices=1."
        )


def cpu_devices(devices: Any) -> int:
    """``devices`` for the CPU: a number of processes (error classes as in Lightning)."""
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


def gpu_indices(devices: Any, accelerator: str, available: int) -> tuple[int, ...]:
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


def select_devices(
    devices: Any,
    kind: AcceleratorName,
    own_kind: type[Accelerator] | None,
    label: str,
    machine: Machine,
    *,
    external: bool,
    local: int | None,
) -> tuple[AcceleratorName, tuple[int, ...], list[str]]:
    """The device kind, the device indices on this node (``0..n-1`` for ``n`` CPU processes) and any warnings.
    ``external``: a launcher started the processes (``local`` of them on this node, where it says).

    Raises:
        TypeError, ValueError, MisconfigurationException: no device selected, or one this machine does not have.
    """
    if own_kind is not None:
        own, indices = own_kind_devices(own_kind, devices, label)
        return own, indices, []
    if kind == "cpu":
        return kind, tuple(range(cpu_devices(devices))), []
    if isinstance(devices, bool):
        raise TypeError(f"Fabric(devices={devices!r}) is not valid: use an int, a list of indices, or 'auto'.")
    if external and kind == "cuda" and machine.cuda_devices == 1:
        # the launcher gave every process one GPU of its own (CUDA_VISIBLE_DEVICES per rank): it is index 0 in every
        # process, and `devices` only says how many processes there are per node
        every = devices in (-1, "-1")
        wanted = gpu_indices(devices, kind, (local or 1) if every else 1 << 16)
        return kind, (0,) * len(wanted), []
    warnings = []
    if devices == "auto" and kind == "cuda" and machine.interactive and machine.cuda_devices > 1:
        # Lightning's choice: several processes in a notebook only when asked for
        devices = 1
        warnings.append(
            f"Fabric will use only 1 of {machine.cuda_devices} GPUs because it is running inside an interactive /"
            f" notebook environment. Pass devices={machine.cuda_devices} (with strategy='ddp_notebook') to use them"
            " all; several GPUs in a notebook is experimental."
        )
    return kind, gpu_indices(devices, kind, machine.cuda_devices if kind == "cuda" else 1), warnings
