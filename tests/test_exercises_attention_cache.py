"""The checks of Exercises 2.1, 2.2, 3.1 and 3.2 pass the reference and catch the usual mistakes."""
from __future__ import annotations

import math

import pytest
import torch

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
    assert {"check_one_head_causal_attention", "check_gqa_attention",
            "check_cached_attention_step", "check_rope_rotate"} <= names
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

def test_gqa_reference_passes(capsys):
    att.check_gqa_attention(att._gqa_attention)
    assert "✓ Exercise 2.2: all 5 cases pass" in capsys.readouterr().out


def test_gqa_with_pytorch_sdpa_passes(capsys):
    sdpa = torch.nn.functional.scaled_dot_product_attention
    att.check_gqa_attention(lambda q, k, v: sdpa(q, k, v, is_causal=True, enable_gqa=True))
    assert "✓ Exercise 2.2" in capsys.readouterr().out


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
