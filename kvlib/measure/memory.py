"""Working memory: the peak bytes of tensors alive at once while a piece of code runs."""
from __future__ import annotations

from typing import Any, Callable

import torch

__all__ = ["TensorMemoryTracker", "peak_memory", "fmt_bytes"]


def _storage_ids(values) -> set[int]:
    """Ids of the storages of the tensors among ``values`` (one level of lists and tuples deep,
    which is how operators take tensors)."""
    ids = set()
    for a in values:
        if isinstance(a, torch.Tensor):
            ids.add(id(a.untyped_storage()))
        elif isinstance(a, (list, tuple)):
            ids.update(id(b.untyped_storage()) for b in a if isinstance(b, torch.Tensor))
    return ids


class TensorMemoryTracker:
    """Peak bytes of tensors that are alive at once while a block runs (working memory).

    Only tensors created inside the block count (weights made before it do not); a view
    shares its base's memory and is counted once. It watches every PyTorch operation
    through a dispatch mode, so it works the same on the CPU and on a GPU, and it sees
    the memory the *program* asks for, not what the allocator keeps in reserve.

    >>> with TensorMemoryTracker() as mem:
    ...     y = torch.ones(1000) * 2
    >>> mem.peak_bytes >= 4000
    True
    """

    def __init__(self) -> None:
        self.live_bytes = 0
        self.peak_bytes = 0
        self._live: set[int] = set()

    def _created(self, t: torch.Tensor) -> None:
        import weakref

        storage = t.untyped_storage()
        key = id(storage)
        if key in self._live or storage.nbytes() == 0:
            return
        self._live.add(key)
        self.live_bytes += storage.nbytes()
        self.peak_bytes = max(self.peak_bytes, self.live_bytes)
        weakref.finalize(storage, self._freed, key, storage.nbytes())

    def _freed(self, key: int, nbytes: int) -> None:
        if key in self._live:
            self._live.discard(key)
            self.live_bytes -= nbytes

    def __enter__(self) -> "TensorMemoryTracker":
        from torch.utils._python_dispatch import TorchDispatchMode

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                results = [t for t in (out if isinstance(out, (tuple, list)) else (out,)) if isinstance(t, torch.Tensor)]
                if results:
                    # A view or an in-place result shares an input's memory: not new memory.
                    inputs = _storage_ids(args)
                    if kwargs:
                        inputs |= _storage_ids(kwargs.values())
                    for t in results:
                        if id(t.untyped_storage()) not in inputs:
                            tracker._created(t)
                return out

        self._mode = _Mode()
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        self._live.clear()          # stop counting frees that happen after the block


def peak_memory(fn: Callable[[], Any]) -> int:
    """Peak bytes of working memory (tensors alive at once) while ``fn`` runs."""
    with TensorMemoryTracker() as mem:
        fn()
    return mem.peak_bytes


def fmt_bytes(n: float) -> str:
    """``1536 -> '1.5 KiB'``."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError
