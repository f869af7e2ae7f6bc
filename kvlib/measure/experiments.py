"""The chapter's experiments as functions: timing both decoders side by side, sweeping the
prompt length, compiling the decode step, measuring working memory, and measuring what a
rounded cache does to the next-token predictions over a text. Notebooks call these so their
cells stay short."""
from __future__ import annotations

import contextlib
import os
import statistics
import sys
from dataclasses import dataclass, field
from typing import Sequence

import torch

from ..cache.base import KVCache
from ..clock import Stopwatch
from .. import ops as kvlib_ops
from ..generate import Generation, generate
from .memory import peak_memory
from .roofline import decode_step_seconds, row_cost

@dataclass
class SpeedComparison:
    """One prompt generated with and without the cache: tokens, logits and wall-clock times.

    The uncached run makes the first ``n_uncached`` of the ``n_new`` tokens (all of them unless a
    time budget stopped it earlier), and the two are compared on those: the same tokens, and the
    time each took for them (``ratio``)."""

    prompt_len: int
    n_new: int
    cached: Generation
    uncached: Generation
    cached_seconds: list[float] = field(default_factory=list)      # whole runs of n_new tokens
    uncached_seconds: list[float] = field(default_factory=list)    # whole runs of n_uncached tokens

    @property
    def n_uncached(self) -> int:
        return len(self.uncached.tokens)

    @property
    def identical(self) -> bool:
        """Whether the uncached run's tokens are the cached run's first ``n_uncached``."""
        return self.cached.tokens[:self.n_uncached] == self.uncached.tokens

    @property
    def max_logit_diff(self) -> float:
        """Largest absolute difference between the logits the two paths chose each token from."""
        return float((self.cached.logits[:self.n_uncached] - self.uncached.logits).abs().max())

    @property
    def cached_median(self) -> float:
        return statistics.median(self.cached_seconds)

    @property
    def uncached_median(self) -> float:
        return statistics.median(self.uncached_seconds)

    @property
    def cached_seconds_for_uncached(self) -> float:
        """The cached run's time for the tokens the uncached run made: the whole run when it made them
        all, else its first ``n_uncached`` steps (the prefill and the steps after it)."""
        if self.n_uncached == self.n_new:
            return self.cached_median
        return self.cached.records and sum(r.seconds for r in self.cached.records[:self.n_uncached])

    @property
    def ratio(self) -> float:
        """How many times longer the uncached run took for the same tokens."""
        return self.uncached_median / self.cached_seconds_for_uncached


def _timed(model, prompt, n_new, use_cache, compile=False) -> tuple[Generation, float]:
    with Stopwatch() as watch:
        out = generate(model, prompt, n_new, use_cache=use_cache, keep_logits=True, compile=compile)
    return out, watch.seconds


def compare_speed(model: torch.nn.Module, prompt_ids: Sequence[int], n_new: int, *,
                  repeats_cached: int = 3, repeats_uncached: int = 1, warmup_tokens: int = 4,
                  uncached_budget_s: float | None = None, progress: bool = True) -> SpeedComparison:
    """Generate ``n_new`` greedy tokens both ways, in one process with the same thread count.

    A short warm-up of both paths runs first (untimed; the uncached one makes a single token, one
    step over the whole prompt), so that one-off costs such as memory allocation and kernel
    selection do not land on either side. Each timed run is the wall-clock time of a whole
    ``generate`` call; with several repeats the medians are compared. ``uncached_budget_s``:
    the uncached run makes only as many tokens as its warm-up step says fit in that many seconds
    (each later step is a little longer, its context a token longer), at least one; a slow
    machine compares fewer tokens, not a worse measurement.
    """
    generate(model, prompt_ids, warmup_tokens, use_cache=True)
    with Stopwatch() as warm:
        generate(model, prompt_ids, 1, use_cache=False)
    n_uncached = n_new
    if uncached_budget_s is not None:
        grows = (len(prompt_ids) + n_new) / len(prompt_ids)                  # the last step's context over the first's
        n_uncached = max(1, min(n_new, int(uncached_budget_s / (warm.seconds * grows))))
    runs = [(True, n_new)] * repeats_cached + [(False, n_uncached)] * repeats_uncached
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(runs), desc=f"{n_new} tokens, both ways", unit="run")
    gens: dict[bool, Generation] = {}
    seconds: dict[bool, list[float]] = {True: [], False: []}
    for use_cache, n in runs:
        out, s = _timed(model, prompt_ids, n, use_cache)
        gens[use_cache] = out
        seconds[use_cache].append(s)
        if bar is not None:
            bar.update()
    if bar is not None:
        bar.close()
    return SpeedComparison(len(prompt_ids), n_new, gens[True], gens[False], seconds[True], seconds[False])


