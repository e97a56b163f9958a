"""Checkpoints of sharded modules (``FSDPStrategy``'s, ``ModelParallelStrategy``'s) through
``torch.distributed.checkpoint``'s state dict API, which handles DTensor parameters and plain ones alike: :func:`save`
writes a sharded folder or one full file, :func:`load` reads either into any world size. DCP is imported inside the
functions."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.runtime.checkpoint import folders
from fabric_lite.runtime.checkpoint.entries import (
    PRECISION_KEY,
    check_missing,
    load_or_replace,
    pop_precision,
    restore_entries,
    to_state_dicts,
)
from fabric_lite.runtime.checkpoint.files import CheckpointError, atomic_save, safe_load
from fabric_lite.utilities._fs import _filesystem, _is_remote, _local_path
from fabric_lite.utilities.types import _PATH

#: what every rank needs to take part in a save: ``(global_rank, world_size, broadcast)``, a strategy's
Ranks = tuple[int, int, Callable[..., Any]]
#: loads the precision's saved state (a loss scaler's) back into the precision: ``precision.load_state_dict``
LoadPrecision = Callable[[Any], Any]
#: the keys of a module's state that other ranks' modules hold (a pipeline's other stages): not unexpected on load
ForeignKeys = Callable[[Module], "set[str]"]
#: a module's optimizer state made whole for the checkpoint: a pipeline's ranks list every stage's parameters
CompleteGroups = Callable[[Module, dict[str, Any]], dict[str, Any]]


def _none(module: Module) -> set[str]:
    return set()


def _as_is(module: Module, optimizer_state: dict[str, Any]) -> dict[str, Any]:
    return optimizer_state


def save(
    path: _PATH,
    state: dict[str, Any],
    filter: dict[str, Callable[[str, Any], bool]],
    storage_options: dict[str, Any] | None = None,
    *,
    full: bool,
    ranks: Ranks,
    precision_state: dict[str, Any],
    modules: Iterable[Module],
    background: Background | None = None,
    complete_groups: CompleteGroups = _as_is,
) -> None:
    """Save ``state`` as a sharded folder, or as one file gathered on rank 0 (``full``); every rank calls it.
    ``modules``: those the strategy set up, searched for an optimizer's module. With ``background`` the state is copied
    before this returns and written afterwards; a failed write raises at the next save, on every rank.
    ``complete_groups`` gives the parameter groups that the checkpoint stores for an optimizer of a module."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    options = StateDictOptions(full_state_dict=full, cpu_offload=full)
    checkpoint = to_state_dicts(
        state,
        filter,
        lambda module: get_model_state_dict(module, options=options),
        lambda optimizer: _optimizer_state(owner(optimizer, modules, state), optimizer, options, complete_groups),
        precision_state,
    )
    if full:

        def write_file(content: dict[str, Any]) -> None:
            if not _is_remote(path) and Path(_local_path(path)).is_dir():
                raise CheckpointError(
                    f"Cannot save a full checkpoint file to {str(path)!r}: it is a folder. Choose a file path, or"
                    " save a sharded checkpoint (state_dict_type='sharded')."
                )
            atomic_save(content, path, storage_options)

        if background is None:
            folders.on_rank_zero(lambda: write_file(checkpoint), *ranks)
        else:  # rank 0 waits for its previous write (a failure raises on every rank), copies, writes in the back
            folders.on_rank_zero(lambda: background.io._submit(write_file, checkpoint, str(path)), *ranks)
        return
    target = folders._folder(path)
    if background is not None:
        finish = _finisher(checkpoint, state, snapshot=True)
        _save_sharded_async(target, checkpoint, finish, ranks, background, storage_options)
        return
    from torch.distributed.checkpoint.state_dict_saver import save as dcp_save

    def write(temp: folders.Folder) -> str | None:
        try:
            dcp_save(checkpoint, storage_writer=folders.writer(temp, storage_options))
        except folders.dcp_errors() as err:
            return _dcp_failure(err, ranks[0])
        return None

    make_temp = partial(folders.make_temp_folder, target, storage_options)
    folders.save_folder(target, "sharded", make_temp, write, _finisher(checkpoint, state), ranks, storage_options)


def _optimizer_state(module: Module, optimizer: Optimizer, options: Any, complete: CompleteGroups) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    return complete(module, get_optimizer_state_dict(module, optimizer, options=options))


@dataclass
class Background:
    """How a sharding strategy saves in the background: ``io`` runs one write at a time and copies the state
    (:class:`~fabric_lite.plugins.io.AsyncCheckpointIO`), ``group`` is a gloo group of the save's own, and ``tag`` names
    the temporary folder, the same on every rank."""

    io: Any
    group: Any
    tag: str = ""


