"""Checks for the exercises of *Quantization* (section 8).

- 8.1 is an experiment: the bytes of SmolLM2-135M's tensors stored as Q8_0, predicted (graded
  against the exact count from the model's shapes and Q8_0's blocks, the same on every machine,
  which is what gguf's quantizer writes) and explained (why a scale per 32 weights).
- 8.2 quantizes a weight matrix to asymmetric int4 in groups; the check names a zero point one
  step off, a scale over 16 steps instead of 15, groups taken along the wrong dimension.
- 8.3, a token the int8 cache flips, is in :mod:`kvlib.exercises.quantization_flip`.
- 8.4 is a derivation: the batch at which a 4-bit model's decode step stops being
  memory-bound (the roofline's knee, from given reference numbers) and why prefill does not
  get faster with 4-bit weights (a choice).

A wrong number that matches a typical mistake fails with a hint that names it; every choice,
right or wrong, is told why.
"""
from __future__ import annotations

from typing import Callable

import torch

from ..config import Config
from ..measure.roofline import decode_knee
from ..quant.formats import quantize_int4_groups
from .framework import Case, check_choice, check_prediction, diagnose, refuse_library_answer, run_check, student_answer

__all__ = ["check_q8_0_bytes", "check_q8_0_explanation", "check_quantize_int4", "check_quantized_knee",
           "check_prefill_explanation", "q8_0_model_bytes"]


# ---------------------------------------------------------------------------------------------
# Exercise 8.1: the Q8_0 file, predicted
# ---------------------------------------------------------------------------------------------

Q8_0_BLOCK = (32, 34)       # weights, bytes: 32 int8 weights and one float16 scale
Q4_1_FILE_TENSOR_BYTES = 96_576_768     # SmolLM2-135M's GGUF file as shipped (Q4_1 layers): cell 14 counts it


def weight_counts(config: Config) -> tuple[int, int, int]:
    """``(layer_weights, embedding_weights, norm_gains)`` of a Llama-style decoder: the weights of
    every layer's seven matrices (q, k, v, o, gate, up, down), of the embedding (which is also the
    output layer, stored once), and of the 1-D norm gains (two per layer and a final one)."""
    c = config
    kv = c.n_kv_heads * c.head_dim
    per_layer = 2 * c.d_model * c.d_model + 2 * kv * c.d_model + 3 * c.d_mlp * c.d_model
    return c.n_layers * per_layer, c.vocab_size * c.d_model, (2 * c.n_layers + 1) * c.d_model


def q8_0_model_bytes(config: Config | None = None, *, block_bytes: int = Q8_0_BLOCK[1], embedding_copies: int = 1,
                     norm_bytes: int = 4) -> int:
    """Bytes of a model's tensors with every matrix (the embedding included, once) in Q8_0 blocks
    of 32 weights in ``block_bytes`` bytes and the norm gains in float32 (SmolLM2-135M by
    default). The keywords give the typical mistakes."""
    layers, embedding, norms = weight_counts(config or Config.smollm2_135m())
    matrices = layers + embedding_copies * embedding
    return matrices // Q8_0_BLOCK[0] * block_bytes + norms * norm_bytes


