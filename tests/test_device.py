"""Devices: kvlib.default_device and its errors; the quantized layers' two paths (the CPU kernel
and a dense weight built once, what runs off the CPU); measurements on a chosen device; and,
marked ``gpu`` (skipped without CUDA), the chapter's paths on a CUDA GPU against the CPU."""
from __future__ import annotations

import copy
import dataclasses
import importlib.util
import platform
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kvlib
from kvlib import Config, Decoder
from kvlib.device import ENV_VAR, check_device, default_device, describe_device
from kvlib.fast import concat_linears
from kvlib.measure import hardware
from kvlib.quant import INT4, INT8, REFERENCE, Int4Linear, Int8Linear, quantize
from kvlib.serve import Request, serve

ROOT = Path(__file__).resolve().parent.parent
CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="no CUDA GPU: torch.cuda.is_available() is False (a CPU build of "
                                                 "PyTorch, or no GPU visible); run `pytest -m gpu` on a GPU machine")
QUANTIZED = (Int8Linear, Int4Linear)


@pytest.fixture
def no_env(monkeypatch):
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def fake_cuda(monkeypatch):
    """Two CUDA GPUs, as far as kvlib.device can tell (nothing is run on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=None: f"Fake GPU {i}")


@pytest.fixture
def no_cuda(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def use_reference(model: torch.nn.Module, on: bool = True) -> torch.nn.Module:
    """Every quantized layer of ``model`` on the reference kernel (dequantize, then F.linear: what
    runs off the CPU), or back on PyTorch's CPU kernels."""
    for m in model.modules():
        if isinstance(m, QUANTIZED):
            m.use(REFERENCE if on else (INT8 if isinstance(m, Int8Linear) else INT4))
    return model


def logits(model: Decoder, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids.to(model.device)).float().cpu()


def bf16_noise(model: Decoder, ids: torch.Tensor) -> float:
    """How far rounding to bfloat16 moves ``model``'s logits, on average: the yardstick for two
    bf16 computations of the same model (the CPU kernel and a dense weight, the CPU and a GPU)."""
    return float((logits(copy.deepcopy(model).to(torch.bfloat16), ids) - logits(model, ids)).abs().mean())


def assert_within_bf16(got: torch.Tensor, expected: torch.Tensor, noise: float) -> None:
    """Two bf16 computations of one model: as close on average as bf16 is to float32 (3× slack),
    and any greedy choice they disagree on is a near-tie (best two within 10× that)."""
    assert float((got - expected).abs().mean()) <= 3 * noise
    top = expected.topk(2, dim=-1).values
    parted = got.argmax(-1) != expected.argmax(-1)
    assert bool(((top[..., 0] - top[..., 1])[parted] <= 10 * noise).all())


# ------------------------------------------------------------------- default_device

def test_default_device_is_the_cpu_without_cuda(no_env, no_cuda):
    assert default_device() == torch.device("cpu")


def test_default_device_is_the_current_gpu_with_cuda(no_env, fake_cuda):
    assert default_device() == torch.device("cuda", 0)


@pytest.mark.parametrize("value, expected", [("cpu", "cpu"), (" cpu ", "cpu"), ("cuda", "cuda:0"), ("cuda:1", "cuda:1")])
def test_the_environment_variable_chooses(monkeypatch, fake_cuda, value, expected):
    monkeypatch.setenv(ENV_VAR, value)
    assert default_device() == torch.device(expected)


def test_an_empty_environment_variable_means_unset(monkeypatch, no_cuda):
    monkeypatch.setenv(ENV_VAR, "")
    assert default_device() == torch.device("cpu")


