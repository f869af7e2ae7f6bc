"""Where tensors live: one choice of device for the whole package, and its name for a report.

:func:`default_device` is what every "where should this run?" question falls back to (the
real model's loader, the measurements): the ``KVLIB_DEVICE`` environment variable when it
is set, else the first CUDA GPU when this PyTorch build can reach one, else the CPU. A
model made by hand (``kvlib.Decoder(config)``) starts on the CPU like any PyTorch module;
move it with ``model.to(kvlib.default_device())``.
"""
from __future__ import annotations

import os
import platform
from pathlib import Path

import torch

__all__ = ["ENV_VAR", "default_device", "check_device", "describe_device"]

ENV_VAR = "KVLIB_DEVICE"
_CHOICES = "cpu, cuda, cuda:N (N a GPU index) or mps"


def _unavailable(name: str, value: object, why: str) -> ValueError:
    fix = (f"Set {ENV_VAR} to one of {_CHOICES} that this machine has, or unset it to let kvlib choose "
           "(CUDA when available, else the CPU)" if name == ENV_VAR else
           f"Use one of {_CHOICES} that this machine has, or kvlib.default_device()")
    return ValueError(f"{name}={str(value)!r}: {why}. {fix}")


def check_device(value: str | torch.device, name: str = "device") -> torch.device:
    """``value`` as a ``torch.device`` this machine can run on, or a ``ValueError`` that names
    ``name`` (the argument, or ``KVLIB_DEVICE``) and says what is wrong and what to do: a name
    ``torch.device`` does not parse, CUDA where this PyTorch build has none (or no GPU of that
    index), MPS where there is no Apple GPU, or ``meta`` (which holds no numbers). ``cuda``
    without an index becomes the current GPU's (``cuda:0``), so that it compares equal to the
    device of tensors moved there."""
    try:
        device = torch.device(value)
    except (RuntimeError, TypeError, ValueError) as e:
        raise _unavailable(name, value, f"not a device PyTorch knows ({e})") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else f"built for CUDA {torch.version.cuda}"
            raise _unavailable(name, value, f"CUDA is not available (this PyTorch {torch.__version__} is {build}, "
                                           "or no GPU is visible)")
        count = torch.cuda.device_count()
        index = torch.cuda.current_device() if device.index is None else device.index
        if index >= count:
            raise _unavailable(name, value, f"there is no CUDA device {index}: this machine has {count} "
                                           f"(cuda:0 to cuda:{count - 1})")
        return torch.device("cuda", index)
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise _unavailable(name, value, "MPS (Apple's GPU backend) is not available on this machine")
    if device.type == "meta":
        raise _unavailable(name, value, "the meta device holds shapes only, no numbers to compute with")
    return device


def default_device() -> torch.device:
    """The device kvlib runs on when none is given: ``KVLIB_DEVICE`` if set (and not empty),
    checked by :func:`check_device` (a ``ValueError`` if this machine lacks it); else the
    current CUDA GPU when ``torch.cuda.is_available()``; else the CPU. Read on every call, so
    a change of the environment variable takes effect at once."""
    value = os.environ.get(ENV_VAR, "").strip()
    if value:
        return check_device(value, ENV_VAR)
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def cpu_name() -> str:
    """The processor's name (``/proc/cpuinfo``'s model name on Linux), else what ``platform`` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def describe_device(device: str | torch.device) -> str:
    """A line naming ``device`` for a measurement to print beside its numbers, e.g.
    ``"CPU (AMD EPYC 7B13 64-Core Processor, 2 threads)"`` or
    ``"CUDA:0 (NVIDIA H100 80GB HBM3)"``. It does not check that the device is usable."""
    device = torch.device(device)
    if device.type == "cpu":
        return f"CPU ({cpu_name()}, {torch.get_num_threads()} threads)"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"{str(device).upper()} (not available)"
        index = torch.cuda.current_device() if device.index is None else device.index
        return f"CUDA:{index} ({torch.cuda.get_device_name(index)})"
    if device.type == "mps":
        return f"MPS (Apple GPU, {platform.machine()})"
    return str(device).upper()
