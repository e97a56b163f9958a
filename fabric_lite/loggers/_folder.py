"""Lightning's folder layout, ``root_dir/name/version_N``, written by global rank 0 only; ``Fabric.launch`` sends rank
0's choice of the next free version to the others (which could see rank 0's new folder and pick the one after)."""

from __future__ import annotations

import os
import weakref
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from typing_extensions import override

from fabric_lite.loggers._metrics import _check_metrics, _to_scalars
from fabric_lite.loggers.logger import Logger
from fabric_lite.utilities._fs import _filesystem, _is_remote, _local_path
from fabric_lite.utilities.logger import _add_prefix
from fabric_lite.utilities.seed import _rank_and_world_size
from fabric_lite.utilities.types import _PATH


class _FolderLogger(Logger):
    """A logger that writes into ``root_dir/name/version`` on global rank 0 (shared by the CSV and TensorBoard
    loggers), through a writer (``_experiment``) created on first use and closed by ``_at_exit`` at the latest."""

    LOGGER_JOIN_CHAR = "-"

    def __init__(self, root_dir: _PATH, name: str | None, version: int | str | None, prefix: str) -> None:
        root = os.fspath(root_dir)
        if _is_remote(root):
            _filesystem(root)  # refuse a protocol without its package now, not at the first logged value
        else:
            root = _local_path(root)  # file:///tmp/logs -> /tmp/logs, which os.makedirs and open understand
        if version is not None and (isinstance(version, bool) or not isinstance(version, (int, str))):
            raise TypeError(
                f"{type(self).__name__}(version={version!r}): the version must be an int (folder `version_N`),"
                " a str (the folder name itself) or None (the next free `version_N`)."
            )
        self._root_dir = root
        self._name = name or ""
        self._version = version
        # a version chosen by scanning the disk must be the same on every rank: see _agree_on_versions
        self._version_is_automatic = version is None
        self._global_rank: int | None = None  # told by Fabric; otherwise torch.distributed's rank, else 0
        self._prefix = prefix
        self._experiment: Any = None
        self._at_exit: weakref.finalize[Any, Any] | None = None

    @property
    @override
    def name(self) -> str:
        """The experiment's name: the folder under :attr:`root_dir` (``""`` puts the versions in it directly)."""
        return self._name

    @property
    @override
    def version(self) -> int | str:
        """The version given to the constructor, else the next free ``version_N`` number (chosen once)."""
        if self._version is None:
            self._version = self._next_version()
        return self._version

    @property
    @override
    def root_dir(self) -> str:
        """The folder that holds every experiment name and version (a ``file://`` root as its local path)."""
        return self._root_dir

    @property
    @override
    def log_dir(self) -> str:
        """``root_dir/name/version_N`` for an int version, ``root_dir/name/VERSION`` for a str version."""
        version = self.version if isinstance(self.version, str) else f"version_{self.version}"
        return os.path.join(self._root_dir, self._name, version)

    def __getstate__(self) -> dict[str, Any]:
        # the subclass's writer (_experiment) and its exit hook (_at_exit) belong to this process; a copy sent to
        # another process starts afresh
        state = self.__dict__.copy()
        state["_experiment"] = None
        state["_at_exit"] = None
        return state

    def _scalars(self, metrics: Mapping[str, Any], caller: str) -> Mapping[str, Any]:
        """``metrics`` checked (:func:`_check_metrics`), as numbers, each name with the prefix in front."""
        _check_metrics(metrics, caller)
        return _add_prefix(_to_scalars(metrics), self._prefix, self.LOGGER_JOIN_CHAR)

    def _is_global_zero(self) -> bool:
        rank = self._global_rank if self._global_rank is not None else _rank_and_world_size()[0]
        return rank == 0

    def _next_version(self) -> int:
        versions_root = os.path.join(self._root_dir, self._name)
        try:
            if _is_remote(versions_root):
                fs, fs_path = _filesystem(versions_root)
                folders = [
                    os.path.basename(str(entry["name"]).rstrip("/"))
                    for entry in fs.ls(fs_path, detail=True)
                    if entry.get("type") == "directory"
                ]
            else:
                folders = [entry.name for entry in os.scandir(versions_root) if entry.is_dir()]
        except (FileNotFoundError, NotADirectoryError):
            return 0
        existing = [
            int(name[len("version_") :])
            for name in folders
            if name.startswith("version_") and name[len("version_") :].isdigit()
        ]
        return max(existing) + 1 if existing else 0


def _attach_rank(loggers: Sequence[Any], global_rank: int) -> None:
    """Tell fabric_lite's own loggers which global rank this process is (only rank 0 writes)."""
    for logger in loggers:
        if isinstance(logger, _FolderLogger):
            logger._global_rank = global_rank


def _agree_on_versions(loggers: Sequence[Any], global_rank: int, broadcast: Callable[[Any], Any]) -> None:
    """Give every rank global rank 0's choice of version for the loggers that pick theirs from the disk.

    ``broadcast`` is a collective, so every rank calls it whatever loggers it holds (often only rank 0 has one); a
    rank takes rank 0's choice for each of its automatic loggers below a folder rank 0 chose for, else keeps its own.
    """
    automatic = [lg for lg in loggers if isinstance(lg, _FolderLogger) and lg._version_is_automatic]
    offer = {_folder_key(lg): lg.version for lg in automatic} if global_rank == 0 else None
    chosen: dict[tuple[str, str, str], Any] = broadcast(offer)
    for logger in automatic:
        key = _folder_key(logger)
        if key in chosen:
            logger._version = chosen[key]


def _folder_key(logger: _FolderLogger) -> tuple[str, str, str]:
    """Which loggers on two ranks are "the same": the same kind, writing below the same folder."""
    root = logger._root_dir
    return (type(logger).__name__, root if _is_remote(root) else os.path.abspath(root), logger._name)