def speed_sweep(model: torch.nn.Module, prompts: Sequence[Sequence[int]], n_new: int, *,
                progress: bool = True) -> list[SpeedComparison]:
    """:func:`compare_speed` (one timed run each way) for each prompt; a progress bar over the prompts."""
    items = prompts
    if progress:
        from tqdm.auto import tqdm
        items = tqdm(prompts, desc="prompt lengths", unit="prompt")
    return [compare_speed(model, p, n_new, repeats_cached=1, repeats_uncached=1, warmup_tokens=2,
                          progress=False) for p in items]


@dataclass
class CompiledComparison:
    """Cached decoding as written and compiled (``generate(..., compile=True)``), timed side by side."""

    compile_seconds: float     # the first compiled call: tracing and compiling the decode step
    eager: Generation
    compiled: Generation
    eager_seconds: list[float] = field(default_factory=list)
    compiled_seconds: list[float] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.eager.tokens == self.compiled.tokens

    @property
    def compiled_median(self) -> float:
        return statistics.median(self.compiled_seconds)

    @property
    def eager_step(self) -> float:
        """Median seconds of a one-token step (the prefill left out), as written."""
        return statistics.median(r.seconds for r in self.eager.records[1:])

    @property
    def compiled_step(self) -> float:
        """Median seconds of a one-token step, compiled."""
        return statistics.median(r.seconds for r in self.compiled.records[1:])


def compare_compiled(model: torch.nn.Module, prompt_ids: Sequence[int], n_new: int, *,
                     repeats: int = 3, progress: bool = True) -> CompiledComparison:
    """Compile the decode step once, then time cached generation as written and compiled, alternately.

    Alternating the runs puts any drift of the machine's speed on both sides alike.
    """
    bar = None
    if progress:
        from tqdm.auto import tqdm
        bar = tqdm(total=1 + 2 * repeats, desc="compiling the decode step", unit="run")
    with Stopwatch() as watch:
        generate(model, prompt_ids, 2, compile=True)
    compile_seconds = watch.seconds
    if bar is not None:
        bar.update()
        bar.set_description(f"{n_new} tokens, as written and compiled")
    gens: dict[bool, Generation] = {}
    seconds: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(repeats):
        for compiled in (False, True):
            gens[compiled], s = _timed(model, prompt_ids, n_new, True, compile=compiled)
            seconds[compiled].append(s)
            if bar is not None:
                bar.update()
    if bar is not None:
        bar.close()
    return CompiledComparison(compile_seconds, gens[False], gens[True], seconds[False], seconds[True])


@dataclass
class MemoryComparison:
    """Peak working memory (bytes of tensors alive at once) of generating with and without the cache."""

    prompt_len: int
    n_new: int
    cached: int          # the whole cached generation, the cache itself included
    uncached: int        # the uncached generation's largest step: only the last position's logits
    uncached_all_logits: int   # the same step computing logits for every position, as a naive loop does
    cache_bytes: int     # of which the KV cache itself


def compare_memory(model: torch.nn.Module, prompt_ids: Sequence[int], n_new: int) -> MemoryComparison:
    """Measure working memory both ways with :class:`kvlib.measure.TensorMemoryTracker`.

    The cached generation is measured whole. An uncached generation is a series of
    independent forward passes over a growing sequence, so its peak is the peak of its
    last and longest step (context ``prompt_len + n_new - 1``); that step is measured on
    its own instead of running every step (:func:`uncached_peak_is_last_step` checks
    this on a short run: the two agree up to the few kilobytes of the previous step's logits).
    """
    cache = KVCache.for_model(model, batch=1, max_len=len(prompt_ids) + n_new)
    cached = peak_memory(lambda: generate(model, prompt_ids, n_new, use_cache=True, cache=cache))
    # The cache was allocated outside the measured block; count it as the working memory it is.
    cached += cache.nbytes
    last = torch.randint(0, model.config.vocab_size, (1, len(prompt_ids) + n_new - 1),
                         generator=torch.Generator().manual_seed(0)).to(next(model.parameters()).device)
    with torch.no_grad():
        lean = peak_memory(lambda: model(last, last_only=True))
        naive = peak_memory(lambda: model(last))
    return MemoryComparison(len(prompt_ids), n_new, cached, lean, naive, cache.nbytes)


