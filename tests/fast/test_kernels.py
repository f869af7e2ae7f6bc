"""kvlib's own CPU kernels (kvlib.fast.kernels): exact to their own arithmetic, close to the
dequantized product, the file's blocks as stored, clear errors, and the fast path without them."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.fast import kernels
from kvlib.fast.gguf_linear import Q4_1, Q8_0Linear, q8_0_blocks
from kvlib.quant.formats import pack_q4_1 as q4_1_blocks
from kvlib.quant import Int4Linear
from kvlib.quant.formats import quantize_int4_groups

pytestmark = pytest.mark.skipif(kernels.kernels_missing() is not None,
                                reason=f"kvlib's CPU kernels cannot be built here: {kernels.kernels_missing()}")


@pytest.fixture(autouse=True, scope="module")
def _built():
    """The operators below are called directly: the library loaded first (built where missing)."""
    assert kernels.load()


def _q4_1(out: int, inp: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random 4-bit integers and float16-exact scales and minima: ``(q (out, in), d, m (out, in/32))``."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out, inp), generator=g, dtype=torch.uint8)
    d = (torch.rand(out, inp // 32, generator=g) * 0.1).half().float()
    m = (torch.randn(out, inp // 32, generator=g) * 0.3).half().float()
    return q, d, m


def _x(rows: int, inp: int, seed: int, spread: float = 1.0) -> torch.Tensor:
    x = torch.randn(rows, inp, generator=torch.Generator().manual_seed(seed)) * spread
    x[0, :32] = 0.0                                   # one block of zeros: its scale is 0, its integers 0
    return x


def _sum_bound(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What float32 sums may move an output by: a few float32 steps of the sum of the terms' sizes."""
    return 64 * 2 ** -24 * (x.abs().double() @ w.abs().double().t()) + 1e-6


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.sampled_from([32, 64, 96, 576]), st.integers(0, 10_000), st.floats(1e-3, 1e3))
def test_activations_round_as_the_reference_says_bit_for_bit(rows, inp, seed, spread):
    x = _x(rows, inp, seed, spread)
    blocks = torch.ops.kvlib_cpu.quantize_rows(x).numpy().reshape(rows, inp // 32, 40)
    d = torch.from_numpy(blocks[..., 0:4].copy().view(np.float32))[..., 0]
    s = torch.from_numpy(blocks[..., 4:8].copy().view(np.float32))[..., 0]
    q = torch.from_numpy(blocks[..., 8:].copy().view(np.int8))
    q_ref, d_ref = kernels.quantize_rows_reference(x)
    assert torch.equal(q, q_ref) and torch.equal(d, d_ref)
    assert torch.allclose(s, d_ref * q_ref.float().sum(-1), rtol=1e-6, atol=0)
    assert int(q.abs().max()) <= 127


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 40), st.sampled_from([32, 64, 576]), st.integers(0, 10_000))
def test_q4_1_is_exact_to_its_own_arithmetic(rows, out, inp, seed):
    """Every row count around the kernel's tile of 4 rows, any number of outputs: the kernel's
    float32 sums against the same formula in float64 (the integer dot products are exact)."""
    q, d, m = _q4_1(out, inp, seed)
    x = _x(rows, inp, seed + 1)
    y = torch.ops.kvlib_cpu.q4_1_mm(x, q4_1_blocks(q, d, m), out)
    assert y.shape == (rows, out) and y.dtype == torch.float32
    w = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)
    assert ((y.double() - kernels.reference_mm(x, q, d, m)).abs() <= _sum_bound(x, w)).all()


@settings(max_examples=40, deadline=None)
@given(st.integers(1, 9), st.integers(1, 40), st.sampled_from([32, 64, 576]), st.integers(0, 10_000))
def test_q8_0_is_exact_to_its_own_arithmetic(rows, out, inp, seed):
    w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))
    blocks, q, d = q8_0_blocks(w)
    x = _x(rows, inp, seed + 1)
    y = torch.ops.kvlib_cpu.q8_0_mm(x, blocks, out)
    w_q = (q.float().reshape(out, -1, 32) * d[..., None]).reshape(out, inp)
    assert ((y.double() - kernels.reference_mm(x, q, d)).abs() <= _sum_bound(x, w_q)).all()


