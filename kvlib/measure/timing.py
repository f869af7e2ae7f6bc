"""Measuring time, and printing measured figures in forms the notebook tests recognise.

Measured times are printed through :func:`fmt_seconds` and :func:`fmt_ratio`, and other
machine-dependent figures through :func:`fmt_approx`, so the notebook tests (nbval, with
``tests/nbval_sanitize.cfg``) can replace them while comparing everything else exactly.
"""
from __future__ import annotations

from ..clock import Stopwatch, median_seconds, sync     # the one stopwatch and the one median timer

__all__ = ["fmt_seconds", "fmt_ratio", "fmt_approx", "fmt_exponent", "fmt_verdict", "sync", "Stopwatch",
           "median_seconds"]


def fmt_seconds(seconds: float) -> str:
    """``0.0123 -> '12.3 ms'``, ``2.5 -> '2.50 s'`` (a difference of times may be negative: ``'-1.2 ms'``)."""
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 1e-3:
        return f"{sign}{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{sign}{seconds * 1e3:.1f} ms"
    return f"{sign}{seconds:.2f} s"


_OPPOSITE = {"faster": "slower", "slower": "faster"}


def fmt_ratio(ratio: float, word: str = "faster") -> str:
    """A ratio of two measured times or rates, e.g. ``'8.7× faster'``: ``ratio`` times ``word``
    (``"faster"`` or ``"slower"``), or, below 1, its inverse with the opposite word (``0.8`` ``"faster"``
    is ``'1.2× slower'``), so that a ratio never reads backwards. Which word comes out depends on
    the machine near 1: ``tests/nbval_sanitize.cfg`` replaces the number and the word."""
    if word not in _OPPOSITE:
        raise ValueError(f"word must be 'faster' or 'slower', got {word!r}")
    return f"{ratio:.1f}× {word}" if ratio >= 1 else f"{1 / ratio:.1f}× {_OPPOSITE[word]}"


def fmt_approx(value: float, spec: str = ".1e") -> str:
    """A figure that depends on the machine, e.g. ``'≈ 8.3e-07'``: a rounding difference, a
    quality measure computed through rounded arithmetic, a fitted exponent.

    Such a figure differs between CPUs, BLAS kernels and thread counts, so the notebook
    tests (``tests/nbval_sanitize.cfg``) replace the pattern ``≈ <number>`` before comparing.
    Print it beside a fact that holds with margin on every machine (``below 1e-5: True``),
    which nbval does compare. ``spec`` is the format of the number (``".3f"``, ``".1%"``, ...).
    """
    return f"≈ {value:{spec}}"


def fmt_exponent(exponent: float) -> str:
    """A growth exponent fitted to *measured* times, e.g. ``'measured exponent ≈ 1.43'``
    (a :func:`fmt_approx` figure; exponents of counted FLOPs are exact and printed as plain
    numbers)."""
    return f"measured exponent {fmt_approx(exponent, '.2f')}"


def fmt_verdict(verdict: str) -> str:
    """A conclusion drawn from this machine's measurements, e.g. ``'→ the draft pays here'``: which
    kernel wins, whether a step is memory-bound, which engine is ahead. It differs between
    machines, so it ends its line, after the measured figures it is drawn from, and the notebook
    tests (``tests/nbval_sanitize.cfg``) replace everything from the arrow to the end of the line.
    The prose beside it says what to expect either way."""
    if "\n" in verdict:
        raise ValueError("a verdict is one line: it is replaced up to the end of its line")
    return f"→ {verdict}"


