"""kvlib's float32 panel product (``panels.cpp``, ``torch.ops.kvlib_cpu.panel_mm``): F.linear to
float32 rounding for any shape (outputs not a multiple of 16 included), the same bits for a row
alone as in a batch, whichever tile or thread it falls to; bad input named; compiled with a
changing number of rows; and a packing that puts the weights in the wrong order is caught."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.fast import kernels
from kvlib.fast.packed import PackedLinear

pytestmark = pytest.mark.skipif(kernels.kernels_missing() is not None,
                                reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")


def panel_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return torch.ops.kvlib_cpu.panel_mm(x, torch.ops.kvlib_cpu.panel_pack(weight), weight.shape[0])


@settings(max_examples=60, deadline=None)
@given(rows=st.integers(0, 40), d_in=st.integers(1, 80), d_out=st.integers(1, 100),
       lead=st.sampled_from([(), (1,), (2,)]), seed=st.integers(0, 2**16))
def test_the_panel_product_is_f_linear(rows, d_in, d_out, lead, seed):
    g = torch.Generator().manual_seed(seed)
    weight, x = torch.randn(d_out, d_in, generator=g), torch.randn(*lead, rows, d_in, generator=g)
    got = panel_linear(x, weight)
    assert got.shape == (*lead, rows, d_out)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-5 * d_in ** 0.5)


def test_the_panels_hold_the_weight_16_outputs_at_a_time_padded_with_zeros():
    weight = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)      # (out 20, in 3)
    panels = torch.ops.kvlib_cpu.panel_pack(weight)
    assert panels.shape == (2, 3, 16)
    assert torch.equal(panels[0], weight[:16].t()) and torch.equal(panels[1, :, :4], weight[16:].t())
    assert not panels[1, :, 4:].any()


@pytest.mark.parametrize("rows", [1, 5, 6, 7, 12, 13, 30])
def test_a_row_gets_the_same_bits_alone_as_in_a_batch(rows):
    """Each output is one in-order sum, whatever tile of rows it falls in (batch-invariant)."""
    g = torch.Generator().manual_seed(rows)
    weight, x = torch.randn(200, 576, generator=g), torch.randn(rows, 576, generator=g)
    batch = panel_linear(x, weight)
    for r in range(rows):
        assert torch.equal(panel_linear(x[r:r + 1], weight), batch[r:r + 1])


def test_the_thread_count_changes_no_bit():
    code = ("import hashlib, torch; from kvlib.fast import kernels; kernels.load(); torch.manual_seed(0); "
            "w, x = torch.randn(300, 200), torch.randn(9, 200); torch.set_num_threads({n}); "
            "y = torch.ops.kvlib_cpu.panel_mm(x, torch.ops.kvlib_cpu.panel_pack(w), 300); "
            "print(hashlib.sha256(y.numpy().tobytes()).hexdigest())")
    runs = [subprocess.run([sys.executable, "-c", code.format(n=n)], capture_output=True, text=True, check=True).stdout
            for n in (1, 2)]
    assert runs[0] == runs[1]


def test_a_packing_that_swaps_the_inner_order_is_caught():
    """The checks above can fail: panels laid out (panels, 16, in) instead of (panels, in, 16)."""
    weight, x = torch.randn(32, 24), torch.randn(3, 24)
    good = torch.ops.kvlib_cpu.panel_pack(weight)
    wrong = weight.view(2, 16, 24).contiguous().view(2, 24, 16)           # the same numbers, another order
    assert torch.allclose(torch.ops.kvlib_cpu.panel_mm(x, good, 32), F.linear(x, weight), atol=1e-4)
    assert not torch.allclose(torch.ops.kvlib_cpu.panel_mm(x, wrong, 32), F.linear(x, weight), atol=1e-2)


def test_bad_input_is_named():
    panels = torch.ops.kvlib_cpu.panel_pack(torch.randn(20, 8))
    with pytest.raises(RuntimeError, match=r"x must be float32 \(\.\.\., 8\)"):
        torch.ops.kvlib_cpu.panel_mm(torch.randn(3, 9), panels, 20)
    with pytest.raises(RuntimeError, match="x must be float32"):
        torch.ops.kvlib_cpu.panel_mm(torch.randn(3, 8, dtype=torch.float64), panels, 20)
    with pytest.raises(RuntimeError, match="2 panels hold 17 to 32 outputs, not 40"):
        torch.ops.kvlib_cpu.panel_mm(torch.randn(3, 8), panels, 40)
    with pytest.raises(RuntimeError, match="must come from panel_pack"):
        torch.ops.kvlib_cpu.panel_mm(torch.randn(3, 8), torch.randn(20, 8), 20)
    with pytest.raises(RuntimeError, match="2-d float32 weight"):
        torch.ops.kvlib_cpu.panel_pack(torch.randn(2, 3, 4))


def test_compiled_with_a_changing_number_of_rows():
    layer = PackedLinear(torch.randn(40, 24), "panels")
    step = torch.compile(layer, dynamic=True, fullgraph=True)
    for rows in (3, 9, 1):
        x = torch.randn(1, rows, 24)
        torch.testing.assert_close(step(x), layer(x), rtol=0, atol=0)


def test_the_build_names_its_code():
    assert kernels.panel_simd() in ("avx512", "avx2", "plain loops")
