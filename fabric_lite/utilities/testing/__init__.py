"""Lightning Fabric's private ``utilities.testing``: :func:`_runif_reasons`, behind litgpt's ``_RunIf``."""

from fabric_lite.utilities.testing._runif import _runif_reasons

__all__ = ["_runif_reasons"]
