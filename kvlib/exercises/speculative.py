"""Checks for the exercises of *Speculative decoding* (section 10).

- 10.1, where a draft stops paying: the largest cost of a draft step (as a share of a plain
  step) at which speculation still breaks even, for a given acceptance and number of drafts,
  graded within 2 %, with the usual slips named; kvlib's own formula refused;
- 10.2, the chance of a rejection: ``rejection_chance(p, q)`` for a draft drawn from ``q`` and
  checked against ``p`` by the rule min(1, p/q), graded on seeded distributions (it is the total
  variation distance between them), with the wrong sums named;
- 10.3, the tokens a verify step writes: ``tokens_per_verify(alpha, k)``, the truncated geometric
  series, graded on seeded cases (α = 0 and α = 1 among them), kvlib's own refused; then a letter
  for where the extra token comes from when every draft passes;
- 10.4, fewer drafts a step: the verify steps the quote takes with k = 2, graded against the run,
  then a letter for why sampling keeps fewer of prompt lookup's drafts.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .framework import (Case, check_choice, check_prediction, diagnose, refuse_library_answer, run_check,
                        student_answer)

__all__ = ["check_break_even", "check_rejection_chance", "check_tokens_per_verify", "check_extra_token",
           "check_lookup_steps", "check_sampled_acceptance", "BREAK_EVEN_CASE", "EXTRA_TOKEN_CHOICES", "SAMPLED_CHOICES"]


def _library_formulas() -> dict[str, Callable]:
    """kvlib's own formulas of this section: the checks refuse them (they compute the answers)."""
    from ..measure import speculation

    return {"tokens_per_step": speculation.tokens_per_step, "predicted_speedup": speculation.predicted_speedup}


def _tokens(alpha: float, k: int) -> float:
    """Reference: 1 + α + α² + ... + α^k, the accepted run and the model's own token."""
    return float(k + 1) if alpha == 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


# ---------------------------------------------------------------------------------------
# Exercise 10.1: where a draft stops paying
# ---------------------------------------------------------------------------------------

BREAK_EVEN_CASE = {"alpha": 0.8, "k": 4}


def _break_even(alpha: float, k: int) -> float:
    """Reference: the speed-up T / (v/c + k d/c) with v = c equals 1 where d/c = (T - 1) / k."""
    return (_tokens(alpha, k) - 1) / k


def _break_even_mistakes(alpha: float, k: int) -> dict[str, float]:
    tokens = _tokens(alpha, k)
    return {
        "the model's own token is left out of the tokens a step writes: accepted drafts or not, the verify step "
        "writes the model's next token too, so a step writes 1 + α + ... + α^k tokens.": (tokens - 2) / k,
        "the verify step's own cost is left out: a step costs the verify step (one plain step here) plus the k draft "
        "steps, so T = 1 + k · d/c at the break-even.": tokens / k,
        "one draft step is counted for all k drafts: the draft model writes its drafts one at a time, k steps.":
            tokens - 1,
    }


def check_break_even(fn: Any) -> None:
    """Exercise 10.1: ``fn()`` returns the largest ``d / c`` at which speculation breaks even for
    :data:`BREAK_EVEN_CASE`, a verify step costing one plain step."""
    exercise = "Exercise 10.1"
    if callable(fn):
        refuse_library_answer(exercise, fn, _library_formulas())
    predicted = student_answer(exercise, fn, "your number")
    expected = _break_even(**BREAK_EVEN_CASE)
    why = ("a step writes T = 1 + α + ... + α^k tokens for the cost of one verify step and k draft steps; it breaks "
           "even where T = 1 + k · d/c.")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for sentence, value in _break_even_mistakes(**BREAK_EVEN_CASE).items():
            if math.isclose(predicted, value, rel_tol=0.02):
                why = sentence
    check_prediction(exercise, predicted, expected, rel_tol=0.02, what="the break-even cost of a draft step, d / c",
                     why=why)


# ---------------------------------------------------------------------------------------
# Exercise 10.2: the chance of a rejection
# ---------------------------------------------------------------------------------------

