"""Checks for the exercises of *Speculative decoding* (section 10).

- 10.1, where a draft stops paying: the acceptance a draft model needs to break even with two
  drafts a step, a verify step dearer than a plain one and a given cost of a draft step (the page
  works out only the case where every draft passes), graded within 2 %, with the usual slips
  named; kvlib's own formulas refused;
- 10.2, two candidates for one position: ``both_rejected(p, q)``, the chance that two drafts
  drawn from ``q`` are both rejected when the second is checked against the residual the first
  left (the rule of SpecInfer and EAGLE, which the page states but does not work out), graded on
  seeded distributions, with the usual slips named;
- 10.3, the tokens a verify step writes: ``tokens_per_verify(alphas)`` with an acceptance that
  changes along the draft, graded on seeded cases (zeros and ones among them), kvlib's own
  refused; then a letter for when one more draft raises the speed-up (its added tokens per added cost
  against the step's own, not against plain decoding's);
- 10.4, fewer drafts a step: the verify steps the quote takes with k = 2, graded against the run,
  then a letter for why sampling keeps fewer of prompt lookup's drafts.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from .framework import (Case, CheckFailed, check_choice, check_prediction, diagnose, refuse_library_answer,
                        run_check, student_answer)

__all__ = ["check_break_even", "check_both_rejected", "check_tokens_per_verify", "check_one_more_draft",
           "check_lookup_steps", "check_sampled_acceptance", "BREAK_EVEN_CASE", "ONE_MORE_DRAFT_CHOICES",
           "SAMPLED_CHOICES"]


def _library_formulas() -> dict[str, Callable]:
    """kvlib's own formulas of this section: the checks refuse them (they compute the answers)."""
    from ..measure import speculation

    return {"tokens_per_step": speculation.tokens_per_step, "predicted_speedup": speculation.predicted_speedup}


def _tokens(alphas) -> float:
    """Reference: the step writes its (i + 1)-th token when the first i drafts pass: 1 + a1 + a1 a2 + ..."""
    total, run = 1.0, 1.0
    for a in alphas:
        run *= a
        total += run
    return total


def _solve(tokens: Callable[[float], float], target: float) -> float:
    """The acceptance in [0, 1] at which ``tokens(alpha)`` (rising) reaches ``target`` (nan if never)."""
    lo, hi = 0.0, 1.0
    if not tokens(lo) <= target <= tokens(hi):
        return float("nan")
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if tokens(mid) < target else (lo, mid)
    return (lo + hi) / 2


# ---------------------------------------------------------------------------------------
# Exercise 10.1: where a draft stops paying
# ---------------------------------------------------------------------------------------

BREAK_EVEN_CASE = {"k": 2, "draft": 0.2, "verify": 1.1}      # d / c and v(k) / c


def _break_even(k: int, draft: float, verify: float) -> float:
    """Reference: the acceptance at which 1 + α + ... + α^k = v(k)/c + k d/c."""
    return _solve(lambda a: _tokens([a] * k), verify + k * draft)


def _break_even_mistakes(k: int, draft: float, verify: float) -> dict[str, float]:
    cost = verify + k * draft
    return {
        "the model's own token is left out of the tokens a step writes: accepted drafts or not, the verify step "
        "writes the model's next token too, so a step writes 1 + α + α² tokens.":
            _solve(lambda a: _tokens([a] * k) - 1, cost),
        "the verify step is counted as one plain step: here it costs 1.1 of them, v(2) / c = 1.1.":
            _solve(lambda a: _tokens([a] * k), 1 + k * draft),
        "one draft step is counted for both drafts: the draft model writes its drafts one at a time, k steps.":
            _solve(lambda a: _tokens([a] * k), verify + draft),
        "this is the infinite series, 1 / (1 - α): a step has only k = 2 drafts to accept.":
            1 - 1 / cost,
        "the second draft is counted with chance α: it is kept only if the first was kept too, with chance α · α.":
            (cost - 1) / k,
    }


