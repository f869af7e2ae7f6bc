"""The roofline of a decode step with the cache in it: the knee, the ceiling, the reference machines."""
from __future__ import annotations

import math

import torch

import pytest
from hypothesis import assume, given, settings, strategies as st

from kvlib.measure.roofline import (REFERENCE_ACCELERATORS, Accelerator, decode_knee, decode_step_seconds,
                                    roofline_seconds, throughput_ceiling, estimate_decode)

positive = st.floats(min_value=1e-3, max_value=1e15, allow_nan=False, allow_infinity=False)
machine = st.fixed_dictionaries(dict(weight_bytes=positive, flops_per_token=positive,
                                     cache_bytes_per_row=st.floats(min_value=0, max_value=1e12),
                                     flops_per_s=positive, bytes_per_s=positive))


@settings(max_examples=200, deadline=None)
@given(machine, st.integers(min_value=1, max_value=10_000))
def test_the_step_grows_with_the_batch_and_throughput_stays_under_the_ceiling(m, batch):
    one, more = decode_step_seconds(batch, **m), decode_step_seconds(batch + 1, **m)
    assert more >= one
    ceiling = throughput_ceiling(**{k: v for k, v in m.items() if k != "weight_bytes"})
    assert batch / one <= ceiling * (1 + 1e-9)


@settings(max_examples=200, deadline=None)
@given(machine)
def test_the_knee_is_where_arithmetic_catches_up_with_memory(m):
    knee = decode_knee(**m)
    f_pi = m["flops_per_token"] / m["flops_per_s"]
    nc_beta = m["cache_bytes_per_row"] / m["bytes_per_s"]
    if f_pi <= nc_beta:
        assert knee == math.inf
        return
    assume(f_pi > nc_beta * (1 + 1e-6))        # far enough from the edge for float rounding
    assert knee > 0
    memory = (m["weight_bytes"] + knee * m["cache_bytes_per_row"]) / m["bytes_per_s"]
    arithmetic = knee * m["flops_per_token"] / m["flops_per_s"]
    assert arithmetic == pytest.approx(memory, rel=1e-6)


def test_without_a_cache_the_knee_is_the_familiar_one():
    # B* = (W / β) · (π / f): 513 MB, 42 GB/s, 203 GFLOP/s, 277 MFLOP per token (section 7's numbers)
    knee = decode_knee(weight_bytes=513e6, flops_per_token=277e6, cache_bytes_per_row=0,
                       flops_per_s=203e9, bytes_per_s=42e9)
    assert knee == pytest.approx(513e6 / 42e9 * 203e9 / 277e6)


def test_a_long_context_has_no_knee_and_its_ceiling_is_the_cache():
    # 4,096 tokens of SmolLM2's float32 cache (46,080 bytes a token) read at 42 GB/s outlast 560 MFLOP at 203 GFLOP/s
    kw = dict(flops_per_token=560e6, cache_bytes_per_row=4096 * 46_080, flops_per_s=203e9, bytes_per_s=42e9)
    assert decode_knee(weight_bytes=513e6, **kw) == math.inf
    assert throughput_ceiling(**kw) == pytest.approx(42e9 / (4096 * 46_080))
    assert 1024 / decode_step_seconds(1024, weight_bytes=513e6, **kw) < throughput_ceiling(**kw)


def test_roofline_seconds_takes_the_slower_side():
    assert roofline_seconds(100, 10, flops_per_s=10, bytes_per_s=10) == 10
    assert roofline_seconds(10, 100, flops_per_s=10, bytes_per_s=10) == 10


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), float("inf"), "fast"])
def test_bad_machine_numbers_are_refused(bad):
    with pytest.raises(ValueError, match="flops_per_s must be a positive finite number"):
        roofline_seconds(1, 1, flops_per_s=bad, bytes_per_s=1)
    with pytest.raises(ValueError, match="bytes_per_s must be a positive finite number"):
        Accelerator("x", 1e12, bad, 0, "nowhere")


def test_a_batch_below_one_is_refused():
    with pytest.raises(ValueError, match="batch"):
        decode_step_seconds(0, weight_bytes=1, flops_per_token=1, cache_bytes_per_row=0, flops_per_s=1, bytes_per_s=1)


def test_reference_accelerators_carry_their_source_and_plausible_ridge_points():
    for a in REFERENCE_ACCELERATORS.values():
        assert a.source and any(ch.isdigit() for ch in a.source)
        assert 10 < a.ridge_point < 1000
    assert REFERENCE_ACCELERATORS["NVIDIA H100 SXM"].ridge_point == pytest.approx(295, rel=0.01)


