"""Serving a stream of requests on the real model: static and continuous batching.

A server holds a batch of ``max_batch`` *slots*, one row of the KV cache each. Every step
runs the model once over all slots (one read of the weights for all of them):

- **static** batching fills the slots with waiting requests, runs until the longest of
  them has finished, and only then takes the next batch: a finished request's slot idles;
- **continuous** batching (iteration-level scheduling, as in Orca and vLLM) frees a slot
  at the step where its request finishes and gives it to a waiting request at the next step.

A request joins with its *prefill*, its prompt run through the model into its slot; with
``prefill_chunk=N`` at most ``N`` prompt tokens are prefilled per step, so that running
requests keep receiving tokens while a long prompt goes in. Each slot stores its tokens
from slot 0 on and rotates them by their own positions, so a request computes what it
would alone (up to the rounding of kernels that see another number of rows).

Everything is measured on the wall clock while the real model runs: time to first token,
the time of every token, and a timeline of what every slot did at every step.
"""
from __future__ import annotations

import statistics
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from ..cache.base import KVCache
from ..checks import optional_positive_int, positive_int
from ..generate import sample
from .batch import check_prompts

__all__ = ["Request", "SlotStep", "ServeReport", "Slots", "serve", "POLICIES"]

POLICIES = ("continuous", "static")


@dataclass
class Request:
    """One request: a prompt (token ids), how many tokens to write at most, when it arrives
    (seconds after :func:`serve` starts) and an optional token that ends it early."""

    prompt: Sequence[int]
    max_new_tokens: int
    arrival: float = 0.0
    stop_token: int | None = None


@dataclass
class SlotStep:
    """One step of the server: when it started and how long it took (seconds since the start),
    what each slot did (``"prefill"``, ``"decode"``; ``"waiting"`` for a prompt whose turn
    to be prefilled has not come, ``"done"`` for a finished request still holding its slot,
    ``"idle"`` for an empty slot), which request held it (or ``None``), how many tokens each
    slot holds in the cache after the step, and how many prompt tokens the step prefilled."""

    start: float
    seconds: float
    work: list[str]
    request: list[int | None]
    lengths: list[int]
    prefill_tokens: int


@dataclass
class ServeReport:
    """What :func:`serve` measured. Times are seconds; ``ttft`` and ``latency`` count from each
    request's arrival."""

    policy: str
    max_batch: int
    prefill_chunk: int | None
    outputs: list[list[int]]                 # new ids per request, in request order
    arrival: list[float]
    token_times: list[list[float]]           # when each new token of each request was chosen
    timeline: list[SlotStep] = field(default_factory=list)
    wall: float = 0.0

    @property
    def ttft(self) -> list[float]:
        """Time to first token of each request, from its arrival."""
        return [times[0] - a for times, a in zip(self.token_times, self.arrival)]

    @property
    def latency(self) -> list[float]:
        """Time from each request's arrival to its last token."""
        return [times[-1] - a for times, a in zip(self.token_times, self.arrival)]

    @property
    def inter_token(self) -> list[float]:
        """Every gap between two successive tokens of the same request."""
        return [b - a for times in self.token_times for a, b in zip(times, times[1:])]

    @property
    def tokens_per_s(self) -> float:
        """New tokens of all requests per second of the whole run."""
        return sum(len(o) for o in self.outputs) / self.wall

    @property
    def useful_row_steps(self) -> int:
        """Slot-steps that produced a token of a request (decode) or took in its prompt (prefill)."""
        return sum(w in ("decode", "prefill") for s in self.timeline for w in s.work)

    @property
    def row_steps(self) -> int:
        """All slot-steps: steps × slots."""
        return len(self.timeline) * self.max_batch

    def percentile(self, values: Sequence[float], q: float) -> float:
        """The ``q``-th percentile (0-100) of ``values``, interpolated."""
        return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1] if len(values) > 1 else values[0]


class Slots:
    """The batch's slots: which request each one holds, and how many tokens it has stored."""

    def __init__(self, n: int, device: torch.device) -> None:
        self.request: list[int | None] = [None] * n
        self.lengths = torch.zeros(n, dtype=torch.long, device=device)     # tokens stored in each slot

    def free(self) -> list[int]:
        return [s for s, i in enumerate(self.request) if i is None]

    def admit(self, slot: int, request: int) -> None:
        """Give ``slot`` to ``request``. Its row starts again at slot 0, so the keys and values
        the previous request left there are masked (each query sees only slots up to its own)
        and overwritten as the new request goes in."""
        self.request[slot] = request
        self.lengths[slot] = 0

    def release(self, slot: int) -> None:
        self.request[slot] = None


def _check_requests(model, requests: Sequence[Request]) -> list[Request]:
    if isinstance(requests, Request) or not isinstance(requests, Sequence):
        raise TypeError(f"requests must be a list of kvlib.serve.Request, got {type(requests).__name__}")
    if not requests:
        raise ValueError("no requests: give at least one kvlib.serve.Request")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"request {i} must be a kvlib.serve.Request, got {type(r).__name__}")
        positive_int(f"request {i}: max_new_tokens", r.max_new_tokens)
        if not isinstance(r.arrival, (int, float)) or isinstance(r.arrival, bool) or r.arrival < 0:
            raise ValueError(f"request {i}: arrival must be a number of seconds >= 0, got {r.arrival!r}")
        try:
            check_prompts([r.prompt], model.config.vocab_size, model.config.max_seq_len, r.max_new_tokens, r.stop_token)
        except (TypeError, ValueError) as e:
            raise type(e)(f"request {i}: " + str(e).replace("prompt 0: ", "").replace("prompt 0", "its prompt")) from None
    return list(requests)


