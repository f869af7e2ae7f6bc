"""The optional compiled decode step (``generate(..., compile=True)``) must choose the same tokens.

Compiling takes a while even for a tiny model (about 20 s on two cores), so one model is
compiled once for the module and every test reuses it.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kvlib import Config, Decoder, KVCache, generate
from kvlib.compiled import compiled_decode_step
from kvlib.fast.kernels import kernels_missing

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    cfg = Config(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=48, max_seq_len=96)
    return Decoder(cfg).eval()


def test_compiled_generation_matches_eager(model):
    prompt = [3, 14, 15, 9, 26, 5, 35]
    eager = generate(model, prompt, 24, keep_logits=True)
    compiled = generate(model, prompt, 24, keep_logits=True, compile=True)
    assert compiled.tokens == eager.tokens
    torch.testing.assert_close(compiled.logits, eager.logits, atol=1e-5, rtol=1e-5)
    # the tokens are not a trivial repetition, so the comparison could fail
    assert len(set(eager.tokens)) > 3


def test_one_compilation_serves_new_caches_and_lengths(model):
    from torch._dynamo.utils import counters

    generate(model, [1, 2, 3], 4, compile=True)            # compiled (or already compiled above)
    before = counters["stats"]["unique_graphs"]
    for prompt_len, n_new in [(5, 9), (30, 20), (2, 60)]:  # new caches of other lengths, other positions
        out = generate(model, list(range(1, prompt_len + 1)), n_new, compile=True)
        assert out == generate(model, list(range(1, prompt_len + 1)), n_new)
    assert counters["stats"]["unique_graphs"] == before, "a new cache length made torch.compile compile again"


def test_compiled_step_is_made_once_per_model(model):
    assert compiled_decode_step(model) is compiled_decode_step(model)


def test_compiled_step_rejects_more_than_one_token(model):
    cache = KVCache.for_model(model, max_len=16)
    step = compiled_decode_step(model)
    with pytest.raises(ValueError, match=r"one new token .* shape \(batch, 1\).* got \(1, 3\)"):
        step(torch.tensor([[1, 2, 3]]), cache)


def test_compiled_step_checks_like_the_model(model):
    cache = KVCache.for_model(model, max_len=2)
    step = compiled_decode_step(model)
    step(torch.tensor([[1]]), cache)
    step(torch.tensor([[2]]), cache)
    with pytest.raises(ValueError, match="KV cache is full"):
        step(torch.tensor([[3]]), cache)
    with pytest.raises(ValueError, match="must lie in 0..63"):
        step(torch.tensor([[64]]), KVCache.for_model(model, max_len=4))


def test_compile_needs_the_cache(model):
    with pytest.raises(ValueError, match="compile=True .* use_cache=True"):
        generate(model, [1, 2], 3, use_cache=False, compile=True)


def test_compare_compiled_times_both_side_by_side(model):
    from kvlib.measure.experiments import compare_compiled

    result = compare_compiled(model, [1, 2, 3, 4], 6, repeats=2, progress=False)
    assert result.identical
    assert len(result.eager_seconds) == len(result.compiled_seconds) == 2
    assert len(result.eager.records) == len(result.compiled.records) == 6
    assert result.compile_seconds > 0 and result.eager_step > 0 and result.compiled_step > 0


def test_a_failing_compiler_gives_a_clear_error(model, monkeypatch):
    from torch._inductor.exc import InductorError

    from kvlib.compiled import CompiledDecodeStep

    def no_compiler(*args, **kwargs):
        raise InductorError(RuntimeError("Failed to find a C++ compiler"), "")

    monkeypatch.setattr(torch, "compile", lambda *args, **kwargs: no_compiler)
    step = CompiledDecodeStep(model)
    with pytest.raises(RuntimeError, match=r"needs a working C\+\+ compiler .* compile=False"):
        step(torch.tensor([[1]]), KVCache.for_model(model, max_len=4))


@pytest.fixture(scope="module")
def model_4bit():
    from kvlib.quant import quantize

    torch.manual_seed(1)
    cfg = Config(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=96)
    # int4 layers, bfloat16 activations on every CPU: these tests are about bfloat16's roundings, which
    # quantize() leaves out on a CPU without bfloat16 arithmetic (it computes in float32 there)
    return quantize(Decoder(cfg).eval(), "int4").to(torch.bfloat16)


def test_compiled_4bit_rounds_where_eager_rounds(model_4bit):
    """In bfloat16 the compiled step keeps eager's roundings (emulate_precision_casts): the same
    tokens, and logits within one bfloat16 step. Without it, Inductor keeps fused chains in float32
    and the logits move by several steps (the check below fails: see test_without_emulation...)."""
    prompt = [3, 14, 15, 9, 26, 5, 35]
    eager = generate(model_4bit, prompt, 16, keep_logits=True)
    compiled = generate(model_4bit, prompt, 16, keep_logits=True, compile=True)
    assert compiled.tokens == eager.tokens
    assert _bf16_steps(compiled.logits, eager.logits) <= 1
    assert len(set(eager.tokens)) > 3


def _bf16_steps(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest difference between ``a`` and ``b``, in bfloat16 steps of the larger magnitude."""
    step = torch.maximum(a.abs(), b.abs()).clamp_min(1e-3) * 2.0 ** -7
    return ((a - b).abs() / step).max().item()


