"""kvlib.quant: round trips within half a step, packing, the model file's Q4_1 blocks read exactly,
the quantized layers against their dequantized float reference, evaluate against a direct
computation; and the checks fail on broken copies (a zero one step off, nibbles swapped,
groups taken along the wrong dimension)."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlib
from kvlib import Config, Decoder
from kvlib.device import compute_dtype
from kvlib.measure.quality import evaluate
from kvlib.quant import (COMPUTE_DTYPE, Int4Linear, Int8Linear, dequantize_int4_groups, dequantize_int8_rows,
                         pack_int4, q4_1_as_int4_groups, q4_1_blocks, quantize, quantize_int4_groups,
                         quantize_int8_rows, unpack_int4)

PROPERTY = settings(max_examples=30, deadline=None, derandomize=True)
shapes = st.tuples(st.integers(1, 6), st.sampled_from([32, 64, 96]), st.sampled_from([32, 16]))


def _weight(out, inp, seed=0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) * spread + torch.randn(out, 1, generator=g)   # rows off centre


# ------------------------------------------------------------------- round trips

def int4_round_trip_within_half_a_step(w, group_size, quant=quantize_int4_groups) -> bool:
    q, scale, zero = quant(w, group_size)
    back = dequantize_int4_groups(q, scale, zero, group_size)
    step = scale.repeat_interleave(group_size, dim=1)
    return bool(((w - back).abs() <= step / 2 + 1e-6).all()) and int(q.max()) <= 15


@PROPERTY
@given(shape=shapes, seed=st.integers(0, 10_000), spread=st.sampled_from([1e-3, 1.0, 50.0]))
def test_int4_round_trip_is_within_half_a_step(shape, seed, spread):
    out, inp, group = shape
    assert int4_round_trip_within_half_a_step(_weight(out, inp, seed, spread), group)


@PROPERTY
@given(shape=shapes, seed=st.integers(0, 10_000))
def test_int8_round_trip_is_within_half_a_step(shape, seed):
    w = _weight(shape[0], shape[1], seed)
    q, scale = quantize_int8_rows(w)
    assert ((w - dequantize_int8_rows(q, scale)).abs() <= scale[:, None] / 2 + 1e-6).all()
    assert q.dtype == torch.int8 and int(q.abs().max()) == 127


def test_a_zero_point_one_step_off_is_caught():
    def off_by_one(w, group_size):
        q, scale, zero = quantize_int4_groups(w, group_size)
        return q, scale, zero + scale                            # the zero a step too high
    assert not int4_round_trip_within_half_a_step(_weight(4, 64), 32, off_by_one)


def test_groups_along_the_wrong_dimension_are_caught():
    def wrong_axis(w, group_size):                               # groups of output rows, not of inputs
        q, scale, zero = quantize_int4_groups(w.t().contiguous(), group_size)
        return q.t(), scale, zero
    w = _weight(64, 64, spread=3.0)
    q, scale, zero = wrong_axis(w, 32)
    back = dequantize_int4_groups(q.contiguous(), scale, zero, 32)
    assert not torch.allclose(back, w, atol=float(scale.max()) / 2)


@PROPERTY
@given(n=st.integers(1, 40), seed=st.integers(0, 1000))
def test_packing_round_trips(n, seed):
    q = torch.randint(0, 16, (3, 2 * n), generator=torch.Generator().manual_seed(seed), dtype=torch.uint8)
    packed = pack_int4(q)
    assert packed.shape == (3, n) and packed.dtype == torch.uint8
    assert torch.equal(unpack_int4(packed), q)


def test_packing_puts_the_even_value_in_the_low_nibble():
    assert pack_int4(torch.tensor([3, 12], dtype=torch.uint8)).tolist() == [3 | 12 << 4]
    swapped = lambda q: q[..., 1::2] | (q[..., 0::2] << 4)        # noqa: E731  (nibbles the other way round)
    q = torch.tensor([1, 2, 3, 4], dtype=torch.uint8)
    assert not torch.equal(unpack_int4(swapped(q)), q)
    with pytest.raises(ValueError, match="even number"):
        pack_int4(torch.zeros(3, dtype=torch.uint8))


# ------------------------------------------------------------------- the model file's Q4_1 blocks

def _q4_1_bytes(d, m, q) -> np.ndarray:
    """Blocks in ggml's layout: d, m (float16), 16 bytes: low nibbles weights 0..15, high 16..31."""
    out = []
    for di, mi, qi in zip(d, m, q):
        out.append(np.frombuffer(np.float16(di).tobytes() + np.float16(mi).tobytes(), dtype=np.uint8))
        out.append((qi[:16] | (qi[16:] << 4)).astype(np.uint8))
    return np.concatenate(out)