def _rejection(p: torch.Tensor, q: torch.Tensor) -> float:
    """Reference: a draft d ~ q is accepted with min(1, p(d)/q(d)), so in all with
    sum_d q(d) min(1, p(d)/q(d)) = sum_d min(p(d), q(d)); rejected with the rest."""
    return float(1 - torch.minimum(p, q).sum())


def _distributions(seed: int, vocab: int, zeros: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(vocab, generator=g, dtype=torch.float64), torch.rand(vocab, generator=g, dtype=torch.float64)
    p[:zeros] = 0                                           # tokens the model would not sample (top-k)
    return p / p.sum(), q / q.sum()


def _rejection_cases() -> list[Case]:
    specs = [("5 tokens", 101, 5, 0), ("50 tokens", 102, 50, 0), ("20 tokens, the first 5 outside the model's top-k",
             104, 20, 5)]
    cases = [Case(name, _distributions(seed, vocab, zeros), None, atol=1e-9) for name, seed, vocab, zeros in specs]
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    cases.append(Case("the drafter's distribution equals the model's", (p, p.clone()), None, atol=1e-9))
    one_hot = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    cases.append(Case("a certain drafter (prompt lookup proposes one token)", (p, one_hot), None, atol=1e-9))
    for case in cases:
        case.expected = _rejection(*case.args)
    return cases


_REJECTION_MISTAKES: list[tuple[str, Callable]] = [
    ("this is the sum of |p - q|, twice the chance: every token where q > p is counted once in the rejections, "
     "and the same mass again where p > q. Half of it is the total variation distance.",
     lambda p, q: float((p - q).abs().sum())),
    ("the acceptance is not capped at 1: a draft the model wants more than the drafter proposes it is kept, "
     "with probability 1, not p/q > 1. Sum q(d) min(1, p(d)/q(d)).",
     lambda p, q: float(1 - sum(float(pi) for pi, qi in zip(p, q) if qi > 0))),
    ("this is the chance of accepting, not of rejecting.", lambda p, q: 1 - _rejection(p, q)),
]


def check_rejection_chance(fn: Callable) -> None:
    """Exercise 10.2: ``fn(p, q)`` returns the chance that a draft drawn from ``q`` is rejected."""
    exercise = "Exercise 10.2"
    cases = _rejection_cases()
    hint = diagnose(fn, cases, _REJECTION_MISTAKES) if callable(fn) else None
    run_check(exercise, fn, cases, hint=hint or "a draft d comes with probability q(d) and is kept with "
              "min(1, p(d) / q(d)): add up q(d) times that over the vocabulary, and take the rest.")


# ---------------------------------------------------------------------------------------
# Exercise 10.3: the tokens a verify step writes
# ---------------------------------------------------------------------------------------

def _tokens_cases() -> list[Case]:
    specs = [("α = 0.8, k = 4", 0.8, 4), ("α = 0.5, k = 1", 0.5, 1), ("α = 0.9, k = 8", 0.9, 8),
             ("every draft wrong, α = 0", 0.0, 4), ("every draft right, α = 1", 1.0, 4), ("no drafts, k = 0", 0.7, 0)]
    return [Case(name, (alpha, k), _tokens(alpha, k), atol=1e-9) for name, alpha, k in specs]


_TOKENS_MISTAKES: list[tuple[str, Callable]] = [
    ("the model's own token is left out: every verify step writes it after the accepted run, so the sum starts "
     "at 1 (α⁰), not at α.", lambda alpha, k: _tokens(alpha, k) - 1),
    ("the series runs one term too far: with k drafts the run is at most k long, so the last term is α^k.",
     lambda alpha, k: _tokens(alpha, k + 1)),
    ("this is the infinite series, 1 / (1 - α): a step has only k drafts to accept.",
     lambda alpha, k: float("inf") if alpha == 1 else 1 / (1 - alpha)),
]


def check_tokens_per_verify(fn: Callable) -> None:
    """Exercise 10.3: ``fn(alpha, k)`` returns the expected tokens a verify step writes."""
    exercise = "Exercise 10.3"
    if callable(fn):
        refuse_library_answer(exercise, fn, _library_formulas())
    cases = _tokens_cases()
    hint = diagnose(fn, cases, _TOKENS_MISTAKES) if callable(fn) else None
    run_check(exercise, fn, cases, hint=hint or "the step writes j + 1 tokens when the first j drafts pass and the "
              "next fails (or j = k): add up the chance that the run reaches each position.")


EXTRA_TOKEN_CHOICES = {
    "a": (False, "the drafter has written only k tokens; a (k+1)-th draft would cost a draft step more, and the "
                 "verify step would not have checked it."),
    "b": (True, "the verify step fed the last token and the k drafts, and so computed the model's logits after "
                "each of them, the last included: after k accepted drafts the model's own next token is already "
                "there, for no extra step (drawn from p when sampling)."),
    "c": (False, "nothing has to be rolled back when every draft passes; and a rolled-back cache holds no token to "
                 "write."),
    "d": (False, "the verify step of the next round starts from the last accepted token; the token after it comes "
                 "from this round's logits, not the next round's."),
}


def check_extra_token(fn: Any) -> None:
    """Exercise 10.3: the letter of where the (k+1)-th token of a step comes from when every draft passes."""
    check_choice("Exercise 10.3", student_answer("Exercise 10.3", fn, "the letter of your choice"),
                 EXTRA_TOKEN_CHOICES)


# ---------------------------------------------------------------------------------------
# Exercise 10.4: fewer drafts a step
# ---------------------------------------------------------------------------------------

def check_lookup_steps(fn: Any, measured: int, n_new: int = 64, k: int = 2) -> None:
    """Exercise 10.4: ``fn()`` returns the verify steps after the prefill for ``n_new`` tokens of the quote
    with ``k`` drafts a step, the first verify step drafting nothing and every later draft right;
    graded against the run's ``measured`` count."""
    exercise = "Exercise 10.4"
    predicted = student_answer(exercise, fn, "your number of verify steps")
    rest = n_new - 2                        # after the prefill's token and the first verify step's own token
    why = (f"the prefill writes the first token, the first verify step drafts nothing and writes one, and each later "
           f"step writes its {k} drafts and the model's own token, {k + 1} in all: 1 + ceil({rest} / {k + 1}).")
    slips = {1 + math.ceil(rest / k): f"a step writes k + 1 = {k + 1} tokens, not k: the model adds its own token "
                                       "after the accepted drafts.",
             math.ceil((n_new - 1) / (k + 1)): "the first verify step drafts nothing: it writes one token, and the "
                                               "full steps start after it.",
             2 + math.ceil(rest / (k + 1)): "that counts the prefill too: the question asks for the verify steps "
                                            "after it."}
    why = slips.get(predicted, why) if predicted != measured else why
    check_prediction(exercise, predicted, measured, rel_tol=1e-9, what=f"the verify steps for {n_new} tokens, k = {k}",
                     why=why)


SAMPLED_CHOICES = {
    "a": (True, "a lookup draft is a certain guess (q = 1 on it), so the rule min(1, p/q) keeps it with probability "
                "p(draft): greedy, a draft that is the model's top token always stays; sampled, it stays only with the "
                "model's probability of it, below 1 wherever the model gives other tokens some probability too."),
    "b": (False, "a verify step costs the same whatever the temperature: the model computes the same logits, and "
                 "sampling from them is a small share of the step."),
    "c": (False, "the generator only draws the random numbers; the cache is rolled back past rejected drafts at any "
                 "temperature, and the tokens before are kept."),
    "d": (False, "dividing the logits by a temperature keeps their order: the most likely token stays the most likely, "
                 "only less sure. The draft is rejected by the draw, not by a new first choice."),
}


def check_sampled_acceptance(fn: Any) -> None:
    """Exercise 10.4: the letter of why sampling accepts fewer of prompt lookup's drafts."""
    check_choice("Exercise 10.4", student_answer("Exercise 10.4", fn, "the letter of your choice"), SAMPLED_CHOICES)
