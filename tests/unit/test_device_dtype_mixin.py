"""``fabric_lite.utilities.device_dtype_mixin``: modules that know their device and dtype, through every move and cast,
and pass them down to every such module inside them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fabric_lite.utilities.device_dtype_mixin import _DeviceDtypeModuleMixin, _update_properties


class _Leaf(_DeviceDtypeModuleMixin):
    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("weight", torch.rand(3, 4))
        self.register_buffer("count", torch.tensor(1))


class _Plain(nn.Module):
    """A plain module between two mixin modules: the properties pass through it."""

    def __init__(self) -> None:
        super().__init__()
        self.leaf = _Leaf()


class _Top(_DeviceDtypeModuleMixin):
    def __init__(self) -> None:
        super().__init__()
        self.plain = _Plain()


def test_a_new_module_takes_the_default_device_and_dtype() -> None:
    top = _Top()
    assert top.device == torch.device("cpu") and top.dtype is torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        with torch.device("cpu"):
            made_under = _Top()
    finally:
        torch.set_default_dtype(previous)
    assert made_under.dtype is torch.float64 and made_under.device == torch.device("cpu")


def test_moves_and_casts_are_recorded_through_plain_modules() -> None:
    top = _Top()
    leaf = top.plain.leaf
    assert top.to(torch.float64) is top
    assert top.dtype is leaf.dtype is torch.float64 and leaf.weight.dtype is torch.float64
    top.to("cpu", dtype=torch.float16, non_blocking=True)
    assert top.device == leaf.device == torch.device("cpu") and leaf.dtype is torch.float16
    assert not hasattr(top.plain, "_device")  # a plain nn.Module gets nothing
    top.float()
    assert leaf.dtype is torch.float32 and leaf.weight.dtype is torch.float32
    top.double()
    assert leaf.dtype is torch.float64
    top.half()
    assert leaf.dtype is torch.float16
    top.cpu()
    assert leaf.device == torch.device("cpu")


def test_type_casts_integer_tensors_too_and_float_casts_do_not() -> None:
    leaf = _Leaf()
    leaf.double()
    assert leaf.count.dtype is torch.int64 and leaf.dtype is torch.float64  # .double() leaves integers alone
    leaf.type(torch.float32)
    assert leaf.count.dtype is torch.float32 and leaf.dtype is torch.float32  # .type() casts every tensor


def test_dtype_cannot_be_set_directly() -> None:
    with pytest.raises(RuntimeError, match=r"module.to\(torch.float64\)"):
        _Leaf().dtype = torch.float64


def test_update_properties_records_without_moving() -> None:
    top = _Top()
    _update_properties(top, device=torch.device("meta"), dtype=torch.float16)
    assert top.device == top.plain.leaf.device == torch.device("meta") and top.plain.leaf.dtype is torch.float16
    assert top.plain.leaf.weight.device == torch.device("cpu")  # nothing moved
    _update_properties(top, dtype=torch.float32)  # what is not given stays
    assert top.device == torch.device("meta") and top.dtype is torch.float32
