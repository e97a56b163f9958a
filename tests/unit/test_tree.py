"""Walking nested collections: ``_tree.flatten``/``unflatten``/``map_leaves`` and the public helpers built on
them (``apply_to_collection``, ``convert_to_tensors``, ``move_data_to_device``).

A round trip must rebuild every supported container with its own type (dict, OrderedDict, defaultdict with
its factory, list, tuple, namedtuple, dataclass including frozen ones and ``init=False`` fields, subclasses
of list and dict) and hand back the very same leaf objects. Hypothesis checks it over random nested
structures.
"""

from __future__ import annotations

import dataclasses
import math
from collections import Counter, OrderedDict, defaultdict, namedtuple
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from fabric_lite.utilities import apply_to_collection, convert_to_tensors, move_data_to_device
from fabric_lite.utilities._tree import flatten, map_leaves, unflatten

Point = namedtuple("Point", ["x", "y"])


class Typed(NamedTuple):
    a: Any
    b: Any = None


@dataclass
class Plain:
    a: Any
    b: Any = 1


@dataclass(frozen=True)
class Frozen:
    a: Any
    b: Any


@dataclass
class WithInitFalse:
    x: Any
    derived: Any = field(init=False)

    def __post_init__(self) -> None:
        self.derived = [self.x]


class MyList(list):  # type: ignore[type-arg]
    pass


class MyDict(dict):  # type: ignore[type-arg]
    pass


