"""Checks for the exercises of *A real model* (section 5).

5.1 measures how close the 48-token answer came to changing: the step whose best logit is
nearest its runner-up. The check tries score tables with ties, negative scores and the
closest call in the first and the last row, and names the usual slips (the largest gap
instead of the smallest, the runner-up taken along the wrong dimension, the best against
the worst score, a tie not counted).

5.2 and 5.3 are a prediction and a derivation graded against the exact arithmetic of
:func:`kvlib.measure.flops.generation_flops`: the same on every machine, and never the real
model's weights. 5.2 also grades an explanation (why the measured speed-up stays below the
ratio of arithmetic).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import Config
from ..measure.flops import generation_ratio, generation_step_flops
from .framework import Case, check_choice, check_prediction, diagnose, run_check, student_answer

__all__ = ["check_closest_call", "check_speedup_limit", "check_speedup_explanation", "check_thousand_times",
           "tokens_for_ratio"]


# ---------------------------------------------------------------------------------------
# Exercise 5.1: how close did the answer come to changing?
# ---------------------------------------------------------------------------------------

def _closest_call(logits: torch.Tensor, *, largest: bool = False, worst: bool = False, dim: int = -1,
                  distinct: bool = False) -> tuple[int, float]:
    """Reference (defaults) and the usual slips (the keywords): the step whose best logit is
    closest to its runner-up, and that gap."""
    if worst:
        margins = logits.amax(dim=-1) - logits.amin(dim=-1)
    elif distinct:                          # the runner-up taken as the best value *below* the best one
        best = logits.amax(dim=-1, keepdim=True)
        margins = (best - logits.masked_fill(logits == best, float("-inf")).amax(dim=-1, keepdim=True))[:, 0]
    else:
        top2 = logits.topk(2, dim=dim).values
        margins = (top2[0] - top2[1]) if dim == 0 else (top2[:, 0] - top2[:, 1])
    step = int(margins.argmax() if largest else margins.argmin())
    return step, float(margins[step])


_MISTAKES_CLOSEST: list[tuple[str, Callable]] = [
    ("that is the step with the LARGEST gap, the safest choice of the answer; the closest call is where the gap "
     "is smallest (argmin).", lambda logits: _closest_call(logits, largest=True)),
    ("that gap is the best score against the worst one; the choice could only flip to the runner-up, the "
     "second-best score: logits.topk(2, dim=-1).", lambda logits: _closest_call(logits, worst=True)),
    ("the two best scores were taken down a column (over the steps); each row is one step, and its runner-up "
     "is found along the vocabulary: topk(2, dim=-1).", lambda logits: _closest_call(logits, dim=0)),
    ("a tie counts: when two tokens share the best score, the runner-up is as good as the best and the margin "
     "is 0. Removing every score equal to the best skips the tie; topk(2) keeps both.",
     lambda logits: _closest_call(logits, distinct=True)),
]


def _closest_cases() -> list[Case]:
    g = torch.Generator().manual_seed(5)
    spread = torch.randn(12, 50, generator=g) * 3
    last = torch.randn(6, 40, generator=g) * 2
    top = last.amax(dim=-1)
    last[-1, 0] = top[-1] + 0.004                                  # a near-tie in the last row
    last[-1, 1] = top[-1]
    tie = torch.randn(5, 30, generator=g)
    tie[2, 7] = tie[2, 3] = tie[2].amax() + 1.0                    # two tokens share the best score
    negative = -torch.rand(4, 20, generator=g) * 10 - 5           # every score below -5
    wide = torch.randn(3, 49_152, generator=g) * 4                  # SmolLM2's vocabulary
    specs = [("one row of 3 scores per step, 2 steps", torch.tensor([[1.0, 3.0, 2.5], [0.0, -1.0, 4.0]])),
             ("12 steps, 50 tokens", spread),
             ("the closest call at the last step", last),
             ("a tie at step 2", tie),
             ("every score negative", negative),
             ("one step only", torch.randn(1, 16, generator=g)),
             ("3 steps of SmolLM2's 49,152 scores", wide)]
    return [Case(name, (x,), _closest_call(x)) for name, x in specs]


def check_closest_call(fn: Callable[[torch.Tensor], tuple[int, float]]) -> None:
    """Exercise 5.1: ``fn(logits)`` with ``logits`` of shape ``(steps, vocab)`` returns ``(step, margin)``:
    the step whose best score is closest to its second best, and best − second best (0 for a tie)."""
    def as_numbers(logits):
        out = fn(logits)
        if isinstance(out, (tuple, list)) and len(out) == 2:
            step, margin = out
            if isinstance(step, torch.Tensor) and step.numel() == 1:
                step = int(step)
            if isinstance(margin, torch.Tensor) and margin.numel() == 1:
                margin = float(margin)
            if isinstance(step, float) and step.is_integer():
                step = int(step)
            return step, margin
        return out

    cases = _closest_cases()
    target = as_numbers if callable(fn) else fn
    hint = diagnose(target, cases, _MISTAKES_CLOSEST) if callable(fn) else None
    run_check("Exercise 5.1", target, cases,
              hint=hint or "per step (row), best − second best of logits.topk(2, dim=-1); the step where that is "
                           "smallest, and the gap itself: (int, float).")


# ---------------------------------------------------------------------------------------
# Exercise 5.2: does the speed-up grow for ever? (predict the limit, explain the gap)
# ---------------------------------------------------------------------------------------

SMOLLM2 = Config.smollm2_135m()


LIMIT_PROMPT = 1_000_000          # "very long": the ratio is within 1e-6 of its limit there


def check_speedup_limit(fn) -> None:
    """Exercise 5.2, the prediction: ``fn()`` returns the value the ratio of arithmetic (uncached ÷
    cached) approaches for 16 new tokens as the prompt grows without bound. Passes within 5 %."""
    exercise = "Exercise 5.2"
    predicted = student_answer(exercise, fn, "the value you predict (a number; float('inf') if it never levels off)")
    limit = generation_ratio(SMOLLM2, 16, prompt_len=LIMIT_PROMPT)
    why = ("with a very long prompt nearly all the work of either loop is the prompt: how many times does each "
           "loop send it through the model?")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        if predicted == float("inf") or predicted > 1000:
            why = ("it levels off. With a very long prompt almost all the work is the prompt: the uncached loop "
                   "sends it through the model at each of its 16 steps, the cached loop once.")
        elif round(predicted) == 15:
            why = ("15 counts only the steps after the first. The uncached loop's first step is a whole prefill "
                   "too, so it runs the prompt 16 times, against the cached loop's once.")
        elif round(predicted) == 8:
            why = ("the uncached loop does not re-read half the prompt on average: every one of its 16 steps runs "
                   "the whole prompt (and the few tokens written so far) again.")
        elif round(predicted) == 1:
            why = ("a ratio of 1 would mean the cache saves nothing for a long prompt; it saves 15 of the 16 "
                   "runs over the prompt.")
    check_prediction(exercise, predicted, limit, rel_tol=0.05,
                     what="the limit of the arithmetic ratio for 16 new tokens", why=why)


SPEEDUP_CHOICES = {
    "a": (True, "The cache removes arithmetic, but not the reading of the weights: a one-token step reads every "
                "weight of the model for one token's worth of arithmetic, while an uncached step reuses every "
                "weight it reads for hundreds of tokens. The cached loop therefore runs at far fewer FLOP/s, and "
                "its time shrinks by less than its arithmetic (section 4: memory-bound against compute-bound)."),
    "b": (False, "The cache is small next to the weights at these lengths: at the sweep's longest, 256 + 16 "
                 "tokens, SmolLM2's float32 cache holds 2 × 30 layers × 3 kv heads × 64 × 4 bytes × 272 ≈ 12.5 MB, "
                 "under a fortieth of the ≈ 540 MB of weights every step reads. Reading it is a small part of "
                 "a cached step; the weights are the rest (answer (a))."),
    "c": (False, "Writing a token's keys and values into the cache copies a few kilobytes per layer: a sliver of "
                 "a step, not half of the time."),
    "d": (False, "Noise scatters measurements in both directions; a gap of this size, in the same direction at "
                 "every length of the sweep, is not noise."),
}


def check_speedup_explanation(fn) -> None:
    """Exercise 5.2, the explanation: ``fn()`` returns the letter of why the measured speed-up stays below
    the ratio of arithmetic."""
    exercise = "Exercise 5.2"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), SPEEDUP_CHOICES)


# ---------------------------------------------------------------------------------------
# Exercise 5.3: how long until a thousand times? (a derivation)
# ---------------------------------------------------------------------------------------

PARTS = ("linear", "attention", "output")         # the parts of a step's arithmetic (kvlib.measure.flops.StepFlops)


def _ratio(config: Config, n_new: int, prompt_len: int, parts: tuple[str, ...]) -> float:
    """Uncached ÷ cached arithmetic of ``n_new`` tokens after ``prompt_len``, counting only ``parts``."""
    def total(use_cache: bool) -> int:
        steps = generation_step_flops(config, prompt_len, n_new, use_cache=use_cache)
        return sum(getattr(step, part) for step in steps for part in parts)
    return total(False) / total(True)


def tokens_for_ratio(config: Config, prompt_len: int, ratio: float = 1000.0, *, limit: int = 1 << 16,
                     parts: tuple[str, ...] = PARTS) -> int:
    """The fewest new tokens after a ``prompt_len``-token prompt for which the uncached loop does at least
    ``ratio`` times the arithmetic of the cached one (:func:`kvlib.measure.flops.generation_ratio`: the
    projections and MLP, attention and the output layer). ``parts`` counts only some of them
    (``("linear", "attention")``: the output layer left out), to show what each part changes. The
    ratio grows with the number of new tokens, so doubling, then a bisection, finds it; past
    ``limit`` new tokens a ``ValueError`` says so."""
    unknown = set(parts) - set(PARTS)
    if not parts or unknown:
        raise ValueError(f"parts must be some of {PARTS}, got {parts}")

    def reaches(n: int) -> bool:
        if tuple(parts) == PARTS:
            return generation_ratio(config, n, prompt_len=prompt_len) >= ratio
        return _ratio(config, n, prompt_len, tuple(parts)) >= ratio

    hi = 1
    while not reaches(hi):
        if hi >= limit:
            raise ValueError(f"the ratio stays below {ratio} up to {limit:,} new tokens")
        hi *= 2
    lo = 1                                    # the ratio reaches it at hi, and not below lo
    while lo < hi:
        mid = (lo + hi) // 2
        if reaches(mid):
            hi = mid
        else:
            lo = mid + 1
    return lo


def check_thousand_times(fn, prompt_len: int) -> None:
    """Exercise 5.3: ``fn()`` returns the number of new tokens after a ``prompt_len``-token prompt at which
    the uncached loop has done 1,000 times the arithmetic of the cached one (SmolLM2-135M's shapes).
    Passes within 8 % of the exact count (attention and the output layer included), which the
    token count leaving both out reaches."""
    exercise = "Exercise 5.3"
    predicted = student_answer(exercise, fn, "your number of new tokens")
    exact = tokens_for_ratio(SMOLLM2, prompt_len)
    one_token = tokens_for_ratio(SMOLLM2, 1)
    why = ("count the tokens each loop feeds: uncached n·P + n(n − 1)/2, cached P + n − 1; set their ratio to "
           "1,000 and solve the quadratic for n.")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        if abs(predicted - one_token) <= 0.03 * one_token:
            why = ("that is about the count for a one-token prompt. Here the uncached loop also re-reads the "
                   f"{prompt_len}-token prompt at every step, so the ratio grows faster and fewer tokens are needed.")
        elif abs(predicted - 1000) <= 15:
            why = ("the ratio is not the number of steps: the uncached loop's step t feeds P + t tokens against the "
                   "cached loop's one, so its total grows like n·P + n²/2, and the ratio like (n·P + n²/2) / (P + n).")
        elif abs(predicted - 2000) <= 30:
            why = ("n²/2 ÷ n = n/2 is the ratio for a one-token prompt; the prompt's P tokens at every step add "
                   "n·P to the uncached total, and P to the cached one.")
    check_prediction(exercise, predicted, exact, rel_tol=0.08,
                     what=f"the new tokens after a {prompt_len}-token prompt at which the uncached loop does "
                          "1,000 times the arithmetic", why=why)
