"""The import hook behind :mod:`fabric_lite.as_lightning`: two views of the ``lightning`` names in one process.

A client (a user's script, litgpt) meets fabric_lite under Lightning's names, while the real Lightning's own modules
(``lightning.pytorch``) need the real Lightning Fabric. So the real one is loaded as ``_original_lightning__fabric``
(and ``_original_lightning_fabric``), and the real Lightning's modules run with an ``__import__`` that leads there;
their code and files are untouched. This module imports neither torch nor Lightning, so the hook costs nothing until a
``lightning`` name is imported.
"""

from __future__ import annotations

import builtins
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
import threading
import types
from collections.abc import Sequence
from typing import Any

#: the Lightning Fabric version whose API fabric_lite provides: ``lightning.fabric.__version__`` under the hook
LIGHTNING_VERSION = "2.6.6"
#: the names a client imports, each served by fabric_lite
CLIENT_PACKAGES = ("lightning.fabric", "lightning_fabric")
#: the Fabric names of the top-level ``lightning`` package, served by fabric_lite (the rest stays Lightning's)
TOP_LEVEL_FABRIC_NAMES = {"Fabric": "fabric_lite.fabric", "seed_everything": "fabric_lite.utilities.seed"}
#: where the real Lightning Fabric lives while the hook is on, for the real Lightning's own modules
ORIGINAL_NAMES = {name: "_original_" + name.replace(".", "__") for name in CLIENT_PACKAGES}
#: top-level packages of the real Lightning distributions: their modules see the real Lightning Fabric
_INTERNAL_TOPS = ("lightning", "pytorch_lightning", *ORIGINAL_NAMES.values())

_NOT_INSTALLED = (
    "{name!r} is part of the real Lightning package, which is not installed: fabric_lite's import hook provides"
    " Lightning Fabric (lightning.fabric, lightning_fabric, lightning.Fabric, lightning.seed_everything) only."
    " Install Lightning for the rest (pip install --no-deps lightning==2.6.6, with its dependencies), or import"
    " the name from fabric_lite."
)


def _split(name: str, prefix: str) -> str | None:
    """The rest of ``name`` after the package ``prefix`` ("" for the package itself), or None if not inside it."""
    if name == prefix:
        return ""
    if name.startswith(prefix + "."):
        return name[len(prefix) :]
    return None


def _original_name(name: str) -> str | None:
    """Where the real Lightning Fabric module ``name`` (``lightning.fabric.X``/``lightning_fabric.X``) lives now."""
    for client, original in ORIGINAL_NAMES.items():
        rest = _split(name, client)
        if rest is not None:
            return original + rest
    return None


class _LightningView:
    """What ``import lightning.fabric[.X]`` binds inside the real Lightning's modules: the ``lightning`` package,
    except that its ``fabric`` is the real Lightning Fabric."""

    def __init__(self, fabric: types.ModuleType) -> None:
        self.fabric = fabric

    def __getattr__(self, name: str) -> Any:
        return getattr(sys.modules["lightning"], name)


def _internal_import(
    name: str,
    globals: dict[str, Any] | None = None,
    locals: dict[str, Any] | None = None,
    fromlist: Sequence[str] | None = (),
    level: int = 0,
) -> Any:
    """``__import__`` for the real Lightning's modules: Lightning Fabric's names lead to the real Lightning Fabric."""
    if level == 0:
        original = _original_name(name)
        if original is not None:
            module = builtins.__import__(original, globals, locals, fromlist, 0)
            if fromlist or not name.startswith("lightning."):
                return module  # `from lightning.fabric.x import y`, or the top package for `import lightning_fabric.x`
            return _LightningView(module)  # `import lightning.fabric.x [as y]` binds the `lightning` package
        if name == "lightning" and fromlist and "fabric" in fromlist:
            builtins.__import__("lightning")
            return _LightningView(builtins.__import__(ORIGINAL_NAMES["lightning.fabric"]))
    return builtins.__import__(name, globals, locals, fromlist, level)


_INTERNAL_BUILTINS = {**vars(builtins), "__import__": _internal_import}


class _InternalLoader(importlib.abc.Loader):
    """Runs a module of the real Lightning with :func:`_internal_import` as its ``__import__``."""

    def __init__(self, loader: importlib.abc.Loader, finder: LightningFinder) -> None:
        self._loader = loader
        self._finder = finder

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: types.ModuleType) -> None:
        module.__dict__["__builtins__"] = _INTERNAL_BUILTINS
        if module.__name__ == "lightning":
            self._finder.defer_top_level(module, self._loader)
            return
        self._loader.exec_module(module)
        if "._graveyard" in module.__name__:
            # Lightning's graveyard registers old module paths in sys.modules by their literal client names
            # ("lightning.fabric.accelerators.tpu"): those names belong to the client view
            for key in [k for k in sys.modules if _split(k, "lightning.fabric") or _split(k, "lightning_fabric")]:
                if getattr(sys.modules[key], "__name__", "").startswith(tuple(ORIGINAL_NAMES.values())):
                    del sys.modules[key]

    def __getattr__(self, name: str) -> Any:
        # get_source, get_filename, is_package, get_resource_reader, ...: the real loader's
        return getattr(self._loader, name)


