"""Throughput (batches, samples, items and FLOPs per second) and model FLOP utilisation (Lightning Fabric's
``utilities.throughput``)."""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

import torch

from fabric_lite.accelerators import cuda
from fabric_lite.utilities.rank_zero import rank_zero_only, rank_zero_warn

if TYPE_CHECKING:
    from fabric_lite.fabric import Fabric
    from fabric_lite.plugins.precision import Precision

_THROUGHPUT_METRICS = dict[str, int | float]

T = TypeVar("T", bound=float)


class _MonotonicWindow(list[T]):
    """The last ``maxlen`` values appended, which must strictly increase (else rates are wrong or divide by zero)."""

    def __init__(self, maxlen: int) -> None:
        super().__init__()
        self.maxlen = maxlen

    def append(self, x: T) -> None:
        if self and self[-1] >= x:
            raise ValueError(f"Expected the value to increase, last: {self[-1]}, current: {x}")
        super().append(x)
        if len(self) > self.maxlen:
            del self[0]

    def __setitem__(self, key: Any, value: Any) -> None:
        raise NotImplementedError("__setitem__ is not supported")


class Throughput:
    """Rates over a window of the most recent :meth:`update` calls, per device and (``world_size > 1``) global.

    :meth:`compute` returns the last ``time``, ``batches``, ``samples`` (and ``lengths``); once ``window_size``
    updates were made, ``device/batches_per_sec``, ``device/samples_per_sec`` (and ``device/items_per_sec``); once
    ``window_size`` ``flops`` were given, ``device/flops_per_sec`` and, with ``available_flops`` (one device's peak,
    see :func:`get_available_flops`), ``device/mfu``. The global rates are the device rates times ``world_size``.

    Raises:
        ValueError: ``world_size < 1`` or ``window_size < 2``.

    Example::

        throughput = Throughput(window_size=2)
        throughput.update(time=1.0, batches=1, samples=4)
        throughput.update(time=3.0, batches=2, samples=8)
        throughput.compute()  # {..., 'device/batches_per_sec': 0.5, 'device/samples_per_sec': 2.0}
    """

    def __init__(
        self, available_flops: float | None = None, world_size: int = 1, window_size: int = 100, separator: str = "/"
    ) -> None:
        if world_size < 1:
            raise ValueError(f"Throughput(world_size={world_size}): the world size must be at least 1.")
        if window_size < 2:
            raise ValueError(
                f"Throughput(window_size={window_size}): the window must hold at least 2 updates (rates are"
                " differences between the first and the last). Use window_size=2 or more."
            )
        self.available_flops = available_flops
        self.separator = separator
        self.world_size = world_size
        self._time: _MonotonicWindow[float] = _MonotonicWindow(maxlen=window_size)
        self._batches: _MonotonicWindow[int] = _MonotonicWindow(maxlen=window_size)
        self._samples: _MonotonicWindow[int] = _MonotonicWindow(maxlen=window_size)
        self._lengths: _MonotonicWindow[int] = _MonotonicWindow(maxlen=window_size)
        self._flops: deque[int] = deque(maxlen=window_size)

    def update(
        self, *, time: float, batches: int, samples: int, lengths: int | None = None, flops: int | None = None
    ) -> None:
        """Record this device's running totals after a batch.

        ``time`` (seconds since the start), ``batches``, ``samples`` (at least ``batches``) and ``lengths`` (items
        such as tokens, at least ``samples``; at every call or never) must increase at every call. ``flops``: this
        device's FLOPs since the previous call.

        Raises:
            ValueError: a total that does not increase, ``samples < batches`` or ``lengths < samples``.
            RuntimeError: ``lengths`` given at some calls only.

        Example::

            throughput.update(time=time.perf_counter() - start, batches=i, samples=i * 32)
        """
        # the same order of appends and checks as Lightning, so a failing call leaves the same state behind
        self._time.append(time)
        if samples < batches:
            raise ValueError(f"Expected samples ({samples}) to be greater or equal than batches ({batches})")
        self._batches.append(batches)
        self._samples.append(samples)
        if lengths is not None:
            if lengths < samples:
                raise ValueError(f"Expected lengths ({lengths}) to be greater or equal than samples ({samples})")
            self._lengths.append(lengths)
            if len(self._samples) != len(self._lengths):
                raise RuntimeError(
                    f"If lengths are passed ({len(self._lengths)}), there needs to be the same number of samples"
                    f" ({len(self._samples)})"
                )
        if flops is not None:
            self._flops.append(flops * self.world_size)  # the FLOPs of all devices together

    def compute(self) -> _THROUGHPUT_METRICS:
        """The metrics described in the class docstring; raises ``IndexError`` before the first :meth:`update`."""
        sep = self.separator
        metrics: _THROUGHPUT_METRICS = {
            "time": self._time[-1],
            "batches": self._batches[-1],
            "samples": self._samples[-1],
        }
        if self._lengths:
            metrics["lengths"] = self._lengths[-1]
        add_global = self.world_size > 1
        if len(self._time) == self._time.maxlen:
            elapsed_time = self._time[-1] - self._time[0]  # > 0: the window is strictly increasing
            batches_per_sec = (self._batches[-1] - self._batches[0]) / elapsed_time
            samples_per_sec = (self._samples[-1] - self._samples[0]) / elapsed_time
            metrics[f"device{sep}batches_per_sec"] = batches_per_sec
            metrics[f"device{sep}samples_per_sec"] = samples_per_sec
            if add_global:
                metrics["batches_per_sec"] = batches_per_sec * self.world_size
                metrics["samples_per_sec"] = samples_per_sec * self.world_size
            if len(self._lengths) == self._lengths.maxlen:
                items_per_sec = (self._lengths[-1] - self._lengths[0]) / elapsed_time
                metrics[f"device{sep}items_per_sec"] = items_per_sec
                if add_global:
                    metrics["items_per_sec"] = items_per_sec * self.world_size
        if len(self._flops) == self._flops.maxlen:
            # the first entry is the work done before the first timestamp of the window
            flops_per_sec = (sum(self._flops) - self._flops[0]) / (self._time[-1] - self._time[0])
            device_flops_per_sec = flops_per_sec / self.world_size
            if add_global:
                metrics["flops_per_sec"] = flops_per_sec
            metrics[f"device{sep}flops_per_sec"] = device_flops_per_sec
            if self.available_flops:
                metrics[f"device{sep}mfu"] = device_flops_per_sec / self.available_flops
        return metrics

    def reset(self) -> None:
        """Forget every update (e.g. after a validation loop, whose time must not count)."""
        for window in (self._time, self._batches, self._samples, self._lengths, self._flops):
            window.clear()


