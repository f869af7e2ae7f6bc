"""The graders for predictions and explanations that every section's experiments use."""
from __future__ import annotations

import pytest

from kvlib.exercises.framework import CheckFailed, check_choice, check_prediction


def test_prediction_within_tolerance_passes_and_says_so(capsys):
    check_prediction("Exercise 9.9", 110, 100.0, rel_tol=0.25, what="the speed-up")
    assert "✓ Exercise 9.9: you predicted 110 for the speed-up; it is 100 (within 25 %)" in capsys.readouterr().out


@pytest.mark.parametrize("predicted, words", [(200, "too high by 100 %"), (40, "too low by 60 %")])
def test_prediction_outside_tolerance_says_how_far_and_why(predicted, words):
    with pytest.raises(CheckFailed, match=f"but it is 100: {words}") as err:
        check_prediction("Exercise 9.9", predicted, 100.0, rel_tol=0.25, what="the speed-up", why="count the reads")
    assert "hint: count the reads" in str(err.value)


@pytest.mark.parametrize("predicted, words", [(None, "write your prediction"), (..., "write your prediction"),
                                              ("12", "should be a number"), (True, "should be a number")])
def test_prediction_that_is_not_a_number_is_refused(predicted, words):
    with pytest.raises(CheckFailed, match=words):
        check_prediction("Exercise 9.9", predicted, 100.0, rel_tol=0.25, what="x")


CHOICES = {"a": (False, "The cache is exact."), "b": (True, "Reading the weights dominates.")}


def test_choice_right_and_wrong_both_say_why(capsys):
    check_choice("Exercise 9.9", " B ", CHOICES)
    assert "✓ Exercise 9.9: (b) is right. Reading the weights dominates." in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"\(a\) is not it. The cache is exact."):
        check_choice("Exercise 9.9", "a", CHOICES)
    with pytest.raises(CheckFailed, match="one of 'a', 'b', got 'z'"):
        check_choice("Exercise 9.9", "z", CHOICES)
    with pytest.raises(CheckFailed, match="choose one of"):
        check_choice("Exercise 9.9", None, CHOICES)


def test_predictions_print_whole_numbers_with_separators(capsys):
    from kvlib.exercises.framework import check_prediction, fmt_number

    assert [fmt_number(x) for x in (143_025_408, 1240.0, 16, 3.2594, 1691.6, 1e20)] == [
        "143,025,408", "1,240", "16", "3.259", "1692", "1e+20"]
    check_prediction("Exercise 9.9", 143_025_408, 143_025_408.0, rel_tol=0.01, what="the bytes")
    assert "you predicted 143,025,408 for the bytes; it is 143,025,408 (within 1 %)" in capsys.readouterr().out
    with pytest.raises(CheckFailed, match=r"you predicted 1,000 for the bytes, but it is 1,823: too low by 45 %"):
        check_prediction("Exercise 9.9", 1000, 1823, rel_tol=0.08, what="the bytes")
