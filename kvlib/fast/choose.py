"""Which kernel each part of the fast path runs, chosen by measuring this machine once.

Two choices depend on the CPU (its vector instructions, its caches, its memory), so kvlib
measures them rather than guessing, and keeps the result in its folder
(:func:`kvlib.paths.cache_dir`, ``kernels/``) for the next run on the same machine:

- **the output layer** (the embedding, transposed: the largest matrix of a small model):
  multiplied in bfloat16 as stored (the tied embedding), or stored again as per-row int8,
  which reads half the bytes but rounds the weights a second time. int8 is chosen only when a
  whole decode step is faster with it by a clear margin (:data:`OUTPUT_INT8_MARGIN`): it moves
  the predictions, the tied layer does not. The step, not the layer alone: timed alone, a layer
  can sit in the processor's caches and look faster than it is inside a step, where every weight
  streams through them (the benchmark's appendix gives one machine's figures). The int8 kernel
  pays off for one row only: with more, its arithmetic costs more than the bytes it saves, so an
  int8 output layer also gets an ``output_dense_from`` (the same rule as the 4-bit layers', below),
  from which it multiplies by its own weight dequantized once;
- **the 4-bit layers at each batch size**: at one row a step only reads the weights, and the
  int4 kernel reads a quarter of bfloat16's bytes; with many rows the arithmetic catches up,
  and a dense product of the dequantized weights may win. Which dense product: bfloat16 where
  the CPU multiplies it fast (AVX-512 with bfloat16 instructions, AMX), float32 where it does
  not (an AVX2-only CPU converts every bfloat16 number first), whichever is faster at the
  largest batch size measured (``dense_kernel``). ``dense_from`` is the smallest batch size
  measured from which that product is faster, for every larger size measured too (``None``: the
  int4 kernel at every size). A float32 dense copy holds twice a bfloat16 one's bytes.

The choice changes which kernel runs, never what is computed beyond the order of float
roundings; ``tests/fast/test_choose.py`` checks that the greedy tokens stay the model's own.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from functools import partial
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from ..clock import median_seconds
from ..cache.base import KVCache
from ..device import cpu_name
from ..paths import cache_dir
from ..quant.linear import COMPUTE_DTYPE, Int4Linear, Int8Linear

__all__ = ["KernelChoice", "OUTPUT_INT8_MARGIN", "DENSE_MARGIN", "BATCH_SIZES", "DENSE_KERNELS", "measure_kernels",
           "dense_against_kernel", "choose", "dense_kernel", "dense_from", "kernel_choice", "choice_path",
           "apply_choice"]

OUTPUT_INT8_MARGIN = 0.95   # int8 output layer only when a decode step with it takes under 95 % of the tied one's
DENSE_MARGIN = 0.9          # dense 4-bit layers only when they take under 90 % of the int4 kernel's time
BATCH_SIZES = (1, 8, 32)
DENSE_KERNELS = {"dense bfloat16": torch.bfloat16, "dense float32": torch.float32}   # the dense candidates
# How the candidates are run and timed: in every machine key, so that a choice kept from an
# earlier way of running them (the output layer alone, before tied_logits) is measured again.
MEASURED_AS = "kvlib kernels 6"

Timer = Callable[[Callable[[], object]], float]
# Median of up to 30 calls, fewer where a call is slow (a dense bfloat16 product of every layer can
# take seconds on a CPU without bfloat16 instructions): the measurement stays a matter of seconds.
MEDIAN_IN_HALF_A_SECOND: Timer = partial(median_seconds, warmup=2, budget_s=0.5)


@dataclass
class KernelChoice:
    """What the fast path runs on this machine, and the measurements (milliseconds) it was chosen from."""

    output_layer: str                   # "tied bfloat16" or "int8"
    dense_from: int | None              # batch size from which the 4-bit layers use their dense weight
    output_ms: dict[str, float] = field(default_factory=dict)          # output layer -> ms of a decode step
    layers_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # batch size -> kernel -> ms, all 4-bit layers
    machine: str = ""
    output_dense_from: int | None = None  # batch size from which an int8 output layer uses its dense weight
    output_rows_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # batch size -> kernel -> ms
    dense_kernel: str = "dense bfloat16"          # the 4-bit layers' dense product, from dense_from on
    output_dense_kernel: str = "dense bfloat16"   # an int8 output layer's, from output_dense_from on


def _layer_shapes(model: torch.nn.Module) -> list[Int4Linear]:
    """One 4-bit layer of each distinct (out, in) shape in ``model`` (every layer repeats them)."""
    shapes: dict[tuple[int, int], Int4Linear] = {}
    for m in model.modules():
        if isinstance(m, Int4Linear):
            shapes.setdefault((m.out_features, m.in_features), m)
    return list(shapes.values())


@torch.no_grad()
def measure_kernels(model: torch.nn.Module, batch_sizes: Sequence[int] = BATCH_SIZES,
                    timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> tuple[dict[str, float], dict[str, dict[str, float]],
                                                            dict[str, dict[str, float]]]:
    """Time the candidates on this machine: a decode step of ``model`` with each output layer
    (tied bfloat16, int8); every 4-bit layer of ``model`` once, back to back, with the int4 kernel
    and as dense products (:func:`dense_against_kernel`); and the int8 output layer alone, likewise,
    at the batch sizes above one. Milliseconds: ``(output_ms, layers_ms, output_rows_ms)`` for
    :func:`choose`. Every layer, not one of each shape: alone, a layer's weights stay in the
    processor's caches, where a dense float32 copy (eight times the int4 bytes) looks faster than
    it is in a step, which streams them all from memory."""
    heads = {"tied bfloat16": None, "int8": Int8Linear.from_weight(model.embed.weight.detach().float())}
    output_ms: dict[str, float] = {}
    for _ in range(2):                    # in turns, the lower of two, so that drift does not favour one
        for name, head in heads.items():
            output_ms[name] = min(output_ms.get(name, float("inf")), _decode_step_ms(model, head, timer))
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    layers_ms = dense_against_kernel(layers, "int4", batch_sizes, timer)
    output_rows_ms = dense_against_kernel([heads["int8"]], "int8", [b for b in batch_sizes if b > 1], timer)
    return output_ms, layers_ms, output_rows_ms


def dense_against_kernel(layers: Sequence[Int4Linear | Int8Linear], kernel: str, batch_sizes: Sequence[int],
                         timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> dict[str, dict[str, float]]:
    """Milliseconds of ``layers``, each once, back to back, with their own kernel (named ``kernel``)
    and as dense products: batch size -> kernel -> ms. From the largest batch size down: every one
    of :data:`DENSE_KERNELS` at the largest, then only the one faster there (:func:`dense_kernel`),
    and no smaller size once it loses there (what :func:`dense_from` decides needs no more)."""
    weights = [layer.dequantized() for layer in layers]                       # float32 (out, in) each, once
    out: dict[str, dict[str, float]] = {}
    candidates = list(DENSE_KERNELS)
    for rows in sorted(batch_sizes, reverse=True):
        out[str(rows)] = ms = _products_ms(layers, weights, kernel, candidates, rows, timer)
        candidates = [dense_kernel(out)]
        if ms[candidates[0]] >= DENSE_MARGIN * ms[kernel]:
            break
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


def _products_ms(layers: Sequence[Int4Linear | Int8Linear], weights: Sequence[torch.Tensor], kernel: str,
                 candidates: Sequence[str], rows: int, timer: Timer) -> dict[str, float]:
    """One batch size of :func:`dense_against_kernel`: the layers' kernel, then each candidate's
    product with ``weights`` cast to its dtype (the input cast to that dtype and the output back,
    as a layer's dense path does; the copies are dropped afterwards)."""
    xs = {n: torch.randn(1, rows, n).to(COMPUTE_DTYPE) for n in {layer.in_features for layer in layers}}  # (1, rows, in)
    out = {kernel: 1e3 * timer(lambda: [layer(xs[layer.in_features]) for layer in layers])}
    for name in candidates:
        dtype = DENSE_KERNELS[name]
        dense = [w.to(dtype) for w in weights]                                      # (out, in) each
        out[name] = 1e3 * timer(lambda: [F.linear(xs[w.shape[1]].to(dtype), w).to(COMPUTE_DTYPE) for w in dense])
        del dense
    return out


def _decode_step_ms(model: torch.nn.Module, head: torch.nn.Module | None, timer: Timer) -> float:
    """Milliseconds of one cached decode step of ``model`` with ``head`` as its output layer
    (``None``: the tied embedding), after up to 63 tokens; ``model``'s own layer is put back."""
    kept, model.lm_head = model.lm_head, head
    try:
        n = min(64, model.config.max_seq_len)
        ids = torch.randint(0, model.config.vocab_size, (1, n), generator=torch.Generator().manual_seed(0))
        ids = ids.to(model.device)
        cache = KVCache.for_model(model, max_len=n)
        model(ids[:, :-1], cache)

        def step() -> None:
            cache.truncate(n - 1)           # the same step every call
            model(ids[:, -1:], cache, last_only=True)
        return 1e3 * timer(step)
    finally:
        model.lm_head = kept


def choose(output_ms: dict[str, float], layers_ms: dict[str, dict[str, float]], machine: str = "",
           output_rows_ms: dict[str, dict[str, float]] | None = None) -> KernelChoice:
    """The rule, from measurements alone (see the module's docstring for why the margins)."""
    int8_wins = output_ms["int8"] < OUTPUT_INT8_MARGIN * output_ms["tied bfloat16"]
    rows = output_rows_ms or {}
    dense, out_dense = dense_kernel(layers_ms), dense_kernel(rows)
    return KernelChoice("int8" if int8_wins else "tied bfloat16", dense_from(layers_ms, "int4", dense), output_ms,
                        layers_ms, machine, dense_from(rows, "int8", out_dense) if int8_wins else None, rows,
                        dense, out_dense)


def dense_kernel(ms: dict[str, dict[str, float]]) -> str:
    """The dense candidate (of :data:`DENSE_KERNELS`) measured fastest at the largest batch size in
    ``ms`` (batch size -> kernel -> ms), where a dense product matters most; bfloat16, the
    activations' own dtype, where ``ms`` is empty or times no other."""
    if not ms:
        return "dense bfloat16"
    at = ms[str(max(int(b) for b in ms))]
    return min((name for name in DENSE_KERNELS if name in at), key=at.__getitem__)


def dense_from(ms: dict[str, dict[str, float]], kernel: str, dense: str = "dense bfloat16") -> int | None:
    """The smallest batch size in ``ms`` (batch size -> kernel -> ms) from which the ``dense``
    product takes under :data:`DENSE_MARGIN` of ``kernel``'s time, at that size and every larger one."""
    sizes = sorted(int(b) for b in ms)
    wins = [ms[str(b)].get(dense, float("inf")) < DENSE_MARGIN * ms[str(b)][kernel] for b in sizes]
    return next((b for i, b in enumerate(sizes) if all(wins[i:])), None)


def machine_key(model: torch.nn.Module) -> str:
    """What the measurement depends on: the CPU, its vector instructions as PyTorch uses them, the
    threads, PyTorch's version, and the model's layer shapes."""
    shapes = sorted({(m.out_features, m.in_features) for m in _layer_shapes(model)})
    return (f"{MEASURED_AS} | {cpu_name()} | {torch.backends.cpu.get_cpu_capability()} | {torch.get_num_threads()} threads | "
            f"torch {torch.__version__} | vocab {model.config.vocab_size} x {model.config.d_model} | {shapes}")


def choice_path() -> Path:
    """The file where the measured choices are kept, one entry per :func:`machine_key`."""
    return cache_dir() / "kernels" / "choices.json"


def kernel_choice(model: torch.nn.Module, *, refresh: bool = False, timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> KernelChoice:
    """This machine's :class:`KernelChoice` for ``model`` (a native 4-bit :class:`kvlib.Decoder`):
    read from :func:`choice_path` when measured before here, else measured now (a few seconds)
    and kept. ``refresh=True`` measures again."""
    key = machine_key(model)
    path = choice_path()
    kept = json.loads(path.read_text()) if path.exists() else {}
    if key in kept and not refresh:
        return KernelChoice(**kept[key])
    output_ms, layers_ms, output_rows_ms = measure_kernels(model, timer=timer)
    choice = choose(output_ms, layers_ms, key, output_rows_ms)
    kept[key] = asdict(choice)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(kept, indent=1) + "\n")
    return choice


@torch.no_grad()
def apply_choice(model: torch.nn.Module, choice: KernelChoice) -> torch.nn.Module:
    """Set ``model``'s kernels (in place) as ``choice`` says: the output layer, and each 4-bit layer's
    ``dense_from`` and dense product's dtype, with its dense weight built now (not inside a compiled
    step); an int8 output layer's ``output_dense_from`` likewise."""
    if choice.output_layer == "int8":
        model.lm_head = Int8Linear.from_weight(model.embed.weight.float())
        _set_dense(model.lm_head, choice.output_dense_from, choice.output_dense_kernel)
    elif choice.output_layer == "tied bfloat16":
        model.lm_head = None
    else:
        raise ValueError(f"unknown output layer {choice.output_layer!r}: 'tied bfloat16' or 'int8'")
    for m in model.modules():
        if isinstance(m, Int4Linear):
            _set_dense(m, choice.dense_from, choice.dense_kernel)
    return model


def _set_dense(layer: Int4Linear | Int8Linear, rows: int | None, kernel: str) -> None:
    if kernel not in DENSE_KERNELS:
        raise ValueError(f"unknown dense kernel {kernel!r}: one of {sorted(DENSE_KERNELS)}")
    layer.dense_from, layer.dense_dtype = rows, DENSE_KERNELS[kernel]
    if rows is not None:
        layer.dense_weight(layer.dense_dtype)
