"""The checks of Exercises 2.1, 2.2, 3.1 and 3.2 pass the reference and catch the usual mistakes."""
from __future__ import annotations

import math

import pytest
import torch

import kvlib
import kvlib.exercises as ex
from kvlib.attention import causal_attention
from kvlib.exercises import CheckFailed
from kvlib.exercises import attention as att
from kvlib.exercises import kv_cache as kvc
from kvlib.rope import RotaryEmbedding

NOT_WRITTEN = "not written yet"


def _not_written(*args, **kwargs):
    raise NotImplementedError("Exercise: write me")


# --- the references agree with kvlib ---------------------------------------------------------

def test_attention_references_agree_with_kvlib():
    g = torch.Generator().manual_seed(0)
    q, k, v = torch.randn(2, 6, 7, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g), torch.randn(2, 3, 7, 4, generator=g)
    torch.testing.assert_close(att._gqa_attention(q, k, v), causal_attention(q, k, v))
    torch.testing.assert_close(att._one_head_causal_attention(q[0, 0], k[0, 0], v[0, 0]),
                               causal_attention(q[:1, :1], k[:1, :1], v[:1, :1])[0, 0])


@pytest.mark.parametrize("offset, seq, theta", [(0, 5, 10_000.0), (7, 1, 10_000.0), (100, 3, 100_000.0)])
def test_rope_reference_agrees_with_kvlib(offset, seq, theta):
    x = torch.randn(2, 3, seq, 8)
    expected = RotaryEmbedding(8, offset + seq, theta)(x, offset)
    torch.testing.assert_close(kvc._rope_rotate(x, offset, theta), expected)


def test_checks_are_found_by_name():
    names = set(ex.all_checks())
    assert {"check_one_head_causal_attention", "check_gqa_attention", "check_sliding_window_attention",
            "check_which_outputs_change", "check_cached_attention_step", "check_rope_rotate",
            "check_rope_rotate_qk", "check_cache_prediction"} <= names
    assert ex.check_rope_rotate is kvc.check_rope_rotate


# --- Exercise 2.1 ----------------------------------------------------------------------------

def test_one_head_reference_passes(capsys):
    att.check_one_head_causal_attention(att._one_head_causal_attention)
    assert "✓ Exercise 2.1: all 4 cases pass" in capsys.readouterr().out


def test_one_head_written_with_tril_passes(capsys):
    def student(q, k, v):
        scores = q @ k.T / math.sqrt(q.shape[-1])
        allowed = torch.ones(len(q), len(k), dtype=torch.bool).tril()
        return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v
    att.check_one_head_causal_attention(student)
    assert "✓ Exercise 2.1" in capsys.readouterr().out


@pytest.mark.parametrize("stub, match", [
    (lambda q, k, v: torch.zeros_like(q), r"case 1 of 4 .* values differ"),
    (lambda q, k, v: v, r"case 1 of 4 .* values differ"),
    (lambda q, k, v: (q @ k.T).softmax(-1), r"expected shape \(5, 4\), got shape \(5, 5\)"),
    (_not_written, NOT_WRITTEN),
])
def test_one_head_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        att.check_one_head_causal_attention(stub)


@pytest.mark.parametrize("wrong, match", [
    (dict(scale=False), r"not scaled"),
    (dict(mask_diagonal=0), r"NaN or infinity[\s\S]*hides the diagonal"),
    (dict(mask_diagonal=2), r"one step too generous"),
    (dict(mask_diagonal=None), r"no causal mask"),
    (dict(softmax_dim=-2), r"softmax runs over the wrong dimension"),
    (dict(softmax_dim=0), r"softmax runs over the wrong dimension"),
])
def test_one_head_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 2.1: case \d of 4 [\s\S]*" + match):
        att.check_one_head_causal_attention(lambda q, k, v: att._attend(q, k, v, **wrong))


def test_one_head_keys_and_values_swapped_is_named():
    with pytest.raises(CheckFailed, match="keys and values are swapped"):
        att.check_one_head_causal_attention(lambda q, k, v: att._attend(q, v, k))


def test_one_head_student_error_is_reported_briefly():
    with pytest.raises(CheckFailed, match=r"case 1 of 4 .* raised RuntimeError"):
        att.check_one_head_causal_attention(lambda q, k, v: q @ k)       # (5, 4) @ (5, 4)


# --- Exercise 2.2 ----------------------------------------------------------------------------

