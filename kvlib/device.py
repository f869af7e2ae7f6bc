"""Where tensors live: one choice of device for the whole package, and its name for a report.

:func:`default_device` is what every "where should this run?" question falls back to (the
real model's loader, the measurements): the ``KVLIB_DEVICE`` environment variable when it
is set, else the first CUDA GPU when this PyTorch build can reach one, else the CPU. A
model made by hand (``kvlib.Decoder(config)``) starts on the CPU like any PyTorch module;
move it with ``model.to(kvlib.default_device())``.
"""
from __future__ import annotations

import ctypes
import os
import platform
from pathlib import Path

import torch

__all__ = ["ENV_VAR", "ENV_BFLOAT16", "default_device", "check_device", "describe_device", "cpu_name", "cpu_flags",
           "bfloat16_is_fast", "compute_dtype", "describe_compute_dtype", "vector_instructions", "describe_machine",
           "return_freed_memory"]

ENV_VAR = "KVLIB_DEVICE"
ENV_BFLOAT16 = "KVLIB_CPU_BFLOAT16"     # "0" or "1": overrides what bfloat16_is_fast reads off the CPU
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


def cpu_flags() -> set[str]:
    """The processor's feature flags (``/proc/cpuinfo`` on Linux: ``avx2``, ``avx512_bf16``, ``amx_bf16`` ...);
    empty where the system does not list them."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def bfloat16_is_fast(device: str | torch.device = "cpu") -> bool:
    """Whether ``device`` multiplies bfloat16 numbers natively, so that a bfloat16 model runs at least
    as fast as a float32 one: a GPU, or an x86 CPU with AVX-512 BF16 or AMX whose instructions
    PyTorch uses (``ATEN_CPU_CAPABILITY`` can lower them to AVX2). Elsewhere (AVX2-only CPUs, most
    AMD and Intel laptops; ARM) each bfloat16 number is converted before it is multiplied, and a
    dense bfloat16 product is many times slower than float32's. ``KVLIB_CPU_BFLOAT16=0`` or ``1``
    decides for the CPU instead."""
    device = torch.device(device)
    if device.type != "cpu":
        return True
    forced = os.environ.get(ENV_BFLOAT16, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    capability = torch.backends.cpu.get_cpu_capability()
    return capability.startswith("AVX512") and bool({"avx512_bf16", "amx_bf16"} & cpu_flags())


def compute_dtype(device: str | torch.device = "cpu") -> torch.dtype:
    """The dtype a quantized model computes in on ``device``: bfloat16 where it is fast
    (:func:`bfloat16_is_fast`), float32 elsewhere."""
    return torch.bfloat16 if bfloat16_is_fast(device) else torch.float32


def describe_compute_dtype(device: str | torch.device = "cpu") -> str:
    """:func:`compute_dtype` and why, for a page to print: ``"activations in bfloat16 (this CPU multiplies
    bfloat16 natively)"`` or ``"activations in float32 (this CPU has no bfloat16 arithmetic)"``.
    (The notebook tests read these two forms as one: which one a page shows depends on the CPU.)"""
    if torch.device(device).type != "cpu":
        return "activations in bfloat16 (a GPU multiplies bfloat16 natively)"
    if bfloat16_is_fast(device):
        return "activations in bfloat16 (this CPU multiplies bfloat16 natively)"
    return "activations in float32 (this CPU has no bfloat16 arithmetic)"


def vector_instructions() -> str:
    """The CPU's widest vector instructions as PyTorch uses them, and its bfloat16 and matrix units:
    ``"AVX-512, AVX-512 BF16, AMX"``, ``"AVX2"``, ``"NEON"``... (``ATEN_CPU_CAPABILITY`` can lower what
    PyTorch uses below what the CPU has: then ``"AVX2, lowered from the CPU's AVX-512"``). These decide which
    matrix kernels run and how fast, so every measurement names them."""
    flags = cpu_flags()
    has = next((name for flag, name in [("avx512f", "AVX-512"), ("avx2", "AVX2"), ("avx", "AVX"), ("sse4_2", "SSE4.2"),
                                        ("asimd", "NEON")] if flag in flags), platform.machine() or "unknown")
    capability = torch.backends.cpu.get_cpu_capability()
    used = {"AVX512": "AVX-512", "AVX2": "AVX2"}.get(capability, has)
    if used != has:
        return f"{used}, lowered from the CPU's {has}"
    extras = [name for flag, name in [("avx512_bf16", "AVX-512 BF16"), ("amx_tile", "AMX")] if flag in flags]
    return ", ".join([used, *extras]) if used == "AVX-512" else used


def describe_machine(device: str | torch.device | None = None) -> str:
    """One line naming what a page's measurements ran on, for its first measuring cell to print:
    the device (the CPU's name, its vector instructions, the threads), torch's version and the
    date. (The notebook tests read the line as one word: another machine prints another.)"""
    import datetime

    device = torch.device(device) if device is not None else default_device()
    threads = torch.get_num_threads()
    what = (f"{cpu_name()} ({vector_instructions()}), {threads} thread{'' if threads == 1 else 's'}"
            if device.type == "cpu" else describe_device(device))
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()     # the day of the cells' UTC times
    return f"This page's measurements: {what}, torch {torch.__version__}, {today}"


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


def return_freed_memory() -> bool:
    """Give memory that the process has freed back to the operating system, where the C library
    keeps it instead (glibc's ``malloc_trim``): True where it could ask, False elsewhere (macOS,
    Windows, musl), where it does nothing. Freed blocks of a few megabytes, a layer's weight in
    a temporary copy, stay in the process with glibc until it is told; kvlib calls this after it has
    made and dropped such copies (loading, quantizing), so that a machine of 2 GiB (Binder) is not
    filled by memory no tensor holds."""
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (AttributeError, OSError, TypeError):    # no malloc_trim (macOS, musl); Windows's CDLL(None)
        return False
    trim(0)
    return True
