"""kvlib's own CPU kernels for block-quantized weights (``cpu_kernels.cpp`` beside this file), the
serving engine's paged attention (``paged_attention.cpp``, :func:`paged_attention`) and a float32
product for a few rows that streams each weight once (``panels.cpp``, :func:`panel_simd`; used by
:func:`kvlib.fast.pack`), built on first use with the machine's C++ compiler and kept in kvlib's folder.

They multiply as llama.cpp does on a CPU: each row of activations is rounded to 8-bit integers
in blocks of 32 (a float scale per block), and each block of weights is multiplied with integer
dot products, then scaled (``cpu_kernels.cpp`` gives the formula). Two weight formats, in the
GGUF file's own block layouts: Q4_1 (the model file's 4-bit layers) and Q8_0 (its embedding,
which is also the output layer). On an x86 CPU with AVX2 the dot products are AVX2's byte
products (``_mm256_maddubs_epi16``); elsewhere plain loops.

:func:`kernels_missing` says why they cannot be used here (no C++ compiler, a failed build), or
``None``, and builds nothing; :func:`load` builds them once (a few seconds) and loads their
implementations of the ``torch.ops.kvlib_cpu`` operators that :mod:`kvlib.ops` declares.

Why not ``torch.utils.cpp_extension.load``: it needs ninja (one more package to install), and
it builds a Python extension keyed by a name and the sources, in one folder for every machine
that shares the home folder. What it gives that matters here is copied: the library is built
aside and moved into place, one process at a time (a file lock, which a dead process releases),
with torch's C++ ABI, in a folder keyed by the architecture, the OS, the compiler and its
version as well as the sources and the vector flags (:func:`library_path`).
:func:`reference_mm` is the same arithmetic in PyTorch, which the tests compare them with. The
fast path (:mod:`kvlib.fast.choose`) measures them against PyTorch's kernels and uses them where
they win; nothing else depends on them.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from .. import ops  # noqa: F401  (declares the operators these kernels implement)
from ..device import cpu_flags
from ..paths import cache_dir

__all__ = ["ENV_SIMD", "SOURCES", "HEADERS", "BLOCK", "BLOCK_BYTES", "compiler", "simd_flags", "library_path", "load",
           "kernels_missing", "simd", "panel_simd", "quantize_rows_reference", "reference_mm", "paged_attention"]

SOURCES = [Path(__file__).with_name(name) for name in ("cpu_kernels.cpp", "paged_attention.cpp", "panels.cpp")]
HEADERS = [Path(__file__).with_name("simd.h")]  # the vector type the sources share (included, not compiled alone)
BLOCK = 32                                    # weights (and activations) per block
BLOCK_BYTES = {"q4_1": 20, "q8_0": 34}        # ggml's block_q4_1 and block_q8_0
ENV_SIMD = "KVLIB_KERNELS_SIMD"               # "off": plain loops even where AVX2 exists; "avx2": no AVX-512
_LIB = "libkvlib_cpu_kernels.so"
_state: dict[str, object] = {}                # "loaded": path, or "error": why not
NO_COMPILER = ("kvlib's CPU kernels need a C++ compiler and found none (Debian/Ubuntu: apt install g++; "
               "macOS: xcode-select --install; or set CXX)")


def compiler() -> str | None:
    """The C++ compiler to build with: ``$CXX``, else the first of c++, g++, clang++ on the PATH."""
    found = [os.environ.get("CXX")] + [shutil.which(name) for name in ("c++", "g++", "clang++")]
    return next((c for c in found if c), None)


def simd_flags() -> list[str]:
    """The compiler flags for this CPU's vector instructions: AVX2 with FMA and F16C on an x86 CPU
    that has all three, and AVX-512F too where it has that (``panels.cpp`` uses it);
    ``KVLIB_KERNELS_SIMD=off`` leaves them all out, ``KVLIB_KERNELS_SIMD=avx2`` leaves out AVX-512.
    None elsewhere (plain loops)."""
    choice, flags = os.environ.get(ENV_SIMD, "").lower(), cpu_flags()
    if choice == "off" or platform.machine().lower() not in ("x86_64", "amd64") or not {"avx2", "fma", "f16c"} <= flags:
        return []
    return ["-mavx2", "-mfma", "-mf16c"] + (["-mavx512f"] if "avx512f" in flags and choice != "avx2" else [])


def _command(cxx: str, out: Path, openmp: bool) -> list[str]:
    torch_dir = Path(torch.__file__).parent
    lib = torch_dir / "lib"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", 1))
    cmd = [cxx, "-O3", "-std=c++17", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *simd_flags(),
           f"-I{torch_dir / 'include'}", f"-I{torch_dir / 'include' / 'torch' / 'csrc' / 'api' / 'include'}",
           *map(str, SOURCES), "-o", str(out), f"-L{lib}", "-lc10", "-ltorch_cpu", "-ltorch", f"-Wl,-rpath,{lib}"]
    if openmp:      # torch's own OpenMP runtime (the same soname, so the one already loaded): threads shared
        cmd[1:1] = ["-fopenmp"]
        cmd += [f"-l:{p.name}" for p in lib.glob("libgomp*.so*")][:1] or ["-lgomp"]
    if sys.platform == "darwin":
        cmd += ["-undefined", "dynamic_lookup"]
    return cmd


@functools.lru_cache(maxsize=None)
def compiler_version(cxx: str) -> str:
    """The first line of ``cxx --version`` (``"g++ (Debian 12.2.0-14) 12.2.0"``), or ``""``."""
    try:
        run = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return ""
    return (run.stdout.splitlines() or [""])[0].strip()


def library_path() -> Path:
    """Where the built kernels are kept: kvlib's folder, ``kernels/<key>/``, the key a hash of the
    sources, torch's version and C++ ABI, the machine's architecture and OS, the compiler and its
    version, and the vector flags: a change of any of them builds again, and machines of different
    kinds sharing one home folder keep a library each."""
    cxx = compiler() or ""
    abi = str(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", ""))
    key = "|".join([*(s.read_text() for s in SOURCES + HEADERS), torch.__version__, abi, platform.machine(),
                    sys.platform, cxx, compiler_version(cxx) if cxx else "", " ".join(simd_flags())])
    return cache_dir() / "kernels" / hashlib.sha256(key.encode()).hexdigest()[:16] / _LIB


@contextlib.contextmanager
def _build_lock(folder: Path):
    """Held by one process at a time (``fcntl.flock``, released by the system if the process dies):
    a second process that wants the same build waits for the first, then finds the library built.
    Where ``fcntl`` is missing (Windows), no lock: each builds aside and the last one's rename wins."""
    try:
        import fcntl
    except ImportError:
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _build(path: Path) -> None:
    cxx = compiler()
    if cxx is None:
        raise RuntimeError(NO_COMPILER)
    with _build_lock(path.parent):
        if path.exists():                                            # another process built it meanwhile
            return
        with tempfile.TemporaryDirectory(dir=path.parent) as tmp:    # built aside, then moved: another process
            out = Path(tmp) / _LIB                                   # loading it meanwhile sees all or nothing
            errors = ""
            for openmp in (True, False):                             # without OpenMP (some Mac compilers): one thread
                run = subprocess.run(_command(cxx, out, openmp), capture_output=True, text=True)
                if run.returncode == 0:
                    os.replace(out, path)
                    return
                errors = run.stderr[:2000]
    raise RuntimeError(f"building kvlib's CPU kernels with {cxx} ({compiler_version(cxx)}) failed:\n{errors}")