def load(
    path: _PATH,
    state: Module | Optimizer | dict[str, Any] | None,
    strict: bool,
    weights_only: bool | None,
    *,
    load_precision: LoadPrecision,
    modules: Iterable[Module],
    foreign_keys: ForeignKeys = _none,
) -> dict[str, Any]:
    """Restore ``state`` from a sharded folder or a full file; the precision's saved state goes to ``load_precision``,
    and ``modules`` are as for :func:`save`; a module's ``foreign_keys`` are loaded by other ranks. Raises
    :class:`NotACheckpointError` for a folder without a sharded checkpoint."""
    target = folders._folder(path)
    name = str(target).rsplit("/", 1)[-1]
    if isinstance(target, str):
        fs, fs_path = _filesystem(target)
        is_dir = fs.isdir(fs_path)
    else:
        is_dir = target.is_dir()
    if is_dir or name == folders.METADATA_FILE or name.endswith(".distcp"):
        try:
            folder = folders.check_sharded_checkpoint(target)
        except CheckpointError as err:
            if not is_dir:
                raise
            what = (
                "The given path must be a single file containing the full state dict, or a sharded checkpoint folder"
                if isinstance(state, Module)
                else "Pass a folder that fabric.save wrote with a sharded strategy, or a single file with a full"
                " checkpoint"
            )
            raise NotACheckpointError(
                f"The path {str(path)!r} does not point to a valid checkpoint. {what}: {err}"
            ) from None
        return _load_sharded(folder, state, strict, load_precision, modules, foreign_keys)
    return _load_full(target, state, strict, weights_only, load_precision, modules, foreign_keys)


class NotACheckpointError(CheckpointError, ValueError):
    """A folder to load from that holds no sharded checkpoint: a :class:`CheckpointError`, and the ``ValueError``
    Lightning raises, so ``except`` clauses written for either catch it."""


def check_storage_options(name: str, path: _PATH, storage_options: Any) -> None:
    """Raise ``TypeError`` unless ``storage_options`` is ``None``, or a dict for an fsspec URL ``path`` (``name``: the
    strategy, for the message)."""
    if storage_options is None:
        return
    if not _is_remote(path):
        raise TypeError(
            f"`{name}.save_checkpoint(..., storage_options=...)` is not supported for the local path {str(path)!r}"
            f" (got storage_options={storage_options!r}): storage options are for fsspec URLs (s3://, gs://, ...)."
            " Pass storage_options=None."
        )
    if not isinstance(storage_options, dict):
        raise TypeError(
            f"{name}.save_checkpoint(..., storage_options={storage_options!r}): storage options must be a dict of"
            " arguments for the URL's fsspec filesystem, or None."
        )


def owner(optimizer: Optimizer, modules: Iterable[Module], state: dict[str, Any] | None = None) -> Module:
    """The module whose parameters ``optimizer`` updates (the state dict APIs need both), among the modules of ``state``
    and ``modules``. Raises ``ValueError``, saying how to create the optimizer, where there is none."""
    params = {id(p) for group in optimizer.param_groups for p in group["params"]}
    for module in [m for m in (state or {}).values() if isinstance(m, Module)] + list(modules):
        if any(id(p) in params for p in module.parameters()):
            return module
    raise ValueError(
        f"The {type(optimizer).__name__} optimizer updates no module set up by the strategy, so its sharded state"
        " cannot be saved or loaded. Create it from the parameters of a module returned by fabric.setup_module(model),"
        " and set it up with fabric.setup_optimizers(...)."
    )


def _dcp_failure(err: BaseException, rank: int) -> str:
    # DCP raises the same CheckpointException on every rank when one rank failed; anything else is this rank's
    described = folders.describe(err)
    return described if hasattr(err, "failures") else f"rank {rank}: {described}"


def _finisher(
    checkpoint: dict[str, Any], state: dict[str, Any], snapshot: bool = False
) -> Callable[[folders.Folder], None]:
    """What rank 0 adds to a written folder before publishing it: the index and Lightning's ``meta.pt`` (with
    ``snapshot``, of the plain values as they are now, for a folder finished later)."""
    modules = [key for key, obj in state.items() if isinstance(obj, Module)]
    optimizers = [key for key, obj in state.items() if isinstance(obj, Optimizer)]
    plain = {k: v for k, v in checkpoint.items() if k not in modules and k not in optimizers}
    plain.pop(PRECISION_KEY, None)
    if snapshot:
        plain = copy.deepcopy(plain)

    def finish(temp: folders.Folder) -> None:
        folders.write_index(temp, modules=sorted(modules), optimizers=sorted(optimizers))
        folders.write_lightning_metadata(temp, plain)  # so that Lightning Fabric loads this folder too

    return finish


