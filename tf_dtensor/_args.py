"""Argument conversion for the public wrappers: plain `TypeError`s that name the argument
and the value, instead of pybind11's dump of the C++ signature. Values are only
converted here; what they mean is checked in C++."""

from __future__ import annotations

import numbers
from typing import Any, List, Sequence


def _got(value: Any) -> str:
    return f"{value!r} ({type(value).__name__})"


def string(value: Any, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str; got {_got(value)}.")
    return value


def strings(values: Any, what: str) -> List[str]:
    if isinstance(values, (str, bytes)):
        raise TypeError(f"{what} must be a list of str; got the string {values!r}. "
                        f"Did you mean [{values!r}]?")
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a list of str; got {_got(values)}.") from None
    for i, item in enumerate(items):
        if not isinstance(item, str):
            raise TypeError(f"{what} must be a list of str; entry {i} is {_got(item)}.")
    return items


def integer(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{what} must be an int; got {_got(value)}.")
    return int(value)


def integers(values: Sequence[Any], what: str, unknown_as: Any = "error") -> List[int]:
    """Ints from a sequence; with `unknown_as` set, None entries become that value."""
    try:
        items = list(values)
    except TypeError:
        raise TypeError(f"{what} must be a sequence of int; got {_got(values)}.") from None
    out = []
    for i, item in enumerate(items):
        if item is None and unknown_as != "error":
            out.append(unknown_as)
            continue
        if isinstance(item, bool) or not isinstance(item, numbers.Integral):
            # numpy and TF dimension objects convert through __index__.
            try:
                out.append(item.__index__())
                continue
            except (AttributeError, TypeError):
                raise TypeError(f"{what} must be a sequence of int; entry {i} is "
                                f"{_got(item)}.") from None
        out.append(int(item))
    return out
