"""The class of ``ACCELERATOR_REGISTRY``: accelerator names mapped to classes and constructor arguments."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric_lite.utilities.exceptions import MisconfigurationException


class _AcceleratorRegistry(dict[str, dict[str, Any]]):
    """Accelerator names mapped to ``{"accelerator", "accelerator_name", "description", "init_params"}``, as in
    Lightning; :meth:`get` builds an instance.

    Example::

        ACCELERATOR_REGISTRY.register("sota", SOTAAccelerator, description="my accelerator", cores=8)
        ACCELERATOR_REGISTRY.get("sota")  # SOTAAccelerator(cores=8)
    """

    def register(
        self,
        name: str,
        accelerator: Callable[..., Any] | None = None,
        description: str = "",
        override: bool = False,
        **init_params: Any,
    ) -> Callable[..., Any]:
        """Register ``accelerator`` (a class or factory) under ``name``, for :meth:`get` to build with
        ``init_params``; without ``accelerator``, return a decorator that registers the class it decorates. Raises
        ``TypeError`` for a non-string ``name``, ``MisconfigurationException`` for a taken one unless ``override``."""
        if not (name is None or isinstance(name, str)):
            raise TypeError(f"`name` must be a str, found {name}")
        if name in self and not override:
            raise MisconfigurationException(f"'{name}' is already present in the registry. HINT: Use `override=True`.")
        data: dict[str, Any] = {"description": description, "init_params": init_params}

        def do_register(accelerator: Callable[..., Any]) -> Callable[..., Any]:
            data["accelerator"] = accelerator
            data["accelerator_name"] = name
            self[name] = data
            return accelerator

        return do_register(accelerator) if accelerator is not None else do_register

    def get(self, name: str, default: Any | None = None) -> Any:
        """A new instance of the accelerator registered under ``name``, else ``default`` if given; ``KeyError``
        (listing the names) otherwise."""
        if name in self:
            data = self[name]
            return data["accelerator"](**data["init_params"])
        if default is not None:
            return default
        raise KeyError(f"'{name}' not found in registry. Available names: {self.available_accelerators()}")

    def remove(self, name: str) -> None:
        """Unregister ``name`` (``KeyError`` if it is not registered)."""
        self.pop(name)

    def available_accelerators(self) -> set[str]:
        """The registered names."""
        return set(self.keys())

    def __str__(self) -> str:
        return "Registered Accelerators: {}".format(", ".join(self.available_accelerators()))


__all__ = ["_AcceleratorRegistry"]
