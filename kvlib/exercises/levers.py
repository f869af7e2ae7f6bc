"""Checks for the exercises of *The levers together* (section 11).

- 11.1, users that fit: how many users of Llama-3-8B fit beside its weights on a 48 GB GPU at a
  long context, in whole users, graded exactly, with the usual slips named; kvlib's formulas refused;
- 11.2, which lever first: a letter for the lever that raises the tokens per second the most for
  four users at a long context, graded against what :func:`kvlib.measure.levers.levers` computes,
  then a letter for why;
- 11.3, speculation past the knee: the speed-up of speculative decoding when the batch's step is
  compute-bound, graded within 2 %; kvlib's own formula refused.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .framework import check_choice, check_prediction, refuse_library_answer, student_answer

__all__ = ["check_users_that_fit", "check_first_lever", "check_first_lever_explanation", "check_compute_bound_speedup",
           "FIT_CASE", "LEVER_LETTERS", "FIRST_LEVER_CHOICES", "COMPUTE_BOUND_CASE"]


def _library() -> dict[str, Callable]:
    """kvlib's formulas that compute these answers: the checks refuse them."""
    from ..cache import sizes
    from ..measure import levers, speculation

    return {"levers": levers.levers, "kv_bytes_per_token": sizes.kv_bytes_per_token,
            "tokens_per_step": speculation.tokens_per_step, "predicted_speedup": speculation.predicted_speedup}


def _refuse(exercise: str, fn: Any) -> None:
    if callable(fn):
        refuse_library_answer(exercise, fn, _library())


# ---------------------------------------------------------------------------------------
# Exercise 11.1: users that fit
# ---------------------------------------------------------------------------------------

FIT_CASE = {"n_params": 8.03e9, "layers": 32, "kv_heads": 8, "head_dim": 128, "memory_bytes": 48e9, "context": 16384}


def _fit(n_params: float, layers: int, kv_heads: int, head_dim: int, memory_bytes: float, context: int,
         bytes_per_number: int = 2) -> int:
    """Reference: whole users whose 16-bit cache fits beside the bfloat16 weights."""
    per_user = 2 * layers * kv_heads * head_dim * bytes_per_number * context
    return math.floor((memory_bytes - n_params * bytes_per_number) / per_user)


def _fit_mistakes() -> dict[str, int]:
    c = FIT_CASE
    per_user = 2 * c["layers"] * c["kv_heads"] * c["head_dim"] * 2 * c["context"]
    return {
        "the keys and the values are two caches: 2 × layers × kv heads × head dim numbers per token, not one.":
            math.floor((c["memory_bytes"] - 2 * c["n_params"]) / (per_user / 2)),
        "the weights take memory too: the caches get what the 16.06 GB of bfloat16 weights leave.":
            math.floor(c["memory_bytes"] / per_user),
        "with grouped-query attention the cache has 8 key/value heads, not the 32 query heads.":
            math.floor((c["memory_bytes"] - 2 * c["n_params"]) / (per_user * 4)),
        "a user is whole: round down, not to the nearest.": round((c["memory_bytes"] - 2 * c["n_params"]) / per_user),
    }


def check_users_that_fit(fn: Any) -> None:
    """Exercise 11.1: ``fn()`` returns the users of :data:`FIT_CASE` that fit, a whole number."""
    exercise = "Exercise 11.1"
    _refuse(exercise, fn)
    predicted = student_answer(exercise, fn, "your number of users")
    expected = _fit(**FIT_CASE)
    why = ("each user holds 2 × 32 × 8 × 128 numbers of 2 bytes per token for 16,384 tokens; the GPU's 48 GB less the "
           "weights' 2 bytes per weight, divided by that, rounded down.")
    for sentence, value in _fit_mistakes().items():
        if predicted == value and value != expected:
            why = sentence
    check_prediction(exercise, predicted, expected, rel_tol=1e-9, what="the users that fit", why=why)


# ---------------------------------------------------------------------------------------
# Exercise 11.2: which lever first
# ---------------------------------------------------------------------------------------

LEVER_LETTERS = ("b", "c", "d", "e")      # the levers the exercise asks about: (b) to (e)


