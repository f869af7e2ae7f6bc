"""Checks for the exercises of *Quadratic versus linear* (section 4): counting the work of a step.

A wrong answer that matches a typical mistake (forgetting the projections and MLP,
counting attention as ``n`` instead of ``n²``, an off-by-one context, ...) fails with a
hint that names the mistake; any other wrong answer fails with the expected value.

Exercise 4.3 is an experiment: a predicted number (graded against the exact count, which is
the same on every machine) and a choice among explanations.
"""
from __future__ import annotations

from typing import Callable

from ..config import Config
from ..measure.flops import (attention_flops_per_pair, count_step_flops, generation_ratio, generation_step_flops,
                             linear_flops_per_token, output_flops_per_row, step_flops)
from .framework import (MULTI_HEAD, MULTI_QUERY, Case, CheckFailed, check_choice, check_prediction, describe,
                        refuse_library_answer, run_check, student_answer)

__all__ = ["check_predict_step_flops", "check_total_flops_ratio", "check_batched_intensity",
           "check_batch_explanation"]



def _coefficients(config: Config) -> tuple[int, int, int]:
    return linear_flops_per_token(config), attention_flops_per_pair(config), output_flops_per_row(config)


def _no_gqa_linear(config: Config) -> int:
    """The projections' FLOPs if k and v were as wide as q (grouped-query attention ignored)."""
    return linear_flops_per_token(Config(**{**config.__dict__, "n_kv_heads": config.n_heads}))


def _diagnose(exercise: str, fn: Callable, cases: list[Case], mistakes: Callable[..., dict[str, float]]) -> None:
    """Raise a :class:`CheckFailed` naming the mistake if a wrong answer matches a known one.

    Anything else (an exception, a wrong answer of another kind) is left to ``run_check``.
    A case that raises is skipped here: a later case may still show which mistake it was
    (e.g. an empty sum for ``n = 1`` after stopping one step early).
    """
    if not callable(fn):
        return
    for i, case in enumerate(cases, start=1):
        try:
            got = fn(*case.args, **case.kwargs)
        except Exception:        # run_check reports it, unless a later case shows a known mistake
            continue
        if not isinstance(got, (int, float)) or isinstance(got, bool):
            return
        expected = case.expected

        def same(a, b):
            return abs(a - b) <= 1e-9 * max(1.0, abs(b))

        if same(got, expected):
            continue
        for why, value in mistakes(*case.args, **case.kwargs).items():
            if not same(value, expected) and same(got, value):
                raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({case.name}) is wrong: expected "
                                  f"{expected:,}, got {got:,}\n  input: {describe(case.args)}\n  hint: {why}")
        return


# ---------------------------------------------------------------------------------------
# Exercise 4.1: the FLOPs of one step
# ---------------------------------------------------------------------------------------

def _step(config: Config, n: int, use_cache: bool) -> int:
    return step_flops(config, n, 1 if use_cache else n).total


