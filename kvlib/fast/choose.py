"""Which kernel each part of the fast path runs, chosen by measuring this machine once.

Which kernel is fastest depends on the CPU (its vector instructions, its caches, its memory), so
kvlib measures rather than guesses, and keeps the result in its folder (:func:`kvlib.paths.cache_dir`,
``kernels/``) for the next run on the same machine:

- **the 4-bit layers' packed kernel**: PyTorch's int4 kernel (bfloat16 activations), or kvlib's
  own Q4_1 kernel (:mod:`kvlib.fast.kernels`: activations rounded to 8 bits per block of 32, integer
  dot products, as llama.cpp multiplies), where a C++ compiler could build it. The faster at one
  row, where a step does little more than read the packed weights;
- **the 4-bit layers at each batch size**: with many rows the arithmetic catches up, and a dense
  product of the dequantized weights may win. Which dense product: bfloat16 where the CPU
  multiplies it natively (:func:`kvlib.device.bfloat16_is_fast`), else float32 only (an AVX2-only CPU
  converts every bfloat16 number first); of those measured, the faster at the largest batch size
  (``dense_kernel``). ``dense_from`` is the smallest batch size measured from which it takes under
  :data:`DENSE_MARGIN` of the packed kernel's time, at every larger size measured too (``None``:
  the packed kernel at every size). A float32 dense copy holds twice a bfloat16 one's bytes;
- **the output layer** (the embedding, transposed: the largest matrix of a small model): the tied
  embedding as the model holds it, a per-row int8 copy (PyTorch's kernel), or Q8_0 blocks (kvlib's
  kernel, the model file's own format for it). Each is timed inside a whole decode step (alone, a
  layer can sit in the processor's caches and look faster than it is in a step, where every weight
  streams through them); another than the tied one only when the step is faster with it by a clear
  margin (:data:`OUTPUT_MARGIN`), since it rounds the embedding again. Its kernel pays off for few
  rows; from ``output_dense_from`` on it multiplies by its weight dequantized once (the same rule).

The choice changes which kernel runs; kvlib's kernels also round the activations to 8 bits, which
moves the logits a little (the benchmark measures how much). ``tests/fast/test_choose.py`` checks
that every choice writes the model's own greedy tokens up to near-ties.
"""
from __future__ import annotations

import json
import os
import tempfile
import warnings
from dataclasses import asdict, dataclass, field, fields
from functools import partial
from pathlib import Path
from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..clock import median_seconds
from ..device import bfloat16_is_fast, cpu_name
from ..measure.flops import step_call
from ..paths import cache_dir
from ..quant.linear import INT4, Int4Linear, Int8Linear, Kernel
from . import kernels
from .dense import DenseFrom
from .gguf_linear import Q4_1, Q8_0Linear
from .heads import TiedHead

__all__ = ["KernelChoice", "LAYER_KERNELS", "OUTPUT_MARGIN", "DENSE_MARGIN", "BATCH_SIZES", "DENSE_KERNELS", "dense_candidates",
           "layer_candidates", "output_candidates", "measure_kernels", "dense_against_kernels", "choose",
           "dense_kernel", "dense_from", "kernel_choice", "choice_path", "apply_choice"]

OUTPUT_MARGIN = 0.95        # another output layer only when a decode step with it takes under 95 % of the tied one's
DENSE_MARGIN = 0.9          # dense weights only when they take under 90 % of the packed kernel's time
BATCH_SIZES = (1, 8, 32)
DENSE_KERNELS = {"dense bfloat16": torch.bfloat16, "dense float32": torch.float32}   # the dense products
# How the candidates are run and timed: in every machine key, so that a choice kept from an
# earlier way of running them is measured again.
MEASURED_AS = "kvlib kernels 8"

Timer = Callable[[Callable[[], object]], float]
# Median of up to 30 calls, fewer where a call is slow: the measurement stays a matter of seconds.
MEDIAN_IN_HALF_A_SECOND: Timer = partial(median_seconds, repeats=30, warmup=2, budget_s=0.5)


@dataclass
class KernelChoice:
    """What the fast path runs on this machine, and the measurements (milliseconds) it was chosen from."""

    output_layer: str                   # "tied", "int8" or "q8_0"
    layer_kernel: str                   # the 4-bit layers' packed kernel: "int4" (PyTorch's) or "q4_1" (kvlib's)
    dense_from: int | None              # batch size from which the 4-bit layers use their dense weight
    dense_kernel: str = "dense float32"             # the 4-bit layers' dense product, from dense_from on
    output_dense_from: int | None = None            # likewise for an int8 or Q8_0 output layer
    output_dense_kernel: str = "dense float32"
    output_ms: dict[str, float] = field(default_factory=dict)              # output layer -> ms of a decode step
    layers_ms: dict[str, dict[str, float]] = field(default_factory=dict)   # batch size -> kernel -> ms, all 4-bit layers
    output_rows_ms: dict[str, dict[str, float]] = field(default_factory=dict)  # batch size -> kernel -> ms
    machine: str = ""