def first_lever(users: int = 4, context: int = 32768) -> str:
    """The letter of the lever of (b) to (e) that raises the tokens per second the most, for
    Llama-3-8B on the H100 with a shared prefix of 1,024 tokens (:func:`kvlib.measure.levers.levers`)."""
    from ..measure.levers import Scenario, levers

    rows = levers(Scenario("Llama-3-8B", "NVIDIA H100 SXM", users=users, context=context, shared_prefix=1024))
    gains = {b.lever.key: b.tokens_per_second / a.tokens_per_second for a, b in zip(rows[:4], rows[1:5])}
    return max(gains, key=gains.get)


def check_first_lever(fn: Any, users: int = 4, context: int = 32768) -> None:
    """Exercise 11.2: ``fn()`` returns the letter of the lever that pays most for ``users`` at ``context`` tokens."""
    exercise = "Exercise 11.2"
    answer = student_answer(exercise, fn, "the letter of your prediction")
    expected = first_lever(users, context)
    letters = ", ".join(map(repr, LEVER_LETTERS))
    if not isinstance(answer, str) or answer.strip().lower() not in LEVER_LETTERS:
        from .framework import CheckFailed
        raise CheckFailed(f"{exercise}: answer with one of {letters}, got {answer!r}.")
    if answer.strip().lower() != expected:
        from .framework import CheckFailed
        raise CheckFailed(f"{exercise}: you predicted ({answer.strip().lower()}); the formulas give ({expected}). With "
                          f"{users} users at {context:,} tokens, what does a step read most: the weights or the caches?")
    print(f"✓ {exercise}: ({expected}) is the lever that pays most for {users} users at {context:,} tokens.")


FIRST_LEVER_CHOICES = {
    "a": (True, "without grouped-query attention each user's 16-bit cache at 32,768 tokens is about 17 GB, more than "
                "the 16 GB of weights, and only three users fit: the caches are most of what a step reads. Grouped-query "
                "attention divides every cache by four (32 query heads over 8 key/value heads), so all four users fit "
                "and the step reads a quarter of the cache; 4-bit weights would shrink the smaller part."),
    "b": (False, "four rows are far below the H100's knee: the step is memory-bound, and grouped-query attention does "
                 "not change the arithmetic of the projections anyway."),
    "c": (False, "in this model prefix reuse saves memory, not reading (every row reads its whole cache), and 1,024 "
                 "shared tokens are a small part of 32,768."),
    "d": (False, "the weights are 16 GB read once a step whatever the batch, while four users' caches are several "
                 "times that at this context: shrinking the weights saves the smaller part."),
}


def check_first_lever_explanation(fn: Any) -> None:
    """Exercise 11.2: the letter of why that lever pays most."""
    check_choice("Exercise 11.2", student_answer("Exercise 11.2", fn, "the letter of your choice"), FIRST_LEVER_CHOICES)


# ---------------------------------------------------------------------------------------
# Exercise 11.3: speculation past the knee
# ---------------------------------------------------------------------------------------

COMPUTE_BOUND_CASE = {"alpha": 0.7, "k": 4}


def _compute_bound(alpha: float, k: int) -> float:
    """Reference: a compute-bound step costs its arithmetic, k + 1 tokens per row instead of 1, while it
    writes 1 + α + ... + α^k of them: the speed-up is their ratio."""
    return sum(alpha ** i for i in range(k + 1)) / (k + 1)


def check_compute_bound_speedup(fn: Any) -> None:
    """Exercise 11.3: ``fn()`` returns the speed-up of speculative decoding on a compute-bound batch."""
    exercise = "Exercise 11.3"
    _refuse(exercise, fn)
    predicted = student_answer(exercise, fn, "your number")
    a, k = COMPUTE_BOUND_CASE["alpha"], COMPUTE_BOUND_CASE["k"]
    tokens = sum(a ** i for i in range(k + 1))
    why = (f"past the knee a step costs its arithmetic: k + 1 = {k + 1} tokens per row cost {k + 1} times a plain "
           f"step, for {tokens:.2f} tokens written.")
    if isinstance(predicted, (int, float)) and math.isclose(predicted, tokens, rel_tol=0.02):
        why = "that is the tokens a step writes, the gain of a memory-bound step; a compute-bound one pays for them."
    check_prediction(exercise, predicted, _compute_bound(a, k), rel_tol=0.02,
                     what="the speed-up of speculative decoding past the knee", why=why)
