"""Checks for the exercises of *Quantization* (section 8).

- 8.1 is an experiment: the bytes of SmolLM2-135M's tensors stored as Q8_0, predicted (graded
  against the exact count from the model's shapes and Q8_0's blocks, the same on every machine,
  which is what gguf's quantizer writes) and explained (why a scale per 32 weights).
- 8.2 quantizes a weight matrix to asymmetric int4 in groups; the check names a zero point one
  step off, a scale over 16 steps instead of 15, groups taken along the wrong dimension.
- 8.3 is an experiment on the real model: ``first_flip`` (checked on a tiny random model whose
  cache is made to flip), a prediction of the logits at a flip (a choice), and a search for a
  chat question whose int8-cached answer flips, which the check verifies by running both
  caches itself.
- 8.4 is a derivation: the batch at which a 4-bit model's decode step stops being
  memory-bound (the roofline's knee, from given reference numbers) and why prefill does not
  get faster with 4-bit weights (a choice).

A wrong number that matches a typical mistake fails with a hint that names it; every choice,
right or wrong, is told why.
"""
from __future__ import annotations

import operator
from typing import Callable, NamedTuple, Sequence

import torch

from ..cache.base import KVCache, LayerKVCache
from ..config import Config
from ..model import Decoder
from .framework import Case, CheckFailed, check_choice, check_prediction, describe, diagnose, run_check, student_answer

__all__ = ["check_q8_0_bytes", "check_q8_0_explanation", "check_quantize_int4", "check_first_flip",
           "check_flip_prediction", "check_found_flip", "check_quantized_knee", "check_prefill_explanation",
           "q8_0_model_bytes", "FoundFlip"]


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

    def as_floats(w, group_size):
        out = fn(w, group_size)
        return tuple(t.float() if isinstance(t, torch.Tensor) else t for t in out) if isinstance(out, tuple) else out

    down_the_columns = ("the groups run down the columns: a group is group_size consecutive inputs of one row "
                        "(reshape to (out, in // group_size, group_size)).")
    hint = diagnose(as_floats, cases, _MISTAKES_INT4 + [
        (down_the_columns, lambda w, gs: _int4(w, gs, transpose=True)),
        (down_the_columns, lambda w, gs: _int4(w, gs, transpose=True, groups_first=True)),
    ]) or "per group: lo, hi = min, max; scale = (hi - lo) / 15; q = round((w - lo) / scale); zero = lo + 8 · scale."
    run_check("Exercise 8.2", as_floats if callable(fn) else fn, cases, hint=hint)


# ---------------------------------------------------------------------------------------------
# Exercise 8.3: find a token the int8 cache flips
# ---------------------------------------------------------------------------------------------

FLIP_TOKENS = 16            # new tokens per question in the search
FLIP_MARGIN = 1e-3          # both caches must choose their token by more than this (logits)


def _first_flip(model, prompt, n_new, make_cache):
    """The reference: the first index where greedy tokens with ``make_cache()`` differ from float32's."""
    from ..generate import generate

    exact = generate(model, prompt, n_new)
    other = generate(model, prompt, n_new, cache=make_cache())
    return next((i for i, (a, b) in enumerate(zip(exact, other)) if a != b), None)


class _ScaledKeysLayer(LayerKVCache):
    """A layer cache that hands back the keys of positions ``start`` on multiplied by ``factor``:
    a cache made to differ from float32's from a known position on (for the check only)."""

    def __init__(self, *args, start: int, factor: float) -> None:
        super().__init__(*args)
        self.start, self.factor = start, factor

    def update(self, pos, k, v):
        k_all, v_all = super().update(pos, k, v)
        if k_all.shape[2] > self.start:
            k_all = k_all.clone()
            k_all[:, :, self.start:] *= self.factor
        return k_all, v_all