def _save_sharded_async(
    target: folders.Folder,
    checkpoint: dict[str, Any],
    finish: Callable[[folders.Folder], None],
    ranks: Ranks,
    background: Background,
    storage_options: dict[str, Any] | None,
) -> None:
    """The sharded write of :func:`save` with DCP's ``async_save``. In the foreground every rank waits for the previous
    write, checks the target, names the temporary folder by the tag (no collective) and copies the state; in the
    background DCP writes, then the ranks agree and rank 0 publishes, on the background's own group."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict_saver import async_save

    io, group = background.io, background.group
    io.wait()  # the outcome of the previous write is the same on every rank: it was agreed on in the background
    # every rank checks the target itself (a sharded checkpoint's folder is on a filesystem every rank shares)
    temp = folders.planned_temp_folder(target, background.tag, storage_options, sweep=ranks[0] == 0)
    future: Any = None  # with a stager that copies at once, async_save returns the write's Future
    try:
        future = async_save(
            checkpoint,
            storage_writer=folders.writer(temp, storage_options),
            process_group=group,
            async_stager=io._dcp_stager,
        )
        error: str | None = None
    except folders.dcp_errors() as err:  # staging failed on this rank: the others learn it in the agreement
        future, error = None, _dcp_failure(err, ranks[0])

    def group_broadcast(obj: Any, src: int = 0) -> Any:
        holder = [obj]
        dist.broadcast_object_list(holder, src=src, group=group)
        return holder[0]

    def write_and_publish() -> None:
        failure = error
        if future is not None:
            try:
                future.result()
            except folders.dcp_errors() as err:
                failure = _dcp_failure(err, ranks[0])
        folders.publish_written(
            target, "sharded", temp, failure, finish, (ranks[0], ranks[1], group_broadcast), storage_options, group
        )

    io._run_in_background(write_and_publish, str(target))


def _load_full(
    path: _PATH,
    state: Module | Optimizer | dict[str, Any] | None,
    strict: bool,
    weights_only: bool | None,
    load_precision: LoadPrecision,
    modules: Iterable[Module],
    foreign_keys: ForeignKeys,
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_optimizer_state_dict,
    )

    # every rank reads the file and keeps its own shards of it
    checkpoint = safe_load(path, weights_only=weights_only)
    pop_precision(checkpoint, load_precision)
    if not state:
        return checkpoint  # type: ignore[no-any-return]
    options = StateDictOptions(full_state_dict=True, strict=strict)

    def load_module(module: Module, value: dict[str, Any]) -> None:
        foreign = foreign_keys(module)
        own = {k: v for k, v in value.items() if k not in foreign}
        load_full_module_state(module, own, strict=strict, source=str(path))

    def load_optimizer(optimizer: Optimizer, value: Any) -> None:
        module = owner(optimizer, modules, state if isinstance(state, dict) else None)
        set_optimizer_state_dict(module, optimizer, _by_name(value, module, optimizer), options=options)

    if isinstance(state, Module):
        load_module(state, checkpoint)
    elif isinstance(state, Optimizer):
        load_optimizer(state, checkpoint)
    else:
        restore_entries(state, checkpoint, path, strict, load_module, load_optimizer)
        return checkpoint  # type: ignore[no-any-return]
    return {}


def load_full_module_state(module: Module, state_dict: dict[str, Any], strict: bool = True, source: str = "") -> None:
    """Load a full state dict into ``module``, sharded or plain, every rank keeping its own shards (every rank calls it
    for a sharded module). With ``strict``, differing keys raise ``KeyError`` (naming ``source``), which
    ``set_model_state_dict`` alone would not."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, set_model_state_dict

    if strict:
        expected = set(get_model_state_dict(module))
        missing, unexpected = sorted(expected - set(state_dict)), sorted(set(state_dict) - expected)
        if missing or unexpected:
            where = f" in {source!r}" if source else ""
            raise KeyError(
                f"The {type(module).__name__} does not match the full state dict{where}: missing from the checkpoint"
                f" {missing}, not in the module {unexpected}. To load only the entries that match, set"
                " `strict=False`."
            )
    set_model_state_dict(module, state_dict, options=StateDictOptions(full_state_dict=True, strict=strict))


