"""The engine (kvlib.serve.Engine) on tiny models: every request's tokens equal its solo greedy
tokens, whatever the arrivals, lengths, block sizes, budgets, pool sizes and policies; prefix
caching on equals off; paged attention equals contiguous attention; and each of these checks
fails on a deliberately broken copy of the engine."""
from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvlib
from kvlib.serve import BlockManager, Engine, Request, serve
from kvlib.serve.runner import ModelRunner, PagedKV, gather

from tiny_models import tiny_model

PROFILE = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def step_clock():
    """A clock that advances one second per call: arrivals then fall on chosen steps."""
    counter = itertools.count()
    return lambda: float(next(counter))


def solo(model, requests):
    return [kvlib.generate(model, r.prompt, r.max_new_tokens, stop_token=r.stop_token) for r in requests]


@st.composite
def workloads(draw, vocab=64, max_prompt=20, max_new=12, max_requests=6):
    n = draw(st.integers(1, max_requests))
    shared = draw(st.lists(st.integers(0, vocab - 1), min_size=0, max_size=10))      # a common prefix, sometimes
    requests = []
    for _ in range(n):
        own = draw(st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_prompt))
        prompt = (shared + own) if draw(st.booleans()) else own
        requests.append(Request(prompt[:max_prompt + 10], draw(st.integers(1, max_new)),
                                arrival=float(draw(st.integers(0, 12)))))
    return requests


