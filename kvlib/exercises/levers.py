"""Checks for the exercises of *The levers together* (section 11).

- 11.1, users that fit: how many users of Llama-3-8B fit beside its weights on a 48 GB GPU at a
  long context, in whole users, graded exactly, with the usual slips named; kvlib's formulas
  (the cache and weight sizes of :mod:`kvlib.cache.sizes`, the levers) refused;
- 11.2, which lever first: a letter for the lever that raises the tokens per second the most for
  24 users of Llama-2-7B (no grouped-query attention) at 4,096 tokens, a scenario the page does not
  print, graded against what :func:`kvlib.measure.levers.levers` computes, then a letter for why;
- 11.3, speculation past the knee: the speed-up of speculative decoding (k = 3, α = 0.8, a case the
  page does not print) when the batch's step is compute-bound, graded within 2 %; kvlib's own
  formula refused.
"""
from __future__ import annotations

import math
from typing import Any, Callable

from .framework import check_choice, check_prediction, refuse_library_answer, student_answer

__all__ = ["check_users_that_fit", "check_first_lever", "check_first_lever_explanation", "check_compute_bound_speedup",
           "first_lever", "FIT_CASE", "LEVER_LETTERS", "FIRST_LEVER_CASE", "FIRST_LEVER_CHOICES", "COMPUTE_BOUND_CASE"]


def _library() -> dict[str, Callable]:
    """kvlib's formulas that compute these answers: the checks refuse them (every size of
    :mod:`kvlib.cache.sizes`: a user's cache and the weights are the two halves of 11.1)."""
    from ..cache import sizes
    from ..measure import levers, speculation

    return {"levers": levers.levers, "best_lever": levers.best_lever, "first_lever": first_lever,
            "kv_bytes_per_token": sizes.kv_bytes_per_token, "kv_cache_bytes": sizes.kv_cache_bytes,
            "weight_bytes": sizes.weight_bytes, "crossover_tokens": sizes.crossover_tokens,
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
FIRST_LEVER_CASE = {"model": "Llama-2-7B", "users": 24, "context": 4096}   # none of the page's printed scenarios


def first_lever(model: str = "Llama-2-7B", users: int = 24, context: int = 4096) -> str:
    """The letter of the lever of (b) to (e) that raises the tokens per second the most, for
    ``model`` on the H100 with a shared prefix of 1,024 tokens (:func:`kvlib.measure.levers.best_lever`)."""
    from ..measure.levers import Scenario, best_lever, levers

    return best_lever(levers(Scenario(model, "NVIDIA H100 SXM", users=users, context=context,
                                      shared_prefix=1024)))[1].key


def _first_lever_slips(model: str, users: int, context: int) -> dict[str, str]:
    """What a wrong letter for :data:`FIRST_LEVER_CASE` most likely overlooked."""
    from ..cache.model_shapes import MODEL_SHAPES

    cfg = MODEL_SHAPES[model].config
    return {
        "b": f"{model} keeps a key/value head for every query head ({cfg.n_kv_heads} of {cfg.n_heads}): "
             f"grouped-query attention is already as it is, and (b) changes nothing.",
        "d": f"the weights are read once a step; {users} users' 16-bit caches at {context:,} tokens are "
             f"read once per row: which part of a step's bytes is the larger, and which lever shrinks it?",
        "e": f"in this model prefix reuse saves memory, not reading (every row reads its whole cache), and "
             f"the {users} users already fit: it changes neither the batch nor the step.",
        "c": "compare the bytes a step reads at each row: the weights once, each user's cache once per row.",
    }


def check_first_lever(fn: Any, model: str = FIRST_LEVER_CASE["model"], users: int = FIRST_LEVER_CASE["users"],
                      context: int = FIRST_LEVER_CASE["context"]) -> None:
    """Exercise 11.2: ``fn()`` returns the letter of the lever that pays most for ``users`` of
    ``model`` at ``context`` tokens."""
    from .framework import CheckFailed

    exercise = "Exercise 11.2"
    _refuse(exercise, fn)
    answer = student_answer(exercise, fn, "the letter of your prediction")
    expected = first_lever(model, users, context)
    letters = ", ".join(map(repr, LEVER_LETTERS))
    if not isinstance(answer, str) or answer.strip().lower() not in LEVER_LETTERS:
        raise CheckFailed(f"{exercise}: answer with one of {letters}, got {answer!r}.")
    letter = answer.strip().lower()
    if letter != expected:
        raise CheckFailed(f"{exercise}: you predicted ({letter}); the formulas give ({expected}): "
                          f"{_first_lever_slips(model, users, context)[letter]}")
    print(f"✓ {exercise}: ({expected}) is the lever that pays most for {users} users of {model} "
          f"at {context:,} tokens.")


FIRST_LEVER_CHOICES = {
    "a": (True, "24 users' 16-bit caches at 4,096 tokens (2 × 32 × 32 × 128 × 2 bytes a token, 2.1 GB a user) "
                "are far more than the 13.5 GB of weights, and each row reads its own every step: an 8-bit "
                "cache about halves the larger part. 4-bit weights, applied after it, cut the weights to "
                "5/16, but the weights are the smaller part."),
    "b": (False, "Llama-2-7B has no grouped-query attention to add: its 32 query heads each keep their own "
                 "keys and values, so row (b) is row (a), and the 8-bit cache shrinks the full cache."),
    "c": (False, "5/16 is the largest cut a lever makes to its part, but what counts is the bytes it saves: "
                 "the weights are read once a step, the caches once per row, and here the caches are the "
                 "larger part."),
    "d": (False, "all 24 users fit from row (a) on (30 of them would), so a larger room changes no batch; "
                 "and in this model every row still reads the shared prompt's cache."),
}


def check_first_lever_explanation(fn: Any) -> None:
    """Exercise 11.2: the letter of why that lever pays most."""
    check_choice("Exercise 11.2", student_answer("Exercise 11.2", fn, "the letter of your choice"), FIRST_LEVER_CHOICES)


# ---------------------------------------------------------------------------------------
# Exercise 11.3: speculation past the knee
# ---------------------------------------------------------------------------------------

# Neither the page's own case (k = 4, α = 0.7: its CPU table prints (e) and (f) side by side) nor a point of
# the assumptions widget's grid: no printed row answers it.
COMPUTE_BOUND_CASE = {"alpha": 0.8, "k": 3}


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
