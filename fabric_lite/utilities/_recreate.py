"""Re-creating a ``DataLoader`` (or its batch sampler) around another sampler, as ``setup_dataloaders`` does: torch
forbids swapping a loader's sampler. The constructor arguments are recorded (inside :func:`_replace_dunder_methods`,
in Lightning's attribute names, so either library re-creates the other's loaders) or read back from the instance
attributes named like the ``__init__`` parameters.
"""

from __future__ import annotations

import functools
import inspect
import re
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import Any

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, Sampler

from fabric_lite.utilities.enums import LightningEnum
from fabric_lite.utilities.exceptions import MisconfigurationException

# where a recorded object keeps its constructor call (Lightning's attribute names: see the module's docstring)
_ARGS, _KWARGS, _ARG_NAMES, _DEFAULTS = (
    "__pl_saved_args",
    "__pl_saved_kwargs",
    "__pl_saved_arg_names",
    "__pl_saved_default_kwargs",
)
_ATTRS_RECORD = "__pl_attrs_record"
# the bookkeeping of a recorded object while a patched method runs: how deep inside __init__, and which
# attribute call is already being recorded (an overriding __setattr__ calls the base's with another value)
_INIT_DEPTH = "__fabric_lite_init_depth"
_RECORDING = "__fabric_lite_recording"


class _WrapAttrTag(LightningEnum):
    """A recorded attribute call, ``SET`` or ``DEL``; calling the tag with the call's arguments repeats it."""

    SET = "set"
    DEL = "del"

    def __call__(self, *args: Any) -> None:
        if self == _WrapAttrTag.SET:
            setattr(*args)
        else:
            delattr(*args)


def get_all_subclasses(cls: type) -> set[type]:
    """Every direct and indirect subclass of ``cls`` defined so far.

    Example::

        get_all_subclasses(torch.optim.Optimizer)  # {SGD, Adam, AdamW, ...}
    """
    found: set[type] = set()
    pending: list[type] = [cls]
    while pending:
        subclasses: list[type] = pending.pop().__subclasses__()
        for subclass in subclasses:
            if subclass not in found:
                found.add(subclass)
                pending.append(subclass)
    return found


def _recording_init(init: Callable[..., None], store_explicit_arg: str | None) -> Callable[..., None]:
    """``init`` recording its call on the object: the outermost ``__init__`` of a subclass chain is the call to repeat;
    the innermost value of ``store_explicit_arg`` is what the base class received."""
    signature = inspect.signature(init)
    positional = [
        p.name
        for p in signature.parameters.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.name != "self"
    ]
    defaults = {
        p.name: p.default
        for p in signature.parameters.values()
        if p.name != "self" and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD) and p.default is not p.empty
    }

    @functools.wraps(init)
    def wrapper(obj: Any, *args: Any, **kwargs: Any) -> None:
        names = tuple(positional[: len(args)])
        if not hasattr(obj, _ARGS):
            object.__setattr__(obj, _ARGS, args)
            object.__setattr__(obj, _KWARGS, kwargs)
            object.__setattr__(obj, _ARG_NAMES, names)
            unset = {k: v for k, v in defaults.items() if k not in kwargs and k not in names}
            object.__setattr__(obj, _DEFAULTS, unset)
        if store_explicit_arg is not None:
            if store_explicit_arg in names:
                object.__setattr__(obj, f"__{store_explicit_arg}", args[names.index(store_explicit_arg)])
            elif store_explicit_arg in kwargs:
                object.__setattr__(obj, f"__{store_explicit_arg}", kwargs[store_explicit_arg])
        depth = getattr(obj, _INIT_DEPTH, 0)
        object.__setattr__(obj, _INIT_DEPTH, depth + 1)
        try:
            init(obj, *args, **kwargs)
        finally:
            object.__setattr__(obj, _INIT_DEPTH, depth)

    return wrapper


def _recording_attr_method(method: Callable[..., None], tag: _WrapAttrTag) -> Callable[..., None]:
    """``method`` (``__setattr__``/``__delattr__``) recording the calls made after ``__init__``, to repeat on the
    re-created object; only the outermost of a chain of overrides is recorded."""

    @functools.wraps(method)
    def wrapper(obj: Any, *args: Any) -> None:
        outer = getattr(obj, _RECORDING, None)
        first = outer != (args[0], tag)
        object.__setattr__(obj, _RECORDING, (args[0], tag))
        try:
            method(obj, *args)
        finally:
            object.__setattr__(obj, _RECORDING, outer)
        if first and getattr(obj, _INIT_DEPTH, 0) == 0:
            record = getattr(obj, _ATTRS_RECORD, [])
            record.append((args, tag))
            object.__setattr__(obj, _ATTRS_RECORD, record)

    return wrapper


