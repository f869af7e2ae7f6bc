"""The fast path's layer (kvlib.fast.KernelSwitch): a packed kernel for a few rows, a dense weight for many."""
from __future__ import annotations

import pytest
import torch

from kvlib.fast import KernelSwitch
from kvlib.quant import Int4Linear, Int8Linear


@pytest.mark.parametrize("layer", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_from_dense_from_rows_on_the_dense_weight_in_its_dtype(layer, dtype):
    """From ``dense_from`` rows on, the weight dequantized once, in the dense weight's dtype (the
    input cast to it, the result back): exactly F.linear on it. Below, the packed kernel itself."""
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(5))
    packed = Int8Linear.from_weight(w) if layer == "int8" else Int4Linear.from_weight(w, 32)
    switch = KernelSwitch(packed, packed.dequantized().to(dtype), dense_from=4)
    x = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    got = switch(x)
    assert got.dtype == torch.bfloat16
    assert torch.equal(got, torch.nn.functional.linear(x.to(dtype), packed.dequantized().to(dtype)).to(torch.bfloat16))
    assert torch.equal(switch(x[:, :3]), packed(x[:, :3]))
    assert torch.equal(KernelSwitch(packed)(x), packed(x))                       # no dense weight: the kernel always


def test_a_dense_weight_comes_with_its_row_count():
    packed = Int8Linear.from_weight(torch.randn(8, 32))
    with pytest.raises(ValueError, match="both"):
        KernelSwitch(packed, packed.dequantized())
    with pytest.raises(ValueError, match="both"):
        KernelSwitch(packed, None, 4)
