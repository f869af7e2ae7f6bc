"""Checks for the exercises of *The price is memory* (section 6): how much context fits, and int8.

A wrong answer that matches a typical mistake (forgetting the factor 2 for keys and
values, counting query heads instead of key/value heads, forgetting the batch or the
weights, a per-tensor instead of a per-token scale, cutting off instead of rounding, ...)
fails with a hint that names the mistake; any other wrong answer fails with the expected value.

Exercise 6.3 is an experiment: a predicted number of tokens (graded against what the real
int8 buffers allow, the same on every machine) and a choice among explanations.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from ..config import Config
from ..cache.model_shapes import MODEL_SHAPES
from ..cache.quantized import quantize_int8
from ..cache.sizes import crossover_tokens, kv_bytes_per_token, kv_cache_bytes
from .framework import (MULTI_QUERY, Case, CheckFailed, check_choice, check_prediction, describe,
                        refuse_library_answer, run_check, student_answer)

__all__ = ["check_max_context", "check_quantize_int8", "check_int8_context", "check_int8_explanation"]



# ---------------------------------------------------------------------------------------
# Exercise 6.1: how long may the conversations get?
# ---------------------------------------------------------------------------------------

def _max_context(config, n_params, memory_bytes, batch, *, two=2, heads=None, layers=True, use_batch=True,
                 weights=True, bytes_per_number=2, rounding=math.floor):
    """Reference (defaults) and typical mistakes (the keywords): the longest context per sequence
    whose 16-bit cache for ``batch`` sequences fits in ``memory_bytes`` beside 16-bit weights."""
    kv_heads = config.n_kv_heads if heads is None else heads
    per_token = two * (config.n_layers if layers else 1) * kv_heads * config.head_dim * bytes_per_number
    free = memory_bytes - (n_params * bytes_per_number if weights else 0)
    return max(0, int(rounding(free / (per_token * (batch if use_batch else 1)))))


def _max_context_mistakes(config, n_params, memory_bytes, batch) -> dict[str, int | tuple[int, ...]]:
    args = (config, n_params, memory_bytes, batch)
    return {
        "keys AND values: the cache holds two tensors per layer, so there is a factor 2 in the bytes per token.":
            _max_context(*args, two=1),
        "the cache holds n_kv_heads key/value heads, not n_heads (nor d_model = n_heads × head_dim numbers "
        "per token): with grouped-query attention several query heads share one key/value head.":
            _max_context(*args, heads=config.n_heads),
        "every sequence of the batch has its own keys and values: the cache per token is × batch.":
            _max_context(*args, use_batch=False),
        "every layer has its own keys and values: the bytes per token are × n_layers.":
            _max_context(*args, layers=False),
        "the weights take their share of the memory first: 2 bytes × n_params.":
            _max_context(*args, weights=False),
        "16-bit numbers take 2 bytes each, not 4.": _max_context(*args, bytes_per_number=4),
        "round down (math.floor or //), not up or to the nearest: a token that only partly fits does not fit.":
            (_max_context(*args, rounding=math.ceil), _max_context(*args, rounding=round)),
    }


def _diagnose_number(exercise: str, fn: Callable, cases: list[Case], mistakes: Callable[..., dict]) -> None:
    """Raise a :class:`CheckFailed` naming the mistake if a wrong answer matches a known one.

    Where several known mistakes give the same wrong number for a case, a later case decides;
    anything else is left to ``run_check``, which reports the first mismatch."""
    if not callable(fn):
        return
    for i, case in enumerate(cases, start=1):
        try:
            got = fn(*case.args)
        except Exception:       # run_check reports it
            return
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return
        if got == case.expected:
            continue
        matches = [why for why, values in mistakes(*case.args).items()
                   if any(v != case.expected and got == v for v in (values if isinstance(values, tuple) else (values,)))]
        if len(matches) == 1:
            raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({case.name}) is wrong: expected "
                              f"{case.expected:,}, got {got:,}\n  input: {describe(case.args)}\n  hint: {matches[0]}")
        if not matches:
            return
        # several mistakes give this same number here: a later case tells them apart


def check_max_context(fn: Callable[[Config, int, int, int], int]) -> None:
    """Exercise 6.1: ``fn(config, n_params, memory_bytes, batch)`` is the longest context (tokens per
    sequence) at which 16-bit weights and the 16-bit cache of ``batch`` sequences fit in ``memory_bytes``
    (0 if not even one token fits)."""
    tiny, smol = Config.tiny(), Config.smollm2_135m()
    llama2, llama3 = MODEL_SHAPES["Llama-2-7B"], MODEL_SHAPES["Llama-3-8B"]
    mistral, llama70 = MODEL_SHAPES["Mistral-7B"], MODEL_SHAPES["Llama-3-70B"]
    gb = 10 ** 9
    specs = [
        ("tiny shapes, 20,000 parameters, 1 MB, batch 1", tiny, 20_000, 10 ** 6, 1),
        ("SmolLM2-135M, 1 GB, batch 4", smol, MODEL_SHAPES["SmolLM2-135M"].n_params, gb, 4),
        ("Llama-3-8B, 80 GB, batch 8", llama3.config, llama3.n_params, 80 * gb, 8),
        ("Llama-2-7B, 24 GB, batch 1", llama2.config, llama2.n_params, 24 * gb, 1),
        ("Mistral-7B, 40 GB, batch 32", mistral.config, mistral.n_params, 40 * gb, 32),
        ("Llama-3-70B on two 80 GB accelerators, batch 16", llama70.config, llama70.n_params, 160 * gb, 16),
        ("multi-query (1 kv head), 5,000 parameters, 50 kB, batch 3", MULTI_QUERY, 5_000, 50_000, 3),
        ("Llama-3-8B on 16 GB: the weights alone do not fit", llama3.config, llama3.n_params, 16 * gb, 1),
    ]
    cases = [Case(name, (cfg, p, m, b), _max_context(cfg, p, m, b)) for name, cfg, p, m, b in specs]
    exercise = "Exercise 6.1"
    refuse_library_answer(exercise, fn, {f.__name__: f for f in (kv_cache_bytes, kv_bytes_per_token, crossover_tokens)})
    _diagnose_number(exercise, fn, cases, _max_context_mistakes)
    run_check(exercise, fn, cases,
              hint="memory left after the weights (2 × n_params bytes), divided by the cache's bytes per token "
                   "(2 × n_layers × n_kv_heads × head_dim × 2) times batch, rounded down; 0 if nothing is left.")


# ---------------------------------------------------------------------------------------
# Exercise 6.2: int8 quantization with one scale per token
# ---------------------------------------------------------------------------------------

def _quant_cases() -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(6)
    with_zero = torch.randn(2, 3, 8, generator=g)
    with_zero[1, 2] = 0.0
    outlier = torch.randn(1, 2, 4, 16, generator=g) * 0.1
    outlier[0, 0, 1, 3] = 25.0
    negative = torch.rand(2, 6, generator=g) - 1.5          # every vector's largest magnitude is negative
    negative[0, 1] = 0.2
    return [
        ("one vector of 4 numbers", torch.tensor([0.3, -1.2, 0.7, 0.0])),
        ("one token of one head, head_dim 64", torch.randn(1, 1, 1, 64, generator=g)),
        ("keys (batch 2, 3 kv heads, 5 tokens, head_dim 16)", torch.randn(2, 3, 5, 16, generator=g) * 3),
        ("largest magnitudes that are negative", negative),
        ("a vector with one large outlier", outlier),
        ("an all-zero vector among others", with_zero),
    ]


def _near(a: torch.Tensor, b: torch.Tensor) -> bool:
    return tuple(a.shape) == tuple(b.shape) and torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-9)


def _quant_mistake(x: torch.Tensor, scale: torch.Tensor) -> str | None:
    """Name the mistake when ``scale`` matches a typical wrong one for ``x``."""
    amax = x.abs().amax(dim=-1, keepdim=True)
    whole = (x.abs().max() / 127).expand_as(amax)
    if (scale.numel() == 1 and amax.numel() > 1) or (_near(scale, whole) and not _near(amax / 127, whole)):
        return ("one scale per vector (per token and head), not one for the whole tensor: "
                "take the largest magnitude over the last dimension, x.abs().amax(dim=-1, keepdim=True).")
    if _near(scale, amax / 128) and amax.any():
        return "divide the largest magnitude by 127, so that it maps to ±127 (int8 holds -128 … 127)."
    if _near(scale, x.amax(dim=-1, keepdim=True) / 127) and not _near(amax, x.amax(dim=-1, keepdim=True)):
        return "take the largest magnitude, x.abs().amax(...): a vector's largest number may be negative."
    inverse = torch.where(amax == 0, torch.zeros_like(amax), 127 / torch.where(amax == 0, 1, amax))
    if tuple(scale.shape) == tuple(amax.shape) and _near(torch.where(amax == 0, 0, scale), inverse):
        return "the scale is what one step of q is worth, max|x| / 127, so that x ≈ q × scale (not 127 / max|x|)."
    return None


def check_quantize_int8(fn: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Exercise 6.2: ``fn(x)`` returns ``(q, scale)``: ``q`` int8 with ``x``'s shape, ``scale`` of
    shape ``(..., 1)`` equal to each vector's largest magnitude ÷ 127, and ``q`` the nearest
    integer to ``x / scale`` (0 for an all-zero vector)."""
    exercise = "Exercise 6.2"
    refuse_library_answer(exercise, fn, {"quantize_int8": quantize_int8})
    specs = _quant_cases()
    for i, (name, x) in enumerate(specs if callable(fn) else [], start=1):
        where = f"{exercise}: case {i} of {len(specs)} ({name})"
        try:
            out = fn(x.clone())
        except Exception:                # run_check says "not written yet" or shows the error
            break
        if not (isinstance(out, (tuple, list)) and len(out) == 2 and all(isinstance(t, torch.Tensor) for t in out)):
            raise CheckFailed(f"{where}: expected two tensors (q, scale), got {describe(out)}")
        q, scale = out
        ref_scale = quantize_int8(x)[1]
        if tuple(q.shape) != tuple(x.shape):
            raise CheckFailed(f"{where}: q must have x's shape {tuple(x.shape)}, got {tuple(q.shape)}")
        if q.dtype != torch.int8:
            raise CheckFailed(f"{where}: q must be stored as torch.int8 (1 byte a number), got dtype "
                              f"{q.dtype}\n  hint: convert the rounded numbers with .to(torch.int8)")
        if not scale.is_floating_point():
            raise CheckFailed(f"{where}: scale must be a floating-point tensor, got dtype {scale.dtype}")
        if not torch.isfinite(scale).all():
            raise CheckFailed(f"{where}: scale contains NaN or infinity\n  hint: an all-zero vector has "
                              f"largest magnitude 0: give it scale 0 and q 0, without dividing by 0")
        why = _quant_mistake(x, scale)
        if why:
            raise CheckFailed(f"{where} is wrong: the scales are not max|x| / 127 per vector\n  "
                              f"input: {describe(x)}\n  hint: {why}")
        if tuple(scale.shape) != tuple(ref_scale.shape):
            raise CheckFailed(f"{where}: scale must have shape {tuple(ref_scale.shape)} (one per vector, "
                              f"keepdim=True), got {tuple(scale.shape)}")
        if not _near(scale, ref_scale):
            diff = (scale.double() - ref_scale.double()).abs()
            idx = tuple(int(j) for j in torch.nonzero(diff == diff.max())[0])
            raise CheckFailed(f"{where} is wrong: scale at index {idx} should be {ref_scale[idx].item():.6g} "
                              f"(largest magnitude ÷ 127), got {scale[idx].item():.6g}\n  input: {describe(x)}")
        ratio = x.double() / torch.where(ref_scale == 0, 1, ref_scale).double()
        qd, gap = q.double(), ratio.abs() - q.double().abs()
        if ((qd - ratio).abs() > 0.5 + 1e-4).any() and bool(((gap > -1e-4) & (gap < 1 + 1e-4)).all()):
            raise CheckFailed(f"{where} is wrong: q is x / scale with its fraction cut off, not rounded\n"
                              f"  hint: round with torch.round before .to(torch.int8), which alone cuts off "
                              f"the fraction")

    def as_numbers(x):
        """The student's q as floats, to compare with x / scale (the scales were checked above)."""
        q, _ = fn(x)
        return q.double() if isinstance(q, torch.Tensor) else q

    cases = []
    for name, x in specs:
        scale = quantize_int8(x)[1]
        ratio = x.double() / torch.where(scale == 0, 1, scale).double()
        # q may be any integer within 1/2 of x / scale (a tie may round either way)
        cases.append(Case(name, (x,), ratio, atol=0.5 + 1e-4))
    run_check(exercise, as_numbers if callable(fn) else fn, cases,
              hint="scale = x.abs().amax(dim=-1, keepdim=True) / 127; q = torch.round(x / scale) as int8 "
                   "(0 where the scale is 0).")


