"""Checks for Exercise 8.3 of *Quantization* (section 8): find a token the int8 cache flips.

An experiment on the real model: ``first_flip`` (checked on a tiny random model whose cache is
made to flip from a known position on), a prediction of the logits at a flip (a choice), and a
search for a chat question whose int8-cached answer parts from the float32 cache's, which the
check verifies by running both caches itself and accepts only where both choices are clear of
float rounding. The section's other checks are in :mod:`kvlib.exercises.quantization`.
"""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple, Sequence

import torch

from ..cache.base import KVCache, LayerKVCache
from ..config import Config
from ..model import Decoder
from .framework import Case, CheckFailed, check_choice, describe, run_check, student_answer

__all__ = ["check_first_flip", "check_flip_prediction", "check_found_flip", "FoundFlip", "FLIP_TOKENS", "FLIP_MARGIN"]


# ---------------------------------------------------------------------------------------------
# Exercise 8.3: find a token the int8 cache flips
# ---------------------------------------------------------------------------------------------

FLIP_TOKENS = 16            # new tokens per question in the search
FLIP_MARGIN = 1e-3          # both caches must choose their token by more than this (logits)


def _first_flip(model, prompt, n_new, make_cache):
    """The reference: the first index where greedy tokens with ``make_cache()`` differ from float32's."""
    from ..generate import generate

    exact = generate(model, prompt, n_new)
    other = generate(model, prompt, n_new, cache=make_cache())
    return next((i for i, (a, b) in enumerate(zip(exact, other)) if a != b), None)


class _ScaledKeysLayer(LayerKVCache):
    """A layer cache that hands back the keys of positions ``start`` on multiplied by ``factor``:
    a cache made to differ from float32's from a known position on (for the check only)."""

    def __init__(self, *args, start: int, factor: float) -> None:
        super().__init__(*args)
        self.start, self.factor = start, factor

    def update(self, positions, k, v, end, contiguous=False):
        k_all, v_all, key_positions = super().update(positions, k, v, end, contiguous)
        if k_all.shape[2] > self.start:
            k_all = k_all.clone()
            k_all[:, :, self.start:] *= self.factor
        return k_all, v_all, key_positions


class _ScaledKeysKVCache(KVCache):
    def __init__(self, *args, start: int = 0, factor: float = -1.0, **kwargs) -> None:
        self.start, self.factor = start, factor
        super().__init__(*args, **kwargs)

    def make_layer(self, *args) -> LayerKVCache:
        return _ScaledKeysLayer(*args, start=self.start, factor=self.factor)


class _CacheMaker:
    """A ``make_cache`` argument that says what it makes when a check's message shows it."""

    def __init__(self, what: str, make: Callable[[], KVCache]) -> None:
        self.what, self.make = what, make

    def __call__(self) -> KVCache:
        return self.make()

    def __repr__(self) -> str:
        return self.what


class _TinyDecoder(Decoder):
    def __repr__(self) -> str:
        return "a tiny random Decoder (Config.tiny(), seed 0)"


def _flip_cases() -> list[Case]:
    with torch.random.fork_rng(devices=[]):            # leave the caller's random state as it was
        torch.manual_seed(0)
        model = _TinyDecoder(Config.tiny()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(0)).tolist()

    def maker(what, cls=KVCache, **kwargs):
        return _CacheMaker(what, lambda: cls.for_model(model, max_len=32, **kwargs))

    specs = [
        ("a float32 kvlib.KVCache: the same answer", 16, maker("a float32 kvlib.KVCache")),
        ("every key negated: the answers part at once", 16,
         maker("a cache that negates every key", _ScaledKeysKVCache, start=0, factor=-1.0)),
        ("keys from position 12 on scaled by -3", 16,
         maker("a cache that scales the keys of positions 12 on by -3", _ScaledKeysKVCache, start=12, factor=-3.0)),
        ("the same cache, 3 new tokens: no flip yet", 3,
         maker("a cache that scales the keys of positions 12 on by -3", _ScaledKeysKVCache, start=12, factor=-3.0)),
        ("keys from position 10 on halved", 16,
         maker("a cache that halves the keys of positions 10 on", _ScaledKeysKVCache, start=10, factor=0.5)),
    ]
    with torch.no_grad():
        return [Case(name, (model, prompt, n, make), _first_flip(model, prompt, n, make)) for name, n, make in specs]


