"""``TensorBoardLogger``: event files in ``root_dir/name/version_N`` (the optional ``tensorboard`` loaded on use)."""

from __future__ import annotations

import enum
import importlib
import io
import os
import time
import warnings
import weakref
from argparse import Namespace
from collections.abc import Mapping
from typing import Any, Literal

from torch import Tensor
from torch.nn import Module
from typing_extensions import override

from fabric_lite.loggers._folder import _FolderLogger
from fabric_lite.loggers._metrics import _to_scalars
from fabric_lite.loggers.logger import _DummyExperiment
from fabric_lite.utilities._fs import _filesystem, _is_object_store, _is_remote
from fabric_lite.utilities.imports import _Availability
from fabric_lite.utilities.types import _PATH

_Backend = Literal["tensorboard", "tensorboardX"]


#: whether ``tensorboard`` / ``tensorboardX`` is installed (Lightning's names; looked up on first use, not imported)
_TENSORBOARD_AVAILABLE = _Availability("tensorboard")
_TENSORBOARDX_AVAILABLE = _Availability("tensorboardX")


class TensorBoardLogger(_FolderLogger):
    r"""Log to TensorBoard event files in ``root_dir/name/version[/sub_dir]``, as Lightning Fabric's
    ``TensorBoardLogger`` does, through ``torch.utils.tensorboard`` (or ``tensorboardX`` where only that is installed).

    Only global rank 0 writes; elsewhere every method is a no-op. The writer is closed by :meth:`finalize`, when the
    function given to ``fabric.launch`` returns, or at process exit. With an fsspec ``root_dir`` (and no
    ``storage_options``), ``tensorboardX`` writes through fsspec, the whole file at every flush, and ``tensorboard``
    writes ``s3://`` through boto3, configured by its environment (``AWS_ENDPOINT_URL``) and not fsspec's.

    Args:
        root_dir, name, version, prefix: as for ``CSVLogger``.
        default_hp_metric: have :meth:`log_hyperparams` without metrics log ``hp_metric = -1`` (TensorBoard needs one).
        sub_dir: a folder inside the version folder to write into (e.g. ``"train"``).
        \**kwargs: passed to ``SummaryWriter`` (e.g. ``flush_secs=30``).

    Raises:
        ModuleNotFoundError: neither ``tensorboard`` nor ``tensorboardX`` is installed.

    Example::

        fabric = Fabric(loggers=TensorBoardLogger("logs", name="my_model"))  # logs/my_model/version_0/events...
    """

    def __init__(
        self,
        root_dir: _PATH,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        default_hp_metric: bool = True,
        prefix: str = "",
        sub_dir: _PATH | None = None,
        **kwargs: Any,
    ) -> None:
        if not (_TENSORBOARD_AVAILABLE or _TENSORBOARDX_AVAILABLE):  # looked up, not imported
            raise ModuleNotFoundError(
                "TensorBoardLogger needs the `tensorboard` package (or `tensorboardX`), and neither is installed."
                " Install it with `pip install tensorboard` (or `pip install 'fabric-lite[tensorboard]'`), or log"
                " with fabric_lite.loggers.CSVLogger, which needs nothing extra."
            )
        super().__init__(root_dir, name, version, prefix)
        self._backend: _Backend = "tensorboard" if _TENSORBOARD_AVAILABLE else "tensorboardX"
        self._default_hp_metric = default_hp_metric
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._kwargs = kwargs

    @property
    @override
    def log_dir(self) -> str:
        """``root_dir/name/version_N`` (``VERSION`` for a str version), then ``sub_dir`` if given; ``~`` and
        ``$VARS`` are expanded."""
        log_dir = super().log_dir
        if self._sub_dir is not None:
            log_dir = os.path.join(log_dir, self._sub_dir)
        return os.path.expanduser(os.path.expandvars(log_dir))

    def _writer_module(self) -> Any:
        # imported by name, on first use: tensorboard is optional and slow to import
        return importlib.import_module("torch.utils.tensorboard" if self._backend == "tensorboard" else "tensorboardX")

    @property
    def sub_dir(self) -> str | None:
        """The folder inside the version folder that the events go to, if any."""
        return self._sub_dir

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` (made with its folder on first use), for what :meth:`log_metrics` does not cover; an
        object doing nothing on other ranks."""
        if not self._is_global_zero():
            return _DummyExperiment()
        if self._experiment is None:
            SummaryWriter = self._writer_module().SummaryWriter
            if _is_remote(self.root_dir):
                _prepare_remote(self.log_dir, self._backend)
            else:
                os.makedirs(self.root_dir or ".", exist_ok=True)
            kwargs = dict(self._kwargs)
            if self._backend == "tensorboardX":
                # tensorboardX names its file after the second and the host only: a second writer in the same
                # folder and second (logging after finalize) would truncate the first one's file
                kwargs.setdefault("filename_suffix", f".{os.getpid()}.{time.monotonic_ns()}")
            self._experiment = SummaryWriter(log_dir=self.log_dir, **kwargs)
            # close (and so flush) the event file when the logger is collected or the interpreter exits
            self._at_exit = weakref.finalize(self, self._experiment.close)
        return self._experiment

    @override
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        """Write each metric as a scalar (a dict value as a group of scalars) at ``step``; ``ValueError`` for a value
        that is not a number, a one-element tensor or a dict of them."""
        if not self._is_global_zero():
            return
        scalars = self._scalars(metrics, "TensorBoardLogger.log_metrics")
        # created outside the `try` below: a writer that cannot be created (a missing package, an unreachable
        # store) must raise its own error, not one that blames the value
        experiment = self.experiment
        for name, value in scalars.items():
            if isinstance(value, dict):
                experiment.add_scalars(name, value, step)
                continue
            try:
                experiment.add_scalar(name, value, step)
            except Exception as err:
                raise ValueError(
                    f"TensorBoardLogger.log_metrics cannot log {name}={value!r} ({type(value).__name__}): log a"
                    " number, a one-element tensor, or a dict of them."
                ) from err

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, metrics: Any = None, step: int | None = None) -> None:
        """Record ``params`` (TensorBoard's HPARAMS tab; nested dicts as ``"outer/inner"``, values other than numbers,
        strings and booleans as text) with ``metrics`` at ``step``: a dict, or one value logged as ``hp_metric``
        (``None``: ``hp_metric = -1`` where ``default_hp_metric``)."""
        if not self._is_global_zero():
            return
        flat = _sanitize(_flatten(vars(params) if isinstance(params, Namespace) else dict(params)))
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, dict):
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        self.log_metrics(metrics, step)
        hparams = importlib.import_module(f"{self._writer_module().__name__}.summary").hparams
        experiment, start, end = hparams(flat, _to_scalars(metrics))
        writer = self.experiment._get_file_writer()
        for summary in (experiment, start, end):
            writer.add_summary(summary, step)

    @override
    def log_graph(self, model: Module, input_array: Tensor | tuple[Tensor, ...] | None = None) -> None:
        """Record the model's graph, traced with ``input_array`` (or ``model.example_input_array``)."""
        if not self._is_global_zero():
            return
        from fabric_lite.wrappers import _unwrap_objects

        input_array = getattr(model, "example_input_array", None) if input_array is None else input_array
        model = _unwrap_objects(model)
        if input_array is None:
            problem = "`model.example_input_array` is not set and no `input_array` was given"
        elif not isinstance(input_array, (Tensor, tuple)):
            problem = f"the example input has type {type(input_array)}, which can't be traced by TensorBoard"
        else:
            before = getattr(model, "_on_before_batch_transfer", None)
            transfer = getattr(model, "_apply_batch_transfer_handler", None)
            if callable(before) and callable(transfer):
                # a LightningModule: its batch hooks prepare the input and move it to its device, as for a batch
                input_array = transfer(before(input_array))
            self.experiment.add_graph(model, input_array)
            return
        warnings.warn(
            f"Could not log computational graph to TensorBoard: {problem}. Pass input_array=<a tensor, or a tuple of"
            " the forward's positional arguments>.",
            UserWarning,
            stacklevel=2,
        )

    @override
    def save(self) -> None:
        """Flush the pending events to disk (rank 0; a no-op before anything was logged)."""
        if self._is_global_zero() and self._experiment is not None:
            self._experiment.flush()

    @override
    def finalize(self, status: str) -> None:
        """Flush and close the event file; logging may go on afterwards, into a new event file."""
        if self._experiment is None:
            return
        self._experiment.flush()
        if self._at_exit is not None:
            self._at_exit()  # closes the writer, once
        self._experiment = None
        self._at_exit = None


def _prepare_remote(log_dir: str, backend: _Backend) -> None:
    """Make tensorboardX write the URL ``log_dir`` through fsspec, by registering its protocol with tensorboardX's
    writer registry: it knows only ``s3://`` and ``gs://`` and would write another URL as a local path
    (``tensorboard`` opens fsspec URLs itself)."""
    if backend != "tensorboardX":
        return
    from tensorboardX import record_writer  # type: ignore[import-untyped,import-not-found,unused-ignore]

    protocol = log_dir.split("://", 1)[0]
    if not isinstance(record_writer.REGISTERED_FACTORIES.get(protocol), _FsspecWriterFactory):
        record_writer.register_writer_factory(protocol, _FsspecWriterFactory())


class _FsspecRecordWriter:
    """An event file on an fsspec URL for tensorboardX: the bytes so far, uploaded whole by every flush."""

    def __init__(self, url: str) -> None:
        self._url = url
        self._buffer = io.BytesIO()
        self.closed = False

    def write(self, data: bytes) -> None:
        self._buffer.write(data)

    def flush(self) -> None:
        fs, fs_path = _filesystem(self._url)
        fs.pipe_file(fs_path, self._buffer.getvalue())

    def close(self) -> None:
        if not self.closed:
            self.flush()
            self.closed = True


class _FsspecWriterFactory:
    """tensorboardX's writer factory interface (``open``, ``directory_check``) over fsspec."""

    def open(self, url: str) -> _FsspecRecordWriter:
        return _FsspecRecordWriter(url)

    def directory_check(self, url: str) -> None:
        if not _is_object_store(url):  # object stores have no folders
            fs, fs_path = _filesystem(url)
            fs.makedirs(fs_path, exist_ok=True)


def _flatten(params: Mapping[Any, Any], parent: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}/{key}" if parent else str(key)
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping) and value:
            flat.update(_flatten(value, name))
        else:
            flat[name] = value
    return flat


def _sanitize(params: dict[str, Any]) -> dict[str, Any]:
    """Values TensorBoard's hparams accept: numbers, strings, booleans, one-element tensors; the rest as text."""
    sanitized: dict[str, Any] = {}
    for name, value in params.items():
        if isinstance(value, enum.Enum):
            value = value.name
        elif callable(value) and hasattr(value, "__name__"):
            value = value.__name__
        if isinstance(value, Tensor) and value.numel() == 1:
            value = value.item()
        sanitized[name] = value if isinstance(value, (bool, int, float, str)) else str(value)
    return sanitized
