"""Checks for Exercise 7.3 of *Batching* (section 7): counting the waste.

Predicted step counts and shares of useful slot-steps of static and continuous batching,
graded against :func:`kvlib.serve.serve` run on a tiny random model (the counts are the same
on every machine). The section's other checks are in :mod:`kvlib.exercises.batching`.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from .framework import CheckFailed, check_prediction, describe, student_answer

__all__ = ["check_predicted_steps", "check_predicted_useful_share", "waste_runs", "WASTE_ANSWERS", "WASTE_SLOTS"]


# ---------------------------------------------------------------------------------------
# Exercise 7.3: counting the waste (predict, run, look)
# ---------------------------------------------------------------------------------------

WASTE_ANSWERS = (2, 2, 2, 20, 2, 2, 2, 20)       # tokens each request writes, in order of arrival
WASTE_SLOTS = 4


def waste_runs(prompt_len: int = 4, seed: int = 7) -> dict[str, Any]:
    """:func:`kvlib.serve.serve` with both policies on a tiny random model: the eight requests of
    :data:`WASTE_ANSWERS` (random prompts of ``prompt_len`` tokens, no stop token), all arriving at
    once, :data:`WASTE_SLOTS` slots. Returns ``{"static": ServeReport, "continuous": ServeReport}``;
    the counts of steps and slot-steps are the same on every machine (no token ends a request early).
    The global random state is left as it was."""
    from ..config import Config
    from ..model import Decoder
    from ..serve import Request, serve

    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = Decoder(Config.tiny())
    g = torch.Generator().manual_seed(seed)
    requests = [Request(torch.randint(0, model.config.vocab_size, (prompt_len,), generator=g).tolist(), n)
                for n in WASTE_ANSWERS]
    return {policy: serve(model, requests, max_batch=WASTE_SLOTS, policy=policy) for policy in ("static", "continuous")}


@functools.lru_cache(maxsize=1)
def _waste_counts() -> dict[str, dict[str, int]]:
    """Steps, useful slot-steps, all slot-steps and prefill slot-steps of :func:`waste_runs`, per
    policy (run once: they are the same every time)."""
    return {name: {"steps": len(r.timeline), "useful": r.useful_row_steps, "total": r.row_steps,
                   "prefills": sum(kind == "prefill" for s in r.timeline for _, kind, _ in s.work)}
            for name, r in waste_runs().items()}


def _pair(exercise: str, answer: Any, what: str) -> tuple[float, float]:
    """The student's (static, continuous) pair of numbers, or a CheckFailed saying what is expected."""
    if answer is None or answer is Ellipsis:
        raise CheckFailed(f"{exercise}: write your prediction of {what} first (two numbers: static, continuous), "
                          f"then run this check.")
    if not (isinstance(answer, (tuple, list)) and len(answer) == 2):
        raise CheckFailed(f"{exercise}: return two numbers, (static, continuous), got {describe(answer)}")
    for name, x in zip(("static", "continuous"), answer):
        if x is None or x is Ellipsis:
            raise CheckFailed(f"{exercise}: write your prediction for {name} batching first, then run this check.")
        if isinstance(x, bool) or not isinstance(x, (int, float)):
            raise CheckFailed(f"{exercise}: your prediction for {name} batching should be a number, got {describe(x)}")
    return answer[0], answer[1]


