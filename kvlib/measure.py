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
    """``0.0123 -> '12.3 ms'``, ``2.5 -> '2.50 s'`` (a difference of times may be negative: ``'-1.2 ms'``)."""
    sign, seconds = ("-" if seconds < 0 else ""), abs(seconds)
    if seconds < 1e-3:
        return f"{sign}{seconds * 1e6:.0f} µs"
    if seconds < 1:
        return f"{sign}{seconds * 1e3:.1f} ms"
    return f"{sign}{seconds:.2f} s"


def fmt_ratio(ratio: float, word: str = "faster") -> str:
    """A ratio of two measured times, e.g. ``'8.7× faster'``."""
    return f"{ratio:.1f}× {word}"


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


def _sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """FLOPs of one fused attention call, as PyTorch counts its GPU kernels: both matmuls
    (scores ``q @ k^T`` and the weighted sum ``p @ v``) over every query-key pair, mask or
    not (the counter does not discount the causal mask); grouped-query heads broadcast."""
    b, h_q, s_q, d_qk = query_shape
    d_v = value_shape[-1]
    s_k = key_shape[-2]
    return 2 * b * h_q * s_q * s_k * d_qk + 2 * b * h_q * s_q * s_k * d_v


def count_flops(fn: Callable[[], Any]) -> int:
    """Floating-point operations PyTorch counts while ``fn`` runs (a multiply-add counts as 2).

    Matrix products (every ``nn.Linear``, ``@``) and attention are counted; element-wise
    work (norms, RoPE, softmax, activations) is not. ``FlopCounterMode`` has no formula
    for the CPU attention kernel (``_scaled_dot_product_flash_attention_for_cpu``) and
    would count attention as 0 on a CPU; we give it the formula it uses for its GPU
    attention kernels, so a CPU counts attention the way PyTorch counts it on a GPU.
    """
    from torch.utils.flop_counter import FlopCounterMode

    mapping = {}
    cpu_sdpa = getattr(torch.ops.aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if cpu_sdpa is not None:
        mapping[cpu_sdpa] = _sdpa_flops
    with torch.no_grad(), FlopCounterMode(display=False, custom_mapping=mapping) as counter:
        fn()
    return counter.get_total_flops()


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
        from torch.utils._pytree import tree_leaves

        tracker = self

        class _Mode(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                out = func(*args, **(kwargs or {}))
                # A view or an in-place result shares an input's memory: not new memory.
                inputs = {id(a.untyped_storage()) for a in tree_leaves((args, kwargs))
                          if isinstance(a, torch.Tensor)}
                for t in tree_leaves(out):
                    if isinstance(t, torch.Tensor) and id(t.untyped_storage()) not in inputs:
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


def matmul_flops_per_second(n: int = 1024, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Floating-point operations per second of one dense ``(n, n) @ (n, n)`` product on this
    machine, with the current thread count: the arithmetic a compute-bound step can hope for.

    The median of ``repeats`` timed products after a warm-up; ``2 n³`` FLOPs each.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / median_seconds(lambda: a @ b, repeats=repeats, warmup=1)


def next_token_agreement(reference: torch.Tensor, other: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """How far ``other``'s next-token predictions are from ``reference``'s, position by position.

    Both are logits of shape ``(..., vocab)``. Returns ``(kl, same_top1)`` of shape ``(...)``:
    the KL divergence ``KL(p_reference || p_other)`` of the two softmax distributions in nats
    (computed in float64, so it is not itself a rounding artefact), and whether the two agree
    on the most likely token.
    """
    if reference.shape != other.shape:
        raise ValueError(f"logits of different shapes: {tuple(reference.shape)} and {tuple(other.shape)}")
    ref = torch.log_softmax(reference.double(), dim=-1)
    oth = torch.log_softmax(other.double(), dim=-1)
    kl = (ref.exp() * (ref - oth)).sum(dim=-1)
    return kl, reference.argmax(dim=-1) == other.argmax(dim=-1)
