"""``module.device`` and ``module.dtype`` for modules, at Lightning Fabric's path.

A plain ``nn.Module`` has no device of its own (its parameters may sit on several, or there are none), so
:class:`_DeviceDtypeModuleMixin` records the device and dtype a module was created under or last moved or cast to.
"""

from __future__ import annotations

from typing import Any, ClassVar

import torch
from torch.nn import Module
from typing_extensions import Self, override


class _DeviceDtypeModuleMixin(Module):
    """An ``nn.Module`` whose ``device`` and ``dtype`` follow its moves and casts, passed on to such modules inside."""

    # TorchScript cannot compile these properties (they return Python-side state): it leaves them out
    __jit_unused_properties__: ClassVar[list[str]] = ["device", "dtype"]

    def __init__(self) -> None:
        super().__init__()
        # where new tensors go now: `with torch.device(...)` and the default dtype decide a new module's place
        self._dtype: str | torch.dtype = torch.get_default_dtype()
        self._device: torch.device = torch.get_default_device()

    @property
    def dtype(self) -> str | torch.dtype:
        """The dtype the module was created under or last cast to."""
        return self._dtype

    @dtype.setter
    def dtype(self, value: str | torch.dtype) -> None:
        raise RuntimeError(
            f"The dtype of a module cannot be set (got {value!r}): cast the module instead, module.to({value!r})."
        )

    @property
    def device(self) -> torch.device:
        """The device the module was created on or last moved to; a CUDA device always with its index."""
        device = self._device
        if device.type == "cuda" and device.index is None:
            return torch.device("cuda", torch.cuda.current_device())
        return device

    def _recorded(
        self, moved: Self, device: torch.device | None = None, dtype: str | torch.dtype | None = None
    ) -> Self:
        """``moved``, with ``device`` and ``dtype`` recorded where given."""
        _update_properties(self, device=device, dtype=dtype)
        return moved

    @override
    def to(self, *args: Any, **kwargs: Any) -> Self:
        """:meth:`torch.nn.Module.to`, recording the device and dtype; the other moves and casts record theirs too."""
        # the arguments as nn.Module.to reads them: a device and a dtype, each given or None
        device, dtype = torch._C._nn._parse_to(*args, **kwargs)[:2]
        return self._recorded(super().to(*args, **kwargs), device=device, dtype=dtype)

    @override
    def cuda(self, device: torch.device | int | None = None) -> Self:
        """:meth:`torch.nn.Module.cuda`, recording the device (the current CUDA device when none is given)."""
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device())
        elif isinstance(device, int):
            device = torch.device("cuda", device)
        return self._recorded(super().cuda(device=device), device=device)

    @override
    def cpu(self) -> Self:
        return self._recorded(super().cpu(), device=torch.device("cpu"))

    @override
    def type(self, dst_type: str | torch.dtype) -> Self:
        return self._recorded(super().type(dst_type=dst_type), dtype=dst_type)

    @override
    def float(self) -> Self:
        return self._recorded(super().float(), dtype=torch.float)

    @override
    def double(self) -> Self:
        return self._recorded(super().double(), dtype=torch.double)

    @override
    def half(self) -> Self:
        return self._recorded(super().half(), dtype=torch.half)


def _update_properties(
    root: Module, device: torch.device | None = None, dtype: str | torch.dtype | None = None
) -> None:
    """Record ``device`` and ``dtype`` (where given) on every :class:`_DeviceDtypeModuleMixin` in ``root``, without
    moving anything."""
    for module in root.modules():
        if not isinstance(module, _DeviceDtypeModuleMixin):
            continue
        if device is not None:
            module._device = device
        if dtype is not None:
            module._dtype = dtype
