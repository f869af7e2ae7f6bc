"""Section 6 exercises: the reference passes, stubs fail, typical mistakes fail with the right hint."""
from __future__ import annotations

import math

import pytest
import torch

import kvlib.exercises as ex
from kvlib.exercises import CheckFailed, check_max_context, check_quantize_int8
from kvlib.cache import crossover_tokens, kv_cache_bytes, weight_bytes
from kvlib.cache import MODEL_SHAPES


# ----------------------------------------------------------------- the reference solutions
# (the same code as the solution cells of chapters/06_the_price_is_memory.ipynb)

def max_context(config, n_params, memory_bytes, batch):
    per_token = 2 * config.n_layers * config.n_kv_heads * config.head_dim * 2     # 16-bit: 2 bytes a number
    left = memory_bytes - 2 * n_params                                            # after the 16-bit weights
    return max(0, left // (per_token * batch))


def quantize_int8(x):
    scale = x.abs().amax(dim=-1, keepdim=True) / 127
    q = torch.round(x / torch.where(scale == 0, 1, scale)).to(torch.int8)
    return q, scale


def test_references_pass(capsys):
    check_max_context(max_context)
    check_quantize_int8(quantize_int8)
    out = capsys.readouterr().out
    assert "✓ Exercise 6.1: all 8 cases pass" in out
    assert "✓ Exercise 6.2: all 6 cases pass" in out


def test_kvlib_reference_agrees():
    from kvlib.cache import quantize_int8 as kvlib_quantize

    x = torch.randn(3, 4, 16, generator=torch.Generator().manual_seed(0))
    for mine, theirs in zip(quantize_int8(x), kvlib_quantize(x)):
        assert torch.equal(mine, theirs)
    s = MODEL_SHAPES["Llama-3-8B"]
    n = max_context(s.config, s.n_params, 80 * 10**9, 8)
    half = torch.float16
    assert weight_bytes(s.n_params) + kv_cache_bytes(s.config, n, 8, half) <= 80 * 10**9
    assert weight_bytes(s.n_params) + kv_cache_bytes(s.config, n + 1, 8, half) > 80 * 10**9
    # with memory for exactly twice the weights, the context is where the cache equals the weights
    assert max_context(s.config, s.n_params, 2 * weight_bytes(s.n_params), 8) == int(crossover_tokens(s.config, s.n_params, 8))


def test_checks_are_found_by_name():
    assert {"check_max_context", "check_quantize_int8"} <= set(ex.all_checks())


def test_other_correct_answers_pass(capsys):
    def with_floats(config, n_params, memory_bytes, batch):          # a float result of the same value
        per_token = 2.0 * config.n_layers * config.n_kv_heads * (config.d_model // config.n_heads) * 2
        return float(max(0, math.floor((memory_bytes - 2.0 * n_params) / per_token / batch)))

    def clamped_and_float64(x):                                    # computed in float64, clamped
        scale = x.double().abs().amax(dim=-1, keepdim=True) / 127
        q = (x.double() / scale.clamp_min(1e-30)).round().clamp(-127, 127).to(torch.int8)
        return q, scale

    check_max_context(with_floats)
    check_quantize_int8(clamped_and_float64)
    out = capsys.readouterr().out
    assert "✓ Exercise 6.1" in out and "✓ Exercise 6.2" in out


@pytest.mark.parametrize("check", [check_max_context, check_quantize_int8])
def test_stubs_fail(check):
    def not_written(*args):
        raise NotImplementedError("Exercise 6.x: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)
    with pytest.raises(CheckFailed, match="expected a function"):
        check(42)


def test_zero_and_identity_stubs_fail():
    with pytest.raises(CheckFailed, match="case 1 of 8 .* is wrong: expected"):
        check_max_context(lambda *args: 0)
    with pytest.raises(CheckFailed, match="case 1 of 8 .* is wrong: expected"):
        check_max_context(lambda config, n_params, memory_bytes, batch: memory_bytes)
    with pytest.raises(CheckFailed, match="scale at index"):
        check_quantize_int8(lambda x: (torch.zeros_like(x, dtype=torch.int8), torch.zeros(*x.shape[:-1], 1)))
    with pytest.raises(CheckFailed, match="must be stored as torch.int8"):
        check_quantize_int8(lambda x: (x, x))
    with pytest.raises(CheckFailed, match=r"expected two tensors"):
        check_quantize_int8(lambda x: x)


def test_a_crashing_answer_shows_its_error():
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_max_context(lambda *args: 1 / 0)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_quantize_int8(lambda x: 1 / 0)


# ------------------------------------------------------------------ typical mistakes, 6.1

def _context(two=2, heads="kv", batch=True, layers=True, weights=True, bytes_=2, rounding="floor", clamp=True):
    def fn(config, n_params, memory_bytes, b):
        h = {"kv": config.n_kv_heads, "q": config.n_heads, "one": 1}[heads]
        per_head = config.head_dim if heads != "one" else config.d_model
        per_token = two * (config.n_layers if layers else 1) * h * per_head * bytes_
        left = memory_bytes - (bytes_ * n_params if weights else 0)
        x = left / (per_token * (b if batch else 1))
        n = {"floor": math.floor, "ceil": math.ceil, "round": round}[rounding](x)
        return max(0, n) if clamp else n
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_context(two=1), "keys AND values"),
    (_context(heads="q"), "n_kv_heads key/value heads, not n_heads"),
    (_context(heads="one"), "nor d_model"),
    (_context(batch=False), "the cache per token is × batch"),
    (_context(layers=False), "× n_layers"),
    (_context(weights=False), "the weights take their share"),
    (_context(bytes_=4), "not 4"),
    (_context(rounding="ceil"), "round down (math.floor or //)"),
    (_context(rounding="round"), "round down (math.floor or //)"),
])
def test_typical_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed) as info:
        check_max_context(wrong)
    assert hint in str(info.value)