def _q8_0_mistakes() -> list[tuple[float, str]]:
    """(the number a mistake gives, the sentence that names it) for SmolLM2-135M."""
    layers, embedding, norms = weight_counts(Config.smollm2_135m())
    n = layers + embedding + norms
    return [
        (q8_0_model_bytes(block_bytes=32),
         "that is about 1 byte a weight: the block scales are missing. Each block of 32 int8 weights carries "
         "a float16 scale, 34 bytes per 32 weights (8.5 bits), not 32."),
        (q8_0_model_bytes(block_bytes=36),
         "Q8_0's scale is a float16 (2 bytes), not a float32: a block is 32 + 2 = 34 bytes."),
        (q8_0_model_bytes(embedding_copies=2),
         "the embedding is counted twice: SmolLM2 ties its output layer to the embedding, and the file "
         "stores that matrix once (49,152 × 576 weights)."),
        (q8_0_model_bytes(embedding_copies=0),
         "the embedding is missing: it is a 2-D matrix too (49,152 × 576), stored in Q8_0 like the layers, "
         "and the largest single tensor of the model."),
        (Q4_1_FILE_TENSOR_BYTES,
         "that is the file as it ships, its layers in Q4_1 (cell 14 printed it); the question is the same "
         "tensors with every matrix in Q8_0."),
        (4 * n, "4 bytes a weight is float32; Q8_0 is 1 byte a weight plus a 2-byte scale per 32."),
        (2 * n, "2 bytes a weight is a 16-bit format; Q8_0 is 1 byte a weight plus a 2-byte scale per 32."),
        (8 * q8_0_model_bytes(), "that is the number of bits; divide by 8 for bytes."),
    ]


def check_q8_0_bytes(fn) -> None:
    """Exercise 8.1, the prediction: ``fn()`` returns the bytes of SmolLM2-135M's tensors with every
    2-D matrix (the embedding included, stored once) in Q8_0 and the 61 norm gains in float32.
    Passes within 1 % of the exact count (the norms' few bytes either way pass too)."""
    exercise = "Exercise 8.1"
    predicted = student_answer(exercise, fn, "your predicted number of bytes")
    exact = q8_0_model_bytes()
    why = ("bytes = (the weights of every matrix, the embedding once) / 32 blocks × 34 bytes a block, plus "
           "4 bytes for each of the norms' gains.")
    number = isinstance(predicted, (int, float)) and not isinstance(predicted, bool)
    if number and abs(predicted - exact) > 0.01 * exact:
        if any(abs(predicted * unit - exact) <= 0.02 * exact for unit in (10 ** 6, 2 ** 20)):
            why = "your number looks like megabytes: the check wants bytes (multiply MB by 10**6)."
        for value, sentence in _q8_0_mistakes():
            if abs(predicted - value) <= 0.01 * value:
                why = sentence
                break
    check_prediction(exercise, predicted, exact, rel_tol=0.01, what="the bytes of SmolLM2-135M's tensors in Q8_0",
                     why=why)


Q8_0_CHOICES = {
    "a": (False, "GGUF aligns where each tensor starts in the file (to 32 bytes by default), not its blocks: a "
                 "Q8_0 block is 34 bytes, not a multiple of 32, and the blocks follow one another with no gap."),
    "b": (True, "A scale follows the largest weight it covers. With one per row, a single large weight sets the "
                "step for all 576 or 1,536 weights of its row and the rest round coarsely; with one per 32 it "
                "coarsens only its 31 neighbours, and every other block keeps a step fitted to its own range. "
                "Half a bit per weight buys a smaller rounding error (the measurement above)."),
    "c": (False, "Q8_0's scale is a float16: 2 bytes per 32 weights is the half bit (8 + 16/32 = 8.5 bits). A "
                 "float32 scale would make it 9 bits."),
    "d": (False, "A per-row scale is one multiplication per output; CPU kernels use it happily (kvlib's "
                 "Int8Linear runs PyTorch's per-row int8 kernel on this CPU). The blocks are paid for their "
                 "accuracy, not because kernels cannot do otherwise."),
}


def check_q8_0_explanation(fn) -> None:
    """Exercise 8.1, the explanation: ``fn()`` returns the letter of the reason llama.cpp pays for a
    scale per 32 weights (8.5 bits) where one per row would cost about 8.03 bits."""
    exercise = "Exercise 8.1"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), Q8_0_CHOICES)


# ---------------------------------------------------------------------------------------------
# Exercise 8.2: asymmetric int4 in groups
# ---------------------------------------------------------------------------------------------