def dense_candidates() -> list[str]:
    """The dense products worth timing here: float32, and bfloat16 where the CPU multiplies it natively."""
    return [name for name, dtype in DENSE_KERNELS.items() if dtype != torch.bfloat16 or bfloat16_is_fast("cpu")]


LAYER_KERNELS: dict[str, Kernel] = {"int4": INT4, "q4_1": Q4_1}     # the 4-bit layers' packed kernels


def layer_candidates(layers: Sequence[Int4Linear]) -> dict[str, list[nn.Module]]:
    """``layers`` with each packed kernel: PyTorch's int4 kernel, and kvlib's Q4_1 kernel where it
    builds here (:func:`kvlib.fast.kernels.load`). Layers sharing ``layers``' blocks, not copies;
    a layer that already has the kernel is itself."""
    names = ["int4", "q4_1"] if kernels.load() else ["int4"]
    return {name: [layer if layer.kernel is LAYER_KERNELS[name] else
                   Int4Linear(layer.blocks, layer.in_features, layer.out_features, LAYER_KERNELS[name])
                   for layer in layers] for name in names}


def output_candidates(model: nn.Module) -> dict[str, nn.Module]:
    """The output layers: the tied embedding (:class:`~kvlib.fast.heads.TiedHead`), per-row int8, and
    Q8_0 blocks where kvlib's kernels can be built here."""
    weight = model.embed.weight.detach().float()
    out: dict[str, nn.Module] = {"tied": TiedHead(model.embed), "int8": Int8Linear.from_weight(weight)}
    if kernels.load():
        out["q8_0"] = Q8_0Linear(weight)
    return out


@torch.no_grad()
def measure_kernels(model: nn.Module, batch_sizes: Sequence[int] = BATCH_SIZES, timer: Timer = MEDIAN_IN_HALF_A_SECOND
                    ) -> tuple[dict[str, float], dict[str, dict[str, float]], dict[str, dict[str, float]]]:
    """Time the candidates on this machine: a decode step of ``model`` with each output layer; every
    4-bit layer of ``model`` once, back to back, with each packed kernel and as dense products
    (:func:`dense_against_kernels`); and the int8 and Q8_0 output layers alone, likewise, at the batch
    sizes above one. Milliseconds: ``(output_ms, layers_ms, output_rows_ms)`` for :func:`choose`.
    Every layer, not one of each shape: alone, a layer's weights stay in the processor's caches,
    where a dense float32 copy (eight times the int4 bytes) looks faster than it is in a step."""
    heads = output_candidates(model)
    output_ms: dict[str, float] = {}
    for _ in range(2):                    # in turns, the lower of two, so that drift does not favour one
        for name, head in heads.items():
            output_ms[name] = min(output_ms.get(name, float("inf")), _decode_step_ms(model, head, timer))
    layers = [m for m in model.modules() if isinstance(m, Int4Linear)]
    weights = [layer.dequantized() for layer in layers]                       # float32 (out, in) each, once
    layers_ms = dense_against_kernels(layer_candidates(layers), weights, batch_sizes, timer)
    packed_heads = {name: [head] for name, head in heads.items() if name != "tied"}
    output_rows_ms = dense_against_kernels(packed_heads, [model.embed.weight.detach().float()],
                                           [b for b in batch_sizes if b > 1], timer)
    return output_ms, layers_ms, output_rows_ms