def test_both_kernels_are_the_dequantized_product_up_to_the_activations_rounding():
    """Rounding each activation to 8 bits moves it by at most half its block's step (amax / 254):
    an output moves by at most the sum over blocks of that times the block's weights' sizes."""
    q, d, m = _q4_1(48, 576, 3)
    x = _x(5, 576, 4)
    w = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)                 # (48, 576)
    step = x.reshape(5, -1, 32).abs().amax(-1) / 254                                         # (5, blocks)
    bound = step.double() @ w.abs().reshape(48, -1, 32).sum(-1).double().t() + _sum_bound(x, w)
    exact = x.double() @ w.double().t()
    assert ((torch.ops.kvlib_cpu.q4_1_mm(x, q4_1_blocks(q, d, m), 48).double() - exact).abs() <= bound).all()
    blocks, q8, d8 = q8_0_blocks(w)
    w8 = (q8.float().reshape(48, -1, 32) * d8[..., None]).reshape(48, 576)
    bound8 = step.double() @ w8.abs().reshape(48, -1, 32).sum(-1).double().t() + _sum_bound(x, w8)
    assert ((torch.ops.kvlib_cpu.q8_0_mm(x, blocks, 48).double() - x.double() @ w8.double().t()).abs() <= bound8).all()


def test_a_broken_block_layout_is_caught():
    """The check above can fail: the same integers with the nibbles of each byte swapped (weights
    16..31 read as 0..15), as a wrong packing would store them, miss the reference by far."""
    q, d, m = _q4_1(16, 64, 5)
    blocks = q4_1_blocks(q, d, m).reshape(16, 2, 20).clone()
    blocks[..., 4:] = (blocks[..., 4:] >> 4) | (blocks[..., 4:] << 4)
    x = _x(3, 64, 6)
    y = torch.ops.kvlib_cpu.q4_1_mm(x, blocks.reshape(16, 40), 16)
    w = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)
    assert not ((y.double() - kernels.reference_mm(x, q, d, m)).abs() <= _sum_bound(x, w)).all()


def test_bfloat16_and_batched_inputs_keep_their_dtype_and_shape():
    q, d, m = _q4_1(24, 64, 7)
    x = _x(6, 64, 8).reshape(2, 3, 64)
    y32 = torch.ops.kvlib_cpu.q4_1_mm(x, q4_1_blocks(q, d, m), 24)
    y16 = torch.ops.kvlib_cpu.q4_1_mm(x.bfloat16(), q4_1_blocks(q, d, m), 24)
    assert y32.shape == y16.shape == (2, 3, 24) and y16.dtype == torch.bfloat16
    assert torch.equal(y32, torch.ops.kvlib_cpu.q4_1_mm(x.reshape(6, 64), q4_1_blocks(q, d, m), 24).reshape(2, 3, 24))


@pytest.mark.parametrize("bad, message", [
    (lambda x, w: (x.double(), w, 24), "float32 or bfloat16"),
    (lambda x, w: (x[:, :48].contiguous(), w, 24), "multiple of 32"),
    (lambda x, w: (x, w[:, :-1].contiguous(), 24), "blocks for 24 outputs"),
    (lambda x, w: (x, w, 25), "blocks for 25 outputs"),
])
def test_bad_inputs_say_what_is_wrong(bad, message):
    q, d, m = _q4_1(24, 64, 9)
    with pytest.raises(RuntimeError, match=message):
        torch.ops.kvlib_cpu.q4_1_mm(*bad(_x(2, 64, 1), q4_1_blocks(q, d, m)))