def engine_kwargs(draw, requests):
    block_size = draw(st.sampled_from([1, 2, 3, 4, 16]))
    need = max(-(-(len(r.prompt) + r.max_new_tokens) // block_size) for r in requests)
    num_blocks = draw(st.sampled_from([None, need, need + 1, 2 * need, 4 * need]))
    return dict(max_batch=draw(st.integers(1, 4)), block_size=block_size, num_blocks=num_blocks,
                policy=draw(st.sampled_from(["continuous", "static"])),
                prefill_chunk=draw(st.sampled_from([None, 1, 3, 8])), prefix_caching=draw(st.booleans()))


@PROFILE
@given(data=st.data())
def test_every_request_gets_its_solo_tokens(data):
    model = tiny_model(torch.float64)
    requests = data.draw(workloads())
    kwargs = engine_kwargs(data.draw, requests)
    report = serve(model, requests, clock=step_clock(), **kwargs)
    assert report.outputs == solo(model, requests), kwargs
    assert report.peak_blocks <= (kwargs["num_blocks"] or float("inf"))
    assert all(len(s.work) <= kwargs["max_batch"] for s in report.timeline)


def test_a_small_pool_preempts_and_still_gets_the_solo_tokens():
    model = tiny_model(torch.float64)
    g = torch.Generator().manual_seed(3)
    requests = [Request(torch.randint(0, 64, (n,), generator=g).tolist(), 12) for n in (9, 7, 11, 5)]
    report = serve(model, requests, max_batch=4, block_size=2, num_blocks=12)
    assert report.preemptions > 0 and report.peak_blocks <= 12
    assert report.outputs == solo(model, requests)
    assert any(s.preempted for s in report.timeline)


def test_prefix_caching_on_equals_off_and_computes_less():
    model = tiny_model(torch.float64)
    system = list(range(1, 40))
    requests = [Request(system + [50 + i, 51, 52], 6) for i in range(5)]
    off = serve(model, requests, max_batch=2, block_size=8)
    on = serve(model, requests, max_batch=2, block_size=8, prefix_caching=True)
    assert on.outputs == off.outputs == solo(model, requests)
    assert on.cached_tokens > 0 and on.prefill_tokens == off.prefill_tokens - on.cached_tokens


def test_requests_admitted_together_share_the_prefix_their_step_computes():
    """As vLLM does: a request admitted after another in the same step takes the blocks that
    step computes for the first (the pass writes a layer's keys and values before any request
    reads them), so a shared prompt is computed once, not once per request."""
    model = tiny_model(torch.float64)
    system = list(range(1, 34))                                   # 33 tokens: 8 full blocks of 4
    requests = [Request(system + [40 + i], 5) for i in range(4)]
    report = serve(model, requests, max_batch=4, block_size=4, prefix_caching=True)
    assert report.outputs == solo(model, requests)
    assert report.cached == [0, 32, 32, 32] and report.timeline[0].prefill_tokens == 34 + 3 * 2


def test_the_engine_keeps_its_cache_across_calls():
    """A second turn of a conversation reuses the blocks the first filled, its answer's included."""
    model = tiny_model(torch.float64)
    engine = Engine(model, max_batch=2, block_size=4, prefix_caching=True)
    first = Request(list(range(1, 23)), 10)
    answer = engine.serve([first]).outputs[0]
    second = Request(first.prompt + answer + [7, 8, 9], 5)
    report = engine.serve([second])
    assert report.cached_tokens == (len(first.prompt) + len(answer) - 1) // 4 * 4
    assert report.outputs == solo(model, [second])


def test_one_forward_pass_per_step_over_running_requests_only(monkeypatch):
    model = tiny_model(torch.float32)
    calls = []
    original = kvlib.Decoder.run

    def spy(self, ids, *args, **kwargs):
        calls.append(tuple(ids.shape))
        return original(self, ids, *args, **kwargs)

    monkeypatch.setattr(kvlib.Decoder, "run", spy)
    requests = [Request([1, 2, 3], 2), Request([4, 5, 6, 7, 8], 9)]
    report = serve(model, requests, max_batch=4)
    assert len(calls) == report.steps
    assert [c[1] for c in calls] == [s.tokens for s in report.timeline]       # no idle row, no padding
    assert calls[-1] == (1, 1)                                               # one request left: one token


@pytest.mark.parametrize("kwargs, message", [
    (dict(max_batch=0), "max_batch must be a positive int"),
    (dict(max_batch=2, block_size=0), "block_size must be a positive int"),
    (dict(max_batch=2, num_blocks=0), "num_blocks must be a positive int"),
    (dict(max_batch=2, policy="fifo"), "unknown policy 'fifo'"),
    (dict(max_batch=2, prefill_chunk=0), "prefill_chunk must be a positive int"),
])
def test_the_engine_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Engine(tiny_model(torch.float32), **kwargs)


@pytest.mark.parametrize("requests, error, message", [
    ([Request([], 3)], ValueError, "request 0 is empty"),
    ([Request([1], 3), Request([1, 64], 3)], ValueError, "request 1 holds token id 64"),
    ([Request([1], 0)], ValueError, "request 0: max_new_tokens must be a positive int"),
    ([Request([1], 3, arrival=-1.0)], ValueError, "request 0: arrival"),
    ([Request([1], 3, stop_token=99)], ValueError, "stop_token must be a token id"),
    ([Request(list(range(1, 60)), 20)], ValueError, "request 0: needs 5 blocks of 16 tokens, the pool has only 4"),
    (Request([1], 3), TypeError, "requests must be a list"),
    ([[1, 2]], TypeError, "request 0 must be a kvlib.serve.Request"),
])
def test_serve_names_the_request_at_fault(requests, error, message):
    engine = Engine(tiny_model(torch.float32), max_batch=2, num_blocks=4)
    with pytest.raises(error, match=message):
        engine.serve(requests)


# ------------------------------------------------------------------ paged attention

def test_paged_attention_equals_contiguous_attention():
    """Keys written through scattered block tables and read back by gather are the same tensor."""
    g = torch.Generator().manual_seed(0)
    kv = PagedKV(n_layers=1, n_kv_heads=2, head_dim=4, block_size=3, num_blocks=10, dtype=torch.float64,
                 device=torch.device("cpu"))
    keys = torch.randn(7, 2, 4, generator=g, dtype=torch.float64)                 # 7 tokens of one sequence
    table = [8, 2, 5]                                                            # blocks, out of order
    slots = torch.tensor([table[p // 3] * 3 + p % 3 for p in range(7)])
    kv.k[0][slots] = keys
    torch.testing.assert_close(gather(kv.k[0], slots[None])[0], keys.transpose(0, 1), rtol=0, atol=0)


def test_one_table_stacks_the_steps_groups_for_one_kernel_call():
    """The decoding group (two requests) and a prefilling one (a chunk of three tokens) as one table:
    every token keeps its own request's slots and its number of keys; padding lies past them."""
    from kvlib.serve.runner import Group, one_table

    z = torch.zeros(1, dtype=torch.long)
    def group(context, row, keys, first):
        return Group(z, z, torch.tensor(context), z, z, z, z, first, torch.tensor(row), torch.tensor(keys))

    decode = group([[1, 2, 3], [4, 5, 6]], [0, 1], [3, 2], 0)
    prefill = group([[7, 8, 9, 10, 11]], [0, 0, 0], [3, 4, 5], 2)
    table = one_table([decode, prefill])
    assert table.context.tolist() == [[1, 2, 3, 0, 0], [4, 5, 6, 0, 0], [7, 8, 9, 10, 11]]
    assert table.query_row.tolist() == [0, 1, 2, 2, 2] and table.query_keys.tolist() == [3, 2, 3, 4, 5]
    assert table.first == 0 and one_table([prefill]) is prefill
    for g in (decode, prefill):                    # each token reads its own keys, and only those
        for j, (r, n) in enumerate(zip(g.query_row.tolist(), g.query_keys.tolist())):
            t = g.first + j
            assert table.context[table.query_row[t], :n].tolist() == g.context[r, :n].tolist()
            assert table.query_keys[t] == n


@PROFILE
@given(data=st.data())
def test_paged_logits_equal_contiguous_logits(data):
    """The engine's forward pass over blocks gives the logits of the model over a plain cache."""
    model = tiny_model(torch.float64)
    prompt = data.draw(st.lists(st.integers(0, 63), min_size=1, max_size=30))
    block_size = data.draw(st.sampled_from([1, 2, 5, 16]))
    engine = Engine(model, max_batch=1, block_size=block_size)
    gen = kvlib.generate(model, prompt, 4, keep_logits=True)
    from kvlib.serve.plan import StepPlan
    from kvlib.serve.sequence import Sequence

    seq, plan = Sequence(0, prompt, 4), StepPlan()
    assert engine.blocks.allocate(seq)
    plan.add(seq, len(prompt), "prefill")
    logits = engine.runner.step(plan)[0]
    torch.testing.assert_close(logits.float(), gen.logits[0], rtol=1e-9, atol=1e-9)


# ------------------------------------------------------------------ broken copies

def _some_request_differs(model, requests, **kwargs) -> bool:
    try:
        return serve(model, requests, clock=step_clock(), **kwargs).outputs != solo(model, requests)
    except (RuntimeError, IndexError, ValueError):
        return True


BROKEN_CASES = [
    ([Request(list(range(1, 12)), 8), Request(list(range(20, 31)), 8)], dict(max_batch=2, block_size=4)),
    ([Request([3, 1, 4, 1, 5, 9, 2, 6], 10), Request([3, 1, 4, 1, 5, 9, 2, 6, 5, 3], 10)],
     dict(max_batch=2, block_size=2, prefix_caching=True)),
]


def test_a_block_table_off_by_one_is_caught(monkeypatch):
    model = tiny_model(torch.float64)
    right = BlockManager.slot_table
    # position p's slot in block_table[p // block_size - 1]: each row's slots shifted by one block
    monkeypatch.setattr(BlockManager, "slot_table",
                        lambda self, seqs, lengths, device=None: right(self, seqs, lengths, device).roll(
                            self.block_size, dims=1))
    assert any(_some_request_differs(model, reqs, **kw) for reqs, kw in BROKEN_CASES)


def test_keys_that_do_not_chain_are_caught(monkeypatch):
    """Keys of a block's tokens alone (and its predecessor's) give false hits: the second request's
    block [3, 3, 3, 3] after [1, 1, 1, 1] would take the first request's block of those tokens at
    positions 12-15, whose keys were rotated for other positions and saw other tokens."""
    from kvlib.serve import block_manager as blocks

    model = tiny_model(torch.float64)
    first = [1] * 4 + [2] * 4 + [1] * 4 + [3] * 4 + [5]
    requests = [Request(first, 6), Request([1] * 4 + [3] * 4 + [5, 6], 6, arrival=30.0)]
    assert not _some_request_differs(model, requests, max_batch=1, block_size=4, prefix_caching=True)
    monkeypatch.setattr(blocks, "chain_key", lambda previous, block: blocks.hashlib.sha256(
        bytes(str(list(block)), "utf8")).digest()[:blocks.KEY_BYTES])
    assert _some_request_differs(model, requests, max_batch=1, block_size=4, prefix_caching=True)


def shared_writes(monkeypatch) -> list[int]:
    """Spy on the runner: the requests that write a slot of a block another request also holds."""
    seen: list[int] = []
    original = ModelRunner.step

    def spy(self, plan):
        for seq, n in plan.items:
            slots = self.blocks.slots(seq, seq.num_computed, seq.num_computed + n)
            seen.extend(seq.index for slot in slots if self.blocks.ref_count(slot // self.blocks.block_size) > 1)
        return original(self, plan)
    monkeypatch.setattr(ModelRunner, "step", spy)
    return seen


def test_a_written_shared_block_is_caught(monkeypatch):
    """A request that takes the block of its last token from the cache must compute that token
    again, and so writes into a block another request holds: the spy sees it."""
    model = tiny_model(torch.float64)
    prompt = [5, 6, 7, 8, 1, 2, 3, 4]
    requests = [Request(prompt + [9], 12), Request(prompt, 5, arrival=3.0)]
    seen = shared_writes(monkeypatch)
    serve(model, requests, max_batch=2, block_size=4, prefix_caching=True, clock=step_clock())
    assert seen == []                                                     # intact: shared blocks are only read
    original = BlockManager.allocate

    def allocate_the_last_block_too(self, seq, max_tokens=None):
        ok = original(self, seq, max_tokens)
        if ok and seq.num_computed == seq.num_tokens:                     # every token from the cache:
            seq.num_computed -= 1                                         # compute the last one again, in place
        return ok
    monkeypatch.setattr(BlockManager, "hit_limit", lambda self, seq: seq.num_tokens // self.block_size)
    monkeypatch.setattr(BlockManager, "allocate", allocate_the_last_block_too)
    serve(model, requests, max_batch=2, block_size=4, prefix_caching=True, clock=step_clock())
    assert 1 in seen


def test_a_preempted_request_resumed_without_recomputing_is_caught(monkeypatch):
    from kvlib.serve import plan

    original = plan.Scheduler._preempt

    def keep_computed(self, seq, step):
        computed = seq.num_computed
        original(self, seq, step)
        seq.num_computed = computed                   # the bug: its blocks are gone, its count is not
    monkeypatch.setattr(plan.Scheduler, "_preempt", keep_computed)
    model = tiny_model(torch.float64)
    g = torch.Generator().manual_seed(3)
    requests = [Request(torch.randint(0, 64, (n,), generator=g).tolist(), 12) for n in (9, 7, 11, 5)]
    assert _some_request_differs(model, requests, max_batch=4, block_size=2, num_blocks=12)


def test_serve_passes_its_sampling_on_to_the_engine():
    """The one-call serve() samples as Engine.serve does (it once dropped temperature, top_k and
    the generator, and sampled greedily)."""
    model = tiny_model(torch.float64)
    requests = [Request([1, 2, 3], 8), Request([4, 5], 8)]
    kwargs = dict(temperature=1.0, top_k=20)
    one = serve(model, requests, max_batch=2, generator=torch.Generator().manual_seed(5), **kwargs)
    engine = Engine(model, max_batch=2).serve(requests, generator=torch.Generator().manual_seed(5), **kwargs)
    assert one.outputs == engine.outputs
    assert one.outputs != serve(model, requests, max_batch=2).outputs           # not greedy


def test_the_runner_groups_requests_as_the_plan_calls_them(monkeypatch):
    """A one-token prompt is a prefill in the plan (it has sampled nothing yet), and the runner puts
    it with the prefills, not with the decodes, which it once did by a rule of its own; the
    decoding requests come first. Either way, the tokens are plain decoding's."""
    model = tiny_model(torch.float64)
    kinds_by_group: list[list[str]] = []
    original = ModelRunner.layout

    def spy(self, plan):
        layout = original(self, plan)
        decode = [k for k in plan.kinds if k == "decode"]
        kinds_by_group.append([len(decode), [len(g.query_row) for g in layout[0].groups]])
        return layout
    monkeypatch.setattr(ModelRunner, "layout", spy)
    requests = [Request([5, 6, 7], 6), Request([9], 3, arrival=3.0)]
    run = serve(model, requests, max_batch=2, block_size=4, clock=step_clock())
    assert run.outputs == [kvlib.generate(model, r.prompt, r.max_new_tokens) for r in requests]
    mixed = [k for k in kinds_by_group if len(k[1]) == 2]            # a step with a decode and a prefill group
    assert mixed and all(groups[0] == decodes for decodes, groups in mixed)
