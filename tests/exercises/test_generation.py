"""The checks of section 1 (the generation loop: 1.1 stop at a token, 1.2 tokens fed, 1.3 ragged
prompts): the reference passes, stubs fail, and the usual mistakes fail with the message that
names them."""
from __future__ import annotations

import pytest
import torch

import kvlib
import kvlib.exercises as ex
from kvlib.exercises import CheckFailed
from kvlib.exercises import one_token as gen

NOT_WRITTEN = "not written yet"


def _not_written(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


def test_checks_are_found_by_name():
    assert {"check_greedy_until", "check_tokens_fed", "check_greedy_ragged"} <= set(ex.all_checks())
    assert ex.check_greedy_until is gen.check_greedy_until


# --- the student's solutions, as the notebooks write them ----------------------------------------

def greedy_uncached(model, prompt_ids, n_new):
    text = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([text]))
            text.append(int(logits[0, -1].argmax()))
    return text[len(prompt_ids):]


# --- the references agree with kvlib -------------------------------------------------------------

def test_until_reference_is_kvlib_generate_cut_at_the_stop_token():
    for case in gen._until_cases():
        model, prompt, max_new, stop = case.args
        for use_cache in (False, True):
            free = kvlib.generate(model, prompt, max_new, use_cache=use_cache)
            assert case.expected == (free[:free.index(stop) + 1] if stop in free else free)


def _smallest_margin(model, prompts, n_new) -> float:
    """The smallest gap between the best and second-best logit over every row and step."""
    ids, gap = torch.tensor(prompts), float("inf")
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(ids)[:, -1]
            top = logits.topk(2, dim=-1).values
            gap = min(gap, float((top[:, 0] - top[:, 1]).min()))
            ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
    return gap


def test_reference_cases_are_far_from_ties():
    # another loop (a padded batch, a cache) rounds differently; the cases are chosen so that no
    # step is anywhere near a tie, and any correct loop gives the same tokens
    for case in gen._until_cases():
        if case.args[2]:
            assert _smallest_margin(case.args[0], [case.args[1]], case.args[2]) > 1e-3
    for case in gen._ragged_cases():
        model, prompts, n_new = case.args
        for p in prompts:
            assert _smallest_margin(model, [p], n_new) > 1e-3
        assert gen._greedy_padded(model, prompts, n_new, side="right", mask=True) == case.expected
        assert all(kvlib.generate(model, p, n_new, use_cache=False) == row for p, row in zip(prompts, case.expected))


def test_cases_are_not_degenerate():
    """A constant answer would let a loop that never appends the token pass: the outputs vary."""
    for case in gen._until_cases():
        if len(case.expected) > 1:
            assert len(set(case.expected)) > 1, case.name
    for case in gen._ragged_cases():
        assert len({tuple(row) for row in case.expected}) == len(case.expected), case.name
        if len(case.args[1]) > 1:
            assert len({len(p) for p in case.args[1]}) > 1 or "same length" in case.name, case.name


def test_check_models_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    gen._until_cases()
    assert torch.equal(torch.rand(3), before)


# --- Exercise 1.1: stop at a token ----------------------------------------------------------------

def greedy_until(model, prompt_ids, max_new, stop_id):
    text = list(prompt_ids)
    with torch.no_grad():
        for _ in range(max_new):
            token = int(model(torch.tensor([text]))[0, -1].argmax())
            text.append(token)
            if token == stop_id:
                break
    return text[len(prompt_ids):]


def test_until_reference_passes(capsys):
    gen.check_greedy_until(greedy_until)
    gen.check_greedy_until(lambda m, p, n, s: gen._greedy_until(m, p, n, s))
    assert capsys.readouterr().out.count("✓ Exercise 1.1: all 6 cases pass") == 2


def test_until_cases_stop_where_their_names_say():
    stops = [len(c.expected) for c in gen._until_cases()]
    assert stops == [4, 1, 7, 6, 6, 0]


@pytest.mark.parametrize("wrong, match", [
    (dict(include=False), r"the stop token is left out"),
    (dict(ignore=True), r"never stops at stop_id"),
    (dict(late=True), r"one token too many after the stop token"),
])
def test_until_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 1.1: case 1 of 6 [\s\S]*hint: this looks like a known slip: [^\n]*" + match):
        gen.check_greedy_until(lambda m, p, n, s: gen._greedy_until(m, p, n, s, **wrong))


def test_until_prompt_returned_too_is_named():
    with pytest.raises(CheckFailed, match=r"the prompt is returned too"):
        gen.check_greedy_until(lambda m, p, n, s: list(p) + greedy_until(m, p, n, s))


