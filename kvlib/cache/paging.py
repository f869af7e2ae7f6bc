"""Paged allocation of the KV cache, simulated: how much memory sits reserved but empty.

A server that gives every request one contiguous cache long enough for the longest
allowed answer (``max_len`` tokens) reserves that memory for the request's whole life,
though most requests are far shorter. Paging (vLLM's PagedAttention, Kwon et al., 2023)
instead hands out fixed-size pages of ``page_size`` token slots as a request grows, from
a shared pool, and records in a *page table* where each page of each request lives; the
pages of one request need not be next to each other. A request then wastes at most the
unfilled part of its last page.

Everything here is plain Python on token counts (no tensors): one slot holds the key and
value of one token in every layer, so slots times :func:`kvlib.cache.kv_bytes_per_token`
is bytes.
"""
from __future__ import annotations

import math
import random
from collections import deque
from dataclasses import dataclass
from typing import Iterable, Sequence

from ..checks import positive_int

__all__ = ["RequestLengths", "sample_requests", "pages_for", "Occupancy", "reserved_slots", "occupancy",
           "per_request_occupancy", "PagePool"]


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


def pages_for(tokens: int, page_size: int) -> int:
    """Pages needed for ``tokens`` slots: ``ceil(tokens / page_size)``."""
    positive_int("page_size", page_size)
    return -(-tokens // page_size)


def reserved_slots(tokens: int, scheme: str, *, max_len: int = 2048, page_size: int = 16) -> int:
    """Slots a request holding ``tokens`` tokens has reserved: ``max_len`` for a contiguous
    max-length cache, whole pages for a paged one."""
    if scheme == "contiguous":
        if tokens > max_len:
            raise ValueError(f"{tokens} tokens do not fit a contiguous cache of max_len={max_len}")
        return max_len
    if scheme == "paged":
        return pages_for(tokens, page_size) * page_size
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


def _at(tokens: int, total: int, scheme: str, max_len: int, page_size: int) -> Occupancy:
    reserved = reserved_slots(tokens, scheme, max_len=max_len, page_size=page_size)
    empty = reserved - tokens
    future = min(empty, total - tokens)          # empty now, filled by this request later
    return Occupancy(tokens, future, empty - future)


def per_request_occupancy(requests: Sequence[RequestLengths], scheme: str, *, max_len: int = 2048,
                          page_size: int = 16, over: str = "lifetime") -> list[Occupancy]:
    """One :class:`Occupancy` per request: at its end (``over="end"``, all tokens written) or
    summed over every step of its life (``over="lifetime"``: what the memory holds while it runs)."""
    out = []
    for r in requests:
        if r.total > max_len:
            raise ValueError(f"a request of {r.total} tokens exceeds max_len={max_len}")
        if over == "end":
            out.append(_at(r.total, r.total, scheme, max_len, page_size))
        elif over == "lifetime":
            occ = Occupancy(0, 0, 0)
            for n in r.lengths():
                occ = occ + _at(n, r.total, scheme, max_len, page_size)
            out.append(occ)
        else:
            raise ValueError(f"over must be 'end' or 'lifetime', got {over!r}")
    return out


def occupancy(requests: Sequence[RequestLengths], scheme: str, *, max_len: int = 2048, page_size: int = 16,
              over: str = "lifetime") -> Occupancy:
    """:func:`per_request_occupancy` summed over all requests."""
    total = Occupancy(0, 0, 0)
    for occ in per_request_occupancy(requests, scheme, max_len=max_len, page_size=page_size, over=over):
        total = total + occ
    return total


class PagePool:
    """A pool of ``n_pages`` pages of ``page_size`` token slots, and a page table per request.

    ``append(request, n)`` records ``n`` more tokens of a request and takes a free page
    whenever its last page is full; ``release(request)`` gives its pages back. Pages are
    handed out in the order they were freed, so a request's pages end up scattered.
    """

    def __init__(self, n_pages: int, page_size: int = 16) -> None:
        self.n_pages, self.page_size = positive_int("n_pages", n_pages), positive_int("page_size", page_size)
        self.free: deque[int] = deque(range(n_pages))
        self.tables: dict[object, list[int]] = {}
        self.lengths: dict[object, int] = {}

    def append(self, request, n_tokens: int = 1) -> list[int]:
        """Record ``n_tokens`` more tokens of ``request``; return the pages it newly took."""
        length = self.lengths.get(request, 0) + n_tokens
        table = self.tables.setdefault(request, [])
        need = pages_for(length, self.page_size) - len(table)
        if need > len(self.free):
            raise MemoryError(f"the pool is full: request {request!r} needs {need} more page(s), "
                              f"{len(self.free)} free of {self.n_pages}")
        new = [self.free.popleft() for _ in range(need)]
        table.extend(new)
        self.lengths[request] = length
        return new

    def release(self, request) -> None:
        """The request is done: its pages go back to the pool."""
        self.free.extend(self.tables.pop(request, []))
        self.lengths.pop(request, None)

    def where(self, request, position: int) -> tuple[int, int]:
        """``(page, slot in the page)`` holding token ``position`` of ``request``."""
        if not 0 <= position < self.lengths.get(request, 0):
            raise IndexError(f"request {request!r} holds no token at position {position}")
        return self.tables[request][position // self.page_size], position % self.page_size

    @property
    def used_pages(self) -> int:
        return self.n_pages - len(self.free)

    def occupancy(self) -> Occupancy:
        """Slots in use now and slots reserved but empty (the last pages' slack)."""
        used = sum(self.lengths.values())
        return Occupancy(used, 0, self.used_pages * self.page_size - used)

    def __repr__(self) -> str:
        return (f"PagePool({self.used_pages} of {self.n_pages} pages of {self.page_size} slots in use, "
                f"{len(self.tables)} requests)")
