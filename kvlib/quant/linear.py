"""Linear layers whose weights are stored in 8 or 4 bits: drop-in replacements for ``nn.Linear``
(after gpt-fast's ``WeightOnlyInt8Linear`` and ``WeightOnlyInt4Linear``). Each is two things kept
apart, as vLLM keeps a layer's weights apart from its ``quant_method``:

- **the format, as data**: the buffers a state dict saves. :class:`Int8Linear` keeps int8
  integers and one scale per output row; :class:`Int4Linear` keeps Q4_1 blocks, the bytes of the
  real model's file as they are (32 weights share a float16 scale ``d`` and minimum ``m``,
  ``w = d · q + m``). :meth:`~QuantizedLinear.dequantized` reads the weights they stand for.
- **the kernel that multiplies by it**, an attribute: ``layer.kernel``, a :class:`Kernel`. It lays
  out once what it needs beyond the format (``prepare``, as vLLM's
  ``process_weights_after_loading``; kept in buffers a state dict leaves out), multiplies
  (``forward``) and says what a product of one row reads (``step_bytes``). ``layer.use(kernel)``
  changes it. :data:`REFERENCE` is the definition: dequantize, then ``F.linear`` (any device; it
  reads the weights twice over, so it is slow). The default on the CPU is PyTorch's weight-only
  kernel (:data:`INT8`, :data:`INT4`); :mod:`kvlib.fast` sets others (kvlib's own, dense copies).

PyTorch's kernels, ``aten._weight_int8pack_mm`` and ``aten._weight_int4pack_mm_for_cpu``, take
bfloat16 activations and scales (with float32 ones they fall back to slow loops), so a layer on
them computes in bfloat16 and hands back its input's dtype. The int4 kernel takes its integers
packed in a layout of its own (which depends on the CPU's vector instructions) and a scale and a
zero per group, ``w = (q - 8) · scale + zero``: ``scale = d`` and ``zero = m + 8 d``, rounded to
bfloat16. Off the CPU there is no such kernel: these layers run the reference there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .formats import Q4_1_BLOCK, dequantize_int8_rows, pack_q4_1, quantize_int4_groups, quantize_int8_rows, unpack_q4_1

__all__ = ["Kernel", "REFERENCE", "INT8", "INT4", "QuantizedLinear", "Int8Linear", "Int4Linear", "COMPUTE_DTYPE"]

COMPUTE_DTYPE = torch.bfloat16      # what PyTorch's weight-only kernels multiply in


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    return x.reshape(-1, x.shape[-1]).to(COMPUTE_DTYPE)                          # (tokens, in)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """``t`` rounded to bfloat16, kept as its 16-bit patterns (``int16``): data that a cast of the
    model leaves alone. ``.view(COMPUTE_DTYPE)`` reads the numbers back, at no cost."""
    return t.to(COMPUTE_DTYPE).contiguous().view(torch.int16)


def nbytes(tensors) -> int:
    """The bytes of ``tensors``, together."""
    return sum(t.numel() * t.element_size() for t in tensors)


class Kernel:
    """How a quantized layer multiplies by its stored weights. This one is the reference:
    ``F.linear`` with the weights dequantized at every call, in the input's dtype."""

    name = "the reference (dequantize, then F.linear)"

    def prepare(self, layer: "QuantizedLinear") -> None:
        """Lay out, once, what :meth:`forward` needs beyond the stored format (``layer.derive``)."""

    def forward(self, layer: "QuantizedLinear", x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, layer.dequantized().to(x.dtype))

    def step_bytes(self, layer: "QuantizedLinear") -> int:
        """The bytes a product of one row reads: here the stored format."""
        return layer.stored_bytes()

    def __repr__(self) -> str:
        return self.name

    def __deepcopy__(self, memo) -> "Kernel":
        return self                        # a kernel holds no tensors: a copied layer shares it


REFERENCE = Kernel()