def _flip_mistake(got, expected, prompt, n_new) -> str | None:
    """The sentence that names the mistake giving ``got`` where ``expected`` is right, or ``None``."""
    if expected is None:
        if got in (-1, n_new, len(prompt) + n_new) or got is False:
            return "when the two answers agree on all n_new tokens, return None (not -1, False or n_new)."
        return None
    if got is None:
        return ("your function found no difference where there is one: one run must use the float32 cache "
                "(kvlib.generate's default), the other a fresh cache from make_cache().")
    if got == expected + 1:
        return "count the new tokens from 0: the first new token has index 0."
    if got == len(prompt) + expected:
        return "return the index among the new tokens, not the position in the whole sequence (prompt included)."
    return None


def check_first_flip(fn: Callable) -> None:
    """Exercise 8.3, the function: ``fn(model, prompt, n_new, make_cache)`` is the index (from 0) of the
    first of ``n_new`` greedy tokens where generation with the cache ``make_cache()`` returns differs
    from generation with a float32 :class:`kvlib.KVCache`, or ``None`` if all ``n_new`` agree.
    Tried on a tiny random model with caches made to differ from a known position on."""
    exercise = "Exercise 8.3"
    cases = _flip_cases()
    hint = "generate n_new tokens with each cache and return the first index where the two lists differ."
    if callable(fn):
        for case in cases:
            try:
                with torch.no_grad():
                    got = fn(*case.args)
            except Exception:             # run_check reports it
                break
            if got != case.expected:
                hint = _flip_mistake(got, case.expected, case.args[1], case.args[2]) or hint
                break
    with torch.no_grad():
        run_check(exercise, fn, cases, hint=hint)


FLIP_CHOICES = {
    "a": (True, "Rounding the keys and values to int8 moves every score a little, a fraction of a logit. That "
                "reorders the two best tokens only where they were about that close: a near-tie, far closer "
                "than at a typical token, where the chosen one leads by a logit or more."),
    "b": (False, "The int8 cache keeps every key and value within half a step of its own: it nudges the scores, "
                 "it does not break a step. A token far ahead of the next survives the nudge."),
    "c": (False, "An exact tie would be decided by the order argmax breaks ties in, not by the int8 cache; the "
                 "check refuses a flip whose float32 logits are closer than 1e-3 for that reason. The two best "
                 "logits are close, not equal."),
    "d": (False, "The prompt's length sets how many vectors are rounded, but whether a token flips depends on "
                 "how close its two best candidates were to begin with."),
}


def check_flip_prediction(fn) -> None:
    """Exercise 8.3, the prediction: ``fn()`` returns the letter of what one should expect of the
    float32 cache's two best logits at a token the int8 cache flips."""
    exercise = "Exercise 8.3"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), FLIP_CHOICES)


class FoundFlip(NamedTuple):
    """A flip :func:`check_found_flip` verified: the question, and the index of the new token."""

    question: str
    index: int


def _margins(logits: torch.Tensor) -> torch.Tensor:
    """The gap between the two largest logits of each row."""
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def check_found_flip(fn: Callable, model: torch.nn.Module, tokenizer, *, questions: Sequence[str] | None = None,
                     n_new: int = FLIP_TOKENS) -> FoundFlip:
    """Exercise 8.3, the search: ``fn(model, tokenizer, questions, n_new)`` returns ``(question, index)``,
    a question (encoded with ``tokenizer.encode_chat``) whose greedy answer with a
    :class:`kvlib.Int8KVCache` first parts from the float32 cache's at new token ``index`` (< ``n_new``).

    The check runs both caches itself and passes only if the answers agree before ``index``, differ
    at it, and each cache chose its token there by more than ``FLIP_MARGIN`` between its two best
    logits: then the int8 rounding made the flip, not a float tie that another CPU could undo.
    ``questions`` defaults to ``kvlib.data.CHAT_QUESTIONS``. Returns the verified flip."""
    from ..data import CHAT_QUESTIONS

    exercise = "Exercise 8.3"
    questions = CHAT_QUESTIONS if questions is None else questions
    question, index = _searched_flip(exercise, fn, model, tokenizer, questions, n_new)
    exact, other = _both_caches(model, tokenizer.encode_chat(question), index + 1)
    where = f"{exercise}: {question!r}, new token {index}"
    _check_parted_at(where, tokenizer, exact.tokens, other.tokens, index)
    gaps = {"float32": _margins(exact.logits[index]).item(), "int8": _margins(other.logits[index]).item()}
    _check_margins(where, gaps)
    before = tokenizer.decode(exact.tokens[:index])
    before = before if len(before) <= 60 else "…" + before[-60:]
    print(f"✓ {exercise}: {question!r} parts at new token {index}: after {before!r} the float32 cache writes "
          f"{_word(tokenizer, exact.tokens[index])}, the int8 cache {_word(tokenizer, other.tokens[index])}. "
          f"Margins between the two best logits there: float32 {_approx(gaps['float32'])}, "
          f"int8 {_approx(gaps['int8'])}, both above {FLIP_MARGIN:g}: a flip the int8 rounding made.")
    return FoundFlip(question, index)