def uncached_peak_is_last_step(model: torch.nn.Module, prompt_ids: Sequence[int], n_new: int) -> tuple[int, int]:
    """(peak of a whole uncached generation, peak of its last step alone): equal when the claim holds."""
    ids = generate(model, prompt_ids, n_new, use_cache=False)
    whole = peak_memory(lambda: generate(model, prompt_ids, n_new, use_cache=False))
    last = torch.tensor([list(prompt_ids) + ids[:-1]], device=next(model.parameters()).device)
    with torch.no_grad():
        step = peak_memory(lambda: model(last, last_only=True))
    return whole, step


@dataclass
class BatchPoint:
    """Batched decoding at one batch size: the median one-token step, and the roofline's prediction
    (:func:`kvlib.measure.roofline.decode_step_seconds`: the weights once, every row's cache, the
    arithmetic of every row)."""

    batch: int
    step_seconds: float          # measured: median of the one-token steps (the prefill left out)
    roofline_seconds: float      # predicted: max((weights + batch × cache) ÷ bandwidth, batch × FLOPs ÷ FLOP/s)
    context: int = 0             # the tokens each row's step attends to (the middle of the run)

    @property
    def tokens_per_s(self) -> float:
        """Decode throughput: new tokens over all rows per second."""
        return self.batch / self.step_seconds

    @property
    def roofline_tokens_per_s(self) -> float:
        return self.batch / self.roofline_seconds


def _roofline_point(model: torch.nn.Module, batch: int, step: float, context: int, *, bandwidth: float,
                    flops_per_s: float) -> BatchPoint:
    """A measured step beside the roofline's time for ``batch`` rows at ``context`` tokens."""
    predicted = decode_step_seconds(batch, weight_bytes=model.weight_bytes(),
                                    **row_cost(model.config, context, next(model.parameters()).dtype),
                                    flops_per_s=flops_per_s, bytes_per_s=bandwidth)
    return BatchPoint(batch, step, predicted, context)


def _prefilled(model: torch.nn.Module, prompt: Sequence[int]) -> tuple[KVCache, torch.Tensor]:
    """One row's cache holding ``prompt``, and the token it chooses next ``(1, 1)``."""
    one = KVCache.for_model(model, max_len=len(prompt))
    with torch.no_grad():
        ids = torch.tensor([list(prompt)], device=next(model.parameters()).device)
        return one, model(ids, one, last_only=True).argmax(-1)


def _items(values: Sequence[int], progress: bool, desc: str):
    if not progress:
        return values
    from tqdm.auto import tqdm
    return tqdm(values, desc=desc, unit="batch")


def steps_at_context(model: torch.nn.Module, prompt: Sequence[int], batch_sizes: Sequence[int], n_steps: int = 6,
                     *, bandwidth: float, flops_per_s: float, progress: bool = True) -> list[BatchPoint]:
    """The median one-token decode step of ``b`` rows that each hold all of ``prompt`` in their
    cache, for each ``b`` of ``batch_sizes``, beside the roofline's prediction.

    The prompt is prefilled once and its keys and values copied into every row: a step's time
    does not depend on what the cache holds, and the long prefill of every row is skipped. Then
    ``n_steps`` steps for all rows (the first is a warm-up and not counted)."""
    if n_steps < 2:
        raise ValueError(f"n_steps must be at least 2 (the first step is a warm-up), got {n_steps}")
    device = next(model.parameters()).device
    one, first = _prefilled(model, prompt)
    points = []
    for b in _items(batch_sizes, progress, f"batch sizes at {len(prompt):,} tokens"):
        cache, ids, seconds = one.tiled(b, n_steps), first.repeat(b, 1), []
        with torch.no_grad():
            for _ in range(n_steps):
                with Stopwatch(device) as clock:
                    ids = model(ids, cache, last_only=True).argmax(-1)                          # (b, 1)
                seconds.append(clock.seconds)
        points.append(_roofline_point(model, b, statistics.median(seconds[1:]), len(prompt) + n_steps // 2,
                                      bandwidth=bandwidth, flops_per_s=flops_per_s))
        del cache             # freed before the next batch's cache is made: never two batches' caches at once
    return points


