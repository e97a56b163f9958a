"""The state of one process group's checked core, on one object that lives as long as the group.

torch's ``ProcessGroupWrapper`` keeps its collective fingerprint check on an object around the process group, with a
gloo group beside it; :class:`GroupState` is that shape, and each layer above the checked core adds its own state in a
subclass (``broadcasts``: the predicted broadcasts; ``predicted``: the history of agreed calls and the cached plans,
in :class:`~fabric_lite.utilities._collectives.predicted.CheckedGroup`, the object the strategy holds). So nothing
outlives the group or is shared between two ``Fabric`` objects, and this module imports none of the layers above.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist


class GroupState:
    """A process group and what its checked core keeps: the gloo group that carries the checks beside NCCL, the
    group's backend and world size, and the grouping and signature of the calls it has seen.

    Args:
        group: the process group (``None``: the default group).
        check_group: a gloo group of the same ranks that carries the checks on the host, for NCCL (where a check on
            the device would make the host wait for the GPU twice a call). The data still travel on ``group``, and
            no payload travels with the check.
    """

    __slots__ = ("backend", "calls", "check_group", "group", "world_size")

    def __init__(self, group: Any, *, check_group: Any = None) -> None:
        self.group = group if group is not None else dist.group.WORLD
        # fixed while the group lives, and asked for on every call (the lookups cost microseconds)
        self.backend: str = dist.get_backend(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.check_group = check_group
        # (call, the tensors' dtypes, devices and shapes) -> (their grouping, as indices, and the call's signature)
        self.calls: dict[tuple[Any, ...], tuple[list[list[int]], tuple[int, int, int]]] = {}
