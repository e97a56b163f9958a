"""The supervision policy every launcher of fabric_lite applies when a rank fails: which failures are the root cause
and which only report that another rank went away."""

from __future__ import annotations

import torch.distributed as dist

#: what an error looks like when it is only the consequence of another rank going away
_SECONDARY_MARKERS = (
    "Connection closed by peer",
    "Connection reset by peer",
    "Broken pipe",
    "Socket Timeout",
    "Timed out waiting",
    "timed out",
    "NCCL communicator was aborted",
    "ProcessGroupNCCL is aborted",
)


def is_secondary(error: BaseException | str) -> bool:
    """Whether an error (or the last line of a traceback) only reports that another rank went away."""
    if isinstance(error, BaseException):
        dist_error = getattr(dist, "DistError", None)
        text = f"{type(error).__name__}: {error}"
        if dist_error is not None and isinstance(error, dist_error) and "timed out" in text.lower():
            return True
    else:
        lines = [line for line in error.strip().splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return any(marker in text for marker in _SECONDARY_MARKERS)
