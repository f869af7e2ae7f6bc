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
           "prefill_flops"]


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
