"""The one stopwatch every timed piece of the package uses (generation steps, experiments,
the benchmark): wall-clock seconds, with queued GPU work waited for at both ends.

On a GPU, PyTorch returns from an operation before the work is done; a timer that does not
wait (``torch.cuda.synchronize``) measures only how long it took to queue the work.
"""
from __future__ import annotations

import time

import torch

__all__ = ["sync", "Stopwatch"]


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
