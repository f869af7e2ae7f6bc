"""kvlib.quant.requantize: weights rounded again to another grid. A grid given back its own
points changes nothing (Q4_0 on a Q4_0 grid, Q4_1 on a Q4_1 grid); blocks shifted off the
grid's blocks do change them; the shift is undone exactly; the stored bits match gguf's bytes;
the model copy shares its embedding and leaves the original alone."""
from __future__ import annotations

import numpy as np
import pytest
import torch

from kvlib import Config, Decoder
from kvlib.quant import (GRIDS, RoundedLinear, dequantize_int4_groups, gguf_round_trip, linear_layers, quantize,
                         quantize_asymmetric, quantize_int4_groups, requantize, requantized_weight)


def _weight(out=8, inp=192, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(out, inp, generator=g) * 0.05 + torch.randn(out, 1, generator=g) * 0.01


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q8_0"])
def test_a_grid_given_its_own_points_changes_nothing(kind):
    on_grid = gguf_round_trip(_weight(), kind)
    assert torch.equal(gguf_round_trip(on_grid, kind), on_grid)


def test_blocks_shifted_off_the_grid_do_not_give_it_back():
    on_grid = gguf_round_trip(_weight(), "Q4_1")
    shifted = gguf_round_trip(on_grid, "Q4_1", shift=16)
    step = (on_grid.amax() - on_grid.amin()) / 15
    assert (shifted - on_grid).abs().max() > step / 20          # far from float rounding


def test_a_shift_of_a_whole_block_is_the_unshifted_grid():
    # shifting by 32 regroups the same blocks in another order: the rotation back must undo it exactly
    w = _weight()
    assert torch.equal(gguf_round_trip(w, "Q4_1", shift=32), gguf_round_trip(w, "Q4_1"))
    assert torch.equal(gguf_round_trip(w, "Q4_1", shift=16 + 32), gguf_round_trip(w, "Q4_1", shift=16))


@pytest.mark.parametrize("kind", ["Q8_0", "Q5_1", "Q4_1", "Q4_0"])
def test_the_bits_per_weight_are_ggufs_bytes(kind):
    import gguf

    w = _weight().numpy()
    stored = gguf.quants.quantize(w, gguf.GGMLQuantizationType[kind])
    assert 8 * stored.nbytes / w.size == GRIDS[kind].bits_per_weight


@pytest.mark.parametrize("grid", list(GRIDS))
def test_every_grid_stays_within_its_rounding(grid):
    w = _weight()
    back = requantized_weight(w, grid)
    assert back.shape == w.shape and back.dtype == torch.float32
    spread = float(w.amax() - w.amin())
    assert float((back - w).abs().max()) <= spread / 2 ** (GRIDS[grid].bits_per_weight // 1) + 1e-6


def test_asymmetric_rounding_is_within_half_a_step_and_is_int4_groups_at_4_bits():
    w = _weight()
    for bits in (2, 3, 5):
        g = w.reshape(w.shape[0], -1, 32)
        step = ((g.amax(-1) - g.amin(-1)) / (2 ** bits - 1)).repeat_interleave(32, dim=1)
        assert ((quantize_asymmetric(w, bits, 32) - w).abs() <= step / 2 + 1e-6).all()
    int4 = dequantize_int4_groups(*quantize_int4_groups(w, 32), 32)
    assert torch.allclose(quantize_asymmetric(w, 4, 32), int4, atol=1e-6)


def test_requantize_copies_shares_the_embedding_and_rounds_every_layer():
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    before = {name: p.clone() for name, p in model.named_parameters()}
    copy = requantize(model, "Q4_0")
    assert copy.embed.weight is model.embed.weight
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), f"requantize changed the original's {name}"
    for (_, _, mine), (_, _, theirs) in zip(linear_layers(copy), linear_layers(model)):
        assert isinstance(mine, torch.nn.Linear)
        assert torch.equal(mine.weight, requantized_weight(theirs.weight, "Q4_0"))
    ids = torch.arange(10)[None]
    assert copy(ids).shape == model(ids).shape


@pytest.mark.parametrize("grid", ["Q4_0", "3-bit, groups of 32"])
def test_requantize_as_it_runs_predicts_as_the_rounded_copy_and_holds_no_copy(grid):
    """The copy that rounds as it runs: the same logits as the rounded copy, every tensor the
    original's (no rounded weight kept), and the original unchanged after a forward pass."""
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    before = {name: p.clone() for name, p in model.named_parameters()}
    held, lazy = requantize(model, grid), requantize(model, grid, as_it_runs=True)
    ids = torch.arange(12)[None]
    assert torch.equal(lazy(ids), held(ids))
    assert not torch.equal(lazy(ids), model(ids))                        # it does round
    originals = {t.data_ptr() for t in [*model.parameters(), *model.buffers()]}
    assert all(t.data_ptr() in originals for t in [*lazy.parameters(), *lazy.buffers()])
    for name, p in model.named_parameters():
        assert torch.equal(p, before[name]), f"requantize changed the original's {name}"
    assert sum(isinstance(m, RoundedLinear) for m in lazy.modules()) == len(linear_layers(model))


def test_requantize_says_what_is_wrong():
    model = Decoder(Config.tiny()).eval()
    with pytest.raises(ValueError, match="unknown grid 'Q3_K'"):
        requantize(model, "Q3_K")
    with pytest.raises(ValueError, match="already quantized"):
        requantize(quantize(model, "int8"), "Q4_0")
    with pytest.raises(ValueError, match="must divide the input width"):
        requantized_weight(torch.zeros(4, 96), "int4, groups of 192")
    assert np.isfinite(requantized_weight(torch.zeros(4, 64), "3-bit, groups of 32").numpy()).all()
