"""Checks for the exercises of *Reusing the cache* (section 9).

- 9.1, how much does the second turn reuse?: a count worked out on paper, graded exactly, with
  the usual slips named (the answer's last token, a partly filled block, the answer forgotten);
- 9.2, a radix tree of prompts: ``radix_tree(prompts)`` (SGLang's structure, which the section
  only describes) graded exactly on seven sets of prompts, with a trie and edges that run past
  a prompt's end named; the figure's own ``radix_tree`` refused;
- 9.3, whole blocks of 32: the prompt tokens the engine computes with reuse and blocks of 32,
  predicted and graded against the count of the run (the same on every machine), then a letter
  for what larger blocks buy in exchange.
"""
from __future__ import annotations

import random
from typing import Any, Callable

from .framework import CheckFailed, check_choice, check_prediction, describe, refuse_library_answer, student_answer


def _library_keys() -> dict[str, Callable]:
    """kvlib's own block keys: the checks refuse them (they compute the answers)."""
    from ..serve import block_manager as blocks

    return {"block_keys": blocks.block_keys, "chain_key": blocks.chain_key}


def _library_tree() -> dict[str, Callable]:
    """kvlib's own radix tree (the one the section's figure draws): refused by 9.2's check."""
    from ..widgets import diagrams_reuse

    return {"radix_tree": diagrams_reuse.radix_tree}

__all__ = ["check_second_turn_reuse", "check_radix_tree", "check_shared_prompt_tokens", "check_larger_blocks",
           "LARGER_BLOCK_CHOICES", "REUSE_TURN"]

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
# Exercise 9.2: a radix tree of prompts
# ---------------------------------------------------------------------------------------

def _radix(sequences) -> dict:
    """Reference: ``{first token: (edge, subtree)}``, each edge running until the sequences below it
    part or one of them ends; empty sequences add nothing."""
    groups: dict = {}
    for s in sequences:
        if len(s):
            groups.setdefault(s[0], []).append(tuple(s))
    tree = {}
    for first, group in groups.items():
        shortest = min(len(s) for s in group)
        end = 1
        while end < shortest and all(s[end] == group[0][end] for s in group):
            end += 1
        tree[first] = (group[0][:end], _radix([s[end:] for s in group]))
    return tree


def _trie(sequences) -> dict:
    """A mistake: one token per edge (a trie, not compressed)."""
    groups: dict = {}
    for s in sequences:
        if len(s):
            groups.setdefault(s[0], []).append(tuple(s))
    return {first: ((first,), _trie([s[1:] for s in group])) for first, group in groups.items()}


def _radix_ignoring_ends(sequences) -> dict:
    """A mistake: edges split only where prompts part, not where one of them ends."""
    groups: dict = {}
    for s in sequences:
        if len(s):
            groups.setdefault(s[0], []).append(tuple(s))
    tree = {}
    for first, group in groups.items():
        end = 1
        while True:
            alive = [s for s in group if len(s) > end]
            if not alive or len({s[end] for s in alive}) > 1:
                break
            end += 1
        longest = max(group, key=len)
        tree[first] = (longest[:end], _radix_ignoring_ends([s[end:] for s in group if len(s) > end]))
    return tree


def _canonical(tree, where: str = "the tree"):
    """The learner's tree with every edge a tuple, or a sentence saying what is malformed."""
    if not isinstance(tree, dict):
        return f"{where} should be a dict from an edge's first token to (edge, subtree), got {describe(tree)}"
    out = {}
    for key, value in tree.items():
        if not (isinstance(value, (tuple, list)) and len(value) == 2):
            return f"in {where}, the value under {key!r} should be a pair (edge, subtree), got {describe(value)}"
        edge, sub = value
        if not isinstance(edge, (tuple, list)) or not edge:
            return f"in {where}, the edge under {key!r} should be a non-empty tuple of tokens, got {describe(edge)}"
        if edge[0] != key:
            return (f"in {where}, the edge {tuple(edge)} is filed under {key!r}: each edge is filed under its own "
                    f"first token, so that a walk finds it from the next token of a prompt")
        inner = _canonical(sub, f"the subtree under {tuple(edge)}")
        if isinstance(inner, str):
            return inner
        out[key] = (tuple(edge), inner)
    return out