class _ClientLoader(importlib.abc.Loader):
    """Gives ``lightning.fabric.X``/``lightning_fabric.X`` the module ``fabric_lite.X`` itself; after its deletion from
    ``sys.modules`` (``fresh``), a new execution of its code, as re-importing gives elsewhere."""

    def __init__(self, target: str, requested: str, fresh: bool = False) -> None:
        self._target = target
        self._requested = requested
        self._fresh = fresh
        self._own_spec: importlib.machinery.ModuleSpec | None = None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self._fresh:
            own = importlib.util.find_spec(self._target)
            if own is not None and own.loader is not None and not own.submodule_search_locations:
                self._own_spec = own
                return importlib.util.module_from_spec(own)  # executed by exec_module
        try:
            module = importlib.import_module(self._target)
        except ModuleNotFoundError as err:
            if err.name != self._target:
                raise
            raise ModuleNotFoundError(
                f"No module named {self._requested!r}: fabric_lite has no counterpart of this Lightning Fabric"
                f" module ({self._target!r} does not exist). docs/migration.md lists the private names fabric_lite"
                " provides and those it leaves out.",
                name=self._requested,
            ) from None
        self._own_spec = module.__spec__
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        # importlib gave the module this alias's spec; it stays fabric_lite's module, with its own spec
        module.__spec__ = self._own_spec
        if self._fresh and self._own_spec is not None and self._own_spec.loader is not None:
            self._own_spec.loader.exec_module(module)

    def get_code(self, fullname: str) -> types.CodeType | None:
        """The code of ``fabric_lite.X``: what ``python -m lightning.fabric.X`` runs (runpy asks the loader)."""
        spec = importlib.util.find_spec(self._target)
        loader = spec.loader if spec is not None else None
        if not isinstance(loader, importlib.abc.InspectLoader):
            raise ImportError(f"No code to run for {self._requested!r} ({self._target!r} has no source loader)")
        return loader.get_code(self._target)


class _ClientPackageLoader(importlib.abc.Loader):
    """``lightning.fabric`` / ``lightning_fabric`` themselves: fabric_lite's top-level names and submodules, with
    Lightning's ``__version__`` (clients compare it; ``__fabric_lite_version__`` has fabric_lite's)."""

    def exec_module(self, module: types.ModuleType) -> None:
        import fabric_lite

        module.__version__ = LIGHTNING_VERSION  # type: ignore[attr-defined]
        module.__fabric_lite_version__ = fabric_lite.__version__  # type: ignore[attr-defined]
        module.__all__ = list(fabric_lite.__all__)  # type: ignore[attr-defined]
        module.__path__ = list(fabric_lite.__path__)
        module.__file__ = fabric_lite.__file__  # where its code is: fabric_lite's package

        def __getattr__(name: str) -> Any:
            if name.startswith("__"):
                raise AttributeError(name)
            try:
                return getattr(fabric_lite, name)
            except AttributeError:
                pass
            try:
                return importlib.import_module(f"{module.__name__}.{name}")
            except ModuleNotFoundError:
                raise AttributeError(f"module {module.__name__!r} has no attribute {name!r}") from None

        module.__dict__["__getattr__"] = __getattr__  # PEP 562: attributes it lacks
        fabric_lite._as_lightning_fabric()  # what importing Lightning Fabric does to the process, on each execution
        _set_up_logger()


def _set_up_logger() -> None:
    """Set up the ``lightning.fabric`` logger as importing Lightning Fabric does: level INFO, with a handler of its own
    where the root logger has none, so that its INFO messages ("Seed set to 42") are printed."""
    logger = logging.getLogger("lightning.fabric")
    logger.setLevel(logging.INFO)
    if not logging.getLogger().hasHandlers() and not logger.handlers:
        logger.addHandler(logging.StreamHandler())
        logger.propagate = False


class _ImportedLoader(importlib.abc.Loader):
    """Gives a module that was imported while its own import was being looked up the module already in
    ``sys.modules`` (the real ``lightning`` package's code, run on the way, imports ``lightning.pytorch``)."""

    def __init__(self, module: types.ModuleType) -> None:
        self._module = module
        self._own_spec = module.__spec__

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        return self._module

    def exec_module(self, module: types.ModuleType) -> None:
        module.__spec__ = self._own_spec  # importlib gave it this loader's spec


class _StandInLightningLoader(importlib.abc.Loader):
    """The top-level ``lightning`` package where the real one is not installed: its Fabric names only."""

    def __init__(self, finder: LightningFinder) -> None:
        self._finder = finder

    def exec_module(self, module: types.ModuleType) -> None:
        module.__version__ = LIGHTNING_VERSION  # type: ignore[attr-defined]
        module.__all__ = [*TOP_LEVEL_FABRIC_NAMES]  # type: ignore[attr-defined]
        module.__path__ = []

        def __getattr__(name: str) -> Any:
            raise AttributeError(name if name.startswith("__") else _NOT_INSTALLED.format(name=f"lightning.{name}"))

        module.__dict__["__getattr__"] = __getattr__  # PEP 562: attributes it lacks
        self._finder.adopt_top_level(module)


