"""DeepSpeed checkpoints: how ``DeepSpeedStrategy`` saves and loads them, and turns one into a single file. A checkpoint
is the folder DeepSpeed's engine writes, in Lightning Fabric's layout (each loads the other's), plus
``fabric_lite.json`` naming the module, the optimizer and the user's entries, which travel as DeepSpeed's client state
(a name DeepSpeed uses itself as ``fabric_lite:<name>``). DeepSpeed is imported inside the functions."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch.nn import Module
from torch.optim import Optimizer

from fabric_lite.runtime.checkpoint import folders
from fabric_lite.runtime.checkpoint.entries import (
    load_or_replace,
    missing_entries_error,
    restore_entries,
    to_state_dicts,
)
from fabric_lite.runtime.checkpoint.files import CheckpointError, atomic_save, safe_load
from fabric_lite.utilities._fs import _is_remote, _local_path
from fabric_lite.utilities.imports import import_deepspeed
from fabric_lite.utilities.types import _PATH

#: DeepSpeed's tag: the subfolder holding the partitions (Lightning Fabric's name for it)
TAG = "checkpoint"
_ESCAPE = "fabric_lite:"
#: the entries of DeepSpeed's own model-states file (DeepSpeed 0.19), which a client entry of that name would replace
DEEPSPEED_KEYS = frozenset(
    {
        "module",
        "buffer_names",
        "optimizer",
        "param_shapes",
        "frozen_param_shapes",
        "shared_params",
        "frozen_param_fragments",
        "lr_scheduler",
        "data_sampler",
        "random_ltd",
        "sparse_tensor_module_names",
        "skipped_steps",
        "global_steps",
        "global_samples",
        "dp_world_size",
        "mp_world_size",
        "checkpoint_parallel_dimensions",
        "universal_checkpoint_info",
        "ds_config",
        "ds_version",
    }
)


def is_deepspeed_checkpoint(path: _PATH) -> bool:
    """Whether ``path`` is a local folder written by DeepSpeed with Lightning's tag (a ``checkpoint`` subfolder).

    Example::

        is_deepspeed_checkpoint("checkpoints/step-100")  # True for what fabric.save wrote with DeepSpeedStrategy
    """
    if _is_remote(path):
        return False
    folder = Path(_local_path(path))
    return folder.is_dir() and (folder / TAG).is_dir()


def engine_in(state: dict[str, Any], action: str) -> tuple[str, Any]:
    """The key and the DeepSpeed engine among the values of ``state``; ``ValueError``, saying what to pass, for none or
    several."""
    engine_class = importlib.import_module("deepspeed").DeepSpeedEngine
    engines = [(key, value) for key, value in state.items() if isinstance(value, engine_class)]
    if not engines:
        raise ValueError(
            f"Could not find a DeepSpeed model in the provided checkpoint state (keys {sorted(state)}). Please provide"
            f" the model as part of the state like so: `{action}(..., state={{'model': model, ...}})`, with the model"
            " returned by fabric.setup(model, optimizer)."
        )
    if len(engines) > 1:
        raise ValueError(
            f"Found multiple DeepSpeed engine modules in the given state ({[key for key, _ in engines]}). A DeepSpeed"
            " checkpoint holds one model: save or load each model separately, with a different path."
        )
    return engines[0]


def save(
    path: _PATH, state: dict[str, Any], exclude_frozen_parameters: bool, ranks: tuple[int, int, Callable[..., Any]]
) -> None:
    """Write ``state`` as a checkpoint folder at ``path``, atomically; every rank calls it, with
    ``ranks = (global_rank, world_size, broadcast)``."""
    if _is_remote(path):
        raise ValueError(
            f"DeepSpeedStrategy cannot save to {str(path)!r}: DeepSpeed's engine writes local files. Save to a local"
            " (or shared) folder and copy it afterwards."
        )
    module_key, engine = engine_in(state, "save_checkpoint")
    optimizer = engine.optimizer
    optimizer_key = next((k for k, v in state.items() if optimizer is not None and v is optimizer), None)
    user = {k: v for k, v in state.items() if k not in (module_key, optimizer_key)}
    client = to_state_dicts(user, {}, lambda m: m.state_dict(), lambda o: o.state_dict())  # the other objects
    stored = {key: _ESCAPE + key if key in DEEPSPEED_KEYS or key.startswith(_ESCAPE) else key for key in client}
    client_state = {stored[key]: value for key, value in client.items()}
    target = Path(_local_path(path))

    def write(temp: folders.Folder) -> str | None:
        try:
            engine.save_checkpoint(
                str(temp), client_state=client_state, tag=TAG, exclude_frozen_parameters=exclude_frozen_parameters
            )
        except Exception as err:
            return f"rank {ranks[0]}: {type(err).__name__}: {err}"
        return None

    def finish(temp: folders.Folder) -> None:
        folders.write_index(temp, module=module_key, optimizer=optimizer_key, entries=stored)

    folders.save_folder(
        target,
        "DeepSpeed",
        lambda: folders.temp_folder_beside(target, "DeepSpeed", is_deepspeed_checkpoint),
        write,
        finish,
        ranks,
    )


def check_folder(path: _PATH) -> Path:
    """``path`` as a DeepSpeed checkpoint folder; else ``FileNotFoundError`` (as Lightning's), naming the folder to pass
    when ``path`` is inside one."""
    folder = Path(_local_path(path))
    if is_deepspeed_checkpoint(folder):
        return folder
    message = f"The provided path is not a valid DeepSpeed checkpoint: {folder}"
    if is_deepspeed_checkpoint(folder.parent):
        raise FileNotFoundError(
            f"{message}. It looks like you passed the path to a subfolder. Try to load using this parent directory"
            f" instead: {folder.parent}"
        )
    if folder.is_file() and is_deepspeed_checkpoint(folder.parent.parent):
        raise FileNotFoundError(
            f"{message}. It looks like you passed the path to a file inside a DeepSpeed checkpoint folder. Try to"
            f" load using this parent directory instead: {folder.parent.parent}"
        )
    raise FileNotFoundError(message)


def _user_entries(index: dict[str, Any] | None, client: dict[str, Any]) -> dict[str, str]:
    """The user's entries of the client state, ``name -> stored name``: from the index, or for a folder written by
    Lightning, every entry DeepSpeed did not write itself."""
    if index is not None:
        return {str(k): str(v) for k, v in dict(index.get("entries", {})).items() if v in client}
    return {key: key for key in client if key not in DEEPSPEED_KEYS}


def load(path: _PATH, state: dict[str, Any], strict: bool) -> dict[str, Any]:
    """Restore ``state`` in place from a checkpoint folder; returns the user's entries it did not restore."""
    folder = check_folder(path)
    module_key, engine = engine_in(state, "load_checkpoint")
    optimizer_keys = [k for k, v in state.items() if engine.optimizer is not None and v is engine.optimizer]
    index = folders.read_json(folder, folders.INDEX_FILE)  # None for a folder written by Lightning
    # ZeRO writes one optimizer-state file per rank; without ZeRO (stage 0) the optimizer is in the model states
    zero_files = len(list((folder / TAG).glob("*zero_pp_rank_*_optim_states.pt")))
    if strict and index is not None:
        names = list(dict(index.get("entries", {})))
        missing = [k for k in state if k != module_key and k not in optimizer_keys and k not in names]
        missing += [k for k in optimizer_keys if not index.get("optimizer")]
        if missing:
            saved_objects = [str(index.get("module"))] + ([str(index["optimizer"])] if index.get("optimizer") else [])
            raise missing_entries_error(folder, missing, saved_objects + names)
    if optimizer_keys and zero_files and zero_files != engine.dp_world_size:
        raise CheckpointError(
            f"The DeepSpeed checkpoint {str(folder)!r} was saved by {zero_files} ranks and is loaded by"
            f" {engine.dp_world_size}: DeepSpeed cannot re-partition ZeRO's optimizer state to another world size."
            f" Leave the optimizer out of the state to load the weights (and your other entries) only, e.g."
            f" fabric.load(path, {{{module_key!r}: model}}), or load with {zero_files} ranks."
        )
    _, client = engine.load_checkpoint(
        str(folder),
        tag=TAG,
        load_optimizer_states=bool(optimizer_keys),
        load_lr_scheduler_states=False,
        load_module_strict=strict,
    )
    if client is None:
        raise CheckpointError(
            f"DeepSpeed was unable to load the checkpoint {str(folder)!r}. Ensure you passed in a DeepSpeed compatible"
            " checkpoint folder, or a single checkpoint file."
        )
    entries = _user_entries(index, client)
    for key in list(state):
        if key != module_key and key not in optimizer_keys and key in entries:
            load_or_replace(state, key, client[entries[key]])
    return {key: client[stored] for key, stored in entries.items() if key not in state}


def load_full(
    path: _PATH,
    state: Module | Optimizer | dict[str, Any] | None,
    strict: bool,
    weights_only: bool | None,
) -> dict[str, Any]:
    """Restore a module (DeepSpeed's or plain) and the user's entries from one full checkpoint file, read on every rank;
    with no ``state``, return the whole file. Raises ``ValueError`` for an optimizer in ``state`` (ZeRO keeps its own
    partitions), and with ``strict`` ``KeyError`` for an entry the file lacks."""
    checkpoint = safe_load(path, weights_only=weights_only)
    if not state:
        return checkpoint  # type: ignore[no-any-return]
    if isinstance(state, Optimizer):
        raise ValueError(_FULL_OPTIMIZER.format(path=str(path)))
    if isinstance(state, Module):
        load_module_weights(state, checkpoint, strict)
        return {}
    if not isinstance(checkpoint, dict):
        raise CheckpointError(
            f"The checkpoint {str(path)!r} holds a {type(checkpoint).__name__}, not a dict of entries."
        )
    optimizers = [k for k, v in state.items() if isinstance(v, Optimizer) or _is_deepspeed_optimizer(v)]
    if optimizers:
        raise ValueError(_FULL_OPTIMIZER.format(path=str(path)) + f" (state keys {optimizers})")
    # the optimizers were refused above: what remains restores as with the other strategies
    restore_entries(state, checkpoint, path, strict, lambda module, value: load_module_weights(module, value, strict))
    return checkpoint


_FULL_OPTIMIZER = (
    "Cannot load optimizer state from the single file {path!r} into a DeepSpeed optimizer: ZeRO keeps its own"
    " partitions of it. Leave the optimizer out of the state to load the weights only, or load a DeepSpeed checkpoint"
    " folder"
)


def _is_deepspeed_optimizer(obj: Any) -> bool:
    return isinstance(obj, importlib.import_module("deepspeed.runtime.base_optimizer").DeepSpeedOptimizer)


def load_module_weights(module: Module, state_dict: dict[str, Any], strict: bool) -> None:
    """Load a full state dict into ``module``, a plain module or a DeepSpeed engine (ZeRO-3's partitions gathered for
    it, the float32 master weights refreshed)."""
    deepspeed = importlib.import_module("deepspeed")
    engine = module if isinstance(module, deepspeed.DeepSpeedEngine) else None
    target = engine.module if engine is not None else module
    partitioned = [p for p in target.parameters() if hasattr(p, "ds_id")]
    # every rank loads the same file; modifier_rank=0 re-partitions rank 0's (equal) values on exit
    with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=0, enabled=bool(partitioned)):
        target.load_state_dict(state_dict, strict=strict)
    optimizer = engine.optimizer if engine is not None else None
    refresh: Callable[[], None] | None = getattr(optimizer, "refresh_fp32_params", None)
    if refresh is not None:
        refresh()


