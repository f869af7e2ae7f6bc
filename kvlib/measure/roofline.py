"""The roofline model of a decode step, with the cache in it, and reference accelerators to set it on.

A decode step for ``B`` sequences at a context of ``n`` tokens reads the weights once (``W``
bytes, shared by the batch) and every row's own cache (``n × c`` bytes, ``c`` the cache's bytes
per token), and does ``B`` tokens' worth of arithmetic (``f(n)`` FLOPs each). On a machine
that does ``π`` FLOP/s and reads ``β`` bytes/s, the roofline (Williams, Waterman and
Patterson, 2009) predicts

    t_step(B) = max((W + B n c) / β,  B f(n) / π).

Batching shares the weights, not the cache. The step leaves the memory side (the **knee**) at

    B* = (W / β) / (f(n) / π − n c / β)

when a row's arithmetic takes longer than reading its cache; when it does not, no batch is
ever compute-bound and throughput creeps up towards ``β / (n c)`` tokens per second.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..cache.sizes import kv_bytes_per_token
from ..checks import non_negative_int, positive_int
from ..config import Config
from .flops import step_flops

__all__ = ["roofline_seconds", "row_cost", "decode_step_seconds", "decode_knee", "throughput_ceiling", "Accelerator",
           "REFERENCE_ACCELERATORS", "DecodeEstimate", "estimate_decode"]


def _positive(name: str, value: float) -> float:
    if not (isinstance(value, (int, float)) and value > 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def roofline_seconds(flops: float, nbytes: float, flops_per_s: float, bytes_per_s: float) -> float:
    """The roofline model's time for work of ``flops`` FLOPs that must read ``nbytes`` bytes:
    whichever of arithmetic and memory takes longer (Williams, Waterman and Patterson, 2009)."""
    return max(flops / _positive("flops_per_s", flops_per_s), nbytes / _positive("bytes_per_s", bytes_per_s))


def row_cost(config: Config, context: int, cache_dtype: torch.dtype | int = 2) -> dict[str, float]:
    """What one row of a decode step at ``context`` tokens costs: ``flops_per_token``
    (:func:`kvlib.measure.flops.step_flops`, one new token) and ``cache_bytes_per_row`` (its
    cache, ``context`` × :func:`kvlib.cache.kv_bytes_per_token` in ``cache_dtype``, a dtype or
    bytes per number), as keyword arguments for the functions below."""
    return dict(flops_per_token=float(step_flops(config, context, 1).total),
                cache_bytes_per_row=float(kv_bytes_per_token(config, cache_dtype) * context))


def decode_step_seconds(batch: int, *, weight_bytes: float, flops_per_token: float, cache_bytes_per_row: float,
                        flops_per_s: float, bytes_per_s: float) -> float:
    """The roofline's time of one decode step for ``batch`` rows: the weights read once, each row's
    cache (``cache_bytes_per_row``: its context × the cache's bytes per token) read once per row,
    ``flops_per_token`` FLOPs per row (:func:`kvlib.measure.flops.step_flops` at that context)."""
    positive_int("batch", batch)
    return roofline_seconds(batch * flops_per_token, weight_bytes + batch * cache_bytes_per_row,
                            flops_per_s, bytes_per_s)


def decode_knee(*, weight_bytes: float, flops_per_token: float, cache_bytes_per_row: float,
                flops_per_s: float, bytes_per_s: float) -> float:
    """The batch at which a decode step stops being memory-bound, ``(W/β) / (f/π − n c/β)``
    (a real number: the first whole batch past it is its ceiling); ``math.inf`` when a row's
    arithmetic is no slower than reading its cache, so that no batch reaches the knee."""
    pi, beta = _positive("flops_per_s", flops_per_s), _positive("bytes_per_s", bytes_per_s)
    per_row = flops_per_token / pi - cache_bytes_per_row / beta
    return weight_bytes / beta / per_row if per_row > 0 else math.inf


def throughput_ceiling(*, flops_per_token: float, cache_bytes_per_row: float, flops_per_s: float,
                       bytes_per_s: float) -> float:
    """Tokens per second that no batch exceeds: each row needs its arithmetic and its cache's
    reading whatever the batch, so throughput tends to ``1 / max(f/π, n c/β)`` as the batch grows."""
    per_row = max(flops_per_token / _positive("flops_per_s", flops_per_s),
                  cache_bytes_per_row / _positive("bytes_per_s", bytes_per_s))
    return math.inf if per_row == 0 else 1 / per_row


@dataclass(frozen=True)
class Accelerator:
    """A machine's two roofline numbers, as its maker publishes them (reference figures, not
    measured here): dense 16-bit matrix arithmetic in FLOP/s (no sparsity), memory bandwidth in
    bytes/s, and its memory in bytes; ``source`` names where the figures come from."""

    name: str
    flops_per_s: float
    bytes_per_s: float
    memory_bytes: int
    source: str

    def __post_init__(self) -> None:
        _positive(f"{self.name}: flops_per_s", self.flops_per_s)
        _positive(f"{self.name}: bytes_per_s", self.bytes_per_s)
        non_negative_int(f"{self.name}: memory_bytes", self.memory_bytes)

    @property
    def ridge_point(self) -> float:
        """FLOPs per byte read at which arithmetic and memory take equally long."""
        return self.flops_per_s / self.bytes_per_s


_GB = 10 ** 9
REFERENCE_ACCELERATORS: dict[str, Accelerator] = {a.name: a for a in [
    Accelerator("NVIDIA H100 SXM", 989e12, 3.35e12, 80 * _GB,
                "NVIDIA H100 Tensor Core GPU datasheet: BF16 989 TFLOPS dense (1,979 with sparsity), "
                "HBM3 3.35 TB/s, 80 GB"),
    Accelerator("NVIDIA A100 SXM 80GB", 312e12, 2.039e12, 80 * _GB,
                "NVIDIA A100 Tensor Core GPU datasheet: BF16 312 TFLOPS dense (624 with sparsity), "
                "HBM2e 2,039 GB/s, 80 GB"),
    Accelerator("NVIDIA GeForce RTX 4090", 165.2e12, 1.008e12, 24 * _GB,
                "NVIDIA Ada Lovelace architecture whitepaper: BF16 tensor 165.2 TFLOPS dense with FP32 "
                "accumulate, GDDR6X 1,008 GB/s, 24 GB"),
    Accelerator("Apple M2 Max", 13.6e12, 400e9, 96 * _GB,
                "Apple newsroom, January 2023: GPU up to 13.6 TFLOPS (FP32; Apple publishes no 16-bit "
                "matrix figure), 400 GB/s unified memory, up to 96 GB"),
]}


@dataclass(frozen=True)
class DecodeEstimate:
    """What the roofline predicts for decoding one model on one machine (see :func:`estimate_decode`)."""

    batch: int
    context: int
    weight_bytes: float          # W: read once per step, shared by the batch
    cache_bytes_per_row: float   # n × c: each row's own cache, read once per step
    flops_per_token: float       # f(n): one row's arithmetic in one step
    step_seconds: float          # t_step(batch)
    knee: float                  # B*, math.inf when no batch reaches it
    ceiling: float               # tokens/s that no batch exceeds

    @property
    def tokens_per_second(self) -> float:
        """Tokens the whole batch decodes per second: ``batch / t_step``."""
        return self.batch / self.step_seconds


def estimate_decode(config: Config, n_params: int, *, flops_per_s: float, bytes_per_s: float,
                    weight_bits: float = 16.0, cache_bytes_per_number: int = 2, context: int = 1,
                    batch: int = 1) -> DecodeEstimate:
    """The roofline's decode step for a model of ``config``'s shapes and ``n_params`` weights
    stored at ``weight_bits`` bits each (16 for bfloat16; :func:`kvlib.quant.formats.bits_per_weight`
    for a grouped format), its cache at ``cache_bytes_per_number`` bytes per number, ``batch``
    rows each at a context of ``context`` tokens, on a machine of ``flops_per_s`` and
    ``bytes_per_s``. A prediction, not a measurement: real steps are slower."""
    non_negative_int("n_params", n_params)
    positive_int("batch", batch)
    machine = dict(flops_per_s=flops_per_s, bytes_per_s=bytes_per_s)
    w = n_params * _positive("weight_bits", weight_bits) / 8
    row = row_cost(config, context, cache_bytes_per_number)
    return DecodeEstimate(batch=batch, context=context, weight_bytes=w, **row,
                          step_seconds=decode_step_seconds(batch, weight_bytes=w, **row, **machine),
                          knee=decode_knee(weight_bytes=w, **row, **machine),
                          ceiling=throughput_ceiling(**row, **machine))
