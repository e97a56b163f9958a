"""Job functions for tests/distributed/test_collectives_dist.py.

Each job runs on every rank (``spawn_job("tests.helpers.jobs.collectives:suite", nprocs)``) and returns a dict
``{case_name: observation}``. An observation is either :func:`describe` of the value a collective returned,
or a :class:`Raised` record when it raised: every case is caught, so one failing case cannot hide the others,
and the ranks stay in step because every rank runs the same cases in the same order.

The inputs depend on the rank (``rank + 1``, ``arange(3) + 3 * rank``, ...), and the input builders are plain
module-level functions, so the tests compute every expected value exactly from the same builders.
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
from collections import OrderedDict, defaultdict, namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import nn

ReduceOp = dist.ReduceOp

Pair = namedtuple("Pair", ["first", "second"])


@dataclass
class Metrics:
    loss: Any
    count: Any
    name: str = "metrics"


class Raised(NamedTuple):
    """What a case raised: the class name, its bases (for ``isinstance`` checks) and the message."""

    type: str
    mro: tuple[str, ...]
    message: str


def catch(fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except Exception as err:
        return Raised(type(err).__name__, tuple(c.__name__ for c in type(err).__mro__), str(err))


def describe(x: Any) -> Any:
    """A picklable, comparable description of ``x``: container types, dtypes, shapes and exact values."""
    if isinstance(x, torch.Tensor):
        return ("tensor", str(x.dtype).replace("torch.", ""), tuple(x.shape), x.detach().tolist())
    if isinstance(x, tuple) and hasattr(x, "_fields"):
        return ("namedtuple", type(x).__name__, [describe(v) for v in x])
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return (
            "dataclass",
            type(x).__name__,
            [(f.name, describe(getattr(x, f.name))) for f in dataclasses.fields(x)],
        )
    if isinstance(x, Mapping):
        factory = getattr(x, "default_factory", None)
        return (
            "mapping",
            type(x).__name__,
            [(k, describe(v)) for k, v in x.items()],
            getattr(factory, "__name__", None),
        )
    if isinstance(x, (list, tuple)):
        return ("sequence", type(x).__name__, [describe(v) for v in x])
    return ("leaf", type(x).__name__, x)


# ---------------------------------------------------------------------------------------------- inputs
REDUCE_DTYPES = ("float32", "float64", "int32", "int64")
SMALL_DTYPES = ("float16", "bfloat16", "int8", "uint8")
REDUCE_OPS = ("sum", "mean", "max", "min", "product")
# spellings of the same five operations, and what each means
REDUCE_ALIASES: dict[str, tuple[Any, str]] = {
    "SUM": ("SUM", "sum"),
    "Sum": ("Sum", "sum"),
    "ReduceOp.SUM": (ReduceOp.SUM, "sum"),
    "None": (None, "sum"),
    "MEAN": ("MEAN", "mean"),
    "avg": ("avg", "mean"),
    "AVG": ("AVG", "mean"),
    "ReduceOp.AVG": (ReduceOp.AVG, "mean"),
    "MAX": ("MAX", "max"),
    "ReduceOp.MAX": (ReduceOp.MAX, "max"),
    "Min": ("Min", "min"),
    "ReduceOp.MIN": (ReduceOp.MIN, "min"),
    "prod": ("prod", "product"),
    "PRODUCT": ("PRODUCT", "product"),
    "ReduceOp.PRODUCT": (ReduceOp.PRODUCT, "product"),
}
INVALID_OPS: dict[str, Any] = {"average": "average", "empty": "", "int": 3, "float": 1.5}
BROADCAST_DTYPES_OK = (
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "complex64",
    "bool",
    "uint8",
    "int8",
    "int32",
    "int64",
)
# dtypes gloo cannot broadcast as raw tensors; Lightning pickles every object, so they work there
BROADCAST_DTYPES_GLOO_GAP = ("int16", "uint16", "uint32", "uint64")
BOOL_OPS = REDUCE_OPS
SYNC_GRAD_CASES = ("plain", "rank_weighted_loss", "slice_weighted_loss", "collection")


def reduce_input(rank: int) -> list[int]:
    """Per-rank values with negative sums that do not divide evenly, so integer means show truncation."""
    return [rank + 1, -3 * rank - 1, 2 * rank, 5 - rank, -5 if rank == 0 else 0]


def small_input(rank: int) -> list[int]:
    """Non-negative values small enough for int8/uint8 products on three ranks."""
    return [rank + 1, 2 * rank, 3]


def bool_input(rank: int, world_size: int) -> list[bool]:
    return [rank == 0, True, False, rank == world_size - 1]


def broadcast_tensor(src: int, dtype: torch.dtype) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.tensor([True, src % 2 == 1, False])
    return (torch.arange(3) + 2 * src).to(dtype)


def broadcast_object(src: int) -> dict[str, Any]:
    return {
        "src": src,
        "list": [1, "a", None],
        "tuple": (src, 2.5),
        "pair": Pair(src, "p"),
        "metrics": Metrics(loss=0.5 * src, count=src),
    }


def reduce_collection(rank: int) -> dict[str, Any]:
    return {
        "loss": torch.tensor(float(rank + 1)),
        "n": rank + 1,
        "items": [torch.tensor([rank, 2 * rank]), "label", None],
        "pair": Pair(torch.tensor(rank + 1.0), (rank * 1.0, "x")),
        "metrics": Metrics(loss=torch.tensor([rank + 0.5]), count=rank),
        "ordered": OrderedDict([("b", torch.tensor(rank, dtype=torch.float64)), ("a", rank == 0)]),
        "counts": defaultdict(int, {"k": torch.tensor([rank, 1], dtype=torch.int32)}),
    }


def mixed_dtypes(rank: int) -> dict[str, Any]:
    return {
        "f32": torch.tensor(rank + 1.0),
        "f64": torch.tensor(rank + 1.0, dtype=torch.float64),
        "i32": torch.tensor(rank + 1, dtype=torch.int32),
        "i64": torch.tensor(-rank - 1),
    }


def same_dtype_many(rank: int) -> list[torch.Tensor]:
    """Several float32 tensors of different shapes: they travel through one flat buffer."""
    return [
        torch.tensor([rank, rank + 1.0]),
        torch.tensor(10.0 * rank),
        torch.full((2, 2), float(rank)),
        torch.zeros(0),
    ]


def gather_collection(rank: int) -> dict[str, Any]:
    return {
        "a": torch.arange(2) + 2 * rank,
        "b": [rank + 1, "s", None],
        "p": Pair(torch.tensor([rank * 1.0]), 2.5 * rank),
        "m": Metrics(loss=torch.tensor(rank + 0.25), count=rank == 0),
        "o": OrderedDict([("z", torch.tensor([[rank]])), ("y", "keep")]),
    }


def noncontiguous(rank: int) -> torch.Tensor:
    return (torch.arange(6.0).reshape(2, 3) + 6 * rank).t()


# ---------------------------------------------------------------------------------------------- the job
def suite(fabric: Any, seed: int = 0, n_property: int = 50) -> dict[str, Any]:
    """Every collective case, run once on this rank. Cases run in the same order on every rank."""
    obs: dict[str, Any] = {}
    _all_reduce_cases(fabric, obs)
    _all_gather_cases(fabric, obs)
    _broadcast_cases(fabric, obs)
    _sync_cases(fabric, obs)
    if fabric.world_size >= 3:
        _subgroup_cases(fabric, obs)
    obs["property"] = property_cases(fabric, seed, n_property)
    # every error above was raised on every rank in step: a plain collective still works afterwards
    obs["healthy_after_errors"] = catch(lambda: describe(fabric.all_reduce(fabric.global_rank + 1, reduce_op="sum")))
    return obs


def _all_reduce_cases(fabric: Any, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    for dtype in REDUCE_DTYPES:
        for op in REDUCE_OPS:
            obs[f"all_reduce/{dtype}/{op}"] = catch(
                lambda d=dtype, o=op: describe(
                    fabric.all_reduce(torch.tensor(reduce_input(rank), dtype=getattr(torch, d)), reduce_op=o)
                )
            )
    for dtype in SMALL_DTYPES:
        for op in REDUCE_OPS:
            obs[f"all_reduce_small/{dtype}/{op}"] = catch(
                lambda d=dtype, o=op: describe(
                    fabric.all_reduce(torch.tensor(small_input(rank), dtype=getattr(torch, d)), reduce_op=o)
                )
            )
    for label, (spelling, _) in REDUCE_ALIASES.items():
        obs[f"all_reduce_alias/{label}"] = catch(
            lambda s=spelling: describe(
                fabric.all_reduce(torch.tensor(reduce_input(rank), dtype=torch.float32), reduce_op=s)
            )
        )
    for label, spelling in INVALID_OPS.items():
        obs[f"all_reduce_invalid/{label}"] = catch(lambda s=spelling: fabric.all_reduce(torch.tensor(1.0), reduce_op=s))
    for op in BOOL_OPS:
        obs[f"all_reduce_bool/{op}"] = catch(
            lambda o=op: describe(fabric.all_reduce(torch.tensor(bool_input(rank, world)), reduce_op=o))
        )

    obs["all_reduce/default_op"] = catch(lambda: describe(fabric.all_reduce(torch.tensor(float(rank + 1)))))
    obs["all_reduce/python_int_default"] = catch(lambda: describe(fabric.all_reduce(rank + 1)))
    obs["all_reduce/python_int_sum"] = catch(lambda: describe(fabric.all_reduce(rank + 1, reduce_op="sum")))
    obs["all_reduce/python_float_sum"] = catch(lambda: describe(fabric.all_reduce(rank + 0.5, reduce_op="sum")))
    obs["all_reduce/python_bool_sum"] = catch(lambda: describe(fabric.all_reduce(rank == 0, reduce_op="sum")))
    obs["all_reduce/python_bool_max"] = catch(lambda: describe(fabric.all_reduce(rank == 0, reduce_op="max")))
    obs["all_reduce/string_leaf"] = catch(lambda: describe(fabric.all_reduce("text")))
    obs["all_reduce/none_leaf"] = catch(lambda: describe(fabric.all_reduce(None)))

    def in_place() -> Any:
        x = torch.tensor([rank + 1.0, 2.0 * rank])
        out = fabric.all_reduce(x, reduce_op="sum")
        return out is x, describe(x)

    obs["all_reduce/in_place"] = catch(in_place)

    def in_place_collection() -> Any:
        x = torch.tensor(float(rank + 1))
        y = torch.tensor([rank], dtype=torch.int32)
        out = fabric.all_reduce({"x": x, "y": [y]}, reduce_op="sum")
        return out["x"] is x, out["y"][0] is y, describe(x), describe(y)

    obs["all_reduce/in_place_collection"] = catch(in_place_collection)

    def noncontiguous_in_place() -> Any:
        x = noncontiguous(rank)
        out = fabric.all_reduce(x, reduce_op="sum")
        return out is x, x.is_contiguous(), describe(x)

    obs["all_reduce/noncontiguous"] = catch(noncontiguous_in_place)
    obs["all_reduce/collection_sum"] = catch(
        lambda: describe(fabric.all_reduce(reduce_collection(rank), reduce_op="sum"))
    )
    obs["all_reduce/collection_mean"] = catch(lambda: describe(fabric.all_reduce(reduce_collection(rank))))
    obs["all_reduce/same_dtype_many"] = catch(
        lambda: describe(fabric.all_reduce(same_dtype_many(rank), reduce_op="sum"))
    )
    obs["all_reduce/mixed_dtypes_mean"] = catch(lambda: describe(fabric.all_reduce(mixed_dtypes(rank))))
    obs["all_reduce/mixed_dtypes_max"] = catch(lambda: describe(fabric.all_reduce(mixed_dtypes(rank), reduce_op="max")))
    obs["all_reduce/empty_tensor"] = catch(lambda: describe(fabric.all_reduce(torch.zeros(0, 3), reduce_op="sum")))
    obs["all_reduce/strategy_direct"] = catch(
        lambda: describe(fabric.strategy.all_reduce(torch.tensor(float(rank + 1)), reduce_op="sum"))
    )


def _all_gather_cases(fabric: Any, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    obs["all_gather/arange"] = catch(lambda: describe(fabric.all_gather(torch.arange(3) + 3 * rank)))
    for dtype in REDUCE_DTYPES:
        obs[f"all_gather/{dtype}"] = catch(
            lambda d=dtype: describe(fabric.all_gather(torch.tensor(reduce_input(rank), dtype=getattr(torch, d))))
        )
    obs["all_gather/bool_tensor"] = catch(lambda: describe(fabric.all_gather(torch.tensor(bool_input(rank, world)))))
    obs["all_gather/scalar"] = catch(lambda: describe(fabric.all_gather(torch.tensor(2.0 * rank))))
    obs["all_gather/python_int"] = catch(lambda: describe(fabric.all_gather(rank + 1)))
    obs["all_gather/python_float"] = catch(lambda: describe(fabric.all_gather(rank + 0.5)))
    obs["all_gather/python_bool"] = catch(lambda: describe(fabric.all_gather(rank == 0)))
    obs["all_gather/matrix"] = catch(lambda: describe(fabric.all_gather(torch.arange(6).reshape(2, 3) + 6 * rank)))
    obs["all_gather/noncontiguous"] = catch(lambda: describe(fabric.all_gather(noncontiguous(rank))))
    obs["all_gather/empty_tensor"] = catch(lambda: describe(fabric.all_gather(torch.zeros(0, 3))))
    obs["all_gather/collection"] = catch(lambda: describe(fabric.all_gather(gather_collection(rank))))
    obs["all_gather/same_dtype_many"] = catch(lambda: describe(fabric.all_gather(same_dtype_many(rank))))
    obs["all_gather/mixed_dtypes"] = catch(lambda: describe(fabric.all_gather(mixed_dtypes(rank))))
    obs["all_gather/only_strings"] = catch(lambda: describe(fabric.all_gather(["a", None])))

    def not_in_place() -> Any:
        x = torch.arange(3) + 3 * rank
        out = fabric.all_gather(x)
        return out is x, describe(x)

    obs["all_gather/input_untouched"] = catch(not_in_place)

    def without_grad_sync() -> Any:
        x = torch.ones(2, requires_grad=True)
        return fabric.all_gather(x * (rank + 1), sync_grads=False).requires_grad

    obs["all_gather/sync_grads_false_requires_grad"] = catch(without_grad_sync)

    def with_grad_sync(case: str) -> Any:
        x = torch.ones(2, requires_grad=True)
        y = x * (rank + 1)
        tag = None
        if case == "collection":
            collection = fabric.all_gather({"y": y, "tag": "t"}, sync_grads=True)
            gathered, tag = collection["y"], collection["tag"]
        else:
            gathered = fabric.all_gather(y, sync_grads=True)
        if case == "rank_weighted_loss":
            loss = gathered.sum() * (rank + 1)
        elif case == "slice_weighted_loss":
            loss = (gathered * torch.arange(1.0, world + 1).view(world, 1)).sum()
        else:
            loss = gathered.sum()
        requires_grad = gathered.requires_grad
        loss.backward()
        return requires_grad, describe(gathered), describe(x.grad), tag

    for case in SYNC_GRAD_CASES:
        obs[f"all_gather_sync_grads/{case}"] = catch(lambda c=case: with_grad_sync(c))

    # shapes, dtypes or tensor counts that differ across ranks: ValueError on every rank, never a hang
    obs["all_gather_mismatch/shape"] = catch(lambda: fabric.all_gather(torch.zeros(rank + 1)))
    obs["all_gather_mismatch/dtype"] = catch(
        lambda: fabric.all_gather(torch.zeros(2, dtype=torch.float64 if rank % 2 else torch.float32))
    )
    obs["all_gather_mismatch/count"] = catch(lambda: fabric.all_gather([torch.zeros(1)] * (2 if rank == 0 else 1)))
    obs["all_gather_mismatch/in_collection"] = catch(
        lambda: fabric.all_gather({"a": torch.zeros(2), "b": torch.zeros(rank + 1)})
    )
    obs["all_gather_mismatch/sync_grads"] = catch(
        lambda: fabric.all_gather(torch.zeros(rank + 1, requires_grad=True), sync_grads=True)
    )
    obs["all_gather/after_mismatch"] = catch(lambda: describe(fabric.all_gather(torch.tensor([rank]))))

    # the same for all_reduce (always checked: raw gloo aborts on different sizes and returns wrong data on
    # equal sizes with different shapes)
    obs["all_reduce_mismatch/size"] = catch(lambda: fabric.all_reduce(torch.ones(rank + 1), reduce_op="sum"))
    obs["all_reduce_mismatch/shape"] = catch(
        lambda: fabric.all_reduce(torch.ones(2, 3) if rank == 0 else torch.ones(3, 2), reduce_op="sum")
    )
    obs["all_reduce_mismatch/dtype"] = catch(
        lambda: fabric.all_reduce(torch.ones(2, dtype=torch.float64 if rank % 2 else torch.float32), reduce_op="sum")
    )
    obs["all_reduce_mismatch/large"] = catch(lambda: fabric.all_reduce(torch.ones(1000 * (rank + 1)), reduce_op="sum"))
    obs["all_reduce_mismatch/op"] = catch(
        lambda: fabric.all_reduce(torch.ones(2), reduce_op="sum" if rank == 0 else "max")
    )
    obs["all_reduce/after_mismatch"] = catch(lambda: describe(fabric.all_reduce(torch.tensor([rank]), reduce_op="sum")))
    # in debug mode every collective is checked: ranks calling different collectives are named at once
    strategy = fabric.strategy
    strategy.debug_collectives = True
    try:
        obs["debug/barrier_vs_all_reduce"] = catch(
            lambda: fabric.barrier() if rank == 0 else fabric.all_reduce(torch.ones(1))
        )
        obs["debug/broadcast_src"] = catch(lambda: fabric.broadcast(rank, src=rank))
        obs["debug/matching_calls"] = catch(
            lambda: (fabric.barrier(), fabric.broadcast(7, src=world - 1), fabric.reduce_boolean_decision(True))
        )
    finally:
        strategy.debug_collectives = False


def _broadcast_cases(fabric: Any, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    for src in range(world):

        def tensor_from(src: int = src) -> Any:
            # receivers pass None or a tensor of another shape and dtype
            obj = broadcast_tensor(src, torch.float32) if rank == src else (None if rank % 2 else torch.zeros(5, 2))
            out = fabric.broadcast(obj, src=src)
            return (out is obj) if rank == src else None, describe(out)

        obs[f"broadcast/tensor/src{src}"] = catch(tensor_from)

        def object_from(src: int = src) -> Any:
            obj = broadcast_object(src) if rank == src else rank
            out = fabric.broadcast(obj, src=src)
            return (out is obj) if rank == src else None, describe(out)

        obs[f"broadcast/object/src{src}"] = catch(object_from)
        obs[f"broadcast/scalar_tensor/src{src}"] = catch(
            lambda s=src: describe(fabric.broadcast(torch.tensor(7 + s) if rank == s else None, src=s))
        )
        obs[f"broadcast/string/src{src}"] = catch(lambda s=src: fabric.broadcast(f"from {rank}", src=s))
    obs["broadcast/none"] = catch(lambda: describe(fabric.broadcast(None if rank == 0 else "ignored", src=0)))
    obs["broadcast/default_src"] = catch(lambda: fabric.broadcast(rank * 10 + 1))
    obs["broadcast/nine_dims"] = catch(
        lambda: describe(fabric.broadcast(torch.arange(3).reshape((1,) * 8 + (3,)) + 1 if rank == 0 else None))
    )
    obs["broadcast/eight_dims"] = catch(
        lambda: describe(
            fabric.broadcast(
                torch.arange(6).reshape(2, 1, 1, 1, 1, 1, 1, 3) * (rank + 1) if rank == world - 1 else None,
                src=world - 1,
            )
        )
    )
    obs["broadcast/unit_dims"] = catch(
        lambda: describe(
            fabric.broadcast(torch.tensor([[[0.5], [1.5], [2.5]]]) if rank == 0 else torch.zeros(3), src=0)
        )
    )
    obs["broadcast/empty_tensor"] = catch(
        lambda: describe(fabric.broadcast(torch.zeros(0, 3) if rank == 0 else torch.ones(2)))
    )
    obs["broadcast/unpicklable_on_receivers"] = catch(lambda: fabric.broadcast(5 if rank == 0 else (lambda: 1), src=0))
    for name in BROADCAST_DTYPES_OK + BROADCAST_DTYPES_GLOO_GAP:
        src = world - 1
        obs[f"broadcast_dtype/{name}"] = catch(
            lambda n=name, s=src: describe(
                fabric.broadcast(broadcast_tensor(s, getattr(torch, n)) if rank == s else None, src=s)
            )
        )

    def requires_grad_tensor() -> Any:
        obj = torch.ones(2, requires_grad=True) if rank == 0 else None
        out = fabric.broadcast(obj, src=0)
        return type(out).__name__, out.requires_grad, describe(out)

    obs["broadcast/requires_grad"] = catch(requires_grad_tensor)

    def parameter() -> Any:
        obj = nn.Parameter(torch.full((2,), 3.0)) if rank == 0 else None
        out = fabric.broadcast(obj, src=0)
        return type(out).__name__, out.requires_grad, describe(out)

    obs["broadcast/parameter"] = catch(parameter)
    # unpicklable at the source: TypeError on every rank naming the type, the others do not wait forever
    obs["broadcast_unpicklable/lambda"] = catch(
        lambda: fabric.broadcast((lambda: 1) if rank == world - 1 else None, src=world - 1)
    )
    obs["broadcast_unpicklable/lock"] = catch(lambda: fabric.broadcast(threading.Lock() if rank == 0 else None, src=0))
    for label, src in {
        "negative": -1,
        "world_size": world,
        "float": 1.0,
        "string": "0",
        "bool": True,
    }.items():
        obs[f"broadcast_invalid_src/{label}"] = catch(lambda s=src: fabric.broadcast(rank, src=s))


def _typed(value: Any) -> tuple[str, Any]:
    return type(value).__name__, value


def _sync_cases(fabric: Any, obs: dict[str, Any]) -> None:
    rank, world = fabric.global_rank, fabric.world_size
    obs["barrier"] = catch(lambda: fabric.barrier())
    obs["barrier/named"] = catch(lambda: fabric.barrier("checkpoint"))
    decisions = {
        "all_true": True,
        "all_false": False,
        "only_rank0": rank == 0,
        "all_but_last": rank != world - 1,
    }
    for label, decision in decisions.items():
        for all_ in (True, False):
            for via in ("fabric", "strategy"):
                owner = fabric if via == "fabric" else fabric.strategy
                obs[f"reduce_boolean_decision/{via}/{label}/all={all_}"] = catch(
                    lambda o=owner, d=decision, a=all_: _typed(o.reduce_boolean_decision(d, all=a))
                )
    obs["reduce_boolean_decision/default_all/only_rank0"] = catch(lambda: fabric.reduce_boolean_decision(rank == 0))


SUBGROUP = (0, 2)


def _subgroup_cases(fabric: Any, obs: dict[str, Any]) -> None:
    """Collectives over ``new_group([0, 2])``: only the members call them (every rank creates the group)."""
    rank = fabric.global_rank
    group = dist.new_group(list(SUBGROUP))
    whole = dist.new_group(list(range(fabric.world_size)))
    if rank in SUBGROUP:
        obs["subgroup/all_reduce_sum"] = catch(
            lambda: describe(fabric.all_reduce(torch.tensor(rank + 1.0), group=group, reduce_op="sum"))
        )
        obs["subgroup/all_reduce_mean"] = catch(
            lambda: describe(fabric.all_reduce(torch.tensor(rank + 1.0), group=group))
        )
        obs["subgroup/all_reduce_int_mean"] = catch(
            lambda: describe(fabric.all_reduce(torch.tensor(-rank - 1), group=group))
        )
        obs["subgroup/all_reduce_max"] = catch(
            lambda: describe(fabric.all_reduce(torch.tensor([rank, -rank]), group=group, reduce_op="max"))
        )
        obs["subgroup/all_reduce_collection"] = catch(
            lambda: describe(
                fabric.all_reduce({"a": rank + 1, "b": [torch.tensor([rank * 1.0])]}, group=group, reduce_op="sum")
            )
        )
        obs["subgroup/all_gather"] = catch(
            lambda: describe(fabric.all_gather(torch.arange(2) + 10 * rank, group=group))
        )
        obs["subgroup/all_gather_collection"] = catch(
            lambda: describe(fabric.all_gather({"n": rank, "t": (torch.tensor([rank * 1.0]), "s")}, group=group))
        )

        def grads() -> Any:
            x = torch.ones(2, requires_grad=True)
            gathered = fabric.all_gather(x * (rank + 1), group=group, sync_grads=True)
            gathered.sum().backward()
            return describe(gathered), describe(x.grad)

        obs["subgroup/all_gather_sync_grads"] = catch(grads)
        obs["subgroup/all_gather_mismatch"] = catch(lambda: fabric.all_gather(torch.zeros(rank + 1), group=group))
    obs["subgroup/whole_group_sum"] = catch(
        lambda: describe(fabric.all_reduce(torch.tensor(rank + 1.0), group=whole, reduce_op="sum"))
    )
    obs["subgroup/world_after"] = catch(lambda: describe(fabric.all_reduce(torch.tensor(rank + 1.0), reduce_op="sum")))


# ---------------------------------------------------------------------------------------------- property
PROPERTY_DTYPES = (torch.float32, torch.float64, torch.int32, torch.int64)
PROPERTY_OPS: tuple[tuple[str, Any, str], ...] = (
    ("sum", "sum", "sum"),
    ("mean", "mean", "mean"),
    ("max", "max", "max"),
    ("min", "min", "min"),
    ("product", "product", "product"),
    ("avg", "avg", "mean"),
    ("ReduceOp.SUM", ReduceOp.SUM, "sum"),
    ("ReduceOp.MAX", ReduceOp.MAX, "max"),
    ("ReduceOp.AVG", ReduceOp.AVG, "mean"),
    ("PROD", "PROD", "product"),
)


def _skeleton(rng: random.Random, depth: int) -> Any:
    """A rank-independent structure: containers, and leaf specs ("tensor", dtype, shape) / ("int",) / ... ."""
    containers = ("dict", "list", "tuple", "pair", "metrics", "ordered") if depth < 3 else ()
    kinds = ("tensor",) * 4 + ("int", "float", "str", "none") + containers * 2
    kind = rng.choice(kinds)
    if kind == "tensor":
        shape = tuple(rng.choice((0, 1, 2, 3) if rng.random() < 0.1 else (1, 2, 3)) for _ in range(rng.randint(0, 3)))
        return ("tensor", rng.choice(PROPERTY_DTYPES), shape)
    if kind in ("int", "float", "none"):
        return (kind,)
    if kind == "str":
        return ("str", rng.choice(("a", "bb", "", "label")))
    if kind in ("dict", "ordered"):
        return (kind, [(f"k{i}", _skeleton(rng, depth + 1)) for i in range(rng.randint(0, 3))])
    if kind in ("list", "tuple"):
        return (kind, [_skeleton(rng, depth + 1) for _ in range(rng.randint(0, 3))])
    return (kind, [_skeleton(rng, depth + 1) for _ in range(2)])  # pair / metrics: two children


def _fill(skeleton: Any, rng: random.Random) -> Any:
    """Values for one rank. Floats are multiples of 1/4 and integers small, so sums and products are exact."""
    kind = skeleton[0]
    if kind == "tensor":
        _, dtype, shape = skeleton
        n = math.prod(shape)
        if dtype.is_floating_point:
            return torch.tensor([rng.randint(-40, 40) / 4 for _ in range(n)], dtype=dtype).reshape(shape)
        return torch.tensor([rng.randint(-40, 40) for _ in range(n)], dtype=dtype).reshape(shape)
    if kind == "int":
        return rng.randint(-40, 40)
    if kind == "float":
        return rng.randint(-40, 40) / 4
    if kind == "none":
        return None
    if kind == "str":
        return skeleton[1]
    children = [
        _fill(c, rng) for c in (skeleton[1] if kind not in ("dict", "ordered") else [c for _, c in skeleton[1]])
    ]
    if kind == "dict":
        return {k: v for (k, _), v in zip(skeleton[1], children)}
    if kind == "ordered":
        return OrderedDict((k, v) for (k, _), v in zip(skeleton[1], children))
    if kind == "list":
        return children
    if kind == "tuple":
        return tuple(children)
    if kind == "pair":
        return Pair(*children)
    return Metrics(loss=children[0], count=children[1])


def property_input(seed: int, case: int, rank: int) -> tuple[Any, tuple[str, Any, str]]:
    """Case ``case``'s collection on ``rank`` (the structure and the op do not depend on the rank)."""
    shape_rng = random.Random(f"{seed}/{case}")
    skeleton = _skeleton(shape_rng, 0)
    op = shape_rng.choice(PROPERTY_OPS)
    return _fill(skeleton, random.Random(f"{seed}/{case}/{rank}")), op


