"""Kubernetes quantities (`10Gi`, `16G`, `500m`, `1e3`, `10240`) read exactly, then converted to the
units gpupool counts in: milli-CPU, MiB, whole numbers of GPUs and percent.

The grammar is the API server's (resource.Quantity): a signed decimal number, then one suffix: a binary
SI one (Ki Mi Gi Ti Pi Ei), a decimal SI one (n u m k M G T P E, or none) or a decimal exponent (e3,
E-2). The number is kept as a Fraction so that `0.1Gi` or `1.5e3` convert without float error.

`core.quantity.parse_memory_mib` reads the common subset; this module is the full reader for the wire
and says, in each error, which value broke which rule.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from functools import lru_cache

from gpupool.core.quantity import QuantityError

__all__ = ["QuantityError", "parse_quantity", "format_quantity", "cpu_milli", "bytes_to_mib", "memory_mib",
           "gpu_memory_mib", "whole_number"]

_NUMBER = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_QUANTITY_RE = re.compile(rf"^({_NUMBER})(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?$")

_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 1000), "": Fraction(1),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9), "T": Fraction(10**12),
    "P": Fraction(10**15), "E": Fraction(10**18),
}
_MIB = 2**20
# Longer text is not a quantity anyone means; refusing it early keeps a hostile pod from making the
# reader build huge integers (`1e999999999`).
_MAX_TEXT = 64
_MAX_EXPONENT = 30


def _describe(what: str, value: object) -> str:
    return f"{what} {value!r}"


# Pods repeat the same few quantities ("1", "30", "8Gi") and the scheduler reads every pod again at each
# restart: remembering the last few thousand texts makes a parse a dictionary hit. Bounded, so hostile
# values cannot grow it; errors are not remembered (they are raised again each time).
_CACHE = 4096


def parse_quantity(value: object, what: str = "quantity") -> tuple[Fraction, bool]:
    """(the number in base units, whether it had a suffix). `what` names the value in errors."""
    if isinstance(value, str):
        return _parse_text(value, what)
    return _parse(value, what)


@lru_cache(maxsize=_CACHE)
def _parse_text(value: str, what: str) -> tuple[Fraction, bool]:
    return _parse(value, what)


def _parse(value: object, what: str) -> tuple[Fraction, bool]:
    if isinstance(value, bool) or value is None:
        raise QuantityError(f"{_describe(what, value)}: expected a quantity such as 10Gi, 500m or 2")
    if isinstance(value, int):
        return Fraction(value), False
    if isinstance(value, float):
        if not math.isfinite(value):
            raise QuantityError(f"{_describe(what, value)}: not a finite number")
        return Fraction(value), False
    text = str(value).strip()
    if len(text) > _MAX_TEXT:
        raise QuantityError(f"{_describe(what, text[:20] + '...')}: longer than {_MAX_TEXT} characters")
    m = _QUANTITY_RE.match(text)
    if m is None:
        raise QuantityError(
            f"{_describe(what, value)}: not a Kubernetes quantity (a number with an optional suffix: "
            "Ki, Mi, Gi, Ti, m, k, M, G, T or an exponent like e3)"
        )
    number, suffix = Fraction(m.group(1)), m.group(2) or ""
    if suffix in _BINARY:
        return number * _BINARY[suffix], True
    if suffix in _DECIMAL:
        return number * _DECIMAL[suffix], suffix != ""
    exponent = int(suffix[1:])
    if abs(exponent) > _MAX_EXPONENT:
        raise QuantityError(f"{_describe(what, value)}: exponent {exponent} is out of range")
    # An exponent only scales the number: `1e3` is "1000", still unitless.
    return number * Fraction(10) ** exponent, False


def format_quantity(amount: Fraction, suffix: str = "") -> str:
    """Write `amount` (base units) with `suffix` as the API server would accept it back; only exact
    representations are written (the caller picks a suffix that divides the amount)."""
    scale = Fraction(_BINARY[suffix]) if suffix in _BINARY else _DECIMAL[suffix]
    value = amount / scale
    if value.denominator != 1:
        raise ValueError(f"{amount} is not a whole number of {suffix or 'units'}")
    return f"{value.numerator}{suffix}"


def _non_negative(amount: Fraction, what: str, value: object) -> None:
    if amount < 0:
        raise QuantityError(f"{_describe(what, value)}: must not be negative")


@lru_cache(maxsize=_CACHE)
def _cached(convert: str, value: str, what: str) -> int:
    return int(_CONVERTERS[convert](value, what))


def _fast(convert: str, value: object, what: str) -> int | None:
    return _cached(convert, value, what) if isinstance(value, str) else None


def cpu_milli(value: object, what: str = "cpu") -> int:
    """CPU in milli-cores, rounded up as the API server does (`0.0001` -> 1m)."""
    fast = _fast("cpu", value, what)
    return fast if fast is not None else _cpu_milli(value, what)


def _cpu_milli(value: object, what: str) -> int:
    amount, _ = parse_quantity(value, what)
    _non_negative(amount, what, value)
    return math.ceil(amount * 1000)


def bytes_to_mib(amount: Fraction, round_up: bool) -> int:
    mib = amount / _MIB
    return math.ceil(mib) if round_up else math.floor(mib)


def memory_mib(value: object, what: str = "memory") -> int:
    """Container memory (`resources.requests.memory`): unitless is bytes, as in Kubernetes. Rounded up to
    whole MiB: a request is what the pod needs, so a fraction of a MiB still needs that MiB."""
    fast = _fast("memory", value, what)
    return fast if fast is not None else _memory_mib(value, what)


def _memory_mib(value: object, what: str) -> int:
    amount, _ = parse_quantity(value, what)
    _non_negative(amount, what, value)
    return bytes_to_mib(amount, round_up=True)


# The API server rewrites a quantity in its canonical form, so a unitless MiB count arrives with a decimal
# suffix: `20000` is stored as `20k`, `2000000` as `2M`. A decimal-suffixed amount below this many is such
# a count of MiB (as bytes it would be under 2 MiB, which nobody asks of a GPU); from it up it is bytes
# (`16G`; as MiB it would be over 2 TiB, which no GPU has).
DECIMAL_MIB_BELOW = 2 * 2**20


def gpu_memory_mib(value: object, what: str = "gpupool.io/gpu-memory") -> int:
    """GPU memory per GPU: unitless (`10240`, `1e3`) is MiB, gpupool's unit for this resource; with a
    binary suffix (`10Gi`) the quantity is bytes; with a decimal one, bytes (`16G`) unless it is the API
    server's canonical form of a unitless count (`20k` for 20000 MiB; DECIMAL_MIB_BELOW). Bytes are rounded
    down to whole MiB (granting a fraction of a MiB more than asked could overcommit a card)."""
    fast = _fast("gpu-memory", value, what)
    return fast if fast is not None else _gpu_memory_mib(value, what)


def _gpu_memory_mib(value: object, what: str) -> int:
    amount, has_suffix = parse_quantity(value, what)
    _non_negative(amount, what, value)
    decimal = has_suffix and isinstance(value, str) and value.strip()[-1:] in ("k", "M", "G", "T", "P", "E")
    if not has_suffix or (decimal and amount < DECIMAL_MIB_BELOW):
        if amount.denominator != 1:
            raise QuantityError(f"{_describe(what, value)}: a number of MiB must be whole (or give a unit: 1536Mi)")
        return int(amount)
    return bytes_to_mib(amount, round_up=False)


def whole_number(value: object, what: str) -> int:
    """A count or percent: a quantity that must be a whole number (`2`, `1e2`, `30`; `30%` is accepted
    because gpupool's docs once showed it, and means 30)."""
    fast = _fast("whole", value, what)
    return fast if fast is not None else _whole_number(value, what)


def _whole_number(value: object, what: str) -> int:
    if isinstance(value, str) and value.strip().endswith("%"):
        value = value.strip()[:-1]
    amount, _ = parse_quantity(value, what)
    if amount.denominator != 1:
        raise QuantityError(f"{_describe(what, value)}: must be a whole number")
    return int(amount)


_CONVERTERS = {"cpu": _cpu_milli, "memory": _memory_mib, "gpu-memory": _gpu_memory_mib, "whole": _whole_number}
