"""The one place where fabric_lite calls ``torch.distributed`` collectives.

Strategies pass flat lists of tensors (the caller walks collections once) and the :class:`CheckedGroup` of the process
group, which holds the checked collectives' state for as long as the group lives. Modules, each importing only those
before it: ``ops`` (plain collectives, the backends' gaps), ``checked`` (the signature check), ``gather``,
``broadcasts``, ``marks``, and ``predicted`` (the optional prediction layer, and the entry points :func:`all_reduce` and
:func:`all_gather`).
"""

from fabric_lite.runtime.collectives.broadcasts import broadcast
from fabric_lite.runtime.collectives.checked import CollectiveMismatchError, check_collective
from fabric_lite.runtime.collectives.gather import gather_uneven
from fabric_lite.runtime.collectives.ops import all_reduce_, reduce_boolean_decision, reduce_call, resolve_reduce_op
from fabric_lite.runtime.collectives.predicted import CheckedGroup, all_gather, all_reduce

__all__ = [
    "CheckedGroup",
    "CollectiveMismatchError",
    "all_gather",
    "all_reduce",
    "all_reduce_",
    "broadcast",
    "check_collective",
    "gather_uneven",
    "reduce_boolean_decision",
    "reduce_call",
    "resolve_reduce_op",
]