def _as_tensor(leaf: Any) -> Any:
    """The conversion Lightning documents: int -> int32, float -> float32; other leaves stay as they are."""
    if isinstance(leaf, torch.Tensor):
        return leaf
    if isinstance(leaf, bool):
        return torch.tensor(leaf, dtype=torch.uint8)
    if isinstance(leaf, int):
        return torch.tensor(leaf, dtype=torch.int32)
    if isinstance(leaf, float):
        return torch.tensor(leaf, dtype=torch.float32)
    return leaf


def _combine(per_rank: list[Any], leaf_fn: Callable[[list[Any]], Any]) -> Any:
    """Walk the per-rank copies of one structure in step and combine their leaves with ``leaf_fn``."""
    first = per_rank[0]
    if isinstance(first, tuple) and hasattr(first, "_fields"):
        return type(first)(*(_combine(list(c), leaf_fn) for c in zip(*per_rank)))
    if dataclasses.is_dataclass(first):
        return type(first)(
            **{f.name: _combine([getattr(p, f.name) for p in per_rank], leaf_fn) for f in dataclasses.fields(first)}
        )
    if isinstance(first, Mapping):
        return type(first)((k, _combine([p[k] for p in per_rank], leaf_fn)) for k in first)
    if isinstance(first, (list, tuple)):
        return type(first)(_combine(list(c), leaf_fn) for c in zip(*per_rank))
    return leaf_fn(per_rank)


