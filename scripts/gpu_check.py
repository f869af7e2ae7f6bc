#!/usr/bin/env python3
"""Check kvlib on a GPU, and time it: for whoever has one.

    python scripts/gpu_check.py                      # the default device (CUDA when available)
    python scripts/gpu_check.py --device cuda:1      # another GPU
    python scripts/gpu_check.py --device cpu --quick # a small model on the CPU (the test suite's smoke test)

It builds a random-weight :class:`kvlib.Decoder` of SmolLM2-135M's shapes (``--quick``: the
tiny test shapes), nothing downloaded, and on the device:

1. checks the paths the chapter uses: greedy :func:`kvlib.generate` with and without the KV
   cache (the same tokens), :func:`kvlib.generate_batch` and :func:`kvlib.serve.serve` (each
   row the tokens of its prompt alone), in float32;
2. times greedy generation in float32, bfloat16, int8 and int4 (:func:`kvlib.quant.quantize`;
   off the CPU those layers run their reference, dequantized at every call), one prompt and a
   batch of 8, and prints tokens/s as a table;
3. measures the device's memory bandwidth, its matmul FLOP/s in float32 and bfloat16, and
   the weight-read floor of the float32 and bfloat16 models (:mod:`kvlib.measure.hardware`).

The exit status is 1 if a check of step 1 fails, else 0. Greedy tokens can part at a near-tie
of two logits (rounding that differs between kernels); a check says so rather than failing
when the two best logits at the parting step are within ``1e-3``.
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import sys
from pathlib import Path
from typing import NamedTuple

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))           # kvlib from this checkout

import kvlib                                                                # noqa: E402
from kvlib import Config, Decoder                                           # noqa: E402
from kvlib.device import check_device, default_device, describe_device      # noqa: E402
from kvlib.measure.hardware import matmul_flops_per_second, memory_bandwidth, weight_read_floor  # noqa: E402
from kvlib.quant import quantize                                            # noqa: E402
from kvlib.serve import Request, serve                                      # noqa: E402

FORMATS = ("float32", "bfloat16", "int8", "int4")
BATCHES = (1, 8)
NEAR_TIE = 1e-3


class Sizes(NamedTuple):
    """How big a run is: the model's shapes, the prompt and generation lengths, the probes."""

    config: Config
    prompt_len: int
    new_tokens: int
    bandwidth_bytes: int
    matmul_n: int | None
    repeats: int


def sizes(quick: bool) -> Sizes:
    """The real model's shapes (RoPE tables for 512 positions), or the tiny test shapes."""
    if quick:
        return Sizes(Config.tiny(), prompt_len=6, new_tokens=6, bandwidth_bytes=8 * 2**20, matmul_n=128, repeats=2)
    config = dataclasses.replace(Config.smollm2_135m(), max_seq_len=512)
    return Sizes(config, prompt_len=32, new_tokens=64, bandwidth_bytes=512 * 2**20, matmul_n=None, repeats=5)


def build_models(config: Config, device: torch.device) -> dict[str, Decoder]:
    """The four formats of one random-weight model (seed 0), each on ``device``. The quantized
    ones are quantized where they run (int4's packing itself runs on the CPU)."""
    torch.manual_seed(0)
    base = Decoder(config).eval().to(device)
    return {"float32": base, "bfloat16": copy.deepcopy(base).to(torch.bfloat16),
            "int8": quantize(base, "int8"), "int4": quantize(base, "int4")}


def prompts(config: Config, n: int, length: int) -> list[list[int]]:
    """``n`` random prompts of ``length`` tokens (seeded, the same on every device)."""
    g = torch.Generator().manual_seed(1)
    return torch.randint(0, config.vocab_size, (n, length), generator=g).tolist()


def parts_at_a_near_tie(a: list[int], b: list[int], logits: torch.Tensor) -> bool | None:
    """``None`` if ``a == b``; else whether, at the first token where they part, the two best of
    ``logits`` (``a``'s, ``(steps, vocab)``) are within :data:`NEAR_TIE`."""
    step = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if step is None:
        return None if len(a) == len(b) else False
    best = logits[step].float().topk(2).values
    return bool(best[0] - best[1] < NEAR_TIE)


def verdict(a: list[int], b: list[int], logits: torch.Tensor) -> tuple[str, bool]:
    """A word for a report and whether the check passed."""
    tie = parts_at_a_near_tie(a, b, logits)
    if tie is None:
        return "same tokens", True
    return ("part at a near-tie (rounding)", True) if tie else ("DIFFERENT TOKENS", False)


