"""kvlib.fast.pack: float32 weights packed once for a matrix kernel, oneDNN's (as vLLM's CPU build
does) or kvlib's panels. The same products up to the order of float32 additions, the same greedy
tokens, and a clear refusal of what it cannot pack."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

import kvlib
from kvlib.fast import PackedLinear, fuse, is_packed, kernels_missing, pack, packing_unavailable
from kvlib.fast.packed import KERNELS, packing_kernel

from tiny_models import tiny_model

needs_onednn = pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="this PyTorch has no oneDNN")
needs_kernels = pytest.mark.skipif(kernels_missing() is not None, reason=f"kvlib's kernels: {kernels_missing()}")
EACH_KERNEL = [pytest.param("onednn", marks=needs_onednn), pytest.param("panels", marks=needs_kernels)]


@pytest.mark.parametrize("kernel", EACH_KERNEL)
@settings(max_examples=40, deadline=None)
@given(rows=st.integers(1, 40), d_in=st.integers(1, 70), d_out=st.integers(1, 90), lead=st.sampled_from([(), (1,), (3,)]))
def test_a_packed_layer_computes_f_linear(kernel, rows, d_in, d_out, lead):
    torch.manual_seed(rows * 1000 + d_in * 10 + d_out)
    weight, x = torch.randn(d_out, d_in), torch.randn(*lead, rows, d_in)
    got = PackedLinear(weight, kernel)(x)
    assert got.shape == (*lead, rows, d_out)
    torch.testing.assert_close(got, F.linear(x, weight), rtol=1e-5, atol=1e-5 * d_in ** 0.5)


@pytest.mark.parametrize("kernel", EACH_KERNEL)
def test_a_packed_layer_that_ignored_its_weight_is_caught(kernel):
    """The check above can fail: a layer packed from another weight computes something else."""
    weight, x = torch.randn(8, 16), torch.randn(3, 16)
    wrong = PackedLinear(weight.flip(0), kernel)
    assert not torch.allclose(wrong(x), F.linear(x, weight), atol=1e-3)


@pytest.mark.parametrize("kernel", EACH_KERNEL)
@pytest.mark.parametrize("how", ["plain", "fused first", "fused on the way"])
def test_a_packed_model_chooses_the_same_tokens_and_leaves_the_original_alone(how, kernel):
    model = tiny_model()
    source = fuse(model) if how == "fused first" else model
    before = {k: v.clone() for k, v in source.state_dict().items()}
    packed = pack(source, fused=how == "fused on the way", kernel=kernel)
    assert {m.kernel for m in packed.modules() if isinstance(m, PackedLinear)} == {kernel}
    assert is_packed(packed) and not is_packed(source) and source.lm_head is None
    assert all(torch.equal(v, before[k]) for k, v in source.state_dict().items())
    assert packed.embed.weight is source.embed.weight                # shared, not copied
    assert kvlib.fast.is_fused(packed) == (how != "plain")
    assert not any(type(m) is torch.nn.Linear for m in packed.modules())
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    with torch.no_grad():
        assert (packed(ids) - model(ids)).abs().max() < 1e-4
    assert kvlib.generate(packed, [1, 2, 3], 12) == kvlib.generate(model, [1, 2, 3], 12)


def test_what_cannot_be_packed_is_refused_with_the_reason():
    with pytest.raises(TypeError, match="takes a kvlib.Decoder"):
        pack(torch.nn.Linear(2, 2))
    assert "float32 model on the CPU" in packing_unavailable(tiny_model(torch.float64))
    with pytest.raises(ValueError, match="cannot pack this model: .*use it as it is"):
        pack(tiny_model(torch.float64))
    with pytest.raises(ValueError, match="2-d float32 weight"):
        PackedLinear(torch.zeros(2, 2, dtype=torch.bfloat16))
    if torch.backends.mkldnn.is_available():
        with pytest.raises(ValueError, match="output layer of its own"):
            pack(pack(tiny_model()))


def test_the_default_kernel_is_one_this_machine_has():
    """pack's default: kvlib's panels where they are built with AVX-512 or AVX2, else oneDNN where PyTorch has it."""
    kernel = packing_kernel()
    assert kernel in KERNELS
    if kernels_missing() is None and kvlib.fast.kernels.panel_simd() in ("avx512", "avx2"):
        assert kernel == "panels"
    elif torch.backends.mkldnn.is_available():
        assert kernel == "onednn"
    with pytest.raises(ValueError, match="kernel is one of"):
        PackedLinear(torch.zeros(2, 2), "mkl")


def test_panels_without_kvlibs_kernels_say_why_and_what_to_use(monkeypatch):
    """Asking for the panels where kvlib's kernels did not build names the reason and the other kernel,
    rather than failing inside torch.ops with an unknown operator."""
    monkeypatch.setattr(kvlib.fast.packed, "load", lambda: False)
    monkeypatch.setattr(kvlib.fast.packed, "kernels_missing", lambda: "no C++ compiler was found")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler was found.*kernel='onednn'"):
        PackedLinear(torch.zeros(16, 8), "panels")