def reference_reduce(per_rank: list[Any], op: str) -> Any:
    """A single-process reduction of every rank's input, computed exactly with Python numbers."""

    def leaf(values: list[Any]) -> Any:
        tensors = [_as_tensor(v) for v in values]
        if not isinstance(tensors[0], torch.Tensor):
            return values[0]
        dtype, shape = tensors[0].dtype, tensors[0].shape
        columns = list(zip(*(t.reshape(-1).tolist() for t in tensors)))
        world = len(values)
        if op == "mean" and not dtype.is_floating_point:
            out = [math.trunc(Fraction(sum(c)) / world) for c in columns]  # truncated toward zero
        elif op == "mean":
            return (torch.tensor([sum(c) for c in columns], dtype=dtype) / world).reshape(shape)
        else:
            fn = {"sum": sum, "max": max, "min": min, "product": math.prod}[op]
            out = [fn(c) for c in columns]
        return torch.tensor(out, dtype=dtype).reshape(shape)

    return _combine(per_rank, leaf)


def reference_gather(per_rank: list[Any]) -> Any:
    def leaf(values: list[Any]) -> Any:
        tensors = [_as_tensor(v) for v in values]
        return torch.stack(tensors) if isinstance(tensors[0], torch.Tensor) else values[0]

    return _combine(per_rank, leaf)


