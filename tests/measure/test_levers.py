"""kvlib.measure.levers: the chapter's levers applied one after another to one scenario."""
from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from kvlib.cache.model_shapes import MODEL_SHAPES
from kvlib.measure.levers import (LEVERS, WEIGHT_BITS, Scenario, best_lever, cache_bits, format_levers, levers,
                                  scenario_notes)
from kvlib.measure.flops import step_flops
from kvlib.measure.roofline import REFERENCE_ACCELERATORS, Accelerator
from kvlib.measure.speculation import tokens_per_step


@st.composite
def scenarios(draw) -> Scenario:
    context = draw(st.integers(min_value=2, max_value=131_072))
    return Scenario(draw(st.sampled_from(sorted(MODEL_SHAPES))), draw(st.sampled_from(sorted(REFERENCE_ACCELERATORS))),
                    users=draw(st.integers(min_value=1, max_value=4096)), context=context,
                    shared_prefix=draw(st.integers(min_value=0, max_value=context - 1)),
                    alpha=draw(st.floats(min_value=0, max_value=1)), drafts=draw(st.integers(min_value=1, max_value=8)))


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_no_lever_before_speculation_costs_memory_and_the_batch_never_shrinks(s):
    rows = levers(s)
    assert [r.lever for r in rows] == list(LEVERS)
    held = [r.weight_bytes + r.shared_bytes / s.users + r.cache_bytes_per_user for r in rows]
    for before, after in zip(rows[:-2], rows[1:-1]):                       # (a) .. (e)
        assert after.cache_bytes_per_user <= before.cache_bytes_per_user
        assert after.weight_bytes <= before.weight_bytes
        assert after.fit >= before.fit and after.batch >= before.batch
    assert all(b <= a * (1 + 1e-12) for a, b in zip(held[:4], held[1:5]))  # memory per user, shared prompt spread
    for r in rows:
        assert r.batch == min(s.users, r.fit) and r.fit >= 0
        assert (r.step_seconds is None) == (r.batch == 0)
        assert r.tokens_per_second == pytest.approx(r.batch * r.tokens_per_second_per_user)


@settings(max_examples=300, deadline=None)
@given(scenarios())
def test_the_users_that_fit_fill_the_memory_and_no_more(s):
    for r in levers(s):
        left = s.machine.memory_bytes - r.weight_bytes - r.shared_bytes
        assert r.fit == 0 or r.fit * r.cache_bytes_per_user <= left * (1 + 1e-12)
        assert (r.fit + 1) * r.cache_bytes_per_user > left * (1 - 1e-12)


@settings(max_examples=200, deadline=None)
@given(scenarios())
def test_speculation_writes_the_formulas_tokens_per_verify_step(s):
    e, f = levers(s)[-2:]
    assert e.tokens_per_step == 1.0
    assert f.tokens_per_step == pytest.approx(tokens_per_step(s.alpha, s.drafts))
    assert 1.0 <= f.tokens_per_step <= s.drafts + 1
    assert f.cache_bytes_per_user > e.cache_bytes_per_user                 # the drafts wait in the cache
    if f.batch and e.batch == f.batch:                                     # the same rows, k + 1 tokens each
        assert f.step_seconds >= e.step_seconds


H100 = REFERENCE_ACCELERATORS["NVIDIA H100 SXM"]


def test_a_hand_count_llama_3_8b_on_an_h100():
    s = Scenario("Llama-3-8B", H100, users=32, context=8192, shared_prefix=1024, alpha=0.7, drafts=4)
    a, b, c, d, e, f = levers(s)
    # 2 (keys, values) × 32 layers × 32 heads × 128 × 2 bytes = 524,288 bytes per token; with GQA 8 heads: 131,072
    assert a.kv_heads == 32 and a.cache_bytes_per_user == 524_288 * 8192
    assert b.kv_heads == 8 and b.cache_bytes_per_user == 131_072 * 8192
    # 8-bit: 65,536 numbers per token, each 8 bits plus a 32-bit scale per 128 numbers = 8.25 bits
    assert cache_bits(s.shape) == 8.25 and c.cache_bytes_per_user == 65_536 * 8.25 / 8 * 8192
    assert a.weight_bytes == 8_030_261_248 * 2 and WEIGHT_BITS == 5.0 and d.weight_bytes == 8_030_261_248 * 5 / 8
    # the weights leave 80e9 - 16.06e9 bytes: 14 users of 4.29 GB fit, so 14 of the 32 run
    assert (a.fit, a.batch) == (14, 14) and math.floor((80e9 - a.weight_bytes) / a.cache_bytes_per_user) == 14
    assert (b.fit, b.batch) == (59, 32)
    assert e.shared_bytes == 1024 * 65_536 * 8.25 / 8 and e.cache_bytes_per_user == 7168 * 65_536 * 8.25 / 8
    assert f.cache_bytes_per_user == (7168 + 4) * 65_536 * 8.25 / 8
    assert f.tokens_per_step == pytest.approx((1 - 0.7 ** 5) / 0.3)
    # the roofline's step for the 32 rows of (b): all weights and 32 caches read once, memory-bound
    assert b.step_seconds == pytest.approx((a.weight_bytes + 32 * b.cache_bytes_per_user) / H100.bytes_per_s)
    assert b.bound == "memory" and 32 * step_flops(s.shape.config, 8192, 1).total / H100.flops_per_s < b.step_seconds
    assert [r.lever.section for r in (a, b, c, d, e, f)] == [7, 6, 6, 8, 9, 10]