class FixedMapping(Mapping):  # type: ignore[type-arg]
    """A mapping whose constructor does not take (key, value) pairs."""

    def __init__(self, size: int) -> None:
        self._data = {f"k{i}": i for i in range(size)}

    def __getitem__(self, key: str) -> int:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class Box:
    """A leaf that is not a container: wrapping every leaf in one must not change the structure around it."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


def _is_container(x: Any) -> bool:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return True
    return isinstance(x, (Mapping, list, tuple)) and not isinstance(x, torch.Size)


def assert_same_structure(a: Any, b: Any, leaves_identical: bool = True) -> None:
    """``a`` and ``b`` have the same container types, keys, fields and factories; with ``leaves_identical``
    the leaves are the very same objects (otherwise leaves may differ in anything)."""
    if not _is_container(a) and not leaves_identical:
        return
    assert type(a) is type(b), (a, b)
    if dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_same_structure(getattr(a, f.name), getattr(b, f.name), leaves_identical)
    elif isinstance(a, Mapping):
        assert list(a.keys()) == list(b.keys())
        if isinstance(a, defaultdict):
            assert a.default_factory is b.default_factory
        for k in a:
            assert_same_structure(a[k], b[k], leaves_identical)
    elif isinstance(a, (list, tuple)) and not isinstance(a, torch.Size):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_structure(x, y, leaves_identical)
    elif leaves_identical:
        assert a is b, (a, b)


t1, t2, t3 = torch.tensor([1.0, 2.0]), torch.tensor(3), torch.zeros(2, 2, dtype=torch.float64)

EXAMPLES = {
    "dict": {"a": t1, "b": 2, "c": "s"},
    "ordered_dict": OrderedDict([("z", t1), ("a", 1.5), ("m", None)]),
    "defaultdict": defaultdict(list, {"a": t1, "b": [t2]}),
    "defaultdict_no_factory": defaultdict(None, {"a": t1}),
    "list": [t1, 2, "x", None],
    "tuple": (t1, t2, 3.5),
    "namedtuple": Point(t1, "y"),
    "typed_namedtuple": Typed(t2),
    "dataclass": Plain(a=t1, b=[t2, 4]),
    "frozen_dataclass": Frozen(a=t1, b=(t2, "z")),
    "init_false_dataclass": WithInitFalse(t1),
    "list_subclass": MyList([t1, 2]),
    "dict_subclass": MyDict(a=t1, b=(2,)),
    "empty_dict": {},
    "empty_list": [],
    "empty_tuple": (),
    "empty_namedtuple": namedtuple("Empty", [])(),
    "nested": {
        "batch": [Point(t1, {"deep": (t2, [t3, Plain(a="s", b=Frozen(a=1, b=2.5))])}), OrderedDict(k=None)],
        "meta": defaultdict(int, {"count": 3}),
        "state": WithInitFalse(Typed(t3, b=[1, 2])),
    },
}


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_round_trip_rebuilds_types_and_keeps_leaves(name):
    obj = EXAMPLES[name]
    leaves, spec = flatten(obj)
    rebuilt = unflatten(spec, leaves)
    assert_same_structure(obj, rebuilt)


@pytest.mark.parametrize("name", list(EXAMPLES))
def test_map_leaves_rebuilds_types_and_does_not_mutate(name):
    obj = EXAMPLES[name]
    before_leaves, _ = flatten(obj)
    snapshot = [leaf.clone() if isinstance(leaf, torch.Tensor) else leaf for leaf in before_leaves]
    mapped = map_leaves(obj, Box)
    mapped_leaves, _ = flatten(mapped)
    assert len(mapped_leaves) == len(before_leaves)
    assert all(type(m) is Box and m.value is leaf for m, leaf in zip(mapped_leaves, before_leaves))
    assert_same_structure(obj, mapped, leaves_identical=False)
    assert_same_structure(obj, map_leaves(obj, lambda leaf: leaf))
    # the input keeps its own leaves (dataclasses are copied, not written into)
    after_leaves, _ = flatten(obj)
    assert all(x is y for x, y in zip(after_leaves, before_leaves))
    for leaf, copy in zip(after_leaves, snapshot):
        if isinstance(leaf, torch.Tensor):
            assert torch.equal(leaf, copy)


def test_flatten_order_is_depth_first():
    obj = {"b": [1, (2, 3)], "a": Point(4, {"z": 5, "y": Plain(a=6, b=[7])}), "c": 8}
    leaves, _ = flatten(obj)
    assert leaves == [
        1,
        2,
        3,
        4,
        5,
        6,
        7,
        8,
    ]  # insertion order of dicts, field order of namedtuples/dataclasses


def test_unflatten_takes_new_leaves_in_order():
    obj = {"a": [1, 2], "b": Point(3, Plain(a=4, b=5))}
    leaves, spec = flatten(obj)
    rebuilt = unflatten(spec, [10 * x for x in leaves])
    assert rebuilt == {"a": [10, 20], "b": Point(30, Plain(a=40, b=50))}
    assert type(rebuilt["b"]) is Point and type(rebuilt["b"].y) is Plain


@pytest.mark.parametrize(
    "leaf",
    [
        "text",
        b"bytes",
        {1, 2},
        frozenset({3}),
        torch.Size([2, 3]),
        t1,
        None,
        7,
        2.5,
        np.arange(3),
        range(3),
        Plain,
        Point,
    ],
    ids=lambda v: type(v).__name__,
)
def test_non_containers_are_leaves(leaf):
    leaves, spec = flatten(leaf)
    assert len(leaves) == 1 and leaves[0] is leaf
    assert unflatten(spec, leaves) is leaf


def test_frozen_dataclass_is_rebuilt_and_stays_frozen():
    obj = Frozen(a=1, b=[2, 3])
    out = map_leaves(obj, lambda x: x * 10)
    assert out == Frozen(a=10, b=[20, 30])
    assert obj == Frozen(a=1, b=[2, 3])
    with pytest.raises(dataclasses.FrozenInstanceError):
        out.a = 0  # type: ignore[misc]


def test_init_false_field_is_mapped_and_post_init_does_not_run_again():
    obj = WithInitFalse(1)
    assert obj.derived == [1]
    out = map_leaves(obj, lambda x: x + 10)
    assert out.x == 11
    assert out.derived == [11]  # mapped from [1]; rerunning __post_init__ would also give [11], so:
    obj.derived = [5]
    assert map_leaves(obj, lambda x: x + 10).derived == [15]  # not recomputed from x
    assert obj.x == 1 and obj.derived == [5]


def test_defaultdict_keeps_its_factory():
    out = map_leaves(defaultdict(list, {"a": 1}), lambda x: x + 1)
    assert type(out) is defaultdict and out.default_factory is list
    assert out["a"] == 2
    assert out["missing"] == []


def test_ordered_dict_keeps_its_order():
    obj = OrderedDict([("z", 1), ("a", 2), ("m", 3)])
    out = map_leaves(obj, str)
    assert type(out) is OrderedDict and list(out.items()) == [("z", "1"), ("a", "2"), ("m", "3")]


def test_mapping_that_cannot_be_rebuilt_raises_type_error_naming_it():
    leaves, spec = flatten(FixedMapping(2))
    assert leaves == [0, 1]
    with pytest.raises(TypeError, match="FixedMapping"):
        unflatten(spec, leaves)


def test_torch_return_types_are_rebuilt():
    result = torch.max(torch.tensor([[1.0, 5.0], [3.0, 2.0]]), dim=0)
    out = map_leaves(result, lambda t: t * 2)
    assert type(out) is type(result)
    assert out.values.tolist() == [6.0, 10.0] and out.indices.tolist() == [2, 0]


def test_counter_round_trip():
    obj = Counter(a=1, b=2)
    leaves, spec = flatten(obj)
    assert leaves == [1, 2]
    rebuilt = unflatten(spec, leaves)
    assert type(rebuilt) is Counter and dict(rebuilt) == {"a": 1, "b": 2}


def test_counter_map_leaves():
    assert map_leaves(Counter(a=1, b=2), lambda x: x * 10) == Counter(a=10, b=20)


def test_counter_through_move_data_to_device():
    out = move_data_to_device({"counts": Counter(a=1, b=2)}, "cpu")
    assert out["counts"] == Counter(a=1, b=2)


# --------------------------------------------------------------------------------------- apply_to_collection
def test_apply_to_collection_docstring_example():
    assert apply_to_collection({"a": 1, "b": [2, "x"]}, int, lambda x: x * 10) == {"a": 10, "b": [20, "x"]}


def test_apply_to_collection_only_touches_matching_leaves_and_passes_arguments():
    data = {"t": t1, "n": 2, "p": Point(3.0, "s"), "d": Plain(a=t2, b=None)}
    out = apply_to_collection(data, torch.Tensor, lambda t, k, *, offset: t * k + offset, 2, offset=1)
    assert out["t"].tolist() == [3.0, 5.0] and out["d"].a.item() == 7
    assert out["n"] == 2 and out["p"] == Point(3.0, "s") and out["d"].b is None
    assert type(out["p"]) is Point and type(out["d"]) is Plain
    assert t1.tolist() == [1.0, 2.0]


def test_apply_to_collection_accepts_a_tuple_of_types():
    out = apply_to_collection([1, 2.5, "s", None], (int, float), lambda x: -x)
    assert out == [-1, -2.5, "s", None]


def test_apply_to_collection_on_a_single_leaf():
    assert apply_to_collection(3, int, lambda x: x + 1) == 4
    assert apply_to_collection("s", int, lambda x: x + 1) == "s"


# ---------------------------------------------------------------------------------------- convert_to_tensors
def test_convert_to_tensors_docstring_example():
    out = convert_to_tensors({"n": 3, "x": 0.5}, "cpu")
    assert out["n"].dtype == torch.int32 and out["n"].item() == 3
    assert out["x"].dtype == torch.float32 and out["x"].item() == 0.5


@pytest.mark.parametrize(
    ("value", "dtype"),
    [
        (True, torch.uint8),
        (False, torch.uint8),
        (7, torch.int32),
        (-2, torch.int32),
        (0.25, torch.float32),
        (np.float64(1.5), torch.float32),  # a float subclass, as in Lightning
        (np.arange(3, dtype=np.int16), torch.int16),
        (np.ones(2), torch.float64),
    ],
)
def test_convert_to_tensors_dtypes(value, dtype):
    out = convert_to_tensors(value, torch.device("cpu"))
    assert isinstance(out, torch.Tensor) and out.dtype == dtype
    assert out.tolist() == (value.tolist() if isinstance(value, np.ndarray) else value)


def test_convert_to_tensors_keeps_tensors_and_other_leaves():
    data = {
        "t": t1,
        "s": "s",
        "none": None,
        "p": Point(1, [True, 2.0]),
        "d": Plain(a=3, b=t2),
        "o": OrderedDict(a=1),
        "dd": defaultdict(list, {"x": 1.0}),
    }
    out = convert_to_tensors(data, "cpu")
    assert out["t"] is t1 and out["s"] == "s" and out["none"] is None
    assert type(out["p"]) is Point and out["p"].x.dtype == torch.int32
    assert out["p"].y[0].dtype == torch.uint8 and out["p"].y[1].dtype == torch.float32
    assert type(out["d"]) is Plain and out["d"].a.dtype == torch.int32 and out["d"].b is t2
    assert type(out["o"]) is OrderedDict and type(out["dd"]) is defaultdict and out["dd"].default_factory is list
    assert data["p"] == Point(1, [True, 2.0])  # the input is not modified


# --------------------------------------------------------------------------------------- move_data_to_device
class Movable:
    def __init__(self) -> None:
        self.moved_to: list[torch.device] = []

    def to(self, device: torch.device) -> Movable:
        self.moved_to.append(device)
        return self


class HasToAsClassAttribute:
    @staticmethod
    def to(device: Any) -> Any:
        raise AssertionError("a class must not be moved")


@pytest.mark.parametrize("device", ["cpu", torch.device("cpu")], ids=["str", "device"])
def test_move_data_to_device_keeps_tensors_already_there(device):
    data = {"t": t1, "l": [t2, "s"], "p": Point(t3, None), "d": Frozen(a=t1, b=1)}
    out = move_data_to_device(data, device)
    assert out["t"] is t1 and out["l"][0] is t2 and out["p"].x is t3 and out["d"].a is t1
    assert_same_structure(data, out)
    assert move_data_to_device(t1, device) is t1


def test_move_data_to_device_calls_to_on_objects_but_not_on_classes():
    movable = Movable()
    out = move_data_to_device({"m": movable, "cls": HasToAsClassAttribute, "n": 1}, "cpu")
    assert out["m"] is movable and movable.moved_to == [torch.device("cpu")]
    assert out["cls"] is HasToAsClassAttribute and out["n"] == 1


def test_move_data_to_device_keeps_an_object_whose_to_returns_nothing():
    # a custom batch class whose ``to`` moves in place and forgets ``return self`` stays in the batch (as in Lightning)
    class MovesInPlace:
        def __init__(self) -> None:
            self.moved_to: list[torch.device] = []

        def to(self, device: torch.device) -> None:
            self.moved_to.append(device)

    item = MovesInPlace()
    assert move_data_to_device(item, "cpu") is item
    out = move_data_to_device({"item": item, "t": t1}, torch.device("cpu"))
    assert out["item"] is item and out["t"] is t1 and item.moved_to == [torch.device("cpu")] * 2


def test_move_data_to_device_changes_dtype_never():
    data = [torch.zeros(1, dtype=torch.int16), torch.zeros(1, dtype=torch.bfloat16)]
    out = move_data_to_device(data, "cpu")
    assert [t.dtype for t in out] == [torch.int16, torch.bfloat16]


# ---------------------------------------------------------------------------------------------- property
_tensors = st.builds(
    lambda values, dtype: torch.tensor(values, dtype=dtype),
    st.lists(st.integers(-100, 100), max_size=4),
    st.sampled_from([torch.float32, torch.float64, torch.int32, torch.int64]),
)
_leaves = st.one_of(st.integers(), st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.booleans(), _tensors)
_keys = st.text(max_size=3)


def _containers(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.lists(children, max_size=4).map(MyList),
        st.dictionaries(_keys, children, max_size=4),
        st.dictionaries(_keys, children, max_size=4).map(OrderedDict),
        st.dictionaries(_keys, children, max_size=4).map(lambda d: defaultdict(list, d)),
        st.builds(Point, children, children),
        st.builds(Typed, children, children),
        st.builds(Plain, children, children),
        st.builds(Frozen, children, children),
        st.builds(WithInitFalse, children),
    )


nested = st.recursive(_leaves, _containers, max_leaves=25)


@settings(max_examples=200, deadline=None, database=None)
@given(nested)
def test_property_unflatten_of_flatten_is_the_identity(obj):
    leaves, spec = flatten(obj)
    assert_same_structure(obj, unflatten(spec, leaves))


@settings(max_examples=100, deadline=None, database=None)
@given(nested)
def test_property_map_leaves_maps_every_leaf_once_in_order(obj):
    leaves, _ = flatten(obj)
    boxed = map_leaves(obj, Box)
    boxed_leaves, _ = flatten(boxed)
    assert all(type(b) is Box for b in boxed_leaves)
    assert len(boxed_leaves) == len(leaves) and all(b.value is leaf for b, leaf in zip(boxed_leaves, leaves))
    assert_same_structure(obj, map_leaves(boxed, lambda b: b.value))


_int32 = st.integers(-(2**31), 2**31 - 1)
_convertible = st.recursive(
    st.one_of(_int32, st.floats(allow_nan=True), st.text(max_size=4), st.none(), st.booleans(), _tensors),
    _containers,
    max_leaves=25,
)


@settings(max_examples=100, deadline=None, database=None)
@given(_convertible)
def test_property_convert_to_tensors_keeps_the_structure(obj):
    out = convert_to_tensors(obj, "cpu")
    leaves, _ = flatten(obj)
    converted, _ = flatten(out)
    assert len(leaves) == len(converted)
    assert_same_structure(obj, map_leaves(out, lambda leaf: leaf), leaves_identical=False)
    for before, after in zip(leaves, converted):
        if isinstance(before, torch.Tensor) or not isinstance(before, (bool, int, float)):
            assert after is before
            continue
        if isinstance(before, bool):
            dtype = torch.uint8
        elif isinstance(before, int):
            dtype = torch.int32
        else:
            dtype = torch.float32
        assert isinstance(after, torch.Tensor) and after.dtype == dtype and after.shape == ()
        assert torch.equal(after, torch.tensor(before, dtype=dtype)) or math.isnan(before)