@pytest.mark.parametrize("value, cuda, message", [
    ("gpu", False, "not a device PyTorch knows"),
    ("cuda", False, "CUDA is not available"),
    ("cuda:0", False, "CUDA is not available"),
    ("cuda:2", True, "there is no CUDA device 2: this machine has 2"),
    ("meta", False, "holds shapes only"),
])
def test_a_device_the_machine_lacks_is_a_clear_error(monkeypatch, value, cuda, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setenv(ENV_VAR, value)
    with pytest.raises(ValueError, match=message) as err:
        default_device()
    assert f"{ENV_VAR}={value.strip()!r}" in str(err.value) and "unset it" in str(err.value)


def test_mps_is_refused_where_there_is_none(monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    with pytest.raises(ValueError, match="MPS"):
        check_device("mps")


def test_default_device_is_exported():
    assert kvlib.default_device is default_device and "default_device" in kvlib.__all__


def test_describe_device(fake_cuda):
    assert describe_device("cpu").startswith("CPU (") and f"{torch.get_num_threads()} threads)" in describe_device("cpu")
    assert describe_device("cuda:1") == "CUDA:1 (Fake GPU 1)" and describe_device("cuda") == "CUDA:0 (Fake GPU 0)"


def test_load_smollm2_puts_the_model_on_the_default_device(monkeypatch):
    import kvlib.device
    import kvlib.smollm2 as smol

    seen = {}
    monkeypatch.setattr(kvlib.device, "default_device", lambda: torch.device("meta"))
    monkeypatch.setattr(smol, "smollm2_path", lambda path, download: "model.gguf")
    monkeypatch.setattr(smol, "open_gguf", lambda file: None)
    monkeypatch.setattr(smol, "load_gguf_decoder", lambda reader, **kw: seen.update(kw) or "model")
    monkeypatch.setattr(smol.Tokenizer, "from_gguf", classmethod(lambda cls, reader, path: "tokenizer"))
    assert smol.load_smollm2() == ("model", "tokenizer") and seen["device"] == torch.device("meta")
    smol.load_smollm2(device="cpu")
    assert seen["device"] == "cpu"


def test_load_smollm2_checks_the_device_before_the_file(monkeypatch, no_cuda):
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(ValueError, match="CUDA is not available"):
        kvlib.load_smollm2("/nonexistent/model.gguf", download=False)


# ------------------------------------------------------------------- the quantized layers' two paths

def _layer(kind: str, out: int = 128, inp: int = 256, seed: int = 0):
    w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed))
    return Int8Linear.from_weight(w) if kind == "int8" else Int4Linear.from_weight(w)


def _x(inp: int = 256, dtype=torch.bfloat16) -> torch.Tensor:
    return torch.randn(2, 5, inp, generator=torch.Generator().manual_seed(1)).to(dtype)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_cpu_path_is_the_kernel_bit_for_bit(kind):
    layer, x = _layer(kind), _x()
    rows = x.reshape(-1, 256)
    if kind == "int8":
        y = torch.ops.aten._weight_int8pack_mm(rows, layer.q, layer.kernel_scale)
    else:
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(rows, layer.int4_packed, 32, layer.int4_scales.view(torch.bfloat16))
    assert torch.equal(layer(x), y.reshape(2, 5, 128))


@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_reference_agrees_with_the_kernel_up_to_bf16(kind, dtype):
    layer, x = _layer(kind), _x(dtype=dtype)
    kernel = layer(x)
    reference = use_reference(layer)(x)
    assert reference.dtype == kernel.dtype == dtype and reference.shape == kernel.shape
    assert torch.equal(reference, torch.nn.functional.linear(x, layer.dequantized().to(dtype)))
    # each product rounded to bf16 (the kernel's operands and scales): a few bf16 steps of the largest
    bound = 2 ** -6 * float((x.float().abs() @ layer.dequantized().abs().t()).max())
    torch.testing.assert_close(reference.float(), kernel.float(), rtol=0, atol=bound)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_the_state_dict_is_the_format_and_loading_it_lays_the_kernel_out_again(kind):
    """A state dict saves the stored format only (not the kernel's packing of it); loading another
    layer's lays out the kernel's operands anew, so the layer then computes what the other does."""
    layer, other, x = _layer(kind), _layer(kind, seed=5), _x()
    assert set(layer.state_dict()) == ({"q", "scale"} if kind == "int8" else {"blocks"})
    before = layer(x)
    layer.load_state_dict(other.state_dict())
    assert torch.equal(layer(x), other(x)) and not torch.equal(layer(x), before)


@pytest.mark.parametrize("kind", ["int8", "int4"])
def test_concatenated_layers_stack_their_weights(kind):
    layers = [_layer(kind, out=64, seed=s) for s in (1, 2, 3)]
    fused = concat_linears(layers)
    assert torch.equal(fused.dequantized(), torch.cat([layer.dequantized() for layer in layers]))
    expected = torch.cat([layer(_x()) for layer in layers], dim=-1)
    torch.testing.assert_close(fused(_x()), expected, rtol=0, atol=2 ** -7 * float(expected.abs().max()))