def _show(tree: dict) -> str:
    """A tree as one line: ``{(1, 2) → {(3,), (4, 5)}}``."""
    parts = [str(edge) + (" → " + _show(sub) if sub else "") for edge, sub in sorted(tree.values())]
    return "{" + ", ".join(parts) + "}"


def _radix_cases() -> list[tuple[str, list]]:
    rng = random.Random(92)
    shared = [rng.randrange(50) for _ in range(6)]
    many = [[rng.randrange(3) for _ in range(rng.randint(2, 9))] for _ in range(12)]
    return [
        ("three prompts sharing a prefix", [[1, 2, 3, 4, 5], [1, 2, 3, 6], [1, 2, 7, 8]]),
        ("one prompt", [[4, 8, 15, 16, 23, 42]]),
        ("no first token in common", [[1, 2], [3, 4], [5]]),
        ("a prompt that ends where another goes on", [[1, 2, 3], [1, 2, 3, 4, 5]]),
        ("the same prompt twice, and an empty one", [[7, 7, 7], [7, 7, 7], []]),
        ("a shared system prompt, then questions", [shared + [60 + i, 70 + i] for i in range(4)]),
        ("twelve prompts over three tokens", many),
    ]


def check_radix_tree(fn: Callable[[list], dict]) -> None:
    """Exercise 9.2: ``fn(prompts)`` returns the radix tree of the token lists ``prompts``:
    ``{first token: (edge, subtree)}``, an edge ending where the prompts below it part or one ends."""
    exercise = "Exercise 9.2"
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    refuse_library_answer(exercise, fn, _library_tree())
    cases = _radix_cases()
    for i, (name, prompts) in enumerate(cases, start=1):
        try:
            got = fn([list(p) for p in prompts])
        except NotImplementedError:
            raise CheckFailed(f"{exercise}: not written yet — replace the NotImplementedError in your function "
                              f"with your code.") from None
        except Exception as e:
            raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({name}) raised {type(e).__name__}: {e}\n"
                              f"  prompts: {prompts}") from None
        tree = _canonical(got)
        if isinstance(tree, str):
            raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({name}): {tree}")
        expected = _radix(prompts)
        if tree == expected:
            continue
        why = "walk the prompts from their first token: where do they part, and where does one of them end?"
        if tree == _trie(prompts) and _trie(prompts) != expected:
            why = ("every edge holds one token: that is a trie. A radix tree merges a run of tokens that no prompt "
                   "leaves into one edge, so a lookup compares runs, not one token per node.")
        elif tree == _radix_ignoring_ends(prompts):
            why = ("an edge runs past the end of a prompt: where a prompt ends, a node must end too, since its "
                   "cached tokens stop there (and can be evicted apart from the longer prompt's).")
        raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({name}) is wrong.\n  prompts: {prompts}\n"
                          f"  expected {_show(expected)}\n  got      {_show(tree)}\n  hint: {why}")
    print(f"✓ {exercise}: all {len(cases)} cases pass ({', '.join(name for name, _ in cases)}).")


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


LARGER_BLOCK_CHOICES = {
    "a": (True, "a block is the unit of everything the engine does per piece of cache: one key to hash and look "
                "up, one entry in every block table, one contiguous run of memory for the attention kernel to "
                "read. Blocks of 32 halve those per token; they share less of a prompt (the run above) and waste "
                "more of a partly filled last block. vLLM's default of 16 is a compromise between the two."),
    "b": (False, "larger blocks share less, not more: only whole blocks are shared, so the shared part rounds down "
                 "to a multiple of 32 instead of 16, and the run above computed more prompt tokens."),
    "c": (False, "a request's last, partly filled block holds up to 31 empty slots with blocks of 32, against 15 "
                 "with blocks of 16: larger blocks waste more memory, not less."),
    "d": (False, "a block taken from the cache holds the keys and values the model computed, whatever the block "
                 "size; reuse is exact up to the same rounding either way."),
}


def check_larger_blocks(fn: Any) -> None:
    """Exercise 9.3: the letter of what blocks of 32 tokens buy, in exchange for the tokens they share less."""
    check_choice("Exercise 9.3", student_answer("Exercise 9.3", fn, "the letter of your choice"), LARGER_BLOCK_CHOICES)