def _int4(w, group_size, *, zero_shift=8.0, levels=15, transpose=False, groups_first=False):
    if transpose:                      # groups of group_size consecutive rows in each column
        q, s, z = _int4(w.t().contiguous(), group_size)
        return (q.t(), s.t(), z.t()) if groups_first else (q.t(), s, z)
    g = w.reshape(w.shape[0], -1, group_size)
    lo, hi = g.amin(-1), g.amax(-1)
    scale = (hi - lo) / levels
    q = torch.round((g - lo[..., None]) / scale[..., None]).clamp(0, 15).reshape(w.shape)
    return q, scale, lo + zero_shift * scale


_MISTAKES_INT4: list[tuple[str, Callable]] = [
    ("the zero is the group's minimum; with w = (q - 8) · scale + zero it must be min + 8 · scale "
     "(q = 8 stands for the zero).", lambda w, g: _int4(w, g, zero_shift=0.0)),
    ("16 levels lie 15 steps apart: scale = (max - min) / 15, not / 16.", lambda w, g: _int4(w, g, levels=16)),
]


def check_quantize_int4(fn: Callable) -> None:
    """Exercise 8.2: ``fn(w, group_size)`` returns ``(q, scale, zero)`` with ``q`` in 0..15
    ``(out, in)`` and ``scale``, ``zero`` ``(out, in // group_size)``, so that each group of
    ``group_size`` consecutive inputs of a row is ``(q - 8) · scale + zero``."""
    g = torch.Generator().manual_seed(8)
    # the square case first: there a mistake that runs down the columns still runs, and is named
    specs = [("64 rows of 64, groups of 32", (64, 64, 32)), ("4 rows of 64, groups of 32", (4, 64, 32)),
             ("one row, one group", (1, 32, 32)),
             ("8 rows of 128, groups of 64", (8, 128, 64)), ("rows far from 0", (3, 64, 32))]
    cases = []
    for name, (rows, cols, group) in specs:
        w = torch.randn(rows, cols, generator=g) + (5.0 if "far" in name else 0.0)
        q, scale, zero = _int4(w, group)
        cases.append(Case(name, (w, group), (q.float(), scale, zero), atol=1e-4))
    if callable(fn):
        refuse_library_answer("Exercise 8.2", fn, {"quantize_int4_groups": quantize_int4_groups})

    def as_floats(w, group_size):
        out = fn(w, group_size)
        return tuple(t.float() if isinstance(t, torch.Tensor) else t for t in out) if isinstance(out, tuple) else out

    down_the_columns = ("the groups run down the columns: a group is group_size consecutive inputs of one row "
                        "(reshape to (out, in // group_size, group_size)).")
    hint = diagnose(as_floats, cases, _MISTAKES_INT4 + [
        (down_the_columns, lambda w, gs: _int4(w, gs, transpose=True)),
        (down_the_columns, lambda w, gs: _int4(w, gs, transpose=True, groups_first=True)),
    ]) or ("per group: which integer stands for the group's minimum, and which for its maximum? Write both in "
           "(q - 8) · scale + zero and solve for scale and zero.")
    run_check("Exercise 8.2", as_floats if callable(fn) else fn, cases, hint=hint)


# ---------------------------------------------------------------------------------------------
# Exercise 8.4: where weight-only quantization stops helping
# ---------------------------------------------------------------------------------------------

# The statement's reference numbers: a 4-bit and a float32 SmolLM2-135M, a laptop-class CPU.
KNEE_NUMBERS = dict(w4=96e6, w32=538e6, bandwidth=20e9, flops_per_s=100e9, flops_per_token=270e6)


def _knee(weight_bytes: float, bandwidth: float, flops_per_s: float, flops_per_token: float) -> float:
    """The statement's knee: the weights alone (its numbers leave the cache out)."""
    return decode_knee(weight_bytes=weight_bytes, flops_per_token=flops_per_token, cache_bytes_per_row=0,
                       flops_per_s=flops_per_s, bytes_per_s=bandwidth)


