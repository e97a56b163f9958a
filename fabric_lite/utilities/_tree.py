"""Flatten nested collections into leaves and rebuild them: the one definition of the containers every walk over a
user's collection supports. Mappings, lists, tuples, namedtuples and dataclasses (shallow-copied with their fields
written back, so frozen ones work) are containers; anything else, strings and tensors included, is a leaf.
"""

from __future__ import annotations

import copy
import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

from torch import Size, Tensor
from torch.nn import Parameter

# A spec is a tuple whose first item says what the node is. Tuples are cheap to build and to walk.
_LEAF = 0
_DICT = 1  # (kind, type, keys, children, default_factory)
_LIST = 2  # (kind, type, children)
_TUPLE = 3
_NAMEDTUPLE = 4
_DATACLASS = 5  # (kind, instance, field names, children)

_LEAF_SPEC = (_LEAF,)

Spec = tuple[Any, ...]


# Types that are always leaves, checked first by exact type: the walk costs a dict lookup per tensor or number.
_ATOMS = frozenset({Tensor, Parameter, int, float, bool, str, bytes, type(None), complex})


def _flatten_into(obj: Any, leaves: list[Any]) -> Spec:
    cls = type(obj)
    if cls in _ATOMS:
        leaves.append(obj)
        return _LEAF_SPEC
    if cls is dict:
        keys = list(obj)
        return (_DICT, cls, keys, [_flatten_into(obj[k], leaves) for k in keys], None)
    if cls is list:
        return (_LIST, cls, [_flatten_into(x, leaves) for x in obj])
    if cls is tuple:
        return (_TUPLE, cls, [_flatten_into(x, leaves) for x in obj])
    if isinstance(obj, (Tensor, Size)):
        leaves.append(obj)
        return _LEAF_SPEC
    if isinstance(obj, Mapping):
        keys = list(obj.keys())
        factory = obj.default_factory if isinstance(obj, defaultdict) else None
        return (_DICT, cls, keys, [_flatten_into(obj[k], leaves) for k in keys], factory)
    if isinstance(obj, list):
        return (_LIST, cls, [_flatten_into(x, leaves) for x in obj])
    if isinstance(obj, tuple):
        kind = _NAMEDTUPLE if hasattr(obj, "_fields") else _TUPLE
        return (kind, cls, [_flatten_into(x, leaves) for x in obj])
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        names = tuple(f.name for f in dataclasses.fields(obj))
        return (_DATACLASS, obj, names, [_flatten_into(getattr(obj, n), leaves) for n in names])
    leaves.append(obj)
    return _LEAF_SPEC


def flatten(obj: Any) -> tuple[list[Any], Spec]:
    """The leaves of ``obj`` in a stable depth-first order, and a spec to rebuild it."""
    if type(obj) is list and all(type(x) in _ATOMS for x in obj):
        # a flat list of tensors or numbers (what Fabric hands its strategy): no recursion needed
        return list(obj), (_LIST, list, [_LEAF_SPEC] * len(obj))
    leaves: list[Any] = []
    return leaves, _flatten_into(obj, leaves)


def _build(spec: Spec, it: Any) -> Any:
    kind = spec[0]
    if kind == _LEAF:
        return next(it)
    if kind == _DICT:
        _, cls, keys, children, factory = spec
        items = [(k, _build(c, it)) for k, c in zip(keys, children, strict=True)]
        if factory is not None or cls is defaultdict:
            return cls(factory, items)
        try:
            # from a dict, not a list of pairs: Counter and other mappings read a list differently
            return cls(dict(items))
        except TypeError as err:
            raise TypeError(
                f"fabric_lite could not rebuild a mapping of type {cls.__qualname__} from its items ({err})."
                " Use a plain dict, or give the type a constructor that accepts a dict."
            ) from err
    if kind == _LIST:
        _, cls, children = spec
        items = [_build(c, it) for c in children]
        return items if cls is list else cls(items)
    if kind == _TUPLE:
        _, cls, children = spec
        members = tuple(_build(c, it) for c in children)
        return members if cls is tuple else cls(members)
    if kind == _NAMEDTUPLE:
        _, cls, children = spec
        return cls(*(_build(c, it) for c in children))
    # dataclass: copy the original and write the new field values back
    _, instance, names, children = spec
    new = copy.copy(instance)
    for name, child in zip(names, children, strict=True):
        object.__setattr__(new, name, _build(child, it))
    return new


def unflatten(spec: Spec, leaves: list[Any]) -> Any:
    """The collection ``spec`` describes, rebuilt from ``leaves`` (see :func:`flatten`)."""
    return leaves[0] if spec is _LEAF_SPEC else _build(spec, iter(leaves))


def map_leaves(obj: Any, fn: Callable[[Any], Any]) -> Any:
    """``obj`` rebuilt with ``fn`` applied to every leaf."""
    leaves, spec = flatten(obj)
    return unflatten(spec, [fn(leaf) for leaf in leaves])
