"""The checks of section 11 (11.1 users that fit, 11.2 which lever first, 11.3 speculation past the
knee): the references pass, stubs and the usual slips fail with the message that names them, and
kvlib's own formulas are refused."""
from __future__ import annotations

import pytest

from kvlib.exercises import CheckFailed
import kvlib
from kvlib.cache.model_shapes import MODEL_SHAPES
from kvlib.cache.sizes import weight_bytes
from kvlib.exercises.levers import (COMPUTE_BOUND_CASE, FIRST_LEVER_CASE, FIRST_LEVER_CHOICES,
                                    check_compute_bound_speedup, check_first_lever, check_first_lever_explanation,
                                    check_users_that_fit, first_lever)
from kvlib.measure.levers import Scenario, best_lever, levers
from kvlib.measure.speculation import tokens_per_step
from kvlib.widgets.levers import ALPHAS, DRAFTS, LEVER_CONTEXTS, LEVER_USERS


def _stub():
    raise NotImplementedError("Exercise 11: write me")


def test_the_references_pass(capsys):
    check_users_that_fit(lambda: int((48e9 - 2 * 8.03e9) // (2 * 32 * 8 * 128 * 2 * 16384)))
    check_first_lever(lambda: "c")
    check_first_lever_explanation(lambda: "a")
    check_compute_bound_speedup(lambda: sum(0.8 ** i for i in range(4)) / 4)
    assert capsys.readouterr().out.count("✓") == 4


def test_the_first_lever_is_computed_not_typed():
    """The graded letter comes from the formulas: the scenarios the page prints (Llama-3-8B) give others."""
    assert first_lever() == "c"
    assert first_lever("Llama-3-8B", 4, 32768) == "b" and first_lever("Llama-3-8B", 1, 8192) == "d"


def test_the_page_does_not_print_the_exercises_scenario():
    """11.2 asks about a scenario that neither the page's cells nor its widget hold (a model without
    grouped-query attention, at users and a context off the widget's grid)."""
    case = FIRST_LEVER_CASE
    assert case["users"] not in LEVER_USERS and case["context"] not in LEVER_CONTEXTS
    assert MODEL_SHAPES[case["model"]].config.n_kv_heads == MODEL_SHAPES[case["model"]].config.n_heads


def test_the_library_answers_are_refused():
    """kvlib's sizes compute 11.1 (the review found kv_cache_bytes and weight_bytes passing), its
    levers 11.2."""
    cfg = MODEL_SHAPES["Llama-3-8B"].config
    with pytest.raises(CheckFailed, match="kvlib's `kv_cache_bytes`"):
        check_users_that_fit(lambda: int((48e9 - 2 * 8.03e9) // kvlib.kv_cache_bytes(cfg, 16384, dtype=2)))
    with pytest.raises(CheckFailed, match="kvlib's `weight_bytes`"):
        check_users_that_fit(lambda: int((48e9 - weight_bytes(8_030_000_000, 2)) // (2 * 32 * 8 * 128 * 2 * 16384)))
    with pytest.raises(CheckFailed, match="kvlib's `first_lever`"):
        check_first_lever(lambda: first_lever())
    with pytest.raises(CheckFailed, match="kvlib's `(best_lever|levers)`"):
        check_first_lever(lambda: best_lever(levers(Scenario("Llama-2-7B", "NVIDIA H100 SXM", 24, 4096, 1024)))[1].key)


@pytest.mark.parametrize("value, named", [(22, "weights take memory too"), (29, "keys and the values are two"),
                                          (3, "8 key/value heads, not the 32"), (15, "round down")])
def test_users_that_fit_names_the_slip(value, named):
    with pytest.raises(CheckFailed, match=named):
        check_users_that_fit(lambda: value)


@pytest.mark.parametrize("letter, named", [("b", "changes nothing"), ("d", "which part of a step's bytes"),
                                           ("e", "saves memory, not reading"), ("a", "one of 'b', 'c', 'd', 'e'")])
def test_a_wrong_lever_is_told_what_it_overlooked(letter, named):
    with pytest.raises(CheckFailed, match=named):
        check_first_lever(lambda: letter)


@pytest.mark.parametrize("letter", [k for k, (right, _) in FIRST_LEVER_CHOICES.items() if not right])
def test_wrong_reasons_are_told_why(letter):
    with pytest.raises(CheckFailed):
        check_first_lever_explanation(lambda: letter)


def test_compute_bound_names_the_memory_bound_answer_and_refuses_kvlib():
    with pytest.raises(CheckFailed, match="a memory-bound step"):
        check_compute_bound_speedup(lambda: sum(0.8 ** i for i in range(4)))
    with pytest.raises(CheckFailed, match="kvlib's `tokens_per_step`"):
        check_compute_bound_speedup(lambda: tokens_per_step(0.8, 3) / 4)


def test_the_page_does_not_print_the_compute_bound_case():
    """11.3's α and k are neither the page's scenario (whose CPU table prints (e) and (f), both
    compute-bound on a CPU with a low ridge point: their ratio would be the answer) nor a point of
    the assumptions widget's grid; the page's own case gives another speed-up."""
    case = COMPUTE_BOUND_CASE
    page = Scenario("SmolLM2-135M", "NVIDIA H100 SXM", users=8, context=2048)
    assert (case["alpha"], case["k"]) != (page.alpha, page.drafts)
    assert case["alpha"] not in ALPHAS and case["k"] not in DRAFTS
    assert abs(tokens_per_step(case["alpha"], case["k"]) / (case["k"] + 1)
               - tokens_per_step(page.alpha, page.drafts) / (page.drafts + 1)) > 0.05


@pytest.mark.parametrize("check", [check_users_that_fit, check_compute_bound_speedup, check_first_lever])
def test_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet"):
        check(_stub)
