"""What goes into the engine (a :class:`Request`) and what comes out (a :class:`ServeReport`)."""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Sequence

__all__ = ["Request", "ServeStep", "ServeReport"]


@dataclass
class Request:
    """One request: a prompt (token ids), how many tokens to write at most, when it arrives
    (seconds after :meth:`kvlib.serve.Engine.serve` starts) and an optional token that ends it early."""

    prompt: Sequence[int]
    max_new_tokens: int
    arrival: float = 0.0
    stop_token: int | None = None


@dataclass
class ServeStep:
    """One step of the engine, which is one forward pass: when it started and how long it took
    (seconds since the start), what each scheduled request did (``(request, "prefill" or
    "decode", tokens)``), which requests it preempted, which were running (admitted and not
    finished before the step), how many had arrived and were still waiting for admission, and
    how many blocks of the pool were in use after it."""

    start: float
    seconds: float
    work: list[tuple[int, str, int]]
    preempted: list[int]
    running: list[int]
    waiting: int
    blocks_used: int

    @property
    def tokens(self) -> int:
        """Tokens run through the model in this step."""
        return sum(n for _, _, n in self.work)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens run through the model in this step (recomputed ones included)."""
        return sum(n for _, kind, n in self.work if kind == "prefill")


@dataclass
class ServeReport:
    """What :meth:`kvlib.serve.Engine.serve` measured. Times are seconds; ``ttft`` and ``latency``
    count from each request's arrival."""

    policy: str
    max_batch: int
    block_size: int
    prefill_chunk: int | None
    outputs: list[list[int]]                 # new ids per request, in request order
    arrival: list[float]
    token_times: list[list[float]]           # when each new token of each request was chosen
    timeline: list[ServeStep] = field(default_factory=list)
    wall: float = 0.0
    cached_tokens: int = 0                   # prompt tokens taken from the prefix cache
    preemptions: int = 0
    peak_blocks: int = 0
    cached: list[int] = field(default_factory=list)            # per request: its tokens taken from the cache
    block_tables: list[list[int]] = field(default_factory=list)   # per request: its blocks when it finished

    @property
    def steps(self) -> int:
        """Forward passes run."""
        return len(self.timeline)

    @property
    def prefill_tokens(self) -> int:
        """Prompt tokens run through the model (recomputed after a preemption included)."""
        return sum(s.prefill_tokens for s in self.timeline)

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
        """Request-steps that did work (a prefill chunk or a decoded token), over all steps."""
        return sum(len(s.work) for s in self.timeline)

    @property
    def row_steps(self) -> int:
        """What the batch could have held: steps × ``max_batch``."""
        return self.steps * self.max_batch

    @staticmethod
    def percentile(values: Sequence[float], q: float) -> float:
        """The ``q``-th percentile (0-100) of ``values``, interpolated."""
        return statistics.quantiles(values, n=100, method="inclusive")[round(q) - 1] if len(values) > 1 else values[0]
