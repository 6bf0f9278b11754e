"""Kubernetes resource quantities ("500m", "64Gi", "1e3") as plain numbers, for the planner's arithmetic."""

from __future__ import annotations

import re
from decimal import Decimal

from railyard.errors import ConfigError

_SUFFIX = {
    "": Decimal(1),
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}
_PATTERN = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))([eE][+-]?\d+|[KMGTPE]i|[numkMGTPE])?$")


def parse_quantity(value: str | int | float) -> Decimal:
    """The quantity's value in base units (cores for cpu, bytes for memory)."""
    if isinstance(value, (int, float)):
        return Decimal(str(value))
    match = _PATTERN.match(str(value).strip())
    if not match:
        raise ConfigError(f"{value!r} is not a Kubernetes quantity (e.g. '8', '500m', '64Gi')")
    number, suffix = match.group(1), match.group(2) or ""
    if suffix[:1] in ("e", "E"):
        return Decimal(number) * (Decimal(10) ** int(suffix[1:]))
    return Decimal(number) * _SUFFIX[suffix]


def milli(value: str | int | float) -> int:
    """Quantity in thousandths, rounded up, as kube-scheduler counts cpu (millicores)."""
    return int((parse_quantity(value) * 1000).to_integral_value(rounding="ROUND_CEILING"))


def units(value: str | int | float) -> int:
    """Quantity in whole units, rounded up (bytes of memory, count of GPUs or pods)."""
    return int(parse_quantity(value).to_integral_value(rounding="ROUND_CEILING"))