def property_cases(fabric: Any, seed: int, n_cases: int) -> list[dict[str, Any]]:
    """Random nested collections through ``all_reduce``/``all_gather``, compared with a local reference.

    Every rank regenerates every other rank's input from ``(seed, case, rank)``. Returns, per case, the op and
    whether each result matched; on a mismatch both descriptions are kept for the failure message.
    """
    rank, world = fabric.global_rank, fabric.world_size
    results = []
    for case in range(n_cases):
        inputs = [property_input(seed, case, r)[0] for r in range(world)]
        (label, op, meaning) = property_input(seed, case, rank)[1]
        record: dict[str, Any] = {"op": label, "input": describe(inputs[rank])}
        expected_gather = describe(reference_gather(inputs))
        expected_reduce = describe(reference_reduce(inputs, meaning))
        gathered = catch(lambda c=case: describe(fabric.all_gather(property_input(seed, c, rank)[0])))
        reduced = catch(lambda c=case, o=op: describe(fabric.all_reduce(property_input(seed, c, rank)[0], reduce_op=o)))
        record["gather_ok"] = gathered == expected_gather
        record["reduce_ok"] = reduced == expected_reduce
        if not record["gather_ok"]:
            record["gather"] = (gathered, expected_gather)
        if not record["reduce_ok"]:
            record["reduce"] = (reduced, expected_reduce)
        results.append(record)
    return results


