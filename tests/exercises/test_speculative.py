"""The checks of section 10 (10.1 where a draft stops paying, 10.2 two candidates for one position, 10.3
the tokens a verify step writes, and when one more draft pays): the reference passes, stubs fail, the
usual mistakes fail with the message that names them, and kvlib's own formulas are refused."""
from __future__ import annotations

import math

import pytest
import torch

from kvlib.exercises import CheckFailed
from kvlib.exercises.speculative import (ONE_MORE_DRAFT_CHOICES, check_both_rejected, check_break_even,
                                         check_one_more_draft, check_tokens_per_verify)
from kvlib.measure.speculation import predicted_speedup, tokens_per_step


def both_rejected(p, q):
    first = float(torch.minimum(p, q).sum())
    if first >= 1 - 1e-12:
        return 0.0
    residual = (p - q).clamp(min=0) / (1 - first)
    return (1 - first) * (1 - float(torch.minimum(residual, q).sum()))


def tokens_per_verify(alphas):
    total, run = 1.0, 1.0
    for a in alphas:
        run *= a
        total += run
    return total


def break_even_acceptance():
    return (-1 + math.sqrt(1 + 4 * (1.1 + 2 * 0.2 - 1))) / 2          # 1 + α + α² = 1.5


def _stub(*args):
    raise NotImplementedError("Exercise 10: write me")


def test_the_references_pass(capsys):
    check_break_even(break_even_acceptance)
    check_break_even(lambda: 0.366)
    check_both_rejected(both_rejected)
    check_tokens_per_verify(tokens_per_verify)
    check_one_more_draft(lambda: "b")
    assert capsys.readouterr().out.count("✓") == 5


@pytest.mark.parametrize("value, named", [
    ((-1 + math.sqrt(7)) / 2, "model's own token is left out"),
    ((-1 + math.sqrt(2.6)) / 2, "verify step is counted as one plain step"),
    ((-1 + math.sqrt(2.2)) / 2, "one draft step is counted for both"),
    (1 / 3, "infinite series"),
    (0.25, "counted with chance α"),
    (0.6, "count the tokens a step writes"),
])
def test_break_even_names_the_slip(value, named):
    with pytest.raises(CheckFailed, match=named):
        check_break_even(lambda: value)


@pytest.mark.parametrize("wrong, named", [
    (lambda p, q: (1 - float(torch.minimum(p, q).sum())) ** 2, "checked against p again"),
    (lambda p, q: (1 - float(torch.minimum(p, q).sum()))
     * (1 - float(torch.minimum((p - q).clamp(min=0), q).sum())), "not normalised"),
    (lambda p, q: 1 - both_rejected(p, q), "one of the two passes"),
    (lambda p, q: 1 - float(torch.minimum(p, q).sum()), "one candidate is rejected"),
])
def test_both_rejected_names_the_slip(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_both_rejected(wrong)


def test_both_rejected_says_why_nan_is_wrong():
    def no_guard(p, q):
        first = float(torch.minimum(p, q).sum())
        residual = (p - q).clamp(min=0) / (1 - first)
        return (1 - first) * (1 - float(torch.minimum(residual, q).sum()))

    with pytest.raises(CheckFailed, match="gave NaN"):
        check_both_rejected(lambda p, q: float("nan") if torch.equal(p, q) else both_rejected(p, q))
    try:                                                  # 0/0 gives NaN, or a float division error
        check_both_rejected(no_guard)
    except CheckFailed as e:
        assert "NaN" in str(e) or "equals the model's" in str(e)


@pytest.mark.parametrize("wrong, named", [
    (lambda alphas: tokens_per_verify(alphas) - 1, "own token is left out"),
    (lambda alphas: 1 + sum(alphas), "added, not multiplied"),
    (lambda alphas: sum(alphas[0] ** i for i in range(len(alphas) + 1)) if alphas else 1.0,
     "only the first position"),
])
def test_tokens_per_verify_names_the_slip(wrong, named):
    with pytest.raises(CheckFailed, match=named):
        check_tokens_per_verify(wrong)


def test_kvlibs_own_formulas_are_refused():
    with pytest.raises(CheckFailed, match="kvlib's `tokens_per_step`"):
        check_tokens_per_verify(lambda alphas: tokens_per_step(alphas[0], len(alphas)))
    with pytest.raises(CheckFailed, match="kvlib's `predicted_speedup`"):
        check_break_even(lambda: predicted_speedup(0.4, 2, 1.0, 1.1, 0.2))


@pytest.mark.parametrize("check", [check_both_rejected, check_tokens_per_verify])
def test_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet|NotImplementedError|write"):
        check(_stub)


@pytest.mark.parametrize("letter", [k for k, (right, _) in ONE_MORE_DRAFT_CHOICES.items() if not right])
def test_wrong_letters_are_told_why(letter):
    with pytest.raises(CheckFailed):
        check_one_more_draft(lambda: letter)


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


def test_one_more_draft_rule_holds_on_numbers():
    """The rule (b) the check grades right: a draft that clears (a) can still lower the speed-up."""
    e, c_cost, de, dc = 4.0, 2.0, 1.5, 1.0              # E tokens for C plain steps; one more draft adds ΔE for ΔC
    assert de > dc                                       # rule (a): it pays for itself against plain decoding
    assert (e + de) / (c_cost + dc) < e / c_cost         # yet the speed-up falls
    assert not de / dc > e / c_cost                      # and rule (b) says so
