"""Checks for the exercises of *Reusing the cache* (section 9).

- 9.1, how much does the second turn reuse?: a count worked out on paper, graded exactly, with
  the usual slips named (the answer's last token, a partly filled block, the answer forgotten);
- 9.2, chained block keys: ``block_keys(tokens, block_size)`` graded on its properties (whole
  blocks only, equal prefixes give equal keys, a change reaches every later key and no earlier
  one, and the same tokens after another prefix give another key: no false hit);
- 9.3, many users, one system prompt: the prompt tokens the engine computes with reuse,
  predicted and graded against the count of the run (the same on every machine), then a letter
  for why the time to first token falls by less.
"""
from __future__ import annotations

import random
from typing import Any, Callable

from .framework import CheckFailed, check_choice, check_prediction, describe, refuse_library_answer, student_answer


def _library_keys() -> dict[str, Callable]:
    """kvlib's own block keys: the checks refuse them (they compute the answers)."""
    from ..serve import blocks

    return {"block_keys": blocks.block_keys, "chain_key": blocks.chain_key}

__all__ = ["check_second_turn_reuse", "check_block_keys", "check_shared_prompt_tokens", "check_ttft_explanation",
           "TTFT_CHOICES", "REUSE_TURN"]

# ---------------------------------------------------------------------------------------
# Exercise 9.1: how much does the second turn reuse?
# ---------------------------------------------------------------------------------------

REUSE_TURN = {"prompt": 57, "answer": 23, "question": 19, "block_size": 16}


