"""The one place where fabric_lite talks to ``torch.distributed`` collectives.

Strategies call these helpers with flat lists of tensors (collections are walked once, by the caller, through
:mod:`fabric_lite.utilities._tree`), and with the :class:`CheckedGroup` of the process group, which holds the state
of its checked collectives for as long as the group lives. The modules, each importing only those above it:

* ``ops``: reduce ops, the backends' gaps (gloo's missing ``AVG``, NCCL's missing ``bool``), flat buffers, and the
  plain (unchecked) collectives.
* ``checked``: the checked core: every rank's signature exchanged first, and the mismatch error on every rank; and
  its state, :class:`GroupState` (one process group, the gloo group that carries the checks beside NCCL, and the
  signatures of the calls seen), which each layer above extends in a subclass.
* ``gather``: checked gathers, the differentiable all-gather, and gathers of tensors of different sizes.
* ``broadcasts``: the broadcast's wire format, and broadcasts predicted from the last one (their state:
  ``BroadcastGroup``).
* ``marks``: how a rank without real data in a predicted call is marked (marks, flags) and seen (probes).
* ``predicted``: the optional prediction layer over the checked core, with :class:`CheckedGroup` (the whole state,
  which the strategy holds: the history of agreed calls, cached plans, and whether calls are predicted), and the
  entry points :func:`all_reduce` and :func:`all_gather`, which are the checked core's alone with prediction off
  (debug mode).
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
