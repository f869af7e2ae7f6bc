"""Planning each forward pass of the serving engine (after nano-vllm's and vLLM v1's schedulers).

The :class:`Scheduler` keeps two queues: ``waiting`` (requests not admitted yet, in order of
arrival, and preempted ones, put back at the front) and ``running`` (admitted requests, in
the order they were admitted). Each call of :meth:`Scheduler.schedule` plans one forward
pass, a :class:`StepPlan`: which sequences feed how many tokens.

1. A running sequence that is *decoding* (one uncomputed token) feeds that token.
2. A running sequence still *prefilling* feeds as many of its uncomputed tokens as the
   step's prefill budget (``prefill_chunk`` tokens in all; ``None``: no limit) leaves; when
   the budget is spent it waits for the next step.
3. Waiting requests that have arrived are admitted, oldest first, while fewer than
   ``max_batch`` run and the budget lasts: their cached prefix is taken from the cache and
   their first chunk is fed. Admission never takes blocks from running sequences: when the
   pool is short, admission waits, and a step that had to preempt admits nobody (as in
   vLLM v1). With ``policy="static"`` a new batch is admitted only once every request of
   the current one has finished.

A sequence is *decoding* when it feeds the one token it sampled at the last step (it has
output, and that token is its only uncomputed one): outside the prefill budget. Every other
feed is a *prefill* (prompt tokens, or output tokens recomputed after a preemption) and counts
against the budget. That is the one classification of a feed (:attr:`StepPlan.kinds`); the
engine's report uses it too.

After the forward pass, :meth:`Scheduler.postprocess` does everything that follows from it, in
one place (as nano-vllm's does): the fed tokens count as computed, full blocks are committed
(cached), each sequence whose tokens reached its end takes its next token, and one that is
then done finishes and frees its blocks.

When a running sequence needs a block and none is left, the most recently admitted running
sequence is *preempted*: its blocks are freed and it goes back to the front of ``waiting``,
to be recomputed from its first token when it is admitted again.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from ..checks import optional_positive_int, positive_int
from .block_manager import BlockManager
from .sequence import Sequence, Status

__all__ = ["POLICIES", "StepPlan", "Scheduler", "decoding"]

POLICIES = ("continuous", "static")


@dataclass
class StepPlan:
    """One forward pass: ``items`` lists ``(sequence, n)``, each sequence feeding
    ``tokens[num_computed : num_computed + n]`` with ``n >= 1`` (running sequences first, in
    admission order, then the newly admitted ones); ``preempted`` lists the sequences
    preempted while planning; ``num_prefill_tokens`` counts the tokens fed by sequences
    that are not decoding (more than one uncomputed token when planned): prompt tokens, and
    output tokens recomputed after a preemption."""

    items: list[tuple[Sequence, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    kinds: list[str] = field(default_factory=list)      # per item: "decode" or "prefill"
    running: list[Sequence] = field(default_factory=list)   # the running sequences when it was planned

    def add(self, seq: Sequence, n: int, kind: str) -> None:
        self.items.append((seq, n))
        self.kinds.append(kind)

    @property
    def num_tokens(self) -> int:
        """All tokens fed in this pass."""
        return sum(n for _, n in self.items)

    @property
    def num_prefill_tokens(self) -> int:
        """Tokens fed by sequences that are not decoding."""
        return sum(n for (_, n), kind in zip(self.items, self.kinds) if kind == "prefill")


def decoding(seq: Sequence) -> bool:
    """Whether ``seq``'s next feed is a decode: the one token it sampled, its only uncomputed token."""
    return bool(seq.output) and seq.num_uncomputed == 1


def _chunk(seq: Sequence, budget: int | None) -> int:
    """Tokens ``seq`` may feed in a prefill: its uncomputed tokens, at most ``budget`` of them."""
    return seq.num_uncomputed if budget is None else min(seq.num_uncomputed, budget)


def _charge(kind: str, n: int, budget: int | None) -> int | None:
    """The prefill budget left after a feed of ``n`` tokens: a prefill counts, a decode is free."""
    return budget if kind == "decode" or budget is None else budget - n