def check_paths(model: Decoder, size: Sizes, device: torch.device) -> bool:
    """Step 1: cached and uncached generation, a batch and the server agree; prints each check."""
    rows = prompts(size.config, 4, size.prompt_len)
    rows[1] = rows[1][: size.prompt_len // 2]                     # prompts of two lengths: padding in the batch
    n = size.new_tokens
    cached = kvlib.generate(model, rows[0], n, keep_logits=True)
    checks = {"generate, without the cache": (kvlib.generate(model, rows[0], n, use_cache=False), cached)}
    alone = [cached] + [kvlib.generate(model, r, n, keep_logits=True) for r in rows[1:]]
    batch = kvlib.generate_batch(model, rows, n)
    served = serve(model, [Request(r, n) for r in rows], max_batch=2, policy="continuous").outputs
    for i, solo in enumerate(alone):
        checks[f"generate_batch, row {i}"] = (batch[i], solo)
        checks[f"serve (continuous, 2 slots), request {i}"] = (served[i], solo)
    ok = True
    print(f"Checks in float32 on {describe_device(device)}, against kvlib.generate with the cache:")
    for name, (tokens, solo) in checks.items():
        word, passed = verdict(solo.tokens, tokens, solo.logits)
        ok &= passed
        print(f"  {name}: {word}")
    return ok


def time_format(model: Decoder, size: Sizes, batch: int, device: torch.device) -> tuple[float, float]:
    """(tokens/s over all steps, tokens/s of the one-token steps alone) of greedy generation of
    ``batch`` prompts, after one untimed warm-up run; each step is timed by kvlib's stopwatch,
    which waits for the device."""
    rows = prompts(size.config, batch, size.prompt_len)
    run = ((lambda: kvlib.generate(model, rows[0], size.new_tokens)) if batch == 1 else
           (lambda: kvlib.generate_batch(model, rows, size.new_tokens)[0]))    # a batch's rows share their records
    run()
    records = run().records
    decode = sum(r.seconds for r in records if r.step > 0)
    whole = batch * size.new_tokens / sum(r.seconds for r in records)
    return whole, (batch * (size.new_tokens - 1) / decode if decode else float("nan"))


def time_formats(models: dict[str, Decoder], size: Sizes, device: torch.device) -> None:
    """Step 2: the table of tokens/s, one row per format and batch size."""
    print(f"\nGreedy generation on {describe_device(device)}: prompts of {size.prompt_len} tokens, "
          f"{size.new_tokens} new tokens each")
    print("| format | batch | tokens/s (prefill + decode) | decode tokens/s |")
    print("|---|---:|---:|---:|")
    for name, model in models.items():
        for batch in BATCHES:
            whole, decode = time_format(model, size, batch, device)
            print(f"| {name} | {batch} | {whole:,.1f} | {decode:,.1f} |")


def measure(models: dict[str, Decoder], size: Sizes, device: torch.device) -> None:
    """Step 3: bandwidth, FLOP/s and weight-read floors on ``device``."""
    bandwidth = memory_bandwidth(size.bandwidth_bytes, repeats=size.repeats, device=device)
    how = "summing a buffer" if device.type == "cpu" else "a device-to-device copy, read + write"
    print(f"\nMeasured on {describe_device(device)}:")
    print(f"  memory bandwidth: {bandwidth / 1e9:,.1f} GB/s ({how})")
    for dtype in (torch.float32, torch.bfloat16):
        flops = matmul_flops_per_second(size.matmul_n, repeats=size.repeats, dtype=dtype, device=device)
        print(f"  dense matmul, {str(dtype).removeprefix('torch.')}: {flops / 1e12:,.2f} TFLOP/s")
    for name in ("float32", "bfloat16"):
        model = models[name]
        nbytes = sum(p.numel() * p.element_size() for p in model.parameters())
        floor = weight_read_floor(model, repeats=size.repeats)
        print(f"  weight-read floor, {name}: {floor * 1e3:,.2f} ms per step "
              f"(reading its {nbytes / 2**20:,.2f} MiB at the measured bandwidth: {nbytes / bandwidth * 1e3:,.3f} ms)")


def main(argv: list[str] | None = None) -> int:
    """Run the three steps; 1 if a check failed, else 0."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", help="cpu, cuda, cuda:N or mps (default: kvlib.default_device())")
    parser.add_argument("--quick", action="store_true", help="the tiny test shapes instead of SmolLM2-135M's")
    args = parser.parse_args(argv)
    device = check_device(args.device, "--device") if args.device else default_device()
    size = sizes(args.quick)
    if device.type == "cpu" and not args.quick:
        print("Note: running the full-size model on the CPU; this takes a while (--quick for the tiny one).")
    print(f"kvlib {kvlib.__version__}, PyTorch {torch.__version__} (CUDA {torch.version.cuda}), "
          f"{'tiny test shapes' if args.quick else 'SmolLM2-135M shapes'}, random weights\n")
    models = build_models(size.config, device)
    ok = check_paths(models["float32"], size, device)
    time_formats(models, size, device)
    measure(models, size, device)
    print("\nAll checks passed." if ok else "\nA CHECK FAILED: see above.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.stdout.reconfigure(line_buffering=True)                # each line as it comes, even into a file
    sys.exit(main())