def test_when_not_even_one_user_fits():
    s = Scenario("Llama-3-70B", "NVIDIA GeForce RTX 4090", users=8, context=8192)
    rows = levers(s)
    assert all(r.fit == 0 and r.batch == 0 and r.step_seconds is None and r.bound is None for r in rows)
    assert rows[0].tokens_per_second == 0
    assert any("not one user fits" in n for n in scenario_notes(s))
    assert "no user fits" in format_levers(rows)


def test_the_notes_name_a_context_past_the_models_and_a_sliding_window():
    assert any("released for 4,096 tokens" in n for n in scenario_notes(Scenario("Llama-2-7B", H100, 1, 8192)))
    assert any("sliding" in n or "last 4,096 tokens" in n for n in scenario_notes(Scenario("Mistral-7B", H100, 1, 2048)))
    assert scenario_notes(Scenario("Llama-3-8B", H100, 1, 2048)) == []


def test_a_measured_table_prints_times_and_rates_in_the_sanitized_forms():
    rows = levers(Scenario("SmolLM2-135M", Accelerator("this machine", 1e11, 3e10, 8 * 10 ** 9, "measured"), 8, 2048))
    text = format_levers(rows, measured=True)
    assert "bound" not in text and "memory" not in text and " ms " in text and "tok/s" in text
    assert "," not in text.split("\n")[1].split("tok/s")[0][-12:]       # rates without separators (one sanitized word)


@pytest.mark.parametrize("kwargs, message", [
    (dict(model="GPT-5"), "unknown model 'GPT-5': choose one of"),
    (dict(machine="TPU"), "unknown machine 'TPU'"),
    (dict(users=0), "users must be a positive int, got 0"),
    (dict(context=0), "context must be a positive int"),
    (dict(shared_prefix=8192), "shared_prefix=8,192 must be smaller than context=8,192"),
    (dict(shared_prefix=-1), "shared_prefix must be a non-negative int"),
    (dict(alpha=1.5), "alpha is the chance that a draft is accepted: a number from 0 to 1, got 1.5"),
    (dict(drafts=0), "drafts must be a positive int"),
])
def test_bad_input_says_what_is_wrong(kwargs, message):
    args = dict(model="Llama-3-8B", machine=H100, users=4, context=8192) | kwargs
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        Scenario(**args)


def test_a_machine_of_the_wrong_kind_and_a_scenario_of_the_wrong_kind():
    with pytest.raises(TypeError, match="machine must be an Accelerator"):
        Scenario("Llama-3-8B", 80e9, 1, 1024)
    with pytest.raises(TypeError, match="levers\\(\\) takes a Scenario"):
        levers(("Llama-3-8B", H100, 1, 1024))


def test_reading_the_shared_prefix_once_shortens_only_the_rows_that_share_it():
    """Cascade attention's assumption: from prefix reuse on, the shared prefix's cache is read once a
    step, not once a row. Rows (a)-(d) are the same; (e) and (f) no slower, and faster with many users;
    without a shared prefix nothing changes."""
    import dataclasses

    from kvlib.measure.levers import Scenario, levers

    s = Scenario("Llama-3-8B", "NVIDIA H100 SXM", users=32, context=8192, shared_prefix=1024)
    rows, once = levers(s), levers(dataclasses.replace(s, shared_read_once=True))
    assert [r.step_seconds for r in rows[:4]] == [r.step_seconds for r in once[:4]]
    assert all(o.step_seconds < r.step_seconds for r, o in zip(rows[4:], once[4:]))
    assert all(o.fit == r.fit and o.cache_bytes_per_user == r.cache_bytes_per_user for r, o in zip(rows, once))
    plain = dataclasses.replace(s, shared_prefix=0)
    same = zip(levers(plain), levers(dataclasses.replace(plain, shared_read_once=True)))
    assert all(a.step_seconds == b.step_seconds for a, b in same)