class QuantizedLinear(nn.Module):
    """What the stored formats share: the kernel attribute, and the buffers a kernel derives
    (left out of the state dict, rebuilt when a state dict is loaded)."""

    in_features: int
    out_features: int

    def __init__(self) -> None:
        super().__init__()
        self.kernel: Kernel = REFERENCE
        self._derived: list[str] = []

    def use(self, kernel: Kernel) -> "QuantizedLinear":
        """Multiply with ``kernel`` from now on: the last kernel's buffers dropped, the new one's laid out."""
        for name in self._derived:
            del self._buffers[name]
        self._derived = []
        kernel.prepare(self)
        self.kernel = kernel
        return self

    def derive(self, name: str, tensor: torch.Tensor) -> None:
        """Keep ``tensor`` for the kernel, as a buffer the state dict leaves out."""
        self.register_buffer(name, tensor, persistent=False)
        self._derived.append(name)

    def stored_bytes(self) -> int:
        """The bytes of the stored format (what a state dict saves)."""
        return nbytes(b for name, b in self._buffers.items() if name not in self._derived)

    def step_bytes(self) -> int:
        """The bytes a product of one row reads with this layer's kernel."""
        return self.kernel.step_bytes(self)

    def dequantized(self) -> torch.Tensor:
        """The weights the stored format stands for, ``(out, in)`` float32."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.kernel.forward(self, x)                                    # (..., in) -> (..., out)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if any(key.startswith(prefix) for key in state_dict):
            self.use(self.kernel)                                              # laid out again from the new data

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, {self.format}, {self.kernel!r}"


class _PyTorchKernel(Kernel):
    """PyTorch's weight-only CPU kernel; the reference elsewhere."""

    def forward(self, layer: "QuantizedLinear", x: torch.Tensor) -> torch.Tensor:
        if x.device.type != "cpu":
            return REFERENCE.forward(layer, x)
        return self.product(layer, _as_rows(x)).reshape(*x.shape[:-1], layer.out_features).to(x.dtype)

    def product(self, layer: "QuantizedLinear", rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class PyTorchInt8(_PyTorchKernel):
    name = "PyTorch's int8 kernel"

    def product(self, layer: "Int8Linear", rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int8pack_mm(rows, layer.q, layer.kernel_scale)     # (tokens, out)


class PyTorchInt4(_PyTorchKernel):
    """PyTorch's int4 kernel: the integers packed by its own routine (the only one that knows its
    layout), scales and zeros ``(groups, out, 2)`` in bfloat16."""

    name = "PyTorch's int4 kernel"

    def prepare(self, layer: "Int4Linear") -> None:
        if layer.out_features % 16:
            raise ValueError(f"PyTorch's int4 kernel takes a multiple of 16 output rows, this layer has "
                             f"{layer.out_features}: give it another kernel (REFERENCE, or kvlib.fast.Q4_1)")
        q, d, m = layer.unpacked()                                             # (out, in), (out, groups) x2
        packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q.to("cpu", torch.int32), 1)
        layer.derive("int4_packed", packed.to(layer.blocks.device))
        layer.derive("int4_scales", _bits(torch.stack([d.t(), (m + 8 * d).t()], dim=-1)))   # bf16, as int16 bits

    def product(self, layer: "Int4Linear", rows: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows, layer.int4_packed, Q4_1_BLOCK,
                                                          layer.int4_scales.view(COMPUTE_DTYPE))

    def step_bytes(self, layer: "Int4Linear") -> int:
        return nbytes([layer.int4_packed, layer.int4_scales])


INT8, INT4 = PyTorchInt8(), PyTorchInt4()


class Int8Linear(QuantizedLinear):
    """``y = x @ (q · scale)ᵀ`` with ``q`` int8 ``(out, in)`` and one scale per output row."""

    format = "int8 per output row"

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, kernel: Kernel = INT8) -> None:
        super().__init__()
        if q.dtype != torch.int8 or q.dim() != 2 or scale.shape != (q.shape[0],):
            raise ValueError(f"Int8Linear takes q int8 (out, in) and one scale per row, got {q.dtype} "
                             f"{tuple(q.shape)} and {tuple(scale.shape)}")
        self.out_features, self.in_features = q.shape
        self.register_buffer("q", q.contiguous())
        self.register_buffer("scale", _bits(scale))                   # bfloat16 numbers, as int16 bits
        self.use(kernel)

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
        return cls(torch.cat([layer.q for layer in layers]), torch.cat([layer.kernel_scale for layer in layers]),
                   layers[0].kernel)

    @property
    def kernel_scale(self) -> torch.Tensor:
        """The scales as the kernel takes them: ``(out,)`` bfloat16."""
        return self.scale.view(COMPUTE_DTYPE)

    def dequantized(self) -> torch.Tensor:
        """``q · scale`` (the scale rounded to bf16): ``(out, in)`` float32."""
        return dequantize_int8_rows(self.q, self.kernel_scale)