def dense_against_kernels(packed: dict[str, Sequence[nn.Module]], weights: Sequence[torch.Tensor],
                          batch_sizes: Sequence[int], timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> dict[str, dict[str, float]]:
    """Milliseconds of one pass over a list of layers, each once, back to back: with each packed kernel
    (``packed``: name -> the layers built for it) at every batch size, and as dense products of
    ``weights`` (their float32 ``(out, in)`` weights). The dense products from the largest batch size
    down: every one of :func:`dense_candidates` at the largest, then only the one faster there, and
    no smaller size once it loses there (what :func:`dense_from` decides needs no more)."""
    out: dict[str, dict[str, float]] = {}
    candidates = dense_candidates()
    for rows in sorted(batch_sizes, reverse=True):
        xs = {w.shape[1]: torch.randn(1, rows, w.shape[1]) for w in weights}                 # (1, rows, in)
        ms = {name: 1e3 * timer(lambda ls=ls: [layer(xs[layer.in_features]) for layer in ls]) for name, ls in packed.items()}
        for name in candidates:
            ms[name] = _dense_ms(weights, xs, DENSE_KERNELS[name], timer)
        out[str(rows)] = ms
        if candidates:
            candidates = [dense_kernel(out)]
            if ms[candidates[0]] >= DENSE_MARGIN * min(ms[name] for name in packed):
                candidates = []
    return dict(sorted(out.items(), key=lambda item: int(item[0])))


def _dense_ms(weights: Sequence[torch.Tensor], xs: dict[int, torch.Tensor], dtype: torch.dtype, timer: Timer) -> float:
    """One pass of dense products with ``weights`` cast to ``dtype`` (the input cast to it and the
    output back to float32, as :class:`~kvlib.fast.dense.DenseFrom` does); the copies are dropped afterwards."""
    dense = [w.to(dtype) for w in weights]                                                   # (out, in) each
    return 1e3 * timer(lambda: [F.linear(xs[w.shape[1]].to(dtype), w).float() for w in dense])


def _decode_step_ms(model: nn.Module, head: nn.Module, timer: Timer) -> float:
    """Milliseconds of one cached decode step of ``model`` with ``head`` as its output layer, after up
    to 63 tokens (:func:`kvlib.measure.flops.step_call`); ``model``'s own layer is put back."""
    kept, model.lm_head = model.lm_head, head
    try:
        return 1e3 * timer(step_call(model, min(64, model.config.max_seq_len), use_cache=True))
    finally:
        model.lm_head = kept


def choose(output_ms: dict[str, float], layers_ms: dict[str, dict[str, float]], machine: str = "",
           output_rows_ms: dict[str, dict[str, float]] | None = None) -> KernelChoice:
    """The rule, from measurements alone (see the module's docstring for why the margins)."""
    others = {name: ms for name, ms in output_ms.items() if name != "tied"}
    best = min(others, key=others.__getitem__, default=None)
    head = best if best is not None and others[best] < OUTPUT_MARGIN * output_ms["tied"] else "tied"
    smallest = layers_ms[str(min(int(b) for b in layers_ms))]
    packed = min((k for k in ("int4", "q4_1") if k in smallest), key=smallest.__getitem__)
    rows = output_rows_ms or {}
    dense, out_dense = dense_kernel(layers_ms), dense_kernel(rows)
    return KernelChoice(head, packed, dense_from(layers_ms, packed, dense), dense,
                        dense_from(rows, head, out_dense) if head != "tied" else None, out_dense,
                        output_ms, layers_ms, rows, machine)


def dense_kernel(ms: dict[str, dict[str, float]]) -> str:
    """The dense product (of :data:`DENSE_KERNELS`) measured fastest at the largest batch size in
    ``ms`` (batch size -> kernel -> ms), where a dense product matters most; float32 where ``ms``
    is empty or times none."""
    if not ms:
        return "dense float32"
    at = ms[str(max(int(b) for b in ms))]
    return min((name for name in DENSE_KERNELS if name in at), key=at.__getitem__, default="dense float32")


def dense_from(ms: dict[str, dict[str, float]], kernel: str, dense: str = "dense float32") -> int | None:
    """The smallest batch size in ``ms`` (batch size -> kernel -> ms) from which the ``dense``
    product takes under :data:`DENSE_MARGIN` of ``kernel``'s time, at that size and every larger one."""
    sizes = sorted(int(b) for b in ms)
    wins = [ms[str(b)].get(dense, float("inf")) < DENSE_MARGIN * ms[str(b)][kernel] for b in sizes]
    return next((b for i, b in enumerate(sizes) if all(wins[i:])), None)


def machine_key(model: nn.Module) -> str:
    """What the measurement depends on: the CPU, its vector instructions as PyTorch uses them, the
    threads, PyTorch's version, whether kvlib's kernels are built here, and the model's shapes."""
    shapes = sorted({(m.out_features, m.in_features) for m in model.modules() if isinstance(m, Int4Linear)})
    ours = "kvlib kernels: " + (kernels.simd() if kernels.load() else "none")
    return (f"{MEASURED_AS} | {cpu_name()} | {torch.backends.cpu.get_cpu_capability()} | {torch.get_num_threads()} threads | "
            f"torch {torch.__version__} | {ours} | {model.embed.weight.dtype} | vocab {model.config.vocab_size} x "
            f"{model.config.d_model} | {shapes}")


def choice_path() -> Path:
    """The file where the measured choices are kept, one entry per :func:`machine_key`."""
    return cache_dir() / "kernels" / "choices.json"


def kernel_choice(model: nn.Module, *, refresh: bool = False, timer: Timer = MEDIAN_IN_HALF_A_SECOND) -> KernelChoice:
    """This machine's :class:`KernelChoice` for ``model`` (a native 4-bit :class:`kvlib.Decoder`):
    read from :func:`choice_path` when measured before here, else measured now (several seconds)
    and kept. ``refresh=True`` measures again."""
    key = machine_key(model)
    kept = _read_choices(choice_path())
    if key in kept and not refresh:
        return KernelChoice(**kept[key])
    output_ms, layers_ms, output_rows_ms = measure_kernels(model, timer=timer)
    choice = choose(output_ms, layers_ms, key, output_rows_ms)
    _write_choices(choice_path(), {**_read_choices(choice_path()), key: asdict(choice)})
    return choice


def _read_choices(path: Path) -> dict[str, dict]:
    """The choices kept in ``path``; ``{}`` (with a warning) when it is unreadable or not a choice file."""
    try:
        kept = json.loads(path.read_text()) if path.exists() else {}
        if isinstance(kept, dict) and all(isinstance(v, dict) and set(v) == {f.name for f in fields(KernelChoice)} for v in kept.values()):
            return kept
        problem = "it does not hold kernel choices"
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        problem = str(err)
    warnings.warn(f"kvlib ignores its kernel choices in {path} ({problem}) and measures again; "
                  "delete the file to stop this warning", stacklevel=3)
    return {}


def _write_choices(path: Path, kept: dict[str, dict]) -> None:
    """Write ``kept`` to ``path`` whole or not at all (a reader never sees half a file); where the
    folder cannot be written, warn and go on: the choice holds for this process."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, suffix=".tmp", delete=False) as tmp:
            tmp.write(json.dumps(kept, indent=1) + "\n")
        os.replace(tmp.name, path)
    except OSError as err:
        warnings.warn(f"kvlib could not keep its kernel choice in {path} ({err}); it will measure again in the "
                      "next process. Set KVLIB_CACHE_DIR to a folder it can write.", stacklevel=3)


@torch.no_grad()
def apply_choice(model: nn.Module, choice: KernelChoice) -> nn.Module:
    """Set ``model``'s kernels (in place) as ``choice`` says: its output layer, and each 4-bit layer's
    kernel (an attribute: the chosen packed kernel and, from ``dense_from`` rows on, its weight
    dequantized once in the chosen dtype, built now, not inside a compiled step)."""
    needs_ours = choice.layer_kernel == "q4_1" or choice.output_layer == "q8_0"
    if needs_ours and not kernels.load():
        raise RuntimeError(f"this choice runs kvlib's own kernels, which are not available here: "
                           f"{kernels.kernels_missing()}. Measure again: kernel_choice(model, refresh=True)")
    heads = {"int8": Int8Linear.from_weight, "q8_0": Q8_0Linear}
    if choice.output_layer == "tied":
        model.lm_head = TiedHead(model.embed)
    elif choice.output_layer in heads:
        head = heads[choice.output_layer](model.embed.weight.detach().float())
        model.lm_head = head.use(_dense_from(head.kernel, choice.output_dense_from, choice.output_dense_kernel))
    else:
        raise ValueError(f"unknown output layer {choice.output_layer!r}: one of {sorted(['tied', *heads])}")
    if choice.layer_kernel not in LAYER_KERNELS:
        raise ValueError(f"unknown 4-bit kernel {choice.layer_kernel!r}: one of {sorted(LAYER_KERNELS)}")
    kernel = _dense_from(LAYER_KERNELS[choice.layer_kernel], choice.dense_from, choice.dense_kernel)
    for layer in model.modules():
        if isinstance(layer, Int4Linear):
            layer.use(kernel)
    return model


def _dense_from(kernel: Kernel, rows: int | None, dense: str) -> Kernel:
    """``kernel``, or from ``rows`` rows on the ``dense`` product (:class:`~kvlib.fast.dense.DenseFrom`)."""
    if dense not in DENSE_KERNELS:
        raise ValueError(f"unknown dense kernel {dense!r}: one of {sorted(DENSE_KERNELS)}")
    return kernel if rows is None else DenseFrom(kernel, rows, DENSE_KERNELS[dense])
