"""Skip conditions for tests that need hardware or packages: Lightning Fabric's private
``lightning_fabric.utilities.testing`` (litgpt's ``_RunIf`` test decorator is built on :func:`_runif_reasons`)."""

from fabric_lite.utilities.testing._runif import _runif_reasons

__all__ = ["_runif_reasons"]
