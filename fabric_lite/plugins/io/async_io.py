"""Checkpoints written in a background thread while training goes on (Lightning's ``AsyncCheckpointIO``)."""

from __future__ import annotations

from typing import Any

from typing_extensions import override

from fabric_lite.plugins.io.checkpoint_io import CheckpointIO
from fabric_lite.plugins.io.torch_io import TorchCheckpointIO
from fabric_lite.runtime.checkpoint._async import _BackgroundSave
from fabric_lite.utilities.types import _PATH


class AsyncCheckpointIO(CheckpointIO):
    """Save without waiting for the write: ``fabric.save`` copies the state on the calling thread and returns, and
    ``checkpoint_io`` (default :class:`TorchCheckpointIO`) writes the copy in a background thread.

    One write is in flight at most: the next save, ``fabric.load``, ``teardown`` and the end of ``fabric.launch``
    (or of the script) wait for it. A failed write raises :class:`~fabric_lite.runtime.checkpoint.CheckpointError`
    at the next save or load on every rank, or at the end of ``launch`` (of a script: printed, exit code 1). The
    host copy is kept for the next save. With FSDP and ModelParallel, ``AsyncCheckpointIO()`` without
    ``checkpoint_io`` makes their folders use ``torch.distributed.checkpoint.async_save``.

    Example::

        fabric = Fabric(strategy="ddp", devices=2, plugins=[AsyncCheckpointIO()])
        fabric.save("checkpoints/last.ckpt", state)  # returns once the state is copied
    """

    def __init__(self, checkpoint_io: CheckpointIO | None = None) -> None:
        if checkpoint_io is not None and not isinstance(checkpoint_io, CheckpointIO):
            raise TypeError(
                f"AsyncCheckpointIO(checkpoint_io={checkpoint_io!r}) got a {type(checkpoint_io).__name__}: expected a"
                " fabric_lite.plugins.io.CheckpointIO (e.g. TorchCheckpointIO()), or None for the default."
            )
        if isinstance(checkpoint_io, AsyncCheckpointIO):
            raise TypeError(
                "AsyncCheckpointIO(checkpoint_io=AsyncCheckpointIO(...)): an AsyncCheckpointIO cannot wrap another."
                " Pass the CheckpointIO that writes the files, e.g. AsyncCheckpointIO(TorchCheckpointIO())."
            )
        self._checkpoint_io = checkpoint_io
        self._background = _BackgroundSave()
        self._stager: Any = None  # a torch.distributed.checkpoint DefaultStager, made at the first save

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_stager": None}  # the staging copy stays in this process (spawn pickles plugins)

    @property
    def checkpoint_io(self) -> CheckpointIO | None:
        """The plugin that writes the files in the background (``None``: the default :class:`TorchCheckpointIO`)."""
        return self._checkpoint_io

    @checkpoint_io.setter
    def checkpoint_io(self, checkpoint_io: CheckpointIO) -> None:
        if self._checkpoint_io is None:
            self._checkpoint_io = checkpoint_io

    def _inner(self) -> CheckpointIO:
        if self._checkpoint_io is None:
            self._checkpoint_io = TorchCheckpointIO()
        return self._checkpoint_io

    @property
    def _dcp_stager(self) -> Any:
        """The ``DefaultStager`` (``torch.distributed.checkpoint``) that stages each save's copy; made on first use."""
        if self._stager is None:
            import torch
            from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

            cuda = torch.cuda.is_available() and torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
            self._stager = DefaultStager(
                StagingOptions(
                    use_pinned_memory=cuda, use_shared_memory=False, use_async_staging=False, use_non_blocking_copy=cuda
                )
            )
        return self._stager

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Wait for the previous write, copy ``checkpoint`` and write the copy to ``path`` in the background; raises
        the previous write's ``CheckpointError`` (this checkpoint is then not saved)."""
        self._submit(lambda staged: self._inner().save_checkpoint(staged, path, storage_options), checkpoint, path)

    def _submit(self, write: Any, checkpoint: Any, path: _PATH) -> None:
        """Wait for the previous write (raising its error), stage ``checkpoint``, and ``write`` the copy in a thread."""
        self._background.wait()
        # new host tensors (pinned where CUDA is in use), reused by the next save: only one write may be in flight
        staged = self._dcp_stager.stage(checkpoint)
        self._background.submit(lambda: write(staged), str(path))

    def _run_in_background(self, job: Any, path: _PATH) -> None:
        """Wait for the previous write (raising its error), then run ``job()`` in the background."""
        self._background.submit(job, str(path))

    @override
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Wait for the write in flight, then read ``path`` with the inner plugin."""
        self.wait()
        return self._inner().load_checkpoint(path, map_location=map_location, weights_only=weights_only)

    @override
    def remove_checkpoint(self, path: _PATH) -> None:
        """Wait for the write in flight, then remove ``path`` with the inner plugin."""
        self.wait()
        self._inner().remove_checkpoint(path)

    @property
    def in_flight(self) -> bool:
        """Whether a write is running now."""
        return self._background.in_flight

    def wait(self) -> None:
        """Block until the write in flight is done; ``CheckpointError`` (naming its path) if it failed."""
        self._background.wait()

    def _join(self, timeout: float | None = None) -> bool:
        """Wait up to ``timeout`` seconds for the write in flight, raising nothing; whether it is done."""
        return self._background.join(timeout)

    def _take_error(self) -> Exception | None:
        """The last write's error (cleared once taken), or ``None``."""
        return self._background.take_error()

    @override
    def teardown(self) -> None:
        """Wait for the write in flight (raising its ``CheckpointError``) and release the staging copy."""
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self._checkpoint_io is not None:
                self._checkpoint_io.teardown()
