"""Collectives without a process group, in this process (RELIABILITY.md case 12), and the reduce-op parser.

* one device: every collective is the identity (numbers are still converted to tensors), ``all_gather``
  adds no leading dimension (Lightning's documented behaviour), ``barrier`` does nothing;
* several devices before ``launch()``: every collective raises ``RuntimeError`` saying to call ``launch()``;
* :func:`fabric_lite.runtime.collectives.resolve_reduce_op`: every accepted spelling, and the rejections.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, namedtuple
from dataclasses import dataclass
from typing import Any

import pytest
import torch
import torch.distributed as dist

from fabric_lite import Fabric
from fabric_lite.runtime.collectives import resolve_reduce_op
from fabric_lite.strategies import SingleDeviceStrategy
from fabric_lite.utilities.exceptions import InvalidReduceOpError

ReduceOp = dist.ReduceOp
Point = namedtuple("Point", ["x", "y"])


@dataclass
class Stats:
    total: Any
    label: str = "stats"


@pytest.fixture
def single() -> Fabric:
    fabric = Fabric(accelerator="cpu", devices=1)
    assert isinstance(fabric.strategy, SingleDeviceStrategy)
    assert fabric.world_size == 1 and fabric.global_rank == 0
    return fabric


@pytest.fixture
def unlaunched() -> Fabric:
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_spawn")
    assert fabric.world_size == 2
    return fabric


# ---------------------------------------------------------------------------------------------- one device
@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "product", "avg", ReduceOp.SUM, ReduceOp.AVG, None])
def test_single_all_reduce_returns_the_tensor_itself_unchanged(single, op):
    x = torch.tensor([1.5, -2.0])
    out = single.all_reduce(x, reduce_op=op)
    assert out is x
    assert x.tolist() == [1.5, -2.0]


@pytest.mark.parametrize(
    ("value", "dtype"),
    [(3, torch.int32), (-7, torch.int32), (2.5, torch.float32), (True, torch.uint8), (False, torch.uint8)],
)
def test_single_all_reduce_converts_numbers(single, value, dtype):
    out = single.all_reduce(value)
    assert isinstance(out, torch.Tensor)
    assert out.dtype == dtype and out.shape == () and out.item() == value


@pytest.mark.parametrize("value", ["text", None])
def test_single_all_reduce_leaves_other_leaves(single, value):
    assert single.all_reduce(value) is value


def test_single_all_reduce_collection(single):
    t = torch.tensor([1.0, 2.0])
    out = single.all_reduce(
        {"t": t, "n": 4, "p": Point(0.5, "s"), "s": Stats(total=[1, None]), "o": OrderedDict(a=True)},
        reduce_op="sum",
    )
    assert out["t"] is t and t.tolist() == [1.0, 2.0]
    assert out["n"].dtype == torch.int32 and out["n"].item() == 4
    assert type(out["p"]) is Point and out["p"].x.dtype == torch.float32 and out["p"].y == "s"
    assert type(out["s"]) is Stats and out["s"].total[0].dtype == torch.int32 and out["s"].total[1] is None
    assert out["s"].label == "stats"
    assert type(out["o"]) is OrderedDict and out["o"]["a"].dtype == torch.uint8


def test_single_all_gather_adds_no_leading_dimension(single):
    x = torch.arange(6).reshape(2, 3)
    out = single.all_gather(x)
    assert out is x and out.shape == (2, 3)
    assert single.all_gather(x, sync_grads=True) is x


def test_single_all_gather_converts_numbers_without_a_leading_dimension(single):
    out = single.all_gather(3)
    assert out.dtype == torch.int32 and out.shape == () and out.item() == 3
    collection = single.all_gather({"a": [1.5, "x"], "p": Point(torch.zeros(2), None)})
    assert collection["a"][0].dtype == torch.float32 and collection["a"][0].shape == ()
    assert collection["a"][1] == "x"
    assert type(collection["p"]) is Point and collection["p"].x.shape == (2,) and collection["p"].y is None


def test_single_all_gather_sync_grads_keeps_the_graph(single):
    x = torch.ones(2, requires_grad=True)
    out = single.all_gather(x * 3, sync_grads=True)
    out.sum().backward()
    assert x.grad.tolist() == [3.0, 3.0]


@pytest.mark.parametrize(
    "obj",
    [torch.arange(3), {"a": 1}, [1, "x"], None, "text", threading.Lock(), lambda: 1],
    ids=["tensor", "dict", "list", "none", "str", "lock", "lambda"],
)
def test_single_broadcast_returns_the_object(single, obj):
    # nothing is sent, so nothing is pickled: even unpicklable objects come back as they are
    assert single.broadcast(obj) is obj
    assert single.broadcast(obj, src=0) is obj


def test_single_barrier_is_a_no_op(single):
    assert single.barrier() is None
    assert single.barrier("named") is None
    assert not dist.is_initialized()


@pytest.mark.parametrize("all_", [True, False])
@pytest.mark.parametrize("decision", [True, False])
def test_single_reduce_boolean_decision_is_the_decision(single, decision, all_):
    assert single.reduce_boolean_decision(decision, all=all_) is decision
    assert single.strategy.reduce_boolean_decision(decision, all=all_) is decision


def test_single_collectives_start_no_process_group(single):
    single.all_reduce(torch.ones(1))
    single.all_gather(torch.ones(1))
    single.broadcast(1)
    single.barrier()
    single.reduce_boolean_decision(True)
    assert not dist.is_initialized()


# ------------------------------------------------------------------------------------------- before launch()
COLLECTIVES = {
    "all_reduce": lambda f: f.all_reduce(torch.ones(1)),
    "all_reduce_number": lambda f: f.all_reduce(1, reduce_op="sum"),
    "all_gather": lambda f: f.all_gather(torch.ones(1)),
    "broadcast": lambda f: f.broadcast({"a": 1}, src=0),
    "barrier": lambda f: f.barrier(),
    "reduce_boolean_decision": lambda f: f.reduce_boolean_decision(True),
}


@pytest.mark.parametrize("name", list(COLLECTIVES))
def test_collectives_before_launch_raise(unlaunched, name):
    with pytest.raises(RuntimeError, match=r"call fabric\.launch\(\)") as info:
        COLLECTIVES[name](unlaunched)
    assert "world size 2" in str(info.value)
    assert not dist.is_initialized()


def test_parallel_strategy_without_a_process_group_is_the_identity(unlaunched):
    # the strategy itself (below Fabric's launch check) falls back to the identity when no group exists
    strategy = unlaunched.strategy
    x = torch.tensor([1.0, 2.0])
    assert strategy.all_reduce(x, reduce_op="sum") is x and x.tolist() == [1.0, 2.0]
    assert strategy.all_gather(x) is x
    obj = {"k": 1}
    assert strategy.broadcast(obj, src=1) is obj
    assert strategy.barrier() is None
    assert strategy.reduce_boolean_decision(False, all=False) is False
    assert not dist.is_initialized()


def test_parallel_strategy_validates_its_arguments_without_a_process_group(unlaunched):
    with pytest.raises(InvalidReduceOpError, match="'median'"):
        unlaunched.strategy.all_reduce(torch.ones(1), reduce_op="median")
    with pytest.raises(ValueError, match=r"src=2.*0\.\.1"):
        unlaunched.strategy.broadcast(1, src=2)


# ----------------------------------------------------------------------------------------- resolve_reduce_op
ACCEPTED = [
    ("sum", ReduceOp.SUM),
    ("SUM", ReduceOp.SUM),
    ("Sum", ReduceOp.SUM),
    ("mean", "mean"),
    ("MEAN", "mean"),
    ("Mean", "mean"),
    ("avg", "mean"),
    ("AVG", "mean"),
    ("max", ReduceOp.MAX),
    ("MAX", ReduceOp.MAX),
    ("min", ReduceOp.MIN),
    ("Min", ReduceOp.MIN),
    ("product", ReduceOp.PRODUCT),
    ("PRODUCT", ReduceOp.PRODUCT),
    ("prod", ReduceOp.PRODUCT),
    ("Prod", ReduceOp.PRODUCT),
    (ReduceOp.SUM, ReduceOp.SUM),
    (ReduceOp.MAX, ReduceOp.MAX),
    (ReduceOp.MIN, ReduceOp.MIN),
    (ReduceOp.PRODUCT, ReduceOp.PRODUCT),
    (ReduceOp.AVG, "mean"),
    (None, ReduceOp.SUM),  # the seed's sync_ddp contract: no op means sum
]


@pytest.mark.parametrize(("spelling", "expected"), ACCEPTED, ids=[repr(s) for s, _ in ACCEPTED])
def test_resolve_reduce_op_accepts(spelling, expected):
    assert resolve_reduce_op(spelling) == expected


def test_resolve_reduce_op_accepts_a_reduce_op_instance():
    assert resolve_reduce_op(ReduceOp(ReduceOp.MAX)) == ReduceOp.MAX


REJECTED_STRINGS = ["median", "", " sum", "sum ", "average", "mean_", "s-u-m", "ReduceOp.SUM"]


@pytest.mark.parametrize("spelling", REJECTED_STRINGS)
def test_resolve_reduce_op_rejects_unknown_names(spelling):
    with pytest.raises(InvalidReduceOpError) as info:
        resolve_reduce_op(spelling)
    message = str(info.value)
    assert repr(spelling) in message  # the value received
    for choice in ("sum", "mean", "avg", "max", "min", "product", "prod"):
        assert repr(choice) in message  # the choices


REJECTED_TYPES = [3, 1.5, b"sum", ["sum"], object(), torch.tensor(0)]


@pytest.mark.parametrize("value", REJECTED_TYPES, ids=[type(v).__name__ for v in REJECTED_TYPES])
def test_resolve_reduce_op_rejects_other_types(value):
    with pytest.raises(InvalidReduceOpError, match=type(value).__name__):
        resolve_reduce_op(value)


def test_invalid_reduce_op_error_is_a_value_error_and_an_attribute_error():
    # ValueError is the right class; AttributeError is what Lightning raises, so both `except` clauses work
    with pytest.raises(ValueError):
        resolve_reduce_op("median")
    with pytest.raises(AttributeError):
        resolve_reduce_op("median")