class ThroughputMonitor(Throughput):
    """A :class:`Throughput` for a launched ``Fabric``, logging through ``fabric.log_dict``.

    ``world_size`` and ``available_flops`` come from ``fabric``; ``**kwargs`` go to :class:`Throughput`. As in
    Lightning, :meth:`update`, :meth:`compute`, :meth:`compute_and_log` and :meth:`reset` act on global rank 0 only
    (elsewhere they return ``None``/``{}``).

    Example::

        monitor = ThroughputMonitor(fabric, window_size=10)
        monitor.update(time=time.perf_counter() - start, batches=i, samples=i * batch_size)
        monitor.compute_and_log(step=i)
    """

    def __init__(self, fabric: Fabric, **kwargs: Any) -> None:
        fabric._validate_launched()  # before launch() the world size is not known yet
        available_flops = get_available_flops(fabric.device, _plugin_to_compute_dtype(fabric.strategy.precision))
        super().__init__(available_flops=available_flops, world_size=fabric.world_size, **kwargs)
        self._fabric = fabric
        self.step = -1
        for name, default in (("update", None), ("compute", {}), ("compute_and_log", {}), ("reset", None)):
            setattr(self, name, rank_zero_only(getattr(self, name), default=default))

    def compute_and_log(self, step: int | None = None, **kwargs: Any) -> _THROUGHPUT_METRICS:
        """:meth:`compute` and ``fabric.log_dict(metrics, step)``; ``step`` defaults to one more than the last."""
        self.step = (self.step + 1) if step is None else step
        metrics = self.compute(**kwargs)
        self._fabric.log_dict(metrics=metrics, step=self.step)
        return metrics


