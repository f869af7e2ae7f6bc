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
Without a kernel, the requests attend in two calls per layer, whatever their number: the
decoding ones (one query each) together, the prefilling ones (a chunk each) together, each
group's rows padded to its longest and masked by :func:`kvlib.attention.visible`. The slots come from the block tables
as tensors (vLLM's ``slot_mapping``), not token by token. With a paged-attention kernel
(:class:`PagedKV`'s ``paged_attention``), all the step's tokens attend in one call per layer
(:func:`one_table`), reading their keys from the pool in place, each token its own keys (a
prefilling token at position ``p`` the first ``p + 1``), with no padding and no gather.

``Engine(..., compile=True)`` gives the runner the pass compiled (:mod:`kvlib.serve.compiled`).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from ..attention import attention, visible
from .block_manager import BlockManager
from .plan import StepPlan
from .sequence import Sequence

__all__ = ["PagedKV", "Group", "StepLayout", "ModelRunner", "group_layout", "one_table", "gather"]


@dataclass
class Group:
    """Requests whose queries attend in one call: ``rows`` requests, each with up to ``q_len``
    new tokens and ``k_len`` keys, padded (built by :func:`group_layout`)."""

    queries: torch.Tensor      # (rows, q_len) each query's index among the step's flat tokens (padding: 0)
    q_positions: torch.Tensor  # (rows, q_len) their positions (padding: 0, which sees key 0; dropped after)
    context: torch.Tensor      # (rows, k_len) the pool slots of each request's keys (padding: slot 0)
    k_positions: torch.Tensor  # (rows, k_len) the keys' positions, -1 for padding
    real: torch.Tensor         # (n,) which of the rows * q_len queries are tokens, in the step's order
    slots: torch.Tensor        # (n,) where the new tokens' keys and values go
    mask: torch.Tensor         # (rows, 1, q_len, k_len) visible(q_positions, k_positions), for every layer
    first: int                 # the flat index of the group's first token (its tokens follow in order)
    query_row: torch.Tensor    # (n,) each token's row (request) in the group
    query_keys: torch.Tensor   # (n,) how many keys each token sees: its position + 1


@dataclass
class StepLayout:
    """One step's groups: the decoding requests (one token each) first, then the prefilling ones;
    for a paged-attention kernel, the step's requests as one table (:func:`one_table`)."""

    groups: list[Group]
    slots: torch.Tensor        # (tokens,) the pool slot of each of the step's tokens, in the step's order
    table: Group | None = None   # every request of the step: context, query_row, query_keys (kernel only)


def one_table(groups: list[Group]) -> Group:
    """The step's groups as one, for a paged-attention kernel, which takes every token of the step
    in one call: their ``context`` tables stacked (each padded with slot 0 to the widest, past
    every token's keys), ``query_row`` counting the requests of earlier groups, ``query_keys``
    side by side. Only those fields and ``first`` (0) are set; the rest are the first group's."""
    if len(groups) == 1:
        return groups[0]
    width = max(g.context.shape[1] for g in groups)
    context = torch.cat([F.pad(g.context, (0, width - g.context.shape[1])) for g in groups])   # (requests, width)
    before = [0]
    for g in groups[:-1]:
        before.append(before[-1] + g.context.shape[0])
    row = torch.cat([g.query_row + b for g, b in zip(groups, before)])
    return dataclasses.replace(groups[0], context=context, query_row=row, first=0,
                               query_keys=torch.cat([g.query_keys for g in groups]))


def group_layout(blocks: BlockManager, items: list[tuple[Sequence, int]], first: int,
                 device: torch.device) -> Group:
    """The :class:`Group` of ``items`` ``(sequence, tokens)``, whose tokens start at flat index
    ``first``: request ``r`` feeds positions ``start_r .. start_r + n_r - 1`` (``start_r`` its
    computed tokens) and reads its keys ``0 .. start_r + n_r - 1``."""
    seqs, n_new = [seq for seq, _ in items], [n for _, n in items]
    q_len = max(n_new)                                    # from the lists: nothing read back from a GPU
    starts = torch.tensor([seq.num_computed for seq in seqs], device=device)           # (rows,)
    counts = torch.tensor(n_new, device=device)
    context = blocks.slot_table(seqs, [seq.num_computed + n for seq, n in items], device)   # (rows, k_len)
    keys = torch.arange(context.shape[1], device=device)
    k_positions = torch.where(keys < (starts + counts)[:, None], keys, -1)
    column = torch.arange(q_len, device=device)
    is_token = column < counts[:, None]                                               # (rows, q_len)
    before = torch.cumsum(counts, 0) - counts                                         # tokens of earlier rows
    queries = torch.where(is_token, first + before[:, None] + column, 0)
    q_positions = torch.where(is_token, starts[:, None] + column, 0)
    real = torch.tensor([r * q_len + j for r, n in enumerate(n_new) for j in range(n)], device=device)
    slots = context.gather(1, q_positions).reshape(-1)[real]
    query_row, query_keys = real // q_len, q_positions.reshape(-1)[real] + 1
    return Group(queries, q_positions, context, k_positions, real, slots, visible(q_positions, k_positions), first,
                 query_row, query_keys)


PagedAttention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
                          torch.Tensor]


class PagedKV:
    """Keys and values of every layer in blocks (see the module's docstring); grows on demand.

    ``paged_attention(q, k_pool, v_pool, context, lengths, row)``, when given, computes every token's
    attention straight from one layer's pool (``q`` ``(n, heads, head_dim)``, the pools ``(slots,
    kv_heads, head_dim)``, ``context`` as in :class:`Group`, ``lengths`` and ``row`` its ``query_keys``
    and ``query_row``; returns ``(n, heads, head_dim)``), instead of gathering the keys of each
    group into a padded tensor for PyTorch's attention: a paged-attention kernel, such as
    :func:`kvlib.fast.paged_attention`."""

    def __init__(self, n_layers: int, n_kv_heads: int, head_dim: int, block_size: int, num_blocks: int,
                 dtype: torch.dtype, device: torch.device, paged_attention: PagedAttention | None = None) -> None:
        self.block_size = block_size
        self.paged_attention = paged_attention
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
        ``positions`` and ``end`` are not needed: the step's layout says where each token sits."""
        lay = self.layout
        pool_k, pool_v = self.k[layer], self.v[layer]                 # (slots, kv_heads, head_dim)
        pool_k[lay.slots] = k[0].transpose(0, 1)                      # (tokens, kv_heads, head_dim)
        pool_v[lay.slots] = v[0].transpose(0, 1)
        if self.paged_attention is not None:                          # every token from the pool in place, one call
            t = lay.table
            out = self.paged_attention(q[0].transpose(0, 1), pool_k, pool_v, t.context, t.query_keys, t.query_row)
            return out.transpose(0, 1)[None]                          # (1, heads, tokens, head_dim), a view
        heads, _, head_dim = q.shape[1:]
        outs = []
        for g in lay.groups:                                          # decoding requests, then prefilling ones
            rows, q_len = g.queries.shape
            qg = q[0][:, g.queries.reshape(-1)].view(heads, rows, q_len, head_dim).transpose(0, 1)
            out = attention(qg, gather(pool_k, g.context), gather(pool_v, g.context), g.q_positions,
                            g.k_positions, dense=rows == 1, mask=g.mask)   # (rows, heads, q_len, head_dim)
            outs.append(out.transpose(0, 1).reshape(heads, rows * q_len, head_dim)[:, g.real])
        return (outs[0] if len(outs) == 1 else torch.cat(outs, dim=1))[None]   # (1, heads, tokens, head_dim)


def gather(pool: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Keys (or values) of the pool at ``slots`` ``(rows, n)``: ``(rows, kv_heads, n, head_dim)``."""
    rows, n = slots.shape
    return pool.index_select(0, slots.reshape(-1)).view(rows, n, *pool.shape[1:]).transpose(1, 2)


Forward = Callable[[torch.Tensor, torch.Tensor, PagedKV, torch.Tensor], torch.Tensor]


class ModelRunner:
    """Runs a model over a :class:`PagedKV` pool, one step's plan per forward pass: ``forward(ids,
    positions, kv, last)``, by default :meth:`kvlib.Decoder.run` itself (eager); the engine passes
    the compiled one (:func:`kvlib.serve.compiled.compiled_pass`). ``paged_attention``: the pool's
    (see :class:`PagedKV`)."""

    def __init__(self, model: torch.nn.Module, blocks: BlockManager, forward: Forward | None = None,
                 paged_attention: PagedAttention | None = None) -> None:
        cfg, p = model.config, next(model.parameters())
        self.model, self.blocks = model, blocks
        self.kv = PagedKV(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, blocks.block_size,
                          max(blocks.capacity, 1), p.dtype, p.device, paged_attention)
        self.forward = forward or self._eager

    def _eager(self, ids: torch.Tensor, positions: torch.Tensor, kv: PagedKV, last: torch.Tensor) -> torch.Tensor:
        return self.model.run(ids, positions, kv, end=0, last=last)    # (the paged pool reads no end)

    def layout(self, plan: StepPlan) -> tuple[StepLayout, list[int], list[int], dict[int, int]]:
        """The step's layout, its token ids, their positions (decoding requests first, as the plan
        calls them: :func:`kvlib.serve.plan.decoding`), and, for each item whose tokens reach its
        end (it chooses a token), the flat index of its last token."""
        items, device = plan.items, self.kv.k.device
        decode = [i for i, kind in enumerate(plan.kinds) if kind == "decode"]
        order = decode + [i for i, kind in enumerate(plan.kinds) if kind != "decode"]
        ids, positions, wanted = [], [], {}
        for i in order:
            seq, n = items[i]
            ids += seq.tokens[seq.num_computed:seq.num_computed + n]
            positions += range(seq.num_computed, seq.num_computed + n)
            if seq.num_computed + n == seq.num_tokens:
                wanted[i] = len(ids) - 1
        parts = [order[:len(decode)], order[len(decode):]]
        groups = [group_layout(self.blocks, [items[i] for i in part], first, device)
                  for part, first in zip(parts, (0, len(decode))) if part]
        table = one_table(groups) if self.kv.paged_attention is not None else None
        return StepLayout(groups, torch.cat([g.slots for g in groups]), table), ids, positions, wanted

    @torch.no_grad()
    def step(self, plan: StepPlan) -> dict[int, torch.Tensor]:
        """Run the plan's items ``(sequence, tokens)`` in one forward pass; return the logits
        ``(vocab,)`` of each sequence whose tokens reach its end (it chooses a new token), by its
        position in ``plan.items``."""
        self.kv.grow(self.blocks.capacity)
        self.kv.layout, ids, positions, wanted = self.layout(plan)
        device = self.kv.k.device
        columns = list(wanted.values()) or [len(ids) - 1]          # (no request chooses: any one column)
        try:
            logits = self.forward(torch.tensor([ids], device=device), torch.tensor([positions], device=device),
                                  self.kv, torch.tensor([columns], device=device))     # (1, k, vocab)
        finally:
            self.kv.layout = None
        return {i: logits[0, j] for j, i in enumerate(wanted)}