class LightningFinder(importlib.abc.MetaPathFinder):
    """The meta path finder that :func:`fabric_lite.as_lightning.install` puts first on ``sys.meta_path``."""

    def __init__(self) -> None:
        #: every module name this finder gave a spec for (what uninstall removes from sys.modules)
        self.names: set[str] = set()
        #: the real ``lightning`` package and its loader while its code has not run yet (:meth:`defer_top_level`)
        self._deferred: tuple[types.ModuleType, importlib.abc.Loader] | None = None
        self._lock = threading.RLock()

    def find_spec(
        self, fullname: str, path: Sequence[str] | None = None, target: types.ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        spec = self._find(fullname, path)
        if spec is not None:
            self.names.add(fullname)
        return spec

    def _find(self, fullname: str, path: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
        for client in CLIENT_PACKAGES:
            rest = _split(fullname, client)
            if rest == "":
                return importlib.machinery.ModuleSpec(fullname, _ClientPackageLoader(), is_package=True)
            if rest is not None:
                # a name served before and asked for again was deleted from sys.modules: a new execution
                loader = _ClientLoader("fabric_lite" + rest, fullname, fresh=fullname in self.names)
                return importlib.machinery.ModuleSpec(fullname, loader)
        top = fullname.partition(".")[0]
        if top not in _INTERNAL_TOPS:
            return None
        if fullname == "lightning" and importlib.machinery.PathFinder.find_spec("lightning") is None:
            return importlib.machinery.ModuleSpec(fullname, _StandInLightningLoader(self), is_package=True)
        lightning = sys.modules.get("lightning")
        if top == "lightning" and lightning is not None and not getattr(lightning, "__file__", None):
            raise ModuleNotFoundError(_NOT_INSTALLED.format(name=fullname), name=fullname)
        if top == "lightning" and fullname != "lightning" and self._deferred is not None:
            self.complete_top_level()  # the package's code runs before its first module, as without the hook
            if fullname in sys.modules:
                return importlib.machinery.ModuleSpec(fullname, _ImportedLoader(sys.modules[fullname]))
        real = self._real_spec(fullname, path)
        if real is None or real.loader is None:
            return real
        real.loader = _InternalLoader(real.loader, self)
        return real

    @staticmethod
    def _real_spec(fullname: str, path: Sequence[str] | None) -> importlib.machinery.ModuleSpec | None:
        for client, original in ORIGINAL_NAMES.items():
            if fullname == original:
                # the real Lightning Fabric package, found where Python would find it, under its new name
                package, _, sub = client.partition(".")
                found = importlib.machinery.PathFinder.find_spec(package)
                if found is None or not found.submodule_search_locations:
                    return None
                if sub:
                    found = importlib.machinery.PathFinder.find_spec(client, found.submodule_search_locations)
                if found is None or found.origin is None or not found.submodule_search_locations:
                    return None
                return importlib.util.spec_from_file_location(
                    fullname, found.origin, submodule_search_locations=list(found.submodule_search_locations)
                )
        return importlib.machinery.PathFinder.find_spec(fullname, path)

    def defer_top_level(self, module: types.ModuleType, loader: importlib.abc.Loader) -> None:
        """Hold back the real ``lightning`` package's code until the program uses more of it than the Fabric names
        (``lightning.Trainer``, ``lightning.pytorch``): that code imports the Trainer and ``torch._dynamo``, which a
        program using only Lightning Fabric's names should not pay for."""

        def __getattr__(name: str) -> Any:  # PEP 562: every name the package's code would have defined
            self.complete_top_level()
            try:
                return module.__dict__[name]
            except KeyError:
                raise AttributeError(f"module 'lightning' has no attribute {name!r}") from None

        module.__dict__["__getattr__"] = __getattr__
        self._deferred = (module, loader)
        self.adopt_top_level(module)

    def complete_top_level(self) -> None:
        """Run the code of the real ``lightning`` package held back by :meth:`defer_top_level`, once."""
        with self._lock:
            if self._deferred is None:
                return
            module, loader = self._deferred
            self._deferred = None
            del module.__dict__["__getattr__"]
            loader.exec_module(module)
            self.adopt_top_level(module)

    def adopt_top_level(self, module: types.ModuleType) -> None:
        """Give the top-level ``lightning`` package (real or stand-in) fabric_lite's Fabric names and
        ``lightning.fabric``."""
        for name, where in TOP_LEVEL_FABRIC_NAMES.items():
            setattr(module, name, getattr(importlib.import_module(where), name))
        module.fabric = importlib.import_module("lightning.fabric")  # type: ignore[attr-defined]