def load() -> bool:
    """Build (once per machine, a few seconds) and load the kernels: ``True`` when
    ``torch.ops.kvlib_cpu`` runs them, ``False`` when they cannot be used here
    (:func:`kernels_missing` then says why). Call it where the kernels are about to be used."""
    if "loaded" in _state or "error" in _state:
        return "loaded" in _state
    try:
        path = library_path()
        if not path.exists():
            _build(path)
        torch.ops.load_library(str(path))          # their implementations, for the operators kvlib.ops declares
        _state["loaded"] = path
    except (RuntimeError, OSError) as err:
        _state["error"] = str(err)
    return "loaded" in _state


def kernels_missing() -> str | None:
    """Why kvlib's CPU kernels cannot be used here, or ``None`` where they can (loaded, built for
    this machine already, or buildable: a C++ compiler is found). It builds nothing: :func:`load`
    builds, and a build or load that failed in this process is the reason from then on."""
    if "error" in _state:
        return str(_state["error"])
    if "loaded" in _state or compiler() is not None:
        return None
    return None if library_path().exists() else NO_COMPILER


def _loaded() -> None:
    if not load():
        raise RuntimeError(f"kvlib's CPU kernels are not available: {_state['error']}")


def panel_simd() -> str:
    """Which code the loaded float32 panel product (``panels.cpp``) runs: ``"avx512"``, ``"avx2"``
    or ``"plain loops"``."""
    _loaded()
    return torch.ops.kvlib_cpu.panel_simd()


