"""kvlib.serve.plan: the scheduler, run against a fake model that only does bookkeeping.

The fake runner gives every fed token a "key/value": a hash of the key/value before it (read
back through the block table), of the token and of its position, as a causal model's depends
on everything before it. The next token is a hash of every key/value the sequence reads back
through its table. So a request's output equals the one it gets alone (:func:`reference`,
no cache at all) only if every slot it reads holds what it should: a block table off by one,
a shared block overwritten, a false prefix hit or a lost recompute all change outputs.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from unittest import mock

import pytest
from hypothesis import Phase, find, given, settings
from hypothesis import strategies as st

from kvlib.serve import block_manager as blocks_module
from kvlib.serve.block_manager import BlockManager
from kvlib.serve.plan import POLICIES, Scheduler, StepPlan, decoding
from kvlib.serve.sequence import Sequence, Status

V = 5                                   # the fake model's vocabulary


def mix(*values: int) -> int:
    return hash(values)                 # deterministic: ints hash to themselves, tuples of ints alike


def reference(prompt: list[int], max_new_tokens: int, stop_token: int | None) -> list[int]:
    """What the fake model writes for one request alone, without a cache."""
    tokens, kv, out = list(prompt), [], []
    while True:
        for p in range(len(kv), len(tokens)):
            kv.append(mix(kv[-1] if p else 0, tokens[p], p))
        out.append(mix(*kv) % V)
        tokens.append(out[-1])
        if len(out) == max_new_tokens or out[-1] == stop_token:
            return out


class FakeRunner:
    """Executes plans on a flat memory of slots, which keeps whatever was last written there.
    With ``guard_writes``, it checks that each slot it writes is in a block the sequence was
    given fresh (not one it took from the cache), shared with others only through the prefix
    cache (a later request admitted in the same step may take a block registered for this
    step's tokens), and that a block already in the cache before the step is never changed."""

    guard_writes = True

    def __init__(self, blocks: BlockManager, scheduler: Scheduler) -> None:
        self.blocks, self.scheduler, self.memory = blocks, scheduler, {}
        self.sealed: dict[int, bytes] = {}            # blocks in the prefix cache when the step began: their keys

    def write(self, seq: Sequence, p: int, token: int) -> None:
        slot = self.blocks.slot(seq, p)
        block, where = slot // self.blocks.block_size, f"request {seq.index} wrote position {p} into"
        previous = self.memory.get(self.blocks.slot(seq, p - 1), -1) if p else 0
        value = mix(previous, token, p)
        if self.guard_writes:
            fresh = seq.block_table[seq.num_cached // self.blocks.block_size:]
            assert block in fresh, f"write: {where} block {block}, not one it was given fresh"
            assert self.blocks.ref_count(block) == 1 or self.blocks.is_cached(block), \
                f"write: {where} block {block}, shared outside the prefix cache"
            # Sealed: cached when the step began and not evicted since. The key object itself is
            # compared (``is``): a block evicted and registered again gets a new key object even
            # where keys collide (test_colliding_keys_...), so equal bytes would not tell.
            sealed = block in self.sealed and self.sealed[block] is self.blocks.key_of(block)
            assert not sealed or self.memory.get(slot) == value, \
                f"write: {where} block {block}, changing a block of the prefix cache"
        self.memory[slot] = value

    def step(self, plan: StepPlan) -> None:
        for seq, n in plan.items:                       # the forward pass
            tokens = seq.tokens
            for p in range(seq.num_computed, seq.num_computed + n):
                self.write(seq, p, tokens[p])
        for seq, n in plan.items:                       # then the bookkeeping
            seq.num_computed += n
            self.blocks.commit(seq)
            if seq.num_computed == seq.num_tokens:
                read = [self.memory.get(s, -1) for s in self.blocks.slots(seq, 0, seq.num_tokens)]
                seq.append(mix(*read) % V)
                if seq.done:
                    self.scheduler.finish(seq)
        self.sealed = {b: self.blocks.key_of(b) for b in range(self.blocks.capacity) if self.blocks.is_cached(b)}


@dataclass
class Workload:
    requests: list[tuple[list[int], int, int | None, int]]      # prompt, max_new_tokens, stop_token, arrival step
    block_size: int
    num_blocks: int | None
    max_batch: int
    policy: str
    prefill_chunk: int | None


@dataclass
class Served:
    outputs: list[list[int]]
    fed: int                            # tokens fed in all
    prefill: int                        # of those, not decodes
    preemptions: int
    hits: int
    evictions: int


@st.composite
def workloads(draw, fixed=st.sampled_from([True, True, False])) -> Workload:
    """A few requests over a 3-token alphabet, some starting with a shared prefix, arriving on
    steps 0-4; a fixed pool from just big enough for the longest request alone (small enough
    to preempt), or a growing one."""
    size = draw(st.integers(1, 4))
    shared = draw(st.lists(st.integers(0, 2), max_size=10))
    requests = []
    for _ in range(draw(st.integers(1, 6))):
        head = shared[:draw(st.integers(0, len(shared)))]
        prompt = head + draw(st.lists(st.integers(0, 2), min_size=0 if head else 1, max_size=6))
        stop = draw(st.sampled_from([None, None, None, 0]))
        requests.append((prompt, draw(st.integers(1, 8)), stop, draw(st.integers(0, 4))))
    need = max(-(-(len(p) + m - 1) // size) for p, m, _, _ in requests)
    num_blocks = draw(st.integers(need, need + 3)) if draw(fixed) else None
    return Workload(requests, size, num_blocks, draw(st.integers(1, 4)), draw(st.sampled_from(POLICIES)),
                    draw(st.none() | st.integers(1, 6)))


def check_plan(w: Workload, sched: Scheduler, plan: StepPlan, before: list[Sequence], step: int) -> None:
    fed = [s for s, _ in plan.items]
    assert len(set(map(id, fed))) == len(fed), "plan: a sequence twice in one plan"
    for s, n in plan.items:
        assert 1 <= n <= s.num_uncomputed, f"plan: request {s.index} feeds {n} of {s.num_uncomputed} tokens"
        assert s.arrival <= step and s.status is Status.RUNNING and s in sched.running, f"plan: request {s.index}"
        assert len(s.block_table) * w.block_size >= s.num_computed + n, f"plan: no slots for request {s.index}"
    assert len(sched.running) <= w.max_batch, "plan: more than max_batch running"
    assert w.prefill_chunk is None or plan.num_prefill_tokens <= w.prefill_chunk, "plan: over the prefill budget"
    for s in before:
        if s not in fed and s not in plan.preempted:    # only a prefill waits, and only for the budget
            assert not decoding(s) and plan.num_prefill_tokens == w.prefill_chunk, f"plan: request {s.index} skipped"
    if w.policy == "static" and any(s not in before for s in fed):
        assert not before, "plan: a static batch admitted while the last one runs"
    for s in plan.preempted:
        assert s.status is Status.WAITING and s in sched.waiting and s not in fed, f"plan: preempted request {s.index}"


def check_pool(w: Workload, blocks: BlockManager, sched: Scheduler) -> None:
    held = Counter(b for s in sched.running for b in s.block_table)
    refs = [blocks.ref_count(b) for b in range(blocks.capacity)]
    assert min(refs, default=0) >= 0 and refs == [held[b] for b in range(blocks.capacity)], "pool: reference counts"
    assert blocks.num_used == len(held) and blocks.num_used + blocks.num_free == blocks.capacity, "pool: counts"
    assert w.num_blocks is None or blocks.capacity == w.num_blocks, "pool: more blocks than the pool has"
    assert w.num_blocks is not None or blocks.evictions == 0, "pool: a growing pool evicted"
    for s in sched.waiting:
        assert not s.block_table and s.num_computed == 0 and s.status is Status.WAITING, f"pool: waiting {s.index}"


def serve(w: Workload, prefix_caching: bool) -> Served:
    blocks = BlockManager(w.block_size, w.num_blocks, prefix_caching=prefix_caching)
    sched = Scheduler(blocks, max_batch=w.max_batch, policy=w.policy, prefill_chunk=w.prefill_chunk)
    seqs = [Sequence(i, p, m, stop_token=s, arrival=a) for i, (p, m, s, a) in enumerate(w.requests)]
    for seq in sorted(seqs, key=lambda s: s.arrival):
        sched.add(seq)
    runner, fed, prefill, step = FakeRunner(blocks, sched), 0, 0, 0
    while sched.has_work():
        assert step < 1000, "plan: no progress"
        before = list(sched.running)
        plan = sched.schedule(now=step)
        check_plan(w, sched, plan, before, step)
        fed, prefill = fed + plan.num_tokens, prefill + plan.num_prefill_tokens
        runner.step(plan)
        check_pool(w, blocks, sched)
        step += 1
    assert all(s.status is Status.FINISHED and not s.block_table for s in seqs), "pool: a request left unfinished"
    return Served([s.output for s in seqs], fed, prefill, sched.num_preemptions, blocks.hits, blocks.evictions)


def failure(w: Workload) -> str | None:
    """The first property ``w`` breaks, served with and without prefix caching, or None."""
    expected = [reference(p, m, s) for p, m, s, _ in w.requests]
    try:
        for caching in (True, False):
            got = serve(w, caching).outputs
            for i, (a, b) in enumerate(zip(got, expected)):
                assert a == b, f"output: request {i} wrote {a}, alone {b} (prefix_caching={caching})"
    except Exception as e:                              # noqa: BLE001 - a crash is a failure too
        return str(e) if isinstance(e, AssertionError) else f"crash: {type(e).__name__}: {e}"
    return None


# ------------------------------------------------------------------ the properties

@settings(max_examples=300, deadline=None)
@given(workloads())
def test_every_request_gets_what_it_gets_alone(w):
    assert failure(w) is None


@settings(max_examples=100, deadline=None)
@given(workloads(fixed=st.just(False)))
def test_a_growing_pool_never_preempts_and_the_cache_saves_exactly_its_hits(w):
    on, off = serve(w, True), serve(w, False)
    assert on.outputs == off.outputs and on.preemptions == off.preemptions == on.evictions == 0
    assert on.fed == off.fed - on.hits


@settings(max_examples=100, deadline=None)
@given(workloads())
def test_colliding_keys_give_misses_never_wrong_blocks(w):
    with mock.patch.object(blocks_module, "chain_key", lambda previous, block: bytes(16)):
        assert failure(w) is None


def test_a_shared_prefix_is_computed_once():
    prefix = [1, 2, 0, 1, 2, 2, 0, 1]                   # two blocks of 4
    w = Workload([(prefix + [i], 3, None, i) for i in range(3)], 4, None, 4, "continuous", None)
    on, off = serve(w, True), serve(w, False)
    assert on.outputs == off.outputs and on.hits == 2 * 8 and on.fed == off.fed - 16 and on.prefill < off.prefill


def test_a_small_pool_preempts_and_recomputes_to_the_same_outputs():
    w = Workload([([1, 2, 0, 1], 8, None, 0), ([2, 2, 1], 8, None, 0), ([0, 1], 8, None, 1)], 2, 6, 3,
                 "continuous", None)
    assert failure(w) is None
    assert serve(w, False).preemptions > 0 and serve(w, True).preemptions > 0


# ------------------------------------------------------------------ the scheduler's rules, one by one

def test_bad_arguments_are_named():
    blocks = BlockManager(4, 8)
    with pytest.raises(ValueError, match="unknown policy 'fifo': use one of 'continuous', 'static'"):
        Scheduler(blocks, max_batch=2, policy="fifo")
    with pytest.raises(ValueError, match="max_batch must be a positive int, got True"):
        Scheduler(blocks, max_batch=True)
    with pytest.raises(ValueError, match="prefill_chunk must be a positive int, got 0"):
        Scheduler(blocks, max_batch=2, prefill_chunk=0)
    with pytest.raises(TypeError, match="blocks must be a kvlib.serve.block_manager.BlockManager"):
        Scheduler(8, max_batch=2)


def test_a_request_that_can_never_fit_is_refused_up_front():
    sched = Scheduler(BlockManager(4, 3), max_batch=2)
    with pytest.raises(ValueError, match="request 2: needs 4 blocks of 4 tokens, the pool has only 3"):
        sched.add(Sequence(2, list(range(10)), 5))      # 10 + 5 - 1 tokens at its longest
    sched.check_fits(Sequence(0, list(range(10)), 3))   # 12 tokens: 3 blocks
    Scheduler(BlockManager(4, None), max_batch=1).check_fits(Sequence(0, list(range(100)), 100))


def run(sched: Scheduler, seqs: list[Sequence], steps: int) -> list[list[tuple[int, int]]]:
    """Plans of ``steps`` steps as ``(request, tokens)`` pairs, executed by the fake runner."""
    for s in seqs:
        sched.add(s)
    runner, plans = FakeRunner(sched.blocks, sched), []
    for step in range(steps):
        plan = sched.schedule(now=step)
        plans.append([(s.index, n) for s, n in plan.items])
        runner.step(plan)
    return plans


def test_static_batching_waits_for_the_whole_batch():
    sched = Scheduler(BlockManager(4, None), max_batch=2, policy="static")
    plans = run(sched, [Sequence(0, [1], 1), Sequence(1, [1, 2], 3), Sequence(2, [2], 1)], 5)
    assert plans == [[(0, 1), (1, 2)], [(1, 1)], [(1, 1)], [(2, 1)], []]


def test_continuous_batching_refills_at_once_and_chunks_prefills():
    sched = Scheduler(BlockManager(4, None), max_batch=2, prefill_chunk=3)
    plans = run(sched, [Sequence(0, [1], 1), Sequence(1, [1, 2], 3), Sequence(2, [2] * 5, 1)], 5)
    assert plans == [[(0, 1), (1, 2)], [(1, 1), (2, 3)], [(1, 1), (2, 2)], [], []]


def test_a_request_waits_for_its_arrival():
    sched = Scheduler(BlockManager(4, 8), max_batch=2)
    sched.add(Sequence(0, [1, 2], 1, arrival=2.5))
    assert sched.schedule(now=2.0).items == [] and sched.has_work()
    assert [n for _, n in sched.schedule(now=2.5).items] == [2]


def test_the_last_admitted_is_preempted_and_goes_first_in_line():
    sched = Scheduler(BlockManager(2, 3), max_batch=3)
    a, b = Sequence(0, [1, 2], 4), Sequence(1, [2, 1], 4)
    assert run(sched, [a, b], 1) == [[(0, 2), (1, 2)]]
    waiting = Sequence(2, [1], 1)
    sched.add(waiting)
    plan = sched.schedule(now=1)                        # a takes the last block: b, last admitted, must go
    assert [(s.index, n) for s, n in plan.items] == [(0, 1)] and plan.preempted == [b]
    assert list(sched.waiting) == [b, waiting] and b.num_computed == 0 and b.output != []


def test_planning_refuses_a_sequence_whose_next_token_was_not_appended():
    sched = Scheduler(BlockManager(2, 4), max_batch=1)
    s = Sequence(0, [1, 2], 2)
    sched.add(s)
    plan = sched.schedule(now=0)
    s.num_computed += plan.items[0][1]                  # no token appended
    with pytest.raises(RuntimeError, match="request 0 runs with every token computed"):
        sched.schedule(now=1)


# ------------------------------------------------------------------ the properties can fail

def unchained_keys(monkeypatch) -> None:
    """Keys that name a block's own tokens only, not what comes before."""
    key = blocks_module.chain_key
    monkeypatch.setattr(blocks_module, "chain_key", lambda previous, block: key(b"", block))


def table_off_by_one(monkeypatch) -> None:
    """The block index off by one, ``block_table[position // block_size - 1]``: Python's index
    -1 makes the first block's tokens land in whichever block is last, without an error."""
    def slot(self, seq, position):
        return seq.block_table[position // self.block_size - 1] * self.block_size + position % self.block_size
    monkeypatch.setattr(BlockManager, "slot", slot)


def hits_cover_the_last_token(monkeypatch) -> None:
    """Hits up to ``num_tokens // block_size`` blocks; a prompt all in cached blocks recomputes
    its last token in place, inside the cached block."""
    allocate = BlockManager.allocate

    def allocate_in_place(self, seq, max_tokens=None):
        ok = allocate(self, seq, max_tokens)
        if ok and seq.num_computed == seq.num_tokens:
            seq.num_computed -= 1
        return ok
    monkeypatch.setattr(BlockManager, "hit_limit", lambda self, seq: seq.num_tokens // self.block_size)
    monkeypatch.setattr(BlockManager, "allocate", allocate_in_place)


def resumed_without_recompute(monkeypatch) -> None:
    """A preempted sequence, admitted again, gets fresh blocks but keeps its ``num_computed``:
    its keys and values are taken to be still there."""
    kept: dict[Sequence, int] = {}
    preempt, allocate = Scheduler._preempt, BlockManager.allocate

    def preempt_keeping(self, seq, plan):
        kept[seq] = seq.num_computed
        preempt(self, seq, plan)

    def allocate_kept(self, seq, max_tokens=None):
        if not kept.get(seq):
            return allocate(self, seq, max_tokens)
        if not self.reserve(seq, seq.num_tokens):
            return False
        seq.num_computed = kept.pop(seq)
        return True
    monkeypatch.setattr(Scheduler, "_preempt", preempt_keeping)
    monkeypatch.setattr(BlockManager, "allocate", allocate_kept)


# Each variant, whether the fake runner guards its writes, the property that catches it (text
# of its failure message), and the smallest counterexample hypothesis's shrinker found for it.
BROKEN = [
    (unchained_keys, False, "output:",
     Workload([([0, 1, 0], 1, None, 1), ([0, 0, 0], 2, None, 0)], 1, 4, 1, "continuous", None)),
    (table_off_by_one, False, "output:",
     Workload([([0], 1, None, 0), ([0, 0], 1, None, 0)], 1, None, 1, "continuous", None)),
    (hits_cover_the_last_token, True, ", not one it was given fresh",
     Workload([([0], 1, None, 0)] * 3, 1, 1, 2, "continuous", None)),
    (resumed_without_recompute, False, "output:",
     Workload([([0], 3, None, 0), ([0], 3, None, 0)] + [([0], 1, None, 0)] * 4, 1, 3, 2, "continuous", None)),
]


@pytest.mark.parametrize("broken, guard_writes, caught_by, smallest", BROKEN, ids=[b[0].__name__ for b in BROKEN])
def test_the_properties_catch_a_broken_variant(monkeypatch, broken, guard_writes, caught_by, smallest):
    monkeypatch.setattr(FakeRunner, "guard_writes", guard_writes)
    assert failure(smallest) is None                    # the real code serves it right
    broken(monkeypatch)
    assert caught_by in failure(smallest)
    found = find(workloads(), lambda w: caught_by in (failure(w) or ""),
                 settings=settings(max_examples=1000, phases=[Phase.generate], derandomize=True, database=None,
                                   deadline=None))
    assert caught_by in failure(found)