def _second_turn_reuse(prompt: int, answer: int, question: int, block_size: int) -> int:
    """Reference: the first turn computed its prompt and all but the last answer token (sampled,
    never fed); its full blocks are cached; the second turn takes the longest run of them, at
    most (its length - 1) // block_size blocks."""
    computed = prompt + answer - 1
    second = prompt + answer + question
    return min(computed // block_size, (second - 1) // block_size) * block_size


_REUSE_MISTAKES = {
    80: "the answer's last token (its <|im_end|>) was sampled but never fed to the model, so its key and value "
        "were never computed: the first turn computed 57 + 23 - 1 = 79 tokens.",
    79: "only whole blocks are cached and shared: 79 computed tokens fill 4 blocks of 16; the rest sits in a "
        "partly filled block, which the second turn computes again.",
    48: "the answer's blocks are cached too: a block filled by generated tokens is kept like any other, so the "
        "next turn of the conversation finds its own answer in the cache.",
    96: "that is the most the second turn could take, (99 - 1) // 16 blocks; the cache holds only what the "
        "first turn computed, 79 tokens, 4 whole blocks.",
}


def check_second_turn_reuse(fn: Any) -> None:
    """Exercise 9.1: ``fn()`` returns how many of the second turn's prompt tokens come from the cache."""
    exercise = "Exercise 9.1"
    predicted = student_answer(exercise, fn, "your count (a number of tokens)")
    expected = _second_turn_reuse(**REUSE_TURN)
    why = _REUSE_MISTAKES.get(predicted) if isinstance(predicted, int) else None
    check_prediction(exercise, predicted, expected, rel_tol=1e-9, what="the tokens the second turn takes from "
                     "the cache", why=why or "count the tokens the first turn computed (its answer's last token "
                     "was never fed), keep the whole blocks of 16, and cap at (prompt length - 1) // 16 blocks.")


# ---------------------------------------------------------------------------------------
# Exercise 9.2: chained block keys
# ---------------------------------------------------------------------------------------

def _tokens(rng: random.Random, n: int, vocab: int = 50) -> list[int]:
    return [rng.randrange(vocab) for _ in range(n)]


def _keys(fn: Callable, tokens: list[int], block_size: int, what: str) -> list:
    try:
        keys = fn(list(tokens), block_size)
    except NotImplementedError:
        raise CheckFailed("Exercise 9.2: not written yet — replace the NotImplementedError in your function "
                          "with your code.") from None
    except Exception as e:
        raise CheckFailed(f"Exercise 9.2: block_keys raised {type(e).__name__}: {e} ({what})") from None
    if not isinstance(keys, (list, tuple)):
        raise CheckFailed(f"Exercise 9.2: block_keys should return a list of keys, one per full block, got "
                          f"{describe(keys)}")
    try:
        [hash(k) for k in keys]
    except TypeError:
        raise CheckFailed("Exercise 9.2: each key must be hashable (a dictionary looks blocks up by their keys): "
                          "an int, a str, bytes or a tuple, not a list") from None
    return list(keys)


def _block_key_problems(fn: Callable, rng: random.Random, block_size: int) -> str | None:
    """The first property ``fn`` breaks for one block size, or ``None``."""
    n = block_size * rng.randint(3, 5) + rng.randrange(block_size)
    tokens = _tokens(rng, n)
    keys = _keys(fn, tokens, block_size, f"{n} tokens, block_size {block_size}")
    if len(keys) != n // block_size:
        return (f"{n} tokens in blocks of {block_size} make {n // block_size} full blocks, got {len(keys)} keys: only "
                f"whole blocks get a key (a partly filled block is still being written, and is never shared)")
    if _keys(fn, tokens, block_size, "the same tokens again") != keys:
        return "the same tokens gave other keys the second time: a key must depend on the tokens alone"
    longer = _keys(fn, tokens + _tokens(rng, 2 * block_size), block_size, "the same tokens and more after them")
    if longer[:len(keys)] != keys:
        return ("the same first blocks gave other keys when more tokens followed them: a block's key must depend "
                "only on its own tokens and those before it, or a request never finds its prefix")
    at = rng.randrange(block_size, n)
    changed = tokens[:at] + [(tokens[at] + 1) % 50] + tokens[at + 1:]
    other = _keys(fn, changed, block_size, "one token changed")
    first = at // block_size
    if other[:first] != keys[:first]:
        return f"changing token {at} changed the key of a block before it: the blocks before stay the same"
    if any(a == b for a, b in zip(other[first:], keys[first:])):
        return (f"changing token {at} left a key of block {first} or later unchanged: every block from the change on "
                f"holds keys and values computed after another token")
    return _false_hit(fn, rng, block_size)


def _false_hit(fn: Callable, rng: random.Random, block_size: int) -> str | None:
    shared = _tokens(rng, 2 * block_size)
    a = _keys(fn, _tokens(rng, block_size) + shared, block_size, "a block of tokens after one prefix")
    b = _keys(fn, _tokens(rng, block_size) + shared, block_size, "the same block after another prefix")
    if a[1:] == b[1:] or a[1] == b[1]:
        return ("the keys do not chain: the same block of tokens after two different prefixes got the same key, so "
                "the second request would take the first one's block, whose keys and values were computed after "
                "other tokens (a false hit). Make each key from the block's tokens and the previous block's key")
    return None


def check_block_keys(fn: Callable[[list[int], int], list]) -> None:
    """Exercise 9.2: ``fn(tokens, block_size)`` returns one hashable key per full block, chained."""
    exercise = "Exercise 9.2"
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    refuse_library_answer(exercise, fn, _library_keys())
    rng = random.Random(9)
    for block_size in (1, 4, 16):
        why = _block_key_problems(fn, rng, block_size)
        if why:
            raise CheckFailed(f"{exercise}: with block_size {block_size}, {why}.")
    print(f"✓ {exercise}: whole blocks only, the same prefix gives the same keys, a change reaches every later key "
          f"and no earlier one, and the same block after another prefix gets another key (block sizes 1, 4, 16).")


# ---------------------------------------------------------------------------------------
# Exercise 9.3: many users, one system prompt
# ---------------------------------------------------------------------------------------

def check_shared_prompt_tokens(fn: Any, counted: int, *, system_tokens: int, users: int, block_size: int = 16) -> None:
    """Exercise 9.3: ``fn()`` predicts the prompt tokens the engine computes for the stream with
    reuse and blocks of ``block_size``; ``counted`` is what the run counted (``report.prefill_tokens``,
    the same on every machine)."""
    exercise = "Exercise 9.3"
    if callable(fn):
        refuse_library_answer(exercise, fn, _library_keys())
    predicted = student_answer(exercise, fn, "your prediction (a number of tokens)")
    check_prediction(exercise, predicted, counted, rel_tol=0.05, what="the prompt tokens computed with reuse",
                     why=f"the first user computes the whole prompt; each of the other {users - 1} shares the "
                         f"system prompt's whole blocks of {block_size} ({system_tokens} tokens: "
                         f"{system_tokens // block_size} blocks) and computes only the rest of its prompt, from the "
                         f"first block that is not all system prompt.")


TTFT_CHOICES = {
    "a": (True, "every forward pass reads all the weights and scores the last token against the whole vocabulary, "
                "whatever the number of tokens it computes: a prefill of a few dozen tokens still pays that whole "
                "fixed part, so its time falls by less than its tokens. Reuse removes arithmetic, not that read."),
    "b": (False, "a cached block is not copied back: it stays in the pool, and the new tokens read it through the "
                 "block table like any other block."),
    "c": (False, "the keys are a few hashes per request, microseconds: nothing next to a forward pass."),
    "d": (False, "the new tokens do attend to the cached ones, but at a few hundred tokens of context that attention "
                 "is a small share of a step; the fixed cost of the step is the larger part."),
}


def check_ttft_explanation(fn: Any) -> None:
    """Exercise 9.3: the letter of the reason the seven users' first token comes sooner by less than their
    prompt tokens fall."""
    check_choice("Exercise 9.3", student_answer("Exercise 9.3", fn, "the letter of your choice"), TTFT_CHOICES)
