"""An optional faster decode step: the same layers, compiled with ``torch.compile``.

Run eagerly, a cached decode step makes many small operator calls (norms, rotary
embedding, cache writes, attention, in every layer) around its matrix products. Each call
costs a few microseconds of Python and dispatch, which adds up to a sizeable share of a step
on a CPU (``python -m kvlib.bench`` profiles it). ``torch.compile`` traces the step once and
fuses the small operations into a few generated kernels; the matrix products, which read
the weights, stay the same library calls. The tokens are the same (the arithmetic is the
same up to the order of a few float roundings, checked in ``tests/test_compiled.py``).

What is compiled is :meth:`kvlib.Decoder.run` itself, for one new token (as gpt-fast
compiles its ``decode_one_token``), so any change to the forward pass reaches this path.
The first call compiles (it takes a while, and on a CPU it needs a C++ compiler); later
calls, also for new caches of any length, reuse the compiled code. What was compiled is kept
on disk (:func:`compile_cache_dir`): a new process traces the step again but compiles nothing
(the benchmark times both). Use it through ``generate(..., compile=True)``.

In bfloat16 (the native 4-bit model) the compiled step rounds where the eager one rounds
(``emulate_precision_casts``): Inductor would otherwise keep a fused chain of operations in
float32 and round once at its end, which moves the logits by a few bfloat16 steps at every
token. With it, the compiled logits are the eager ones bit for bit at almost every step; where a
fused kernel still rounds one value differently, a logit moves by a bfloat16 step, and a greedy
token can differ only where two logits tie at bfloat16's resolution (``tests/test_compiled.py``
checks tiny models in float32 and in 4 bits with bfloat16 activations; ``python -m kvlib.bench``
compares the real 4-bit model's tokens).
"""
from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable

import torch

from .cache.base import KVCache
from .device import cpu_name
from .paths import cache_dir

# Inductor's options for the step. emulate_precision_casts: round in bfloat16 where eager does
# (see above). size_asserts off: the generated code would check the sizes and strides of each of
# the step's hundreds of inputs and outputs again, in Python, at every call, after dynamo's guards
# have checked the inputs. Other Inductor options (the fast path's C++ wrapper, kvlib.fast) are
# passed by the caller of compiled_decode_step.
COMPILE_OPTIONS = {"emulate_precision_casts": True, "size_asserts": False}

def compile_cache_dir() -> Path:
    """Where torch.compile keeps the code it compiles: ``TORCHINDUCTOR_CACHE_DIR`` when set, else
    ``torch-compile/<CPU>/<operators>`` in kvlib's folder (:func:`kvlib.paths.cache_dir`), which it
    sets as ``TORCHINDUCTOR_CACHE_DIR`` for this process. (PyTorch's own default is a folder in the
    system's temporary directory, which a reboot or a new Colab session empties.)

    ``<CPU>`` (:func:`cpu_tag`) names the processor and the vector instructions PyTorch's kernels
    use (``ATEN_CPU_CAPABILITY`` can lower them): torch's cache does not tell them apart, and a
    step compiled under one capability and loaded under another wrote wrong tokens (seen with
    ``ATEN_CPU_CAPABILITY=avx2`` on an AVX-512 machine); a home folder shared by machines with
    different CPUs would meet the same. ``<operators>`` (:func:`ops_tag`) names the version of
    kvlib's own operators: torch's cache knows an operator by its name, not by the shape and
    layout its fake says it returns, and a pass compiled when ``unified_attention`` returned a
    contiguous tensor, loaded after it came to return its query's layout, wrote wrong tokens.

    Importing ``torch._dynamo`` (which loading a model can do) sets ``TORCHINDUCTOR_CACHE_DIR`` to
    torch's default folder; that value is taken for unset, not for a choice, so kvlib's folder
    still wins over it (before, such a process compiled into, and loaded from, the default folder).
    """
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not chosen or chosen == default_cache_dir():      # unset, or torch's own default: not a user's choice
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(cache_dir() / "torch-compile" / cpu_tag() / ops_tag())
    return Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])