def test_q4_1_blocks_match_the_gguf_dequantizer():
    import gguf
    rng = np.random.default_rng(0)
    d, m = rng.random(6).astype(np.float16) * 0.1, (rng.random(6).astype(np.float16) - 0.5)
    q = rng.integers(0, 16, (6, 32)).astype(np.uint8)
    raw = _q4_1_bytes(d, m, q)
    expected = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType.Q4_1).reshape(2, 96)
    dd, mm, qq = q4_1_blocks(raw, 192)
    assert torch.equal(qq, torch.from_numpy(q))
    ours = (dd.float()[:, None] * qq.float() + mm.float()[:, None]).reshape(2, 96)
    torch.testing.assert_close(ours, torch.from_numpy(expected), rtol=0, atol=1e-6)
    qg, scale, zero = q4_1_as_int4_groups(raw, (2, 96))            # the int4 kernel's groups: exactly the same
    torch.testing.assert_close(dequantize_int4_groups(qg, scale, zero, 32), torch.from_numpy(expected),
                               rtol=0, atol=1e-6)


def test_swapped_nibbles_are_caught():
    import gguf
    rng = np.random.default_rng(1)
    d, m, q = np.float16([0.05]), np.float16([-0.2]), rng.integers(0, 16, (1, 32)).astype(np.uint8)
    raw = _q4_1_bytes(d, m, q)
    raw[4:] = (raw[4:] >> 4) | ((raw[4:] & 0x0F) << 4)             # high and low nibble exchanged
    expected = torch.from_numpy(gguf.quants.dequantize(_q4_1_bytes(d, m, q), gguf.GGMLQuantizationType.Q4_1))
    dd, mm, qq = q4_1_blocks(raw, 32)
    assert not torch.allclose(dd.float() * qq.float() + mm.float(), expected.reshape(1, 32))


# ------------------------------------------------------------------- the layers

@pytest.mark.parametrize("layer", ["int8", "int4"])
@pytest.mark.parametrize("rows", [1, 3, 17])
def test_quantized_linear_matches_its_dequantized_weight(layer, rows):
    w = _weight(96, 64, seed=3)
    lin = Int8Linear.from_weight(w) if layer == "int8" else Int4Linear.from_weight(w)
    x = torch.randn(2, rows, 64, generator=torch.Generator().manual_seed(4))
    got = lin(x)
    assert got.shape == (2, rows, 96) and got.dtype == x.dtype
    expected = x.to(COMPUTE_DTYPE).float() @ lin.dequantized().to(COMPUTE_DTYPE).float().t()
    # bf16 activations, products and result: within a few bf16 steps (2**-8) of the largest output
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=2 ** -6 * float(expected.abs().max()))
    step = (w.amax() - w.amin()) / (254 if layer == "int8" else 30)             # at worst half a step of the widest group
    assert (lin.dequantized() - w).abs().max() <= step * 1.05                    # and near the float weight


