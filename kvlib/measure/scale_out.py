"""Serving past one machine, in the chapter's terms: the bytes each way of splitting the work
moves, and how long a link takes to move them.

These are the costs vLLM and SGLang pay when a model is split across devices or a request
across machines. Each is a count of bytes from the model's shapes (a :class:`kvlib.Config` or
a :class:`kvlib.cache.ModelShape`), in ``dtype_bytes`` per number (2 for 16-bit):

- **tensor parallelism** over ``t`` devices: every layer's attention and MLP outputs are summed
  across the devices (two all-reduces per layer); a ring all-reduce sends and receives
  ``2 (t - 1) / t`` times the summed tensor per device (Megatron-LM: Shoeybi et al., 2019);
- **pipeline parallelism** over ``p`` stages: the activations of each token cross each of the
  ``p - 1`` stage boundaries once per step;
- **prefill/decode disaggregation**: a prompt's whole KV cache moves once, from the machine
  that prefilled it to the one that decodes it (DistServe, Splitwise);
- **KV offloading** (LMCache): a cached prefix's KV comes back from CPU memory or disk instead
  of being recomputed: its bytes against the prefill's FLOPs.

The links' figures are their makers' (reference figures, not measured here).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..cache import kv_bytes_per_token
from .flops import step_flops

__all__ = ["Link", "REFERENCE_LINKS", "tensor_parallel_bytes", "pipeline_parallel_bytes", "disaggregation_bytes",
           "prefill_flops", "Segment", "tensor_parallel_timeline", "pipeline_parallel_timeline"]


@dataclass(frozen=True)
class Link:
    """A link's bandwidth in bytes/s one way, as its maker publishes it, and where that comes from."""

    name: str
    bytes_per_s: float
    source: str


_GB = 10 ** 9
REFERENCE_LINKS: dict[str, Link] = {k.name: k for k in [
    Link("NVLink (H100 SXM)", 450 * _GB,
         "NVIDIA H100 Tensor Core GPU datasheet: NVLink 900 GB/s (both directions together)"),
    Link("PCIe Gen5 x16", 64 * _GB, "NVIDIA H100 Tensor Core GPU datasheet: PCIe Gen5 128 GB/s (both directions)"),
    Link("InfiniBand NDR 400 Gb/s", 50 * _GB, "NVIDIA ConnectX-7 product brief: 400 Gb/s per port"),
]}


def tensor_parallel_bytes(config, tokens: int, devices: int, dtype_bytes: int = 2) -> float:
    """Bytes each device sends (and receives) in one forward pass of ``tokens`` tokens split over
    ``devices``: two all-reduces of ``tokens × d_model`` numbers per layer, each costing a ring
    ``2 (devices - 1) / devices`` times its size."""
    per_all_reduce = tokens * _config(config).d_model * dtype_bytes * 2 * (devices - 1) / devices
    return 2 * config.n_layers * per_all_reduce


def pipeline_parallel_bytes(config, tokens: int, stages: int, dtype_bytes: int = 2) -> float:
    """Bytes crossing the stage boundaries in one forward pass of ``tokens`` tokens over ``stages``
    stages: each token's ``d_model`` activations, once per boundary."""
    return (stages - 1) * tokens * _config(config).d_model * dtype_bytes


def disaggregation_bytes(config, prompt_tokens: int, dtype_bytes: int = 2) -> int:
    """Bytes of a prompt's KV cache, moved once from the prefill machine to the decode machine
    (or back from an offload tier): ``prompt_tokens ×`` :func:`kvlib.cache.kv_bytes_per_token`."""
    return prompt_tokens * kv_bytes_per_token(config, dtype_bytes)


def prefill_flops(config, prompt_tokens: int) -> int:
    """FLOPs of prefilling ``prompt_tokens`` tokens (:func:`kvlib.measure.flops.step_flops`): what
    reloading their KV instead of recomputing it saves."""
    return step_flops(_config(config), prompt_tokens, prompt_tokens).total


def _config(model):
    """The :class:`kvlib.Config` of a config or a :class:`kvlib.cache.ModelShape`."""
    return getattr(model, "config", model)


@dataclass(frozen=True)
class Segment:
    """What one device does for a while in a split decode step: ``kind`` is ``"attention"`` or
    ``"MLP"`` (reading its share of those weights), ``"all-reduce"`` (summing partial results
    over the link), ``"stage"`` (a pipeline stage's layers for one batch) or ``"send"``
    (activations to the next stage); ``label`` names the layer or the batch."""

    device: int
    start: float
    seconds: float
    kind: str
    label: str


def _layer_bytes(config, dtype_bytes: int) -> tuple[int, int]:
    """A layer's weight bytes: its attention projections (q, k, v, o) and its MLP (gate, up, down)."""
    c = _config(config)
    attention = c.d_model * c.head_dim * (2 * c.n_heads + 2 * c.n_kv_heads)
    return attention * dtype_bytes, 3 * c.d_model * c.d_mlp * dtype_bytes


def tensor_parallel_timeline(config, tokens: int, devices: int, accelerator, link: Link, layers: int = 2,
                             dtype_bytes: int = 2) -> list[Segment]:
    """The first ``layers`` layers of a memory-bound decode step of ``tokens`` rows split over
    ``devices`` (tensor parallelism): every device reads ``1 / devices`` of a layer's attention
    weights, then all of them wait for the all-reduce of its output
    (:func:`tensor_parallel_bytes`' share of one layer, over ``link``), then the same for the MLP.
    Times: bytes over ``accelerator.bytes_per_s`` and ``link.bytes_per_s``; the arithmetic, the
    cache reads and the link's latency (a few microseconds per all-reduce, which for messages this
    small weighs as much as their bytes) are left out."""
    attention, mlp = (b / devices / accelerator.bytes_per_s for b in _layer_bytes(config, dtype_bytes))
    reduce = tensor_parallel_bytes(config, tokens, devices, dtype_bytes) / (2 * config.n_layers) / link.bytes_per_s
    out, t = [], 0.0
    for layer in range(layers):
        for kind, seconds in (("attention", attention), ("all-reduce", reduce), ("MLP", mlp), ("all-reduce", reduce)):
            out += [Segment(d, t, seconds, kind, f"layer {layer}") for d in range(devices)]
            t += seconds
    return out


def pipeline_parallel_timeline(config, tokens: int, stages: int, batches: int, accelerator, link: Link,
                               dtype_bytes: int = 2) -> list[Segment]:
    """``batches`` decode steps of ``tokens`` rows each, in flight together over ``stages`` pipeline
    stages: stage ``s`` runs its ``n_layers / stages`` layers on batch ``b`` (reading their weights:
    memory-bound) once stage ``s - 1`` has sent it that batch's activations (``tokens × d_model``
    numbers over ``link``: :func:`pipeline_parallel_bytes` per boundary). One batch alone would
    leave every stage but one idle: the pipeline is kept full by several batches at once."""
    layer = sum(_layer_bytes(config, dtype_bytes))
    stage = layer * config.n_layers / stages / accelerator.bytes_per_s
    send = pipeline_parallel_bytes(config, tokens, 2, dtype_bytes) / link.bytes_per_s       # one boundary
    out, ready = [], [0.0] * batches                       # when batch b's activations reach the next stage
    for s in range(stages):
        free = 0.0
        for b in range(batches):
            start = max(free, ready[b])
            out.append(Segment(s, start, stage, "stage", f"batch {b}"))
            free = start + stage
            if s < stages - 1:
                out.append(Segment(s, free, send, "send", f"batch {b}"))
                ready[b] = free + send
    return out
