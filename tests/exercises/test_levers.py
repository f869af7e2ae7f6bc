"""The checks of section 11 (11.1 users that fit, 11.2 which lever first, 11.3 speculation past the
knee): the references pass, stubs and the usual slips fail with the message that names them, and
kvlib's own formulas are refused."""
from __future__ import annotations

import pytest

from kvlib.exercises import CheckFailed
from kvlib.exercises.levers import (FIRST_LEVER_CHOICES, check_compute_bound_speedup, check_first_lever,
                                    check_first_lever_explanation, check_users_that_fit, first_lever)
from kvlib.measure.speculation import tokens_per_step


def _stub():
    raise NotImplementedError("Exercise 11: write me")


def test_the_references_pass(capsys):
    check_users_that_fit(lambda: int((48e9 - 2 * 8.03e9) // (2 * 32 * 8 * 128 * 2 * 16384)))
    check_first_lever(lambda: "b")
    check_first_lever_explanation(lambda: "a")
    check_compute_bound_speedup(lambda: sum(0.7 ** i for i in range(5)) / 5)
    assert capsys.readouterr().out.count("✓") == 4


def test_the_first_lever_is_computed_not_typed():
    """The graded letter comes from the formulas: the scenario of the page's three examples gives others."""
    assert first_lever(4, 32768) == "b" and first_lever(1, 8192) == "d"


@pytest.mark.parametrize("value, named", [(22, "weights take memory too"), (29, "keys and the values are two"),
                                          (3, "8 key/value heads, not the 32"), (15, "round down")])
def test_users_that_fit_names_the_slip(value, named):
    with pytest.raises(CheckFailed, match=named):
        check_users_that_fit(lambda: value)


def test_a_wrong_lever_is_told_what_to_compare():
    with pytest.raises(CheckFailed, match="the weights or the caches"):
        check_first_lever(lambda: "d")
    with pytest.raises(CheckFailed, match="one of 'b', 'c', 'd', 'e'"):
        check_first_lever(lambda: "a")


@pytest.mark.parametrize("letter", [k for k, (right, _) in FIRST_LEVER_CHOICES.items() if not right])
def test_wrong_reasons_are_told_why(letter):
    with pytest.raises(CheckFailed):
        check_first_lever_explanation(lambda: letter)


def test_compute_bound_names_the_memory_bound_answer_and_refuses_kvlib():
    with pytest.raises(CheckFailed, match="a memory-bound step"):
        check_compute_bound_speedup(lambda: sum(0.7 ** i for i in range(5)))
    with pytest.raises(CheckFailed, match="kvlib's `tokens_per_step`"):
        check_compute_bound_speedup(lambda: tokens_per_step(0.7, 4) / 5)


@pytest.mark.parametrize("check", [check_users_that_fit, check_compute_bound_speedup, check_first_lever])
def test_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet"):
        check(_stub)