def check_quantized_knee(fn) -> None:
    """Exercise 8.4, the prediction: ``fn()`` returns the batch size at which the 4-bit model's decode
    step stops being memory-bound (the roofline's knee) with the statement's reference numbers.
    Passes within 15 % (a batch of 2, the first whole batch past the knee, passes)."""
    exercise = "Exercise 8.4"
    predicted = student_answer(exercise, fn, "your predicted batch size")
    k = KNEE_NUMBERS
    exact = _knee(k["w4"], k["bandwidth"], k["flops_per_s"], k["flops_per_token"])
    float32 = _knee(k["w32"], k["bandwidth"], k["flops_per_s"], k["flops_per_token"])
    known = [
        (1 / exact, "this is the inverse: the knee is where batch × FLOPs per token ÷ FLOP/s grows to weight "
                    "bytes ÷ bandwidth, B* = (W / β)(π / f)."),
        (float32, "that is the float32 model's knee (538 MB of weights); the 4-bit model reads 96 MB per step."),
        (k["w4"] / k["flops_per_s"] * k["bandwidth"] / k["flops_per_token"],
         "bandwidth and FLOP/s are swapped: reading takes W / β, the arithmetic of a batch B · f / π."),
        (8 * exact, "the 96 MB are bytes, like the bandwidth's 20 GB per second; multiplying by 8 counts bits."),
        (float32 / 4, "the 4-bit weights are not a quarter of the float32 bytes: with their scales, and an "
                      "8-bit embedding, they take 96 MB against 538 (0.18). Use the bytes given."),
        (float32 / 8, "4 bits are an eighth of 32, but the 4-bit model's scales and its 8-bit embedding make "
                      "96 MB against 538 (0.18), not an eighth. Use the bytes given."),
    ]
    why = "B* = (W / β)(π / f): the bytes of the 4-bit weights over the bandwidth, times FLOP/s over FLOPs per token."
    number = isinstance(predicted, (int, float)) and not isinstance(predicted, bool)
    if number and abs(predicted - exact) > 0.15 * exact:
        for value, sentence in known:
            if abs(predicted - value) <= 0.05 * value:
                why = sentence
                break
    check_prediction(exercise, predicted, exact, rel_tol=0.15,
                     what="the 4-bit model's knee (the batch size at which its decode step stops being memory-bound)",
                     why=why)
    print(f"  (float32's knee with the same numbers: {float32:.1f}; the 4-bit weights move it down "
          f"{float32 / exact:.1f} times, the ratio of their bytes.)")


PREFILL_CHOICES = {
    "a": (False, "The weight-only kernel reads each 4-bit weight once per matrix product, for all the prompt's "
                 "tokens together: a prefill reads fewer bytes with 4-bit weights, not more."),
    "b": (False, "The cache of a few hundred tokens is a few megabytes, written once; the prefill's time goes to "
                 "its hundred-odd GFLOP of matrix products, not to writing the cache."),
    "c": (True, "A prefill of hundreds of tokens reuses every weight it reads for each of them: at 270 MFLOP per "
                "token it is far past the knee, so arithmetic sets its time and fewer bytes do not shorten it. "
                "Weight-only quantization saves bytes, not FLOPs. And on any CPU the weight-only kernel does that "
                "arithmetic less efficiently than float32's matrix library: it unpacks and scales every weight "
                "before it multiplies, and it is written for the few rows of a decode step, not for hundreds; "
                "which is why the prefill can even get slower."),
    "d": (False, "At a few hundred tokens attention's own products are a small share of the FLOPs (section 4 "
                 "counted them); the linear layers dominate. And a step that quantization does not touch would "
                 "take as long as before, not longer."),
}


def check_prefill_explanation(fn) -> None:
    """Exercise 8.4, the explanation: ``fn()`` returns the letter of the reason a prefill does not get
    faster with 4-bit weights."""
    exercise = "Exercise 8.4"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), PREFILL_CHOICES)
