"""Which GPU indices a ``devices=`` value selects: one pure parser over the value and a machine's indices, so that a
value means the same to the plan, the accelerators and :mod:`fabric_lite.utilities.device_parser`."""

from __future__ import annotations

import re
from collections.abc import MutableSequence, Sequence

from fabric_lite.utilities.exceptions import MisconfigurationException

_TYPE_MESSAGE = "Device IDs (GPU/TPU) must be an int, a string, a sequence of ints, but you passed"
_CHOICES = "Use an int, -1 for every GPU, a list of indices such as [0, 1], a string such as '0,1', or 'auto'."


def _check_data_type(device_ids: object) -> None:
    """Raise ``TypeError`` for a value that is not an int, a string or a sequence of ints (a bool is no int here)."""
    if device_ids is None:
        raise TypeError(f"{_TYPE_MESSAGE} None. {_CHOICES}")
    if isinstance(device_ids, (MutableSequence, tuple)):
        for id_ in device_ids:
            if type(id_) is not int:
                raise TypeError(
                    f"{_TYPE_MESSAGE} a sequence of {type(id_).__name__} ({device_ids!r}). Example: devices=[0, 1]."
                )
    elif type(device_ids) not in (int, str):
        raise TypeError(f"{_TYPE_MESSAGE} {device_ids!r}. {_CHOICES}")


def _check_unique(device_ids: Sequence[int]) -> None:
    """Raise ``MisconfigurationException`` for an index listed twice."""
    if len(device_ids) != len(set(device_ids)):
        raise MisconfigurationException(
            f"Device ID's (GPU) must be unique: {list(device_ids)} lists a device twice; each device can be used once."
            " Example: [0, 1]."
        )


def _normalize_parse_gpu_string_input(s: int | str | list[int]) -> int | list[int]:
    """A string as the number or index list it spells (``"-1"``, ``"0, 2"``, ``"1,"``); other values unchanged.

    Raises:
        TypeError: a string that spells neither.
    """
    if not isinstance(s, str):
        return s
    parts = [part.strip() for part in s.split(",")]
    numbers = [part for part in parts if part]
    if not numbers or not all(re.fullmatch("-?[0-9]+", part) for part in numbers):
        raise TypeError(f"{_TYPE_MESSAGE} {s!r}, which is no number or list of indices. {_CHOICES}")
    return [int(part) for part in numbers] if len(parts) > 1 else int(numbers[0])


def _shown(available: Sequence[int]) -> str:
    """``available`` for a message, short even for a range of thousands."""
    return f"[{available[0]}, ..., {available[-1]}]" if len(available) > 16 else str(list(available))


def requested_ids(devices: int | str | Sequence[int], available: Sequence[int]) -> list[int] | None:
    """The indices ``devices`` asks for, unchecked: ``None`` for none (``0``, ``"0"``, ``[]``), all of ``available`` for
    ``-1``, ``[0..n)`` for a count ``n``, the list itself for a list or an index string.

    Raises:
        TypeError: a value of another type.
        MisconfigurationException: a negative count other than -1, or -1 where no device is available.
    """
    _check_data_type(devices)
    if isinstance(devices, (MutableSequence, tuple)):
        return list(devices) or None
    value = _normalize_parse_gpu_string_input(devices)  # type: ignore[arg-type]
    if isinstance(value, list):
        return value
    if value == 0:
        return None
    if value == -1:
        if not available:
            raise MisconfigurationException(
                f"GPUs requested but none are available: devices={devices!r} means every GPU, and this machine has"
                " none. Use accelerator='cpu'."
            )
        return list(available)
    if value < 0:
        raise MisconfigurationException(
            f"devices={devices!r} is no device count: a count must be > 0, or -1 for every GPU."
        )
    return list(range(value))


def check_available(ids: list[int], available: Sequence[int]) -> list[int]:
    """``ids`` unchanged when each is listed once and in ``available``, else ``MisconfigurationException``."""
    _check_unique(ids)
    missing = [i for i in ids if i not in available]
    if missing:
        usable = min(len(ids), len(available)) or 1
        raise MisconfigurationException(
            f"You requested gpu: {ids}\n But your machine only has: {_shown(available)} ({missing} missing)."
            f" Use devices={usable} or indices from that list."
        )
    return ids


def parse_device_ids(
    devices: int | str | Sequence[int], available: Sequence[int], *, one_device_per_process: bool = False
) -> list[int] | None:
    """The GPU indices ``devices`` selects among ``available``; ``None`` for none (``0``, ``"0"``, ``[]``).

    With ``one_device_per_process`` (a launcher gave each process one visible GPU), another count is returned
    unchecked: it counts the node's processes, not this process's GPUs.

    Raises:
        TypeError: a value that is not an int, a string or a sequence of ints.
        MisconfigurationException: a negative count other than -1, an index listed twice or missing.
    """
    ids = requested_ids(devices, available)
    if ids is None:
        return None
    if one_device_per_process and len(ids) != 1 and len(available) == 1:
        return ids
    return check_available(ids, available)