@contextlib.contextmanager
def _quiet_stderr():
    """The process's standard error (file descriptor 2) sent nowhere: PyTorch's profiler prints
    a line there, from C++, each time it starts and stops, with a time stamp in it."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


# The one classification of a step's operators (this section's profile and the benchmark's): the
# matrix products, every kernel that multiplies by the weights (dense, matrix-vector, quantized:
# PyTorch's, listed here, and kvlib's own, from their declarations in kvlib.ops), and attention;
# the rest is "other operators".
_TORCH_PARTS = {"matrix products": ("aten::mm", "aten::addmm", "aten::bmm", "aten::mv", "aten::addmv_",
                                    "aten::_weight_int8pack_mm", "aten::_weight_int4pack_mm_for_cpu",
                                    "aten::_weight_int4pack_mm", "mkldnn::_linear_pointwise"),
                "attention": ("aten::_scaled_dot_product_flash_attention_for_cpu", "aten::scaled_dot_product_attention",
                              "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_flash_attention",
                              "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_attention_math")}
STEP_PARTS = {part: names + kvlib_ops.step_parts()[part] for part, names in _TORCH_PARTS.items()}


def step_profile(model: torch.nn.Module, prompt: Sequence[int], batch_sizes: Sequence[int], n_steps: int = 5,
                 warmup: int = 2) -> dict[int, dict[str, float]]:
    """Where a decode step's time goes, for each batch size: PyTorch's profiler over one-token
    steps of ``b`` rows holding ``prompt``, the operators' own time summed into :data:`STEP_PARTS`
    and ``"other operators"`` (norms, rotary embedding, cache writes, activations).

    Each batch first runs ``warmup`` steps unprofiled; then each of ``n_steps`` steps is profiled
    on its own, and the batch's parts are those of the step whose total is the median, so that
    one step slowed by the rest of the machine does not move the figures. A throwaway profiled
    step comes before all of them: the profiler's first session carries one-off costs. The
    profile counts operators' time only: the Python between them is not in it, while the
    profiler adds its own cost to every operator, so a total comes near the same step timed
    without the profiler, under or over it."""
    from torch.profiler import ProfilerActivity, profile

    if n_steps < 1 or warmup < 0:
        raise ValueError(f"n_steps must be at least 1 and warmup at least 0, got {n_steps} and {warmup}")
    one, first = _prefilled(model, prompt)

    def profiled(step):
        with _quiet_stderr(), profile(activities=[ProfilerActivity.CPU]) as prof:
            out = step()
        events = prof.key_averages()
        parts = {name: sum(e.self_cpu_time_total for e in events if e.key in keys) / 1e6
                 for name, keys in STEP_PARTS.items()}
        parts["other operators"] = sum(e.self_cpu_time_total for e in events) / 1e6 - sum(parts.values())
        return out, parts

    out = {}
    with torch.no_grad():
        cache, ids = one.tiled(1, 1), first
        profiled(lambda: model(ids, cache, last_only=True))                             # the throwaway session
        for b in batch_sizes:
            cache, ids = one.tiled(b, warmup + n_steps), first.repeat(b, 1)
            for _ in range(warmup):
                ids = model(ids, cache, last_only=True).argmax(-1)
            steps = []
            for _ in range(n_steps):
                logits, parts = profiled(lambda: model(ids, cache, last_only=True))
                ids = logits.argmax(-1)
                steps.append(parts)
            steps.sort(key=lambda parts: sum(parts.values()))
            out[b] = steps[(len(steps) - 1) // 2]                  # the median step (the lower one of two)
            del cache
    return out


def grew_most(before: dict[str, float], after: dict[str, float]) -> str | None:
    """The part of a step's profile (two of :func:`step_profile`'s dicts) whose time grew most from
    ``before`` to ``after``, or ``None`` when no part grew."""
    name = max(before, key=lambda part: after[part] - before[part])
    return name if after[name] > before[name] else None


def few_rows_pattern(seconds: dict[int, float]) -> str:
    """What one matrix product's times for 1, 2, 3 and 4 rows (``{rows: seconds}``, at least those
    four) show about the kernel, in words: whether a few rows cost about what one row costs, or
    about a pass of their own each, and what changes at 4 rows. Two rows within 1.3 times one row's
    time cost "like one"; 2 and 3 rows above 1.7 and 2.4 times it, "a pass each"."""
    r2, r3, r4 = (seconds[n] / seconds[1] for n in (2, 3, 4))
    if r2 <= 1.3 and r3 <= 1.3:
        if r4 >= 1.5:
            return "2 and 3 rows cost about what 1 row costs; from 4 rows the cost grows with the rows"
        return "2, 3 and 4 rows cost about what 1 row costs"
    if r2 >= 1.7 and r3 >= 2.4:
        if r4 < r3:
            return "2 and 3 rows cost about a pass each; 4 rows cost less than 3 (another kernel from 4)"
        return "each row costs about a pass of its own"
    return "each extra row costs a part of a pass (between 'like one' and 'a pass each')"
