"""A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, tied embeddings."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention
from .cache.base import KVCache, LayerCache
from .config import Config
from .rope import RotaryEmbedding


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (no mean, no bias)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype in (torch.float16, torch.bfloat16):
            # Normalise in float32, as Llama does, so half-precision models stay stable.
            xf = x.float()
            xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
            return self.weight * xf.to(x.dtype)
        # The same formula as one fused operator (bit-for-bit equal in float32): one call
        # instead of five, in a decode step that runs two norms per layer.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


class MLP(nn.Module):
    """SwiGLU: ``down(silu(gate(x)) * up(x))``."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.d_mlp, bias=False)
        self.up = nn.Linear(config.d_model, config.d_mlp, bias=False)
        self.down = nn.Linear(config.d_mlp, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(F.silu(self.gate(x)) * self.up(x))


class Block(nn.Module):
    """One transformer layer: pre-norm attention and pre-norm MLP, each added to the residual stream."""

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.attn_norm = RMSNorm(config.d_model, config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = RMSNorm(config.d_model, config.norm_eps)
        self.mlp = MLP(config)

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding, offset: int | torch.Tensor,
                cache: LayerCache | None = None, window: int | None = None, sinks: int = 0,
                left_pad: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, offset, cache, window, sinks, left_pad)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """``model(ids)`` maps token ids ``(batch, seq)`` to next-token logits ``(batch, seq, vocab)``.

    Pass a :class:`kvlib.KVCache` to reuse the keys and values of earlier tokens: the new
    ids are then positions ``cache.pos, cache.pos + 1, ...`` and the cache advances past them.
    """

    def __init__(self, config: Config) -> None:
        super().__init__()
        self.config = config
        self.embed = nn.Embedding(config.vocab_size, config.d_model)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layers))
        self.norm = RMSNorm(config.d_model, config.norm_eps)
        self.rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
        # The output layer is the embedding, transposed (tied). Quantization may put a layer of
        # its own here (kvlib.quant.quantize(..., output_layer=True)).
        self.lm_head: nn.Module | None = None
        self.apply(self._init_weights)

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Wide enough that a random model's greedy text varies from token to token (with
        # tied embeddings and a small init it would just repeat its last token), so that
        # "cached and uncached choose the same tokens" is a test that can fail.
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=1.0 / math.sqrt(module.embedding_dim))
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=1.5 / math.sqrt(module.in_features))

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, *,
                last_only: bool = False, window: int | None = None, sinks: int = 0,
                left_pad: torch.Tensor | None = None) -> torch.Tensor:
        """Logits for every position of ``ids``, or only the last one with ``last_only=True``
        (what generation needs: ``(batch, 1, vocab)``).

        With a cache, the ids are positions ``cache.pos, cache.pos + 1, ...``: their keys and
        values are stored and the cache moves past them. ``window=W`` runs sliding-window
        attention (each token sees the last ``W`` tokens, itself included) without a cache; a
        :class:`kvlib.cache.SlidingWindowKVCache` brings its own window. ``sinks=S`` (with
        ``window``, without a cache) lets every token also see the first ``S`` tokens:
        StreamingLLM's attention sinks. ``left_pad`` (a ``(batch,)`` tensor) says how many
        tokens at the start of each row are padding: they are masked, and each row's
        positions count from its first real token (a batch of prompts of different lengths).

        This is :meth:`check_input`, then :meth:`run`, then ``cache.advance``.
        """
        if sinks and (window is None or cache is not None):
            raise ValueError(f"sinks={sinks!r} keeps the first tokens visible beside a sliding window: give "
                             "window=W too, and run the whole sequence without a cache (model(ids, window=W, sinks=S))")
        self.check_input(ids, cache, left_pad)
        logits = self.run(ids, 0 if cache is None else cache.pos, cache, last_only=last_only, window=window,
                          sinks=sinks, left_pad=left_pad)
        if cache is not None:
            cache.advance(ids.shape[1])
        return logits

    def run(self, ids: torch.Tensor, offset: int | torch.Tensor = 0, cache: KVCache | None = None, *,
            last_only: bool = False, window: int | None = None, sinks: int = 0,
            left_pad: torch.Tensor | None = None) -> torch.Tensor:
        """The forward pass itself: ``ids`` ``(batch, seq)`` at positions ``offset, offset + 1, ...``
        to logits, writing their keys and values into ``cache`` when one is given.

        It checks nothing and does not move the cache on (:meth:`forward` does both), so it
        is the function to trace: :mod:`kvlib.compiled` compiles exactly this, and a change
        here reaches the compiled path too. ``offset`` may hold one slot per row, ``(batch,)``:
        each row's tokens are written at its own slot, and attend causally within its row.
        """
        x = self.embed(ids)                                        # (batch, seq, d_model)
        for i, block in enumerate(self.blocks):
            x = block(x, self.rope, offset, None if cache is None else cache.layers[i], window, sinks, left_pad)
        if last_only:
            x = x[:, -1:]
        if self.lm_head is not None:
            return self.lm_head(self.norm(x))
        return F.linear(self.norm(x), self.embed.weight)           # tied input/output embedding

    def check_input(self, ids: torch.Tensor, cache: KVCache | None = None,
                    left_pad: torch.Tensor | None = None) -> None:
        """Raise a clear ``TypeError``/``ValueError`` if ``ids`` (and ``cache``, ``left_pad``) cannot
        go through this model: wrong type, shape or dtype, ids outside the vocabulary, too long a
        sequence, a cache of another shape, dtype or size, or padding longer than a row."""
        cfg = self.config
        if not isinstance(ids, torch.Tensor):
            raise TypeError(f"ids must be a torch.Tensor of token ids, got {type(ids).__name__}")
        if ids.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"ids must hold integer token ids (torch.long), got dtype {ids.dtype}")
        if ids.dim() != 2:
            raise ValueError(f"ids must have shape (batch, seq), got {tuple(ids.shape)} "
                             f"(for one sequence use ids[None])")
        if ids.shape[1] == 0:
            raise ValueError("ids is empty: give at least one token")
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= cfg.vocab_size:
            raise ValueError(f"token ids must lie in 0..{cfg.vocab_size - 1} (the vocabulary), "
                             f"got values from {lo} to {hi}")
        start = 0 if cache is None else int(torch.as_tensor(cache.pos).max())
        if start + ids.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence too long: positions {start}..{start + ids.shape[1] - 1} but the model "
                             f"supports max_seq_len={cfg.max_seq_len}")
        if cache is not None:
            if cache.batch != ids.shape[0]:
                raise ValueError(f"cache was built for batch size {cache.batch}, ids have batch size {ids.shape[0]}")
            dtype = self.embed.weight.dtype
            if cache.dtype != dtype:
                raise ValueError(f"cache holds {cache.dtype} but the model computes in {dtype}; "
                                 f"build it with KVCache.for_model(model)")
            if len(cache.layers) != cfg.n_layers:
                raise ValueError(f"cache has {len(cache.layers)} layers, the model {cfg.n_layers}")
            cache.check_room(ids.shape[1])
        if left_pad is not None:
            if not isinstance(left_pad, torch.Tensor) or left_pad.shape != (ids.shape[0],) or left_pad.is_floating_point():
                raise ValueError(f"left_pad must be an integer tensor of shape ({ids.shape[0]},): one count per row, "
                                 f"got {left_pad!r}")
            if int(left_pad.min()) < 0 or int(left_pad.max()) >= start + ids.shape[1]:
                raise ValueError(f"left_pad counts padding tokens at the start of each row: each must lie in "
                                 f"0..{start + ids.shape[1] - 1} (a row needs at least one real token), got "
                                 f"{left_pad.tolist()}")

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())
