"""Sizes as the ``warren`` command and its config file take them: a number of bytes, or a
number with a unit (``16MiB``, ``50 MB``, ``1.5GiB``); decimal and binary units both, as
RabbitMQ's ``disk_free_limit`` takes them."""

from __future__ import annotations

import re
from typing import Any

from ..errors import UsageError

__all__ = ["parse_size"]

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_SIZE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*")


def parse_size(value: Any, what: str) -> int:
    """Bytes from an int or a string such as ``"16MiB"`` or ``"50 MB"``."""
    number: float
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        number, unit = value, ""
    elif isinstance(value, str) and (match := _SIZE.fullmatch(value)):
        number, unit = float(match.group(1)), match.group(2).lower()
    else:
        raise UsageError(f"{what} must be a number of bytes or a size such as 16MiB, got {value!r}")
    if unit not in _UNITS:
        raise UsageError(f"{what}: unknown unit {unit!r} (use one of kB MB GB KiB MiB GiB)")
    return int(number * _UNITS[unit])
