"""A Llama-style decoder: RMSNorm, RoPE, grouped-query attention, SwiGLU MLP, tied embeddings."""
from __future__ import annotations

import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from .attention import Attention, KVStore
from .cache.base import KVCache
from .config import Config
from .rope import RotaryEmbedding, Rotation, as_positions


class RMSNorm(nn.Module):
    """Scale each vector to unit root-mean-square, then by a learned gain (no mean, no bias)."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x * rsqrt(mean(x²) + eps) * weight, as one fused operator (bit for bit the formula in
        # float32): one call instead of five, in a decode step that runs two norms per layer.
        if x.dtype in (torch.float16, torch.bfloat16):
            # Normalise in float32, round, then scale by the gain, as Llama does, so
            # half-precision models stay stable.
            return self.weight * F.rms_norm(x.float(), (x.shape[-1],), None, self.eps).to(x.dtype)
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

    def forward(self, x: torch.Tensor, rope: RotaryEmbedding | Rotation, positions: torch.Tensor,
                cache: KVStore | None = None, layer: int = 0, end: int = 0,
                window: int | None = None, sinks: int = 0) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), rope, positions, cache, layer, end, window, sinks)
        return x + self.mlp(self.mlp_norm(x))


class Decoder(nn.Module):
    """``model(ids)`` maps token ids ``(batch, seq)`` to next-token logits ``(batch, seq, vocab)``.

    Pass a :class:`kvlib.KVCache` to reuse the keys and values of earlier tokens: row ``b``'s
    new ids are then positions ``cache.lengths[b], cache.lengths[b] + 1, ...`` and the cache
    moves past them.
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

    @classmethod
    def empty(cls, config: Config) -> "Decoder":
        """The layout of a decoder with no weights yet (its parameters on PyTorch's ``meta``
        device, which stores nothing): what a loader fills with ``load_state_dict(state,
        assign=True)``, without drawing random weights only to throw them away. The RoPE
        tables, computed rather than loaded, are made for real."""
        with torch.device("meta"):
            model = cls(config)
        model.rope = RotaryEmbedding(config.head_dim, config.max_seq_len, config.rope_theta)
        return model

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        # Wide enough that a random model's greedy text varies from token to token (with
        # tied embeddings and a small init it would just repeat its last token), so that
        # "cached and uncached choose the same tokens" is a test that can fail.
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, mean=0.0, std=1.0 / math.sqrt(module.embedding_dim))
        elif isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, mean=0.0, std=1.5 / math.sqrt(module.in_features))

    def forward(self, ids: torch.Tensor, cache: KVCache | None = None, *, last_only: bool = False,
                window: int | None = None, sinks: int = 0, n_tokens: Sequence[int] | None = None) -> torch.Tensor:
        """Logits for every position of ``ids``, or only the last one with ``last_only=True``
        (what generation needs: ``(batch, 1, vocab)``).

        With a cache, row ``b``'s ids go to positions ``cache.lengths[b], ...``: their keys and
        values are stored and the cache moves past them. ``n_tokens`` (one count per row) says
        that only the first ``n_tokens[b]`` ids of row ``b`` are tokens and the rest is padding
        (prompts of different lengths in one batch): the cache moves each row past its own
        tokens only, and ``last_only`` gives each row's last token. ``window=W`` runs
        sliding-window attention without a cache (a :class:`kvlib.cache.SlidingWindowKVCache`
        brings its own window); ``sinks=S`` (with ``window``, without a cache) lets every token
        also see the first ``S`` tokens: StreamingLLM's attention sinks.

        This is :meth:`check_input`, then :meth:`run`, then ``cache.advance``.
        """
        if sinks and (window is None or cache is not None):
            raise ValueError(f"sinks={sinks!r} keeps the first tokens visible beside a sliding window: give "
                             "window=W too, and run the whole sequence without a cache (model(ids, window=W, sinks=S))")
        self.check_input(ids, cache, n_tokens)
        t = ids.shape[1]
        if cache is None:
            positions, end = torch.arange(t, device=ids.device)[None], t
        else:
            positions, end = cache.positions(t), cache.end(t)
        last = None
        if last_only:
            last = -1 if n_tokens is None else torch.tensor(n_tokens, device=ids.device)[:, None] - 1
        logits = self.run(ids, positions, cache, end=end, last=last, window=window, sinks=sinks)
        if cache is not None:
            cache.advance(t if n_tokens is None else n_tokens)
        return logits

    def run(self, ids: torch.Tensor, positions: int | torch.Tensor, cache: KVStore | None = None, *,
            end: int | None = None, last: int | torch.Tensor | None = None, window: int | None = None,
            sinks: int = 0) -> torch.Tensor:
        """The forward pass itself: ``ids`` ``(batch, seq)`` at ``positions`` ``(batch, seq)`` to
        logits, through ``cache`` when one is given (which stores their keys and values).

        It checks nothing and moves no cache on (:meth:`forward` does both), so it is the
        function to trace: :mod:`kvlib.compiled` compiles exactly this, and the serving engine
        (:mod:`kvlib.serve`) runs it over its paged pool. ``last``: ``None`` for the logits of
        every token; ``-1`` for the last column only, ``(batch, 1, vocab)``; a ``(batch, k)`` tensor
        for ``k`` chosen columns of each row, ``(batch, k, vocab)``. ``positions`` may be an int ``p``
        (the tokens sit at ``p, p + 1, ...``); ``end`` (what a :class:`kvlib.KVCache` reads, see
        :meth:`kvlib.KVCache.end`) is then ``p + seq``, else one past the furthest position.
        """
        if end is None:
            end = positions + ids.shape[1] if isinstance(positions, int) else int(positions.max()) + 1
        positions = as_positions(positions, ids.shape[1], ids.device)
        x = self.embed(ids)                                        # (batch, seq, d_model)
        rotation = self.rope.at(positions)                         # the angles of these positions, once
        for i, block in enumerate(self.blocks):
            x = block(x, rotation, positions, cache, i, end, window, sinks)
        if isinstance(last, torch.Tensor):
            x = x[torch.arange(x.shape[0], device=x.device)[:, None], last]    # (batch, k, d_model)
        elif last is not None:
            x = x[:, last:][:, :1]
        if self.lm_head is not None:
            return self.lm_head(self.norm(x))
        return F.linear(self.norm(x), self.embed.weight)           # tied: the input embedding, transposed

    def check_input(self, ids: torch.Tensor, cache: KVCache | None = None,
                    n_tokens: Sequence[int] | None = None) -> None:
        """Raise a clear ``TypeError``/``ValueError`` if ``ids`` (and ``cache``, ``n_tokens``) cannot
        go through this model: wrong type, shape or dtype, ids outside the vocabulary, too long a
        sequence, a cache of another shape, dtype or size, or counts that do not fit the rows."""
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
        start = 0 if cache is None else max(cache.lengths)
        if start + ids.shape[1] > cfg.max_seq_len:
            raise ValueError(f"sequence too long: positions {start}..{start + ids.shape[1] - 1} but the model "
                             f"supports max_seq_len={cfg.max_seq_len}")
        if cache is not None:
            self.check_cache(cache, ids.shape[0])
            cache.check_room(ids.shape[1] if n_tokens is None else n_tokens)
        if n_tokens is not None:
            counts = list(n_tokens)
            if len(counts) != ids.shape[0] or not all(isinstance(n, int) and 1 <= n <= ids.shape[1] for n in counts):
                raise ValueError(f"n_tokens gives each row's number of tokens: {ids.shape[0]} ints in "
                                 f"1..{ids.shape[1]} (a row needs at least one token), got {counts!r}")

    def check_cache(self, cache: KVCache, batch: int) -> None:
        """A clear ``ValueError`` if ``cache`` was not built for this model and ``batch`` rows."""
        if cache.batch != batch:
            raise ValueError(f"cache was built for batch size {cache.batch}, ids have batch size {batch}")
        if cache.dtype != self.embed.weight.dtype:
            raise ValueError(f"cache holds {cache.dtype} but the model computes in {self.embed.weight.dtype}; "
                             f"build it with KVCache.for_model(model)")
        if len(cache.layers) != self.config.n_layers:
            raise ValueError(f"cache has {len(cache.layers)} layers, the model {self.config.n_layers}")

    @property
    def device(self) -> torch.device:
        return self.embed.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.weight.dtype

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def weight_bytes(self) -> int:
        """The bytes of weights a one-token decode step reads, whatever the format: each layer's
        parameters, each tensor once; of a quantized layer, what its kernel reads for one row (its
        ``step_bytes()``: the stored format, or the kernel's own layout of it, not a dense copy
        kept for many rows); the embedding whole when it is the output layer too, else its one row.
        RoPE's tables are no weights. What the roofline counts."""
        seen: set[int] = set()

        def read(module: nn.Module) -> int:
            if hasattr(module, "step_bytes"):
                return module.step_bytes()
            own = [*module.parameters(recurse=False), *module.buffers(recurse=False)]
            fresh = [t for t in own if id(t) not in seen and not seen.add(id(t))]
            return sum(t.numel() * t.element_size() for t in fresh) + sum(read(c) for c in module.children())

        total = sum(read(m) for name, m in self.named_children() if name not in ("embed", "rope"))
        table = self.embed.weight
        if self.lm_head is None or id(table) in seen:                   # the output layer reads it whole
            return total + (0 if id(table) in seen else table.numel() * table.element_size())
        return total + table[0].numel() * table.element_size()          # one row a token
