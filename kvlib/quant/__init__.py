"""Fewer bytes per weight: quantized linear layers and the number formats behind them.

- :mod:`.formats`: int8 per channel, int4 per group, packing, llama.cpp's Q4_1 blocks;
- :mod:`.linear`: :class:`Int8Linear` and :class:`Int4Linear` (Q4_1 blocks): a stored format each, and a
  kernel as an attribute (the reference, or PyTorch's weight-only kernels);
- :mod:`.model`: :func:`quantize` a decoder;
- :mod:`.requantize`: :func:`requantize`, weights rounded again to another grid (what a grid costs).

What they cost in quality is measured by :mod:`kvlib.measure.quality`; the model file's own
4-bit blocks are loaded by :func:`kvlib.smollm2.load_q4_1_decoder`.
"""
from __future__ import annotations

from .formats import (bits_per_weight, dequantize_int4_groups, dequantize_int8_rows, pack_int4, q4_1_as_int4_groups,
                      pack_q4_1, q4_1_blocks, quantize_asymmetric, quantize_int4_groups, quantize_int8_rows, quantize_symmetric,
                      unpack_int4, unpack_q4_1)
from .linear import COMPUTE_DTYPE, INT4, INT8, REFERENCE, Int4Linear, Int8Linear, Kernel, QuantizedLinear
from .model import SCHEMES, is_quantized, linear_layers, quantize
from .requantize import GRIDS, Grid, RoundedLinear, gguf_round_trip, requantize, requantized_weight

__all__ = ["quantize", "Int8Linear", "Int4Linear", "QuantizedLinear", "Kernel", "REFERENCE", "INT8", "INT4", "COMPUTE_DTYPE", "SCHEMES",
           "is_quantized", "linear_layers", "quantize_int8_rows", "dequantize_int8_rows",
           "quantize_int4_groups", "dequantize_int4_groups", "quantize_symmetric", "quantize_asymmetric", "pack_int4", "unpack_int4",
           "bits_per_weight", "pack_q4_1", "unpack_q4_1", "q4_1_blocks", "q4_1_as_int4_groups", "GRIDS", "Grid", "gguf_round_trip",
           "requantize", "requantized_weight", "RoundedLinear"]