@torch.no_grad()
def serve(model: torch.nn.Module, requests: Sequence[Request], *, max_batch: int, policy: str = "continuous",
          prefill_chunk: int | None = None, clock: Callable[[], float] | None = None) -> ServeReport:
    """Serve ``requests`` with ``max_batch`` slots, greedily, and measure it (:class:`ServeReport`).

    ``policy`` is ``"continuous"`` (a slot is refilled at the step after its request ends) or
    ``"static"`` (the next batch starts when every request of the current one has ended).
    ``prefill_chunk=N`` prefills at most ``N`` prompt tokens per step. Requests are taken in
    order of arrival. ``clock`` (seconds, default: the wall clock from the start of the call)
    is for tests that need arrivals to fall on chosen steps.
    """
    positive_int("max_batch", max_batch)
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(map(repr, POLICIES))}")
    optional_positive_int("prefill_chunk", prefill_chunk)
    reqs = _check_requests(model, requests)
    if clock is None:
        t0 = time.perf_counter()
        clock = lambda: time.perf_counter() - t0            # noqa: E731
    device = next(model.parameters()).device
    n = len(reqs)
    prompts = [list(r.prompt) for r in reqs]
    cache = KVCache.for_model(model, batch=max_batch, max_len=max(len(p) + r.max_new_tokens for p, r in zip(prompts, reqs)))
    slots = Slots(max_batch, device)
    slot_of, lengths = slots.request, slots.lengths
    prefilled = [0] * n                                                   # prompt tokens already in the cache
    outputs: list[list[int]] = [[] for _ in range(n)]
    times: list[list[float]] = [[] for _ in range(n)]
    done = [False] * n
    waiting = deque(sorted(range(n), key=lambda i: reqs[i].arrival))
    timeline: list[SlotStep] = []
    start_wall = clock()

    def choose(i: int, logits: torch.Tensor, now: float) -> None:
        token = int(sample(logits))
        outputs[i].append(token)
        times[i].append(now)
        done[i] = token == reqs[i].stop_token or len(outputs[i]) == reqs[i].max_new_tokens

    while not all(done):
        now = clock()
        free = slots.free()
        if policy == "static" and len(free) < max_batch:
            free = []                                   # the current batch runs until all of it is done
        while free and waiting and reqs[waiting[0]].arrival <= now:
            slots.admit(free.pop(0), waiting.popleft())
        if all(i is None for i in slot_of):             # nothing to do until the next request arrives
            while clock() < reqs[waiting[0]].arrival:
                time.sleep(0.0005)
            continue
        step_start = clock()
        work = ["idle" if i is None else ("done" if done[i] else "decode") for i in slot_of]
        budget = prefill_chunk or float("inf")
        taken_total = 0
        finished_prefill = []
        for s, i in enumerate(slot_of):                  # prompts first: the oldest admitted first
            if i is None or done[i] or prefilled[i] == len(prompts[i]):
                continue
            take = int(min(len(prompts[i]) - prefilled[i], budget))
            if take == 0:
                work[s] = "waiting"                      # the step's prefill budget is spent
                continue
            work[s] = "prefill"
            chunk = torch.tensor([prompts[i][prefilled[i]:prefilled[i] + take]], device=device)
            logits = model.run(chunk, int(lengths[s]), cache.rows(s, s + 1), last_only=True)[0, -1]
            prefilled[i] += take
            lengths[s] += take
            budget -= take
            taken_total += take
            if prefilled[i] == len(prompts[i]):
                finished_prefill.append((i, logits))
        decoding = [s for s, i in enumerate(slot_of)
                    if i is not None and not done[i] and prefilled[i] == len(prompts[i]) and outputs[i]]
        if decoding:                                     # one step for every slot: one read of the weights
            last = torch.zeros(max_batch, 1, dtype=torch.long, device=device)
            for s in decoding:
                last[s, 0] = outputs[slot_of[s]][-1]
            logits = model.run(last, lengths, cache, last_only=True)[:, -1]            # (max_batch, vocab)
        now = clock()
        for i, first in finished_prefill:
            choose(i, first, now)
        for s in decoding:
            lengths[s] += 1
            choose(slot_of[s], logits[s], now)
        timeline.append(SlotStep(step_start - start_wall, now - step_start, work, list(slot_of), lengths.tolist(),
                                 taken_total))
        for s, i in enumerate(slot_of):
            if i is not None and done[i] and (policy == "continuous" or all(done[j] for j in slot_of if j is not None)):
                slots.release(s)
    return ServeReport(policy, max_batch, prefill_chunk, outputs, [r.arrival for r in reqs], times, timeline,
                       clock() - start_wall)
