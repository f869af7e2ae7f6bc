"""The engine's hands: the paged pool of keys and values, and one forward pass per step.

:class:`PagedKV` holds the keys and values of every layer in one preallocated pool of blocks
of ``block_size`` token slots (``(layers, blocks * block_size, kv_heads, head_dim)``); a
request's tokens live wherever its *block table* says, position ``p`` in slot
``table[p // block_size] * block_size + p % block_size``. It keeps the contract of
:class:`kvlib.attention.KVStore`, so :meth:`kvlib.Decoder.run` runs over it unchanged.

:class:`ModelRunner` executes a step's plan in **one forward pass**: the tokens of every
scheduled request (the one new token of each decoding request, the prompt chunk of each
prefilling one) in one flat row ``(1, tokens)``, each token at its own position, each request
attending through its own block table. Only scheduled requests are computed, never idle rows.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..attention import attention
from .blocks import BlockManager
from .sequence import Sequence

__all__ = ["PagedKV", "StepLayout", "ModelRunner"]


@dataclass
class StepLayout:
    """Where one step's flat tokens go and what each request reads (built by :meth:`ModelRunner.layout`).

    The decoding requests come first, one token each (tokens ``0 .. n_decode-1``), then each
    prefilling request's chunk, in order (``chunks``: ``(start, stop, context_slots)``)."""

    slots: torch.Tensor              # (tokens,) the pool slot each new token's key and value go to
    n_decode: int
    decode_context: torch.Tensor     # (n_decode, longest) slots of each decoding request's keys, padded
    decode_positions: torch.Tensor   # (n_decode, longest) their positions, -1 for padding
    chunks: list[tuple[int, int, torch.Tensor]]


class PagedKV:
    """Keys and values of every layer in blocks (see the module's docstring); grows on demand."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                 dtype: torch.dtype, device: torch.device) -> None:
        self.block_size = block_size
        shape = (n_layers, num_blocks * block_size, n_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.layout: StepLayout | None = None

    @property
    def num_blocks(self) -> int:
        return self.k.shape[1] // self.block_size

    def grow(self, num_blocks: int) -> None:
        """Make room for at least ``num_blocks`` blocks (doubling), keeping what is stored."""
        if num_blocks <= self.num_blocks:
            return
        extra = (max(num_blocks, 2 * self.num_blocks) - self.num_blocks) * self.block_size
        pad = self.k.new_zeros((self.k.shape[0], extra, *self.k.shape[2:]))
        self.k, self.v = torch.cat([self.k, pad], dim=1), torch.cat([self.v, pad], dim=1)

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor,
               end: int) -> torch.Tensor:
        """The :class:`kvlib.attention.KVStore` contract for one flat step: ``q`` ``(1, heads, tokens,
        head_dim)``, ``k, v`` ``(1, kv_heads, tokens, head_dim)``; returns ``(1, heads, tokens, head_dim)``.
        ``end`` is not needed: the step's layout says which slots each request reads."""
        lay = self.layout
        pool_k, pool_v = self.k[layer], self.v[layer]                 # (slots, kv_heads, head_dim)
        pool_k[lay.slots] = k[0].transpose(0, 1)                      # (tokens, kv_heads, head_dim)
        pool_v[lay.slots] = v[0].transpose(0, 1)
        outs = []
        if lay.n_decode:                                               # one query per request, padded keys
            qd = q[0, :, :lay.n_decode].transpose(0, 1)[:, :, None]   # (n_decode, heads, 1, head_dim)
            outs.append(attention(qd, gather(pool_k, lay.decode_context), gather(pool_v, lay.decode_context),
                                  positions[0, :lay.n_decode, None], lay.decode_positions)[:, :, 0].transpose(0, 1))
        for start, stop, context in lay.chunks:                        # a prompt chunk after its cached tokens
            keys, values = gather(pool_k, context[None]), gather(pool_v, context[None])
            key_positions = torch.arange(len(context), device=q.device)[None]
            outs.append(attention(q[:, :, start:stop], keys, values, positions[:, start:stop], key_positions,
                                  dense=True)[0])
        return torch.cat(outs, dim=1)[None]                             # (1, heads, tokens, head_dim)


def gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Keys (or values) of the pool at ``slots`` ``(rows, n)``: ``(rows, kv_heads, n, head_dim)``."""
    rows, n = slots.shape
    return pool.index_select(0, slots.reshape(-1)).view(rows, n, *pool.shape[1:]).transpose(1, 2)


class ModelRunner:
    """Runs a model over a :class:`PagedKV` pool, one step's plan per forward pass."""

    def __init__(self, model: torch.nn.Module, blocks: BlockManager) -> None:
        cfg, p = model.config, next(model.parameters())
        self.model, self.blocks = model, blocks
        self.kv = PagedKV(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, blocks.block_size,
                          max(blocks.capacity, 1), p.dtype, p.device)

    def layout(self, items: list[tuple[Sequence, int]]) -> tuple[StepLayout, list[int], list[int]]:
        """The step's layout, its token ids and their positions, decoding requests first."""
        device, blocks = self.kv.k.device, self.blocks
        ids, positions, slots, chunks = [], [], [], []
        decode = [(seq, n) for seq, n in items if seq.num_tokens - seq.num_computed == 1]
        prefill = [(seq, n) for seq, n in items if seq.num_tokens - seq.num_computed > 1]
        for seq, n in decode + prefill:
            start = seq.num_computed
            ids += seq.tokens[start:start + n]
            positions += range(start, start + n)
            slots += blocks.slots(seq, start, start + n)
        contexts = [blocks.slots(seq, 0, seq.num_computed + 1) for seq, _ in decode]
        longest = max(map(len, contexts), default=0)
        padded = torch.tensor([c + [0] * (longest - len(c)) for c in contexts], dtype=torch.long, device=device)
        held = torch.tensor([list(range(len(c))) + [-1] * (longest - len(c)) for c in contexts], device=device)
        start = len(decode)
        for seq, n in prefill:
            context = torch.tensor(blocks.slots(seq, 0, seq.num_computed + n), device=device)
            chunks.append((start, start + n, context))
            start += n
        lay = StepLayout(torch.tensor(slots, device=device), len(decode), padded.reshape(len(decode), longest),
                         held.reshape(len(decode), longest), chunks)
        return lay, ids, positions

    @torch.no_grad()
    def step(self, items: list[tuple[Sequence, int]]) -> dict[int, torch.Tensor]:
        """Run the plan's ``items`` ``(sequence, tokens)`` in one forward pass; return the logits
        ``(vocab,)`` of each sequence whose tokens reach its end (it chooses a new token), by its
        position in ``items``."""
        self.kv.grow(self.blocks.capacity)
        lay, ids, positions = self.layout(items)
        order = [i for i, (seq, n) in enumerate(items) if seq.num_tokens - seq.num_computed == 1]
        order += [i for i, (seq, n) in enumerate(items) if seq.num_tokens - seq.num_computed > 1]
        ends, wanted = 0, {}
        for i in order:                                                  # where each item's last token lands
            seq, n = items[i]
            ends += n
            if seq.num_computed + n == seq.num_tokens:
                wanted[i] = ends - 1
        self.kv.layout = lay
        device = self.kv.k.device
        columns = list(wanted.values()) or [len(ids) - 1]          # (no request chooses: any one column)
        logits = self.model.run(torch.tensor([ids], device=device), torch.tensor([positions], device=device),
                                self.kv, end=max(positions) + 1,                  # from the list: no device sync
                                last=torch.tensor([columns], device=device))      # (1, k, vocab)
        self.kv.layout = None
        return {i: logits[0, j] for j, i in enumerate(wanted)}
