"""Linear layers whose weights are stored in 8 or 4 bits: drop-in replacements for ``nn.Linear``
(after gpt-fast's ``WeightOnlyInt8Linear`` and ``WeightOnlyInt4Linear``).

Only the weights are quantized; activations stay floating point. On a CPU the matrix
product runs in PyTorch's weight-only kernels, ``aten._weight_int8pack_mm`` and
``aten._weight_int4pack_mm_for_cpu``, which take bfloat16 activations and scales (with float32
ones they fall back to slow loops), so a layer computes in bfloat16 and hands back its input's
dtype, whatever the model around it computes in (:func:`kvlib.device.compute_dtype`). The
scales are kept as the bits of their bfloat16 numbers (``int16``), like the packed integers
beside them: casting the model to float32 leaves the kernel's operands as the kernel takes them.
Elsewhere (a GPU) there is no such kernel for these layouts: the layer dequantizes its
weight once, to a dense matrix in the activations' dtype kept beside the packed integers
(built when the layer is moved there, dropped when it is moved again), and multiplies by it
with ``F.linear``. That is as fast as a bfloat16 layer, not faster, and holds the dense copy
as well: on a GPU these layers show the formats' rounding, not their savings.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..device import compute_dtype
from .formats import dequantize_int8_rows, quantize_int4_groups, quantize_int8_rows

__all__ = ["Int8Linear", "Int4Linear", "COMPUTE_DTYPE", "INT4_GROUP_SIZES"]

COMPUTE_DTYPE = torch.bfloat16      # what the weight-only kernels multiply in
INT4_GROUP_SIZES = (32, 64, 128, 256)   # the group sizes PyTorch's int4 kernel takes


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)                          # (tokens, in)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16, kept as its 16-bit patterns (``int16``): data that a cast of the
    model leaves alone. ``.view(COMPUTE_DTYPE)`` reads the numbers back, at no cost."""
    return t.to(COMPUTE_DTYPE).contiguous().view(torch.int16)


