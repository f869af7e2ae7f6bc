"""The one stopwatch every timed piece of the package uses (generation steps, experiments,
the benchmark): wall-clock seconds, with queued GPU work waited for at both ends.

On a GPU, PyTorch returns from an operation before the work is done; a timer that does not
wait (``torch.cuda.synchronize``) measures only how long it took to queue the work.
"""
from __future__ import annotations

import statistics
import time

import torch

__all__ = ["sync", "Stopwatch", "median_seconds"]


def sync(device: torch.device | str | None = None) -> None:
    """Wait for queued GPU work so that a timer measures it (no-op on the CPU).

    ``device=None`` waits for the current CUDA device when CUDA is available. An Apple GPU
    (``"mps"``) is waited for too.
    """
    kind = None if device is None else torch.device(device).type
    if kind == "mps":
        torch.mps.synchronize()
    elif kind in (None, "cuda") and torch.cuda.is_available():
        torch.cuda.synchronize(device)


class Stopwatch:
    """``with Stopwatch(device) as watch: ...`` then ``watch.seconds``.

    Waits for ``device`` (see :func:`sync`) before starting and before stopping.
    """

    def __init__(self, device: torch.device | str | None = None) -> None:
        self.device = device
        self.seconds = 0.0

    def __enter__(self) -> "Stopwatch":
        sync(self.device)
        self._start = time.perf_counter()
        return self

    def __exit__(self, *exc) -> None:
        sync(self.device)
        self.seconds = time.perf_counter() - self._start


def median_seconds(fn, device: torch.device | str | None = None, repeats: int = 3, warmup: int = 1,
                   budget_s: float | None = None) -> float:
    """The one median timer of the package (measurements, notebooks, the fast path's kernel choice).

    Median seconds of ``fn()`` over ``repeats`` calls after ``warmup`` unmeasured ones, each
    timed by a :class:`Stopwatch` that waits for ``device``'s queued work at both ends. With
    ``budget_s``, a slow ``fn`` is called fewer times: as many as fit in ``budget_s`` by the last
    warm-up call's time, at least 3 and at most ``repeats``."""
    for _ in range(warmup):
        with Stopwatch(device) as watch:
            fn()
    if budget_s is not None and warmup:
        repeats = max(3, min(repeats, int(budget_s / max(watch.seconds, 1e-9))))
    times = []
    for _ in range(repeats):
        with Stopwatch(device) as watch:
            fn()
        times.append(watch.seconds)
    return statistics.median(times)