# ---------------------------------------------------------------------------------------------- predicted calls
def predicted(fabric: Any) -> dict[str, Any]:
    """A training loop's collectives, repeated, then every way a predicted call can go wrong (see
    ``fabric_lite.runtime.collectives.predicted``); every value is checked by the test against closed forms."""
    history = fabric.strategy._checked(None).history
    rank, world = fabric.global_rank, fabric.world_size
    obs: dict[str, Any] = {}
    loop = []
    for step in range(6):
        scalar = torch.tensor(float(rank + step))
        metrics = {f"m{i}": torch.full((8,), float(rank * 100 + i + step)) for i in range(64)}
        big = torch.arange(70_000, dtype=torch.float32) * (rank + 1)
        gathered = torch.tensor([[rank, step], [step, rank]], dtype=torch.float64)
        loop.append(
            {
                "sum": describe(fabric.all_reduce(scalar, reduce_op="sum")),
                "mean": {k: v.tolist() for k, v in fabric.all_reduce(metrics, reduce_op="mean").items()},
                "max": fabric.all_reduce(big, reduce_op="max")[[0, 1, 69_999]].tolist(),
                "min": describe(fabric.all_reduce(torch.tensor([float(rank), -float(rank)]), reduce_op="min")),
                "gather": describe(fabric.all_gather(gathered)),
            }
        )
    obs["loop"] = loop
    obs["hits_after_loop"] = history.hits
    # values that look like a rank taking part without data, but are real: the results stand
    obs["nan"] = describe(fabric.all_reduce(torch.tensor(math.nan if rank == 0 else 1.0), reduce_op="sum"))
    for _ in range(2):
        fabric.all_reduce(torch.ones(70_000), reduce_op="max")
    obs["inf_max"] = fabric.all_reduce(torch.full((70_000,), math.inf if rank == world - 1 else 1.0), reduce_op="max")[
        [0, -1]
    ].tolist()
    # a rank that calls something else where a call is predicted: every rank raises, then the loop goes on
    obs["mismatch_shape"] = catch(
        lambda: fabric.all_reduce(torch.tensor(1.0) if rank != 1 else torch.ones(3), reduce_op="sum")
    )
    obs["after_mismatch"] = describe(fabric.all_reduce(torch.tensor(float(rank)), reduce_op="sum"))
    for _ in range(3):  # predicted again
        obs["again"] = describe(fabric.all_reduce(torch.tensor(float(rank)), reduce_op="sum"))
    obs["mismatch_kind"] = catch(
        lambda: (
            fabric.all_gather(torch.tensor(float(rank)))
            if rank == 1
            else fabric.all_reduce(torch.tensor(float(rank)), reduce_op="sum")
        )
    )
    for _ in range(3):
        obs["gather_again"] = describe(fabric.all_gather(torch.tensor([float(rank)] * 3)))
    obs["nan_gather"] = describe(fabric.all_gather(torch.tensor([math.nan if rank == 0 else float(rank)] * 3)))
    obs["mismatch_gather"] = catch(lambda: fabric.all_gather(torch.tensor([float(rank)] * (3 if rank == 0 else 4))))
    for _ in range(3):
        obs["reduce_again"] = describe(fabric.all_reduce(torch.tensor([float(rank)] * 3), reduce_op="sum"))
    obs["mismatch_reduce_op"] = catch(
        lambda: fabric.all_reduce(torch.tensor([float(rank)] * 3), reduce_op="max" if rank == 0 else "sum")
    )
    obs["hits"] = history.hits
    return obs