def test_a_verify_step_computes_the_logits_of_every_position():
    """The model's own token after the last accepted draft needs the logits after every draft, so a
    verify step's output layer runs at all k + 1 positions (formulas.md). On a machine whose steps
    all cost their arithmetic, row (f) takes the k + 1 tokens' full count, not the last position's
    output layer alone (what it took before: 4.45 plain steps instead of 5 for Llama-3-8B)."""
    arithmetic_only = Accelerator("arithmetic only", 1e12, 1e30, 10 ** 12, "made up")
    s = Scenario("Llama-3-8B", arithmetic_only, users=4, context=8192, drafts=4)
    e, f = levers(s)[-2:]
    cfg = s.shape.config
    assert f.flops_per_row == step_flops(cfg, 8192 + 4, 5, last_only=False).total
    assert f.step_seconds == pytest.approx(4 * step_flops(cfg, 8196, 5, last_only=False).total / 1e12)
    assert f.step_seconds / e.step_seconds == pytest.approx(5, rel=1e-3)
    # past the knee the speed-up is the tokens a step writes over the k + 1 it computes (exercise 11.3)
    assert f.tokens_per_second / e.tokens_per_second == pytest.approx(tokens_per_step(0.7, 4) / 5, rel=1e-3)


def test_the_step_reads_and_computes_what_the_roofline_times():
    """What a row's step reads (the weights once, each row's whole cache, the drafts included) and
    computes gives its time and, against the ridge point, its bound."""
    s = Scenario("SmolLM2-135M", Accelerator("a CPU", 3e11, 3e10, 4 * 10 ** 9, "made up"), 8, 2048, 512)
    for r in levers(s):
        drafts = 4 if r.lever.key == "f" else 0
        per_token = r.cache_bytes_per_user / (2048 - (512 if r.shared_bytes else 0) + drafts)
        assert r.step_bytes == pytest.approx(r.weight_bytes + 8 * (2048 + drafts) * per_token)
        assert r.step_seconds == pytest.approx(max(r.step_bytes / 3e10, r.step_flops / 3e11))
        assert (r.bound == "compute") == (r.intensity > 3e11 / 3e10)       # the ridge point, FLOP per byte


def test_float32_rows_for_a_cpu_without_bfloat16_arithmetic():
    """dense_bits=32 prices rows (a)-(c) in float32 (what kvlib computes in there); the 4-bit weights
    and the 8-bit cache of the later rows are the same either way."""
    cpu = Accelerator("a CPU", 3e11, 3e10, 4 * 10 ** 9, "made up")
    half, full = (levers(Scenario("SmolLM2-135M", cpu, 8, 2048, 512, dense_bits=b)) for b in (16, 32))
    assert full[0].lever.name == "float32 weights and cache, no GQA" and full[0].lever.key == "a"
    assert [r.lever for r in full[1:]] == list(LEVERS[1:])
    for h, f in zip(half[:3], full[:3]):
        assert f.weight_bytes == 2 * h.weight_bytes
    assert full[0].cache_bytes_per_user == 2 * half[0].cache_bytes_per_user
    assert all(h.weight_bytes == f.weight_bytes and h.cache_bytes_per_user == f.cache_bytes_per_user
               for h, f in zip(half[3:], full[3:]))
    with pytest.raises(ValueError, match="dense_bits is 16 \\(bfloat16\\) or 32"):
        Scenario("SmolLM2-135M", cpu, 8, 2048, dense_bits=8)


def test_the_best_lever_is_the_largest_gain_of_b_to_e():
    rows = levers(Scenario("Llama-3-8B", H100, users=32, context=8192, shared_prefix=1024))
    gain, lever = best_lever(rows)
    gains = [b.tokens_per_second / a.tokens_per_second for a, b in zip(rows[:4], rows[1:5])]
    assert gain == max(gains) and lever == rows[1 + gains.index(max(gains))].lever and lever.key == "b"
    gain, lever = best_lever(levers(Scenario("Llama-2-7B", H100, users=24, context=4096, shared_prefix=1024)))
    assert lever.key == "c" and gain > 1.5
