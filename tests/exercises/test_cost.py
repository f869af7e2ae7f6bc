"""Section 4 exercises: the reference passes, stubs fail, typical mistakes fail with the right hint."""
from __future__ import annotations

import pytest

import kvlib
import torch
from kvlib.exercises import CheckFailed, check_predict_step_flops, check_total_flops_ratio


# ----------------------------------------------------------------- the reference solutions
# (the same code as the solution cells of chapters/04_quadratic_versus_linear.ipynb)

def predict_step_flops(config, n, use_cache):
    d, hd = config.d_model, config.head_dim
    per_token = config.n_layers * (2 * d * config.n_heads * hd          # wq
                                   + 2 * 2 * d * config.n_kv_heads * hd  # wk, wv
                                   + 2 * config.n_heads * hd * d        # wo
                                   + 3 * 2 * d * config.d_mlp)          # gate, up, down
    per_pair = config.n_layers * config.n_heads * 4 * hd                # q·k and p·v
    output = 2 * d * config.vocab_size                                  # the last position's logits
    tokens_in = 1 if use_cache else n
    return output + tokens_in * per_token + tokens_in * n * per_pair


def total_flops_ratio(config, n):
    without = sum(predict_step_flops(config, m, use_cache=False) for m in range(1, n + 1))
    with_cache = sum(predict_step_flops(config, m, use_cache=True) for m in range(1, n + 1))
    return without / with_cache


def test_references_pass(capsys):
    check_predict_step_flops(predict_step_flops)
    check_total_flops_ratio(total_flops_ratio)
    out = capsys.readouterr().out
    assert "✓ Exercise 4.1: all 10 cases pass" in out
    assert "✓ Exercise 4.2: all 7 cases pass" in out


def test_reference_agrees_with_kvlib_flops():
    from kvlib.measure.flops import generation_ratio, step_flops

    cfg = kvlib.Config.smollm2_135m()
    assert predict_step_flops(cfg, 300, False) == step_flops(cfg, 300, 300).total
    assert total_flops_ratio(cfg, 200) == pytest.approx(generation_ratio(cfg, 200), rel=1e-12)


