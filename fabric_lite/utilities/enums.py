"""``LightningEnum`` (Lightning Fabric's ``utilities.enums``)."""

from __future__ import annotations

import warnings
from enum import Enum
from typing import Literal, TypeVar

_E = TypeVar("_E", bound="LightningEnum")
_Source = Literal["key", "value", "any"]


class LightningEnum(str, Enum):
    """A ``str`` enum whose members equal (and hash as) strings and enums of the same value, ignoring case.

    Example::

        >>> class Mode(LightningEnum):
        ...     TRAIN = "Train"
        >>> Mode.TRAIN == "train", Mode.from_str("train")
        (True, <Mode.TRAIN: 'Train'>)
    """

    @classmethod
    def from_str(cls: type[_E], value: str, source: _Source = "key") -> _E:
        """The member whose name (``source="key"``), value (``"value"``) or either (``"any"``, names first) matches
        ``value``, ignoring case; raises ``ValueError`` listing the choices when none does."""
        if source in ("key", "any"):
            for name in cls.__members__:
                if name.lower() == value.lower():
                    return cls[name]
        if source in ("value", "any"):
            for name, member in cls.__members__.items():
                if member == value:
                    return cls[name]
        raise ValueError(f"Invalid match: expected one of {cls._allowed_matches(source)}, but got {value}.")

    @classmethod
    def try_from_str(cls: type[_E], value: str, source: _Source = "key") -> _E | None:
        """:meth:`from_str`, or ``None`` with a ``UserWarning`` when nothing matches."""
        try:
            return cls.from_str(value, source)
        except ValueError:
            warnings.warn(
                UserWarning(f"Invalid string: expected one of {cls._allowed_matches(source)}, but got {value}."),
                stacklevel=2,
            )
        return None

    @classmethod
    def _allowed_matches(cls, source: str) -> list[str]:
        keys = list(cls.__members__)
        values = [member.value for member in cls.__members__.values()]
        if source == "key":
            return keys
        if source == "value":
            return values
        return keys + values

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Enum):
            other = other.value
        return bool(self.value.lower() == str(other).lower())

    def __hash__(self) -> int:
        return hash(self.value.lower())


__all__ = ["LightningEnum"]