class _ScaledKeysKVCache(KVCache):
    def __init__(self, *args, start: int = 0, factor: float = -1.0, **kwargs) -> None:
        self.start, self.factor = start, factor
        super().__init__(*args, **kwargs)

    def make_layer(self, *args) -> LayerKVCache:
        return _ScaledKeysLayer(*args, start=self.start, factor=self.factor)


class _CacheMaker:
    """A ``make_cache`` argument that says what it makes when a check's message shows it."""

    def __init__(self, what: str, make: Callable[[], KVCache]) -> None:
        self.what, self.make = what, make

    def __call__(self) -> KVCache:
        return self.make()

    def __repr__(self) -> str:
        return self.what


class _TinyDecoder(Decoder):
    def __repr__(self) -> str:
        return "a tiny random Decoder (Config.tiny(), seed 0)"


def _flip_cases() -> list[Case]:
    with torch.random.fork_rng(devices=[]):            # leave the caller's random state as it was
        torch.manual_seed(0)
        model = _TinyDecoder(Config.tiny()).eval()
    prompt = torch.randint(0, model.config.vocab_size, (8,), generator=torch.Generator().manual_seed(0)).tolist()

    def maker(what, cls=KVCache, **kwargs):
        return _CacheMaker(what, lambda: cls.for_model(model, max_len=32, **kwargs))

    specs = [
        ("a float32 kvlib.KVCache: the same answer", 16, maker("a float32 kvlib.KVCache")),
        ("every key negated: the answers part at once", 16,
         maker("a cache that negates every key", _ScaledKeysKVCache, start=0, factor=-1.0)),
        ("keys from position 12 on scaled by -3", 16,
         maker("a cache that scales the keys of positions 12 on by -3", _ScaledKeysKVCache, start=12, factor=-3.0)),
        ("the same cache, 3 new tokens: no flip yet", 3,
         maker("a cache that scales the keys of positions 12 on by -3", _ScaledKeysKVCache, start=12, factor=-3.0)),
        ("keys from position 10 on halved", 16,
         maker("a cache that halves the keys of positions 10 on", _ScaledKeysKVCache, start=10, factor=0.5)),
    ]
    with torch.no_grad():
        return [Case(name, (model, prompt, n, make), _first_flip(model, prompt, n, make)) for name, n, make in specs]


def _flip_mistake(got, expected, prompt, n_new) -> str | None:
    """The sentence that names the mistake giving ``got`` where ``expected`` is right, or ``None``."""
    if expected is None:
        if got in (-1, n_new, len(prompt) + n_new) or got is False:
            return "when the two answers agree on all n_new tokens, return None (not -1, False or n_new)."
        return None
    if got is None:
        return ("your function found no difference where there is one: one run must use the float32 cache "
                "(kvlib.generate's default), the other a fresh cache from make_cache().")
    if got == expected + 1:
        return "count the new tokens from 0: the first new token has index 0."
    if got == len(prompt) + expected:
        return "return the index among the new tokens, not the position in the whole sequence (prompt included)."
    return None


def check_first_flip(fn: Callable) -> None:
    """Exercise 8.3, the function: ``fn(model, prompt, n_new, make_cache)`` is the index (from 0) of the
    first of ``n_new`` greedy tokens where generation with the cache ``make_cache()`` returns differs
    from generation with a float32 :class:`kvlib.KVCache`, or ``None`` if all ``n_new`` agree.
    Tried on a tiny random model with caches made to differ from a known position on."""
    exercise = "Exercise 8.3"
    cases = _flip_cases()
    hint = "generate n_new tokens with each cache and return the first index where the two lists differ."
    if callable(fn):
        for case in cases:
            try:
                with torch.no_grad():
                    got = fn(*case.args)
            except Exception:             # run_check reports it
                break
            if got != case.expected:
                hint = _flip_mistake(got, case.expected, case.args[1], case.args[2]) or hint
                break
    with torch.no_grad():
        run_check(exercise, fn, cases, hint=hint)