def test_an_int4_layer_is_its_q4_1_blocks_and_kvlibs_kernel_reads_them_as_they_are():
    """An Int4Linear stores Q4_1 blocks: its integers are quantize_int4_groups's, its weights
    ``d · q + m`` exactly; kvlib's kernel multiplies by those very blocks (nothing laid out again),
    PyTorch's int4 kernel by its own packing of them (scales and zeros in bfloat16)."""
    w = torch.randn(96, 64, generator=torch.Generator().manual_seed(2)) * 0.05
    layer = Int4Linear.from_weight(w)
    q, d, m = layer.unpacked()
    assert torch.equal(q, quantize_int4_groups(w, 32)[0]) and torch.equal(layer.blocks, q4_1_blocks(q, d, m))
    assert (layer.dequantized() - w).abs().max() <= 0.51 * d.max() + 2 ** -10 * w.abs().max()
    x = _x(3, 64, 4)
    pytorch_int4 = layer(x)
    layer.use(Q4_1)
    assert [name for name, _ in layer.named_buffers()] == ["blocks"]
    assert torch.equal(layer(x), torch.ops.kvlib_cpu.q4_1_mm(x, layer.blocks, 96))
    assert (layer(x) - pytorch_int4).abs().max() <= 0.02 * pytorch_int4.abs().max()


def test_q8_0_gives_the_files_blocks_back():
    """Weights that are Q8_0 blocks decoded in float32 (as the real model's embedding is) quantize to
    those very blocks: the scale comes back exact in float16 and every integer with it."""
    g = torch.Generator().manual_seed(3)
    q = torch.randint(-127, 128, (8, 96), generator=g, dtype=torch.int8)
    q[:, ::32] = 127                                              # every block reaches its scale, as ggml's do
    d = (torch.rand(8, 3, generator=g) * 0.01 + 1e-3).half().float()
    w = (q.float().reshape(8, 3, 32) * d[..., None]).reshape(8, 96)
    _, q_again, d_again = q8_0_blocks(w)
    assert torch.equal(q_again, q) and torch.equal(d_again, d)
    assert torch.equal(Q8_0Linear(w).dequantized(), w)


def test_the_plain_loops_compute_what_the_avx2_code_computes(tmp_path):
    """The build without vector flags (KVLIB_KERNELS_SIMD=off, what a CPU without AVX2 gets), in
    its own process (a process loads one library of these names): the same outputs up to float32
    sums; the integer roundings of the activations bit for bit."""
    q, d, m = _q4_1(20, 64, 11)
    x = _x(5, 64, 12)
    torch.save({"x": x, "blocks": q4_1_blocks(q, d, m)}, tmp_path / "in.pt")
    script = ("import sys, torch; from kvlib.fast import kernels; assert kernels.load(), kernels.kernels_missing(); "
              "a = torch.load(sys.argv[1]); torch.save({'simd': kernels.simd(), "
              "'y': torch.ops.kvlib_cpu.q4_1_mm(a['x'], a['blocks'], 20), "
              "'q': torch.ops.kvlib_cpu.quantize_rows(a['x'])}, sys.argv[2])")
    env = {**os.environ, kernels.ENV_SIMD: "off"}
    subprocess.run([sys.executable, "-c", script, str(tmp_path / "in.pt"), str(tmp_path / "out.pt")], env=env, check=True)
    plain = torch.load(tmp_path / "out.pt")
    assert plain["simd"] == "plain loops"
    w = d.repeat_interleave(32, 1) * q.float() + m.repeat_interleave(32, 1)
    assert ((plain["y"].double() - torch.ops.kvlib_cpu.q4_1_mm(x, q4_1_blocks(q, d, m), 20).double()).abs()
            <= 2 * _sum_bound(x, w)).all()
    ours = torch.ops.kvlib_cpu.quantize_rows(x).reshape(5, 2, 40)
    assert torch.equal(plain["q"].reshape(5, 2, 40)[..., 8:], ours[..., 8:])       # the integers