def _searched_flip(exercise: str, fn: Callable, model: torch.nn.Module, tokenizer, questions: Sequence[str],
                   n_new: int) -> tuple[str, int]:
    """What the student's search ``fn`` returns, as ``(question, index)`` with ``0 <= index < n_new``;
    a ``CheckFailed`` that says what is wrong when it fails, finds nothing or returns something else."""
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    try:
        with torch.no_grad():
            found = fn(model, tokenizer, questions, n_new)
    except NotImplementedError:
        raise CheckFailed(f"{exercise}: not written yet — replace the NotImplementedError in your function "
                          f"with your search.") from None
    except Exception as e:                                   # show the student's own error, briefly
        raise CheckFailed(f"{exercise}: your search raised {type(e).__name__}: {e}") from None
    if found is None:
        raise CheckFailed(f"{exercise}: your search found no flip among the {len(questions)} questions. Some "
                          f"answers do part within {n_new} tokens: check that first_flip passes its check, and "
                          f"that your search does not ask for more margin than a flip has: at a flip the float32 "
                          f"cache's two best logits are close.")
    try:
        question, index = found
        index = operator.index(index)
    except (TypeError, ValueError):
        raise CheckFailed(f"{exercise}: your search should return (question, index), a string and an int, "
                          f"got {describe(found)}") from None
    if not isinstance(question, str):
        raise CheckFailed(f"{exercise}: the question should be the text of the question (a string), got "
                          f"{describe(question)}")
    if not 0 <= index < n_new:
        raise CheckFailed(f"{exercise}: the index counts the new tokens from 0, so it lies in 0..{n_new - 1}; "
                          f"got {index}")
    return question, index


def _both_caches(model: torch.nn.Module, prompt: list[int], n_new: int):
    """The greedy generations, logits kept, of ``n_new`` tokens after ``prompt`` with the float32
    cache and with a :class:`kvlib.Int8KVCache`."""
    from ..cache.quantized import Int8KVCache
    from ..generate import generate

    with torch.no_grad():
        exact = generate(model, prompt, n_new, keep_logits=True)
        other = generate(model, prompt, n_new, keep_logits=True,
                         cache=Int8KVCache.for_model(model, max_len=len(prompt) + n_new))
    return exact, other


def _word(tokenizer, token: int) -> str:
    """One token's text, quoted."""
    return repr(tokenizer.decode([token]))


def _check_parted_at(where: str, tokenizer, exact: Sequence[int], other: Sequence[int], index: int) -> None:
    """A ``CheckFailed`` unless the two token lists first differ at ``index``."""
    parted = next((i for i, (a, b) in enumerate(zip(exact, other)) if a != b), None)
    if parted is not None and parted < index:
        raise CheckFailed(f"{where}: the answers already part at new token {parted} (float32 "
                          f"{_word(tokenizer, exact[parted])}, int8 {_word(tokenizer, other[parted])}); the first "
                          f"flip is there, not at {index}.")
    if parted is None:
        raise CheckFailed(f"{where}: both caches choose {_word(tokenizer, exact[index])} there, so the answers "
                          f"have not parted yet; the index is where they first differ.")


def _check_margins(where: str, gaps: dict[str, float]) -> None:
    """A ``CheckFailed`` unless every cache's gap between its two best logits exceeds ``FLIP_MARGIN``."""
    for name, gap in gaps.items():
        if gap <= FLIP_MARGIN:
            raise CheckFailed(f"{where}: refused. The {name} cache's two best logits there are only "
                              f"{gap:.1e} apart (more than {FLIP_MARGIN:g} is needed): a tie that float rounding "
                              f"on another CPU could decide the other way, not a flip the int8 rounding made. "
                              f"Try another prompt, or have your search ask for a larger margin.")


def _approx(x: float) -> str:
    from ..measure import fmt_approx

    return fmt_approx(x, ".3f")