@contextmanager
def _replace_dunder_methods(base_cls: type, store_explicit_arg: str | None = None) -> Iterator[None]:
    """Within the context, objects of ``base_cls`` and its subclasses record their constructor call (and
    ``store_explicit_arg`` as the base class received it) and later attribute calls, for :func:`_update_dataloader`.

    Patches ``__init__``, ``__setattr__`` and ``__delattr__`` on the classes and restores them on exit, also after an
    error. The patch is process-wide: other threads' objects record too meanwhile.
    """
    originals: list[tuple[type, str, Any]] = []
    try:
        for cls in get_all_subclasses(base_cls) | {base_cls}:
            own = cls.__dict__
            if "__init__" in own:
                originals.append((cls, "__init__", own["__init__"]))
                setattr(cls, "__init__", _recording_init(own["__init__"], store_explicit_arg))  # noqa: B010
            for name, tag in (("__setattr__", _WrapAttrTag.SET), ("__delattr__", _WrapAttrTag.DEL)):
                # the base's always: a subclass that overrides neither still needs one recording method in its chain
                if name in own or cls is base_cls:
                    originals.append((cls, name, own.get(name)))
                    setattr(cls, name, _recording_attr_method(getattr(cls, name), tag))
        yield
    finally:
        for cls, name, original in reversed(originals):
            if original is None:
                delattr(cls, name)  # it was inherited: remove the replacement
            else:
                setattr(cls, name, original)


def _replace_value_in_saved_args(
    replace_key: str,
    replace_value: Any,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    default_kwargs: dict[str, Any],
    arg_names: tuple[str, ...],
) -> tuple[bool, tuple[Any, ...], dict[str, Any]]:
    """Put ``replace_value`` in place of the argument ``replace_key`` of a recorded call, in ``args`` where it was
    positional, else in ``kwargs`` (changed in place). Returns ``(found, args, kwargs)``."""
    if replace_key in arg_names:
        index = arg_names.index(replace_key)
        return True, (*args[:index], replace_value, *args[index + 1 :]), kwargs
    if replace_key in kwargs or replace_key in default_kwargs:
        kwargs[replace_key] = replace_value
        return True, args, kwargs
    return False, args, kwargs


def _reinstantiate(original: Any, *args: Any, **kwargs: Any) -> Any:
    """A new object of ``original``'s class from ``args``/``kwargs``, with ``original``'s recorded attribute calls."""
    cls = type(original)
    try:
        result = cls(*args, **kwargs)
    except TypeError as err:
        clash = re.match(r".*__init__\(\) got multiple values .* '(\w+)'", str(err))
        if clash is None:
            raise
        name = clash.group(1)
        raise MisconfigurationException(
            f"The {cls.__name__} implementation has an error where more than one `__init__` argument can be passed"
            f" to its parent's `{name}=...` `__init__` argument: {err}. fabric_lite passes `{name}` again to"
            f" re-create it; filter `{name}` out of the `**kwargs` your `__init__` forwards to its parent (e.g."
            f" `kwargs.pop('{name}', None)`), or pass use_distributed_sampler=False to setup_dataloaders."
        ) from err
    for call_args, tag in getattr(original, _ATTRS_RECORD, []):
        tag(result, *call_args)
    return result


_CUSTOM_BATCH_SAMPLER = (
    "fabric_lite can't inject a (distributed) sampler into your batch sampler {name}: it does not follow"
    " `torch.utils.data.BatchSampler`'s `__init__(sampler, batch_size, drop_last)`. Subclass BatchSampler or"
    " accept those arguments, or pass use_distributed_sampler=False to setup_dataloaders and give your batch sampler"
    " a DistributedSampler yourself."
)


def _resolve_sampler(dataloader: DataLoader[Any], sampler: Sampler[Any] | Iterable[Any]) -> dict[str, Any]:
    """The re-created loader's sampling arguments: ``sampler``, or the custom batch sampler made again around it."""
    batch_sampler = dataloader.batch_sampler
    if batch_sampler is None or type(batch_sampler) is BatchSampler:
        resolved: dict[str, Any] = {"sampler": sampler, "shuffle": False, "batch_sampler": None}
        if batch_sampler is not None and dataloader.batch_size is None:
            # built with batch_sampler=BatchSampler(...): torch leaves batch_size=None, the batching lives there
            resolved.update(batch_size=batch_sampler.batch_size, drop_last=batch_sampler.drop_last)
        return resolved
    cls: type[Any] = type(batch_sampler)
    if hasattr(batch_sampler, _ARGS):
        found, args, kwargs = _replace_value_in_saved_args(
            "sampler",
            sampler,
            getattr(batch_sampler, _ARGS),
            dict(getattr(batch_sampler, _KWARGS)),
            getattr(batch_sampler, _DEFAULTS),
            getattr(batch_sampler, _ARG_NAMES),
        )
        if not found:
            raise TypeError(
                f"Trying to inject a modified sampler into the batch sampler; however, {cls.__qualname__}'s"
                " `__init__` has no argument called `sampler`. Add a `sampler` argument to it, or pass"
                " use_distributed_sampler=False to setup_dataloaders and give it a DistributedSampler yourself."
            )
        new = _reinstantiate(batch_sampler, *args, **kwargs)
    elif hasattr(batch_sampler, "batch_size") and hasattr(batch_sampler, "drop_last"):
        # not recorded, but shaped like a BatchSampler: make it again with BatchSampler's arguments
        try:
            new = cls(sampler, batch_size=batch_sampler.batch_size, drop_last=batch_sampler.drop_last)
        except TypeError as err:
            if not re.match(r".*__init__\(\) (got multiple values|missing \d+ required|got an unexpected)", str(err)):
                raise
            raise TypeError(_CUSTOM_BATCH_SAMPLER.format(name=cls.__qualname__)) from err
    else:
        raise TypeError(_CUSTOM_BATCH_SAMPLER.format(name=cls.__qualname__))
    # DataLoader accepts a batch_sampler only with its defaults for batch_size, shuffle, sampler and drop_last
    return {"sampler": None, "shuffle": False, "batch_sampler": new, "batch_size": 1, "drop_last": False}


