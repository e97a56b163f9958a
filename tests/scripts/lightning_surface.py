"""Print Lightning Fabric's public surface as JSON: every public name of its public modules, with call signatures.

Run with an interpreter that has ``lightning_fabric`` (the comparison venv). tests/test_surface.py compares the
output with fabric_lite, and keeps ``tests/data/lightning_fabric_surface.json`` (the same output, committed) equal to
it, so that the surface is checked even where no Lightning venv exists::

    .venv-lightning/bin/python tests/scripts/lightning_surface.py > tests/data/lightning_fabric_surface.json

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
    registry = importlib.import_module("lightning_fabric.strategies").STRATEGY_REGISTRY
    version = importlib.import_module("lightning_fabric").__version__
    json.dump(
        {"version": version, "names": surface, "strategies": sorted(registry.keys())},
        sys.stdout,
        indent=1,
        sort_keys=True,
    )
    print()


if __name__ == "__main__":
    main()
