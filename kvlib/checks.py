"""Argument checks shared by the whole package: one place that says what a valid count is.

Each check returns the value it was given, so it can be used inline, and raises a
``ValueError`` (or ``TypeError`` for a value of the wrong kind) whose message names the
argument, says what it must be, and shows what it got. ``True`` is not accepted as the
number 1: a bool passed as a count is almost always a mistake.
"""
from __future__ import annotations

import operator
from typing import Any


def as_int(value: Any) -> int | None:
    """``value`` as a Python int if it is an integer (NumPy integers too) and not a bool, else ``None``."""
    if isinstance(value, bool):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def is_int(value: Any) -> bool:
    """An integer (NumPy integers too) that is not a ``bool``."""
    return as_int(value) is not None


def positive_int(name: str, value: Any) -> int:
    """``value`` as an int if it is an integer >= 1 (not a bool); otherwise a ``ValueError`` naming ``name``."""
    n = as_int(value)
    if n is None or n < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return n


def non_negative_int(name: str, value: Any) -> int:
    """``value`` as an int if it is an integer >= 0 (not a bool); otherwise a ``ValueError`` naming ``name``."""
    n = as_int(value)
    if n is None or n < 0:
        raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return n


def optional_positive_int(name: str, value: Any) -> int | None:
    """``None``, or a positive int (see :func:`positive_int`)."""
    return None if value is None else positive_int(name, value)
