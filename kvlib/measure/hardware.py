"""What the machine can do: memory bandwidth, dense arithmetic, and how fast its matrix
kernels read a model's weights (the weight-read floor); and a description of the machine
to print beside any measurement."""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch
import torch.nn.functional as F

from .timing import median_seconds

__all__ = ["memory_bandwidth", "matmul_flops_per_second", "weight_read_floor", "machine_description"]


def memory_bandwidth(nbytes: int = 512 * 2**20, repeats: int = 5) -> float:
    """Bytes per second this machine reads from memory: median time to sum a buffer larger than any cache."""
    x = torch.ones(nbytes // 4, dtype=torch.float32)
    return nbytes / median_seconds(x.sum, repeats=repeats, warmup=1)


def matmul_flops_per_second(n: int = 1024, repeats: int = 5, dtype: torch.dtype = torch.float32) -> float:
    """Floating-point operations per second of one dense ``(n, n) @ (n, n)`` product on this
    machine, with the current thread count: the arithmetic a compute-bound step can hope for.

    The median of ``repeats`` timed products after a warm-up; ``2 n³`` FLOPs each.
    """
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    return 2 * n ** 3 / median_seconds(lambda: a @ b, repeats=repeats, warmup=1)


def weight_read_floor(model: torch.nn.Module, repeats: int = 7) -> float:
    """Seconds to run every weight matrix of ``model`` once as a matrix-vector product, back to back.

    Every linear layer (float or quantized) and the output layer, each called on one vector of
    the right width in the model's dtype, with nothing in between: the same kernels a decode
    step uses, so no decode step of ``model`` can be faster than this.
    """
    layers = [m for m in model.modules() if m is not model and hasattr(m, "in_features") and hasattr(m, "out_features")]
    output = model.lm_head if getattr(model, "lm_head", None) is not None else (lambda x: F.linear(x, model.embed.weight))
    dtype, device = model.embed.weight.dtype, model.embed.weight.device
    inputs = {w: torch.randn(1, 1, w, dtype=dtype, device=device) for w in {m.in_features for m in layers} | {model.config.d_model}}

    def read_every_weight() -> None:
        with torch.no_grad():
            for layer in layers:
                layer(inputs[layer.in_features])
            output(inputs[model.config.d_model])

    return median_seconds(read_every_weight, repeats=repeats, warmup=1)


def machine_description() -> dict:
    """What the numbers were measured on."""
    cpu, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and cpu in (platform.processor(), platform.machine()):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith(("flags", "Features")):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    # the widest vector instructions the CPU offers: they decide which matrix kernels run
    vector = next((name for flag, name in [("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"),
                                           ("sse4_2", "SSE4.2"), ("asimd", "NEON")] if flag in flags), "unknown")
    return {"cpu": cpu, "vector_extensions": vector, "logical_cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(), "python": platform.python_version(),
            "torch": torch.__version__, "os": platform.platform()}
