"""The fast path: the chapter's decoder with its matrices fused at load time.

:func:`fuse` returns a copy of a :class:`kvlib.Decoder` whose query, key and value
projections are one matrix, and whose MLP's gate and up projections are one matrix, in
whatever format the layers are stored (float, int8 or the native 4-bit layers). A decode
step then makes 4 matrix products per layer instead of 7: fewer kernel calls, each on a
larger matrix. The model computes the same function; only the order of a few roundings
may change. The readable modules the notebooks teach are untouched.
"""
from __future__ import annotations

from .fused import FusedAttention, FusedMLP, concat_linears, fuse, is_fused

__all__ = ["fuse", "is_fused", "FusedAttention", "FusedMLP", "concat_linears"]
