"""Argument checks shared by the public constructors (each error names the argument)."""

from __future__ import annotations

import math


def check_int(name: str, value: object, minimum: int) -> int:
    """`value` if it is an int (bools refused) >= `minimum`, else `ValueError` naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


def check_name(name: str, value: object) -> str:
    """`value` if it is a non-empty str, else `ValueError` naming it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{name} must be a non-empty str, got {value!r}")
    return value


def check_number(name: str, value: object, low: float, high: float = math.inf) -> float:
    """`value` as a float if it is a finite real number (bools refused) in [low, high]."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number, got {value!r}")
    if not low <= value <= high:
        raise ValueError(f"{name} must be in [{low}, {high}], got {value!r}")
    return float(value)