class Scheduler:
    """Plans the forward passes of a batch of at most ``max_batch`` running sequences whose
    keys and values live in ``blocks``. ``policy`` is ``"continuous"`` or ``"static"``;
    ``prefill_chunk`` caps the prefill tokens of one pass (``None``: no cap).

    Guarantees of every plan: no sequence feeds 0 tokens or more than it has uncomputed;
    at most ``max_batch`` sequences run; a waiting request is admitted only once it has
    arrived; a fixed pool never hands out more blocks than it has. Progress: if no sequence
    runs and the oldest waiting request has arrived, the plan admits it (every request
    added fits the pool alone, see :meth:`check_fits`).
    """

    def __init__(self, blocks: BlockManager, *, max_batch: int, policy: str = "continuous",
                 prefill_chunk: int | None = None) -> None:
        if not isinstance(blocks, BlockManager):
            raise TypeError(f"blocks must be a kvlib.serve.block_manager.BlockManager, got {type(blocks).__name__}")
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}: use one of {', '.join(map(repr, POLICIES))}")
        self.blocks = blocks
        self.max_batch = positive_int("max_batch", max_batch)
        self.policy = policy
        self.prefill_chunk = optional_positive_int("prefill_chunk", prefill_chunk)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions = 0

    def check_fits(self, seq: Sequence) -> None:
        """Raise ``ValueError`` if ``seq`` could never run: at its longest (its prompt and all
        but its last answer token, which is sampled, never fed) it needs more blocks than a
        fixed pool has."""
        if self.blocks.num_blocks is None:
            return
        need = self.blocks.blocks_for(len(seq.prompt) + seq.max_new_tokens - 1)
        if need > self.blocks.num_blocks:
            raise ValueError(f"request {seq.index}: needs {need} blocks of {self.blocks.block_size} tokens, "
                             f"the pool has only {self.blocks.num_blocks}")

    def add(self, seq: Sequence) -> None:
        """Queue a new request, in order of arrival; raises as :meth:`check_fits` does if it can never run."""
        if seq.status is not Status.WAITING or seq.block_table or seq.num_computed:
            raise ValueError(f"request {seq.index} is not a new request: {seq!r}")
        self.check_fits(seq)
        self.waiting.append(seq)

    def has_work(self) -> bool:
        """Some request is waiting or running."""
        return bool(self.waiting or self.running)

    def schedule(self, now: float) -> StepPlan:
        """Plan one forward pass at time ``now`` (requests with ``arrival <= now`` have arrived)."""
        plan = StepPlan()
        budget = self._plan_running(plan, self.prefill_chunk)
        if not plan.preempted:                         # memory is short: admit nobody this step
            self._admit(now, plan, budget)
        plan.running = list(self.running)
        return plan

    def postprocess(self, plan: StepPlan, chosen: dict[int, int]) -> list[Sequence]:
        """After the forward pass of ``plan``: every fed sequence's tokens count as computed and its
        full blocks are committed; each whose tokens reached its end takes its next token,
        ``chosen[i]`` for item ``i``; one that is then done finishes. Returns the sequences that
        took a token, in the plan's order."""
        took = []
        for i, (seq, n) in enumerate(plan.items):
            seq.num_computed += n
            self.blocks.commit(seq)
            if i in chosen:
                seq.append(chosen[i])
                took.append(seq)
                if seq.done:
                    self.finish(seq)
        return took

    def finish(self, seq: Sequence) -> None:
        """``seq`` is done: it leaves ``running`` and its blocks are freed (its table is kept in
        ``seq.final_blocks``, for the report)."""
        if seq not in self.running:
            raise ValueError(f"request {seq.index} is not running: {seq!r}")
        self.running.remove(seq)
        seq.final_blocks = list(seq.block_table)
        self.blocks.free(seq)
        seq.status = Status.FINISHED

    # ------------------------------------------------------------------ the three rules

    def _plan_running(self, plan: StepPlan, budget: int | None) -> int | None:
        """Rules 1 and 2: give each running sequence its decode token or a prefill chunk;
        returns the prefill budget left."""
        i = 0
        while i < len(self.running):
            seq = self.running[i]
            if seq.num_uncomputed < 1:
                raise RuntimeError(f"request {seq.index} runs with every token computed: "
                                   f"append its next token (or finish it) before planning the next step")
            kind = "decode" if decoding(seq) else "prefill"
            n = 1 if kind == "decode" else _chunk(seq, budget)     # a decode, or a prefill chunk
            if n == 0:                                 # the budget is spent: this prefill waits
                i += 1
                continue
            if not self._reserve_or_preempt(seq, n, plan):
                break                                  # it was the last one, and is now preempted
            plan.add(seq, n, kind)
            budget = _charge(kind, n, budget)
            i += 1
        return budget

    def _reserve_or_preempt(self, seq: Sequence, n: int, plan: StepPlan) -> bool:
        """Reserve blocks for ``n`` more tokens of ``seq``, preempting the most recently
        admitted running sequences until they fit; False if ``seq`` itself was preempted."""
        while not self.blocks.reserve(seq, n):
            victim = self.running[-1]
            self._preempt(victim, plan)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence, plan: StepPlan) -> None:
        """Free ``seq``'s blocks and put it back at the front of ``waiting``: it will be
        recomputed from its first token (``num_computed = 0``)."""
        self.running.remove(seq)
        self.blocks.free(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        plan.preempted.append(seq)
        self.num_preemptions += 1

    def _admit(self, now: float, plan: StepPlan, budget: int | None) -> None:
        """Rule 3: admit arrived waiting requests, oldest first, while there is room."""
        if self.policy == "static" and self.running:
            return                                     # the current batch runs until all of it is done
        while self.waiting and len(self.running) < self.max_batch:
            seq = self.waiting[0]
            if seq.arrival > now:
                break
            if budget == 0 and self.policy == "continuous":
                break
            if not self.blocks.allocate(seq, budget):
                break                                  # the pool is short: admission waits
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            n = _chunk(seq, budget)                    # what allocate reserved blocks for
            if n:                                      # (0 in a static batch admitted beyond the budget)
                plan.add(seq, n, "prefill")
                budget = _charge("prefill", n, budget)
                self.blocks.commit(seq, seq.num_computed + n)    # the next admitted request may share them

    def __repr__(self) -> str:
        return (f"Scheduler({self.policy}, max_batch={self.max_batch}, prefill_chunk={self.prefill_chunk}, "
                f"{len(self.running)} running, {len(self.waiting)} waiting, {self.num_preemptions} preemptions)")