def check_break_even(fn: Any) -> None:
    """Exercise 10.1: ``fn()`` returns the acceptance α at which speculation with :data:`BREAK_EVEN_CASE`'s
    two drafts a step, verify step and draft step breaks even."""
    exercise = "Exercise 10.1"
    if callable(fn):
        refuse_library_answer(exercise, fn, _library_formulas())
    predicted = student_answer(exercise, fn, "your number")
    expected = _break_even(**BREAK_EVEN_CASE)
    why = ("count the tokens a step writes when the first draft fails, when only the first passes, and when both "
           "pass, each with its chance; the step costs v(2) + 2 d, in plain steps 1.5.")
    if isinstance(predicted, (int, float)) and not isinstance(predicted, bool):
        for sentence, value in _break_even_mistakes(**BREAK_EVEN_CASE).items():
            if math.isclose(predicted, value, rel_tol=0.02):
                why = sentence
    check_prediction(exercise, predicted, expected, rel_tol=0.02, what="the acceptance at which the draft breaks "
                     "even", why=why)


# ---------------------------------------------------------------------------------------
# Exercise 10.2: two candidates for one position
# ---------------------------------------------------------------------------------------

def _both_rejected(p: torch.Tensor, q: torch.Tensor) -> float:
    """Reference: the first candidate passes with sum min(p, q); after a rejection the second is
    checked against the residual r = max(0, p - q) / (1 - that), and passes with sum min(r, q)."""
    first = float(torch.minimum(p, q).sum())
    if first >= 1 - 1e-12:
        return 0.0
    residual = (p - q).clamp(min=0) / (1 - first)
    return (1 - first) * (1 - float(torch.minimum(residual, q).sum()))