def simd() -> str:
    """Which code the loaded kernels run: ``"avx2"`` or ``"plain loops"``."""
    _loaded()
    return torch.ops.kvlib_cpu.simd()


def paged_attention(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, context: torch.Tensor,
                    lengths: torch.Tensor, row: torch.Tensor | None = None) -> torch.Tensor:
    """Attention read straight from one layer's paged pool (``paged_attention.cpp``, as vLLM's CPU
    attention reads its blocks): a decoding request's one query alone, a prompt's queries in tiles
    that read each key once (each query's bits the same whatever its tile holds): ``q`` float32 ``(n, heads, head_dim)``;
    ``k_pool, v_pool`` ``(slots, kv_heads, head_dim)``; ``context`` ``(rows, k_len)`` the slots of
    each request's keys by position; ``lengths`` ``(n,)`` how many keys each query sees (a decoding
    request's one query: all its keys; a prefilling request's token at position ``p``: ``p + 1``, its
    causal mask); ``row`` ``(n,)`` each query's request (``None``: query ``i`` is request ``i``'s).
    Returns ``(n, heads, head_dim)``: what :func:`kvlib.attention.attention` gives on the gathered
    keys, to float32 rounding. RuntimeError where the kernels cannot be built here
    (:func:`kernels_missing` says why), or, naming it, for a query, slot or length outside its bounds."""
    _loaded()
    if row is None:
        row = torch.arange(q.shape[0], device=q.device)
    return torch.ops.kvlib_cpu.paged_attention(q.contiguous(), k_pool, v_pool, context.contiguous(),
                                               lengths.contiguous(), row.contiguous(), q.shape[-1] ** -0.5)


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernels' rounding of activations, in PyTorch: ``x`` float32 ``(rows, in)`` to int8 in
    blocks of 32, ``(q (rows, in/32, 32), d (rows, in/32))``: ``d = amax / 127`` and
    ``q = round-half-even(x · (127 / amax))`` (0 where a block is all zeros)."""
    blocks = x.float().reshape(x.shape[0], -1, BLOCK)
    amax = blocks.abs().amax(dim=-1)
    # float32 divisions as the kernels do them (``127.0 / amax`` would multiply by a reciprocal instead)
    inv = torch.where(amax > 0, torch.full_like(amax, 127.0) / amax, torch.zeros_like(amax))
    return torch.round(blocks * inv[..., None]).to(torch.int8), amax / torch.full_like(amax, 127.0)


def reference_mm(x: torch.Tensor, q: torch.Tensor, d: torch.Tensor, m: torch.Tensor | None = None) -> torch.Tensor:
    """What the kernels compute, in float64: ``x`` float32 ``(rows, in)`` rounded by
    :func:`quantize_rows_reference`, times weights ``d · q + m`` given as ``q`` ``(out, in)``
    (0..15 for Q4_1, -127..127 for Q8_0), and ``d``, ``m`` ``(out, in/32)`` (``m=None``: Q8_0).
    The integer dot products are exact, so this differs from the kernels only by their float32
    sums: ``(rows, out)``."""
    qx, dx = quantize_rows_reference(x)                                        # (rows, b, 32), (rows, b)
    qw = q.reshape(q.shape[0], -1, BLOCK).double()                             # (out, b, 32)
    dots = torch.einsum("rbi,obi->rob", qx.double(), qw)                      # exact integer sums
    out = (dots * dx.double()[:, None, :] * d.double()[None]).sum(-1)
    if m is not None:
        sums = qx.double().sum(-1) * dx.double()                               # s = d_x · sum(q_x), (rows, b)
        out = out + torch.einsum("rb,ob->ro", sums, m.double())
    return out

