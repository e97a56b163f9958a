"""The checkpoint IO interface: the last step of ``fabric.save`` and the first of ``fabric.load``."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

from fabric_lite.utilities.types import _PATH


class CheckpointIO(ABC):
    """Writes, reads and removes checkpoint files for a strategy.

    The strategy turns modules, optimizers and stateful objects into a plain dict of state dicts; a
    ``CheckpointIO`` only decides how that dict becomes bytes at ``path`` and back. ``fabric.save`` calls
    :meth:`save_checkpoint` on global rank 0 only; ``fabric.load`` calls :meth:`load_checkpoint` on every rank.
    Pass your own through ``Fabric(plugins=[MyCheckpointIO()])`` or a strategy's ``checkpoint_io=`` argument.
    Strategies whose checkpoint is a sharded folder (``FSDPStrategy``) write it themselves and refuse a
    ``CheckpointIO``, as Lightning Fabric's do.

    Example::

        class JsonCheckpointIO(CheckpointIO):
            def save_checkpoint(self, checkpoint, path, storage_options=None):
                Path(path).write_text(json.dumps(checkpoint))

            def load_checkpoint(self, path, map_location=None, weights_only=None):
                return json.loads(Path(path).read_text())

            def remove_checkpoint(self, path):
                Path(path).unlink(missing_ok=True)

        fabric = Fabric(plugins=[JsonCheckpointIO()])
        fabric.save("state.json", {"step": 3})  # written by JsonCheckpointIO.save_checkpoint, on rank 0
    """

    @abstractmethod
    def save_checkpoint(self, checkpoint: dict[str, Any], path: _PATH, storage_options: Any | None = None) -> None:
        """Write ``checkpoint`` (plain state: tensors, numbers, strings, containers) to ``path``.

        Args:
            checkpoint: the state to write.
            path: where to write it.
            storage_options: options of your own for the write (``None`` when the caller gives none).
        """

    @abstractmethod
    def load_checkpoint(
        self, path: _PATH, map_location: Any | None = None, weights_only: bool | None = None
    ) -> dict[str, Any]:
        """Read back the state written by :meth:`save_checkpoint`.

        Args:
            path: the checkpoint to read.
            map_location: where tensors are loaded, as for ``torch.load``.
            weights_only: ``True`` restricts unpickling to tensors and plain values (safe for untrusted files).

        Returns:
            The checkpoint's state.
        """

    @abstractmethod
    def remove_checkpoint(self, path: _PATH) -> None:
        """Delete the checkpoint at ``path`` (nothing happens when there is none)."""

    def teardown(self) -> None:
        """Release what this plugin holds; called by the strategy's ``teardown``. Nothing by default."""
