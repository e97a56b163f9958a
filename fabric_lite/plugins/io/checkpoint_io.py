"""The checkpoint IO interface: the last step of ``fabric.save`` and the first of ``fabric.load``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from fabric_lite.utilities.types import _PATH


class CheckpointIO(ABC):
    """Writes, reads and removes checkpoint files for a strategy.

    The strategy turns the state into a plain dict; a ``CheckpointIO`` only decides how it becomes bytes at ``path``
    and back. ``fabric.save`` calls :meth:`save_checkpoint` on global rank 0, ``fabric.load`` :meth:`load_checkpoint`
    on every rank. Strategies that write sharded folders (``FSDPStrategy``) refuse one, as Lightning's do.

    Example::

        class JsonCheckpointIO(CheckpointIO):
            def save_checkpoint(self, checkpoint, path, storage_options=None):
                Path(path).write_text(json.dumps(checkpoint))
            ...  # load_checkpoint and remove_checkpoint likewise
    """

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` (tensors, numbers, strings, containers) to ``path``; ``storage_options`` are the
        caller's, for the plugin to interpret."""

    @abstractmethod
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Return the state :meth:`save_checkpoint` wrote to ``path``; ``map_location`` as for ``torch.load``, and
        ``weights_only=True`` unpickles only tensors and plain values (safe for untrusted files)."""

    @abstractmethod
    def remove_checkpoint(self, path: _PATH) -> None:
        """Delete the checkpoint at ``path`` (nothing happens when there is none)."""

    def teardown(self) -> None:
        """Release what this plugin holds; called by the strategy's ``teardown``. Nothing by default."""
