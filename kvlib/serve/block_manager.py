"""The KV cache as a pool of blocks, with prefix caching (after nano-vllm and vLLM v1).

The cache is cut into *blocks* of ``block_size`` token slots. A sequence's *block table*
lists, in order, the blocks holding its tokens: token ``p`` lives in block
``block_table[p // block_size]`` at offset ``p % block_size``, i.e. in the flat slot
``block_table[p // block_size] * block_size + p % block_size`` (:meth:`BlockManager.slot`).

Each block has a *reference count*, the number of sequences whose table holds it. With
``prefix_caching=True`` every *full* block that has been computed, or is computed in the step
being planned, is also registered under a key that names its tokens and everything before them::

    key_0 = sha256(b"" + bytes of block 0's tokens)
    key_i = sha256(key_{i-1} + bytes of block i's tokens)

so that a new sequence whose prompt starts with the same tokens finds those blocks and
skips computing them. Two blocks with the same tokens after different prefixes get
different keys: their keys and values differ, since attention mixes in everything before.
A hit is checked: the cached block must hold the same tokens after the same previous key,
so a digest that collides with another block's is a miss, not a wrong block.

A block no sequence holds any more keeps its key and waits, least recently used first, to
be *evicted* (its key dropped) when a new block is needed and no never-cached block is free.

Shared blocks are never written. A sequence writes only at positions ``>= num_computed``,
i.e. into blocks from index ``num_computed // block_size`` on; the blocks it shares are
whole blocks before that (a prefix hit never covers the block of the prompt's last token,
whose logits must be computed), and :meth:`BlockManager.reserve` gives it fresh blocks for
the rest.
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict, deque
from collections.abc import Sequence as ListLike

import torch

from ..cache.paging import blocks_for
from ..checks import non_negative_int, optional_positive_int, positive_int
from .sequence import Sequence

__all__ = ["KEY_BYTES", "chain_key", "block_keys", "BlockManager"]

KEY_BYTES = 16                  # a block key is the first 16 bytes of a SHA-256 digest
TokenIds = ListLike[int]        # token ids in a list, a tuple or a slice of one


def chain_key(previous: bytes, block: TokenIds) -> bytes:
    """The key of a full block of token ids, chained with the key of the block before it
    (``b""`` for the first block)."""
    data = previous + b"".join(int(t).to_bytes(8, "little", signed=True) for t in block)
    return hashlib.sha256(data).digest()[:KEY_BYTES]


def block_keys(tokens: TokenIds, block_size: int) -> list[bytes]:
    """The chained keys of the full blocks of ``tokens`` (a last, partial block has none)."""
    positive_int("block_size", block_size)
    keys: list[bytes] = []
    while len(keys) < len(tokens) // block_size:
        keys.append(next_block(tokens, block_size, keys)[2])
    return keys


def next_block(tokens: TokenIds, block_size: int, keys: list[bytes]) -> tuple[bytes, tuple[int, ...], bytes]:
    """The full block after the ``len(keys)`` blocks already keyed: ``(the key before it, its
    tokens, its key)``, one step of the chained walk."""
    i = len(keys)
    content = tuple(tokens[i * block_size:(i + 1) * block_size])
    previous = keys[-1] if keys else b""
    return previous, content, chain_key(previous, content)


class BlockManager:
    """Blocks of ``block_size`` slots: a fixed pool of ids ``0 .. num_blocks - 1``, or, with
    ``num_blocks=None``, a pool that grows whenever a block is needed (then nothing cached is
    ever evicted). With ``prefix_caching=True``, full computed blocks are shared by key.

    Counters: ``hits`` (tokens taken from the cache in total), ``evictions`` (cached blocks
    whose key was dropped to reuse them), ``peak_used`` (most blocks referenced at once).
    """

    def __init__(self, block_size: int, num_blocks: int | None, *, prefix_caching: bool = False) -> None:
        self.block_size = positive_int("block_size", block_size)
        self.num_blocks = optional_positive_int("num_blocks", num_blocks)
        if not isinstance(prefix_caching, bool):
            raise ValueError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        self.prefix_caching = prefix_caching
        size = self.num_blocks or 0
        self._refs: list[int] = [0] * size                 # reference count of each block
        self._free: deque[int] = deque(range(size))         # unreferenced blocks without a key
        self._lru: OrderedDict[int, None] = OrderedDict()   # unreferenced cached blocks, oldest first
        self._by_key: dict[bytes, int] = {}                 # key -> the cached block holding it
        self._key_of: dict[int, bytes] = {}                 # cached block -> its key
        self._content: dict[int, tuple[bytes, tuple[int, ...]]] = {}   # cached block -> (previous key, tokens)
        self._seq_keys: dict[Sequence, list[bytes]] = {}    # keys of each sequence's committed full blocks
        self._used = 0
        self.peak_used = 0
        self.hits = 0
        self.evictions = 0

    # ------------------------------------------------------------------ the pool's state

    @property
    def capacity(self) -> int:
        """Blocks that exist now (``num_blocks`` for a fixed pool)."""
        return len(self._refs)

    @property
    def num_free(self) -> int:
        """Blocks that can be handed out now: never-cached free ones plus evictable cached ones."""
        return len(self._free) + len(self._lru)

    @property
    def free_blocks(self) -> list[int]:
        """The blocks that can be handed out now, in the order they will be: never-cached free
        ones first (in the order they were freed), then cached ones, least recently used first."""
        return list(self._free) + list(self._lru)

    @property
    def num_used(self) -> int:
        """Blocks referenced by at least one sequence."""
        return self._used

    def ref_count(self, block: int) -> int:
        """How many sequences hold ``block``."""
        return self._refs[block]

    def is_cached(self, block: int) -> bool:
        """Whether ``block`` is registered in the prefix cache (it then is never written)."""
        return block in self._key_of

    def key_of(self, block: int) -> bytes | None:
        """The key ``block`` is registered under in the prefix cache, or None."""
        return self._key_of.get(block)

    def blocks_for(self, n_tokens: int) -> int:
        """Blocks needed to hold ``n_tokens`` tokens: ``ceil(n_tokens / block_size)``."""
        return blocks_for(n_tokens, self.block_size)

    # ------------------------------------------------------------------ taking and giving back

    def _take(self) -> int:
        """A block with reference count 1: a never-cached free block, else a new block (growing
        pool), else the least recently used evictable block, whose key is dropped."""
        if self._free:
            block = self._free.popleft()
        elif self.num_blocks is None:
            block = len(self._refs)
            self._refs.append(0)
        elif self._lru:
            block, _ = self._lru.popitem(last=False)
            self._forget(block)
            self.evictions += 1
        else:
            raise RuntimeError("no block left: check num_free before taking blocks")
        self._hold(block)
        return block

    def _hold(self, block: int) -> None:
        """One more reference to ``block``; a cached block nobody held leaves the LRU order."""
        if self._refs[block] == 0:
            self._lru.pop(block, None)
            self._used += 1
            self.peak_used = max(self.peak_used, self._used)
        self._refs[block] += 1

    def _forget(self, block: int) -> None:
        del self._by_key[self._key_of.pop(block)]
        del self._content[block]

    def free(self, seq: Sequence) -> None:
        """Drop ``seq``'s references: its table is cleared and ``num_computed`` set to 0.

        A block nobody holds any more becomes evictable (most recently used) if it is cached,
        else free. The table is walked backwards, so a sequence's last blocks are evicted
        before its first ones, which more prompts share.
        """
        for block in reversed(seq.block_table):
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._used -= 1
                if block in self._key_of:
                    self._lru[block] = None
                else:
                    self._free.append(block)
        seq.block_table.clear()
        seq.num_computed = 0
        self._seq_keys.pop(seq, None)

    # ------------------------------------------------------------------ admission and growth

    def hit_limit(self, seq: Sequence) -> int:
        """The most blocks ``seq`` may take from the cache: ``(num_tokens - 1) // block_size``.
        Its last token is always computed (its logits choose the next token), so the block
        holding it is never taken from the cache, even when it is full and cached: a block
        taken from the cache is never written."""
        return (seq.num_tokens - 1) // self.block_size

    def cached_prefix(self, seq: Sequence) -> tuple[list[int], list[bytes]]:
        """The cached blocks that hold the longest run of ``seq``'s first full blocks (at most
        :meth:`hit_limit`), and their keys; changes nothing."""
        if not self.prefix_caching:
            return [], []
        tokens = seq.tokens
        blocks: list[int] = []
        keys: list[bytes] = []
        for _ in range(self.hit_limit(seq)):
            previous, content, key = next_block(tokens, self.block_size, keys)
            block = self._by_key.get(key)
            if block is None or self._content[block] != (previous, content):   # a digest collision is a miss
                break
            blocks.append(block)
            keys.append(key)
        return blocks, keys

    def allocate(self, seq: Sequence, max_tokens: int | None = None) -> bool:
        """Admit ``seq`` (no blocks, nothing computed): put its cached prefix blocks in its
        table, set ``num_computed`` and ``num_cached`` to the tokens they hold, and reserve
        blocks for its first chunk, ``min(num_uncomputed, max_tokens)`` tokens (``None``: all).

        Returns False, changing nothing, if the pool lacks the blocks.
        """
        if seq.block_table or seq.num_computed:
            raise ValueError(f"request {seq.index} already holds blocks: free it before allocating again")
        if max_tokens is not None:
            non_negative_int("max_tokens", max_tokens)
        hit_blocks, keys = self.cached_prefix(seq)
        cached = len(hit_blocks) * self.block_size
        chunk = seq.num_tokens - cached if max_tokens is None else min(seq.num_tokens - cached, max_tokens)
        revived = sum(1 for block in hit_blocks if self._refs[block] == 0)
        new = self.blocks_for(cached + chunk) - len(hit_blocks)
        if self.num_blocks is not None and revived + new > self.num_free:
            return False
        for block in hit_blocks:
            self._hold(block)
        seq.block_table.extend(hit_blocks)
        seq.num_computed = seq.num_cached = cached
        self.hits += cached
        if self.prefix_caching:
            self._seq_keys[seq] = keys
        return self.reserve(seq, chunk)

    def reserve(self, seq: Sequence, n_new: int) -> bool:
        """Make ``seq``'s table long enough for ``num_computed + n_new`` tokens.

        Returns False, changing nothing, if the pool lacks the blocks.
        """
        non_negative_int("n_new", n_new)
        need = self.blocks_for(seq.num_computed + n_new) - len(seq.block_table)
        if need <= 0:
            return True
        if self.num_blocks is not None and need > self.num_free:
            return False
        seq.block_table.extend(self._take() for _ in range(need))
        return True

    def commit(self, seq: Sequence, upto: int | None = None) -> None:
        """Register in the prefix cache every block of ``seq``'s table that is full once its
        first ``upto`` tokens are computed (default ``num_computed``) and is not registered yet.

        The scheduler calls it with the tokens it has just planned for a newly admitted request
        (as vLLM caches blocks when it allocates them), so that a request admitted after it in
        the same step finds those blocks: the forward pass writes every new key and value of a
        layer into the pool before any request of the step reads that layer
        (:meth:`kvlib.serve.runner.PagedKV.attend`), so a block computed in the step is there
        when the later request reads it. After the pass, ``commit(seq)`` registers the rest.

        A block whose key another block already holds (two sequences computed the same
        tokens at once) stays unregistered: the cache keeps the first, and this one is
        freed as usual.
        """
        if not self.prefix_caching:
            return
        keys = self._seq_keys.setdefault(seq, [])
        full = (seq.num_computed if upto is None else upto) // self.block_size
        if len(keys) >= full:
            return                                           # no block became full
        tokens = seq.tokens
        while len(keys) < full:
            previous, content, key = next_block(tokens, self.block_size, keys)
            block = seq.block_table[len(keys)]
            keys.append(key)
            if key not in self._by_key and block not in self._key_of:
                self._by_key[key] = block
                self._key_of[block] = key
                self._content[block] = (previous, content)

    # ------------------------------------------------------------------ where tokens live

    def slot_table(self, seqs: list[Sequence], lengths: list[int], device: torch.device | str | None = None
                   ) -> torch.Tensor:
        """``(rows, max(lengths))``: the flat slot holding each position ``p < lengths[r]`` of ``seqs[r]``,
        ``block_table[p // block_size] * block_size + p % block_size`` (vLLM's ``slot_mapping``), and slot
        0 past a row's length. IndexError where a block table holds fewer than its row's length."""
        size, longest = self.block_size, max(lengths)
        for seq, n in zip(seqs, lengths):
            if n > len(seq.block_table) * size:
                raise IndexError(f"request {seq.index} has no slot for position {n - 1}: "
                                 f"its {len(seq.block_table)} blocks hold {len(seq.block_table) * size} tokens")
        n_blocks = -(-longest // size)
        tables = torch.tensor([(seq.block_table + [0] * n_blocks)[:n_blocks] for seq in seqs], device=device)
        slots = (tables[:, :, None] * size + torch.arange(size, device=device)).reshape(len(seqs), -1)[:, :longest]
        held = torch.arange(longest, device=device) < torch.tensor(lengths, device=device)[:, None]
        return torch.where(held, slots, 0)                                # (rows, longest)

    def slots(self, seq: Sequence, start: int, stop: int) -> list[int]:
        """The flat slots of positions ``start .. stop - 1`` of ``seq`` (:meth:`slot_table`'s row)."""
        if not 0 <= start < stop:
            raise IndexError(f"request {seq.index}: positions {start} .. {stop - 1} are no range of positions")
        return self.slot_table([seq], [stop])[0, start:].tolist()

    def slot(self, seq: Sequence, position: int) -> int:
        """The flat slot holding token ``position`` of ``seq``:
        ``block_table[position // block_size] * block_size + position % block_size``."""
        if position < 0:
            raise IndexError(f"request {seq.index} has no slot for position {position}")
        return self.slots(seq, position, position + 1)[0]

    def __repr__(self) -> str:
        pool = "growing" if self.num_blocks is None else f"of {self.num_blocks}"
        return (f"BlockManager({self.num_used} blocks used, {self.capacity} {pool}, block_size={self.block_size}, "
                f"{len(self._by_key)} cached, prefix_caching={self.prefix_caching})")