@pytest.mark.parametrize("check", [check_predict_step_flops, check_total_flops_ratio])
def test_stubs_fail(check):
    def not_written(*args):
        raise NotImplementedError("Exercise 4.x: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)
    with pytest.raises(CheckFailed, match="case 1 of .* is wrong: expected"):
        check(lambda *args: 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        check(42)


def test_a_crashing_answer_shows_its_error():
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_predict_step_flops(lambda config, n, use_cache: 1 / 0)


# ------------------------------------------------------------------ typical mistakes, 4.1

def _step(linear=True, pow_=2, keys_shift=0, output=True, out_all=False, kv_full=False, mac=2, triangle=False,
          tokens_shift=0):
    def fn(config, n, use_cache):
        d, hd = config.d_model, config.head_dim
        kv = config.n_heads if kv_full else config.n_kv_heads
        per_token = config.n_layers * (mac * d * config.n_heads * hd + 2 * mac * d * kv * hd
                                       + mac * config.n_heads * hd * d + 3 * mac * d * config.d_mlp)
        per_pair = config.n_layers * config.n_heads * 2 * mac * hd
        out = mac * d * config.vocab_size
        t = 1 if use_cache else n + tokens_shift
        keys = n + keys_shift
        if triangle and not use_cache:
            attention = per_pair * n * (n + 1) // 2
        elif pow_ == 1:
            attention = per_pair * keys
        else:
            attention = per_pair * t * keys
        return (out * (t if out_all else 1) if output else 0) + (t * per_token if linear else 0) + attention
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_step(linear=False), "left out the projections and the MLP"),
    (_step(pow_=1), "not n\\."),
    (_step(keys_shift=-1), "off by one: at a context of n tokens"),
    (_step(keys_shift=+1), "not n \\+ 1"),
    (_step(tokens_shift=-1, keys_shift=-1), "feeds n tokens without the cache, not n - 1"),
    (_step(output=False), "left out the output layer"),
    (_step(out_all=True), "last position only"),
    (_step(kv_full=True), "grouped-query attention"),
    (_step(mac=1), "multiply-add counts as 2"),
    (_step(triangle=True), "not only the causal triangle"),
])
def test_typical_step_mistakes_are_named(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_predict_step_flops(wrong)


def test_an_unknown_mistake_gets_the_general_hint():
    with pytest.raises(CheckFailed, match="hint: a step is output"):
        check_predict_step_flops(lambda config, n, use_cache: predict_step_flops(config, n, use_cache) + 1)


# ------------------------------------------------------------------ typical mistakes, 4.2

def _ratio(contexts=lambda n: range(1, n + 1), step=predict_step_flops, invert=False, last_only_step=False):
    def fn(config, n):
        if last_only_step:
            return step(config, n, False) / step(config, n, True)
        un = sum(step(config, m, False) for m in contexts(n))
        ca = sum(step(config, m, True) for m in contexts(n))
        return ca / un if invert else un / ca
    return fn


@pytest.mark.parametrize("wrong, hint", [
    (_ratio(contexts=lambda n: range(0, n)), "not 0 … n-1"),
    (_ratio(contexts=lambda n: range(1, n)), "stopped one step early"),
    (_ratio(contexts=lambda n: range(1, n + 2)), "one step too far"),
    (_ratio(contexts=lambda n: range(2, n + 2)), "not 2 … n \\+ 1"),
    (_ratio(step=_step(linear=False)), "left out the projections and the MLP"),
    (_ratio(step=_step(output=False)), "left out the output layer"),
    (_ratio(step=_step(pow_=1)), "not m\\."),
    (_ratio(invert=True), "divided the other way"),
    (_ratio(last_only_step=True), "last step alone"),
    (_ratio(step=_step(out_all=True)), "last position only"),
])
def test_typical_ratio_mistakes_are_named(wrong, hint):
    with pytest.raises(CheckFailed, match=hint):
        check_total_flops_ratio(wrong)


def test_an_approximation_is_not_enough():
    with pytest.raises(CheckFailed, match="case .* is wrong"):
        check_total_flops_ratio(lambda config, n: n / 2 if n > 1 else 1.0)


# ------------------------------------------------------------ 4.3: an experiment, predicted and explained

from kvlib.exercises import check_batch_explanation, check_batched_intensity  # noqa: E402
from kvlib.exercises.quadratic_vs_linear import BATCH_CHOICES, batched_intensity, small_weight_bytes  # noqa: E402


def predicted_intensity():                        # the solution cell's arithmetic, without the notebook's names
    from kvlib.cache import kv_cache_bytes
    from kvlib.measure.flops import step_flops

    cfg = kvlib.Config.small()
    return 16 * step_flops(cfg, 512, 1).total / (small_weight_bytes() + 16 * kv_cache_bytes(cfg, 512, 1, torch.float32))


def test_the_experiments_reference_passes(capsys):
    check_batched_intensity(predicted_intensity)
    check_batched_intensity(3.3)                   # a plain number is taken too
    check_batch_explanation(lambda: "c")
    check_batch_explanation(" C ")
    out = capsys.readouterr().out
    assert "✓ Exercise 4.3: you predicted 3.259 for the FLOPs per byte" in out
    assert "✓ Exercise 4.3: (c) is right." in out


def test_the_exact_intensity_is_the_notebooks_count():
    model = kvlib.Decoder(kvlib.Config.small())
    assert small_weight_bytes() == sum(p.numel() * p.element_size() for p in model.parameters()) == 16_000_000
    assert batched_intensity() == pytest.approx(16 * 10_092_544 / (16_000_000 + 16 * 2_097_152), rel=1e-12)


@pytest.mark.parametrize("predicted, hint", [
    (16 * 10_092_544 / (16_000_000 + 2_097_152), "every sequence reads its own keys and values"),   # 16 × batch 1
    (16 * 10_092_544 / 16_000_000, "you left out the caches' bytes"),
    (10_092_544 / (16_000_000 + 2_097_152), "that is the intensity of one sequence"),
    (100.0, "the weights once, plus 16 caches"),                                                   # none of them
])
def test_wrong_predictions_are_told_why(predicted, hint):
    with pytest.raises(CheckFailed, match="Exercise 4.3: you predicted .* too (high|low)") as info:
        check_batched_intensity(lambda: predicted)
    assert hint in str(info.value)


@pytest.mark.parametrize("check", [check_batched_intensity, check_batch_explanation])
def test_the_experiments_stubs_fail(check):
    def not_written():
        raise NotImplementedError("Exercise 4.3: ...")

    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)
    with pytest.raises(CheckFailed, match="first"):
        check(lambda: ...)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check(lambda: 1 / 0)


def test_a_prediction_must_be_a_number():
    with pytest.raises(CheckFailed, match="should be a number"):
        check_batched_intensity(lambda: "3.3")


@pytest.mark.parametrize("letter", ["a", "b", "d"])
def test_wrong_explanations_are_told_why(letter):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_batch_explanation(lambda: letter)
    assert BATCH_CHOICES[letter][1] in str(info.value)
    with pytest.raises(CheckFailed, match="should be one of"):
        check_batch_explanation(lambda: "e")
