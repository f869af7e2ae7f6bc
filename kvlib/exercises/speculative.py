"""Checks for the exercises of *Speculative decoding* (section 10).

- 10.1, the speed-up, predicted: the formula's speed-up for a given acceptance, number of
  drafts and cost ratio, graded within 2 %, with the usual slips named (the model's own token
  left out, the drafts' cost left out, one draft step counted for all);
- 10.2, the acceptance rule: ``acceptance(p, q, d)`` graded on seeded distributions: the
  probability ``min(1, p(d) / q(d))`` and the normalised ``max(0, p - q)`` to draw from on a
  rejection, with the wrong rules named;
- 10.3, when every draft is right: the forward passes for 64 tokens, graded exactly, then a
  letter for why new text takes fewer drafts from prompt lookup.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .framework import Case, check_choice, check_prediction, diagnose, run_check, student_answer

__all__ = ["check_expected_speedup", "check_acceptance", "check_forward_passes", "check_lookup_explanation",
           "SPEEDUP_CASE", "LOOKUP_CHOICES"]

# ---------------------------------------------------------------------------------------
# Exercise 10.1: the speed-up, predicted
# ---------------------------------------------------------------------------------------

SPEEDUP_CASE = {"alpha": 0.8, "k": 4, "cost_ratio": 0.1}


def _speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """Reference: tokens per verify step, (1 - alpha^(k+1)) / (1 - alpha), over the cost of a
    step, one verify step and k draft steps, in units of a plain decode step (a verify step of
    k + 1 tokens costs about one plain step: the weights are read once)."""
    return (1 - alpha ** (k + 1)) / (1 - alpha) / (1 + k * cost_ratio)


def _speedup_mistakes(alpha: float, k: int, cost_ratio: float) -> dict[str, float]:
    tokens = (1 - alpha ** (k + 1)) / (1 - alpha)
    return {
        "the model's own token is left out: every verify step also writes the model's next token, accepted drafts "
        "or not, so a step writes (1 - α^(k+1)) / (1 - α) tokens, not α(1 - α^k) / (1 - α).":
            alpha * (1 - alpha ** k) / (1 - alpha) / (1 + k * cost_ratio),
        "the drafts' cost is left out: each of the k drafts costs a step of the draft model, cost_ratio of a "
        "verify step each, so a step costs 1 + k · cost_ratio.": tokens,
        "one draft step is counted for all k drafts: the draft model writes its k tokens one at a time, k steps.":
            tokens / (1 + cost_ratio),
    }


def check_expected_speedup(fn: Any) -> None:
    """Exercise 10.1: ``fn()`` returns the speed-up the formula predicts for :data:`SPEEDUP_CASE`."""
    exercise = "Exercise 10.1"
    predicted = student_answer(exercise, fn, "your number")
    expected = _speedup(**SPEEDUP_CASE)
    why = "tokens per verify step (1 - α^(k+1)) / (1 - α), divided by the cost of a step, 1 + k · cost_ratio."
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for sentence, value in _speedup_mistakes(**SPEEDUP_CASE).items():
            if math.isclose(predicted, value, rel_tol=0.02):
                why = sentence
    check_prediction(exercise, predicted, expected, rel_tol=0.02, what="the speed-up over plain decoding", why=why)


# ---------------------------------------------------------------------------------------
# Exercise 10.2: the acceptance rule
# ---------------------------------------------------------------------------------------

def _acceptance(p: torch.Tensor, q: torch.Tensor, d: int) -> tuple[float, torch.Tensor]:
    """Reference: accept draft ``d`` with probability min(1, p[d] / q[d]); on a rejection draw from
    max(0, p - q), normalised (p itself where p <= q everywhere: a rejection cannot happen then)."""
    rest = (p - q).clamp(min=0)
    return min(1.0, float(p[d] / q[d])), (rest / rest.sum() if rest.sum() > 0 else p.clone())


def _distributions(seed: int, vocab: int, zeros: int = 0) -> tuple[torch.Tensor, torch.Tensor, int]:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(vocab, generator=g, dtype=torch.float64), torch.rand(vocab, generator=g, dtype=torch.float64)
    p[:zeros] = 0                                           # tokens the model would not sample (top-k)
    p, q = p / p.sum(), q / q.sum()
    d = int(torch.multinomial(q, 1, generator=g))
    return p, q, d


def _acceptance_cases() -> list[Case]:
    specs = [("5 tokens", 101, 5, 0), ("50 tokens", 102, 50, 0), ("a draft the model would never write "
             "(p = 0 there)", 103, 8, 8 // 2), ("20 tokens, the first 5 outside the model's top-k", 104, 20, 5)]
    cases = []
    for name, seed, vocab, zeros in specs:
        p, q, d = _distributions(seed, vocab, zeros)
        if name.startswith("a draft"):
            d = 0
        cases.append(Case(name, (p, q, d), _acceptance(p, q, d), atol=1e-9))
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    cases.append(Case("the drafter's distribution equals the model's", (p, p.clone(), 1), _acceptance(p, p, 1),
                      atol=1e-9))
    return cases


_ACCEPTANCE_MISTAKES: list[tuple[str, Callable]] = [
    ("the ratio is upside down: accept with probability min(1, p(d) / q(d)), the model's probability over the "
     "drafter's, so that a token the drafter over-proposes is accepted less often.",
     lambda p, q, d: (min(1.0, float(q[d] / p[d])) if p[d] > 0 else 1.0, _acceptance(p, q, d)[1])),
    ("on a rejection the token is drawn from p itself: that over-weights the tokens the drafter proposes, which "
     "were already given their chance. Draw from max(0, p - q), normalised.",
     lambda p, q, d: (_acceptance(p, q, d)[0], p.clone())),
    ("max(0, p - q) is not normalised: divide it by its sum to make it a distribution.",
     lambda p, q, d: (_acceptance(p, q, d)[0], (p - q).clamp(min=0))),
    ("the probability is not capped at 1: min(1, p(d) / q(d)).",
     lambda p, q, d: (float(p[d] / q[d]), _acceptance(p, q, d)[1])),
]


def check_acceptance(fn: Callable) -> None:
    """Exercise 10.2: ``fn(p, q, d)`` returns ``(probability of accepting d, distribution to draw
    from on a rejection)``."""
    exercise = "Exercise 10.2"
    cases = _acceptance_cases()
    hint = diagnose(fn, cases, _ACCEPTANCE_MISTAKES) if callable(fn) else None
    run_check(exercise, fn, cases, hint=hint or "accept with min(1, p[d] / q[d]); on a rejection, draw from "
              "max(0, p - q) divided by its sum.")


# ---------------------------------------------------------------------------------------
# Exercise 10.3: when every draft is right
# ---------------------------------------------------------------------------------------

def check_forward_passes(fn: Any, n_new: int = 64, k: int = 4) -> None:
    """Exercise 10.3: ``fn()`` returns the model's forward passes for ``n_new`` tokens when every
    one of the ``k`` drafts of every step is accepted."""
    exercise = "Exercise 10.3"
    predicted = student_answer(exercise, fn, "your number of forward passes")
    expected = 1 + math.ceil((n_new - 1) / (k + 1))
    why = (f"the prefill writes the first token; every verify step after it writes k + 1 = {k + 1} (its {k} drafts "
           f"and the model's own token), so {n_new - 1} more tokens take ceil({n_new - 1} / {k + 1}) steps.")
    if predicted == math.ceil(n_new / k):
        why = f"a step writes k + 1 tokens, not k: the model adds its own token after the {k} accepted drafts."
    check_prediction(exercise, predicted, expected, rel_tol=1e-9, what=f"the forward passes for {n_new} tokens",
                     why=why)


LOOKUP_CHOICES = {
    "a": (True, "prompt lookup drafts only what already occurred in the text: a quote repeats the passage, so the "
                "last few tokens were seen before and the tokens after them are the right guess; new text repeats "
                "little, so lookup finds no draft, or a wrong one."),
    "b": (False, "greedy acceptance does not depend on how sure the model is: a draft is kept when it is the "
                 "model's most likely token, however likely that is."),
    "c": (False, "the lengths were the same (64 tokens each); what differs is how many drafts were right."),
    "d": (False, "rolling the cache back is setting a number (the cache's length): it costs nothing, whatever "
                 "was rejected."),
}


def check_lookup_explanation(fn: Any) -> None:
    """Exercise 10.3: the letter of why new text takes fewer drafts from prompt lookup."""
    check_choice("Exercise 10.3", student_answer("Exercise 10.3", fn, "the letter of your choice"), LOOKUP_CHOICES)