#: the integer and boolean reductions of :func:`predicted_integers`: (name, dtype, numel, reduce op); 600,000
#: elements (and 70,000 of int64 on 2 ranks) go through the backend's all-reduce, with the flag in a collective of
#: its own (more than _collectives.predicted._LOCAL_REDUCE_BYTES gathered), the others are gathered and reduced locally
INTEGER_CASES = [
    (f"{dtype}-{op}-{numel}", dtype, numel, op)
    for dtype in ("int64", "int32", "bool")
    for numel in (1, 5, 70_000, 600_000)
    for op in ("sum", "mean", "max", "min", "product")
]


def integer_input(dtype: str, numel: int, op: str, rank: int) -> torch.Tensor:
    """Rank-dependent values whose reductions the test computes exactly (products stay small)."""
    if dtype == "bool":
        return (torch.arange(numel) + rank) % 3 == 0
    if op == "product":
        values = (rank + 2) * (1 - 2 * (torch.arange(numel) % 2))
    else:
        values = (torch.arange(numel) % 7 - 3) * (rank + 1) + rank
    return values.to(getattr(torch, dtype))


def predicted_integers(fabric: Any) -> dict[str, Any]:
    """Integer and boolean reductions of every op, small and large, repeated as a loop repeats them (predicted from
    the third round: a flag beside the data marks a rank without real data), then mismatches at predicted calls."""
    history = fabric.strategy._checked(None).history
    rank = fabric.global_rank
    obs: dict[str, Any] = {}
    start = history.hits
    for round in range(4):
        for name, dtype, numel, op in INTEGER_CASES:
            reduced = fabric.all_reduce(integer_input(dtype, numel, op, rank), reduce_op=op)
            obs[f"{round}/{name}"] = describe(reduced[:5])
            obs[f"{round}/{name}/total"] = int(reduced.to(torch.int64).sum())  # every element, not only the first
        # a dict of mixed dtypes: one flagged call
        mixed = {"n": torch.tensor(rank + 1), "ok": torch.tensor(rank == 0), "loss": torch.tensor(0.5 * rank)}
        obs[f"{round}/mixed"] = {k: describe(v) for k, v in fabric.all_reduce(mixed, reduce_op="sum").items()}
        obs[f"{round}/hits"] = history.hits - start
    large = torch.arange(70_000, dtype=torch.int64)
    for _ in range(3):
        fabric.all_reduce(large.clone(), reduce_op="sum")
    # where a large integer sum is predicted: rank 1 reduces floats instead, then another shape, then another op
    obs["mismatch_dtype"] = catch(
        lambda: fabric.all_reduce(large.clone() if rank != 1 else large.float(), reduce_op="sum")
    )
    huge = torch.arange(600_000, dtype=torch.int64)  # 4.8 MB: the backend's all-reduce, then the flag
    for _ in range(3):
        fabric.all_reduce(huge.clone(), reduce_op="sum")
    obs["mismatch_dtype_flag_apart"] = catch(
        lambda: fabric.all_reduce(huge.clone() if rank != 1 else huge.int(), reduce_op="sum")
    )
    for _ in range(3):
        fabric.all_reduce(torch.arange(5), reduce_op="max")
    obs["mismatch_shape"] = catch(lambda: fabric.all_reduce(torch.arange(5 if rank != 1 else 6), reduce_op="max"))
    for _ in range(3):
        fabric.all_reduce(torch.ones(5, dtype=torch.bool), reduce_op="min")
    obs["mismatch_op"] = catch(
        lambda: fabric.all_reduce(torch.ones(5, dtype=torch.bool), reduce_op="min" if rank != 1 else "max")
    )
    # integer max and min are marked in the buffer (the dtype's extremes), not flagged: a real extreme where the probe
    # reads takes the exchange and stands; a rank that calls another op where a large max is predicted is named
    extremes = {"max": torch.iinfo(torch.int64).max, "min": torch.iinfo(torch.int64).min}
    for numel in (5, 600_000):
        for op, extreme in extremes.items():
            for _ in range(2):
                fabric.all_reduce(torch.arange(numel), reduce_op=op)
            real = torch.arange(numel)
            real[0] = extreme if rank == fabric.world_size - 1 else 0
            reduced = fabric.all_reduce(real, reduce_op=op)
            obs[f"extreme/{op}/{numel}"] = [int(reduced[0]), int(reduced[-1])]
    for _ in range(3):
        fabric.all_reduce(huge.clone(), reduce_op="max")
    obs["mismatch_marked_op"] = catch(lambda: fabric.all_reduce(huge.clone(), reduce_op="max" if rank != 1 else "min"))
    for _ in range(3):
        obs["after"] = describe(fabric.all_reduce(torch.tensor([rank, 1]), reduce_op="sum"))
    return obs


