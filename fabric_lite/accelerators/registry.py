"""``ACCELERATOR_REGISTRY``: accelerator names mapped to classes and their constructor arguments (Lightning Fabric's
``accelerators.registry``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fabric_lite.utilities.exceptions import MisconfigurationException


class _AcceleratorRegistry(dict[str, dict[str, Any]]):
    """Accelerator names mapped to ``{"accelerator": cls, "accelerator_name": name, "description": str,
    "init_params": dict}``; :meth:`get` builds an instance.

    Example::

        @ACCELERATOR_REGISTRY.register("sota", description="my accelerator", cores=8)
        class SOTAAccelerator(Accelerator):
            def __init__(self, cores): ...

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
        """Register ``accelerator`` (a class, or any callable that builds one) under ``name``; without
        ``accelerator``, return a decorator that registers the class it decorates.

        Args:
            name: the name, e.g. ``"cpu"``.
            accelerator: the class; omit it to use ``register`` as a decorator.
            description: a free text description.
            override: replace an entry already registered under ``name``.
            **init_params: the keyword arguments :meth:`get` passes to the class.

        Raises:
            TypeError: ``name`` is not a string.
            MisconfigurationException: ``name`` is taken and ``override`` is ``False``.
        """
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
        """A new instance of the accelerator registered under ``name``, built with its ``init_params``; ``default``
        when there is none and ``default`` is not ``None``.

        Raises:
            KeyError: ``name`` is not registered and no ``default`` is given; the message lists the names.
        """
        if name in self:
            data = self[name]
            return data["accelerator"](**data["init_params"])
        if default is not None:
            return default
        raise KeyError(f"'{name}' not found in registry. Available names: {self.available_accelerators()}")

    def remove(self, name: str) -> None:
        """Unregister ``name``.

        Raises:
            KeyError: ``name`` is not registered.
        """
        self.pop(name)

    def available_accelerators(self) -> set[str]:
        """The registered names."""
        return set(self.keys())

    def __str__(self) -> str:
        return "Registered Accelerators: {}".format(", ".join(self.available_accelerators()))


__all__ = ["_AcceleratorRegistry"]
