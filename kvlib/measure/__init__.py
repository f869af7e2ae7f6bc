"""Measuring: time, arithmetic, memory, the machine itself, and prediction quality; the
chapter's experiments built on them. (The benchmark command, ``python -m kvlib.bench``, is a
wing of its own on top of everything: :mod:`kvlib.bench`.)

- :mod:`.timing`: timing a call, and printing measured figures in forms the notebook tests
  recognise (:func:`fmt_seconds`, :func:`fmt_ratio`, :func:`fmt_approx`, :func:`fmt_verdict`);
- :mod:`.flops`: the arithmetic of a step in closed form, and PyTorch's own count of it;
- :mod:`.memory`: working memory (:class:`TensorMemoryTracker`);
- :mod:`.hardware`: memory bandwidth, dense FLOP/s, the weight-read floor;
- :mod:`.quality`: how far two sets of next-token predictions are apart, and how close a greedy
  run came to a near-tie (:func:`closest_call`);
- :mod:`.experiments`: the chapter's experiments as functions;

Lesson code (the decoder, its cache, generation) never imports this package; it imports them.
"""
from __future__ import annotations

from .flops import (StepFlops, attention_flops_per_pair, count_flops, count_step_flops, crossover_context,
                    fmt_flops, generation_flops, generation_ratio, generation_step_flops, linear_flops_per_token,
                    output_flops_per_row, step_call, step_flops)
from .hardware import machine_description, matmul_flops_per_second, memory_bandwidth, weight_read_floor
from .memory import TensorMemoryTracker, fmt_bytes, peak_memory
from .quality import LogProbs, closest_call, next_token_agreement, top2_gap
from .timing import (Stopwatch, fmt_approx, fmt_exponent, fmt_ratio, fmt_seconds, fmt_verdict, median_seconds, sync)

__all__ = ["fmt_seconds", "fmt_ratio", "fmt_approx", "fmt_exponent", "fmt_verdict", "sync", "Stopwatch",
           "median_seconds", "StepFlops", "linear_flops_per_token", "attention_flops_per_pair",
           "output_flops_per_row", "crossover_context", "step_flops", "generation_step_flops", "generation_flops",
           "generation_ratio", "count_flops", "step_call", "count_step_flops", "fmt_flops", "TensorMemoryTracker",
           "peak_memory", "fmt_bytes", "memory_bandwidth", "matmul_flops_per_second", "weight_read_floor",
           "machine_description", "LogProbs", "next_token_agreement", "top2_gap", "closest_call"]