def test_until_with_the_cache_or_an_extra_call_is_caught():
    def cached(model, prompt_ids, max_new, stop_id):
        out = []
        for t in kvlib.generate(model, prompt_ids, max_new, use_cache=True):
            out.append(t)
            if t == stop_id:
                break
        return out
    with pytest.raises(CheckFailed, match=r"the tokens are right, but the model was called 10 times"):
        gen.check_greedy_until(cached)


@pytest.mark.parametrize("stub, match", [(_not_written, NOT_WRITTEN), (lambda m, p, n, s: [], r"expected 4 token ids"),
                                         (None, "expected a function")])
def test_until_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        gen.check_greedy_until(stub)


# --- Exercise 1.2: tokens fed, predicted and counted -------------------------------------------------

def tokens_fed(p, n, use_cache):
    return p + n - 1 if use_cache else n * p + n * (n - 1) // 2


def test_tokens_fed_reference_passes_and_grades_the_ratio(capsys):
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    without = kvlib.generate(model, [1, 2, 3, 4, 5, 6, 7, 8], 30, use_cache=False, keep_logits=True)
    with_ = kvlib.generate(model, [1, 2, 3, 4, 5, 6, 7, 8], 30, use_cache=True, keep_logits=True)
    gen.check_tokens_fed(tokens_fed, without.records, with_.records)
    gen.check_tokens_fed(lambda p, n, c: float(tokens_fed(p, n, c)))
    out = capsys.readouterr().out
    assert out.count("✓ Exercise 1.2: all 8 cases pass") == 2
    assert "you predicted 18.24 for the ratio of tokens fed without and with the cache (p = 8, n = 30)" in out


@pytest.mark.parametrize("wrong, match", [
    (lambda p, n, c: p + n - 1 if c else n * p, r"only the prompt is counted at every step"),
    (lambda p, n, c: p + n - 1 if c else n * p + n * (n + 1) // 2, r"one step too many is counted"),
    (lambda p, n, c: p + n if c else tokens_fed(p, n, c), r"the last new token is counted as fed"),
    (lambda p, n, c: n - 1 if c else tokens_fed(p, n, c), r"the prompt is left out"),
])
def test_tokens_fed_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 1.2: case \d of 8 [\s\S]*known slip: [^\n]*" + match):
        gen.check_tokens_fed(wrong)


def test_tokens_fed_stub_and_unknown_mistake_fail():
    with pytest.raises(CheckFailed, match=NOT_WRITTEN):
        gen.check_tokens_fed(_not_written)
    with pytest.raises(CheckFailed, match=r"hint: step t \(t = 0 .. n - 1\)"):
        gen.check_tokens_fed(lambda p, n, c: 2 * tokens_fed(p, n, c))


# --- Exercise 1.3: prompts of different lengths ------------------------------------------------------

def greedy_ragged_one_by_one(model, prompts, n_new):
    return [greedy_uncached(model, p, n_new) for p in prompts]


def test_ragged_per_row_and_padded_solutions_pass(capsys):
    gen.check_greedy_ragged(greedy_ragged_one_by_one)
    gen.check_greedy_ragged(lambda m, ps, n: gen._greedy_padded(m, ps, n, side="right", mask=True))
    gen.check_greedy_ragged(lambda m, ps, n: torch.tensor(gen._greedy_padded(m, ps, n, side="right", mask=True)))
    assert capsys.readouterr().out.count("✓ Exercise 1.3: all 6 cases pass") == 3


@pytest.mark.parametrize("wrong, match", [
    (lambda m, ps, n: gen._greedy_padded(m, ps, n, side="right"), r"padded at the end and the batch's last column"),
    (lambda m, ps, n: gen._greedy_padded(m, ps, n, side="left"), r"padded on the left: the real tokens attend"),
    (lambda m, ps, n: gen._greedy_padded(m, ps, n, side="right", mask=True, keep_prompt=True),
     r"the prompts are returned too"),
])
def test_ragged_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 1.3: case 1 of 6 [\s\S]*known slip: [^\n]*" + match):
        gen.check_greedy_ragged(wrong)


def test_ragged_equal_length_assumption_fails_with_its_error():
    with pytest.raises(CheckFailed, match=r"Exercise 1.3: case 1 of 6 .* raised (ValueError|TypeError|RuntimeError)"):
        gen.check_greedy_ragged(lambda m, ps, n: m(torch.tensor(ps)))


@pytest.mark.parametrize("stub, match", [(_not_written, NOT_WRITTEN),
                                         (lambda m, ps, n: [greedy_uncached(m, ps[0], n)], r"expected 3 lists, one per prompt")])
def test_ragged_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        gen.check_greedy_ragged(stub)
