"""Dataclasses as JSON and back: what the controller's part of a checkpoint is made of.

A state is written with `dataclasses.asdict` and read back by `decode`, which rebuilds each
dataclass from its field types and refuses anything that does not fit (an unknown field, a
wrong type), naming where. A field added later with a default reads from an older file as
its default.
"""

from __future__ import annotations

import dataclasses
import types
from typing import Any, Literal, TypeVar, Union, get_args, get_origin, get_type_hints

T = TypeVar("T")


class CheckpointError(ValueError):
    """A checkpoint (or a part of one read back) is missing, incomplete, damaged or of another
    format."""


def decode(tp: Any, value: Any, where: str) -> Any:
    """`value` (parsed JSON) as type `tp`: dataclasses, tuples, unions with None, literals,
    str / int / float / bool."""
    origin, args = get_origin(tp), get_args(tp)
    if dataclasses.is_dataclass(tp) and isinstance(tp, type):
        return _dataclass(tp, value, where)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        errors = []
        for option in (a for a in args if a is not type(None)):
            try:
                return decode(option, value, where)
            except CheckpointError as e:
                errors.append(str(e))
        raise CheckpointError("; ".join(errors))
    if origin is tuple:
        if not isinstance(value, list):
            raise CheckpointError(f"{where}: expected a list, got {value!r:.80}")
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(decode(args[0], v, f"{where}[{i}]") for i, v in enumerate(value))
        if len(args) != len(value):
            raise CheckpointError(f"{where}: expected {len(args)} items, got {len(value)}")
        return tuple(
            decode(a, v, f"{where}[{i}]") for i, (a, v) in enumerate(zip(args, value, strict=True))
        )
    if origin is Literal:
        if value not in args:
            raise CheckpointError(f"{where}: {value!r} is not one of {list(args)}")
        return value
    if tp is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    if tp in (int, str, bool) and type(value) is tp:
        return value
    if tp is Any:
        return value
    raise CheckpointError(f"{where}: expected {getattr(tp, '__name__', tp)}, got {value!r:.80}")


def _dataclass(cls: type[T], value: Any, where: str) -> T:
    if not isinstance(value, dict):
        raise CheckpointError(f"{where}: expected an object, got {value!r:.80}")
    hints = get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    unknown = sorted(set(value) - names)
    if unknown:
        raise CheckpointError(f"{where}: unknown field(s) {unknown}")
    kwargs = {k: decode(hints[k], v, f"{where}.{k}") for k, v in value.items()}
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"{where}: {e}") from None
