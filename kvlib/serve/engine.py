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

from ..checks import positive_int
from ..generate import Sampler, check_prompt
from .block_manager import BlockManager
from .compiled import compiled_pass
from .plan import Scheduler, StepPlan
from .report import Request, ServeReport, ServeStep
from .runner import PagedAttention, ModelRunner
from .sequence import Sequence

__all__ = ["Engine", "serve", "check_requests"]


def check_requests(model: torch.nn.Module, requests: Seq[Request], *, first: int = 0) -> list[Request]:
    """The requests as a list, or a ``TypeError``/``ValueError`` naming the request at fault by its
    index (counted from ``first``)."""
    if isinstance(requests, Request) or not isinstance(requests, Seq):
        raise TypeError(f"requests must be a list of kvlib.serve.Request, got {type(requests).__name__}")
    if not requests:
        raise ValueError("no requests: give at least one kvlib.serve.Request")
    for i, r in enumerate(requests, start=first):
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
    that starts with the same tokens (across calls too). ``compile=True``: each step's forward
    pass runs compiled, attention left as one operator (:mod:`kvlib.serve.compiled`, as vLLM
    compiles its model; the first step compiles, or loads what an earlier process compiled).
    ``paged_attention``: a paged-attention kernel that reads each token's keys from the pool in
    place (see :class:`~kvlib.serve.runner.PagedKV`; vLLM's attention backend), such as
    :func:`kvlib.fast.paged_attention`; ``None``: the keys gathered, PyTorch's attention.
    Bad values raise a ``ValueError`` from the part that takes them (the block manager, the scheduler).

    As nano-vllm's engine: :meth:`add` queues a request, :meth:`step` runs one step (schedule,
    one forward pass, postprocess), :meth:`serve` adds a stream and steps it to the end.
    """

    def __init__(self, model: torch.nn.Module, *, max_batch: int, block_size: int = 16, num_blocks: int | None = None,
                 policy: str = "continuous", prefill_chunk: int | None = None, prefix_caching: bool = False,
                 compile: bool = False, paged_attention: PagedAttention | None = None) -> None:
        self.model = model
        self.blocks = BlockManager(block_size, num_blocks, prefix_caching=prefix_caching)
        self.scheduler = Scheduler(self.blocks, max_batch=max_batch, policy=policy, prefill_chunk=prefill_chunk)
        self.runner = ModelRunner(model, self.blocks, compiled_pass(model) if compile else None, paged_attention)
        self.sampler = Sampler()

    @property
    def max_batch(self) -> int:
        return self.scheduler.max_batch

    @property
    def policy(self) -> str:
        return self.scheduler.policy

    @property
    def prefill_chunk(self) -> int | None:
        return self.scheduler.prefill_chunk

    def add(self, request: Request, index: int = 0) -> Sequence:
        """Queue ``request`` (checked as :func:`check_requests` does); ``index`` names it in errors and reports."""
        (r,) = check_requests(self.model, [request], first=index)
        seq = Sequence(index, list(r.prompt), r.max_new_tokens, r.stop_token, float(r.arrival))
        self.scheduler.add(seq)
        return seq

    @torch.no_grad()
    def step(self, now: float = float("inf")) -> tuple[StepPlan, list[Sequence]] | None:
        """One step at time ``now`` (requests that arrive later wait): the scheduler plans it, the
        runner does its one forward pass, each request that reached its end chooses a token
        (:attr:`sampler`), and the scheduler's postprocess does the rest. Returns the plan and the
        requests that took a token, or ``None`` when nothing could run."""
        plan = self.scheduler.schedule(now)
        if not plan.items:
            return None
        logits = self.runner.step(plan)                      # item index -> (vocab,)
        rows = torch.stack(list(logits.values())) if logits else None     # (choosing, vocab): one call
        chosen = dict(zip(logits, self.sampler(rows).tolist())) if logits else {}
        return plan, self.scheduler.postprocess(plan, chosen)

    def serve(self, requests: Seq[Request], *, clock: Callable[[], float] | None = None, temperature: float = 0.0,
              top_k: int | None = None, generator: torch.Generator | None = None,
              progress: bool = False) -> ServeReport:
        """Serve ``requests`` (taken in order of arrival) to the end, and measure it.

        ``clock`` (seconds; default the wall clock from the start of the call) tells when
        requests arrive: tests and notebooks pass one that counts steps, so that arrivals fall
        on chosen steps whatever the machine's speed. Tokens are chosen by :func:`kvlib.sample`
        (greedy by default). ``progress=True`` shows a bar of tokens written.
        """
        sampler = Sampler(temperature, top_k, generator)         # (checks them)
        reqs = check_requests(self.model, requests)
        if clock is None:
            t0 = time.perf_counter()
            clock = lambda: time.perf_counter() - t0            # noqa: E731
        self.sampler = sampler
        order = sorted(range(len(reqs)), key=lambda i: reqs[i].arrival)
        seqs = dict(sorted((i, self.add(reqs[i], i)) for i in order))
        record = _Record(self, list(seqs.values()), clock, progress)
        while self.scheduler.has_work():
            step_start = clock()
            done = self.step(step_start)
            if done is None:                                   # nothing to run until the next request arrives
                record.wait()
                continue
            record.add(*done, step_start)
        return record.report()


class _Record:
    """What one call of :meth:`Engine.serve` records beside its steps, for its :class:`ServeReport`."""

    def __init__(self, engine: Engine, seqs: list[Sequence], clock: Callable[[], float], progress: bool) -> None:
        self.engine, self.seqs, self.clock = engine, seqs, clock
        self.times: list[list[float]] = [[] for _ in seqs]
        self.timeline: list[ServeStep] = []
        self.hits_before, self.peak = engine.blocks.hits, engine.blocks.num_used
        self.preemptions_before = engine.scheduler.num_preemptions
        self.start = clock()
        self.bar = None
        if progress:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=sum(s.max_new_tokens for s in seqs), desc="serving", unit="tok")

    def wait(self) -> None:
        scheduler = self.engine.scheduler
        if scheduler.running or not scheduler.waiting:
            raise RuntimeError(f"the scheduler planned nothing with requests running: {scheduler!r}")
        arrival = scheduler.waiting[0].arrival
        while self.clock() < arrival:
            time.sleep(0.0005)

    def add(self, plan: StepPlan, took: list[Sequence], step_start: float) -> None:
        """One step: when each request took its token, the pool's peak, and the step's line of the timeline."""
        now, blocks = self.clock(), self.engine.blocks
        for seq in took:
            self.times[seq.index].append(now)
        if self.bar is not None:
            self.bar.update(len(took))
        self.peak = max(self.peak, blocks.num_used)
        work = [(seq.index, kind, n) for (seq, n), kind in zip(plan.items, plan.kinds)]
        running = [seq.index for seq in plan.running]
        arrived = sum(s.arrival <= now for s in self.engine.scheduler.waiting)
        self.timeline.append(ServeStep(step_start - self.start, now - step_start, work,
                                       [s.index for s in plan.preempted], running, arrived, blocks.num_used))

    def report(self) -> ServeReport:
        if self.bar is not None:
            self.bar.close()
        e, seqs = self.engine, self.seqs
        return ServeReport(e.policy, e.max_batch, e.blocks.block_size, e.prefill_chunk, [list(s.output) for s in seqs],
                           [s.arrival for s in seqs], self.times, self.timeline, self.clock() - self.start,
                           cached_tokens=e.blocks.hits - self.hits_before,
                           preemptions=e.scheduler.num_preemptions - self.preemptions_before, peak_blocks=self.peak,
                           cached=[s.num_cached for s in seqs], block_tables=[list(s.final_blocks) for s in seqs])


def serve(model: torch.nn.Module, requests: Seq[Request], *, max_batch: int, block_size: int = 16,
          num_blocks: int | None = None, policy: str = "continuous", prefill_chunk: int | None = None,
          prefix_caching: bool = False, compile: bool = False, paged_attention: PagedAttention | None = None,
          clock: Callable[[], float] | None = None, temperature: float = 0.0, top_k: int | None = None,
          generator: torch.Generator | None = None, progress: bool = False) -> ServeReport:
    """``Engine(model, ...).serve(requests, ...)``: one call on a fresh engine (see :class:`Engine`
    and :meth:`Engine.serve`, sampling included)."""
    engine = Engine(model, max_batch=max_batch, block_size=block_size, num_blocks=num_blocks, policy=policy,
                    prefill_chunk=prefill_chunk, prefix_caching=prefix_caching, compile=compile,
                    paged_attention=paged_attention)
    return engine.serve(requests, clock=clock, temperature=temperature, top_k=top_k, generator=generator,
                        progress=progress)
