"""Measuring: wall-clock time, counted arithmetic, and formatting numbers that vary from run to run.

Measured times are printed through :func:`fmt_seconds` and :func:`fmt_ratio`, so the
notebook tests (nbval) can recognise and ignore them while comparing everything else.
"""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable

import torch


def fmt_seconds(seconds: float) -> str:
    """``0.0123 -> '12.3 ms'``, ``2.5 -> '2.50 s'``."""
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def fmt_ratio(ratio: float, word: str = "faster") -> str:
    """A ratio of two measured times, e.g. ``'8.7× faster'``."""
    return f"{ratio:.1f}× {word}"


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work so that a timer measures it (no-op on the CPU)."""
    if torch.cuda.is_available() and (device is None or torch.device(device).type == "cuda"):
        torch.cuda.synchronize()


def time_call(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> list[float]:
    """Run ``fn`` ``warmup`` times unmeasured, then ``repeats`` times; return each run's seconds."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - t0)
    return times


def median_seconds(fn: Callable[[], Any], *, repeats: int = 3, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``fn`` (see :func:`time_call`)."""
    return statistics.median(time_call(fn, repeats=repeats, warmup=warmup))


def count_flops(fn: Callable[[], Any]) -> int:
    """Floating-point operations PyTorch counts while ``fn`` runs (a multiply-add counts as 2)."""
    from torch.utils.flop_counter import FlopCounterMode

    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        fn()
    return counter.get_total_flops()
