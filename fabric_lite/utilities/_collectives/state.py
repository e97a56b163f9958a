"""The state of one process group's checked collectives, on one object that lives as long as the group.

torch's ``ProcessGroupWrapper`` keeps its collective fingerprint check on an object around the process group, with a
gloo group beside it; :class:`CheckedGroup` is that shape. The strategy makes one for each process group it runs
collectives on, and drops it when the group is destroyed, so nothing outlives the group or is shared between two
``Fabric`` objects: the history of agreed calls, the cached plans, the gloo group that carries the checks beside
NCCL, the world size, the predicted broadcasts and their counters, and whether calls are predicted at all.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch.distributed as dist

if TYPE_CHECKING:
    from fabric_lite.utilities._collectives.broadcasts import _PredictedBroadcast
    from fabric_lite.utilities._collectives.predicted import _Plan

#: the history's "previous call" before the first one
_START = (0, 0, 0)
_MAX_HISTORY = 256


class _History:
    """The calls every rank of one process group agreed on, as "which call followed which" (see ``predicted``)."""

    __slots__ = ("hits", "last", "next")

    def __init__(self) -> None:
        self.last: tuple[int, int, int] = _START
        self.next: dict[tuple[int, int, int], _Plan] = {}
        self.hits = 0  # calls that took the predicted path and needed nothing else (for tests and benchmarks)

    def predicted(self) -> _Plan | None:
        plan = self.next.get(self.last)
        return plan if plan is not None and plan.predictable else None

    def advance(self, plan: _Plan, hit: bool = False) -> None:
        self.hits += hit
        if len(self.next) >= _MAX_HISTORY and self.last not in self.next:
            self.next.clear()
        self.next[self.last] = plan
        self.last = plan.key

    def forget(self) -> None:
        self.next.clear()
        self.last = _START


class CheckedGroup:
    """A process group and the state of its checked collectives: made by the strategy for each group it runs
    collectives on, and dropped with the group, so that no state outlives the group or is shared between strategies.

    Args:
        group: the process group (``None``: the default group).
        predicting: whether checked calls may be predicted from the history of agreed calls (off in debug mode,
            where every collective takes the fixed exchange of signatures; see ``predicted``).
        check_group: a gloo group of the same ranks that carries the checks on the host, for NCCL (where a check on
            the device would make the host wait for the GPU twice a call). The data still travel on ``group``, and
            no payload travels with the check.

    Example::

        checked = CheckedGroup(None, predicting=not debug)  # the default group
        op = resolve_reduce_op("mean")
        all_reduce([loss], op, checked, torch.device("cpu"), reduce_call(op))  # loss: the ranks' mean, in place
        checked.history.hits  # how many calls so far took the predicted path
    """

    __slots__ = (
        "backend",
        "broadcast_hits",
        "broadcasts",
        "calls",
        "check_group",
        "group",
        "history",
        "plans",
        "predicting",
        "world_size",
    )

    def __init__(self, group: Any, *, predicting: bool = True, check_group: Any = None) -> None:
        self.group = group if group is not None else dist.group.WORLD
        # fixed while the group lives, and asked for on every call (the lookups cost microseconds)
        self.backend: str = dist.get_backend(self.group)
        self.world_size = dist.get_world_size(self.group)
        self.predicting = predicting
        self.check_group = check_group
        self.history = _History()
        # (call, the tensors' dtypes, devices and shapes) -> (their grouping, as indices, and the call's signature)
        self.calls: dict[tuple[Any, ...], tuple[list[list[int]], tuple[int, int, int]]] = {}
        # signature -> the prediction layer's plan of the call
        self.plans: dict[tuple[int, int, int], _Plan] = {}
        # source rank -> the last broadcast from it, which the next one is predicted to be like
        self.broadcasts: dict[int, _PredictedBroadcast] = {}
        self.broadcast_hits = 0  # broadcasts that took the predicted path (for tests and benchmarks)