def _get_dataloader_init_args_and_kwargs(
    dataloader: DataLoader[Any], sampler: Sampler[Any] | Iterable[Any]
) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``(args, kwargs)`` that make ``dataloader`` again with ``sampler`` (an iterable dataset's loader gets none).

    Raises:
        ValueError: ``dataloader`` is not a ``DataLoader``.
        MisconfigurationException: a required ``__init__`` argument is no instance attribute of the same name.
        TypeError: ``__init__`` does not take an argument that must be passed, or a custom batch sampler cannot be
            made again around ``sampler``.
    """
    if not isinstance(dataloader, DataLoader):
        raise ValueError(
            f"The dataloader {dataloader!r} needs to subclass `torch.utils.data.DataLoader` to get a new sampler."
        )
    recorded = hasattr(dataloader, _ARGS)
    params = dict(inspect.signature(dataloader.__init__).parameters)  # type: ignore[misc]  # the object's own class
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    if takes_kwargs:
        # what **kwargs passes on to DataLoader; a recorded call already has its required arguments
        base = inspect.signature(DataLoader.__init__).parameters
        params.update({k: p for k, p in base.items() if k != "self" and (not recorded or p.default is not p.empty)})
    if recorded:
        args: tuple[Any, ...] = getattr(dataloader, _ARGS)
        kwargs: dict[str, Any] = dict(getattr(dataloader, _KWARGS))
        arg_names: tuple[str, ...] = getattr(dataloader, _ARG_NAMES)
        dataset = kwargs.get("dataset", getattr(dataloader, "__dataset", None))
    else:
        attrs = {k: v for k, v in vars(dataloader).items() if not k.startswith("_")}
        attrs["multiprocessing_context"] = dataloader.multiprocessing_context  # a property, not in vars
        args, arg_names = (), ()
        # `is not`: attributes may be arrays, whose == does not give one truth value
        kwargs = {k: v for k, v in attrs.items() if k in params and (k == "dataset" or params[k].default is not v)}
        dataset = kwargs.get("dataset")
    if isinstance(dataset, IterableDataset):
        kwargs.update(sampler=None, batch_sampler=None)  # an iterable dataset takes no sampler
    else:
        kwargs.update(_resolve_sampler(dataloader, sampler))

    name = type(dataloader).__name__
    required = sorted(
        p.name
        for p in params.values()
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)
        and p.default is p.empty
        and p.name not in kwargs
        and p.name not in arg_names
    )
    if required:
        attributes = ", ".join(f"`self.{arg}`" for arg in required)
        raise MisconfigurationException(
            f"Trying to inject custom `Sampler` into the `{name}` instance: fabric_lite makes the loader again with a"
            f" distributed sampler, but some of its `__init__` arguments are not instance attributes of the same"
            f" name. The missing attributes are {required}. Define {attributes} in your `__init__`, or pass"
            " use_distributed_sampler=False to setup_dataloaders and give the loader a DistributedSampler yourself."
        )
    if not takes_kwargs:
        unaccepted = sorted((set(kwargs) | set(arg_names)) - params.keys())
        if unaccepted:
            raise TypeError(
                f"Trying to inject parameters into the `{name}` instance: its `__init__` does not accept"
                f" {unaccepted}, which fabric_lite passes to make the loader again with a distributed sampler. Add"
                " those arguments to its `__init__` (or accept `**kwargs` and pass them on to DataLoader), or pass"
                " use_distributed_sampler=False to setup_dataloaders."
            )
    return args, kwargs


def _update_dataloader(dataloader: DataLoader[Any], sampler: Sampler[Any] | Iterable[Any]) -> DataLoader[Any]:
    """A new loader of ``dataloader``'s class and settings that draws from ``sampler``; ``dataloader`` is unchanged.

    Raises:
        MisconfigurationException, TypeError: see :func:`_get_dataloader_init_args_and_kwargs`.
    """
    args, kwargs = _get_dataloader_init_args_and_kwargs(dataloader, sampler)
    return _reinstantiate(dataloader, *args, **kwargs)  # type: ignore[no-any-return]