class Int4Linear(QuantizedLinear):
    """``y = x @ Wᵀ`` with ``W`` stored in Q4_1 blocks (``blocks``, ``(out, in/32 · 20)`` uint8, the
    layout of :func:`~kvlib.quant.formats.pack_q4_1`): ``w = d · q + m`` per 32 inputs."""

    format = "Q4_1 blocks of 32"
    group_size = Q4_1_BLOCK

    def __init__(self, blocks: torch.Tensor, in_features: int, out_features: int, kernel: Kernel = INT4) -> None:
        super().__init__()
        if in_features % Q4_1_BLOCK or blocks.dtype != torch.uint8 or \
                tuple(blocks.shape) != (out_features, in_features // Q4_1_BLOCK * 20):
            raise ValueError(f"Int4Linear: {out_features} rows of {in_features} inputs (a multiple of 32) take Q4_1 "
                             f"blocks of shape ({out_features}, {in_features // Q4_1_BLOCK * 20}) uint8, got "
                             f"{tuple(blocks.shape)} {blocks.dtype}")
        self.in_features, self.out_features = in_features, out_features
        self.register_buffer("blocks", blocks.contiguous())
        self.use(kernel)

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "Int4Linear":
        """Quantize a float ``(out, in)`` weight to Q4_1, as llama.cpp does: per 32 inputs, ``m`` the
        smallest weight and ``d`` a fifteenth of their range (both then rounded to float16)."""
        q, scale, zero = quantize_int4_groups(weight.detach().float(), Q4_1_BLOCK)
        return cls(pack_q4_1(q, scale, zero - 8 * scale), weight.shape[1], weight.shape[0])

    @classmethod
    def concat(cls, layers: "list[Int4Linear]") -> "Int4Linear":
        """One layer whose outputs are those of ``layers`` side by side (same inputs): their blocks,
        one row of blocks per output, stacked, exactly."""
        widths = {layer.in_features for layer in layers}
        if len(widths) != 1:
            raise ValueError(f"Int4Linear.concat: the layers must share their input width, got {sorted(widths)}")
        return cls(torch.cat([layer.blocks for layer in layers]), widths.pop(),
                   sum(layer.out_features for layer in layers), layers[0].kernel)

    def unpacked(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(q, d, m)``: the integers ``(out, in)`` uint8 and ``(out, in/32)`` float32 scales and minima."""
        return unpack_q4_1(self.blocks, (self.out_features, self.in_features))

    def dequantized(self) -> torch.Tensor:
        """``d · q + m``, exactly: ``(out, in)`` float32."""
        q, d, m = self.unpacked()
        g = q.reshape(self.out_features, -1, Q4_1_BLOCK).float()                  # (out, blocks, 32)
        return (d[..., None] * g + m[..., None]).reshape(self.out_features, self.in_features)