FLIP_CHOICES = {
    "a": (True, "Rounding the keys and values to int8 moves every score a little, a fraction of a logit. That "
                "reorders the two best tokens only where they were about that close: a near-tie, far closer "
                "than at a typical token, where the chosen one leads by a logit or more."),
    "b": (False, "The int8 cache keeps every key and value within half a step of its own: it nudges the scores, "
                 "it does not break a step. A token far ahead of the next survives the nudge."),
    "c": (False, "An exact tie would be decided by the order argmax breaks ties in, not by the int8 cache; the "
                 "check refuses a flip whose float32 logits are closer than 1e-3 for that reason. The two best "
                 "logits are close, not equal."),
    "d": (False, "The prompt's length sets how many vectors are rounded, but whether a token flips depends on "
                 "how close its two best candidates were to begin with."),
}


def check_flip_prediction(fn) -> None:
    """Exercise 8.3, the prediction: ``fn()`` returns the letter of what one should expect of the
    float32 cache's two best logits at a token the int8 cache flips."""
    exercise = "Exercise 8.3"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), FLIP_CHOICES)


class FoundFlip(NamedTuple):
    """A flip :func:`check_found_flip` verified: the question, and the index of the new token."""

    question: str
    index: int


def _margins(logits: torch.Tensor) -> torch.Tensor:
    """The gap between the two largest logits of each row."""
    top2 = logits.topk(2, dim=-1).values
    return top2[..., 0] - top2[..., 1]


def check_found_flip(fn: Callable, model: torch.nn.Module, tokenizer, *, questions: Sequence[str] | None = None,
                     n_new: int = FLIP_TOKENS) -> FoundFlip:
    """Exercise 8.3, the search: ``fn(model, tokenizer, questions, n_new)`` returns ``(question, index)``,
    a question (encoded with ``tokenizer.encode_chat``) whose greedy answer with a
    :class:`kvlib.Int8KVCache` first parts from the float32 cache's at new token ``index`` (< ``n_new``).

    The check runs both caches itself and passes only if the answers agree before ``index``, differ
    at it, and each cache chose its token there by more than ``FLIP_MARGIN`` between its two best
    logits: then the int8 rounding made the flip, not a float tie that another CPU could undo.
    ``questions`` defaults to ``kvlib.data.CHAT_QUESTIONS``. Returns the verified flip."""
    from ..cache.quantized import Int8KVCache
    from ..data import CHAT_QUESTIONS
    from ..generate import generate

    exercise = "Exercise 8.3"
    questions = CHAT_QUESTIONS if questions is None else questions
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    try:
        with torch.no_grad():
            found = fn(model, tokenizer, questions, n_new)
    except NotImplementedError:
        raise CheckFailed(f"{exercise}: not written yet — replace the NotImplementedError in your function "
                          f"with your search.") from None
    except Exception as e:                                   # show the student's own error, briefly
        raise CheckFailed(f"{exercise}: your search raised {type(e).__name__}: {e}") from None
    if found is None:
        raise CheckFailed(f"{exercise}: your search found no flip among the {len(questions)} questions. Some "
                          f"answers do part within {n_new} tokens: check that first_flip passes its check, and "
                          f"that your search does not ask for more margin than a flip has: at a flip the float32 "
                          f"cache's two best logits are close.")
    try:
        question, index = found
        index = operator.index(index)
    except (TypeError, ValueError):
        raise CheckFailed(f"{exercise}: your search should return (question, index), a string and an int, "
                          f"got {describe(found)}") from None
    if not isinstance(question, str):
        raise CheckFailed(f"{exercise}: the question should be the text of the question (a string), got "
                          f"{describe(question)}")
    if not 0 <= index < n_new:
        raise CheckFailed(f"{exercise}: the index counts the new tokens from 0, so it lies in 0..{n_new - 1}; "
                          f"got {index}")
    prompt = tokenizer.encode_chat(question)
    with torch.no_grad():
        exact = generate(model, prompt, index + 1, return_records=True)
        other = generate(model, prompt, index + 1, return_records=True,
                         cache=Int8KVCache.for_model(model, max_len=len(prompt) + index + 1))
    parted = next((i for i, (a, b) in enumerate(zip(exact.tokens, other.tokens)) if a != b), None)

    def word(token: int) -> str:
        return repr(tokenizer.decode([token]))

    where = f"{exercise}: {question!r}, new token {index}"
    if parted is not None and parted < index:
        raise CheckFailed(f"{where}: the answers already part at new token {parted} (float32 "
                          f"{word(exact.tokens[parted])}, int8 {word(other.tokens[parted])}); the first flip is "
                          f"there, not at {index}.")
    if parted is None:
        raise CheckFailed(f"{where}: both caches choose {word(exact.tokens[index])} there, so the answers have "
                          f"not parted yet; the index is where they first differ.")
    gaps = {"float32": _margins(exact.logits[index]).item(), "int8": _margins(other.logits[index]).item()}
    for name, gap in gaps.items():
        if gap <= FLIP_MARGIN:
            raise CheckFailed(f"{where}: refused. The {name} cache's two best logits there are only "
                              f"{gap:.1e} apart (more than {FLIP_MARGIN:g} is needed): a tie that float rounding "
                              f"on another CPU could decide the other way, not a flip the int8 rounding made. "
                              f"Try another prompt, or have your search ask for a larger margin.")
    before = tokenizer.decode(exact.tokens[:index])
    before = before if len(before) <= 60 else "…" + before[-60:]
    print(f"✓ {exercise}: {question!r} parts at new token {index}: after {before!r} the float32 cache writes "
          f"{word(exact.tokens[index])}, the int8 cache {word(other.tokens[index])}. Margins between the two best "
          f"logits there: float32 {_approx(gaps['float32'])}, int8 {_approx(gaps['int8'])}, both above "
          f"{FLIP_MARGIN:g}: a flip the int8 rounding made.")
    return FoundFlip(question, index)