def test_quantize_copies_and_leaves_the_model_alone():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    q = quantize(model, "int4", output_layer=True)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert isinstance(q.blocks[0].attn.wq, Int4Linear) and isinstance(q.lm_head, Int8Linear)
    assert q.dtype == compute_dtype("cpu")                  # bfloat16 only where the CPU multiplies it natively
    ids = torch.tensor([[1, 2, 3, 4, 5]])
    with torch.no_grad():
        exact, approx = model(ids), quantize(model, "int8")(ids).float()
    assert 0 < (approx - exact).abs().max() < 0.1 * exact.abs().max()           # close, not equal
    assert kvlib.generate(q, [1, 2, 3], 4) and kvlib.generate_batch(q, [[1, 2], [3, 4, 5]], 3)


@pytest.mark.parametrize("kwargs, message", [
    (dict(scheme="int3"), "unknown scheme 'int3'"),
    (dict(scheme="int4", config=dict(d_model=48)), "blocks of 32 inputs, which do not divide the input width 48"),
])
def test_quantize_says_what_is_wrong(kwargs, message):
    torch.manual_seed(0)
    config = Config.tiny()
    config = Config(**{**config.__dict__, **kwargs.pop("config", {})})
    with pytest.raises(ValueError, match=message):
        quantize(Decoder(config), **kwargs)


def test_quantizing_twice_is_refused():
    torch.manual_seed(0)
    once = quantize(Decoder(Config.tiny()), "int8")
    with pytest.raises(ValueError, match="already quantized"):
        quantize(once, "int4")


def test_an_unknown_block_type_is_a_clear_error(tmp_path):
    """A file whose matrices are not Q4_1 blocks (here float32) cannot be loaded as 4-bit."""
    from smollm2 import test_loading as test_smollm2
    from kvlib.smollm2 import load_q4_1_decoder
    from kvlib.smollm2.gguf import open_gguf
    torch.manual_seed(0)
    test_smollm2._write_tiny_gguf(tmp_path / "tiny.gguf", Decoder(Config.tiny()).eval())
    with pytest.raises(ValueError, match="not stored as Q4_1"):
        load_q4_1_decoder(open_gguf(tmp_path / "tiny.gguf"), tmp_path / "tiny.gguf")


# ------------------------------------------------------------------- evaluate

@pytest.mark.parametrize("rows", [128, 3])
def test_evaluate_matches_a_direct_computation(rows, monkeypatch):
    """Also when each window's positions are compared a few at a time (rows=3: windows of 7 in
    chunks of 3, the last window's targets one short)."""
    from kvlib.measure import quality
    monkeypatch.setattr(quality, "COMPARE_ROWS", rows)
    torch.manual_seed(0)
    reference = Decoder(Config.tiny()).double().eval()
    other = Decoder(Config.tiny()).double().eval()              # another model: float64, so windows cost no rounding
    ids = torch.randint(0, 64, (40,), generator=torch.Generator().manual_seed(5))
    got = evaluate(reference, other, ids, window=7)
    with torch.no_grad():
        p = torch.log_softmax(reference(ids[None])[0].double(), -1)
        r = torch.log_softmax(other(ids[None])[0].double(), -1)
    kl = (p.exp() * (p - r)).sum(-1)
    torch.testing.assert_close(got.kl, kl, rtol=1e-3, atol=1e-4)
    assert got.top1 == pytest.approx(float((p.argmax(-1) == r.argmax(-1)).double().mean()))
    nll = -p[:-1].gather(-1, ids[1:, None])[:, 0]
    assert got.ppl_reference == pytest.approx(math.exp(float(nll.mean())), rel=1e-6)
    assert got.kl_p99 >= got.kl_mean >= 0


def test_evaluate_refuses_a_text_longer_than_the_model():
    torch.manual_seed(0)
    m = Decoder(Config.tiny()).eval()
    with pytest.raises(ValueError, match="more than the model's max_seq_len=128"):
        evaluate(m, m, list(range(60)) * 3)


# ------------------------------------------------------------------- the real model

