"""Which GPU indices a ``devices=`` value selects: one pure parser over the value and the indices a machine has.

fabric_lite's plan (with its machine snapshot), the accelerators' ``parse_devices`` and Lightning's
:mod:`fabric_lite.utilities.device_parser` (with the indices this machine has) all call :func:`parse_device_ids`, so
a value means the same everywhere. It reads nothing itself; the errors carry Lightning's wording and fabric_lite's fix.
"""

from __future__ import annotations

import re
from collections.abc import MutableSequence, Sequence

from fabric_lite.utilities.exceptions import MisconfigurationException

_TYPE_MESSAGE = "Device IDs (GPU/TPU) must be an int, a string, a sequence of ints, but you passed"
_CHOICES = "Use an int, -1 for every GPU, a list of indices such as [0, 1], a string such as '0,1', or 'auto'."


def _check_data_type(device_ids: object) -> None:
    """Refuse a value that is not an int, a string or a sequence of ints (a bool is no int here).

    Raises:
        TypeError: naming what was passed.
    """
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
    """Refuse an index listed twice (the backends cannot use one device twice).

    Raises:
        MisconfigurationException: naming the list.
    """
    if len(device_ids) != len(set(device_ids)):
        raise MisconfigurationException(
            f"Device ID's (GPU) must be unique: {list(device_ids)} lists a device twice; each device can be used once."
            " Example: [0, 1]."
        )


def _normalize_parse_gpu_string_input(s: int | str | list[int]) -> int | list[int]:
    """A string as the number or the index list it spells (``"-1"``, ``"3"``, ``"0, 2"``, ``"1,"``); other values
    unchanged.

    Raises:
        TypeError: a string that spells neither.
    """
    if not isinstance(s, str):
        return s
    parts = [part.strip() for part in s.split(",")]
    numbers = [part for part in parts if part]
    if not numbers or not all(re.fullmatch("-?[0-9]+", part) for part in numbers):
        raise TypeError(f"{_TYPE_MESSAGE} {s!r}, which is no number or list of indices. {_CHOICES}")
    if len(parts) > 1:
        return [int(part) for part in numbers]
    return int(numbers[0])


def _shown(available: Sequence[int]) -> str:
    """``available`` for a message, short even when it is a range of thousands."""
    if len(available) > 16:
        return f"[{available[0]}, ..., {available[-1]}]"
    return str(list(available))


def requested_ids(devices: int | str | Sequence[int], available: Sequence[int]) -> list[int] | None:
    """The indices ``devices`` asks for, before they are checked against ``available``: ``None`` for no GPU (``0``,
    ``"0"``, ``[]``), all of ``available`` for ``-1``/``"-1"``, ``[0..n)`` for a count ``n``, the list itself for a
    list or an index string.

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
    """``ids`` unchanged when each is listed once and exists in ``available``.

    Raises:
        MisconfigurationException: an index listed twice, or one this machine does not have.
    """
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
    """The GPU indices ``devices`` selects on a machine with the device indices ``available``; ``None`` when it
    selects none (``0``, ``"0"``, ``[]``).

    With ``one_device_per_process`` (a launcher such as torchrun gave each process one visible GPU), a request for
    any other number of devices is returned as it is: it counts the processes on the node, not this process's GPUs.

    Example::

        parse_device_ids("1, 3", range(4))  # [1, 3]
        parse_device_ids(-1, range(2))      # [0, 1]
        parse_device_ids(3, range(2))       # MisconfigurationException: You requested gpu: [0, 1, 2] ...

    Raises:
        TypeError: a value that is neither an int, a string nor a sequence of ints.
        MisconfigurationException: a negative count other than -1, an index listed twice or missing.
    """
    ids = requested_ids(devices, available)
    if ids is None:
        return None
    if one_device_per_process and len(ids) != 1 and len(available) == 1:
        return ids
    return check_available(ids, available)
