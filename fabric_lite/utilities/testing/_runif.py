"""The reasons behind Lightning's ``RunIf`` test decorator (and litgpt's ``_RunIf``)."""

from __future__ import annotations

import importlib.util
import os
import sys

import torch

from fabric_lite.accelerators.cuda import num_cuda_devices
from fabric_lite.utilities.imports import _torch_at_least, _version_tuple


def _runif_reasons(
    *,
    min_cuda_gpus: int = 0,
    min_torch: str | None = None,
    max_torch: str | None = None,
    min_python: str | None = None,
    bf16_cuda: bool = False,
    tpu: bool = False,
    mps: bool | None = None,
    skip_windows: bool = False,
    standalone: bool = False,
    deepspeed: bool = False,
    dynamo: bool = False,
    linux_only: bool = False,
) -> tuple[list[str], dict[str, bool]]:
    """Why a test with these requirements must be skipped here (empty: it can run), and the marker keyword arguments a
    conftest filters on (``min_cuda_gpus``, ``tpu``, ``standalone``).

    Each argument is a requirement: ``min_cuda_gpus`` CUDA devices, torch in ``[min_torch, max_torch)``,
    ``min_python``, a bf16 CUDA device, a TPU (never here), MPS present (``mps=True``) or absent (``False``), not
    Windows, ``PL_RUN_STANDALONE_TESTS=1``, DeepSpeed, dynamo support, Linux.

    Example::

        reasons, kwargs = _runif_reasons(min_cuda_gpus=2)
        pytest.mark.skipif(bool(reasons), reason=f"Requires: [{' + '.join(reasons)}]", **kwargs)
    """
    reasons: list[str] = []
    kwargs: dict[str, bool] = {}
    if min_cuda_gpus:
        if num_cuda_devices() < min_cuda_gpus:
            reasons.append(f"GPUs>={min_cuda_gpus}")
        kwargs["min_cuda_gpus"] = True
    if min_torch and not _torch_at_least(min_torch):
        reasons.append(f"torch>={min_torch}, {torch.__version__} installed")
    if max_torch and _torch_at_least(max_torch):
        reasons.append(f"torch<{max_torch}, {torch.__version__} installed")
    if min_python and sys.version_info[:3] < _version_tuple(min_python):
        reasons.append(f"python>={min_python}")
    if bf16_cuda and not (torch.cuda.is_available() and torch.cuda.is_bf16_supported()):
        reasons.append("CUDA device bf16")
    if skip_windows and sys.platform == "win32":
        reasons.append("unimplemented on Windows")
    if tpu:
        reasons.append("TPU")
        kwargs["tpu"] = True
    if mps is not None:
        available = torch.backends.mps.is_available()
        if mps and not available:
            reasons.append("MPS")
        elif not mps and available:
            reasons.append("not MPS")
    if standalone:
        if os.getenv("PL_RUN_STANDALONE_TESTS", "0") != "1":
            reasons.append("Standalone execution")
        kwargs["standalone"] = True
    if deepspeed and importlib.util.find_spec("deepspeed") is None:
        reasons.append("Deepspeed")
    if dynamo:
        from torch._dynamo.eval_frame import is_dynamo_supported

        if not is_dynamo_supported():
            reasons.append("torch.dynamo")
    if linux_only and sys.platform != "linux":
        reasons.append("only linux")
    return reasons, kwargs
