"""kvlib's paged attention (kvlib.fast.paged_attention, ``paged_attention.cpp``): the attention of
PyTorch on the gathered keys, to float32 rounding, for any grouping, lengths, slots and queries a request;
the engine with it chooses the tokens of the engine without it, compiled or not; bad input is named;
and a kernel that reads one key too many is caught by the engine's test."""
from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlib.attention import attention
from kvlib.fast import kernels, paged_attention
from kvlib.serve import Request, serve
from kvlib.serve.runner import gather
from tiny_models import tiny_model

from serve.test_engine import engine_kwargs, step_clock, workloads
from tiny_models import tiny_model

pytestmark = pytest.mark.skipif(kernels.kernels_missing() is not None,
                                reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")


def reference(q, k_pool, v_pool, context, lengths, row=None):
    """PyTorch's attention of each query over its request's gathered keys: ``(n, heads, head_dim)``."""
    context = context if row is None else context[row]                    # (n, k_len): each query's request
    keys = torch.arange(context.shape[1])
    k_pos = torch.where(keys < lengths[:, None], keys, -1)
    return attention(q[:, :, None], gather(k_pool, context), gather(v_pool, context), (lengths - 1)[:, None],
                     k_pos)[:, :, 0]


# float32 rounding: over 3,000 random cases of the prefilling test's kind (2026-12-06), the kernel's
# largest difference from a float64 reference was 2.6e-06 (PyTorch's float32 attention's, 2.6e-06
# too); allowed: 1e-05. A key read wrongly moves an output by far more (the values are of order 1).
FLOAT32_ROUNDING = 1e-5


def close_to_exact(got, q, k_pool, v_pool, context, lengths, row=None):
    """``got`` is the attention computed in float64 (:func:`reference`), to float32 rounding."""
    exact = reference(q.double(), k_pool.double(), v_pool.double(), context, lengths, row)
    torch.testing.assert_close(got.double(), exact, atol=FLOAT32_ROUNDING, rtol=0)


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(1, 6), kv_heads=st.integers(1, 3), group=st.integers(1, 4),
       head_dim=st.sampled_from([4, 17, 32, 64]), slots=st.integers(1, 80), data=st.data())
def test_the_kernel_is_pytorchs_attention_on_the_gathered_keys(rows, kv_heads, group, head_dim, slots, data):
    """One query a request (decoding), as the engine's decoding group calls it."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    lengths = torch.tensor(data.draw(st.lists(st.integers(1, 40), min_size=rows, max_size=rows)))
    context = torch.randint(0, slots, (rows, int(lengths.max())), generator=g)
    q = torch.randn(rows, kv_heads * group, head_dim, generator=g) * 2
    k_pool, v_pool = (torch.randn(slots, kv_heads, head_dim, generator=g) for _ in range(2))
    got = paged_attention(q, k_pool, v_pool, context, lengths)
    close_to_exact(got, q, k_pool, v_pool, context, lengths)


@settings(max_examples=60, deadline=None)
@given(kv_heads=st.integers(1, 3), group=st.integers(1, 4), head_dim=st.sampled_from([4, 17, 64]),
       chunks=st.lists(st.tuples(st.integers(0, 30), st.integers(1, 12)), min_size=1, max_size=5), data=st.data())
def test_prefilling_tokens_see_their_requests_keys_up_to_their_own(kv_heads, group, head_dim, chunks, data):
    """Several queries a request (prefilling chunks after ``done`` computed tokens), as the engine's
    prefilling group calls it: each token at position p over its request's keys 0 .. p."""
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    row = torch.tensor([r for r, (done, n) in enumerate(chunks) for _ in range(n)])
    lengths = torch.tensor([done + j + 1 for done, n in chunks for j in range(n)])
    slots = 50
    context = torch.randint(0, slots, (len(chunks), int(lengths.max())), generator=g)
    q = torch.randn(len(row), kv_heads * group, head_dim, generator=g) * 2
    k_pool, v_pool = (torch.randn(slots, kv_heads, head_dim, generator=g) for _ in range(2))
    got = paged_attention(q, k_pool, v_pool, context, lengths, row)
    close_to_exact(got, q, k_pool, v_pool, context, lengths, row)


@settings(max_examples=30, deadline=None)
@given(group=st.integers(1, 6), done=st.integers(0, 40), n=st.integers(2, 40), cut=st.integers(2, 40), data=st.data())
def test_a_prompts_query_gets_the_same_bits_whatever_else_its_tile_holds(group, done, n, cut, data):
    """The tiled path (several queries of a request in one call): each query's heads are rows summed
    in their own lanes, so its bits do not depend on the other queries beside it, on the tile it
    falls in, or on another request in the call (batch invariance)."""
    cut = min(cut, n)
    g = torch.Generator().manual_seed(data.draw(st.integers(0, 2**16)))
    lengths = torch.arange(done + 1, done + n + 1)
    context = torch.randperm(100, generator=g)[:done + n][None]
    q = torch.randn(n, 2 * group, 64, generator=g)
    k_pool, v_pool = (torch.randn(100, 2, 64, generator=g) for _ in range(2))
    whole = paged_attention(q, k_pool, v_pool, context, lengths, torch.zeros(n, dtype=torch.long))
    first = paged_attention(q[:cut], k_pool, v_pool, context, lengths[:cut], torch.zeros(cut, dtype=torch.long))
    last = paged_attention(q[-cut:], k_pool, v_pool, context, lengths[-cut:], torch.zeros(cut, dtype=torch.long))
    other = torch.randint(0, 100, (1, done + n), generator=g)                 # another request beside it
    both = paged_attention(torch.cat([q[:cut], q[:cut]]), k_pool, v_pool, torch.cat([other, context]),
                           torch.cat([lengths[:cut], lengths[:cut]]), torch.tensor([0] * cut + [1] * cut))
    assert torch.equal(first, whole[:cut]) and torch.equal(last, whole[-cut:]) and torch.equal(both[cut:], first)