def ops_tag() -> str:
    """The version of kvlib's operators, as a folder name: ``ops-1a2b3c4d``, a hash of
    :mod:`kvlib.ops`, where every operator and what it returns (its fake) is declared."""
    import hashlib

    from . import ops

    return "ops-" + hashlib.sha256(Path(ops.__file__).read_bytes()).hexdigest()[:8]


def cpu_tag() -> str:
    """This CPU and the vector instructions PyTorch uses on it, as a folder name: ``avx512-1a2b3c4d``."""
    import hashlib

    name = cpu_name()
    capability = torch.backends.cpu.get_cpu_capability().lower()
    return f"{capability}-{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def compiler_missing(device: torch.device | str = "cpu") -> str | None:
    """Why ``torch.compile`` cannot build code for ``device`` here, or ``None`` when it can.

    On a CPU it needs a C++ compiler (gcc or clang; on Windows, MSVC's ``cl``): Windows and a
    Mac without the command-line tools have none by default. On a GPU it needs Triton. Only
    looks; compiles nothing. (It first points torch's compile cache at kvlib's folder,
    :func:`compile_cache_dir`: looking for a compiler makes torch settle its cache folder.)
    """
    compile_cache_dir()
    if torch.device(device).type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            return "torch.compile needs Triton on a GPU, and it is not installed (pip install triton)"
        return None
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        get_cpp_compiler()
    except Exception as err:      # torch raises several kinds here: any of them means "no compiler"
        return (f"torch.compile needs a C++ compiler on the CPU and found none ({type(err).__name__}). "
                "Install gcc or clang (Debian/Ubuntu: apt install g++; macOS: xcode-select --install; "
                "Windows: the Visual Studio Build Tools), or decode without compile=True")
    return None


def _compile_errors() -> tuple[type[BaseException], ...]:
    """The exceptions torch.compile raises when it cannot build the code (not errors of the model)."""
    from torch._dynamo.exc import BackendCompilerFailed
    from torch._inductor.exc import CppCompileError, InductorError

    return BackendCompilerFailed, InductorError, CppCompileError


def _decode_one_token(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, end: int,
                      cache: KVCache) -> torch.Tensor:
    """``model.run`` for one new token per sequence, at ``positions`` ``(batch, 1)``: ``(batch, 1, vocab)``."""
    return model.run(ids, positions, cache, end=end, last=-1)


def _cache_sizes_are_dynamic():
    """Let one compiled graph serve caches of every length.

    The cache's buffers are module buffers, whose sizes torch.compile treats as fixed unless
    told otherwise, so every new cache length would compile the step again. torch 2.13 has
    no public switch for this (``torch.compiler`` offers none); these two settings of its
    dynamo front end are the ones that do it, and ``tests/test_compiled.py`` fails if a new
    cache length recompiles.
    """
    return torch._dynamo.config.patch(force_nn_module_property_static_shapes=False,
                                      force_parameter_static_shapes=False, specialize_float=True)


def _weights_are_static(model: torch.nn.Module) -> None:
    """Tell torch.compile that ``model``'s weights keep their shapes. :func:`_cache_sizes_are_dynamic`
    lets every module tensor take any size, the weights too, and ``dynamic=True`` would then
    give each weight dimension a symbol of its own: more to trace, and more guards to check at
    every call. Marked static, only the cache's lengths and the batch stay symbols."""
    for tensor in [*model.parameters(), *model.buffers()]:
        torch._dynamo.mark_static(tensor)


