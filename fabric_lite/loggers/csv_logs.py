"""``CSVLogger``: metrics in ``root_dir/name/version_N/metrics.csv``, the file Lightning's CSVLogger writes."""

from __future__ import annotations

import csv
import io
import os
import stat
import tempfile
import warnings
import weakref
from argparse import Namespace
from collections.abc import Sequence
from typing import Any

from typing_extensions import override

from fabric_lite.loggers._folder import _FolderLogger
from fabric_lite.loggers.logger import _DummyExperiment
from fabric_lite.utilities._fs import _filesystem, _is_object_store, _is_remote
from fabric_lite.utilities.types import _PATH


class CSVLogger(_FolderLogger):
    """Log metrics to ``root_dir/name/version/metrics.csv``, as Lightning Fabric's ``CSVLogger`` does.

    One row per :meth:`log_metrics` call: ``step`` and one column per metric name, sorted; a new name adds a column
    (the file is rewritten) and missing values stay empty. Rows are buffered and written every
    ``flush_logs_every_n_steps`` rows, by :meth:`save` and :meth:`finalize`, and at the latest at process exit.
    Only global rank 0 writes; elsewhere every method is a no-op.

    Args:
        root_dir: the folder of every experiment: a path, a ``file://`` URL or an fsspec URL (``s3://bucket/logs``).
        name: the experiment's folder under ``root_dir``; ``None`` or ``""`` puts the versions in ``root_dir``.
        version: an int (folder ``version_N``), a str (the folder's name) or ``None`` for the next free
            ``version_N``, which rank 0 chooses for every rank. A ``metrics.csv`` there is replaced, with a warning.
        prefix: put in front of every metric name, joined with ``"-"``.
        flush_logs_every_n_steps: how many rows to buffer before writing them.

    Example::

        fabric = Fabric(loggers=CSVLogger("logs", name="my_model"))  # logs/my_model/version_0/metrics.csv
    """

    _experiment: _ExperimentWriter | None

    def __init__(
        self,
        root_dir: _PATH,
        name: str | None = "lightning_logs",
        version: int | str | None = None,
        prefix: str = "",
        flush_logs_every_n_steps: int = 100,
    ) -> None:
        super().__init__(root_dir, name, version, prefix)
        if isinstance(flush_logs_every_n_steps, bool) or not isinstance(flush_logs_every_n_steps, int):
            raise TypeError(
                f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps!r}) must be an int >= 1 (e.g. 100)."
            )
        if flush_logs_every_n_steps < 1:
            raise ValueError(
                f"CSVLogger(flush_logs_every_n_steps={flush_logs_every_n_steps}) must be >= 1 (1 writes every row)."
            )
        self._flush_logs_every_n_steps = flush_logs_every_n_steps
        # rows logged since the last row whose step ended a flush period, or since save(): the rows Lightning's
        # CSVLogger would hold in its buffer, whose count is the step it writes for a row logged without one
        self._rows_in_period = 0

    @property
    def experiment(self) -> _ExperimentWriter | _DummyExperiment:
        """The writer of ``metrics.csv`` (made with its folder on first use); an object doing nothing on other ranks."""
        return self._writer() if self._is_global_zero() else _DummyExperiment()

    def _writer(self) -> _ExperimentWriter:
        if self._experiment is None:
            self._experiment = _ExperimentWriter(self.log_dir)
            # flush the buffered rows when the logger is collected or the interpreter exits, if nobody did
            self._at_exit = weakref.finalize(self, self._experiment.save)
        return self._experiment

    @override
    def log_hyperparams(self, params: dict[str, Any] | Namespace, *args: Any, **kwargs: Any) -> None:
        """Not supported, as in Lightning Fabric's ``CSVLogger``: raises ``NotImplementedError`` on rank 0."""
        if not self._is_global_zero():
            return
        raise NotImplementedError(
            "CSVLogger does not record hyperparameters (as in Lightning Fabric). Use TensorBoardLogger for them,"
            " or write them next to the metrics yourself, e.g. json.dump(params, open(os.path.join(logger.log_dir,"
            " 'hparams.json'), 'w'))."
        )

    @override
    def log_metrics(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Add a row: the metrics (one-element tensors as numbers) and ``step``, else Lightning's count of rows since
        the last flush point (which restarts from 0), so pass ``step=`` for a meaningful step column."""
        if not self._is_global_zero():
            return
        row = dict(self._scalars(metrics, "CSVLogger.log_metrics"))
        writer = self._writer()
        if step is None:
            step = self._rows_in_period
        writer.log_metrics(row, step)
        self._rows_in_period += 1
        if (step + 1) % self._flush_logs_every_n_steps == 0:
            self.save()  # a flush point (Lightning's)
        elif len(writer.metrics) >= self._flush_logs_every_n_steps:
            writer.save()  # a full buffer (Lightning's would keep growing); not a flush point for the step count

    @override
    def save(self) -> None:
        """Write the buffered rows to ``metrics.csv`` (rank 0; a no-op before anything was logged)."""
        self._rows_in_period = 0
        if self._is_global_zero() and self._experiment is not None:
            self._experiment.save()

    @override
    def finalize(self, status: str) -> None:
        """Write the buffered rows. Logging may go on afterwards (into the same file)."""
        self.save()


class _ExperimentWriter:
    """Buffers rows and writes them to ``log_dir/metrics.csv``."""

    NAME_METRICS_FILE = "metrics.csv"

    def __init__(self, log_dir: str) -> None:
        self.metrics: list[dict[str, Any]] = []
        self.metrics_keys: list[str] = []
        self.log_dir = log_dir
        self.metrics_file_path = os.path.join(log_dir, self.NAME_METRICS_FILE)
        # a URL: the whole file is kept here and uploaded whole by every save (object stores cannot append)
        remote = _is_remote(log_dir)
        self._remote_text: str | None = "" if remote else None
        self._check_log_dir_exists()
        if not remote:
            os.makedirs(log_dir, exist_ok=True)
        elif not _is_object_store(log_dir):
            fs, fs_path = _filesystem(log_dir)
            fs.makedirs(fs_path, exist_ok=True)

    def _check_log_dir_exists(self) -> None:
        """Warn when the folder holds files already, and remove its ``metrics.csv``: this run's replaces it."""
        if self._remote_text is not None:
            fs, fs_path = _filesystem(self.log_dir)
            occupied = fs.exists(fs_path) and bool(fs.ls(fs_path))
            exists, remove, metrics_file = fs.isfile, fs.rm, f"{fs_path.rstrip('/')}/{self.NAME_METRICS_FILE}"
        else:
            occupied = os.path.isdir(self.log_dir) and bool(os.listdir(self.log_dir))
            exists, remove, metrics_file = os.path.isfile, os.remove, self.metrics_file_path
        if occupied:
            warnings.warn(
                f"Experiment logs directory {self.log_dir} exists and is not empty. Its metrics.csv, if any, is"
                " replaced by this run's. Pass another `version` (or none, for the next free one) to keep it.",
                UserWarning,
                stacklevel=5,
            )
            if exists(metrics_file):
                remove(metrics_file)

    def log_metrics(self, metrics: dict[str, Any], step: int) -> None:
        """Buffer one row."""
        self.metrics.append({**metrics, "step": step})

    def save(self) -> None:
        """Append the buffered rows to the file; when new metric names appeared, rewrite it with the new header."""
        if not self.metrics:
            return
        new_keys = {key for row in self.metrics for key in row} - set(self.metrics_keys)
        self.metrics_keys = sorted([*self.metrics_keys, *new_keys])
        if self._remote_text is not None:
            self._save_remote(bool(new_keys))
            return
        file_exists = os.path.isfile(self.metrics_file_path)
        if new_keys and file_exists:
            self._rewrite_with_new_header(self.metrics_keys, self.metrics)
        else:
            with open(self.metrics_file_path, "a" if file_exists else "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=self.metrics_keys)
                if not file_exists:
                    writer.writeheader()
                writer.writerows(self.metrics)
        self.metrics = []

    def _save_remote(self, new_header: bool) -> None:
        text = io.StringIO(newline="")
        writer = csv.DictWriter(text, fieldnames=self.metrics_keys)
        old_rows = list(csv.DictReader(io.StringIO(self._remote_text or "", newline=""))) if new_header else []
        if new_header or not self._remote_text:
            writer.writeheader()
            writer.writerows(old_rows)
        else:
            text.write(self._remote_text)
        writer.writerows(self.metrics)
        fs, fs_path = _filesystem(self.metrics_file_path)
        fs.pipe_file(fs_path, text.getvalue().encode())  # one upload of the whole file: readers never see half
        self._remote_text = text.getvalue()
        self.metrics = []

    def _rewrite_with_new_header(self, fieldnames: list[str], new_rows: Sequence[dict[str, Any]] = ()) -> None:
        """Rewrite the local file with the header ``fieldnames`` (new columns empty), followed by ``new_rows``."""
        with open(self.metrics_file_path, newline="") as file:
            rows = [*csv.DictReader(file), *new_rows]
        # write a new file and move it over the old one, so that an interruption never leaves half a file
        handle, temporary = tempfile.mkstemp(prefix=".metrics-", suffix=".csv", dir=self.log_dir)
        try:
            os.chmod(temporary, stat.S_IMODE(os.stat(self.metrics_file_path).st_mode))  # mkstemp makes it 0600
            with os.fdopen(handle, "w", newline="") as file:
                writer = csv.DictWriter(file, fieldnames=fieldnames)
                writer.writeheader()
                writer.writerows(rows)
            os.replace(temporary, self.metrics_file_path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