def measure_flops(
    model: torch.nn.Module,
    forward_fn: Callable[[], torch.Tensor],
    loss_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> int:
    """The FLOPs of ``forward_fn()``, and of ``loss_fn(output).backward()`` when given (``FlopCounterMode``).

    A model on the ``meta`` device is measured without allocating anything; ``model`` is kept for Lightning's signature.

    Example::

        flops = measure_flops(model, lambda: model(x), lambda y: y.sum())
    """
    from torch.utils.flop_counter import FlopCounterMode

    counter = FlopCounterMode(display=False)
    with counter:
        if loss_fn is None:
            forward_fn()
        else:
            loss_fn(forward_fn()).backward()  # type: ignore[no-untyped-call]
    return int(counter.get_total_flops())


# Peak dense FLOP/s from NVIDIA's data sheets (Lightning Fabric's figures): one row a chip, one column a dtype of
# _FLOPS_DTYPES; None where the data sheet gives no figure.
_FLOPS_DTYPES: tuple[torch.dtype | str, ...] = (
    torch.float64,
    torch.float32,
    "tfloat32",
    torch.bfloat16,
    torch.float16,
    torch.int8,
    "int4",
)
_FLOPS_ROWS: dict[str, tuple[float | None, ...]] = {
    # Hopper
    "h200 sxm1": (3.4e13, 6.7e13, 9.9e14, 2.0e15, 2.0e15, 4.0e15, None),
    "h200 nvl1": (3.0e13, 6.0e13, 8.4e14, 1.7e15, 1.7e15, 3.3e15, None),
    "h100 nvl": (67e12, 133.8e12, 989.4e12, 1978.8e12, 1978.8e12, 3957.8e12, None),
    "h100 sxm": (33.5e12, 66.9e12, 494.7e12, 989.4e12, 989.4e12, 1978.9e12, None),
    "h100 pcie": (25.6e12, 51.2e12, 378e12, 756e12, 756e12, 1513e12, None),
    # Ada
    "rtx 4090": (None, 82.6e12, 82.6e12, 82.6e12, 82.6e12, 660.6e12, 1321.2e12),
    "rtx 4080": (None, 48.7e12, 48.7e12, 48.7e12, 48.7e12, 389.9e12, 779.8e12),
    "rtx 4080 super": (None, 52.2e12, 52.2e12, 52.2e12, 52.2e12, 417.6e12, 835.2e12),
    "l4": (None, 30.3e12, 60e12, 121e12, 121e12, 242e12, 484e12),
    "l40": (None, 90.5e12, 90.5e12, 181e12, 181e12, 362e12, 724e12),
    # Ampere
    "a100": (9.7e12, 19.5e12, 156e12, 312e12, 312e12, 624e12, None),
    "a6000": (None, 38.7e12, 77.4e12, 38.7e12, 38.7e12, 309.7e12, 619.3e12),
    "a40": (None, 37.4e12, 74.8e12, 37.4e12, 37.4e12, 299.3e12, 598.7e12),
    "a10g": (None, 31.2e12, 62.5e12, 125e12, 125e12, 250e12, 500e12),
    "rtx 3090 ti": (None, 40e12, 40e12, 40e12, 40e12, 320e12, 640e12),
    "rtx 3090": (None, 35.6e12, 35.6e12, 35.6e12, 35.6e12, 284e12, 568e12),
    "rtx 3080 ti": (None, 34.1e12, 34.1e12, 34.1e12, 34.1e12, 272.8e12, 546.6e12),
    "rtx 3080": (None, 29.8e12, 29.8e12, 29.8e12, 29.8e12, 238e12, 476e12),
    "rtx 3070": (None, 20.3e12, 20.3e12, 20.3e12, 20.3e12, 162.6e12, 325.2e12),
    # Turing
    "t4": (None, 8.1e12, None, None, 65e12, 130e12, 260e12),
    "quadro rtx 5000": (None, 11.2e12, None, None, 89.2e12, None, None),
    "rtx 2080 super": (None, 11.2e12, None, None, 22.3e12, 178.4e12, 356.8e12),
    "rtx 2080 ti": (None, 14.2e12, None, None, 28.5e12, 227.7e12, 455.4e12),
    "rtx 2080": (None, 10.6e12, None, None, 21.2e12, 169.6e12, 339.1e12),
    "rtx 2070 super": (None, 9.1e12, None, None, 18.1e12, 145e12, 290e12),
    "titan rtx": (None, 16.3e12, None, None, 32.6e12, 261e12, 522e12),
    # Volta
    "v100 sxm": (7.8e12, 15.7e12, None, None, 125e12, None, None),
    "v100 pcie": (7e12, 14e12, None, None, 112e12, None, None),
    "v100s pcie": (8.2e12, 16.4e12, None, None, 130e12, None, None),
}
_CUDA_FLOPS: dict[str, dict[str | torch.dtype, float]] = {
    chip: {dtype: flops for dtype, flops in zip(_FLOPS_DTYPES, row, strict=True) if flops is not None}
    for chip, row in _FLOPS_ROWS.items()
}

# (substring of the lower-cased device name, table key), checked in order, for the chips whose name needs no parsing
_SIMPLE_CHIPS = (
    ("a6000", "a6000"),
    ("a100", "a100"),
    ("a40", "a40"),
    ("a10g", "a10g"),
    ("t4", "t4"),
    ("quadro rtx 5000", "quadro rtx 5000"),
    ("titan rtx", "titan rtx"),
    ("v100-sxm", "v100 sxm"),
    ("v100-pcie", "v100 pcie"),
    ("v100s-pcie", "v100s pcie"),
)


def _chip_of(device_name: str) -> str | None:
    """The :data:`_CUDA_FLOPS` key for a CUDA device name (Lightning's parsing), or ``None``."""
    chip = device_name.lower()
    if "h200" in chip:
        if "sxm1" in chip:
            return "h200 sxm1"
        if "nvl1" in chip:
            return "h200 nvl1"
        return chip
    if "h100" in chip:
        if "hbm3" in chip:
            return "h100 sxm"
        if "nvl" in chip:
            return "h100 nvl"
        if "pcie" in chip or "hbm2e" in chip:
            return "h100 pcie"
        return chip
    if "l4" in chip:
        return "l40" if "tesla" in chip else "l4"
    if "geforce rtx" in chip:
        words = chip.split(" ")
        number = words[3] if len(words) > 3 else ""
        extra = " super" if "super" in chip else " ti" if "ti" in chip else ""
        return f"rtx {number}{extra}"
    return next((key for needle, key in _SIMPLE_CHIPS if needle in chip), None)


def _cuda_flops(device_name: str, dtype: torch.dtype | str, tf32: bool) -> int | None:
    """:func:`get_available_flops` for a CUDA device name; ``tf32``: float32 matmuls run on TF32 tensor cores."""
    chip = _chip_of(device_name)
    if chip is None:
        rank_zero_warn(f"FLOPs not found for {device_name!r}")
        return None
    if chip not in _CUDA_FLOPS:
        rank_zero_warn(f"FLOPs not found for {device_name!r}, chip is {chip!r}")
        return None
    dtype_to_flops = _CUDA_FLOPS[chip]
    if dtype is torch.float32 and tf32:
        dtype = "tfloat32"
    if dtype not in dtype_to_flops:
        rank_zero_warn(f"{device_name!r} does not support {dtype}")
        return None
    return int(dtype_to_flops[dtype])


def get_available_flops(device: torch.device, dtype: torch.dtype | str) -> int | None:
    """The theoretical peak FLOP/s of ``device`` for ``dtype``, from a table of NVIDIA GPUs.

    ``None`` for non-CUDA devices, and ``None`` with a warning for a GPU or dtype not in the table. For float32 on
    Ampere or later, the TF32 figure unless ``torch.get_float32_matmul_precision() == "highest"``.

    Example::

        get_available_flops(torch.device("cuda", 0), torch.bfloat16)  # 312000000000000 on an A100
    """
    if device.type != "cuda":
        # no TPU support (Lightning's torch_xla branch)
        return None
    tf32 = (
        dtype is torch.float32
        and cuda._is_ampere_or_later(device)  # through the module: Lightning's tests patch it there
        and torch.get_float32_matmul_precision() != "highest"
    )
    return _cuda_flops(torch.cuda.get_device_name(device), dtype, tf32)


def _plugin_to_compute_dtype(plugin: Precision) -> torch.dtype:
    """The dtype matmuls run in under ``plugin``, as Lightning decides it: the half dtype of mixed or true-half
    precision, float64 for double, FSDP's reduce dtype, else float32."""
    from fabric_lite.plugins.precision import Precision

    if not isinstance(plugin, Precision):
        raise RuntimeError(f"Expected a precision plugin, got {plugin!r}")
    if hasattr(type(plugin), "mixed_precision_config"):  # FSDPPrecision
        return plugin.mixed_precision_config.reduce_dtype or torch.float32  # type: ignore[attr-defined]
    dtype = getattr(plugin, "_desired_input_dtype", torch.float32)
    return dtype if isinstance(dtype, torch.dtype) else torch.float32


__all__ = ["Throughput", "ThroughputMonitor", "get_available_flops", "measure_flops"]
