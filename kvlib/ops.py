"""kvlib's operators, each declared once, here: its schema, what it returns as ``torch.compile``
sees it (its *fake*: the result's shape, dtype and layout, computed without running it), and the
part of a step it belongs to in a profile.

Two namespaces. ``torch.ops.kvlib``: operators written in Python, implemented by the module that
uses them (:func:`implement`), so that ``torch.compile`` calls them as they are. ``torch.ops.kvlib_cpu``:
kvlib's C++ kernels (``kvlib/fast/*.cpp``), which register only their implementations; declared
here, they exist (and trace) even before :func:`kvlib.fast.kernels.load` builds and loads them,
and calling one that is not loaded is a Python error that says so.

Everything else is derived from :data:`OPS`: the profile's parts (:func:`step_parts`), and the
version of the operators that names the folder of compiled code (:func:`kvlib.compiled.ops_tag`,
a hash of this file: a fake changed here is a new folder, so no compiled graph outlives it).
All are registered the one way vLLM's ``direct_register_custom_op`` does, with
``torch.library.Library``: ``torch.library.custom_op`` would wrap each call in dispatching logic
that costs several microseconds, and a compiled pass calls these a few hundred times a step.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["Op", "OPS", "PARTS", "implement", "step_parts", "attention_room"]

PARTS = ("matrix products", "attention", "other operators")     # a profile's parts of a step
BLOCK = 32                                                       # weights (and activations) per GGUF block
Q8_1_BYTES = 40                                                  # an activation block: d, s and 32 int8


@dataclass(frozen=True)
class Op:
    """One operator: ``name`` as the profiler and ``torch.ops`` know it (``"kvlib::matvec"``), its
    ``schema``, its ``fake``, its ``part`` of a step (:data:`PARTS`) and where its code lives."""
    name: str
    schema: str
    fake: Callable[..., torch.Tensor]
    part: str
    code: str

    @property
    def packet(self):
        """``torch.ops.<namespace>.<name>``."""
        namespace, short = self.name.split("::")
        return getattr(getattr(torch.ops, namespace), short)


OPS: dict[str, Op] = {}
_LIBS = {ns: torch.library.Library(ns, "FRAGMENT") for ns in ("kvlib", "kvlib_cpu")}   # kept alive here


def _declare(name: str, schema: str, part: str, code: str) -> Callable[[Callable], Callable]:
    """Declare operator ``name`` with ``schema``, the decorated function as its fake."""
    if part not in PARTS:
        raise ValueError(f"{name}: part {part!r} is not one of {PARTS}")

    def register(fake: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
        namespace, short = name.split("::")
        _LIBS[namespace].define(short + schema)
        if "Tensor" in schema:                     # one that takes no tensor is never traced
            torch.library.register_fake(name, fake, lib=_LIBS[namespace])
        OPS[name] = Op(name, schema, fake, part, code)
        return fake
    return register


def implement(name: str, fn: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """Give the Python operator ``name`` (declared here) its implementation ``fn``, for every device;
    returns ``torch.ops.kvlib.<name>``. ``fn`` returns a new tensor and changes none of its arguments."""
    op = OPS.get(name)
    if op is None or not name.startswith("kvlib::"):
        raise KeyError(f"{name} is not one of kvlib's Python operators: {sorted(n for n in OPS if n.startswith('kvlib::'))}")
    _LIBS["kvlib"].impl(name.split("::")[1], fn, "CompositeExplicitAutograd")
    return op.packet


def step_parts() -> dict[str, tuple[str, ...]]:
    """kvlib's operators by the part of a step they belong to (``"other operators"`` left out)."""
    return {part: tuple(n for n, op in OPS.items() if op.part == part) for part in PARTS[:2]}


def attention_room(q: torch.Tensor) -> torch.Tensor:
    """Room for attention's result ``(1, heads, tokens, head_dim)`` from ``q`` of that shape, laid
    out in memory as ``(1, tokens, heads, head_dim)``: the layer's output product then reads it as
    it lies. Fixed here, not taken from ``q``, whose layout the compiler may choose after tracing."""
    b, heads, tokens, head_dim = q.shape
    return q.new_empty(b, tokens, heads, head_dim).transpose(1, 2)


# Python operators ----------------------------------------------------------------------------

@_declare("kvlib::matvec", "(Tensor matrix, Tensor vector) -> Tensor", "matrix products", "kvlib/fast/heads.py")
def _(matrix, vector):
    return matrix.new_empty(matrix.shape[0])                                     # (rows,)


@_declare("kvlib::packed_linear", "(Tensor x, Tensor packed, int out_features) -> Tensor", "matrix products",
          "kvlib/fast/packed.py")
def _(x, packed, out_features):
    return x.new_empty(*x.shape[:-1], out_features)                              # (..., out)


@_declare("kvlib::unified_attention", "(Tensor q, Tensor k, Tensor v, int layer) -> Tensor", "attention",
          "kvlib/serve/compiled.py")
def _(q, k, v, layer):
    return attention_room(q)


# C++ kernels (kvlib/fast/*.cpp) ----------------------------------------------------------------

def _blocks_mm(x, w, n):
    return x.new_empty(*x.shape[:-1], n)                                         # (..., n)


for _format in ("q4_1", "q8_0"):                 # x (..., in) times a weight in GGUF blocks (out = n)
    _declare(f"kvlib_cpu::{_format}_mm", "(Tensor x, Tensor w, int n) -> Tensor", "matrix products",
             "kvlib/fast/cpu_kernels.cpp")(_blocks_mm)


@_declare("kvlib_cpu::quantize_rows", "(Tensor x) -> Tensor", "other operators", "kvlib/fast/cpu_kernels.cpp")
def _(x):
    return x.new_empty(x.shape[0], x.shape[1] // BLOCK * Q8_1_BYTES, dtype=torch.uint8)   # (rows, blocks · 40)


@_declare("kvlib_cpu::paged_attention", "(Tensor q, Tensor k_pool, Tensor v_pool, Tensor context, Tensor lengths, "
          "Tensor row, float scale) -> Tensor", "attention", "kvlib/fast/paged_attention.cpp")
def _(q, k_pool, v_pool, context, lengths, row, scale):
    return torch.empty_like(q)                                                   # (n, heads, head_dim)


@_declare("kvlib_cpu::panel_pack", "(Tensor w) -> Tensor", "other operators", "kvlib/fast/panels.cpp")
def _(w):
    return w.new_empty(-(-w.shape[0] // 16), w.shape[1], 16)                     # (panels, in, 16)


@_declare("kvlib_cpu::panel_mm", "(Tensor x, Tensor p, int out) -> Tensor", "matrix products",
          "kvlib/fast/panels.cpp")
def _(x, p, out):
    return x.new_empty(*x.shape[:-1], out)                                       # (..., out)


# Which vector code a build runs ("avx2", "avx512" or "plain loops"): information, never traced.
@_declare("kvlib_cpu::simd", "() -> str", "other operators", "kvlib/fast/cpu_kernels.cpp")
def _():
    raise NotImplementedError


@_declare("kvlib_cpu::panel_simd", "() -> str", "other operators", "kvlib/fast/panels.cpp")
def _():
    raise NotImplementedError