def test_bad_input_is_named():
    q, pool = torch.zeros(2, 4, 8), torch.zeros(10, 2, 8)
    context, lengths = torch.zeros(2, 5, dtype=torch.long), torch.tensor([5, 3])
    with pytest.raises(RuntimeError, match="query 1 sees 6 keys, but its request's context holds 5"):
        paged_attention(q, pool, pool, context, torch.tensor([5, 6]))
    with pytest.raises(RuntimeError, match="slot 10 of request 0 is outside the pool of 10"):
        paged_attention(q, pool, pool, torch.full((2, 5), 10), lengths)
    with pytest.raises(RuntimeError, match="query 0 belongs to request 2, but the context has 2"):
        paged_attention(q, pool, pool, context, lengths, torch.tensor([2, 0]))
    with pytest.raises(RuntimeError, match="one for each of q's 2 queries"):
        paged_attention(q, pool, pool, context, lengths, torch.tensor([0]))
    with pytest.raises(RuntimeError, match="float32"):
        paged_attention(q.double(), pool, pool, context, lengths)
    with pytest.raises(RuntimeError, match="do not fit"):
        paged_attention(torch.zeros(2, 3, 8), pool, pool, context, lengths)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_engine_with_the_kernel_chooses_the_engines_tokens(data):
    model = tiny_model(torch.float32)
    requests = data.draw(workloads())
    kwargs = engine_kwargs(data.draw, requests)
    plain = serve(model, requests, clock=step_clock(), **kwargs)
    kernel = serve(model, requests, clock=step_clock(), paged_attention=paged_attention, **kwargs)
    assert kernel.outputs == plain.outputs


@pytest.mark.slow
def test_the_compiled_engine_with_the_kernel_chooses_the_engines_tokens():
    model = tiny_model(torch.float32)
    requests = [Request(list(range(1, 12)), 9), Request(list(range(20, 27)), 12), Request([5, 6, 7], 6)]
    plain = serve(model, requests, max_batch=2, block_size=4)
    both = serve(model, requests, max_batch=2, block_size=4, compile=True, paged_attention=paged_attention)
    assert both.outputs == plain.outputs and len({t for out in plain.outputs for t in out}) > 3


def test_a_kernel_that_reads_one_key_too_many_is_caught():
    """A broken copy: each token also sees the slot after its last key (a later token's key, a stale
    key, or another request's). The engine's tokens must change."""
    def one_too_many(q, k_pool, v_pool, context, lengths, row):
        wider = torch.cat([context, context[:, -1:] + 1], dim=1).clamp(max=k_pool.shape[0] - 1)
        return paged_attention(q, k_pool, v_pool, wider, lengths + 1, row)

    model = tiny_model(torch.float32)
    requests = [Request(list(range(1, 12)), 8), Request(list(range(20, 31)), 8)]
    plain = serve(model, requests, max_batch=2, block_size=4)
    broken = serve(model, requests, max_batch=2, block_size=4, paged_attention=one_too_many)
    assert broken.outputs != plain.outputs


def test_the_kernel_is_used_only_where_it_measures_faster(monkeypatch):
    """paged_attention_choice times both ways on the model's shapes and takes the kernel only where
    it wins every case; with a timer that makes it lose one, the gathered keys, saying why."""
    from kvlib.fast import paged

    model = tiny_model()
    for step in ("decode", "prefill"):
        assert paged.attention_ms(model, None, 2, 40, step, timer=_once) >= 0
    wins = iter([1.0, 2.0] * len(paged.CASES))                           # ours, then gathered: ours faster
    kernel, why = paged.paged_attention_choice(model, timer=lambda fn: (fn(), next(wins))[1])
    assert kernel is paged.paged_attention and why == ""
    loses = iter([1.0, 2.0, 3.0, 2.0])                                   # the second case: ours slower
    kernel, why = paged.paged_attention_choice(model, timer=lambda fn: (fn(), next(loses))[1])
    assert kernel is None and "not faster here than the gathered keys (a prefill" in why
    monkeypatch.setattr(paged, "load", lambda: False)
    monkeypatch.setattr(paged, "kernels_missing", lambda: "no compiler (a test)")
    assert paged.paged_attention_choice(model) == (None, "no compiler (a test)")


def _once(fn) -> float:
    fn()
    return 0.0