def predicted_broadcasts(fabric: Any) -> dict[str, Any]:
    """Broadcasts as a loop makes them (predicted after the first), and every way a prediction can fail: another
    shape, dtype or source, an object, a parameter, a large tensor, a source that cannot pickle."""
    rank, world = fabric.global_rank, fabric.world_size
    obs: dict[str, Any] = {}
    sequence: list[tuple[str, int, Any]] = []
    for step in range(4):
        sequence.append((f"loop{step}", 0, torch.arange(1024, dtype=torch.float32) * (rank + 1) + step))
    sequence += [
        ("other_shape", 0, torch.arange(5, dtype=torch.float32) * (rank + 1)),
        ("other_dtype", 0, torch.arange(5, dtype=torch.int64) * (rank + 1)),
        ("same_again", 0, torch.arange(5, dtype=torch.int64) * (rank + 2)),
        ("other_source", world - 1, torch.arange(5, dtype=torch.int64) * (rank + 3)),
        ("object", 0, {"rank": rank, "values": [rank] * 3}),
        ("after_object", 0, torch.full((2, 3), float(rank))),
        ("after_object_again", 0, torch.full((2, 3), float(rank + 1))),
        ("parameter", 0, torch.nn.Parameter(torch.full((2, 3), float(rank + 2)))),
        ("grad", 0, torch.full((2, 3), float(rank + 3), requires_grad=True)),
        ("large", 0, torch.arange(70_000, dtype=torch.float64) * (rank + 1)),
        ("small_after_large", 0, torch.ones(3) * rank),
        ("empty", 0, torch.empty(0)),
        ("small_after_empty", 0, torch.ones(3) * (rank + 1)),
    ]
    # a tensor like the loop's but not contiguous: predicted and held, copied into the source's reused message
    sequence.insert(4, ("strided", 0, (torch.arange(2048, dtype=torch.float32) * (rank + 1) + 10)[::2]))
    kept = {}
    for name, src, value in sequence:
        received = kept[name] = fabric.broadcast(value, src=src)
        if isinstance(received, torch.Tensor):
            obs[name] = (describe(received[:8] if received.dim() == 1 else received), type(received).__name__,
                         received.requires_grad)  # fmt: skip
        else:
            obs[name] = received
    obs["unpicklable"] = catch(lambda: fabric.broadcast(threading.Lock() if rank == 0 else None, src=0))
    obs["after_error"] = describe(fabric.broadcast(torch.ones(3) * (rank + 5), src=0))
    obs["loop1_later"] = describe(kept["loop1"][:8])  # every received tensor owns its memory
    obs["hits"] = fabric.strategy._checked(None).broadcast_hits
    return obs


