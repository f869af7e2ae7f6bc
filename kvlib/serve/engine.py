"""A small serving engine (after nano-vllm and vLLM): paged KV blocks, a scheduler that plans,
a runner that does one forward pass per step.

Each step, the :class:`~kvlib.serve.plan.Scheduler` plans which requests feed how many tokens
(admitting waiting requests while blocks and batch slots last, chunking prompts, preempting
when the pool runs out); the :class:`~kvlib.serve.runner.ModelRunner` runs them all in one
forward pass over the paged pool; each request whose tokens reached its end chooses its next
token. The engine keeps its pool (and, with ``prefix_caching=True``, the blocks it has cached)
from one call of :meth:`Engine.serve` to the next.
"""
from __future__ import annotations

import time
from typing import Callable, Sequence as Seq

import torch

from ..checks import optional_positive_int, positive_int
from ..clock import Stopwatch
from ..generate import check_prompt, check_sampling, sample
from .blocks import BlockManager
from .plan import POLICIES, Scheduler, StepPlan
from .report import Request, ServeReport, ServeStep
from .runner import ModelRunner
from .sequence import Sequence

__all__ = ["Engine", "serve", "check_requests"]


def check_requests(model: torch.nn.Module, requests: Seq[Request]) -> list[Request]:
    """The requests as a list, or a ``TypeError``/``ValueError`` naming the request at fault by index."""
    if isinstance(requests, Request) or not isinstance(requests, Seq):
        raise TypeError(f"requests must be a list of kvlib.serve.Request, got {type(requests).__name__}")
    if not requests:
        raise ValueError("no requests: give at least one kvlib.serve.Request")
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise TypeError(f"request {i} must be a kvlib.serve.Request, got {type(r).__name__}")
        positive_int(f"request {i}: max_new_tokens", r.max_new_tokens)
        if not isinstance(r.arrival, (int, float)) or isinstance(r.arrival, bool) or r.arrival < 0:
            raise ValueError(f"request {i}: arrival must be a number of seconds >= 0, got {r.arrival!r}")
        check_prompt(f"request {i}", r.prompt, model.config.vocab_size, model.config.max_seq_len, r.max_new_tokens,
                     r.stop_token)
    return list(requests)


class Engine:
    """Serves :class:`Request` streams on ``model`` with at most ``max_batch`` running requests.

    ``block_size``: token slots per block of the KV pool. ``num_blocks=None``: the pool grows as
    needed and nothing cached is evicted; ``num_blocks=N``: a fixed pool of ``N`` blocks (a
    request waits for free blocks, running ones are preempted and recomputed when it runs
    out, cached blocks nobody uses are evicted least-recently-used first). ``policy``:
    ``"continuous"`` (a finished request's place is refilled at the next step) or ``"static"``
    (the next batch starts when every request of the current one has finished).
    ``prefill_chunk=N``: at most ``N`` prompt tokens per step. ``prefix_caching=True``: full
    blocks are kept under a key chained from their tokens and reused by any later request
    that starts with the same tokens (across calls too).
    """

    def __init__(self, model: torch.nn.Module, *, max_batch: int, block_size: int = 16, num_blocks: int | None = None,
                 policy: str = "continuous", prefill_chunk: int | None = None, prefix_caching: bool = False) -> None:
        positive_int("max_batch", max_batch)
        positive_int("block_size", block_size)
        optional_positive_int("num_blocks", num_blocks)
        optional_positive_int("prefill_chunk", prefill_chunk)
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(map(repr, POLICIES))}")
        if not isinstance(prefix_caching, bool):
            raise TypeError(f"prefix_caching must be True or False, got {prefix_caching!r}")
        self.model, self.max_batch, self.policy, self.prefill_chunk = model, max_batch, policy, prefill_chunk
        self.blocks = BlockManager(block_size, num_blocks, prefix_caching=prefix_caching)
        self.runner = ModelRunner(model, self.blocks)

    @torch.no_grad()
    def serve(self, requests: Seq[Request], *, clock: Callable[[], float] | None = None, temperature: float = 0.0,
              top_k: int | None = None, generator: torch.Generator | None = None,
              progress: bool = False) -> ServeReport:
        """Serve ``requests`` (taken in order of arrival) to the end, and measure it.

        ``clock`` (seconds; default the wall clock from the start of the call) tells when
        requests arrive: tests and notebooks pass one that counts steps, so that arrivals fall
        on chosen steps whatever the machine's speed. Tokens are chosen by :func:`kvlib.sample`
        (greedy by default). ``progress=True`` shows a bar of tokens written.
        """
        check_sampling(temperature, top_k)
        reqs = check_requests(self.model, requests)
        if clock is None:
            t0 = time.perf_counter()
            clock = lambda: time.perf_counter() - t0            # noqa: E731
        scheduler = Scheduler(self.blocks, max_batch=self.max_batch, policy=self.policy,
                              prefill_chunk=self.prefill_chunk)
        seqs = [Sequence(i, list(r.prompt), r.max_new_tokens, r.stop_token, float(r.arrival))
                for i, r in enumerate(reqs)]
        for seq in sorted(seqs, key=lambda s: s.arrival):
            scheduler.add(seq)
        run = _Run(self, scheduler, seqs, clock, lambda logits: int(sample(logits, temperature, top_k, generator)))
        return run.to_end(progress)