# ---------------------------------------------------------------------------------------
# Exercise 6.3: how far does an int8 cache stretch the context? (predict, measure, explain)
# ---------------------------------------------------------------------------------------

INT8_MEMORY, INT8_BATCH = 512 * 10 ** 6, 16      # SmolLM2-135M, 16-bit weights, 16 conversations in 512 MB


def int8_bytes_per_token(config: Config) -> int:
    """Bytes one token of one sequence adds to a real :class:`kvlib.Int8KVCache` (int8 numbers and
    their float32 scales), measured on a one-token buffer."""
    from ..cache.quantized import Int8KVCache

    return Int8KVCache(config.n_layers, 1, config.n_kv_heads, 1, config.head_dim).nbytes


def int8_context(memory_bytes: int = INT8_MEMORY, batch: int = INT8_BATCH, *, per_token: int | None = None,
                 weight_bytes_per_param: int = 2, use_batch: bool = True) -> int:
    """Longest context per conversation for SmolLM2-135M with 16-bit weights and an int8 cache (the
    keywords: the typical mistakes)."""
    shape = MODEL_SHAPES["SmolLM2-135M"]
    per_token = int8_bytes_per_token(shape.config) if per_token is None else per_token
    left = memory_bytes - weight_bytes_per_param * shape.n_params
    return max(0, left // (per_token * (batch if use_batch else 1)))


def check_int8_context(fn) -> None:
    """Exercise 6.3, the prediction: ``fn()`` returns the longest context per conversation at which
    SmolLM2-135M's 16-bit weights and an int8 cache (with its scales) for 16 conversations fit in
    512 MB (512 × 10**6 bytes). Passes within 2 %."""
    exercise = "Exercise 6.3"
    predicted = student_answer(exercise, fn, "your predicted number of tokens")
    exact = int8_context()
    cfg = MODEL_SHAPES["SmolLM2-135M"].config
    numbers = 2 * cfg.n_layers * cfg.n_kv_heads * cfg.head_dim          # numbers per token: keys and values
    known = [
        (int8_context(per_token=numbers), "you left out the scales: every stored vector of head_dim int8 numbers "
                                          "has a float32 scale beside it, 4 more bytes per 64."),
        (int8_context(per_token=2 * numbers), "that is the 16-bit cache (2 bytes a number); int8 stores 1 byte a "
                                              "number, plus the scales."),
        (int8_context(use_batch=False), "every conversation has its own cache: the bytes per token are × 16."),
        (int8_context(weight_bytes_per_param=0), "the weights take their share first: 2 bytes × n_params, "
                                                 "16-bit whatever the cache stores."),
        (int8_context(weight_bytes_per_param=1), "only the cache is int8 here; the weights stay 16-bit, "
                                                 "2 bytes a parameter."),
    ]
    why = ("bytes per token: 2 (keys and values) × layers × kv heads × (head_dim one-byte numbers + one 4-byte "
           "scale), × 16 conversations; what is left after 2 × n_params bytes of weights, divided by that.")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for value, sentence in known:
            if abs(predicted - value) <= 0.01 * value and abs(predicted - exact) > 0.02 * exact:
                why = sentence
                break
    check_prediction(exercise, predicted, exact, rel_tol=0.02, what="the longest context with an int8 cache "
                     "(tokens per conversation)", why=why)


INT8_CHOICES = {
    "a": (False, "A torch.int8 number takes exactly one byte (element_size() is 1), half a 16-bit number's two."),
    "b": (False, "The weights are the same 16-bit weights in both cases: they take the same share of the memory "
                 "before the cache gets any."),
    "c": (False, "Rounding down to whole tokens loses less than one token per conversation: not 6 % of a "
                 "thousand tokens."),
    "d": (True, "Each vector of head_dim = 64 one-byte numbers carries a 4-byte float32 scale: 68 bytes where "
                "16 bits take 128, so the context grows 128 / 68, about 1.88 times, not 2. With the weights "
                "the same either way, the contexts are in the inverse ratio of the bytes per token."),
}


def check_int8_explanation(fn) -> None:
    """Exercise 6.3, the explanation: ``fn()`` returns the letter of the reason the int8 cache
    gives less than twice the 16-bit cache's context."""
    exercise = "Exercise 6.3"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), INT8_CHOICES)
