"""The checks of Exercises 1.1, 1.3 (the generation loop) and 5.1 (the size of the cache):
the reference passes, stubs fail, and the usual mistakes fail with the message that names them."""
from __future__ import annotations

import pytest
import torch

import kvlib
import kvlib.exercises as ex
from kvlib.exercises import CheckFailed
from kvlib.exercises import one_token as gen
from kvlib.exercises import real_model as rm

NOT_WRITTEN = "not written yet"


def _not_written(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


def test_checks_are_found_by_name():
    assert {"check_greedy_uncached", "check_greedy_batch", "check_kv_cache_bytes"} <= set(ex.all_checks())
    assert ex.check_greedy_uncached is gen.check_greedy_uncached
    assert ex.check_kv_cache_bytes is rm.check_kv_cache_bytes


# --- the student's solutions, as the notebooks write them ----------------------------------------

def greedy_uncached(model, prompt_ids, n_new):
    text = list(prompt_ids)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(torch.tensor([text]))
            text.append(int(logits[0, -1].argmax()))
    return text[len(prompt_ids):]


def greedy_batch(model, prompts, n_new):
    ids = torch.tensor(prompts)
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(ids)
            ids = torch.cat([ids, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    return ids[:, len(prompts[0]):].tolist()


def kv_cache_bytes(config, seq_len, batch=1, bytes_per_number=4):
    return 2 * config.n_layers * config.n_kv_heads * config.head_dim * bytes_per_number * seq_len * batch


# --- the references agree with kvlib -------------------------------------------------------------

def test_loop_reference_is_kvlib_generate_without_cache():
    for case in gen._loop_cases():
        model, prompt, n_new = case.args
        assert case.expected == kvlib.generate(model, prompt, n_new, use_cache=False)
        assert case.expected == kvlib.generate(model, prompt, n_new, use_cache=True)


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


def _agrees_with_generate(case) -> bool:
    """The batched reference equals ``kvlib.generate`` run on each prompt alone."""
    model, prompts, n_new = case.args
    return all(kvlib.generate(model, p, n_new, use_cache=False) == row for p, row in zip(prompts, case.expected))


def test_batch_reference_is_each_prompt_alone_and_far_from_ties():
    # batched and one-at-a-time arithmetic round differently; the cases are chosen so that no
    # step is anywhere near a tie, and any correct loop gives the same tokens
    for case in gen._batch_cases():
        assert _agrees_with_generate(case)
        assert _smallest_margin(*case.args) > 1e-3
    for case in gen._loop_cases():
        if case.args[2]:
            assert _smallest_margin(case.args[0], [case.args[1]], case.args[2]) > 1e-3


def test_cases_are_not_degenerate():
    """A constant answer would let a loop that never appends the token pass: the outputs vary."""
    for case in gen._loop_cases():
        if len(case.expected) > 1:
            assert len(set(case.expected)) > 1, case.name
    for case in gen._batch_cases():
        assert len({tuple(row) for row in case.expected}) == len(case.expected), case.name


def test_kv_reference_agrees_with_kvlib_cache():
    model = kvlib.Decoder(kvlib.Config.tiny())
    for batch in (1, 3):
        cache = kvlib.KVCache.for_model(model, batch=batch, max_len=40)
        assert rm._kv_cache_bytes(model.config, 40, batch) == cache.nbytes
    assert rm._kv_cache_bytes(kvlib.Config.smollm2_135m(), 32_768) == 1_509_949_440      # 45 KiB a token


def test_check_models_leave_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    gen._loop_cases()
    assert torch.equal(torch.rand(3), before)


# --- Exercise 1.1 --------------------------------------------------------------------------------

def test_loop_reference_passes(capsys):
    gen.check_greedy_uncached(greedy_uncached)
    gen.check_greedy_uncached(gen._greedy_uncached)
    out = capsys.readouterr().out
    assert "✓ Exercise 1.1: all 6 cases pass" in out


def test_loop_returning_a_tensor_passes(capsys):
    gen.check_greedy_uncached(lambda m, p, n: torch.tensor(greedy_uncached(m, p, n), dtype=torch.long))
    assert "✓ Exercise 1.1" in capsys.readouterr().out


def test_loop_that_changes_the_callers_list_is_fine(capsys):
    def student(model, prompt_ids, n_new):
        start = len(prompt_ids)
        for _ in range(n_new):
            prompt_ids.append(int(model(torch.tensor([prompt_ids]))[0, -1].argmax()))
        return prompt_ids[start:]
    gen.check_greedy_uncached(student)
    assert "✓ Exercise 1.1" in capsys.readouterr().out


@pytest.mark.parametrize("stub, match", [
    (lambda m, p, n: [0] * n, r"case 1 of 6 .* is wrong: new token 0: expected 6, got 0"),
    (lambda m, p, n: list(p), r"case 1 of 6 .* is wrong: expected 6 token ids"),
    (lambda m, p, n: [], r"case 1 of 6 .* is wrong: expected 6 token ids"),
    (lambda m, p, n: None, r"case 1 of 6 .* expected 6 token ids .* got None"),
    (_not_written, NOT_WRITTEN),
    (42, "expected a function"),
])
def test_loop_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        gen.check_greedy_uncached(stub)


@pytest.mark.parametrize("wrong, match", [
    (dict(keep_prompt=True), r"expected 6 token ids [\s\S]*the prompt is returned too"),
    (dict(position=0), r"new token 0: [\s\S]*scores of the first position"),
    (dict(append=False), r"never appended"),
    (dict(feed_last_only=True), r"only the last token goes into the model"),
    (dict(steps_shift=-1), r"one token too few"),
    (dict(steps_shift=+1), r"one token too many"),
])
def test_loop_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 1.1: case \d of 6 [\s\S]*" + match):
        gen.check_greedy_uncached(lambda m, p, n: gen._greedy(m, p, n, **wrong))


def test_loop_with_a_cache_is_caught_by_what_goes_into_the_model():
    # the right tokens, but through kvlib's cache: one token per step after the prompt
    with pytest.raises(CheckFailed, match=r"the tokens are right, but the model was called 6 times, with token "
                                          r"ids of shape \(1, 5\), \(1, 1\), [\s\S]*\(1, 5\), \(1, 6\), \(1, 7\)"):
        gen.check_greedy_uncached(lambda m, p, n: kvlib.generate(m, p, n, use_cache=True))


def test_loop_with_an_extra_model_call_is_caught():
    def student(model, prompt_ids, n_new):
        out = greedy_uncached(model, prompt_ids, n_new)
        model(torch.tensor([list(prompt_ids) + out]))           # one more pass, for nothing
        return out
    with pytest.raises(CheckFailed, match=r"called 7 times"):
        gen.check_greedy_uncached(student)


def test_loop_student_error_is_reported_briefly():
    with pytest.raises(CheckFailed, match=r"case 1 of 6 .* raised (TypeError|ValueError|RuntimeError)"):
        gen.check_greedy_uncached(lambda m, p, n: [int(m(torch.tensor(p))[-1].argmax())] * n)   # 1-D ids
    with pytest.raises(CheckFailed, match=r"raised ZeroDivisionError: division by zero\n  input: "
                                          r"\(<random decoder, Config.tiny\(\)"):
        gen.check_greedy_uncached(lambda m, p, n: 1 / 0)


def test_loop_unknown_mistake_gets_the_general_hint():
    with pytest.raises(CheckFailed, match=r"hint: the usual mistakes"):
        gen.check_greedy_uncached(lambda m, p, n: [(t + 1) % m.config.vocab_size for t in greedy_uncached(m, p, n)])


# --- Exercise 1.3 --------------------------------------------------------------------------------

def test_batch_reference_passes(capsys):
    gen.check_greedy_batch(greedy_batch)
    gen.check_greedy_batch(lambda m, ps, n: torch.tensor(greedy_batch(m, ps, n)))
    assert capsys.readouterr().out.count("✓ Exercise 1.3: all 6 cases pass") == 2


@pytest.mark.parametrize("stub, match", [
    (lambda m, ps, n: [[0] * n for _ in ps], r"case 1 of 6 .* is wrong: prompt 0, new token 0: expected 48, got 0"),
    (lambda m, ps, n: ps, r"case 1 of 6 .* is wrong: prompt 0: expected 5 token ids \(48, 46, 8, 15, 45\), got \(54, 60"),
    (lambda m, ps, n: [greedy_uncached(m, ps[0], n)], r"expected 3 lists, one per prompt"),
    (_not_written, NOT_WRITTEN),
])
def test_batch_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        gen.check_greedy_batch(stub)


@pytest.mark.parametrize("wrong, match", [
    (dict(per_row=False), r"prompt 1, new token 0: [\s\S]*every prompt gets the token chosen for the first one"),
    (dict(transpose=True), r"expected 3 lists, one per prompt[\s\S]*one list per step"),
    (dict(keep_prompt=True), r"prompt 0: expected 5 token ids[\s\S]*prompts are returned too"),
    (dict(position=0), r"scores of the first position"),
])
def test_batch_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 1.3: case \d of 6 [\s\S]*" + match):
        gen.check_greedy_batch(lambda m, ps, n: gen._greedy_batch(m, ps, n, **wrong))


def test_batch_one_prompt_at_a_time_is_caught():
    with pytest.raises(CheckFailed, match=r"the tokens are right, but the model was called 15 times[\s\S]*"
                                          r"calls it 5 times, with shape \(3, 4\), \(3, 5\)"):
        gen.check_greedy_batch(lambda m, ps, n: [greedy_uncached(m, p, n) for p in ps])


def test_batch_argmax_over_everything_fails_with_its_error():
    def student(model, prompts, n_new):
        ids = torch.tensor(prompts)
        for _ in range(n_new):
            nxt = model(ids)[:, -1].argmax()                      # one id for the whole batch
            ids = torch.cat([ids, nxt.expand(len(prompts), 1)], dim=1)
        return ids[:, len(prompts[0]):].tolist()
    with pytest.raises(CheckFailed, match=r"Exercise 1.3: case 1 of 6 .*(raised|is wrong)"):
        gen.check_greedy_batch(student)


def test_batch_new_tokens_on_the_wrong_dimension_fail_with_their_error():
    def student(model, prompts, n_new):
        ids = torch.tensor(prompts)
        for _ in range(n_new):
            ids = torch.cat([ids, model(ids)[:, -1].argmax(-1, keepdim=True)], dim=0)
        return ids.tolist()
    with pytest.raises(CheckFailed, match=r"case 1 of 6 .* raised RuntimeError"):
        gen.check_greedy_batch(student)


# --- Exercise 5.1 --------------------------------------------------------------------------------

def test_kv_reference_passes(capsys):
    rm.check_kv_cache_bytes(kv_cache_bytes)
    rm.check_kv_cache_bytes(rm._kv_cache_bytes)
    assert capsys.readouterr().out.count("✓ Exercise 5.1: all 7 cases pass") == 2


def test_kv_float_answer_is_accepted(capsys):
    rm.check_kv_cache_bytes(lambda c, n, batch=1, bytes_per_number=4: float(kv_cache_bytes(c, n, batch, bytes_per_number)))
    assert "✓ Exercise 5.1" in capsys.readouterr().out


@pytest.mark.parametrize("stub, match", [
    (lambda c, n, batch=1, bytes_per_number=4: 0, r"case 1 of 7 .* is wrong: expected 1509949440, got 0"),
    (lambda c, n, batch=1, bytes_per_number=4: n, r"case 1 of 7 .* is wrong: expected 1509949440, got 32768"),
    (lambda c, n, batch=1, bytes_per_number=4: c, r"case 1 of 7 .* got Config\("),
    (_not_written, NOT_WRITTEN),
    ("kv", "expected a function"),
])
def test_kv_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        rm.check_kv_cache_bytes(stub)


def test_kv_without_the_keyword_arguments_fails_with_its_error():
    with pytest.raises(CheckFailed, match=r"case 3 of 7 \(Config.tiny\(\), 10 tokens, batch 3, float32\) raised TypeError"):
        rm.check_kv_cache_bytes(lambda c, n: kv_cache_bytes(c, n))


def _kv(keys_only=False, heads=False, layers=True, batch_on=True, bytes_on=True, numbers=False, bits=False,
        max_len=False, shift=0):
    def fn(config, seq_len, batch=1, bytes_per_number=4):
        heads_ = config.n_heads if heads else config.n_kv_heads
        size = (1 if keys_only else 2) * (config.n_layers if layers else 1) * heads_ * config.head_dim
        size *= 1 if numbers else (bytes_per_number if bytes_on else 4)
        size *= (config.max_seq_len if max_len else seq_len + shift) * (batch if batch_on else 1)
        return size * 8 if bits else size
    return fn


@pytest.mark.parametrize("wrong, match, case", [
    (_kv(keys_only=True), r"only the keys are counted", 1),
    (_kv(heads=True), r"the query heads are counted", 1),
    (_kv(layers=False), r"the layers are forgotten", 1),
    (_kv(batch_on=False), r"the batch is forgotten", 3),
    (_kv(bytes_on=False), r"bytes_per_number is ignored", 4),
    (_kv(numbers=True), r"the number of numbers, not of bytes", 1),
    (_kv(bits=True), r"that is bits, not bytes", 1),
    (_kv(max_len=True), r"sized for max_seq_len", 1),          # 8,192 = 32,768 / 4: told apart by case 2
    (_kv(shift=+1), r"not seq_len \+ 1", 1),
    (_kv(shift=-1), r"not seq_len - 1", 1),
])
def test_kv_usual_mistakes_are_named(wrong, match, case):
    with pytest.raises(CheckFailed, match=rf"Exercise 5.1: case {case} of 7 [\s\S]*hint: [^\n]*{match}"):
        rm.check_kv_cache_bytes(wrong)


def test_kv_unknown_mistake_gets_the_formula_as_hint():
    with pytest.raises(CheckFailed, match=r"hint: 2 \(a key and a value\) × n_layers"):
        rm.check_kv_cache_bytes(lambda c, n, batch=1, bytes_per_number=4: kv_cache_bytes(c, n, batch, bytes_per_number) + 1)


def test_kv_check_never_loads_the_model(monkeypatch):
    def no_model(*a, **k):
        raise AssertionError("the check must not load the real model")
    monkeypatch.setattr(kvlib, "load_smollm2", no_model, raising=False)
    rm.check_kv_cache_bytes(kv_cache_bytes)
