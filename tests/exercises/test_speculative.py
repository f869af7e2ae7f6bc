"""The checks of section 10 (10.1 where a draft stops paying, 10.2 the chance of a rejection, 10.3 the
tokens a verify step writes): the reference passes, stubs fail, the usual mistakes fail with the
message that names them, and kvlib's own formulas are refused."""
from __future__ import annotations

import pytest
import torch

from kvlib.exercises import CheckFailed
from kvlib.exercises.speculative import (EXTRA_TOKEN_CHOICES, check_break_even, check_extra_token,
                                         check_rejection_chance, check_tokens_per_verify)
from kvlib.measure.speculation import predicted_speedup, tokens_per_step


def rejection_chance(p, q):
    return float(1 - torch.minimum(p, q).sum())


def tokens_per_verify(alpha, k):
    return sum(alpha ** j for j in range(k + 1))


def _stub(*args):
    raise NotImplementedError("Exercise 10: write me")


def test_the_references_pass(capsys):
    check_break_even(lambda: (tokens_per_verify(0.8, 4) - 1) / 4)
    check_rejection_chance(rejection_chance)
    check_rejection_chance(lambda p, q: float(0.5 * (p - q).abs().sum()))      # the total variation distance: the same
    check_tokens_per_verify(tokens_per_verify)
    check_extra_token(lambda: "b")
    assert capsys.readouterr().out.count("✓") == 5


@pytest.mark.parametrize("value, named", [
    ((tokens_per_verify(0.8, 4) - 2) / 4, "model's own token is left out"),
    (tokens_per_verify(0.8, 4) / 4, "verify step's own cost is left out"),
    (tokens_per_verify(0.8, 4) - 1, "one draft step is counted for all"),
])
def test_break_even_names_the_slip(value, named):
    with pytest.raises(CheckFailed, match=named):
        check_break_even(lambda: value)


@pytest.mark.parametrize("wrong, named", [
    (lambda p, q: float((p - q).abs().sum()), "twice the chance"),
    (lambda p, q: float(torch.minimum(p, q).sum()), "chance of accepting"),
])
def test_rejection_names_the_slip(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_rejection_chance(wrong)


@pytest.mark.parametrize("wrong, named", [
    (lambda a, k: tokens_per_verify(a, k) - 1, "own token is left out"),
    (lambda a, k: tokens_per_verify(a, k + 1), "one term too far"),
])
def test_tokens_per_verify_names_the_slip(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_tokens_per_verify(wrong)


def test_kvlibs_own_formulas_are_refused():
    with pytest.raises(CheckFailed, match="kvlib's `tokens_per_step`"):
        check_tokens_per_verify(tokens_per_step)
    with pytest.raises(CheckFailed, match="kvlib's `tokens_per_step`"):
        check_tokens_per_verify(lambda a, k: tokens_per_step(a, k))
    with pytest.raises(CheckFailed, match="kvlib's `predicted_speedup`"):
        check_break_even(lambda: predicted_speedup(0.8, 4, 1.0, 1.0, 0.5))


@pytest.mark.parametrize("check", [check_rejection_chance, check_tokens_per_verify])
def test_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet|NotImplementedError|write"):
        check(_stub)


@pytest.mark.parametrize("letter", [k for k, (right, _) in EXTRA_TOKEN_CHOICES.items() if not right])
def test_wrong_letters_are_told_why(letter):
    with pytest.raises(CheckFailed):
        check_extra_token(lambda: letter)


def test_lookup_steps_grades_against_the_run_and_names_the_slips(capsys):
    from kvlib.exercises.speculative import SAMPLED_CHOICES, check_lookup_steps, check_sampled_acceptance

    check_lookup_steps(lambda: 22, 22)
    check_sampled_acceptance(lambda: "a")
    assert capsys.readouterr().out.count("✓") == 2
    with pytest.raises(CheckFailed, match="not k: the model adds its own token"):
        check_lookup_steps(lambda: 32, 22)
    with pytest.raises(CheckFailed, match="first verify step drafts nothing"):
        check_lookup_steps(lambda: 21, 22)
    with pytest.raises(CheckFailed, match="counts the prefill too"):
        check_lookup_steps(lambda: 23, 22)
    for letter, (right, _) in SAMPLED_CHOICES.items():
        if not right:
            with pytest.raises(CheckFailed):
                check_sampled_acceptance(lambda: letter)