def test_without_emulation_the_4bit_logits_move_more(model_4bit):
    """The broken copy of the option: compiled without emulate_precision_casts, the same model's
    logits part from eager's by more than a bfloat16 step (so the test above can fail)."""
    from kvlib.compiled import CompiledDecodeStep, _decode_one_token

    prompt = [3, 14, 15, 9, 26, 5, 35]
    eager = generate(model_4bit, prompt, 16, keep_logits=True)
    step = CompiledDecodeStep(model_4bit)
    step._fn = torch.compile(_decode_one_token, dynamic=True)
    cache = KVCache.for_model(model_4bit, max_len=len(prompt) + 16)
    with torch.no_grad():
        model_4bit(torch.tensor([prompt]), cache, last_only=True)
        logits = [step(torch.tensor([[t]]), cache)[0, -1].float() for t in eager.tokens[:-1]]
    assert _bf16_steps(torch.stack(logits), eager.logits[1:]) > 1


def test_compile_seconds_are_kept(model):
    step = compiled_decode_step(model)
    generate(model, [1, 2], 3, compile=True)
    assert step.compile_seconds is not None and step.compile_seconds > 0


def test_torchs_own_default_folder_does_not_keep_kvlibs_out(monkeypatch, tmp_path):
    """Importing torch._dynamo sets TORCHINDUCTOR_CACHE_DIR to torch's default: kvlib's folder wins
    over that, as over an unset variable (a broken copy that kept it compiled into the shared
    temporary folder, where code compiled by older kvlib operators was loaded)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from kvlib.compiled import compile_cache_dir, cpu_tag, ops_tag

    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", default_cache_dir())
    assert compile_cache_dir() == tmp_path / "torch-compile" / cpu_tag() / ops_tag()


def test_compiled_code_is_kept_in_kvlibs_folder(monkeypatch, tmp_path):
    from kvlib.compiled import compile_cache_dir

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    from kvlib.compiled import cpu_tag, ops_tag

    assert compile_cache_dir() == tmp_path / "torch-compile" / cpu_tag() / ops_tag()
    assert cpu_tag().startswith(torch.backends.cpu.get_cpu_capability().lower() + "-")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert compile_cache_dir() == tmp_path / "mine"           # the user's choice wins


def test_compiled_batch_matches_eager(model):
    from kvlib import generate_batch

    prompts = [[3, 14, 15], [9, 26, 5, 35, 8, 9], [2, 7]]
    eager = generate_batch(model, prompts, 10, keep_logits=True)
    compiled = generate_batch(model, prompts, 10, keep_logits=True, compile=True)
    for a, b in zip(compiled, eager):
        assert a.tokens == b.tokens
        torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)
    with pytest.raises(ValueError, match="compile=True .* use_cache=True"):
        generate_batch(model, prompts, 3, use_cache=False, compile=True)


def test_first_compile_is_announced_with_its_seconds(model, capsys):
    from kvlib.compiled import CompiledDecodeStep

    step = CompiledDecodeStep(model)
    step.announce = True
    cache = KVCache.for_model(model, max_len=4)
    step(torch.tensor([[1]]), cache)
    step(torch.tensor([[2]]), cache)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and lines[0].startswith("compiling the decode step (the first time on a machine")
    assert lines[1] == f"compiled the decode step in {step.compile_seconds:.1f} s"
    generate(model, [1, 2], 3, compile=True)                   # progress=False: nothing printed
    assert capsys.readouterr().out == ""


def test_looking_for_a_compiler_keeps_the_cache_in_kvlibs_folder(monkeypatch, tmp_path):
    """torch settles its cache folder the first time it looks for a compiler (section 5's cell looks
    first): kvlib's folder must be in place by then, or the code lands in the system's temp folder."""
    import os

    from kvlib.compiled import compiler_missing, cpu_tag, ops_tag

    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    compiler_missing("cpu")
    assert os.environ["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "torch-compile" / cpu_tag() / ops_tag())


def test_only_the_cache_and_the_batch_are_symbols(monkeypatch):
    """The weights are marked static, so the traced step's sizes hold a few symbols (the cache's
    length and position, the batch), not one per weight dimension: fewer guards at every call."""
    import kvlib.compiled as compiled

    symbols: list[set] = []

    def recording_backend(gm, example_inputs):
        free = set()
        for x in example_inputs:
            dims = x.shape if isinstance(x, torch.Tensor) else [x]
            free |= {s for d in dims if isinstance(d, torch.SymInt) for s in d.node.expr.free_symbols}
        symbols.append(free)
        return gm.forward

    torch._dynamo.reset()              # forget the steps traced above (of another model's shapes)
    real_compile = torch.compile
    monkeypatch.setattr(compiled.torch, "compile", lambda fn, **kwargs: real_compile(fn, backend=recording_backend,
                                                                                         dynamic=True))
    torch.manual_seed(1)
    cfg = Config(vocab_size=64, d_model=32, n_layers=3, n_heads=4, n_kv_heads=2, d_mlp=48, max_seq_len=96)
    fresh = Decoder(cfg).eval()
    generate(fresh, [1, 2, 3], 3, compile=True)
    # (without the weights marked static, this tiny model's step held 5 symbols; the real one's, dozens)
    assert len(symbols) == 1 and 1 <= len(symbols[0]) <= 3, f"symbols in the traced step: {symbols}"


def test_the_tied_layers_matrix_vector_product_stays_one_kernel():
    """Compiled, the fast path's one-row tied output layer stays PyTorch's matrix-vector kernel (kvlib::matvec):
    Inductor would otherwise write torch.mv out as products and a sum and fuse the final norm
    into each of the vocabulary's rows (a compiled 4-bit step went from 12 to 26 ms that way)."""
    from torch._inductor.utils import run_and_get_code

    from kvlib.compiled import COMPILE_OPTIONS
    from kvlib.fast import TiedHead
    from kvlib.model import RMSNorm

    norm = RMSNorm(64, 1e-5).to(torch.bfloat16)
    head = TiedHead(torch.nn.Embedding.from_pretrained(torch.randn(300, 64).to(torch.bfloat16)))
    x = torch.randn(1, 1, 64).to(torch.bfloat16)
    with torch.no_grad():
        step = torch.compile(lambda x: head(norm(x + 1)), options=COMPILE_OPTIONS)
        logits, code = run_and_get_code(step, x)
        torch.testing.assert_close(logits, head(norm(x + 1)), rtol=2 ** -7, atol=0.05)
    assert "torch.ops.kvlib.matvec.default(" in "".join(code), "the matrix-vector product was written out by Inductor"


