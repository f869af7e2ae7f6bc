"""Section 8 exercises: 8.1 the Q8_0 file (a prediction and an explanation), 8.2 asymmetric int4
in groups, 8.3 a token the int8 cache flips (a function, a prediction, a search on the real model),
8.4 where weight-only quantization stops helping (a prediction and an explanation). The references
pass, stubs fail, and the usual mistakes fail with the message that names them."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import kvlib
import kvlib.exercises as ex
from kvlib.cache import Int8KVCache, MODEL_SHAPES
from kvlib.exercises import CheckFailed
from kvlib.exercises import quantization as qz
from kvlib.exercises import quantization_flip as qf
from kvlib.exercises.quantization import (check_prefill_explanation, check_q8_0_bytes, check_q8_0_explanation,
                                          check_quantize_int4, check_quantized_knee)
from kvlib.exercises.quantization_flip import check_first_flip, check_flip_prediction, check_found_flip

# What the first cell of chapters/08_quantization.ipynb prints: the weights of the 210 layer matrices
# and of the embedding, names its solution of 8.1 uses.
layer_weights, embedding = 106_168_320, 28_311_552


# ----------------------------------------------------------------- the reference solutions
# (the same code as the solution cells of chapters/08_quantization.ipynb)

def predicted_q8_0_bytes():
    matrices = layer_weights + embedding
    norms = 61 * 576
    return matrices // 32 * 34 + norms * 4


def q8_0_explanation():
    return "b"


def quantize_int4(w, group_size):
    g = w.reshape(w.shape[0], -1, group_size)
    lo, hi = g.amin(dim=-1), g.amax(dim=-1)
    scale = (hi - lo) / 15
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
    return q.reshape(w.shape), scale, lo + 8 * scale


def first_flip(model, prompt, n_new, make_cache):
    exact = kvlib.generate(model, prompt, n_new)
    other = kvlib.generate(model, prompt, n_new, cache=make_cache())
    return next((i for i, (a, b) in enumerate(zip(exact, other)) if a != b), None)


def flip_prediction():
    return "a"


def find_flip(model, tokenizer, questions, n_new):
    def gaps(logits):
        top2 = logits.topk(2, dim=-1).values
        return top2[:, 0] - top2[:, 1]

    best, widest = None, 0.0
    for question in questions:
        prompt = tokenizer.encode_chat(question)
        int8 = lambda: Int8KVCache.for_model(model, max_len=len(prompt) + n_new)      # noqa: E731
        index = first_flip(model, prompt, n_new, int8)
        if index is None:
            continue
        exact = kvlib.generate(model, prompt, index + 1, keep_logits=True).logits
        other = kvlib.generate(model, prompt, index + 1, keep_logits=True, cache=int8()).logits
        if gaps(exact).min() > 1e-2 and gaps(other).min() > widest:
            best, widest = (question, index), gaps(other).min().item()
    return best


def predicted_knee_4bit():
    weight_bytes, bandwidth, flops_per_s, flops_per_token = 96e6, 20e9, 100e9, 270e6
    return weight_bytes / bandwidth * flops_per_s / flops_per_token


def prefill_explanation():
    return "c"


def test_references_pass(capsys):
    check_q8_0_bytes(predicted_q8_0_bytes)
    check_q8_0_explanation(q8_0_explanation)
    check_quantize_int4(quantize_int4)
    check_first_flip(first_flip)
    check_flip_prediction(flip_prediction)
    check_quantized_knee(predicted_knee_4bit)
    check_prefill_explanation(prefill_explanation)
    out = capsys.readouterr().out
    assert "✓ Exercise 8.1: you predicted 143,025,408 for the bytes" in out
    assert "✓ Exercise 8.1: (b) is right." in out
    assert "✓ Exercise 8.2: all 5 cases pass" in out
    assert "✓ Exercise 8.3: all 5 cases pass" in out
    assert "✓ Exercise 8.3: (a) is right." in out
    assert "✓ Exercise 8.4: you predicted 1.778 for the 4-bit model's knee" in out
    assert "float32's knee with the same numbers: 10.0" in out
    assert "✓ Exercise 8.4: (c) is right." in out


def test_checks_are_found_by_name_and_the_old_one_is_gone():
    names = set(ex.all_checks())
    assert {"check_q8_0_bytes", "check_q8_0_explanation", "check_quantize_int4", "check_first_flip",
            "check_flip_prediction", "check_found_flip", "check_quantized_knee", "check_prefill_explanation"} <= names
    assert "check_gguf_tensor_bytes" not in names


STUBBED = [check_q8_0_bytes, check_q8_0_explanation, check_quantize_int4, check_first_flip, check_flip_prediction,
           check_quantized_knee, check_prefill_explanation]


@pytest.mark.parametrize("check", STUBBED, ids=lambda c: c.__name__)
def test_stubs_fail(check):
    def not_written(*args):
        raise NotImplementedError("Exercise 8.x: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)


@pytest.mark.parametrize("check", [check_q8_0_bytes, check_q8_0_explanation, check_flip_prediction,
                                   check_quantized_knee, check_prefill_explanation], ids=lambda c: c.__name__)
def test_unanswered_and_crashing_predictions_fail(check):
    with pytest.raises(CheckFailed, match="first"):
        check(lambda: None)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check(lambda: 1 / 0)


@pytest.mark.parametrize("check", [check_quantize_int4, check_first_flip], ids=lambda c: c.__name__)
def test_functions_that_crash_or_are_not_functions_fail(check):
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check(lambda *args: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        check(42)


# ------------------------------------------------------------------------- 8.1, the Q8_0 file

def test_the_exact_count_follows_from_the_shapes():
    layers, emb, norms = qz.weight_counts(kvlib.Config.smollm2_135m())
    assert (layers, emb, norms) == (layer_weights, embedding, 61 * 576)
    assert layers + emb + norms == MODEL_SHAPES["SmolLM2-135M"].n_params
    assert qz.q8_0_model_bytes() == predicted_q8_0_bytes() == 143_025_408
    assert 8 * qz.q8_0_model_bytes() / MODEL_SHAPES["SmolLM2-135M"].n_params == pytest.approx(8.506, abs=1e-3)


@pytest.mark.slow
def test_the_exact_count_is_what_ggufs_quantizer_writes():
    """Every tensor of the real file decoded, each matrix quantized to Q8_0 by gguf (llama.cpp's format),
    the norms in float32: as many bytes as the check expects, and the file's own Q8_0 embedding
    comes back byte for byte (the experiment cell of the notebook)."""
    import gguf
    from kvlib.smollm2 import open_gguf

    q8_0 = gguf.GGMLQuantizationType.Q8_0
    total, matrices, norms = 0, 0, 0
    for t in open_gguf(kvlib.smollm2_path()).tensors:
        w = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
        if w.ndim == 2:
            stored = gguf.quants.quantize(w, q8_0)
            matrices += 1
            if t.name == "token_embd.weight":
                assert np.array_equal(stored, np.asarray(t.data))
        else:
            stored, norms = w.astype(np.float32), norms + 1
        total += stored.nbytes
    assert (matrices, norms) == (211, 61)
    assert total == qz.q8_0_model_bytes()


def test_other_correct_predictions_pass(capsys):
    n = MODEL_SHAPES["SmolLM2-135M"].n_params
    layers, emb, norms = qz.weight_counts(kvlib.Config.smollm2_135m())
    for value in (143e6, 143_025_408.0, n * 8.5 / 8,                          # 8.5 bits for everything
                  (layers + emb + norms) // 32 * 34,                          # the norms quantized too
                  (layers + emb) // 32 * 34):                                 # the norms left out
        check_q8_0_bytes(lambda v=value: v)
    assert capsys.readouterr().out.count("✓ Exercise 8.1") == 5


@pytest.mark.parametrize("value, hint", [
    (134_620_416, "the block scales are missing"),
    (134_479_872, "the block scales are missing"),
    (qz.q8_0_model_bytes(block_bytes=36), "not a float32"),
    (qz.q8_0_model_bytes(embedding_copies=2), "the embedding is counted twice"),
    (qz.q8_0_model_bytes(embedding_copies=0), "the embedding is missing"),
    (96_576_768, "the file as it ships"),
    (538_060_032, "4 bytes a weight is float32"),
    (269_030_016, "a 16-bit format"),
    (143.03, "looks like megabytes"),
    (136.4, "looks like megabytes"),                                          # MiB
    (8 * 143_025_408, "the number of bits"),
    (120e6, "4 bytes for each of the norms' gains"),                        # none of them: the general hint
])
def test_wrong_q8_0_predictions_are_told_why(value, hint):
    with pytest.raises(CheckFailed, match=r"Exercise 8\.1: you predicted .* too (high|low)") as info:
        check_q8_0_bytes(lambda: value)
    assert hint in str(info.value)


def test_a_prediction_that_is_not_a_number_fails():
    with pytest.raises(CheckFailed, match="should be a number"):
        check_q8_0_bytes(lambda: "143 MB")


@pytest.mark.parametrize("letter", ["a", "c", "d"])
def test_wrong_q8_0_explanations_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_q8_0_explanation(lambda: letter)
    assert qz.Q8_0_CHOICES[letter][1] in str(info.value)


def test_explanation_letters_are_read_loosely_and_checked():
    check_q8_0_explanation(lambda: " B ")
    with pytest.raises(CheckFailed, match="should be one of"):
        check_q8_0_explanation(lambda: "e")


# --------------------------------------------------------------------------- 8.2, int4 groups

def test_other_int4_formulations_pass(capsys):
    def in_float64_with_unfold(w, group_size):
        g = w.double().unfold(1, group_size, group_size)                  # (out, groups, group_size)
        lo, hi = g.min(dim=-1).values, g.max(dim=-1).values
        scale = (hi - lo) / 15
        q = ((g - lo[..., None]) / scale[..., None]).round().clamp(0, 15).to(torch.uint8)
        return q.flatten(1), scale.float(), (lo + 8 * scale).float()

    check_quantize_int4(in_float64_with_unfold)
    assert "✓ Exercise 8.2" in capsys.readouterr().out


def _int4(zero_shift=8.0, levels=15, transpose=False):
    def fn(w, group_size):
        if transpose:                      # groups of group_size rows in each column, (groups, in)
            g = w.reshape(-1, group_size, w.shape[1])
            lo, hi = g.amin(dim=1), g.amax(dim=1)
            scale = (hi - lo) / 15
            q = torch.round((g - lo[:, None]) / scale[:, None]).clamp(0, 15)
            return q.reshape(w.shape), scale, lo + 8 * scale
        g = w.reshape(w.shape[0], -1, group_size)
        lo, hi = g.amin(dim=-1), g.amax(dim=-1)
        scale = (hi - lo) / levels
        q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15)
        return q.reshape(w.shape), scale, lo + zero_shift * scale
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_int4(zero_shift=0.0), "the zero is the group's minimum"),
    (_int4(levels=16), "not / 16"),
    (_int4(transpose=True), "the groups run down the columns"),
])
def test_typical_int4_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed, match="Exercise 8.2: case .* is wrong") as info:
        check_quantize_int4(wrong)
    assert hint in str(info.value)


def test_int4_answers_of_the_wrong_kind_fail():
    with pytest.raises(CheckFailed, match="case 1 of 5 .* is wrong"):
        check_quantize_int4(lambda w, g: (torch.zeros_like(w), torch.zeros(w.shape[0], w.shape[1] // g),
                                          torch.zeros(w.shape[0], w.shape[1] // g)))
    with pytest.raises(CheckFailed, match="expected 3 results"):
        check_quantize_int4(lambda w, g: (w, w))


# ------------------------------------------------------------------------ 8.3, the first flip

def test_the_flip_cases_cover_none_zero_and_later_flips():
    expected = [case.expected for case in qf._flip_cases()]
    assert expected[0] is None and expected[3] is None
    assert expected[1] == 0
    assert all(isinstance(e, int) and e > 0 for e in (expected[2], expected[4])) and expected[2] != expected[4]


def test_the_flip_cases_are_far_from_ties():
    """The cases' answers must not hang on float rounding: a student whose float32 run computes the
    same numbers another way (without the cache, say) must get the same tokens."""
    for case in qf._flip_cases():
        model, prompt, n_new, make = case.args
        for cache in (None, make()):
            run = kvlib.generate(model, prompt, n_new, keep_logits=True, cache=cache)
            top2 = run.logits.topk(2, dim=-1).values
            assert (top2[:, 0] - top2[:, 1]).min() > 1e-3, case.name


def test_check_first_flip_leaves_the_random_state_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    check_first_flip(first_flip)
    assert torch.equal(torch.random.get_rng_state(), before)


def test_other_first_flip_formulations_pass(capsys):
    def without_a_float_cache(model, prompt, n_new, make_cache):         # the float32 run recomputed every step
        exact = kvlib.generate(model, prompt, n_new, use_cache=False)
        other = kvlib.generate(model, prompt, n_new, cache=make_cache())
        for i in range(n_new):
            if exact[i] != other[i]:
                return i
        return None

    def as_a_tensor(model, prompt, n_new, make_cache):                   # an index as a 0-d tensor
        exact = torch.tensor(kvlib.generate(model, prompt, n_new))
        other = torch.tensor(kvlib.generate(model, prompt, n_new, cache=make_cache()))
        differ = torch.nonzero(exact != other)
        return differ[0, 0] if len(differ) else None

    check_first_flip(without_a_float_cache)
    check_first_flip(as_a_tensor)
    assert capsys.readouterr().out.count("✓ Exercise 8.3: all 5 cases pass") == 2


def _shifted(shift=None, none_as=None, same_cache=False):
    def fn(model, prompt, n_new, make_cache):
        if same_cache:
            return first_flip(model, prompt, n_new, lambda: kvlib.KVCache.for_model(model, max_len=64))
        i = first_flip(model, prompt, n_new, make_cache)
        if i is None:
            return {"minus one": -1, "n_new": n_new, "False": False}.get(none_as)
        return {None: i, "+1": i + 1, "prompt": len(prompt) + i}[shift]
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_shifted(shift="+1"), "count the new tokens from 0"),
    (_shifted(shift="prompt"), "not the position in the whole sequence"),
    (_shifted(none_as="minus one"), "return None (not -1, False or n_new)"),
    (_shifted(none_as="n_new"), "return None (not -1, False or n_new)"),
    (_shifted(none_as="False"), "return None (not -1, False or n_new)"),
    (_shifted(same_cache=True), "one run must use the float32 cache"),
    (lambda *args: 3, "the first index where the two lists differ"),          # none of them: the general hint
])
def test_typical_first_flip_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed, match="Exercise 8.3: case .* is wrong") as info:
        check_first_flip(wrong)
    assert hint in str(info.value)


# ------------------------------------------------------------------------- 8.3, the prediction

@pytest.mark.parametrize("letter", ["b", "c", "d"])
def test_wrong_flip_predictions_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_flip_prediction(lambda: letter)
    assert qf.FLIP_CHOICES[letter][1] in str(info.value)


# ---------------------------------------------------------------------- 8.3, the found flip
# On a tiny random model whose int8 cache flips one of these questions, with a tokenizer that
# turns characters into token ids: the check's verdicts, without the real model.

class _CharTokenizer:
    def encode_chat(self, text):
        return [ord(c) % 64 for c in text]

    def decode(self, ids):
        return "".join(chr(ord("a") + i % 26) for i in ids)


TINY_QUESTIONS = ["What is the capital of France?", "Why is the sky blue?", "How do I boil an egg?"]


@pytest.fixture(scope="module")
def tiny_flip():
    """A tiny model (seed 3) and the question and index where its int8 cache first flips."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(3)
        model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    found = find_flip(model, _CharTokenizer(), TINY_QUESTIONS, 24)
    assert found is not None and found[1] > 0, found
    return model, found


def _check_tiny(model, answer):
    return check_found_flip(lambda *args: answer, model, _CharTokenizer(), questions=TINY_QUESTIONS, n_new=24)


def test_a_found_flip_is_verified_and_returned(tiny_flip, capsys):
    model, (question, index) = tiny_flip
    got = check_found_flip(find_flip, model, _CharTokenizer(), questions=TINY_QUESTIONS, n_new=24)
    assert got == qf.FoundFlip(question, index) and got.question == question and got.index == index
    out = capsys.readouterr().out
    assert f"✓ Exercise 8.3: {question!r} parts at new token {index}" in out and "both above 0.001" in out
    assert _check_tiny(model, [question, np.int64(index)]) == (question, index)      # a list, a NumPy int


def test_an_index_past_the_first_flip_is_refused(tiny_flip):
    model, (question, index) = tiny_flip
    with pytest.raises(CheckFailed, match=rf"already part at new token {index} \(.*\); the first flip is there"):
        _check_tiny(model, (question, index + 1))


def test_an_index_before_the_flip_is_refused(tiny_flip):
    model, (question, index) = tiny_flip
    with pytest.raises(CheckFailed, match="both caches choose .* have not parted yet"):
        _check_tiny(model, (question, index - 1))


def test_a_flip_without_a_clear_margin_is_refused(tiny_flip, monkeypatch):
    model, found = tiny_flip
    monkeypatch.setattr(qf, "FLIP_MARGIN", 1e3)
    with pytest.raises(CheckFailed, match="refused. The float32 cache's two best logits .* Try another prompt"):
        _check_tiny(model, found)


@pytest.mark.parametrize("answer, message", [
    (None, "your search found no flip among the 3 questions"),
    ("Why is the sky blue?", r"should return \(question, index\)"),
    (("Why is the sky blue?", 1.5), r"should return \(question, index\)"),
    ((1, "Why is the sky blue?"), r"should return \(question, index\)"),
    ((7, 1), "the question should be the text of the question"),
    (("Why is the sky blue?", 24), r"lies in 0\.\.23; got 24"),
    (("Why is the sky blue?", -1), r"lies in 0\.\.23"),
])
def test_malformed_searches_are_told_what_to_return(tiny_flip, answer, message):
    model, _ = tiny_flip
    with pytest.raises(CheckFailed, match=message):
        _check_tiny(model, answer)


def test_a_search_that_is_not_written_or_crashes_fails(tiny_flip):
    model, _ = tiny_flip

    def not_written(*args):
        raise NotImplementedError("Exercise 8.3: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check_found_flip(not_written, model, _CharTokenizer())
    with pytest.raises(CheckFailed, match="your search raised ZeroDivisionError"):
        check_found_flip(lambda *args: 1 / 0, model, _CharTokenizer())
    with pytest.raises(CheckFailed, match="expected a function"):
        check_found_flip(("Why is the sky blue?", 1), model, _CharTokenizer())


@pytest.mark.slow
def test_the_search_on_the_real_model_passes_its_check(capsys):
    """The reference search over the chat questions, 16 tokens each, and the check's own runs."""
    model, tokenizer = kvlib.load_smollm2()
    flip = check_found_flip(find_flip, model, tokenizer)
    assert 0 <= flip.index < qf.FLIP_TOKENS
    assert f"✓ Exercise 8.3: {flip.question!r} parts at new token {flip.index}" in capsys.readouterr().out


# ---------------------------------------------------------------------------- 8.4, the knee

def test_the_knee_follows_from_the_statements_numbers():
    assert predicted_knee_4bit() == pytest.approx(1.7778, abs=1e-4)
    k = qz.KNEE_NUMBERS
    assert qz._knee(k["w32"], k["bandwidth"], k["flops_per_s"], k["flops_per_token"]) == pytest.approx(9.963, abs=1e-3)


def test_other_knee_answers_pass(capsys):
    for value in (1.8, 2, 1.6):                          # rounded; the first whole batch past the knee
        check_quantized_knee(lambda v=value: v)
    assert capsys.readouterr().out.count("✓ Exercise 8.4") == 3


@pytest.mark.parametrize("value, hint", [
    (0.5625, "this is the inverse"),
    (9.963, "that is the float32 model's knee"),
    (96e6 / 100e9 * 20e9 / 270e6, "bandwidth and FLOP/s are swapped"),
    (14.2, "multiplying by 8 counts bits"),
    (9.963 / 4, "not a quarter of the float32 bytes"),
    (9.963 / 8, "4 bits are an eighth of 32"),
    (4, "the bytes of the 4-bit weights over the bandwidth"),          # none of them: the general hint
])
def test_wrong_knees_are_told_why(value, hint):
    with pytest.raises(CheckFailed, match=r"Exercise 8\.4: you predicted .* too (high|low)") as info:
        check_quantized_knee(lambda: value)
    assert hint in str(info.value)


@pytest.mark.parametrize("letter", ["a", "b", "d"])
def test_wrong_prefill_explanations_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_prefill_explanation(lambda: letter)
    assert qz.PREFILL_CHOICES[letter][1] in str(info.value)