def test_a_negative_context_fails():
    with pytest.raises(CheckFailed, match="the weights alone do not fit.*expected 0"):
        check_max_context(_context(clamp=False))


def test_two_mistakes_at_once_still_fail():
    with pytest.raises(CheckFailed, match="is wrong: expected"):
        check_max_context(_context(two=1, weights=False))


# ------------------------------------------------------------------ typical mistakes, 6.2

def _quant(scale_fn, rounding=torch.round):
    def fn(x):
        scale = scale_fn(x)
        q = rounding(x / torch.where(scale == 0, 1, scale)).clamp(-128, 127).to(torch.int8)
        return q, scale
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_quant(lambda x: x.abs().max() / 127), "one per vector, keepdim=True"),   # case 1 is a single vector
    (_quant(lambda x: (x.abs().max() / 127).expand(*x.shape[:-1], 1)), "not one for the whole tensor"),
    (_quant(lambda x: x.abs().amax(dim=-1, keepdim=True) / 128), "divide the largest magnitude by 127"),
    (_quant(lambda x: x.amax(dim=-1, keepdim=True) / 127), "a vector's largest number may be negative"),
    (_quant(lambda x: 127 / x.abs().amax(dim=-1, keepdim=True)), "not 127 / max|x|"),
    (_quant(lambda x: x.abs().amax(dim=-1, keepdim=True) / 127, rounding=lambda t: t), "not rounded"),
    (_quant(lambda x: x.abs().amax(dim=-1) / 127), "keepdim=True"),
])
def test_typical_quantization_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed) as info:
        check_quantize_int8(wrong)
    assert hint in str(info.value)


def test_dividing_by_a_zero_scale_is_named():
    def wrong(x):
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        return torch.round(x / scale).nan_to_num(0).to(torch.int8), scale / scale * scale
    with pytest.raises(CheckFailed, match="NaN or infinity"):
        check_quantize_int8(wrong)


def test_floor_instead_of_round_fails():
    def wrong(x):
        scale = x.abs().amax(dim=-1, keepdim=True) / 127
        return torch.floor(x / torch.where(scale == 0, 1, scale)).to(torch.int8), scale
    with pytest.raises(CheckFailed, match="values differ"):
        check_quantize_int8(wrong)


# ------------------------------------------------------------ 6.3: an experiment, predicted and explained

from kvlib.exercises import check_int8_context, check_int8_explanation  # noqa: E402
from kvlib.exercises.price_of_memory import INT8_CHOICES, int8_context  # noqa: E402


def predicted_int8_context():                      # the solution cell of chapters/06_the_price_is_memory.ipynb
    s = MODEL_SHAPES["SmolLM2-135M"]
    per_token = 2 * s.n_layers * s.n_kv_heads * (s.head_dim + 4)
    return (512 * 10**6 - 2 * s.n_params) // (16 * per_token)


def test_the_int8_experiments_reference_passes(capsys):
    check_int8_context(predicted_int8_context)
    check_int8_context(1_250)                      # a plain number, within 2 %
    check_int8_explanation(lambda: "d")
    out = capsys.readouterr().out
    assert "✓ Exercise 6.3: you predicted 1,240 for the longest context" in out
    assert "✓ Exercise 6.3: (d) is right." in out


def test_the_int8_context_is_what_real_buffers_allow():
    from kvlib import Int8KVCache

    s = MODEL_SHAPES["SmolLM2-135M"]
    n = int8_context()
    assert n == predicted_int8_context() == 1240
    per_token = Int8KVCache(s.n_layers, 16, s.n_kv_heads, 2, s.head_dim).nbytes // 2
    assert weight_bytes(s.n_params) + per_token * n <= 512 * 10**6 < weight_bytes(s.n_params) + per_token * (n + 1)
    assert max_context(s.config, s.n_params, 512 * 10**6, 16) == 659


@pytest.mark.parametrize("predicted, hint", [
    (1318, "you left out the scales"),
    (659, "that is the 16-bit cache"),
    (19_850, "every conversation has its own cache"),
    (2614, "the weights take their share first"),
    (1927, "the weights stay 16-bit"),
    (1400, "× 16 conversations"),                   # none of them: the general hint
])
def test_wrong_int8_predictions_are_told_why(predicted, hint):
    with pytest.raises(CheckFailed, match="Exercise 6.3: you predicted .* too (high|low)") as info:
        check_int8_context(lambda: predicted)
    assert hint in str(info.value)


@pytest.mark.parametrize("check", [check_int8_context, check_int8_explanation])
def test_the_int8_experiments_stubs_fail(check):
    def not_written():
        raise NotImplementedError("Exercise 6.3: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)
    with pytest.raises(CheckFailed, match="first"):
        check(lambda: None)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check(lambda: 1 / 0)


@pytest.mark.parametrize("letter", ["a", "b", "c"])
def test_wrong_int8_explanations_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_int8_explanation(lambda: letter)
    assert INT8_CHOICES[letter][1] in str(info.value)
