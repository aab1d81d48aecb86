"""Parsing of Kubernetes-style quantities into gpupool's units, with errors that say what is wrong."""

from __future__ import annotations

import re

_MEMORY_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*$")

# Factors to MiB. Decimal suffixes (k, M, G, T) are converted exactly and then rounded down, because
# granting a fraction of a MiB more than asked could overcommit a card.
_MIB_FACTORS: dict[str, float] = {
    "": 1.0,  # a bare number for gpu-memory means MiB (the unit of gpupool.io/gpu-memory)
    "Mi": 1.0,
    "Gi": 1024.0,
    "Ti": 1024.0 * 1024.0,
    "Ki": 1.0 / 1024.0,
    "k": 1000.0 / 1048576.0,
    "M": 1e6 / 1048576.0,
    "G": 1e9 / 1048576.0,
    "T": 1e12 / 1048576.0,
}


class QuantityError(ValueError):
    """A quantity string that cannot be understood; the message names the value and the rule."""


def parse_memory_mib(value: str | int) -> int:
    """Parse `10Gi`, `512Mi`, `2048` (MiB) or `16G` into whole MiB (rounded down)."""
    if isinstance(value, bool):
        raise QuantityError(f"memory {value!r}: expected a number of MiB or a quantity like 512Mi")
    if isinstance(value, int):
        if value < 0:
            raise QuantityError(f"memory {value}: must not be negative")
        return value
    m = _MEMORY_RE.match(value)
    if m is None:
        if value.strip().startswith("-"):
            raise QuantityError(f"memory {value!r}: must not be negative")
        raise QuantityError(f"memory {value!r}: expected a number with an optional unit (Mi, Gi, Ti, M, G)")
    number, unit = m.groups()
    if unit not in _MIB_FACTORS:
        units = ", ".join(u for u in _MIB_FACTORS if u)
        raise QuantityError(f"memory {value!r}: unknown unit {unit!r} (use one of {units})")
    return int(float(number) * _MIB_FACTORS[unit])


def parse_cores_percent(value: str | int) -> int:
    """Parse a compute share `30`, `30%` into an integer percent in 1..100."""
    if isinstance(value, bool):
        raise QuantityError(f"cores {value!r}: expected a percent such as 30 or 30%")
    if isinstance(value, int):
        number = value
    else:
        text = value.strip().removesuffix("%").strip()
        try:
            number = int(text)
        except ValueError:
            raise QuantityError(f"cores {value!r}: expected a whole percent such as 30 or 30%") from None
    if not 1 <= number <= 100:
        raise QuantityError(f"cores {value!r}: must be between 1 and 100 percent of one GPU")
    return number