def _approx(x: float) -> str:
    from ..measure import fmt_approx

    return fmt_approx(x, ".3f")


# ---------------------------------------------------------------------------------------------
# Exercise 8.4: where weight-only quantization stops helping
# ---------------------------------------------------------------------------------------------

# The statement's reference numbers: a 4-bit and a float32 SmolLM2-135M, a laptop-class CPU.
KNEE_NUMBERS = dict(w4=96e6, w32=513e6, bandwidth=20e9, flops_per_s=100e9, flops_per_token=270e6)


def _knee(weight_bytes: float, bandwidth: float, flops_per_s: float, flops_per_token: float) -> float:
    return weight_bytes / bandwidth * flops_per_s / flops_per_token


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
        (float32, "that is the float32 model's knee (513 MB of weights); the 4-bit model reads 96 MB per step."),
        (k["w4"] / k["flops_per_s"] * k["bandwidth"] / k["flops_per_token"],
         "bandwidth and FLOP/s are swapped: reading takes W / β, the arithmetic of a batch B · f / π."),
        (8 * exact, "the 96 MB are bytes, like the bandwidth's 20 GB per second; multiplying by 8 counts bits."),
        (float32 / 4, "the 4-bit weights are not a quarter of the float32 bytes: with their scales, and an "
                      "8-bit embedding, they take 96 MB against 513 (0.19). Use the bytes given."),
        (float32 / 8, "4 bits are an eighth of 32, but the 4-bit model's scales and its 8-bit embedding make "
                      "96 MB against 513 (0.19), not an eighth. Use the bytes given."),
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
                "Weight-only quantization saves bytes, not FLOPs; and the kernel converts the weights and "
                "multiplies in bfloat16, on a CPU without fast bfloat16 arithmetic slower than float32's library, "
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