def test_without_a_compiler_the_kernels_say_why(monkeypatch, tmp_path):
    """No C++ compiler and nothing built before: kernels_missing says what to install, and the fast
    path's candidates are PyTorch's kernels only."""
    from kvlib.fast.choose import layer_candidates, output_candidates
    from kvlib import Config, Decoder
    from kvlib.quant import quantize

    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setattr(kernels, "compiler", lambda: None)
    assert "need a C++ compiler" in kernels.kernels_missing()
    model = quantize(Decoder(Config(vocab_size=64, d_model=64, n_layers=1, n_heads=2, n_kv_heads=1, d_mlp=64,
                                    max_seq_len=16)).eval(), "int4")
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    assert set(layer_candidates(layers)) == {"int4"} and set(output_candidates(model)) == {"tied", "int8"}


def test_the_library_is_built_once_and_kept(tmp_path):
    """A second process finds the library built by the first in kvlib's folder and builds nothing."""
    script = ("import json, time, sys; from kvlib.fast import kernels; t = time.perf_counter(); ok = kernels.load(); "
              "print(json.dumps([ok, str(kernels.library_path()), time.perf_counter() - t]))")
    env = {**os.environ, "KVLIB_CACHE_DIR": str(tmp_path)}
    runs = [json.loads(subprocess.run([sys.executable, "-c", script], env=env, check=True, capture_output=True,
                                      text=True).stdout) for _ in range(2)]
    assert runs[0][0] and runs[1][0] and runs[0][1] == runs[1][1]
    assert runs[1][2] < runs[0][2] / 3                     # loading a built file, not compiling it


def test_asking_whether_the_kernels_can_be_used_builds_nothing(monkeypatch, tmp_path):
    """kernels_missing answers from what is here (a compiler, a built library, an earlier failure);
    only load() builds."""
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(kernels, "_state", {})
    monkeypatch.setattr(kernels, "_build", lambda path: pytest.fail("kernels_missing built the kernels"))
    assert kernels.kernels_missing() is None                      # a compiler is here: they can be built
    assert not list(tmp_path.iterdir())


def test_machines_of_another_kind_sharing_a_home_keep_a_library_each(monkeypatch):
    """The library's folder is keyed by the architecture and OS too: an ARM node and an x86 node
    sharing one home folder do not load each other's build."""
    here = kernels.library_path()
    monkeypatch.setattr(kernels.platform, "machine", lambda: "aarch64")
    assert kernels.library_path() != here
    monkeypatch.setattr(kernels, "compiler_version", lambda cxx: "g++ (another) 99.1")
    assert len({here, kernels.library_path()}) == 2


def test_two_processes_building_at_once_build_once(monkeypatch, tmp_path):
    """The build holds a file lock: the second builder waits, then finds the library and builds nothing.
    (Two threads, each its own open lock file, contend as two processes do.)"""
    import threading

    count = tmp_path / "builds"
    monkeypatch.setattr(kernels, "_command", lambda cxx, out, openmp: [
        "sh", "-c", f"echo built >> {count}; sleep 1; touch {out}"])
    path = tmp_path / "lib" / "libkvlib_cpu_kernels.so"
    threads = [threading.Thread(target=kernels._build, args=(path,)) for _ in range(2)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert path.exists() and count.read_text().count("built") == 1


def test_a_home_that_cannot_be_written_is_a_reason_not_a_crash(monkeypatch, tmp_path):
    """A cache folder that cannot be made (here: under a file; on a read-only home, the same
    OSError) leaves the kernels unavailable, with the reason, and the fast path without them."""
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path / "a-file" / "kvlib"))
    monkeypatch.setattr(kernels, "_state", {})
    assert kernels.load() is False
    assert "a-file" in kernels.kernels_missing()


def test_python_m_kvlib_fast_builds_ahead_of_time_or_says_why_not(monkeypatch, capsys):
    """``python -m kvlib.fast`` (make setup, Binder's image) leaves the library where load() finds
    it and names it; where it cannot build, it says why and exits 0 (the kernels are optional)."""
    from kvlib.fast.__main__ import main

    assert main() == 0 and str(kernels.library_path()) in capsys.readouterr().out
    assert kernels.library_path().exists()
    monkeypatch.setattr(kernels, "_state", {"error": "no C++ compiler (a test)"})
    assert main() == 0
    assert "not built: no C++ compiler (a test); kvlib uses PyTorch's kernels alone" in capsys.readouterr().out