def test_the_cpp_wrapper_step_writes_eagers_tokens():
    """The fast path's C++ wrapper (``kvlib.fast.compile_fast_step``, the benchmark's fastest path) generates one around the same
    kernels: the 4-bit model's tokens are eager's and its logits within a bfloat16 step. A model
    keeps one compiled step, so asking it for the other wrapper afterwards is an error."""
    from torch._inductor.utils import run_and_get_code

    from kvlib.fast import CPP_WRAPPER, compile_fast_step
    from kvlib.quant import quantize

    torch.manual_seed(1)
    cfg = Config(vocab_size=64, d_model=64, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=96)
    fresh = quantize(Decoder(cfg).eval(), "int4")
    prompt = [3, 14, 15, 9, 26, 5, 35]
    eager = generate(fresh, prompt, 12, keep_logits=True)
    step = compile_fast_step(fresh)
    compiled, code = run_and_get_code(lambda: generate(fresh, prompt, 12, keep_logits=True, compile=True))
    assert step.options == CPP_WRAPPER and compiled_decode_step(fresh) is step
    assert "inductor_entry_impl" in "".join(code), "the generated step has no C++ wrapper"
    assert compiled.tokens == eager.tokens
    assert _bf16_steps(compiled.logits, eager.logits) <= 1
    with pytest.raises(ValueError, match="cpp_wrapper"):
        compiled_decode_step(fresh, options={})