@pytest.mark.slow
def test_the_native_4_bit_model_keeps_the_files_blocks_up_to_bf16():
    import gguf
    from kvlib.smollm2.gguf import open_gguf, unpermute
    model, _ = kvlib.load_smollm2(quantized=True)
    tensors = {t.name: t for t in open_gguf(kvlib.smollm2_path()).tensors}
    for gguf_name, layer, heads in [("blk.0.ffn_gate.weight", model.blocks[0].mlp.gate, None),
                                    ("blk.3.attn_q.weight", model.blocks[3].attn.wq, model.config.n_heads)]:
        t = tensors[gguf_name]
        ref = torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)).reshape(layer.out_features, -1)
        if heads:
            ref = unpermute(ref, heads)
        diff = (layer.dequantized() - ref).abs()
        assert diff.max() < 2 ** -6 * ref.abs().max()             # bf16 rounding of the scales, zeros and weights
        q_file = q4_1_as_int4_groups(np.asarray(t.data), (layer.out_features, layer.in_features))[0]
        assert torch.equal(quantize_int4_groups(torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type))
                                                .reshape(layer.out_features, -1), 32)[0], q_file)   # found again


# ------------------------------------------------------------------- everywhere a model goes

@pytest.mark.parametrize("cache_cls, kwargs", [
    ("KVCache", {}), ("Int8KVCache", {}), ("HalfKVCache", {}), ("SlidingWindowKVCache", {"window": 6}),
    ("KiviKVCache", {"bits": 4, "recent": 2}),
])
def test_a_quantized_model_runs_with_every_cache(cache_cls, kwargs):
    """Cached decoding on a quantized model picks the tokens the uncached forward pass picks."""
    import kvlib.cache
    torch.manual_seed(0)
    q = quantize(Decoder(Config.tiny()).eval(), "int4")
    cache = getattr(kvlib.cache, cache_cls).for_model(q, max_len=20, **kwargs)
    got = kvlib.generate(q, [5, 6, 7, 8], 8, cache=cache)
    assert len(got) == 8 and all(0 <= t < q.config.vocab_size for t in got)
    if cache_cls in ("KVCache", "HalfKVCache"):               # the cache holds bf16 already: nothing more rounded
        assert got == kvlib.generate(q, [5, 6, 7, 8], 8, use_cache=False)


def test_a_quantized_model_serves_and_compiles():
    torch.manual_seed(0)
    q = quantize(Decoder(Config.tiny()).eval(), "int8")
    from kvlib.serve import Request, serve
    run = serve(q, [Request([1, 2, 3], 4), Request([4, 5], 3)], max_batch=2, policy="continuous")
    solo = [kvlib.generate(q, [1, 2, 3], 4), kvlib.generate(q, [4, 5], 3)]
    assert run.outputs == solo
    assert kvlib.generate(q, [1, 2, 3], 6, compile=True) == kvlib.generate(q, [1, 2, 3], 6)


def test_weight_bytes_count_the_quantized_buffers_and_feed_the_roofline():
    """One count of a model's weight bytes (kvlib.Decoder.weight_bytes): the parameters of a float model
    (RoPE's tables are no weights); for a 4-bit model also the packed integers and scales its layers
    keep in buffers, which a count of parameters alone misses. The roofline of section 7 reads it."""
    from kvlib.measure.roofline import decode_step_seconds, row_cost

    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    assert model.weight_bytes() == sum(p.numel() * p.element_size() for p in model.parameters())
    q = quantize(model, "int4")
    layers = [m for m in q.modules() if isinstance(m, Int4Linear)]
    packed = sum(b.numel() * b.element_size() for m in layers for b in m.buffers() if b is not m.blocks)
    params = sum(p.numel() * p.element_size() for p in q.parameters())
    assert packed > 0 and q.weight_bytes() == params + packed                   # what PyTorch's int4 kernel reads
    assert packed == sum(m.blocks.numel() for m in layers)                      # as many bytes as the Q4_1 blocks
    step = lambda m: decode_step_seconds(1, weight_bytes=m.weight_bytes(), **row_cost(m.config, 16, m.dtype),
                                         flops_per_s=1e12, bytes_per_s=1e9)
    assert step(q) < step(model)              # fewer bytes to read: a shorter memory-bound step