def host_checks(fabric: Any) -> dict[str, Any]:
    """The checks on a separate gloo group (what the strategy sets up for NCCL), exercised with gloo data."""
    rank = fabric.global_rank
    world = fabric.strategy._checked(None)
    world.check_group = dist.new_group(backend="gloo")
    obs: dict[str, Any] = {"registered": fabric.strategy._checked(None).check_group is not None}
    obs["small"] = describe(fabric.all_reduce(torch.tensor([1.0, float(rank)]), reduce_op="sum"))
    obs["ints"] = describe(fabric.all_reduce(torch.tensor([rank, 2], dtype=torch.int64), reduce_op="max"))
    obs["dict"] = {k: v.tolist() for k, v in fabric.all_reduce({"a": torch.ones(3), "b": torch.ones(2)}).items()}
    obs["gather"] = describe(fabric.all_gather(torch.tensor([rank, rank + 1])))
    obs["mismatch"] = catch(lambda: fabric.all_reduce(torch.ones(2 + rank), reduce_op="sum"))
    obs["gather_mismatch"] = catch(lambda: fabric.all_gather(torch.ones(1 + rank)))
    fabric.barrier()
    obs["after"] = describe(fabric.all_reduce(torch.tensor(float(rank)), reduce_op="sum"))
    return obs


# ---------------------------------------------------------------------------------------------- per-group state
def _loop(fabric: Any, rank: int) -> list[Any]:
    """One round of a training loop's two collectives (both predictable: a float sum and a float gather)."""
    return [
        describe(fabric.all_reduce(torch.tensor(float(rank)), reduce_op="sum")),
        describe(fabric.all_gather(torch.tensor([float(rank)]))),
    ]


def two_fabrics(fabric: Any) -> dict[str, Any]:
    """This job's Fabric (debug off) and two more over the same process group, set up after it: one with
    ``debug=True``, then one without. Their calls interleave; each keeps the behaviour of its own setting."""
    from tests.helpers.jobs.ddp_toolkit import fabric_with

    rank = fabric.global_rank
    debug = fabric_with(fabric, debug=True)
    later = fabric_with(fabric)
    obs: dict[str, Any] = {"debug": [f.strategy.debug_collectives for f in (fabric, debug, later)]}
    obs["same_state"] = fabric.strategy._checked(None) is debug.strategy._checked(None)
    for round in range(4):
        obs[f"{round}/plain"] = _loop(fabric, rank)
        obs[f"{round}/debug"] = _loop(debug, rank)
    obs["hits"] = [f.strategy._checked(None).history.hits for f in (fabric, debug, later)]
    # the debug Fabric still names ranks that call different collectives at once, and the first one still predicts
    obs["debug_mismatch"] = catch(lambda: debug.barrier() if rank == 0 else debug.all_reduce(torch.ones(1)))
    obs["plain_after"] = _loop(fabric, rank)
    obs["hits_after"] = fabric.strategy._checked(None).history.hits
    return obs


def group_recreated(fabric: Any) -> dict[str, Any]:
    """A loop on a process group, the group destroyed, and the same loop on a new group over the same ranks: the
    new group starts with no history (its first calls are not predicted), whatever address it was given."""
    rank, world = fabric.global_rank, fabric.world_size
    obs: dict[str, Any] = {}
    first = dist.new_group(list(range(world)), backend="gloo")
    for _ in range(4):
        fabric.all_reduce(torch.ones(2), group=first, reduce_op="sum")
    old = fabric.strategy._checked(first)
    obs["first_hits"] = old.history.hits
    dist.destroy_process_group(first)
    second = dist.new_group(list(range(world)), backend="gloo")
    new = fabric.strategy._checked(second)
    obs["new_state"] = new is not old and new.group is second
    obs["new_hits_before"] = new.history.hits
    reduced = [describe(fabric.all_reduce(torch.ones(2) * rank, group=second, reduce_op="sum")) for _ in range(4)]
    obs["reduced"] = reduced
    obs["new_hits"] = new.history.hits
    obs["old_hits"] = old.history.hits
    dist.destroy_process_group(second)
    return obs