@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_a_quantized_model_on_the_reference_agrees_with_the_kernels(scheme):
    torch.manual_seed(0)
    model = Decoder(Config.tiny()).eval()
    ids = torch.randint(0, 64, (2, 24), generator=torch.Generator().manual_seed(2))
    q = quantize(model, scheme)
    kernel = logits(q, ids)
    assert_within_bf16(logits(use_reference(q), ids), kernel, bf16_noise(model, ids))
    assert torch.equal(logits(use_reference(q, False), ids), kernel)


# ------------------------------------------------------------------- measurements on a device

def test_measurements_on_the_cpu_are_positive_floats(no_env):
    model = Decoder(Config.tiny()).eval()
    values = [hardware.memory_bandwidth(8 * 2**20, repeats=2, device="cpu"),
              hardware.matmul_flops_per_second(64, repeats=2, device="cpu"),
              hardware.weight_read_floor(model, repeats=2), hardware.weight_read_floor(model, repeats=2, device="cpu")]
    assert all(type(v) is float and v > 0 for v in values)


def test_measurements_run_where_they_are_told(monkeypatch, no_cuda):
    model = Decoder(Config.tiny()).eval()
    monkeypatch.setenv(ENV_VAR, "cpu")
    assert hardware.measurement_device() == torch.device("cpu") == hardware.measurement_device(model=model)
    assert hardware.measured_on().startswith("CPU (")
    monkeypatch.setenv(ENV_VAR, "cuda")
    with pytest.raises(ValueError, match=f"{ENV_VAR}='cuda': CUDA is not available"):
        hardware.memory_bandwidth(8 * 2**20, repeats=1)
    with pytest.raises(ValueError, match="device='cuda': CUDA is not available.*kvlib.default_device"):
        hardware.matmul_flops_per_second(64, device="cuda")


def test_machine_description_names_the_devices(no_env):
    m = hardware.machine_description()
    assert m["devices"][0].startswith("CPU (") and m["default_device"] in m["devices"]
    assert m["torch_threads"] >= 1 and "cuda" in m


# ------------------------------------------------------------------- scripts/gpu_check.py

def _gpu_check():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_gpu_check_script_runs_quick_on_the_cpu(capsys):
    assert _gpu_check().main(["--device", "cpu", "--quick"]) == 0
    out = capsys.readouterr().out
    assert all(f"| {name} | {batch} |" in out for name in ("float32", "bfloat16", "int8", "int4") for batch in (1, 8))
    assert "memory bandwidth:" in out and "TFLOP/s" in out and "All checks passed." in out
    assert "DIFFERENT" not in out and "CPU (" in out


def test_the_gpu_check_script_refuses_a_missing_device(no_cuda):
    with pytest.raises(ValueError, match="--device='cuda': CUDA is not available"):
        _gpu_check().main(["--device", "cuda", "--quick"])


# ------------------------------------------------------------------- on a CUDA GPU (pytest -m gpu)

@pytest.fixture(scope="module")
def real_shapes():
    """A random-weight decoder of SmolLM2-135M's shapes (RoPE tables for 512 positions) on the
    CPU, the same on the GPU, a prompt, and the bf16 noise of its logits."""
    torch.manual_seed(0)
    cpu = Decoder(dataclasses.replace(Config.smollm2_135m(), max_seq_len=512)).eval()
    ids = torch.randint(0, cpu.config.vocab_size, (1, 32), generator=torch.Generator().manual_seed(1))
    return cpu, copy.deepcopy(cpu).to("cuda"), ids, bf16_noise(cpu, ids)


def _same_or_near_tie(tokens: list[int], reference: kvlib.Generation, tie: float = 1e-3) -> bool:
    """The same tokens as ``reference``, or parting where its two best logits are within ``tie``."""
    step = next((i for i, (a, b) in enumerate(zip(tokens, reference.tokens)) if a != b), None)
    if step is None:
        return len(tokens) == len(reference.tokens)
    best = reference.logits[step].topk(2).values
    return bool(best[0] - best[1] < tie)


@pytest.mark.gpu
@needs_cuda
def test_cuda_is_the_default_device(no_env):
    assert default_device().type == "cuda" and describe_device(default_device()).startswith("CUDA:")


