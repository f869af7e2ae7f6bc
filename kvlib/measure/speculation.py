"""Measuring speculative decoding: acceptance, the cost of a step, and the formula's speed-up."""
from __future__ import annotations

from typing import Sequence

import torch

from ..clock import median_seconds
from .flops import step_call

__all__ = ["acceptance_rate", "tokens_per_step", "predicted_speedup", "step_seconds", "decode_rate"]


def acceptance_rate(records: Sequence) -> float:
    """``α``, the chance that a draft is accepted when the drafts before it were: accepted drafts
    over drafts examined (a step examines its drafts up to and including the first rejected one)."""
    accepted = sum(r.accepted for r in records)
    examined = sum(r.accepted + (r.accepted < r.drafted) for r in records)
    return accepted / examined if examined else 0.0


def tokens_per_step(alpha: float, k: int) -> float:
    """Expected tokens a verify step writes with ``k`` drafts accepted with chance ``alpha`` each:
    ``(1 - alpha^(k+1)) / (1 - alpha)`` (the accepted run, and the model's own token)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, plain: float, verify: float, draft: float) -> float:
    """The speed-up over plain decoding: tokens per step over a step's cost, ``verify`` (one step of
    the model over ``k + 1`` tokens) and ``k`` draft steps, in units of a ``plain`` decode step."""
    return tokens_per_step(alpha, k) * plain / (verify + k * draft)


def step_seconds(model: torch.nn.Module, prompt: Sequence[int], tokens_in: int, repeats: int = 7) -> float:
    """Median seconds of one step of ``model`` feeding ``tokens_in`` tokens after ``prompt`` in its cache,
    as a verify step runs it: the logits of every fed position (each one's next token is checked),
    not only the last's (:func:`kvlib.measure.flops.step_call`, the cache rolled back after each)."""
    context = list(prompt) + list(prompt[-tokens_in:])
    return median_seconds(step_call(model, len(context), use_cache=True, tokens_in=tokens_in, ids=context,
                                    last_only=False), repeats=repeats, warmup=1)


def decode_rate(generation) -> float:
    """New tokens per second after the first (the prefill's) of a :class:`kvlib.Generation`."""
    later = generation.records[1:]
    return (len(generation) - 1) / sum(r.seconds for r in later) if later else 0.0
