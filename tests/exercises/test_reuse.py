"""Section 9's checks (kvlib.exercises.reuse): the references pass, the stubs and the usual
mistakes fail, each with its own message."""
from __future__ import annotations

import pytest

from kvlib.exercises import CheckFailed
from kvlib.exercises.reuse import (TTFT_CHOICES, check_block_keys, check_second_turn_reuse,
                                   check_shared_prompt_tokens, check_ttft_explanation)
from kvlib.serve import block_keys as kvlib_block_keys
from kvlib.serve.blocks import chain_key


def chained(tokens, block_size):
    keys, previous = [], None
    for i in range(len(tokens) // block_size):
        previous = hash((previous, tuple(tokens[i * block_size:(i + 1) * block_size])))
        keys.append(previous)
    return keys


def stub(*args):
    raise NotImplementedError("Exercise 9.x")


def test_the_references_pass(capsys):
    check_second_turn_reuse(lambda: 64)
    check_block_keys(chained)
    check_shared_prompt_tokens(lambda: 1000, 1000, system_tokens=190, users=8, block_size=32)
    check_ttft_explanation(lambda: "a")
    assert capsys.readouterr().out.count("✓") == 4


def test_kvlibs_own_block_keys_are_refused():
    """9.2 asks for what kvlib.serve.block_keys computes: calling it (or chain_key) passes nothing."""
    for fn in (kvlib_block_keys, lambda t, b: kvlib_block_keys(t, b),
               lambda t, b: [chain_key(b"", t[:b])] * (len(t) // b)):
        with pytest.raises(CheckFailed, match="kvlib's `(block_keys|chain_key)`"):
            check_block_keys(fn)


@pytest.mark.parametrize("answer, message", [
    (80, "never fed"), (79, "only whole blocks"), (48, "the answer's blocks are cached too"),
    (96, "the most the second turn could take"), (50, "count the tokens the first turn computed"),
])
def test_second_turn_mistakes_are_named(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_second_turn_reuse(lambda: answer)


@pytest.mark.parametrize("fn, message", [
    (lambda t, b: [hash(tuple(t[i * b:(i + 1) * b])) for i in range(len(t) // b)], "the keys do not chain"),
    (lambda t, b: chained(t + [0] * (-len(t) % b), b), "only whole blocks"),
    (lambda t, b: [hash((tuple(t), i)) for i in range(len(t) // b)], "when more tokens followed them"),
    (lambda t, b: [list(t[i * b:(i + 1) * b]) for i in range(len(t) // b)], "must be hashable"),
    (lambda t, b: {"keys": chained(t, b)}, "should return a list of keys"),
    (lambda t, b: chained(t, b)[:1] * (len(t) // b), "changing token"),
])
def test_block_key_mistakes_are_named(fn, message):
    with pytest.raises(CheckFailed, match=message):
        check_block_keys(fn)


def test_stubs_and_errors_fail_clearly():
    for check in (check_second_turn_reuse, check_ttft_explanation):
        with pytest.raises(CheckFailed, match="not written yet"):
            check(stub)
    with pytest.raises(CheckFailed, match="not written yet"):
        check_block_keys(stub)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_block_keys(lambda t, b: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        check_block_keys(3)


def test_a_prediction_far_off_says_what_the_reuse_covers():
    with pytest.raises(CheckFailed, match=r"(?s)too high .*whole blocks of 16 \(190 tokens: 11 blocks\)"):
        check_shared_prompt_tokens(lambda: 1600, 1000, system_tokens=190, users=8)


@pytest.mark.parametrize("letter", sorted(set(TTFT_CHOICES) - {"a"}))
def test_every_wrong_letter_is_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it"):
        check_ttft_explanation(lambda: letter)
