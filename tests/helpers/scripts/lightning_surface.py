"""Print Lightning Fabric's public surface as JSON: every public name of its public modules, with call signatures.

Run with an interpreter that has ``lightning_fabric`` (the comparison venv). tests/compat/test_surface.py compares the
output with fabric_lite, and keeps ``tests/data/lightning_fabric_surface.json`` (the same output, committed) equal to
it, so that the surface is checked even where no Lightning venv exists::

    .venv-lightning/bin/python tests/helpers/scripts/lightning_surface.py > tests/data/lightning_fabric_surface.json

``client_imports`` holds the names outside that surface which public client code imports (``CLIENT_IMPORTS``).
A public name is: a name in the module's ``__all__``; or, for a module without ``__all__``, a public class or function
that the module's own package defines, a registry object, or one of the re-exports listed in ``REEXPORTS`` (names that
scripts import from that module although Lightning defines them elsewhere).
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from typing import Any

MODULES = (
    "lightning_fabric",
    "lightning_fabric.accelerators",
    "lightning_fabric.loggers",
    "lightning_fabric.plugins",
    "lightning_fabric.plugins.collectives",
    "lightning_fabric.plugins.collectives.collective",
    "lightning_fabric.plugins.environments",
    "lightning_fabric.plugins.io",
    "lightning_fabric.plugins.precision",
    "lightning_fabric.strategies",
    "lightning_fabric.utilities",
    "lightning_fabric.utilities.apply_func",
    "lightning_fabric.utilities.cloud_io",
    "lightning_fabric.utilities.data",
    "lightning_fabric.utilities.distributed",
    "lightning_fabric.utilities.enums",
    "lightning_fabric.utilities.exceptions",
    "lightning_fabric.utilities.rank_zero",
    "lightning_fabric.utilities.seed",
    "lightning_fabric.utilities.spike",
    "lightning_fabric.utilities.throughput",
    "lightning_fabric.utilities.types",
    "lightning_fabric.utilities.warnings",
)

#: names scripts import from a module that defines them elsewhere (lightning_utilities, mostly)
REEXPORTS = {
    "lightning_fabric.utilities.rank_zero": (
        "rank_zero_only",
        "rank_zero_debug",
        "rank_zero_info",
        "rank_zero_warn",
        "rank_zero_deprecation",
        "rank_prefixed_message",
        "WarningCache",
    ),
    "lightning_fabric.utilities.data": ("AttributeDict", "suggested_max_num_workers", "has_len", "sized_len"),
    "lightning_fabric.utilities.seed": ("max_seed_value", "min_seed_value"),
    "lightning_fabric.plugins.collectives.collective": ("CollectibleGroup",),
}

#: names outside that public surface which public client code imports (private names and private modules), found by
#: searching public repositories (litgpt first; see docs/migration.md for the ranking): a drop-in must have them too
CLIENT_IMPORTS = {
    "lightning_fabric.accelerators.cuda": ("is_cuda_available", "num_cuda_devices"),
    "lightning_fabric.connector": ("_PLUGIN_INPUT", "_is_using_cli"),
    "lightning_fabric.fabric": ("_FabricOptimizer",),
    "lightning_fabric.loggers.logger": ("rank_zero_experiment",),
    "lightning_fabric.plugins.collectives.torch_collective": ("default_pg_timeout",),
    "lightning_fabric.plugins.precision.bitsandbytes": ("_BITSANDBYTES_AVAILABLE",),
    "lightning_fabric.plugins.precision.precision": ("_PRECISION_INPUT",),
    "lightning_fabric.plugins.precision.utils": ("_ClassReplacementContextManager", "_DtypeContextManager"),
    "lightning_fabric.strategies": ("_StrategyRegistry",),
    "lightning_fabric.strategies.launchers.subprocess_script": ("_SubprocessScriptLauncher",),
    "lightning_fabric.strategies.strategy": (
        "TBroadcast",
        "_BackwardSyncControl",
        "_Sharded",
        "_apply_filter",
        "_validate_keys_for_strict_loading",
    ),
    "lightning_fabric.strategies.xla_fsdp": ("_activation_checkpointing_auto_wrapper",),
    "lightning_fabric.utilities.cloud_io": ("_atomic_save", "_is_dir", "_load"),
    "lightning_fabric.utilities.device_parser": ("_check_data_type", "_check_unique", "_parse_gpu_ids"),
    "lightning_fabric.utilities.distributed": (
        "ReduceOp",
        "_all_gather_ddp_if_available",
        "_distributed_is_initialized",
        "_gather_all_tensors",
        "_get_default_process_group_backend_for_device",
        "_init_dist_connection",
        "_sync_ddp",
        "_sync_ddp_if_available",
        "group",
    ),
    "lightning_fabric.utilities.imports": (
        "_IS_INTERACTIVE",
        "_IS_WINDOWS",
        "_TORCH_GREATER_EQUAL_2_2",
        "_TORCH_GREATER_EQUAL_2_3",
        "_TORCH_GREATER_EQUAL_2_4",
    ),
    "lightning_fabric.utilities.init": (
        "_EmptyInit",
        "_has_meta_device_parameters_or_buffers",
        "_materialize",
        "_materialize_distributed_module",
        "_materialize_meta_tensors",
    ),
    "lightning_fabric.utilities.load": (
        "_METADATA_FILENAME",
        "_NotYetLoadedTensor",
        "_lazy_load",
        "_load_distributed_checkpoint",
        "_materialize_tensors",
        "_move_state_into",
    ),
    "lightning_fabric.utilities.logger": (
        "_add_prefix",
        "_convert_params",
        "_flatten_dict",
        "_sanitize_callable_params",
        "_sanitize_params",
    ),
    "lightning_fabric.utilities.optimizer": ("_optimizer_to_device", "_optimizers_to_device"),
    "lightning_fabric.utilities.seed": ("_collect_rng_states", "_set_rng_states", "reset_seed"),
    "lightning_fabric.utilities.testing": ("_runif_reasons",),
    "lightning_fabric.utilities.types": (
        "Optimizable",
        "ReduceOp",
        "Steppable",
        "_DEVICE",
        "_MAP_LOCATION_TYPE",
        "_PATH",
        "_Stateful",
    ),
    "lightning_fabric.wrappers": ("_FabricDataLoader", "_FabricModule", "_FabricOptimizer", "_unwrap_objects"),
}


def parameters(obj: Any) -> list[list[Any]] | None:
    """``[name, kind, has_default]`` for each parameter of a callable (a class: its constructor), without ``self``."""
    try:
        signature = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [
        [p.name, p.kind.name, p.default is not inspect.Parameter.empty]
        for p in signature.parameters.values()
        if p.name != "self"
    ]


def describe(obj: Any) -> dict[str, Any]:
    if type(obj).__module__ == "typing" and not inspect.isclass(obj):  # Union[...], Optional[...], Literal[...]
        return {"kind": "type alias", "params": None}
    if inspect.isclass(obj):
        return {"kind": "class", "params": parameters(obj)}
    if isinstance(obj, property):
        return {"kind": "property", "params": None}
    if isinstance(obj, (staticmethod, classmethod)):
        return {"kind": "method", "params": parameters(obj.__func__)}
    if callable(obj):
        return {"kind": "function", "params": parameters(obj)}
    return {"kind": "data", "params": None}


def public_names(module_name: str) -> list[str]:
    module = importlib.import_module(module_name)
    if hasattr(module, "__all__"):
        return sorted(module.__all__)
    names = set(REEXPORTS.get(module_name, ()))
    for name, value in vars(module).items():
        if name.startswith("_") or inspect.ismodule(value):
            continue
        if inspect.isclass(value) or inspect.isfunction(value):
            if getattr(value, "__module__", "").startswith(module_name):  # defined by this module (or package)
                names.add(name)
        elif type(value).__module__.startswith("lightning_fabric") and name.isupper():  # the registries
            names.add(name)
    return sorted(names)


def main() -> None:
    surface: dict[str, Any] = {}
    for module_name in MODULES:
        module = importlib.import_module(module_name)
        for name in public_names(module_name):
            surface[f"{module_name}.{name}"] = describe(getattr(module, name))
    fabric = importlib.import_module("lightning_fabric").Fabric
    for name, value in vars(fabric).items():
        if not name.startswith("_"):
            surface[f"lightning_fabric.Fabric.{name}"] = describe(value)
    client_imports = {
        f"{module_name}.{name}": describe(getattr(importlib.import_module(module_name), name))
        for module_name, names in CLIENT_IMPORTS.items()
        for name in names
    }
    registry = importlib.import_module("lightning_fabric.strategies").STRATEGY_REGISTRY
    version = importlib.import_module("lightning_fabric").__version__
    json.dump(
        {
            "version": version,
            "names": surface,
            "client_imports": client_imports,
            "strategies": sorted(registry.keys()),
        },
        sys.stdout,
        indent=1,
        sort_keys=True,
    )
    print()


if __name__ == "__main__":
    main()
