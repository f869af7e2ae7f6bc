"""Section 9's checks (kvlib.exercises.reuse): the references pass, the stubs and the usual
mistakes fail, each with its own message, and the figure's own radix tree is refused."""
from __future__ import annotations

import pytest

from kvlib.exercises import CheckFailed
from kvlib.exercises.reuse import (LARGER_BLOCK_CHOICES, check_larger_blocks, check_radix_tree,
                                   check_second_turn_reuse, check_shared_prompt_tokens)
from kvlib.widgets import diagrams_reuse
from kvlib.widgets.diagrams_reuse import radix_tree as kvlib_radix_tree


def build_radix_tree(prompts):
    """The reference of the notebook's solution: group by first token, run the edge while all agree."""
    groups = {}
    for p in prompts:
        if p:
            groups.setdefault(p[0], []).append(list(p))
    tree = {}
    for first, group in groups.items():
        end = 1
        while end < min(map(len, group)) and len({p[end] for p in group}) == 1:
            end += 1
        tree[first] = (tuple(group[0][:end]), build_radix_tree([p[end:] for p in group]))
    return tree


def trie(prompts):
    groups = {}
    for p in prompts:
        if p:
            groups.setdefault(p[0], []).append(p)
    return {first: ((first,), trie([p[1:] for p in group])) for first, group in groups.items()}


def past_the_end(prompts):
    """Edges split only where prompts part: a prompt that ends inside an edge is lost."""
    groups = {}
    for p in prompts:
        if p:
            groups.setdefault(p[0], []).append(p)
    tree = {}
    for first, group in groups.items():
        end = 1
        while True:
            alive = [p for p in group if len(p) > end]
            if not alive or len({p[end] for p in alive}) > 1:
                break
            end += 1
        tree[first] = (tuple(max(group, key=len)[:end]), past_the_end([p[end:] for p in group if len(p) > end]))
    return tree


def stub(*args):
    raise NotImplementedError("Exercise 9.x")


def test_the_references_pass(capsys):
    check_second_turn_reuse(lambda: 64)
    check_radix_tree(build_radix_tree)
    check_radix_tree(lambda prompts: {k: (list(e), s) for k, (e, s) in build_radix_tree(prompts).items()})   # lists pass
    check_shared_prompt_tokens(lambda: 1000, 1000, system_tokens=190, users=8, block_size=32)
    check_larger_blocks(lambda: "a")
    assert capsys.readouterr().out.count("✓") == 5


def test_kvlibs_own_radix_tree_is_refused():
    """9.2 asks for what the figure's radix_tree computes: calling it passes nothing."""
    for fn in (kvlib_radix_tree, lambda p: kvlib_radix_tree(p), lambda p: diagrams_reuse.radix_tree(p)):
        with pytest.raises(CheckFailed, match="kvlib's `radix_tree`"):
            check_radix_tree(fn)


@pytest.mark.parametrize("answer, message", [
    (80, "never fed"), (79, "only whole blocks"), (48, "the answer's blocks are cached too"),
    (96, "the most the second turn could take"), (50, "count the tokens the first turn computed"),
])
def test_second_turn_mistakes_are_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_second_turn_reuse(lambda: answer)


@pytest.mark.parametrize("fn, message", [
    (trie, "that is a trie"),
    (past_the_end, "an edge runs past the end of a prompt"),
    (lambda p: [build_radix_tree(p)], "should be a dict"),
    (lambda p: {k: [e] for k, (e, s) in build_radix_tree(p).items()}, "should be a pair"),
    (lambda p: {k + 1: v for k, v in build_radix_tree(p).items()}, "is filed under"),
    (lambda p: {k: ((), s) for k, (e, s) in build_radix_tree(p).items()}, "non-empty tuple"),
    (lambda p: build_radix_tree(p[:1]), "expected"),
])
def test_radix_tree_mistakes_are_named(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_radix_tree(fn)


def test_stubs_and_errors_fail_clearly():
    for check in (check_second_turn_reuse, check_larger_blocks, check_radix_tree):
        with pytest.raises(CheckFailed, match="not written yet"):
            check(stub)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_radix_tree(lambda p: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        check_radix_tree(3)


def test_a_prediction_far_off_says_what_the_reuse_covers():
    with pytest.raises(CheckFailed, match=r"(?s)too high .*whole blocks of 16 \(190 tokens: 11 blocks\)"):
        check_shared_prompt_tokens(lambda: 1600, 1000, system_tokens=190, users=8)


@pytest.mark.parametrize("letter", sorted(set(LARGER_BLOCK_CHOICES) - {"a"}))
def test_every_wrong_letter_is_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it"):
        check_larger_blocks(lambda: letter)