class _WeightOnly(nn.Module):
    """What both layers share: the choice between the CPU kernel and a dense weight.

    ``force_dense = True`` (on an instance) sends CPU inputs through the dense path too, so
    that a test on a machine without a GPU can compare the two paths.
    """

    force_dense: bool = False
    _dense: torch.Tensor | None = None          # the cached dense weight; never a buffer (not saved, not moved)
    out_features: int

    def dequantized(self) -> torch.Tensor:
        raise NotImplementedError

    def uses_kernel(self, x: torch.Tensor) -> bool:
        """Whether ``x`` goes through the CPU weight-only kernel (else through the dense weight)."""
        return x.device.type == "cpu" and not self.force_dense

    def dense_weight(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight as a dense ``(out, in)`` matrix in ``dtype`` on the layer's device: built from
        :meth:`dequantized` on first use and kept until the layer is moved or cast (``.to``,
        ``.cuda``, ``.cpu``...) or loads a state dict; asked for in another dtype, rebuilt."""
        if self._dense is None or self._dense.dtype != dtype:
            self._dense = self.dequantized().to(dtype)
        return self._dense

    def _apply(self, fn, recurse: bool = True):
        """Moving or casting the buffers drops the dense weight; off the CPU it is rebuilt at
        once, in the dtype a model computes in there (:func:`kvlib.device.compute_dtype`), so no
        forward pass (or compiled graph) has to build it."""
        self._dense = None
        out = super()._apply(fn, recurse)
        device = next(iter(self.buffers())).device
        if device.type not in ("cpu", "meta"):
            self.dense_weight(compute_dtype(device))
        return out

    def _load_from_state_dict(self, *args, **kwargs) -> None:
        self._dense = None                      # the buffers are about to be overwritten in place
        super()._load_from_state_dict(*args, **kwargs)

    def _dense_forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear`` with :meth:`dense_weight` in ``x``'s dtype."""
        return F.linear(x, self.dense_weight(x.dtype))


class Int8Linear(_WeightOnly):
    """``y = x @ (q · scale)ᵀ`` with ``q`` int8 ``(out, in)`` and one scale per output row."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != (q.shape[0],):
            raise ValueError(f"Int8Linear takes q int8 (out, in) and one scale per row, got {q.dtype} "
                             f"{tuple(q.shape)} and {tuple(scale.shape)}")
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scale", _bits(scale))                   # bfloat16 numbers, as int16 bits

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "Int8Linear":
        """Quantize a float ``(out, in)`` weight, symmetric, per output row."""
        return cls(*quantize_int8_rows(weight.detach().float()))

    @classmethod
    def concat(cls, layers: "list[Int8Linear]") -> "Int8Linear":
        """One layer whose outputs are those of ``layers`` side by side (same inputs): their rows
        stacked, exactly, so one kernel call does the work of several."""
        widths = {layer.in_features for layer in layers}
        if len(widths) != 1:
            raise ValueError(f"Int8Linear.concat: the layers must share their input width, got {sorted(widths)}")
        return cls(torch.cat([layer.q for layer in layers]), torch.cat([layer.kernel_scale for layer in layers]))

    @property
    def kernel_scale(self) -> torch.Tensor:
        """The scales as the kernel takes them: ``(out,)`` bfloat16."""
        return self.scale.view(COMPUTE_DTYPE)

    def dequantized(self) -> torch.Tensor:
        """The float32 weight this layer stands for: ``q · scale`` (with the scale rounded to bf16)."""
        return dequantize_int8_rows(self.q, self.kernel_scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On the CPU the int8 kernel, in bfloat16, handing back ``x``'s dtype; elsewhere (or with
        ``force_dense``) ``F.linear`` with :meth:`dense_weight` in ``x``'s dtype."""
        if not self.uses_kernel(x):
            return self._dense_forward(x)
        y = torch.ops.aten._weight_int8pack_mm(_as_rows(x), self.q, self.kernel_scale)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8 per output row"


class Int4Linear(_WeightOnly):
    """``y = x @ Wᵀ`` with ``W = (q - 8) · scale + zero`` per group of ``group_size`` inputs,
    ``q`` 4-bit, stored packed two per byte in the layout of PyTorch's CPU int4 kernel."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, group_size: int) -> None:
        super().__init__()
        out, inp = q.shape
        if group_size not in INT4_GROUP_SIZES:
            raise ValueError(f"Int4Linear: group_size={group_size!r}; the int4 kernel takes groups of {INT4_GROUP_SIZES}")
        if scale.shape != (out, inp // group_size) or zero.shape != scale.shape or inp % group_size:
            raise ValueError(f"Int4Linear: q {tuple(q.shape)} needs a scale and a zero of shape "
                             f"({out}, {inp // group_size}) for groups of {group_size}")
        self.out_features, self.in_features, self.group_size = out, inp, group_size
        # the kernel's operands: packed weights, and (groups, out, 2) scales and zeros in bf16
        # packed by the CPU kernel's own routine wherever q is (there is no other): its layout
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to("cpu", torch.int32), 1)
        self.register_buffer("packed", packed.to(q.device))
        self.register_buffer("scales_and_zeros", _bits(torch.stack([scale.t(), zero.t()], dim=-1)))  # bf16, as int16 bits

    @classmethod
    def from_weight(cls, weight: torch.Tensor, group_size: int = 32) -> "Int4Linear":
        """Quantize a float ``(out, in)`` weight, asymmetric, in groups of ``group_size`` inputs."""
        return cls(*quantize_int4_groups(weight.detach().float(), group_size), group_size)

    @classmethod
    def concat(cls, layers: "list[Int4Linear]") -> "Int4Linear":
        """One layer whose outputs are those of ``layers`` side by side (same inputs, same groups).

        The kernel packs output rows in blocks of 64 (smaller blocks when the row count is not a
        multiple of 64), and its scales and zeros are ``(groups, out, 2)``: when every layer has
        a multiple of 64 rows, stacking is a concatenation of both, exact, with no unpacking."""
        shapes = {(layer.in_features, layer.group_size) for layer in layers}
        if len(shapes) != 1:
            raise ValueError(f"Int4Linear.concat: the layers must share their input width and group size, got {shapes}")
        if any(layer.out_features % 64 for layer in layers):
            raise ValueError(f"Int4Linear.concat stacks the kernel's blocks of 64 output rows: every layer needs a "
                             f"multiple of 64 rows, got {[layer.out_features for layer in layers]}; quantize the "
                             "stacked float weight instead (Int4Linear.from_weight)")
        (inp, group_size), = shapes
        out = cls.__new__(cls)
        nn.Module.__init__(out)
        out.out_features, out.in_features, out.group_size = sum(l.out_features for l in layers), inp, group_size
        out.register_buffer("packed", torch.cat([layer.packed for layer in layers]))
        out.register_buffer("scales_and_zeros", torch.cat([layer.scales_and_zeros for layer in layers], dim=1))
        return out

    @property
    def kernel_scales(self) -> torch.Tensor:
        """The scales and zeros as the kernel takes them: ``(groups, out, 2)`` bfloat16."""
        return self.scales_and_zeros.view(COMPUTE_DTYPE)

    def dequantized(self) -> torch.Tensor:
        """The weight this layer multiplies by, ``(out, in)`` float32: read back through the kernel
        itself (the identity matrix times the weight), so it is exactly what the kernel uses,
        each value rounded to bfloat16. The packed layout is the CPU kernel's (and depends on the
        CPU's vector instructions), so off the CPU this copies the packed integers to the CPU and
        the result back: once per move (:meth:`dense_weight`), never per call."""
        eye = torch.eye(self.in_features, dtype=COMPUTE_DTYPE, device="cpu")
        w_t = torch.ops.aten._weight_int4pack_mm_for_cpu(eye, self.packed.cpu(), self.group_size,
                                                         self.kernel_scales.cpu())             # (in, out)
        return w_t.t().float().to(self.packed.device)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """On the CPU the int4 kernel, in bfloat16, handing back ``x``'s dtype; elsewhere (or with
        ``force_dense``) ``F.linear`` with :meth:`dense_weight` in ``x``'s dtype."""
        if not self.uses_kernel(x):
            return self._dense_forward(x)
        y = torch.ops.aten._weight_int4pack_mm_for_cpu(_as_rows(x), self.packed, self.group_size,
                                                       self.kernel_scales)
        return y.reshape(*x.shape[:-1], self.out_features).to(x.dtype)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"int4 in groups of {self.group_size}")