def gqa_attention(q, k, v):
    """The notebook's solution: the group folded into the rows of the queries, nothing copied."""
    b, n_heads, n, d = q.shape
    n_kv = k.shape[1]
    group = n_heads // n_kv
    rows = q.reshape(b, n_kv, group * n, d)
    scores = (rows @ k.transpose(-2, -1) / math.sqrt(d)).view(b, n_kv, group, n, n)
    future = torch.ones(n, n, dtype=torch.bool).triu(diagonal=1)
    weights = scores.masked_fill(future, float("-inf")).softmax(dim=-1).view(b, n_kv, group * n, n)
    return (weights @ v).reshape(b, n_heads, n, d)


def test_gqa_without_copies_passes(capsys):
    att.check_gqa_attention(gqa_attention)
    out = capsys.readouterr().out
    assert "✓ Exercise 2.2: all 5 cases pass" in out and "No key or value was copied" in out


def _broadcast(q, k, v):
    b, n_heads, n, d = q.shape
    qg = q.reshape(b, k.shape[1], n_heads // k.shape[1], n, d)
    return att._attend(qg, k[:, :, None], v[:, :, None]).reshape(b, n_heads, n, d)


def _expanded(q, k, v):
    g = q.shape[1] // k.shape[1]
    grow = lambda t: t[:, :, None].expand(-1, -1, g, -1, -1).contiguous().flatten(1, 2)   # noqa: E731
    return att._attend(q, grow(k), grow(v))


def _indexed(q, k, v):
    idx = torch.arange(q.shape[1]) // (q.shape[1] // k.shape[1])
    return att._attend(q, k[:, idx], v[:, idx])


@pytest.mark.parametrize("copying, op", [
    (att._gqa_attention, r"aten\.(repeat_interleave|clone|index_select|index)"),        # repeat_interleave
    (lambda q, k, v: att._attend(q, *(t.repeat_interleave(q.shape[1] // t.shape[1], dim=1) for t in (k, v))), r"aten\.\w+"),
    (_expanded, r"aten\.clone"),
    (_indexed, r"aten\.index"),
    (_broadcast, r"aten\.clone"),                  # torch.matmul copies the broadcast keys and values
])
def test_gqa_copies_fail_and_say_what_was_copied(copying, op):
    with pytest.raises(CheckFailed, match=r"Exercise 2.2: case 1 of 5 \(batch 1, 4 query heads sharing 2 kv heads, 6 tokens\): "
                                          r"the result may be right, but the keys k \(shape \(1, 2, 6, 4\)\) were copied "
                                          r"to shape \([\d, ]+\) by " + op + r"[\s\S]*2 copies[\s\S]*hint: view the queries"):
        att.check_gqa_attention(copying)


@pytest.mark.parametrize("stub, match", [
    (lambda q, k, v: torch.zeros_like(q), r"case 1 of 5 .* values differ"),
    (lambda q, k, v: v, r"case 1 of 5 .* expected shape \(1, 4, 6, 4\), got shape \(1, 2, 6, 4\)"),
    (lambda q, k, v: q, r"case 1 of 5 .* values differ"),
    (_not_written, NOT_WRITTEN),
])
def test_gqa_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        att.check_gqa_attention(stub)


@pytest.mark.parametrize("wrong, match", [
    (dict(tiled=True), r"wrong key/value heads"),
    (dict(scale=False), r"not scaled"),
    (dict(mask_diagonal=0), r"hides the diagonal"),
    (dict(mask_diagonal=2), r"one step too generous"),
    (dict(mask_diagonal=None), r"no causal mask"),
    (dict(softmax_dim=-2), r"wrong dimension"),
])
def test_gqa_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 2.2: [\s\S]*" + match):
        att.check_gqa_attention(lambda q, k, v: att._gqa_attention(q, k, v, **wrong))


def test_gqa_keys_and_values_swapped_is_named():
    with pytest.raises(CheckFailed, match="keys and values are swapped"):
        att.check_gqa_attention(lambda q, k, v: att._gqa_attention(q, v, k))


def test_gqa_that_ignores_the_groups_fails_on_shapes():
    # multi-head attention without expanding k, v: breaks as soon as kv_heads < heads
    with pytest.raises(CheckFailed, match=r"case 1 of 5 .* raised RuntimeError"):
        att.check_gqa_attention(lambda q, k, v: att._attend(q, k, v))


# --- Exercise 3.1 ----------------------------------------------------------------------------

def test_cached_step_reference_passes(capsys):
    kvc.check_cached_attention_step(kvc._cached_attention_step)
    assert "✓ Exercise 3.1: all 4 cases pass" in capsys.readouterr().out


def test_cached_step_matches_full_causal_attention():
    """The cached step is attention's last row: grow a cache token by token, compare with one full pass."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 8, generator=g)
    wq, wk, wv = (torch.randn(8, 4, generator=g) for _ in range(3))
    full = att._one_head_causal_attention(x @ wq, x @ wk, x @ wv)
    k_cache = v_cache = torch.empty(0, 4)
    for t in range(6):
        out, k_cache, v_cache = kvc._cached_attention_step(x[t:t + 1], wq, wk, wv, k_cache, v_cache)
        torch.testing.assert_close(out[0], full[t])


@pytest.mark.parametrize("stub, match", [
    (lambda x, wq, wk, wv, kc, vc: (torch.zeros(1, wq.shape[1]), torch.zeros(len(kc) + 1, wq.shape[1]),
                                    torch.zeros(len(vc) + 1, wq.shape[1])), r"case 1 of 4 .* values differ"),
    (lambda x, wq, wk, wv, kc, vc: (x, kc, vc), r"case 1 of 4 .* result 0: expected shape \(1, 4\), got shape \(1, 8\)"),
    (lambda x, wq, wk, wv, kc, vc: x @ wv, r"expected 3 results"),
    (_not_written, NOT_WRITTEN),
])
def test_cached_step_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        kvc.check_cached_attention_step(stub)


@pytest.mark.parametrize("wrong, match", [
    (dict(include_new=False), r"own key and value are left out"),
    (dict(prepend=True), r"case 2 of 4 [\s\S]*result 1: [\s\S]*put in front of the cache"),
    (dict(scale=False), r"not scaled"),
    (dict(swap_kv=True), r"keys and values are swapped"),
    (dict(swap_returned=True), r"wrong order"),
    (dict(softmax_dim=0), r"wrong dimension"),
])
def test_cached_step_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 3.1: [\s\S]*" + match):
        kvc.check_cached_attention_step(lambda *a: kvc._cached_attention_step(*a, **wrong))


def test_cached_step_that_forgets_to_grow_the_cache_fails():
    def student(x_new, wq, wk, wv, k_cache, v_cache):
        out, _, _ = kvc._cached_attention_step(x_new, wq, wk, wv, k_cache, v_cache)
        return out, k_cache, v_cache
    with pytest.raises(CheckFailed, match=r"result 1: expected shape \(1, 4\), got shape \(0, 4\)"):
        kvc.check_cached_attention_step(student)


# --- Exercise 3.2 ----------------------------------------------------------------------------

def test_rope_reference_passes(capsys):
    kvc.check_rope_rotate(kvc._rope_rotate)
    assert "✓ Exercise 3.2: all 4 cases pass" in capsys.readouterr().out


def test_rope_with_float32_tables_passes(capsys):
    def student(x, offset, theta=10_000.0):
        seq, d = x.shape[-2], x.shape[-1]
        inv_freq = theta ** (-torch.arange(0, d, 2).float() / d)
        angles = torch.outer(torch.arange(offset, offset + seq).float(), inv_freq)
        angles = torch.cat([angles, angles], dim=-1)
        x1, x2 = x.chunk(2, dim=-1)
        return x * angles.cos() + torch.cat([-x2, x1], dim=-1) * angles.sin()
    kvc.check_rope_rotate(student)
    assert "✓ Exercise 3.2" in capsys.readouterr().out


def test_the_buggy_rope_of_the_exercise_is_caught_on_the_decode_case():
    buggy = lambda x, offset, theta=10_000.0: kvc._rope_rotate(        # noqa: E731
        x, offset, theta, positions=torch.arange(x.shape[-2], dtype=torch.float64))
    with pytest.raises(CheckFailed, match=r"case 2 of 4 \(decode: one token at position 5\)[\s\S]*"
                                          r"position offset is forgotten"):
        kvc.check_rope_rotate(buggy)


@pytest.mark.parametrize("stub, match", [
    (lambda x, offset, theta=10_000.0: torch.zeros_like(x), r"case 1 of 4 .* values differ"),
    (lambda x, offset, theta=10_000.0: x, r"case 1 of 4 [\s\S]*comes back unrotated"),
    (_not_written, NOT_WRITTEN),
])
def test_rope_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        kvc.check_rope_rotate(stub)


@pytest.mark.parametrize("wrong, match", [
    (lambda x, o, t: torch.arange(o + 1, o + 1 + x.shape[-2], dtype=torch.float64), r"off by one"),
    # at offset 0 every token at position 0 is no rotation at all, which the prefill case shows first
    (lambda x, o, t: torch.full((x.shape[-2],), float(o)), r"case 1 of 4 [\s\S]*unrotated, as if every token"),
])
def test_rope_wrong_positions_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        kvc.check_rope_rotate(lambda x, offset, theta=10_000.0: kvc._rope_rotate(
            x, offset, theta, positions=wrong(x, offset, theta)))


@pytest.mark.parametrize("wrong, match", [
    (dict(sign=-1.0), r"wrong way"),
    (dict(interleaved=True), r"neighbouring channels"),
])
def test_rope_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=match):
        kvc.check_rope_rotate(lambda x, offset, theta=10_000.0: kvc._rope_rotate(x, offset, theta, **wrong))


def test_rope_ignoring_theta_fails_on_the_last_case():
    with pytest.raises(CheckFailed, match=r"case 4 of 4 [\s\S]*theta is ignored"):
        kvc.check_rope_rotate(lambda x, offset, theta=10_000.0: kvc._rope_rotate(x, offset))



# --- Exercise 2.1 (since issue 17): sliding-window attention --------------------------------

def sliding_window_attention(q, k, v, window):
    n = len(q)
    i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
    hidden = (j > i) | (j <= i - window)
    scores = q @ k.T / math.sqrt(q.shape[-1])
    return scores.masked_fill(hidden, float("-inf")).softmax(dim=-1) @ v


def test_sliding_reference_passes_and_agrees_with_kvlib(capsys):
    att.check_sliding_window_attention(sliding_window_attention)
    att.check_sliding_window_attention(att._sliding)
    assert capsys.readouterr().out.count("✓ Exercise 2.1: all 5 cases pass") == 2
    q, k, v = att._qkv(5, 9, 4)
    torch.testing.assert_close(att._sliding(q, k, v, 9), att._attend(q, k, v))       # a long window: causal
    torch.testing.assert_close(att._sliding(q, k, v, 1), v)                           # window 1: itself


@pytest.mark.parametrize("wrong, match", [
    (dict(lo_shift=-1), r"window \+ 1 keys"),
    (dict(lo_shift=+1), r"window - 1 keys"),
    (dict(causal=False), r"the window is not causal"),
    (dict(scale=False), r"not scaled"),
])
def test_sliding_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 2.1: case 1 of 5 [\s\S]*known slip: [^\n]*" + match):
        att.check_sliding_window_attention(lambda q, k, v, w: att._sliding(q, k, v, w, **wrong))


def test_sliding_that_ignores_the_window_is_named():
    with pytest.raises(CheckFailed, match=r"case 1 of 5 [\s\S]*the window is ignored"):
        att.check_sliding_window_attention(lambda q, k, v, w: att._attend(q, k, v))


@pytest.mark.parametrize("stub, match", [(_not_written, NOT_WRITTEN), (lambda q, k, v, w: v, r"case 1 of 5 .* values differ")])
def test_sliding_stubs_fail(stub, match):
    with pytest.raises(CheckFailed, match=match):
        att.check_sliding_window_attention(stub)


# --- Exercise 2.4: which outputs change ----------------------------------------------------------

def test_which_outputs_change_grades_every_letter(capsys):
    att.check_which_outputs_change(lambda: "b")
    att.check_which_outputs_change(lambda: " B ")
    assert capsys.readouterr().out.count("✓ Exercise 2.4: (b) is right. The causal mask") == 2
    for letter, why in [("a", "never read position 5's"), ("c", "which attend to position 5, change too"),
                        ("d", "a new token there gives a new state")]:
        with pytest.raises(CheckFailed, match=rf"Exercise 2.4: \({letter}\) is not it\. [\s\S]*{why}"):
            att.check_which_outputs_change(lambda: letter)
    with pytest.raises(CheckFailed, match=NOT_WRITTEN):
        att.check_which_outputs_change(_not_written)
    with pytest.raises(CheckFailed, match="choose one of"):
        att.check_which_outputs_change(lambda: None)


def test_which_outputs_change_the_experiment_agrees():
    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8]])
    changed = ids.clone()
    changed[0, 5] = 40
    with torch.no_grad():
        moved = (model(ids) - model(changed)).abs().amax(dim=-1)[0]
    assert [i for i, m in enumerate(moved.tolist()) if m > 1e-5] == [5, 6, 7]


# --- Exercise 3.2 (since issue 17): find the bug, right prefill, wrong decode -------------------

def rope_rotate_qk(q, k, offset, theta=10_000.0):
    return kvc._rope_rotate(q, offset, theta), kvc._rope_rotate(k, offset, theta)


def test_rope_qk_reference_passes_and_agrees_with_kvlib(capsys):
    kvc.check_rope_rotate_qk(rope_rotate_qk)
    assert "✓ Exercise 3.2: all 4 cases pass" in capsys.readouterr().out
    for case in kvc._qk_cases():
        q, k, offset = case.args
        rope = RotaryEmbedding(q.shape[-1], offset + q.shape[-2], case.kwargs["theta"])
        torch.testing.assert_close(case.expected[0], rope(q, offset))
        torch.testing.assert_close(case.expected[1], rope(k, offset))


def test_the_buggy_rotation_of_the_exercise_passes_the_prefill_and_is_named_on_decode():
    buggy = lambda q, k, offset, theta=10_000.0: kvc._rope_rotate_qk(q, k, offset, theta, k_start=0)   # noqa: E731
    prefill = kvc._qk_cases()[0]
    torch.testing.assert_close(buggy(*prefill.args, **prefill.kwargs), prefill.expected)
    with pytest.raises(CheckFailed, match=r"Exercise 3.2: case 2 of 4 \(decode: one token at position 5\) is wrong[\s\S]*"
                                          r"known slip: the queries are rotated at offset, offset \+ 1, ..., but the keys at 0"):
        kvc.check_rope_rotate_qk(buggy)


@pytest.mark.parametrize("wrong, match", [
    (dict(q_start=0), r"now the keys are rotated at offset, but the queries at 0"),
    (dict(q_start=0, k_start=0), r"neither queries nor keys get the offset"),
])
def test_rope_qk_usual_mistakes_are_named(wrong, match):
    with pytest.raises(CheckFailed, match=r"Exercise 3.2: case 2 of 4 [\s\S]*" + match):
        kvc.check_rope_rotate_qk(lambda q, k, offset, theta=10_000.0: kvc._rope_rotate_qk(q, k, offset, theta, **wrong))


def test_rope_qk_offset_twice_and_swapped_results_are_named():
    with pytest.raises(CheckFailed, match=r"the keys get the offset twice"):
        kvc.check_rope_rotate_qk(lambda q, k, o, theta=10_000.0: kvc._rope_rotate_qk(q, k, o, theta, k_start=2 * o))
    with pytest.raises(CheckFailed, match=r"case 1 of 4 [\s\S]*wrong order"):
        kvc.check_rope_rotate_qk(lambda q, k, o, theta=10_000.0: rope_rotate_qk(q, k, o, theta)[::-1])


def test_rope_qk_stub_fails():
    with pytest.raises(CheckFailed, match=NOT_WRITTEN):
        kvc.check_rope_rotate_qk(_not_written)


# --- Exercise 3.3: the cache, predicted then measured ------------------------------------------

RIGHT = {"pos": 15, "bytes in use": 3_840, "bytes allocated": 16_384, "pos after kvlib.generate": 14}


def test_cache_prediction_right_passes(capsys):
    kvc.check_cache_prediction(lambda: dict(RIGHT))
    out = capsys.readouterr().out
    assert "✓ Exercise 3.3: you predicted 15 for 'pos'; it is 15" in out
    assert "✓ Exercise 3.3: you predicted 14 for 'pos after kvlib.generate'; it is 14" in out


@pytest.mark.parametrize("key, value, match", [
    ("pos after kvlib.generate", 15, r"too high[\s\S]*the last one is never fed back in"),
    ("bytes allocated", 3_840, r"too low[\s\S]*allocated for all max_len positions"),
    ("bytes in use", 7_680, r"too high[\s\S]*the query heads are not cached"),
    ("pos", 10, r"too low[\s\S]*each decode step one more"),
])
def test_cache_prediction_wrong_answers_say_why(key, value, match):
    with pytest.raises(CheckFailed, match=rf"Exercise 3.3: you predicted [\d.,e+]+ for '{key}'[\s\S]*" + match):
        kvc.check_cache_prediction(lambda: {**RIGHT, key: value})


def test_cache_prediction_stub_and_malformed_answers_fail():
    with pytest.raises(CheckFailed, match=NOT_WRITTEN):
        kvc.check_cache_prediction(_not_written)
    with pytest.raises(CheckFailed, match=r"return a dict with the keys 'pos'"):
        kvc.check_cache_prediction(lambda: 15)
    with pytest.raises(CheckFailed, match=r"write your prediction of 'pos' first"):
        kvc.check_cache_prediction(lambda: {**RIGHT, "pos": ...})