@pytest.mark.gpu
@needs_cuda
def test_float32_on_cuda_with_and_without_the_cache(real_shapes):
    cpu, gpu, ids, _ = real_shapes
    prompt = ids[0, :16].tolist()
    cached = kvlib.generate(gpu, prompt, 24, keep_logits=True)
    assert kvlib.generate(gpu, prompt, 24, use_cache=False) == cached.tokens
    assert _same_or_near_tie(kvlib.generate(cpu, prompt, 24), cached)
    torch.testing.assert_close(logits(gpu, ids), logits(cpu, ids), rtol=0, atol=1e-2)


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("scheme", ["int8", "int4"])
def test_quantized_on_cuda_agrees_with_the_cpu_kernels(real_shapes, scheme, monkeypatch):
    cpu, gpu, ids, noise = real_shapes
    on_cpu = quantize(cpu, scheme)
    moved = copy.deepcopy(on_cpu).to("cuda")                     # the reference kernel runs there
    on_gpu = quantize(gpu, scheme)                               # quantized where it runs
    expected = logits(on_cpu, ids)
    assert_within_bf16(logits(moved, ids), expected, noise)
    assert_within_bf16(logits(on_gpu, ids), expected, noise)
    cached = kvlib.generate(moved, ids[0, :16].tolist(), 8, keep_logits=True)
    assert _same_or_near_tie(kvlib.generate(moved, ids[0, :16].tolist(), 8, use_cache=False), cached, 10 * noise)
    assert torch.equal(logits(moved.to("cpu"), ids), expected)   # back on the CPU: the kernels again


@pytest.mark.gpu
@needs_cuda
def test_generate_batch_and_serve_on_cuda(real_shapes):
    _, gpu, ids, _ = real_shapes
    prompts = [ids[0, :n].tolist() for n in (16, 9, 16, 3)]
    alone = [kvlib.generate(gpu, p, 10, keep_logits=True) for p in prompts]
    batch = kvlib.generate_batch(gpu, prompts, 10)
    served = serve(gpu, [Request(p, 10) for p in prompts], max_batch=2).outputs
    assert all(_same_or_near_tie(b, a) and _same_or_near_tie(s, a) for a, b, s in zip(alone, batch, served))


@pytest.mark.gpu
@needs_cuda
def test_measurements_on_cuda(real_shapes):
    cpu, gpu, _, _ = real_shapes
    values = [hardware.memory_bandwidth(64 * 2**20, repeats=3, device="cuda"),
              hardware.matmul_flops_per_second(repeats=3, device="cuda"),
              hardware.matmul_flops_per_second(repeats=3, dtype=torch.bfloat16, device="cuda"),
              hardware.weight_read_floor(gpu, repeats=3), hardware.weight_read_floor(cpu, repeats=3, device="cuda")]
    assert all(type(v) is float and v > 0 for v in values)
    assert hardware.measured_on(model=gpu).startswith("CUDA:")
    assert any(d.startswith("CUDA:") for d in hardware.machine_description()["devices"])


@pytest.mark.gpu
@needs_cuda
def test_the_gpu_check_script_runs_quick_on_cuda(capsys):
    assert _gpu_check().main(["--device", "cuda", "--quick"]) == 0
    assert "CUDA:" in capsys.readouterr().out


FRAGMENT = """
import ctypes, sys
from kvlib.device import return_freed_memory
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def rss():
    return next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmRSS"))
libc.mallopt(-3, 32 * 2**20)                        # M_MMAP_THRESHOLD: blocks of 2 MiB come from the heap
blocks = [libc.malloc(2**21) for _ in range(300)]   # 300 blocks of 2 MiB, touched
for block in blocks:
    ctypes.memset(block, 1, 2**21)
for block in blocks[::2]:                           # every other one freed: the heap cannot shrink from its
    libc.free(block)                                # top past the live ones between them
before = rss()
said = return_freed_memory() if sys.argv[1] == "trim" else None
print(before, rss(), said)
"""


@pytest.mark.skipif(not (sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"),
                    reason="malloc_trim is glibc's")
@pytest.mark.parametrize("trim", [True, False])
def test_return_freed_memory_gives_back_what_glibc_keeps(trim):
    """With glibc, memory freed in the heap stays in the process until malloc_trim; the helper must
    call it. The run without it shows that the freed memory would have stayed (else the test proves
    nothing); a copy of the helper that only returns True fails the first case."""
    out = subprocess.run([sys.executable, "-c", FRAGMENT, "trim" if trim else "keep"], capture_output=True,
                         text=True, check=True).stdout.split()
    before, after = int(out[0]), int(out[1])
    if trim:
        assert out[2] == "True" and before - after > 200 * 2**20, f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB"
    else:
        assert before - after < 50 * 2**20, f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB without a trim"