def _distributions(seed: int, vocab: int, zeros: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    p, q = torch.rand(vocab, generator=g, dtype=torch.float64), torch.rand(vocab, generator=g, dtype=torch.float64)
    p[:zeros] = 0                                           # tokens the model would not sample (top-k)
    return p / p.sum(), q / q.sum()


def _both_rejected_cases() -> list[Case]:
    specs = [("5 tokens", 101, 5, 0), ("50 tokens", 102, 50, 0), ("20 tokens, the first 5 outside the model's top-k",
             104, 20, 5)]
    cases = [Case(name, _distributions(seed, vocab, zeros), None, atol=1e-9) for name, seed, vocab, zeros in specs]
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    cases.append(Case("the drafter's distribution equals the model's", (p, p.clone()), None, atol=1e-9))
    sure = torch.tensor([0.0, 1.0, 0.0], dtype=torch.float64)
    cases.append(Case("a drafter sure of one token", (p, sure), None, atol=1e-9))
    cases.append(Case("a model sure of one token", (sure, p.clone()), None, atol=1e-9))
    for case in cases:
        case.expected = _both_rejected(*case.args)
    return cases


def _against_p_again(p, q):
    first = float(torch.minimum(p, q).sum())
    return (1 - first) ** 2


def _unnormalised(p, q):
    first = float(torch.minimum(p, q).sum())
    return (1 - first) * (1 - float(torch.minimum((p - q).clamp(min=0), q).sum()))


_BOTH_REJECTED_MISTAKES: list[tuple[str, Callable]] = [
    ("the second candidate is checked against p again, as if the first had never been tried: that is "
     "(1 - β)², and it writes tokens that do not follow p. After a rejection, the part of p the first check "
     "already covered, min(p, q), is used up: the second candidate is checked against what is left, "
     "max(0, p - q), normalised.", _against_p_again),
    ("the residual max(0, p - q) is not normalised: it sums to 1 - β, not 1; divide it by that before the second "
     "check.", _unnormalised),
    ("this is the chance that one of the two passes, not that both are rejected.",
     lambda p, q: 1 - _both_rejected(p, q)),
    ("this is the chance that one candidate is rejected: the question asks for both of them.",
     lambda p, q: 1 - float(torch.minimum(p, q).sum())),
]


def check_both_rejected(fn: Callable) -> None:
    """Exercise 10.2: ``fn(p, q)`` returns the chance that two drafts drawn from ``q`` are both rejected, the
    second checked against the residual the first left."""
    exercise = "Exercise 10.2"
    cases = _both_rejected_cases()
    if callable(fn):
        for case in cases:
            try:
                got = fn(*(a.clone() for a in case.args))
            except Exception:
                break                                           # run_check reports it
            if isinstance(got, (int, float, torch.Tensor)) and math.isnan(float(got)):
                raise CheckFailed(f"{exercise}: case '{case.name}' gave NaN. When the first candidate always "
                                  f"passes (β = 1), nothing is left to normalise, max(0, p - q) is all zeros: "
                                  f"the second candidate is never checked, and the chance is 0.")
    hint = diagnose(fn, cases, _BOTH_REJECTED_MISTAKES) if callable(fn) else None
    run_check(exercise, fn, cases, hint=hint or "the first check passes with β = Σ min(p, q); after a rejection "
              "what distribution is the second candidate checked against, and with what chance does it pass?")


# ---------------------------------------------------------------------------------------
# Exercise 10.3: the tokens a verify step writes
# ---------------------------------------------------------------------------------------

def _tokens_cases() -> list[Case]:
    specs = [("the same 0.8 at 4 positions", [0.8] * 4), ("one draft, 0.5", [0.5]),
             ("falling along the draft", [0.9, 0.8, 0.7, 0.6, 0.5, 0.4]), ("every draft wrong", [0.0] * 4),
             ("every draft right", [1.0] * 4), ("no drafts", []), ("a sure miss in the middle", [0.9, 0.0, 0.9])]
    return [Case(name, (list(alphas),), _tokens(alphas), atol=1e-9) for name, alphas in specs]


def _geometric_of_first(alphas):
    return sum(alphas[0] ** i for i in range(len(alphas) + 1)) if alphas else 1.0


_TOKENS_MISTAKES: list[tuple[str, Callable]] = [
    ("the model's own token is left out: every verify step writes it after the accepted run, so the count starts "
     "at 1.", lambda alphas: _tokens(alphas) - 1),
    ("the chances are added, not multiplied: the step writes its third token only if the first draft and the "
     "second both pass, with chance α₁ · α₂.", lambda alphas: 1 + sum(alphas)),
    ("only the first position's acceptance is used, as if it held at every position: each position has its own.",
     _geometric_of_first),
]


def check_tokens_per_verify(fn: Callable) -> None:
    """Exercise 10.3: ``fn(alphas)`` returns the expected tokens a verify step writes when draft ``i`` passes
    with chance ``alphas[i]`` given that the drafts before it passed."""
    exercise = "Exercise 10.3"
    if callable(fn):
        refuse_library_answer(exercise, fn, _library_formulas())
    cases = _tokens_cases()
    hint = diagnose(fn, cases, _TOKENS_MISTAKES) if callable(fn) else None
    run_check(exercise, fn, cases, hint=hint or "with what chance does the step write its first token, its "
              "second, its third? Add those chances up.")


ONE_MORE_DRAFT_CHOICES = {
    "a": (False, "that sets the extra draft against plain decoding: it pays for itself, but the speed-up is a ratio, "
                 "E·c / C, and adding ΔE on top and ΔC below raises it only if ΔE / ΔC beats E / C. (a) and (b) "
                 "agree only at a speed-up of exactly 1; above it, a draft that clears (a) can still lower the "
                 "speed-up: E = 4 tokens for C = 2c, one more draft adding 1.5 tokens for c, gives 5.5 / 3 < 2."),
    "b": (True, "the speed-up is a ratio, E·c / C, and (E + ΔE) / (C + ΔC) > E / C exactly when ΔE / ΔC > E / C "
                "(multiply out). One more draft must beat the tokens per cost the step already reaches, not plain "
                "decoding's: the better the speed-up so far, the more a further draft must add. Below α = 1, "
                "ΔE = α_1 ⋯ α_(k+1) shrinks with every draft while ΔC does not, which puts the best k inside the "
                "range."),
    "c": (False, "α_(k+1) is only the chance that the new draft passes once the others have; it adds that chance "
                 "times the chance of getting there, α_1 ⋯ α_(k+1), and whether that is enough depends on what the "
                 "draft costs, ΔC, which this rule leaves out."),
    "d": (False, "the tokens do rise with every draft that can pass, but so does the cost: each draft costs a draft "
                 "step and makes the verify step longer. The speed-up is their ratio."),
}


def check_one_more_draft(fn: Any) -> None:
    """Exercise 10.3: the letter of when one more draft raises the speed-up."""
    check_choice("Exercise 10.3", student_answer("Exercise 10.3", fn, "the letter of your choice"),
                 ONE_MORE_DRAFT_CHOICES)


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
