"""Section 5 exercises: 5.1 the closest call, 5.2 the limit of the speed-up and why the clock
falls short of it, 5.3 the answer length at which the uncached loop does 1,000 times the
arithmetic. The references pass, stubs fail, and the usual mistakes fail with the message
that names them."""
from __future__ import annotations

import math

import pytest

import kvlib
import kvlib.exercises as ex
from kvlib.exercises import CheckFailed
from kvlib.exercises import real_model as rm
from kvlib.measure.flops import generation_flops, generation_ratio

PROMPT_LEN = 377            # the demo prompt of section 5 (kvlib.data.demo_prompt): its check is called with it


# ----------------------------------------------------------------- the reference solutions
# (the same code as the solution cells of chapters/05_a_real_model.ipynb)

def closest_call(logits):
    top2 = logits.topk(2, dim=-1).values
    margins = top2[:, 0] - top2[:, 1]
    step = int(margins.argmin())
    return step, float(margins[step])


def predicted_limit():
    return 16


def measured_gap_explanation():
    return "a"


def tokens_for_a_thousand(prompt_len=PROMPT_LEN):
    b, c = 2 * prompt_len - 1 - 2000, -2000 * (prompt_len - 1)
    return (-b + math.sqrt(b * b - 4 * c)) / 2


def _not_written(*args, **kwargs):
    raise NotImplementedError("Exercise 5.x: write me")


def test_checks_are_found_by_name():
    assert {"check_closest_call", "check_speedup_limit", "check_speedup_explanation",
            "check_thousand_times"} <= set(ex.all_checks())
    assert ex.check_closest_call is rm.check_closest_call


def test_references_pass(capsys):
    rm.check_closest_call(closest_call)
    rm.check_speedup_limit(predicted_limit)
    rm.check_speedup_explanation(measured_gap_explanation)
    rm.check_thousand_times(tokens_for_a_thousand, PROMPT_LEN)
    out = capsys.readouterr().out
    assert "✓ Exercise 5.1: all 7 cases pass" in out
    assert "✓ Exercise 5.2: you predicted 16 " in out and "✓ Exercise 5.2: (a) is right" in out
    assert "✓ Exercise 5.3: you predicted 1692 " in out and "it is 1,823 " in out


# ----------------------------------------------------------------- 5.1 the closest call

def test_closest_cases_hold_what_their_names_say():
    cases = {c.name: c for c in rm._closest_cases()}
    assert cases["one row of 3 scores per step, 2 steps"].expected == (0, 0.5)
    step, margin = cases["the closest call at the last step"].expected
    assert step == 5 and margin == pytest.approx(0.004, abs=1e-5)
    assert cases["a tie at step 2"].expected == (2, 0.0)
    assert cases["3 steps of SmolLM2's 49,152 scores"].args[0].shape == (3, 49_152)
    # every case's closest call is unique with margin, so that a correct answer finds that step
    for case in cases.values():
        (logits,) = case.args
        top2 = logits.topk(2, dim=-1).values
        margins = (top2[:, 0] - top2[:, 1]).sort().values
        if len(margins) > 1:
            assert margins[1] - margins[0] > 1e-3, case.name


def test_closest_call_other_correct_answers_pass(capsys):
    def sorted_descending(logits):                           # sort instead of topk, tensors returned
        s = logits.sort(dim=-1, descending=True).values
        gaps = s[:, 0] - s[:, 1]
        return gaps.argmin(), gaps.min()

    def loop(logits):                                        # plain Python, one row at a time
        best = None
        for i, row in enumerate(logits.tolist()):
            a, b = sorted(row, reverse=True)[:2]
            if best is None or a - b < best[1]:
                best = (i, a - b)
        return best

    rm.check_closest_call(sorted_descending)
    rm.check_closest_call(loop)
    assert capsys.readouterr().out.count("✓ Exercise 5.1") == 2


@pytest.mark.parametrize("wrong, match", [
    (lambda x: rm._closest_call(x, largest=True), r"the LARGEST gap"),
    (lambda x: rm._closest_call(x, worst=True), r"the best score against the worst"),
    (lambda x: rm._closest_call(x, dim=0), r"down a column"),
    (lambda x: rm._closest_call(x, distinct=True), r"a tie counts"),
])
def test_closest_call_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=rf"Exercise 5.1: case \d of 7 [\s\S]*hint: this looks like a known slip: [^\n]*{match}"):
        rm.check_closest_call(wrong)


@pytest.mark.parametrize("stub, match", [
    (_not_written, "not written yet"),
    (lambda x: (0, 0.0), r"case 1 of 7 .* is wrong: result 1: expected 0.5, got 0.0"),
    (lambda x: x, r"case 1 of 7 .* expected 2 results"),
    ("closest", "expected a function"),
])
def test_closest_call_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        rm.check_closest_call(stub)


def test_closest_call_unknown_mistake_gets_the_recipe():
    with pytest.raises(CheckFailed, match=r"hint: per step \(row\), best − second best"):
        rm.check_closest_call(lambda x: (closest_call(x)[0], closest_call(x)[1] + 0.1))


