"""What the machine can do: memory bandwidth, dense arithmetic, and how fast its matrix
kernels read a model's weights (the weight-read floor); and a description of the machine
to print beside any measurement.

Each measurement runs on one device: the one it is given, else the model's, else
:func:`kvlib.default_device` (a CUDA GPU when there is one). :func:`measured_on` names it
for a report; the numbers themselves stay plain floats.
"""
from __future__ import annotations

import copy
import os
import platform

import torch
import torch.nn.functional as F

from ..clock import median_seconds
from ..device import check_device, cpu_name, default_device, describe_device, vector_instructions

__all__ = ["memory_bandwidth", "matmul_flops_per_second", "weight_read_floor", "machine_description",
           "measurement_device", "measured_on"]


def measurement_device(device: str | torch.device | None = None,
                       model: torch.nn.Module | None = None) -> torch.device:
    """Where a measurement runs: ``device`` if given (checked by :func:`kvlib.device.check_device`:
    a ``ValueError`` if this machine lacks it), else ``model``'s device (that of its first
    parameter), else :func:`kvlib.default_device`."""
    if device is not None:
        return check_device(device)
    if model is not None:
        return next(model.parameters()).device
    return default_device()


def measured_on(device: str | torch.device | None = None, model: torch.nn.Module | None = None) -> str:
    """The line to print beside a measurement: :func:`kvlib.device.describe_device` of
    :func:`measurement_device` (e.g. ``"CUDA:0 (NVIDIA H100 80GB HBM3)"``)."""
    return describe_device(measurement_device(device, model))


def memory_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5, device: str | torch.device | None = None) -> float:
    """Bytes per second the memory of ``device`` (default :func:`kvlib.default_device`) moves.

    On the CPU: the median time to sum a buffer of ``nbytes``, larger than any cache (bytes
    read). Elsewhere: the median time of a device-to-device copy of ``nbytes``, counted as
    ``2 · nbytes`` (every byte is read once and written once, as CUDA's ``bandwidthTest``
    counts it). Queued GPU work is waited for at both ends of each timing.
    """
    device = measurement_device(device)
    x = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    if device.type == "cpu":
        return nbytes / median_seconds(x.sum, device, repeats, warmup=1)
    out = torch.empty_like(x)
    return 2 * nbytes / median_seconds(lambda: out.copy_(x), device, repeats, warmup=1)


def matmul_flops_per_second(n: int | None = None, repeats: int = 5, dtype: torch.dtype = torch.float32,
                            device: str | torch.device | None = None) -> float:
    """Floating-point operations per second of one dense ``(n, n) @ (n, n)`` product in ``dtype``
    on ``device`` (default :func:`kvlib.default_device`): on the CPU with the current thread
    count, the arithmetic a compute-bound step can hope for.

    ``n`` defaults to 1024 on the CPU and 4096 elsewhere (a GPU needs a large product to be
    busy). The median of ``repeats`` timed products after a warm-up; ``2 n³`` FLOPs each. On
    CUDA, ``dtype=torch.bfloat16`` measures the tensor cores; float32 follows PyTorch's
    ``torch.backends.cuda.matmul.allow_tf32`` setting (off by default).
    """
    device = measurement_device(device)
    n = n or (1024 if device.type == "cpu" else 4096)
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    return 2 * n ** 3 / median_seconds(lambda: a @ b, device, repeats, warmup=1)


def weight_read_floor(model: torch.nn.Module, repeats: int = 7, device: str | torch.device | None = None) -> float:
    """Seconds to run every weight matrix of ``model`` once as a matrix-vector product, back to back.

    Every linear layer (float or quantized) and the output layer, each called on one vector of
    the right width in the model's dtype, with nothing in between: the same kernels a decode
    step uses, so no decode step of ``model`` can be faster than this. It runs where ``model``
    is; given another ``device``, on a copy of ``model`` moved there (``model`` stays put).
    """
    device = measurement_device(device, model)
    if device != model.embed.weight.device:
        model = copy.deepcopy(model).to(device)
    layers = _outermost_linears(model)
    output = model.lm_head if getattr(model, "lm_head", None) is not None else (lambda x: F.linear(x, model.embed.weight))
    dtype = model.embed.weight.dtype
    inputs = {w: torch.randn(1, 1, w, dtype=dtype, device=device) for w in {m.in_features for m in layers} | {model.config.d_model}}

    def read_every_weight() -> None:
        with torch.no_grad():
            for layer in layers:
                layer(inputs[layer.in_features])
            output(inputs[model.config.d_model])

    return median_seconds(read_every_weight, device, repeats, warmup=1)


def _outermost_linears(model: torch.nn.Module) -> list[torch.nn.Module]:
    """Every weight matrix's layer once: the modules with ``in_features`` and ``out_features``
    that sit in no other such module, the output layer left out (the floor runs it on its own)."""
    found: list[torch.nn.Module] = []

    def walk(module: torch.nn.Module) -> None:
        for child in module.children():
            if child is getattr(model, "lm_head", None):
                continue
            if hasattr(child, "in_features") and hasattr(child, "out_features"):
                found.append(child)
            else:
                walk(child)
    walk(model)
    return found


def _devices() -> list[str]:
    """Every device this process can compute on, described (the CPU first)."""
    found = [describe_device("cpu")]
    if torch.cuda.is_available():
        found += [describe_device(torch.device("cuda", i)) for i in range(torch.cuda.device_count())]
    if torch.backends.mps.is_available():
        found.append(describe_device("mps"))
    return found


def machine_description() -> dict:
    """What the numbers were measured on: the CPU, every device PyTorch can reach
    (``"devices"``), the one measurements run on by default (``"default_device"``, see
    :func:`kvlib.default_device`), and the versions."""
    return {"cpu": cpu_name(), "vector_extensions": vector_instructions(), "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "os": platform.platform(), "devices": _devices(),
            "default_device": describe_device(default_device()), "cuda": torch.version.cuda}