_STATIC_STEP_MISTAKES = {
    20: "that is one batch only: four slots take the first four requests, and the other four wait for a second "
        "batch, which again runs until its 20-token answer is done.",
    22: "requests are taken in order of arrival, so each batch of four holds one 20-token answer: both batches "
        "take 20 steps.",
    42: "the prefill step writes each request's first token: it is the first of an answer's steps, not one "
        "more (2 × 20, not 2 × 21).",
    52: "that is the number of tokens written; static batching runs a batch until its longest answer is done, "
        "one step for all four slots at once.",
}
_CONTINUOUS_STEP_MISTAKES = {
    13: "that is all 52 tokens shared out over 4 slots, as if one request could use several slots at once: a "
        "request writes one token per step, so request 7's 20 tokens take 20 steps from the step it starts.",
    20: "request 7 cannot start at step 1: it waits for a free slot.",
    22: "request 7 waits longer: after step 2 three slots free up, and requests 4, 5 and 6 (earlier in the "
        "queue) take them at step 3; the next slot frees after step 4.",
    23: "off by one: request 7 writes its first token (its prefill) at step 5 and its 20th at step 24.",
    25: "off by one: request 7 writes its first token (its prefill) at step 5 and its 20th at step 24.",
}


def check_predicted_steps(fn: Any) -> None:
    """Exercise 7.3: ``fn()`` returns the predicted number of steps ``(static, continuous)`` for the
    eight requests of :data:`WASTE_ANSWERS` on four slots; graded exactly against :func:`waste_runs`."""
    exercise = "Exercise 7.3"
    static, continuous = _pair(exercise, student_answer(exercise, fn, "your two predicted numbers of steps"),
                               "the number of steps")
    actual = {name: counts["steps"] for name, counts in _waste_counts().items()}
    if (static, continuous) == (actual["continuous"], actual["static"]):
        raise CheckFailed(f"{exercise}: you predicted {static:g} steps for static and {continuous:g} for continuous "
                          f"batching: the other way round. Return (static, continuous).")
    as_static = {actual["static"]: "continuous batching refills a slot at the step after its request is done: "
                                   "requests 4, 5 and 6 start at step 3, not after the whole first batch."}
    for name, predicted, mistakes, general in (
            ("static", static, _STATIC_STEP_MISTAKES,
             "static batching runs each batch of four until its longest answer is done; an answer of n tokens "
             "takes n steps (the prefill step writes the first)."),
            ("continuous", continuous, {**_CONTINUOUS_STEP_MISTAKES, **as_static},
             "draw the four slots over the steps: a slot is refilled at the step after its request is done, and "
             "each request writes one token per step.")):
        if predicted != actual[name]:
            why = mistakes.get(predicted, general)
            direction = "too many" if predicted > actual[name] else "too few"
            raise CheckFailed(f"{exercise}: you predicted {predicted:g} steps for {name} batching, but serve took "
                              f"{actual[name]}: {direction}.\n  hint: {why}")
    print(f"✓ {exercise}: you predicted {static:g} steps for static and {continuous:g} for continuous batching; "
          f"serve took exactly {actual['static']} and {actual['continuous']}.")


def check_predicted_useful_share(fn: Any) -> None:
    """Exercise 7.3: ``fn()`` returns the predicted share (0 to 1) of slot-steps that write a token,
    ``(static, continuous)``; graded within 3 % against :func:`waste_runs` (a prefill slot-step writes
    its request's first token, so it counts)."""
    exercise = "Exercise 7.3"
    shares = _pair(exercise, student_answer(exercise, fn, "your two predicted shares"),
                   "the share of useful slot-steps")
    for (name, counts), predicted in zip(_waste_counts().items(), shares):
        useful, total, prefills = counts["useful"], counts["total"], counts["prefills"]
        why = (f"useful slot-steps are one per token written ({useful}, the prefill steps included), over all "
               f"slot-steps: steps × {WASTE_SLOTS} slots.")
        if 1 < predicted <= 100 and abs(predicted / 100 - useful / total) <= 0.03 * useful / total:
            why = "give the share as a fraction between 0 and 1 (0.5 for half), not a percentage."
        elif abs(predicted - (useful - prefills) / total) <= 0.01 * useful / total:
            why = (f"the prefill step writes each request's first token, so its slot-step is useful too: "
                   f"{useful}, not {useful - prefills}.")
        check_prediction(exercise, predicted, useful / total, rel_tol=0.03,
                         what=f"the share of useful slot-steps with {name} batching", why=why)
