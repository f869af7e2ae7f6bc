"""The engine's forward pass compiled, the way vLLM compiles its model.

``torch.compile`` turns everything between two attentions (norms, rotations, residual adds,
SwiGLU's ``silu(gate) * up``) into a few generated loops, where the eager pass makes a dozen
PyTorch calls a layer, each starting the threads anew. Attention stays outside what is compiled,
one opaque operator per layer, as vLLM's ``unified_attention``: it stores the step's keys and
values in the paged pool and attends through block tables that change every step, which a
compiled graph could not follow. Like vLLM's, the operator takes only the layer's tensors and
finds the pool and the step's layout in a *forward context* set around the pass
(:func:`forward_context`), so the compiled graph holds no step's layout and no pool of a given size.

The number of tokens in a step is a symbol of the graph: one compilation serves a 984-token
prefill and a 1-row decode step alike (a step of one token, or one row of logits, compiles once
more). What was compiled is kept on disk (:func:`kvlib.compiled.compile_cache_dir`). The tokens
are the eager pass's up to the order of a few float additions (``tests/serve/test_compiled.py``).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch

from .. import ops
from ..compiled import compiled_function
from .runner import PagedKV

__all__ = ["unified_attention", "forward_context", "compiled_pass"]

_CONTEXT: list[PagedKV] = []          # the pool of the pass running now (vLLM's forward context)


@contextmanager
def forward_context(kv: PagedKV) -> Iterator[None]:
    """Within it, :func:`unified_attention` reads and writes ``kv`` (with its step's layout set)."""
    _CONTEXT.append(kv)
    try:
        yield
    finally:
        _CONTEXT.pop()


def _unified_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int) -> torch.Tensor:
    """:meth:`PagedKV.attend` of layer ``layer`` on the pool of :func:`forward_context`: ``q``
    ``(1, heads, tokens, head_dim)``, ``k, v`` ``(1, kv_heads, tokens, head_dim)``; returns a new
    ``(1, heads, tokens, head_dim)`` tensor laid out as :func:`kvlib.ops.attention_room` says (what the compiled
    pass was told). It writes the pool, which is no argument: the compiler sees a function of its
    arguments, called in the order the layers need."""
    if not _CONTEXT:
        raise RuntimeError("kvlib::unified_attention runs inside forward_context(pool), which says which pool")
    out, room = _CONTEXT[-1].attend(layer, q, k, v, None, 0), ops.attention_room(q)
    same = out.stride() == room.stride() and out.data_ptr() not in (q.data_ptr(), k.data_ptr(), v.data_ptr())
    return out if same else room.copy_(out)


# What the compiler knows of it, the result's shape and layout, is declared in kvlib.ops.
unified_attention = ops.implement("kvlib::unified_attention", _unified_attention)


class _OpaqueAttention:
    """The cache the compiled pass is traced with (:class:`kvlib.attention.KVStore`): attention as one operator."""

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               end: int) -> torch.Tensor:
        return unified_attention(q, k, v, layer)


_OPAQUE = _OpaqueAttention()


def _pass(model: torch.nn.Module, ids: torch.Tensor, positions: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
    """What is compiled: ``model.run`` over the opaque attention, ``(1, tokens)`` to ``(1, k, vocab)``."""
    return model.run(ids, positions, _OPAQUE, end=0, last=last)


def compiled_pass(model: torch.nn.Module):
    """``forward(ids, positions, kv, last)``: :meth:`kvlib.Decoder.run` of ``ids`` ``(1, tokens)`` at
    ``positions`` over the pool ``kv`` (its step's layout set), logits of the ``last`` ``(1, k)`` columns,
    compiled. The first call compiles (or loads what an earlier process compiled); RuntimeError,
    saying what to do, where no compiler can be had (:func:`kvlib.compiled.compiled_function`)."""
    compiled = compiled_function(_pass, model, what="the engine's forward pass",
                                 fallback="Use Engine(..., compile=False) (the default) to serve without it.")

    def forward(ids: torch.Tensor, positions: torch.Tensor, kv: PagedKV, last: torch.Tensor) -> torch.Tensor:
        with forward_context(kv):
            return compiled(model, ids, positions, last)
    return forward
