"""A progress display for training and evaluation loops, shown by global rank 0 only: a tqdm bar on a terminal with
tqdm installed, else (as in a SLURM log) a plain line every ``interval`` seconds, with no control characters::

    epoch 1: 120/500 (24%) | 41.3 it/s | elapsed 0:02 | eta 0:09 | loss=0.4312
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import time
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TextIO, TypeVar

from torch import Tensor

from fabric_lite.utilities.seed import _rank_and_world_size

if TYPE_CHECKING:
    from fabric_lite.fabric import Fabric

T = TypeVar("T")
_BACKENDS = ("auto", "tqdm", "plain")
Backend = Literal["auto", "tqdm", "plain"]


class ProgressBar(Generic[T]):
    """Progress over an iterable (iterate over the bar) or over manual steps (:meth:`update`).

    Made by :func:`progress_bar`, whose arguments it takes. A bar that is not shown (``enabled=False``) still yields
    every item and counts :attr:`n`; its other methods do nothing.

    Example::

        bar = ProgressBar(range(100), desc="eval", backend="plain")
        for i in bar:
            bar.set_postfix(i=i)
    """

    def __init__(
        self,
        iterable: Iterable[T] | None = None,
        *,
        total: int | None = None,
        desc: str | None = None,
        enabled: bool = True,
        backend: Backend = "auto",
        interval: float = 10.0,
        file: TextIO | None = None,
        unit: str = "it",
        leave: bool = True,
    ) -> None:
        if backend not in _BACKENDS:
            raise ValueError(f"progress_bar(backend={backend!r}) is not one of {_BACKENDS}.")
        if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not interval >= 0:
            raise ValueError(f"progress_bar(interval={interval!r}) must be a number of seconds >= 0, e.g. 10.0.")
        if total is None and iterable is not None:
            try:
                total = len(iterable)  # type: ignore[arg-type]
            except TypeError:  # a generator or an iterable dataset's loader: no length
                total = None
        self._iterable = iterable
        self.total = total
        self.desc = desc or ""
        self.n = 0
        self.unit = unit
        self._closed = False
        self._display: _TqdmDisplay | _PlainDisplay | None = None
        if enabled:
            stream = file if file is not None else sys.stdout
            if _use_tqdm(backend, stream):
                self._display = _TqdmDisplay(total, self.desc, stream, unit, leave)
            else:
                self._display = _PlainDisplay(total, self.desc, stream, unit, float(interval))

    @property
    def backend(self) -> Literal["tqdm", "plain", "off"]:
        """``"tqdm"``, ``"plain"`` or ``"off"`` (not shown)."""
        if isinstance(self._display, _TqdmDisplay):
            return "tqdm"
        return "plain" if isinstance(self._display, _PlainDisplay) else "off"

    def __iter__(self) -> Iterator[T]:
        if self._iterable is None:
            raise TypeError(
                "This ProgressBar has no iterable to iterate over: pass one (progress_bar(loader, ...)), or call"
                " bar.update(n) for manual steps."
            )
        try:
            for item in self._iterable:
                yield item
                self.update()
        finally:
            self.close()  # also when the loop is left early (break, exception)

    def __len__(self) -> int:
        if self.total is None:
            raise TypeError("This ProgressBar has no length: its iterable has none and no total was given.")
        return self.total

    def update(self, n: int = 1) -> None:
        """Count ``n`` more steps (iterating counts one per item)."""
        self.n += n
        if self._display is not None:
            self._display.update(self.n, n)

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, **metrics: Any) -> None:
        """Show these values after the progress, replacing the previous ones; one-element tensors show as numbers."""
        if self._display is None:
            return
        values = {**(ordered_dict or {}), **metrics}
        # detach now (cheap), convert to a number only when shown: no device sync on every step
        self._display.set_postfix({k: v.detach() if isinstance(v, Tensor) else v for k, v in values.items()})

    def set_description(self, desc: str) -> None:
        """Change the label in front of the progress."""
        self.desc = desc
        if self._display is not None:
            self._display.set_description(desc)

    def close(self) -> None:
        """Show the final state and release the display (iteration's end calls it). Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._display is not None:
            self._display.close(self.n)

    def __enter__(self) -> ProgressBar[T]:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def progress_bar(
    iterable: Iterable[T] | None = None,
    *,
    fabric: Fabric | None = None,
    desc: str | None = None,
    total: int | None = None,
    backend: Backend = "auto",
    interval: float = 10.0,
    file: TextIO | None = None,
    unit: str = "it",
    leave: bool = True,
    disable: bool = False,
) -> ProgressBar[T]:
    """A :class:`ProgressBar` over ``iterable`` (``None`` for manual steps): every process gets every item, and only
    global rank 0 (per ``fabric``, else the process group, else this process) shows the progress.

    ``total`` defaults to ``len(iterable)``. ``backend``: ``"auto"`` (tqdm when installed and writing to a terminal,
    else plain lines), ``"tqdm"`` or ``"plain"``. ``interval``: seconds between plain lines (the last comes when the
    loop ends). ``leave`` keeps the tqdm bar on screen; ``disable`` shows nothing anywhere.

    Raises:
        ValueError: an unknown ``backend`` or a negative ``interval``.
        ModuleNotFoundError: ``backend="tqdm"`` without tqdm, where the bar is shown.

    Example::

        bar = progress_bar(loader, fabric=fabric, desc=f"epoch {epoch}")
        for x, y in bar:
            bar.set_postfix(loss=train_step(x, y))
    """
    shown = fabric.is_global_zero if fabric is not None else _rank_and_world_size()[0] == 0
    return ProgressBar(
        iterable,
        total=total,
        desc=desc,
        enabled=shown and not disable,
        backend=backend,
        interval=interval,
        file=file,
        unit=unit,
        leave=leave,
    )


def _use_tqdm(backend: Backend, stream: TextIO) -> bool:
    if backend == "plain":
        return False
    installed = importlib.util.find_spec("tqdm") is not None
    if backend == "tqdm":
        if not installed:
            raise ModuleNotFoundError(
                "progress_bar(backend='tqdm') needs tqdm, which is not installed: `pip install tqdm` (or"
                " `pip install 'fabric-lite[progress]'`), or use backend='auto' or 'plain' for plain text lines."
            )
        return True
    isatty = getattr(stream, "isatty", None)
    return installed and callable(isatty) and bool(isatty())


def _clean(text: str) -> str:
    """``text`` without control characters, which would garble a log file."""
    return "".join(ch if ch.isprintable() else " " for ch in text)


def _number(value: Any) -> Any:
    return value.item() if isinstance(value, Tensor) and value.numel() == 1 else value


def _format_value(value: Any) -> str:
    value = _number(value)
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def _format_seconds(seconds: float) -> str:
    """``65.2`` -> ``"1:05"``, ``3725`` -> ``"1:02:05"``."""
    hours, rest = divmod(int(seconds), 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


class _PlainDisplay:
    """Plain text lines, one every ``interval`` seconds and one at the end."""

    def __init__(self, total: int | None, desc: str, stream: TextIO, unit: str, interval: float) -> None:
        self.total = total
        self.desc = desc
        self.stream = stream
        self.unit = unit
        self.interval = interval
        self.postfix: dict[str, Any] = {}
        self._clock = time.monotonic
        self.start = self._clock()
        self.last_print = self.start
        self.printed_n: int | None = None

    def update(self, n: int, _: int) -> None:
        now = self._clock()
        if now - self.last_print >= self.interval:
            self._print(n, now)

    def set_postfix(self, values: dict[str, Any]) -> None:
        self.postfix = values

    def set_description(self, desc: str) -> None:
        self.desc = desc

    def close(self, n: int) -> None:
        if self.printed_n != n:
            self._print(n, self._clock())

    def line(self, n: int, now: float) -> str:
        elapsed = max(0.0, now - self.start)
        rate = n / elapsed if elapsed > 0 else 0.0
        parts = [f"{n}/{self.total} ({100 * n / self.total:.0f}%)" if self.total else f"{n} {self.unit}"]
        if rate <= 0:
            parts.append(f"? {self.unit}/s")
        elif rate >= 1:
            parts.append(f"{rate:.2f} {self.unit}/s")
        else:
            parts.append(f"{1 / rate:.2f} s/{self.unit}")
        parts.append(f"elapsed {_format_seconds(elapsed)}")
        if self.total and rate > 0 and n < self.total:
            parts.append(f"eta {_format_seconds(round((self.total - n) / rate))}")
        if self.postfix:
            parts.append(", ".join(f"{name}={_format_value(value)}" for name, value in self.postfix.items()))
        text = " | ".join(parts)
        return _clean(f"{self.desc}: {text}" if self.desc else text)

    def _print(self, n: int, now: float) -> None:
        self.stream.write(self.line(n, now) + "\n")
        self.stream.flush()
        self.last_print = now
        self.printed_n = n


class _TqdmDisplay:
    """A tqdm bar, fed by manual updates."""

    def __init__(self, total: int | None, desc: str, stream: TextIO, unit: str, leave: bool) -> None:
        tqdm = importlib.import_module("tqdm").tqdm  # optional: imported only when a bar is shown with it
        self.bar = tqdm(total=total, desc=desc or None, file=stream, unit=unit, leave=leave, dynamic_ncols=True)

    def update(self, n: int, step: int) -> None:
        self.bar.update(step)

    def set_postfix(self, values: dict[str, Any]) -> None:
        self.bar.set_postfix({name: _number(value) for name, value in values.items()}, refresh=False)

    def set_description(self, desc: str) -> None:
        self.bar.set_description(desc or None, refresh=False)

    def close(self, n: int) -> None:
        self.bar.close()