# ----------------------------------------------------------------- 5.2 the limit, and why the clock falls short

def test_the_limit_is_the_number_of_new_tokens():
    assert generation_ratio(rm.SMOLLM2, 16, prompt_len=rm.LIMIT_PROMPT) == pytest.approx(16, abs=1e-5)
    # and the ratio grows towards it with the prompt
    ratios = [generation_ratio(rm.SMOLLM2, 16, prompt_len=p) for p in (32, 512, 8192, rm.LIMIT_PROMPT)]
    assert ratios == sorted(ratios) and ratios[0] < 13


@pytest.mark.parametrize("answer", [16, 16.0, 15.5, 16.7])
def test_limit_within_five_percent_passes(answer, capsys):
    rm.check_speedup_limit(lambda: answer)
    assert "✓ Exercise 5.2" in capsys.readouterr().out


@pytest.mark.parametrize("answer, match", [
    (float("inf"), r"it levels off"),
    (1e6, r"it levels off"),
    (15, r"15 counts only the steps after the first"),
    (8, r"does not re-read half the prompt"),
    (1, r"a ratio of 1 would mean"),
    (32, r"how many times does each loop"),
])
def test_limit_mistakes_are_named(answer, match):
    with pytest.raises(CheckFailed, match=rf"Exercise 5.2: you predicted [\s\S]*hint: [^\n]*{match}"):
        rm.check_speedup_limit(lambda: answer)


@pytest.mark.parametrize("letter", ["b", "c", "d", "B "])
def test_wrong_explanations_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter.strip().lower()}\) is not it\. "):
        rm.check_speedup_explanation(lambda: letter)


@pytest.mark.parametrize("check", [rm.check_speedup_limit, rm.check_speedup_explanation])
def test_section_5_2_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet"):
        check(_not_written)
    with pytest.raises(CheckFailed, match="first"):
        check(lambda: None)


# ----------------------------------------------------------------- 5.3 how long until a thousand times

def test_tokens_for_ratio_is_the_first_length_that_reaches_it():
    cfg = rm.SMOLLM2
    n = rm.tokens_for_ratio(cfg, PROMPT_LEN)
    assert n == 1823
    def ratio(k):
        return (generation_flops(cfg, PROMPT_LEN, k, use_cache=False)
                / generation_flops(cfg, PROMPT_LEN, k, use_cache=True))
    assert ratio(n) >= 1000 > ratio(n - 1)
    assert rm.tokens_for_ratio(cfg, 1) == 2199                      # a one-token prompt needs more
    assert rm.tokens_for_ratio(cfg, PROMPT_LEN, ratio=2) < 10
    with pytest.raises(ValueError, match="stays below"):
        rm.tokens_for_ratio(cfg, PROMPT_LEN, ratio=1e9, limit=1024)


def test_tokens_for_ratio_counts_the_parts_asked_for():
    """The page's exercise 5.3 explains the gap between the token count and the exact count by the
    parts: attention alone lowers the count (it raises the ratio), the output layer alone raises it
    (both loops pay it once per step), and the output layer wins."""
    cfg = rm.SMOLLM2
    tokens = rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=("linear",))
    with_attention = rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=("linear", "attention"))
    with_output = rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=("linear", "output"))
    exact = rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=("linear", "attention", "output"))
    assert exact == rm.tokens_for_ratio(cfg, PROMPT_LEN) == 1823
    assert tokens == round(tokens_for_a_thousand())                       # the derivation is the token count
    assert with_attention < tokens < exact < with_output
    with pytest.raises(ValueError, match="parts"):
        rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=("linear", "mlp"))
    with pytest.raises(ValueError, match="parts"):
        rm.tokens_for_ratio(cfg, PROMPT_LEN, parts=())


def test_the_token_count_without_attention_passes_with_margin():
    derived, exact = tokens_for_a_thousand(), rm.tokens_for_ratio(rm.SMOLLM2, PROMPT_LEN)
    assert 0.05 < abs(derived - exact) / exact < 0.08              # inside the tolerance, not by accident


@pytest.mark.parametrize("answer, match", [
    (2199, r"a one-token prompt"),
    (1000, r"the ratio is not the number of steps"),
    (2000, r"n/2 is the ratio for a one-token prompt"),
    (500, r"count the tokens each loop feeds"),
])
def test_thousand_times_mistakes_are_named(answer, match):
    with pytest.raises(CheckFailed, match=rf"Exercise 5.3: you predicted [\s\S]*hint: [^\n]*{match}"):
        rm.check_thousand_times(lambda: answer, PROMPT_LEN)


def test_thousand_times_stub_fails():
    with pytest.raises(CheckFailed, match="not written yet"):
        rm.check_thousand_times(_not_written, PROMPT_LEN)


def test_section_5_checks_never_load_the_model(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the checks must not load the real model")
    monkeypatch.setattr(kvlib, "load_smollm2", no_model, raising=False)
    rm.check_closest_call(closest_call)
    rm.check_speedup_limit(predicted_limit)
    rm.check_thousand_times(tokens_for_a_thousand, PROMPT_LEN)