def test_estimate_for_a_published_model_matches_the_hand_count():
    from kvlib.cache.model_shapes import model_shape
    shape, h100 = model_shape("Llama-3-8B"), REFERENCE_ACCELERATORS["NVIDIA H100 SXM"]
    est = estimate_decode(shape.config, shape.n_params, flops_per_s=h100.flops_per_s,
                          bytes_per_s=h100.bytes_per_s, context=1)
    # batch 1, bfloat16: 16.06 GB of weights at 3.35 TB/s is about 4.8 ms a token
    assert est.weight_bytes == 2 * 8_030_261_248
    assert est.step_seconds == pytest.approx(2 * 8_030_261_248 / 3.35e12, rel=1e-3)
    four_bit = estimate_decode(shape.config, shape.n_params, flops_per_s=h100.flops_per_s,
                               bytes_per_s=h100.bytes_per_s, weight_bits=4.5, context=1)
    assert four_bit.step_seconds == pytest.approx(est.step_seconds * 4.5 / 16, rel=1e-2)
    # a 32k-token context: 128 KiB per token in bfloat16 (GQA, 8 kv heads), 4 GiB per row
    long = estimate_decode(shape.config, shape.n_params, flops_per_s=h100.flops_per_s,
                           bytes_per_s=h100.bytes_per_s, context=32_768, batch=8)
    assert long.cache_bytes_per_row == 131_072 * 32_768
    assert long.knee == math.inf and long.ceiling == pytest.approx(3.35e12 / long.cache_bytes_per_row, rel=1e-3)
    assert long.tokens_per_second < long.ceiling


def test_estimate_rejects_bad_input():
    from kvlib.config import Config
    with pytest.raises(ValueError, match="weight_bits"):
        estimate_decode(Config.tiny(), 10, flops_per_s=1e9, bytes_per_s=1e9, weight_bits=0)
    with pytest.raises(ValueError, match="batch"):
        estimate_decode(Config.tiny(), 10, flops_per_s=1e9, bytes_per_s=1e9, batch=0)


# --- the measurements beside the roofline, on a tiny model -----------------------------------------

def test_steps_at_context_times_every_batch_beside_the_formula():
    from kvlib.cache import kv_bytes_per_token
    from kvlib.measure.experiments import steps_at_context
    from kvlib.measure.flops import step_flops
    from tests.tiny_models import tiny_model

    model, prompt = tiny_model(), list(range(1, 21))
    points = steps_at_context(model, prompt, [1, 3], n_steps=4, bandwidth=1e9, flops_per_s=1e9, progress=False)
    assert [p.batch for p in points] == [1, 3] and all(p.step_seconds > 0 for p in points)
    weights = sum(t.numel() * t.element_size() for t in model.parameters())
    context = len(prompt) + 2                                        # the middle of four steps
    for p in points:
        assert p.context == context
        assert p.roofline_seconds == pytest.approx(decode_step_seconds(
            p.batch, weight_bytes=weights, flops_per_token=step_flops(model.config, context, 1).total,
            cache_bytes_per_row=context * kv_bytes_per_token(model.config), flops_per_s=1e9, bytes_per_s=1e9))
    with pytest.raises(ValueError, match="n_steps must be at least 2"):
        steps_at_context(model, prompt, [1], n_steps=1, bandwidth=1e9, flops_per_s=1e9)


def test_steps_at_context_decodes_what_generate_decodes():
    """The rows hold the prompt's real cache: the tokens the timed steps choose are generate's."""
    import kvlib
    from kvlib.measure.experiments import _prefilled
    from tests.tiny_models import tiny_model

    model, prompt = tiny_model(), [5, 9, 2, 33, 7, 1]
    one, ids = _prefilled(model, prompt)
    cache, ids, chosen = one.tiled(2, room=3), ids.repeat(2, 1), []
    with torch.no_grad():
        for _ in range(3):
            chosen.append(ids[:, 0].tolist())
            ids = model(ids, cache, last_only=True).argmax(-1)
    want = list(kvlib.generate(model, prompt, 3))
    assert [row[0] for row in chosen] == want and [row[1] for row in chosen] == want