def compiled_function(fn: Callable[..., torch.Tensor], model: torch.nn.Module, *, what: str,
                      options: dict | None = None, fallback: str = "") -> Callable[..., torch.Tensor]:
    """``torch.compile(fn, dynamic=True)`` for a function whose first argument is ``model``, with
    :data:`COMPILE_OPTIONS` (and ``options`` on top), ``model``'s weights marked static and the code
    kept in :func:`compile_cache_dir`. Calling it compiles the first time; where the compiler fails
    (most often: no C++ compiler for the CPU), a RuntimeError names ``what`` could not be compiled,
    why, and then ``fallback`` (what to do instead)."""
    missing = compiler_missing(model.device)
    if missing:
        raise RuntimeError(missing)
    _weights_are_static(model)
    # dynamic=True: one compiled graph serves every position, length and batch size.
    compiled = torch.compile(fn, dynamic=True, options={**COMPILE_OPTIONS, **(options or {})})

    def call(*args: Any) -> torch.Tensor:
        try:
            return compiled(*args)
        except _compile_errors() as err:
            raise RuntimeError(f"torch.compile could not compile {what} ({type(err).__name__}: {str(err)[:300]}). "
                               f"On a CPU it needs a working C++ compiler (gcc or clang). {fallback}".rstrip()) from err
    return call


class CompiledDecodeStep:
    """``step(ids, cache)``: what ``model(ids, cache, last_only=True)`` returns, for one new token, compiled.

    ``compile_seconds``: how long the first call took (tracing, and compiling or loading the
    compiled code from :func:`compile_cache_dir`); ``None`` before it. With ``announce = True``
    the first call prints a line before it starts and its seconds when it ends
    (``generate(..., compile=True, progress=True)`` sets it). ``options``: Inductor options on top
    of :data:`COMPILE_OPTIONS` (the fast path asks for its C++ wrapper, :mod:`kvlib.fast`).
    """

    def __init__(self, model: torch.nn.Module, options: dict | None = None) -> None:
        self.model = model
        self.options = dict(options or {})
        self.compile_seconds: float | None = None
        self.announce = False
        self._fn = compiled_function(_decode_one_token, model, what="the decode step", options=self.options,
                                     fallback="Use compile=False (the default) to decode without it.")

    def __call__(self, ids: torch.Tensor, cache: KVCache) -> torch.Tensor:
        if ids.dim() != 2 or ids.shape[1] != 1:
            raise ValueError(f"the compiled step takes one new token per sequence, ids of shape (batch, 1); "
                             f"got {tuple(ids.shape)} (run the prompt through the model itself first)")
        self.model.check_input(ids, cache)
        first = self.compile_seconds is None
        if first and self.announce:
            print("compiling the decode step (the first time on a machine: a minute or more; "
                  f"the code is kept in {compile_cache_dir()}) ...", flush=True)
        start = time.perf_counter()
        with _cache_sizes_are_dynamic():
            logits = self._fn(self.model, ids, cache.positions(1), cache.end(1), cache)
        if first:
            self.compile_seconds = time.perf_counter() - start
            if self.announce:
                print(f"compiled the decode step in {self.compile_seconds:.1f} s", flush=True)
        cache.advance(1)
        return logits


def compiled_decode_step(model: torch.nn.Module, *, options: dict | None = None) -> CompiledDecodeStep:
    """The compiled one-token step for ``model``, made once per model and then reused.

    It is kept on the model itself, so it goes away with the model. ``options``: Inductor options
    on top of :data:`COMPILE_OPTIONS` for the step made now; ``None`` (what ``generate`` passes)
    takes the step already made, or makes one with none. Asking for other options than the
    model's step already has raises a ``ValueError``.
    """
    step = model.__dict__.get("_compiled_decode_step")
    if step is None:
        step = model.__dict__["_compiled_decode_step"] = CompiledDecodeStep(model, options)
    elif options is not None and dict(options) != step.options:
        raise ValueError(f"this model's compiled step was made with options {step.options}; a model keeps one "
                         f"compiled step: ask for {dict(options)} before its first compiled call, or on a model "
                         "loaded again")
    return step
