"""Paged allocation of the KV cache, simulated: how much memory sits reserved but empty.

A server that gives every request one contiguous cache long enough for the longest
allowed answer (``max_len`` tokens) reserves that memory for the request's whole life,
though most requests are far shorter. Paging (vLLM's PagedAttention, Kwon et al., 2023)
instead hands out fixed-size *blocks* of ``block_size`` token slots (the pages of an
operating system's virtual memory) as a request grows, from a shared pool, and records in
a *block table* where each block of each request lives; the blocks of one request need
not be next to each other. A request then wastes at most the unfilled part of its last
block. The allocator itself is the serving engine's :class:`kvlib.serve.BlockManager`;
this module only counts.

Everything here is plain Python on token counts (no tensors): one slot holds the key and
value of one token in every layer, so slots times :func:`kvlib.cache.kv_bytes_per_token`
is bytes.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from typing import Sequence

from ..checks import positive_int

__all__ = ["RequestLengths", "sample_requests", "blocks_for", "Occupancy", "reserved_slots", "occupancy",
           "per_request_occupancy"]


@dataclass(frozen=True)
class RequestLengths:
    """One request: a prompt of ``prompt_len`` tokens and an answer of ``output_len`` tokens."""

    prompt_len: int
    output_len: int

    @property
    def total(self) -> int:
        return self.prompt_len + self.output_len

    def lengths(self) -> range:
        """Tokens held in its cache after each generation step: ``prompt_len + 1 .. total``."""
        return range(self.prompt_len + 1, self.total + 1)


def sample_requests(n: int, *, seed: int = 0, max_len: int = 2048, prompt_median: float = 200.0,
                    output_median: float = 150.0, sigma: float = 1.0) -> list[RequestLengths]:
    """``n`` requests with log-normally spread prompt and answer lengths (many short, a long
    tail, as in chat traffic), seeded, each at least one token of each and at most ``max_len``
    tokens in all."""
    positive_int("n", n)
    if max_len < 2:
        raise ValueError(f"max_len must be at least 2 (one prompt and one answer token), got {max_len}")
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        prompt = min(max(1, round(rng.lognormvariate(math.log(prompt_median), sigma))), max_len - 1)
        answer = min(max(1, round(rng.lognormvariate(math.log(output_median), sigma))), max_len - prompt)
        out.append(RequestLengths(prompt, answer))
    return out


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks needed for ``tokens`` slots: ``ceil(tokens / block_size)``."""
    positive_int("block_size", block_size)
    return -(-tokens // block_size)


def reserved_slots(tokens: int, scheme: str, *, max_len: int = 2048, block_size: int = 16) -> int:
    """Slots a request holding ``tokens`` tokens has reserved: ``max_len`` for a contiguous
    max-length cache, whole blocks for a paged one."""
    if scheme == "contiguous":
        if tokens > max_len:
            raise ValueError(f"{tokens} tokens do not fit a contiguous cache of max_len={max_len}")
        return max_len
    if scheme == "paged":
        return blocks_for(tokens, block_size) * block_size
    raise ValueError(f"scheme must be 'contiguous' or 'paged', got {scheme!r}")


@dataclass(frozen=True)
class Occupancy:
    """Token slots, summed over requests (and over the steps of their lives, for ``over="lifetime"``).

    ``used`` hold a key and value; ``future`` are reserved for tokens the request will
    still write (filled later, empty now); ``never_used`` are reserved and never filled.
    """

    used: int
    future: int
    never_used: int

    @property
    def reserved(self) -> int:
        return self.used + self.future + self.never_used

    @property
    def wasted(self) -> int:
        return self.future + self.never_used

    @property
    def waste_fraction(self) -> float:
        """Share of reserved memory that holds no token: wasted ÷ reserved."""
        return self.wasted / self.reserved if self.reserved else 0.0

    def __add__(self, other: "Occupancy") -> "Occupancy":
        return Occupancy(self.used + other.used, self.future + other.future, self.never_used + other.never_used)


def _at(tokens: int, total: int, scheme: str, max_len: int, block_size: int) -> Occupancy:
    reserved = reserved_slots(tokens, scheme, max_len=max_len, block_size=block_size)
    empty = reserved - tokens
    future = min(empty, total - tokens)          # empty now, filled by this request later
    return Occupancy(tokens, future, empty - future)


def per_request_occupancy(requests: Sequence[RequestLengths], scheme: str, *, max_len: int = 2048,
                          block_size: int = 16, over: str = "lifetime") -> list[Occupancy]:
    """One :class:`Occupancy` per request: at its end (``over="end"``, all tokens written) or
    summed over every step of its life (``over="lifetime"``: what the memory holds while it runs)."""
    out = []
    for r in requests:
        if r.total > max_len:
            raise ValueError(f"a request of {r.total} tokens exceeds max_len={max_len}")
        if over == "end":
            out.append(_at(r.total, r.total, scheme, max_len, block_size))
        elif over == "lifetime":
            occ = Occupancy(0, 0, 0)
            for n in r.lengths():
                occ = occ + _at(n, r.total, scheme, max_len, block_size)
            out.append(occ)
        else:
            raise ValueError(f"over must be 'end' or 'lifetime', got {over!r}")
    return out


def occupancy(requests: Sequence[RequestLengths], scheme: str, *, max_len: int = 2048, block_size: int = 16,
              over: str = "lifetime") -> Occupancy:
    """:func:`per_request_occupancy` summed over all requests."""
    total = Occupancy(0, 0, 0)
    for occ in per_request_occupancy(requests, scheme, max_len=max_len, block_size=block_size, over=over):
        total = total + occ
    return total