def test_step_profile_splits_a_step_into_its_operators():
    from kvlib.measure.experiments import STEP_PARTS, step_profile
    from tests.tiny_models import tiny_model

    profile = step_profile(tiny_model(), list(range(1, 11)), [1, 2], n_steps=2)
    assert list(profile) == [1, 2]
    for parts in profile.values():
        assert list(parts) == [*STEP_PARTS, "other operators"]
        assert parts["matrix products"] > 0 and parts["attention"] > 0 and parts["other operators"] >= 0


def test_step_profile_prints_nothing_to_stderr(capfd):
    """The profiler's own start and stop lines (stamped with the time) would differ on every run
    of a notebook: step_profile keeps them out of its cell's output."""
    from kvlib.measure.experiments import step_profile
    from tests.tiny_models import tiny_model

    step_profile(tiny_model(), list(range(1, 6)), [1], n_steps=2)
    assert "profiler" not in capfd.readouterr().err


def test_step_profile_takes_the_median_step_after_a_warm_up(monkeypatch):
    """One slow profiled step (a busy machine, a one-off cost) does not move a batch's figures:
    the batch's parts are those of its median step."""
    from kvlib.measure import experiments
    from tests.tiny_models import tiny_model

    model = tiny_model()
    calls, real, big = [], model.forward, torch.ones(256, 256)

    def slow_first(*args, **kwargs):
        calls.append(1)
        if len(calls) == 5:                      # the first profiled step (after the prefill, throwaway, 2 warm-ups)
            for _ in range(40):
                torch.mm(big, big)               # ~1.3 GFLOP of matrix products in this step alone
        return real(*args, **kwargs)

    monkeypatch.setattr(model, "forward", slow_first)
    profile = experiments.step_profile(model, list(range(1, 11)), [1], n_steps=3, warmup=2)
    assert len(calls) == 1 + 1 + 2 + 3          # the prefill, the throwaway, the warm-up, the profiled steps
    calls.clear()
    slow = experiments.step_profile(model, list(range(1, 11)), [1], n_steps=1, warmup=2)    # only the slow step
    assert profile[1]["matrix products"] < slow[1]["matrix products"] / 3   # the median step, not the slow one
    with pytest.raises(ValueError, match="n_steps"):
        experiments.step_profile(model, [1, 2], [1], n_steps=0)


def test_grew_most_names_the_part_or_none():
    from kvlib.measure.experiments import grew_most

    before = {"matrix products": 0.035, "attention": 0.0034, "other operators": 0.0085}
    assert grew_most(before, {"matrix products": 0.050, "attention": 0.004, "other operators": 0.009}) \
        == "matrix products"
    assert grew_most(before, {"matrix products": 0.036, "attention": 0.0034, "other operators": 0.012}) \
        == "other operators"
    # every part fell (the stored Xeon run's first profile): nothing grew, whatever fell least
    assert grew_most(before, {"matrix products": 0.0219, "attention": 0.0013, "other operators": 0.0071}) is None
    assert grew_most(before, dict(before)) is None


@pytest.mark.parametrize("ratios, words", [
    ((1.1, 1.1, 1.8, 3.3), "2 and 3 rows cost about what 1 row costs; from 4 rows"),       # the Xeon's MKL
    ((1.0, 1.1, 1.2, 1.9), "2, 3 and 4 rows cost about what 1 row costs"),
    ((2.1, 2.8, 2.3, 2.8), "2 and 3 rows cost about a pass each; 4 rows cost less than 3"),  # the AVX2 EPYC's
    ((2.0, 3.0, 4.0, 8.0), "each row costs about a pass of its own"),
    ((1.5, 1.9, 2.2, 3.0), "each extra row costs a part of a pass"),
])
def test_few_rows_pattern_classifies_the_measured_shapes(ratios, words):
    from kvlib.measure.experiments import few_rows_pattern

    seconds = {1: 0.01, **{rows: 0.01 * r for rows, r in zip((2, 3, 4, 8), ratios)}}
    assert few_rows_pattern(seconds).startswith(words)


def test_row_cost_is_the_step_and_the_cache_of_one_row():
    from kvlib.cache import kv_bytes_per_token
    from kvlib.config import Config
    from kvlib.measure.flops import step_flops
    from kvlib.measure.roofline import row_cost

    cfg = Config.smollm2_135m()
    row = row_cost(cfg, 4096, torch.float32)
    assert row == {"flops_per_token": step_flops(cfg, 4096, 1).total, "cache_bytes_per_row": 46_080 * 4096}
    assert row_cost(cfg, 10, 1)["cache_bytes_per_row"] == kv_bytes_per_token(cfg, 1) * 10
