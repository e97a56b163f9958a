"""Precision plugins: how a loop computes (full, double, mixed and true half precision)."""

from fabric_lite.plugins.precision.amp import MixedPrecision
from fabric_lite.plugins.precision.double import DoublePrecision
from fabric_lite.plugins.precision.fsdp import FSDPPrecision
from fabric_lite.plugins.precision.half import HalfPrecision
from fabric_lite.plugins.precision.precision import Precision

__all__ = ["DoublePrecision", "FSDPPrecision", "HalfPrecision", "MixedPrecision", "Precision"]