@pytest.mark.skipif(kernels_missing() is not None, reason="kvlib's CPU kernels cannot be built here")
def test_kvlibs_own_kernels_compile_to_eagers_tokens():
    """The fast path with kvlib's Q4_1 layers and Q8_0 output layer (C++ operators with shapes
    registered for the compiler), compiled: the eager step's tokens, its logits up to float32 sums."""
    from kvlib.fast import KernelChoice, apply_choice, fuse
    from kvlib.quant import quantize

    torch.manual_seed(3)
    cfg = Config(vocab_size=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=96)
    fast = apply_choice(fuse(quantize(Decoder(cfg).eval(), "int4").float()),
                        KernelChoice("q8_0", "q4_1", None))
    eager = generate(fast, [3, 14, 15, 9, 26], 12, keep_logits=True)
    compiled = generate(fast, [3, 14, 15, 9, 26], 12, keep_logits=True, compile=True)
    assert compiled.tokens == eager.tokens
    torch.testing.assert_close(compiled.logits, eager.logits, rtol=1e-4, atol=1e-4)


def test_the_fast_paths_dense_float32_batch_compiles_to_eagers_tokens():
    """Where the kernel choice takes a dense float32 product from some batch size on (an AVX2-only
    CPU), the compiled batched step casts to float32 and back where eager does: the same tokens,
    and logits within a bfloat16 step, for a batch on the dense path."""
    from kvlib.fast import KernelChoice, apply_choice, fuse
    from kvlib.quant import quantize
    from kvlib import generate_batch

    torch.manual_seed(2)
    cfg = Config(vocab_size=64, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=96)
    fast = apply_choice(fuse(quantize(Decoder(cfg).eval(), "int4")),
                        KernelChoice("tied", "int4", 2, dense_kernel="dense float32"))
    prompts = [[3, 14, 15], [9, 26, 5, 35, 8, 9], [2, 7]]                 # 3 rows: the dense float32 path
    eager = generate_batch(fast, prompts, 10, keep_logits=True)
    compiled = generate_batch(fast, prompts, 10, keep_logits=True, compile=True)
    for a, b in zip(compiled, eager):
        assert a.tokens == b.tokens
        assert _bf16_steps(a.logits, b.logits) <= 1