def _load_sharded(
    folder: folders.Folder,
    state: Module | Optimizer | dict[str, Any] | None,
    strict: bool,
    load_precision: LoadPrecision,
    modules: Iterable[Module],
    foreign_keys: ForeignKeys,
) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    metadata = folders.read_metadata(folder)
    available = folders.top_level_keys(metadata)
    # Lightning Fabric keeps the entries that are not modules or optimizers in meta.pt, outside DCP's files
    lightning = {k: v for k, v in folders.read_lightning_metadata(folder).items() if k not in available}
    if not state:
        everything = {**folders.read_entries(folder, None), **lightning}
        pop_precision(everything, load_precision)
        return everything
    if isinstance(state, (Module, Optimizer)):  # a raw state dict saved on its own: its keys are the top-level ones
        if isinstance(state, Module):
            target = _module_target(folder, state, set(available) - foreign_keys(state), strict)
        else:
            target = get_optimizer_state_dict(owner(state, modules), state)
        _read_sharded(folder, {"": state}, {"": target}, modules, strict)
        return {}
    available = available + list(lightning)
    check_missing(folder, state, available, strict)
    targets: dict[str, Any] = {}
    for key, obj in state.items():
        if key in available and isinstance(obj, Module):
            targets[key] = _module_target(
                folder, obj, folders.entry_keys(metadata, key) - foreign_keys(obj), strict, key
            )
        elif key in available and isinstance(obj, Optimizer):
            targets[key] = get_optimizer_state_dict(owner(obj, modules, state), obj)
    _read_sharded(folder, state, targets, modules, strict)
    index = folders.read_json(folder, folders.INDEX_FILE) or {}  # none in a folder that DCP wrote without fabric_lite
    sharded = {*index.get("modules", []), *index.get("optimizers", [])}
    plain = [k for k in state if k in available and k not in targets]
    remainder = [k for k in available if k not in state and k not in sharded and k != PRECISION_KEY]
    stored = [k for k in plain + remainder if k not in lightning]
    values = folders.read_entries(folder, stored + ([PRECISION_KEY] if PRECISION_KEY in available else []))
    values.update(lightning)
    pop_precision(values, load_precision)
    for key in plain:
        load_or_replace(state, key, values[key])
    return {key: values[key] for key in remainder if key in values}


def _module_target(
    folder: folders.Folder, module: Module, saved: set[str], strict: bool, key: str = ""
) -> dict[str, Any]:
    """The module's sharded state dict to read into, restricted to what the checkpoint has (``strict``: the
    keys must match exactly)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    target = get_model_state_dict(module)
    missing, unexpected = sorted(set(target) - saved), sorted(saved - set(target))
    if strict and (missing or unexpected):
        name = f"The module {key!r}" if key else f"The {type(module).__name__}"
        raise KeyError(
            f"{name} does not match its state in {str(folder)!r}: missing from the checkpoint {missing}, not in"
            f" the module {unexpected}. Load with strict=False to restore only the entries that match."
        )
    return {k: v for k, v in target.items() if k in saved}


def _read_sharded(
    folder: folders.Folder, objects: dict[str, Any], targets: dict[str, Any], modules: Iterable[Module], strict: bool
) -> None:
    """Read ``targets`` (sharded state dicts, keyed as in the checkpoint; ``""`` for a raw one) from ``folder``
    in place, every rank its own shards, then load each into its module or optimizer in ``objects``."""
    from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    if not targets:
        return
    try:
        with warnings.catch_warnings():
            # without a process group (one process loading into a plain module) DCP warns that it assumes one process
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            planner = DefaultLoadPlanner(allow_partial_load=not strict)
            dcp_load(targets.get("", targets), storage_reader=folders.reader(folder), planner=planner)
    except folders.dcp_errors() as err:
        raise CheckpointError(
            f"Loading the sharded checkpoint {str(folder)!r} failed: {folders.describe(err)}"
        ) from err
    for key, value in targets.items():
        obj = objects[key]
        if isinstance(obj, Module):
            set_model_state_dict(obj, value, options=StateDictOptions(strict=strict))
        else:
            set_optimizer_state_dict(owner(obj, modules, objects), obj, value)


def _by_name(optimizer_state: dict[str, Any], module: Module, optimizer: Optimizer) -> dict[str, Any]:
    """``optimizer_state`` keyed by parameter name, as the distributed state dict API needs it; a state dict keyed by
    position (``optimizer.state_dict()``) is converted through ``optimizer``'s parameters."""
    groups = optimizer_state.get("param_groups", [])
    if not any(isinstance(i, int) for group in groups for i in group.get("params", [])):
        return optimizer_state
    names = {id(p): name for name, p in module.named_parameters()}
    order = [names.get(id(p), "") for group in optimizer.param_groups for p in group["params"]]
    saved = [i for group in groups for i in group["params"]]
    if len(saved) != len(order) or "" in order:
        raise ValueError(
            f"The optimizer state in the checkpoint has {len(saved)} parameter(s) but the {type(optimizer).__name__}"
            f" optimizer has {len(order)} parameters of the module: they cannot be matched by position. Create the"
            " optimizer from model.parameters() as when the checkpoint was saved."
        )
    return {
        "state": {order[i]: value for i, value in optimizer_state.get("state", {}).items()},
        "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in groups],
    }
