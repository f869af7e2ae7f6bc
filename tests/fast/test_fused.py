"""The fast path (kvlib.fast): matrices fused at load time compute what the separate ones do."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from kvlib import Config, Decoder, generate
from kvlib.fast import FusedAttention, FusedMLP, concat_linears, fuse, is_fused
from kvlib.quant import Int4Linear, Int8Linear, quantize
from kvlib import generate_batch

CFG = Config(vocab_size=97, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=64)   # widths of 64s: the int4 blocks


def _model(seed=0) -> Decoder:
    torch.manual_seed(seed)
    return Decoder(CFG).eval()


def _layers(kind, outs, inp=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    weights = [torch.randn(o, inp, generator=g) for o in outs]
    if kind == "float":
        layers = []
        for w in weights:
            layer = nn.Linear(inp, w.shape[0], bias=False)
            layer.weight.data.copy_(w)
            layers.append(layer)
        return layers
    return [Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w) for w in weights]


@settings(max_examples=15, deadline=None)
@given(kind=st.sampled_from(["float", "int8", "int4"]), blocks=st.lists(st.integers(1, 3), min_size=2, max_size=3),
       rows=st.integers(1, 5), seed=st.integers(0, 1000))
def test_concatenated_layer_is_the_layers_side_by_side(kind, blocks, rows, seed):
    """The quantized kernels compute each output row on its own: stacking is exact there. A float
    matrix product may block a larger matrix differently, so it agrees to float rounding."""
    outs = [64 * b for b in blocks]               # the int4 kernel's blocks of 64 rows
    layers = _layers(kind, outs, seed=seed)
    fused = concat_linears(layers)
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(seed + 1))
    if kind != "float":
        x = x.to(torch.bfloat16)
    with torch.no_grad():
        expected = torch.cat([layer(x) for layer in layers], dim=-1)
        got = fused(x)
    assert got.shape == (rows, sum(outs)) and fused.out_features == sum(outs)
    if kind == "float":
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, expected)


def test_concat_refuses_what_it_cannot_stack():
    with pytest.raises(TypeError, match="of one kind"):
        concat_linears(_layers("int8", [16]) + _layers("int4", [16]))
    with pytest.raises(TypeError, match="no bias"):
        concat_linears([nn.Linear(4, 4), nn.Linear(4, 4)])
    with pytest.raises(ValueError, match="share their input width"):
        Int4Linear.concat(_layers("int4", [64], inp=64) + _layers("int4", [64], inp=128))
    with pytest.raises(ValueError, match="share their input width"):
        Int8Linear.concat(_layers("int8", [8], inp=64) + _layers("int8", [8], inp=32))



def test_q4_1_blocks_stack_at_any_row_count():
    """The stored blocks are one row of blocks per output: any row counts stack, exactly (PyTorch's
    own packing, in blocks of 64 rows, could not be concatenated when a layer had 16)."""
    layers = _layers("int4", [16, 48])
    fused = Int4Linear.concat(layers)
    assert torch.equal(fused.blocks, torch.cat([layer.blocks for layer in layers]))
    assert torch.equal(fused.dequantized(), torch.cat([layer.dequantized() for layer in layers]))
    with pytest.raises(ValueError, match="multiple of 16 output rows, this layer has 40"):
        _layers("int4", [40])


@pytest.mark.parametrize("scheme", [None, "int8", "int4"])
def test_fused_model_gives_the_same_logits_and_tokens(scheme):
    """Float32: the same logits to float rounding. Quantized: the kernels compute each output
    row on its own, so stacking the rows changes nothing at all. Either way, the same tokens,
    one sequence or a batch. (Swapping k and v in the fused matrix fails this test.)"""
    model = _model() if scheme is None else quantize(_model(), scheme)
    fast = fuse(model)
    assert is_fused(fast) and not is_fused(model)
    assert all(isinstance(b.attn, FusedAttention) and isinstance(b.mlp, FusedMLP) for b in fast.blocks)
    ids = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        expected, got = model(ids), fast(ids)
    if scheme is None:
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    else:
        assert torch.equal(got, expected)
    prompt = ids[0].tolist()
    assert generate(fast, prompt, 12) == generate(model, prompt, 12) == generate(model, prompt, 12, use_cache=False)
    prompts = [prompt[:7], prompt[:12], prompt]
    assert generate_batch(fast, prompts, 6) == generate_batch(model, prompts, 6)


def test_fused_matrices_read_fewer_times():
    """4 matrix products per layer instead of 7, and the weights are the same bytes."""
    model, fast = _model(), fuse(_model())
    linears = lambda m: [x for x in m.modules() if isinstance(x, nn.Linear)]
    assert len(linears(model)) == 7 * CFG.n_layers and len(linears(fast)) == 4 * CFG.n_layers
    assert sum(x.weight.numel() for x in linears(model)) == sum(x.weight.numel() for x in linears(fast))


def test_int8_output_layer_and_refusals():
    model = _model()
    fast = fuse(model, int8_output_layer=True)
    assert isinstance(fast.lm_head, Int8Linear) and model.lm_head is None
    ids = torch.randint(0, CFG.vocab_size, (1, 16), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        diff = (fast(ids) - model(ids)).abs().max()
    assert 0 < diff < 0.1          # int8 rows: close, not equal
    with pytest.raises(ValueError, match="already fused"):
        fuse(fast)
    with pytest.raises(ValueError, match="output layer of its own"):
        fuse(quantize(model, "int8", output_layer=True), int8_output_layer=True)
    with pytest.raises(TypeError, match="kvlib.Decoder"):
        fuse(nn.Linear(2, 2))


def _agrees(model, fast) -> bool:
    ids = torch.randint(0, CFG.vocab_size, (2, 20), generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        return torch.equal(model(ids), fast(ids))


@pytest.mark.parametrize("mistake", ["k and v swapped", "gate and up swapped"])
def test_the_agreement_check_fails_on_a_broken_fusion(mistake, monkeypatch):
    """The check above can fail: on a fused model that mixes up its pieces it does."""
    model = quantize(_model(), "int4")
    assert _agrees(model, fuse(model))
    if mistake == "k and v swapped":
        project = FusedAttention.project
        monkeypatch.setattr(FusedAttention, "project", lambda self, x: (lambda q, k, v: (q, v, k))(*project(self, x)))
    else:
        monkeypatch.setattr(FusedMLP, "forward",
                            lambda self, x: self.down(torch.nn.functional.silu(self.gate_up(x).chunk(2, -1)[1])
                                                      * self.gate_up(x).chunk(2, -1)[0]))
    assert not _agrees(model, fuse(model))