def consolidate(checkpoint_folder: _PATH, output_file: _PATH) -> Path:
    """Write a DeepSpeed checkpoint folder's weights, gathered in float32, and the user's other entries as one
    ``torch.save`` file, atomically: ``{module_key: state_dict, **entries}``, no optimizer state. Needs DeepSpeed
    (``ImportError`` where it is missing or does not work with this torch), no process group; :class:`CheckpointError`
    when ``output_file`` is a folder or reading fails."""
    import_deepspeed("Consolidating a DeepSpeed checkpoint")
    zero_to_fp32 = importlib.import_module("deepspeed.utils.zero_to_fp32")
    folder = check_folder(checkpoint_folder)
    target = Path(_local_path(output_file))
    if target.is_dir():
        raise CheckpointError(f"Cannot write the consolidated checkpoint to {str(target)!r}: it is a folder.")
    index = folders.read_json(folder, folders.INDEX_FILE)
    try:
        states = sorted((folder / TAG).glob("*model_states.pt"))
        client = safe_load(states[0]) if states else {}
        if any((folder / TAG).glob("*zero_pp_rank_*_optim_states.pt")):
            weights = zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint(str(folder), tag=TAG)
        else:  # stage 0: the whole module is in the model states, as the model held it
            weights = {k: v.float() if v.is_floating_point() else v for k, v in client["module"].items()}
    except Exception as err:
        raise CheckpointError(f"Consolidating the DeepSpeed checkpoint {str(folder)!r} failed: {err}") from err
    entries = _user_entries(index, client)
    module_key = str(index.get("module", "model")) if index else "model"
    atomic_save({module_key: dict(weights), **{key: client[stored] for key, stored in entries.items()}}, target)
    return target