def _step_mistakes(config: Config, n: int, use_cache: bool) -> dict[str, float]:
    a, b, o = _coefficients(config)
    t = 1 if use_cache else n
    return {
        "you left out the projections and the MLP: every token fed goes through all of them "
        "(tokens_in × linear_flops_per_token).": o + b * t * n,
        "attention grows with tokens_in × context: without the cache that is n × n pairs, "
        "not n.": o + a * t + b * n,
        "off by one: at a context of n tokens the new token's keys are n (the stored ones plus its own), "
        "so attention covers tokens_in × n pairs.": o + a * t + b * t * (n - 1),
        "off by one: the context is n tokens, the new one included, so the step sees n keys, not n + 1.":
            o + a * t + b * t * (n + 1),
        "off by one: the step at context n feeds n tokens without the cache, not n - 1.":
            o + a * (n - 1) + b * (n - 1) ** 2 if not use_cache else -1,
        "you left out the output layer: one row of logits, 2 × d_model × vocab_size.": a * t + b * t * n,
        "generation needs the logits at the last position only (last_only=True): one row of the "
        "output layer, not one per token fed.": o * t + a * t + b * t * n,
        "grouped-query attention: k and v have n_kv_heads × head_dim columns, not n_heads × head_dim.":
            o + _no_gqa_linear(config) * t + b * t * n,
        "a multiply-add counts as 2 FLOPs.": (o + a * t + b * t * n) / 2,
        "the FLOP counter counts every query-key pair, masked or not (tokens_in × context), "
        "not only the causal triangle.": o + a * t + b * (n * (n + 1) // 2 if not use_cache else n),
    }


def check_predict_step_flops(fn: Callable[[Config, int, bool], int]) -> None:
    """Exercise 4.1: ``fn(config, n, use_cache)`` is the FLOPs of one generation step at a
    context of ``n`` tokens (logits at the last position only), as :mod:`kvlib.measure.flops` counts it."""
    small, smol = Config.small(), Config.smollm2_135m()
    specs = [
        ("tiny, n=1, without the cache", Config.tiny(), 1, False),
        ("tiny, n=1, with the cache", Config.tiny(), 1, True),
        ("tiny, n=10, without the cache", Config.tiny(), 10, False),
        ("tiny, n=10, with the cache", Config.tiny(), 10, True),
        ("Config.small(), n=1024, without the cache", small, 1024, False),
        ("Config.small(), n=2048, without the cache", small, 2048, False),
        ("Config.small(), n=2048, with the cache", small, 2048, True),
        ("SmolLM2-135M shapes, n=2048, with the cache", smol, 2048, True),
        ("multi-head (no GQA), n=7, without the cache", MULTI_HEAD, 7, False),
        ("multi-query, n=33, with the cache", MULTI_QUERY, 33, True),
    ]
    cases = [Case(name, (cfg, n, use_cache), _step(cfg, n, use_cache)) for name, cfg, n, use_cache in specs]
    exercise = "Exercise 4.1"
    refuse_library_answer(exercise, fn, {f.__name__: f for f in (
        step_flops, generation_step_flops, count_step_flops, linear_flops_per_token, attention_flops_per_pair,
        output_flops_per_row)})
    _diagnose(exercise, fn, cases, _step_mistakes)
    run_check(exercise, fn, cases,
              hint="a step is output + tokens_in × linear_per_token + tokens_in × n × attention_per_pair, "
                   "with tokens_in = n without the cache and 1 with it.")


# ---------------------------------------------------------------------------------------
# Exercise 4.2: the total arithmetic of generating n tokens, both ways
# ---------------------------------------------------------------------------------------

def _ratio_from(config: Config, contexts, *, linear=True, attention_pow=2, output=True, out_rows_all=False):
    a, b, o = _coefficients(config)
    a, o = (a if linear else 0), (o if output else 0)
    contexts = list(contexts)
    un = sum((o * m if out_rows_all else o) + a * m + b * m ** attention_pow for m in contexts)
    ca = sum(o + a + b * m for m in contexts)
    return un / ca if ca else float("nan")


def _ratio_mistakes(config: Config, n: int) -> dict[str, float]:
    a, b, o = _coefficients(config)
    return {
        "generating n tokens after a one-token prompt runs n steps, at contexts 1, 2, …, n "
        "(not 0 … n-1).": _ratio_from(config, range(0, n)),
        "generating n tokens runs n steps, at contexts 1 … n: you stopped one step early.":
            _ratio_from(config, range(1, n)) if n > 1 else -1.0,
        "generating n tokens runs n steps, at contexts 1 … n: you went one step too far.":
            _ratio_from(config, range(1, n + 2)),
        "the contexts start at 1 (the prompt), so they run 1 … n, not 2 … n + 1.":
            _ratio_from(config, range(2, n + 2)),
        "you left out the projections and the MLP, which every token fed goes through.":
            _ratio_from(config, range(1, n + 1), linear=False),
        "you left out the output layer (it costs the same for every step both ways, but it counts).":
            _ratio_from(config, range(1, n + 1), output=False),
        "without the cache, attention at context m covers m × m pairs, not m.":
            _ratio_from(config, range(1, n + 1), attention_pow=1),
        "the question asks without ÷ with the cache (a number ≥ 1); you divided the other way.":
            1 / _ratio_from(config, range(1, n + 1)),
        "that is the ratio of the last step alone; the question asks for the totals over all n steps.":
            (o + a * n + b * n * n) / (o + a + b * n),
        "kvlib.generate computes the logits at the last position only, one output row per step "
        "both ways.": _ratio_from(config, range(1, n + 1), out_rows_all=True),
    }


def check_total_flops_ratio(fn: Callable[[Config, int], float]) -> None:
    """Exercise 4.2: ``fn(config, n)`` is how many times more arithmetic generating ``n``
    tokens after a one-token prompt takes without the cache than with it."""
    small, smol = Config.small(), Config.smollm2_135m()
    specs = [
        ("tiny, n=1", Config.tiny(), 1),
        ("tiny, n=2", Config.tiny(), 2),
        ("tiny, n=100", Config.tiny(), 100),
        ("Config.small(), n=64", small, 64),
        ("Config.small(), n=2048", small, 2048),
        ("SmolLM2-135M shapes, n=2048", smol, 2048),
        ("multi-head (no GQA), n=50", MULTI_HEAD, 50),
    ]
    cases = [Case(name, (cfg, n), generation_ratio(cfg, n), atol=1e-9) for name, cfg, n in specs]
    exercise = "Exercise 4.2"
    _diagnose(exercise, fn, cases, _ratio_mistakes)
    run_check(exercise, fn, cases,
              hint="add up the exact cost of each step (contexts 1 … n) both ways, then divide the totals.")


# ---------------------------------------------------------------------------------------
# Exercise 4.3: batch the cached step (an experiment: predict, measure, explain)
# ---------------------------------------------------------------------------------------

BATCH, CONTEXT = 16, 512          # the experiment: a cached step of Config.small() for 16 sequences at 512 tokens


def small_weight_bytes() -> int:
    """Bytes of the float32 weights of a ``Decoder(Config.small())`` (built on the meta device:
    no memory, no random numbers drawn)."""
    import torch

    from ..model import Decoder

    with torch.device("meta"):
        model = Decoder(Config.small())
    return model.weight_bytes()


def batched_intensity(batch: int = BATCH, context: int = CONTEXT, *, own_caches: bool = True,
                      caches: bool = True) -> float:
    """FLOPs per byte read of one cached step of ``Config.small()`` (float32) for ``batch``
    sequences at ``context`` tokens: ``batch`` rows of arithmetic over the weights, read once,
    and every sequence's own keys and values (the typical mistakes as keywords)."""
    from ..cache.sizes import kv_cache_bytes

    cfg = Config.small()
    flops = batch * step_flops(cfg, context, 1).total
    cache = kv_cache_bytes(cfg, context, batch if own_caches else 1, 4) if caches else 0
    return flops / (small_weight_bytes() + cache)


def check_batched_intensity(fn) -> None:
    """Exercise 4.3, the prediction: ``fn()`` returns the FLOPs per byte read of one cached step of
    ``Config.small()`` for 16 sequences at 512 tokens (float32). Passes within 15 %."""
    exercise = "Exercise 4.3"
    predicted = student_answer(exercise, fn, "your predicted number")
    exact = batched_intensity()
    what = f"the FLOPs per byte of a cached step for {BATCH} sequences at {CONTEXT:,} tokens"
    known = [
        (BATCH * batched_intensity(1), "16 × the batch-1 intensity assumes the bytes stay the same: the weights "
                                       "are read once for the batch, but every sequence reads its own keys and values."),
        (batched_intensity(caches=False), "you left out the caches' bytes: a cached step reads every stored key "
                                          "and value as well as the weights."),
        (batched_intensity(own_caches=False), "the 16 sequences do not share a cache: each has its own 512 keys "
                                              "and values per layer, 16 × the cache of one."),
        (batched_intensity(1), "that is the intensity of one sequence: with 16 the arithmetic is 16 times as much."),
    ]
    why = ("FLOPs: 16 × one cached step at 512 tokens; bytes: the weights once, plus 16 caches of 512 tokens "
           "(float32, 4 bytes a number).")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for value, sentence in known:
            if abs(predicted - value) <= 0.05 * abs(value) and abs(predicted - exact) > 0.15 * exact:
                why = sentence
                break
    check_prediction(exercise, predicted, exact, rel_tol=0.15, what=what, why=why)


BATCH_CHOICES = {
    "a": (False, "A generation step asks for the logits of the last position only, one row per sequence "
                 "(last_only=True): the output layer costs 16 rows at batch 16, in step with the batch."),
    "b": (False, "Each sequence's query meets only its own keys: attention's arithmetic grows in step with "
                 "the batch, not with its square. The FLOPs are exactly 16 times batch 1's."),
    "c": (True, "The weights are read once per step, whatever the batch, so their bytes are shared by 16 rows "
                "of arithmetic; but every sequence has its own keys and values, and at 512 tokens the 16 caches "
                "(32 MiB) already outweigh the weights (15.3 MiB). Batching shares the weights, not the cache."),
    "d": (False, "FLOPs per byte is counted, not measured: it does not depend on how fast this machine "
                 "computes. The counted FLOPs are exactly 16 times batch 1's."),
}


def check_batch_explanation(fn) -> None:
    """Exercise 4.3, the explanation: ``fn()`` returns the letter of the reason the intensity grows
    far less than 16 times from batch 1 to batch 16."""
    exercise = "Exercise 4.3"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), BATCH_CHOICES)
