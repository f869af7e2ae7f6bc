"""The fast path's kernel for many rows (kvlib.fast.DenseFrom): a packed kernel for a few rows, a dense weight for many."""
from __future__ import annotations

import pytest
import torch

from kvlib.fast import DenseFrom
from kvlib.quant import INT4, INT8, Int4Linear, Int8Linear


@pytest.mark.parametrize("layer", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_from_rows_on_the_dense_weight_in_its_dtype(layer, dtype):
    """From ``rows`` rows on, the weight dequantized once, in the dense weight's dtype (the input
    cast to it, the result back): exactly F.linear on it. Below, the packed kernel itself."""
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(5))
    packed = Int8Linear.from_weight(w) if layer == "int8" else Int4Linear.from_weight(w)
    x = torch.randn(1, 6, 64, generator=torch.Generator().manual_seed(6)).to(torch.bfloat16)
    few = packed(x[:, :3])
    packed.use(DenseFrom(packed.kernel, 4, dtype))
    got = packed(x)
    assert got.dtype == torch.bfloat16 and packed.dense.dtype == dtype
    assert torch.equal(got, torch.nn.functional.linear(x.to(dtype), packed.dequantized().to(dtype)).to(torch.bfloat16))
    assert torch.equal(packed(x[:, :3]), few)
    assert "dense" not in packed.state_dict()                                    # the format alone is saved
    packed.use(INT8 if layer == "int8" else INT4)
    assert not hasattr(packed, "dense")                                          # dropped with its kernel


def test_a_dense_kernel_takes_a_packed_kernel_and_a_row_count():
    with pytest.raises(ValueError, match="packed kernel"):
        DenseFrom(INT8, 0, torch.float32)
    with pytest.raises(ValueError, match="packed kernel"):
        DenseFrom(DenseFrom(INT8, 4, torch.float32), 8, torch.float32)
