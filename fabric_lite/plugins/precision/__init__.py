"""Precision plugins: how a loop computes (full, double; mixed and half precision come next)."""

from fabric_lite.plugins.precision.double import DoublePrecision
from fabric_lite.plugins.precision.precision import Precision

__all__ = ["DoublePrecision", "Precision"]