class _Run:
    """One call of :meth:`Engine.serve`: the loop of steps and what it records."""

    def __init__(self, engine: Engine, scheduler: Scheduler, seqs: list[Sequence], clock: Callable[[], float],
                 choose: Callable[[torch.Tensor], int]) -> None:
        self.engine, self.scheduler, self.seqs, self.clock, self.choose = engine, scheduler, seqs, clock, choose
        self.times: list[list[float]] = [[] for _ in seqs]
        self.timeline: list[ServeStep] = []
        self.hits_before = engine.blocks.hits
        self.peak = engine.blocks.num_used
        self.tables: list[list[int]] = [[] for _ in seqs]

    def to_end(self, progress: bool) -> ServeReport:
        bar = None
        if progress:
            from tqdm.auto import tqdm
            bar = tqdm(total=sum(s.max_new_tokens for s in self.seqs), desc="serving", unit="tok")
        start = self.clock()
        while self.scheduler.has_work():
            plan = self.scheduler.schedule(self.clock())
            if not plan.items:                             # nothing to run until the next request arrives
                self.wait(plan)
                continue
            self.step(plan, start, bar)
        if bar is not None:
            bar.close()
        e = self.engine
        return ServeReport(e.policy, e.max_batch, e.blocks.block_size, e.prefill_chunk,
                           [list(s.output) for s in self.seqs], [s.arrival for s in self.seqs], self.times,
                           self.timeline, self.clock() - start, cached_tokens=e.blocks.hits - self.hits_before,
                           preemptions=self.scheduler.num_preemptions, peak_blocks=self.peak,
                           cached=[s.num_cached for s in self.seqs], block_tables=self.tables)

    def wait(self, plan: StepPlan) -> None:
        if plan.preempted or self.scheduler.running or not self.scheduler.waiting:
            raise RuntimeError(f"the scheduler planned nothing with requests running: {self.scheduler!r}")
        arrival = self.scheduler.waiting[0].arrival
        while self.clock() < arrival:
            time.sleep(0.0005)

    def step(self, plan: StepPlan, start: float, bar) -> None:
        """Run one planned forward pass, then let each request that reached its end choose a token."""
        blocks, device = self.engine.blocks, self.engine.runner.kv.k.device
        running = [s.index for s in self.scheduler.running]
        step_start = self.clock()
        with Stopwatch(device):
            logits = self.engine.runner.step(plan.items)
        now = self.clock()
        work = []
        for i, (seq, n) in enumerate(plan.items):
            decoding = n == 1 and bool(seq.output) and seq.num_uncomputed == 1     # its last sampled token
            work.append((seq.index, "decode" if decoding else "prefill", n))
            seq.num_computed += n
            blocks.commit(seq)
            if i in logits:
                seq.append(self.choose(logits[i]))
                self.times[seq.index].append(now)
                if bar is not None:
                    bar.update()
                if seq.done:
                    self.tables[seq.index] = list(seq.block_table)
                    self.scheduler.finish(seq)
        self.peak = max(self.peak, blocks.num_used)
        arrived = sum(s.arrival <= now for s in self.scheduler.waiting)
        self.timeline.append(ServeStep(step_start - start, now - step_start, work, [s.index for s in plan.preempted],
                                       running, arrived, blocks.num_used))


def serve(model: torch.nn.Module, requests: Seq[Request], *, max_batch: int, block_size: int = 16,
          num_blocks: int | None = None, policy: str = "continuous", prefill_chunk: int | None = None,
          prefix_caching: bool = False, clock: Callable[[], float] | None = None, progress: bool = False) -> ServeReport:
    """``Engine(model, ...).serve(requests)``: one call on a fresh engine (see :class:`Engine`)."""
    engine = Engine(model, max_batch=max_batch, block_size=block_size, num_blocks=num_blocks, policy=policy,
                    prefill_chunk=prefill_chunk, prefix_caching=prefix_caching)
    return engine.serve(requests, clock=clock, progress=progress)
