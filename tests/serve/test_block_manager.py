"""kvlib.serve.block_manager: the block pool, its reference counts and the prefix cache, without a model."""
from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.serve import block_manager as blocks_module
from kvlib.serve.block_manager import KEY_BYTES, BlockManager, block_keys, chain_key
from kvlib.serve.sequence import Sequence, Status


def seq(prompt, index=0, max_new_tokens=4, **kw) -> Sequence:
    return Sequence(index, list(prompt), max_new_tokens, **kw)


def computed(blocks: BlockManager, s: Sequence, n: int | None = None) -> Sequence:
    """Pretend a forward pass computed ``n`` more tokens of ``s`` (all of them by default)."""
    n = s.num_uncomputed if n is None else n
    assert blocks.reserve(s, n)
    s.num_computed += n
    blocks.commit(s)
    return s


def admitted(blocks: BlockManager, prompt, index=0) -> Sequence:
    s = seq(prompt, index)
    assert blocks.allocate(s)
    return computed(blocks, s)


# ------------------------------------------------------------------ arguments and sequences

@pytest.mark.parametrize("args, name", [((0, 4), "block_size"), ((True, 4), "block_size"), ((2.5, 4), "block_size"),
                                        ((4, 0), "num_blocks"), ((4, True), "num_blocks"), ((4, -1), "num_blocks")])
def test_bad_counts_are_named(args, name):
    with pytest.raises(ValueError, match=f"{name} must be a positive int"):
        BlockManager(*args)


def test_prefix_caching_must_be_a_bool():
    with pytest.raises(ValueError, match="prefix_caching must be True or False"):
        BlockManager(4, 4, prefix_caching="yes")


def test_a_sequence_checks_its_request_and_finishes_when_done():
    with pytest.raises(ValueError, match="request 3: prompt must be a non-empty list"):
        Sequence(3, [], 2)
    with pytest.raises(ValueError, match="request 1: max_new_tokens must be a positive int"):
        Sequence(1, [1], 0)
    s = Sequence(0, [5, 6], 3, stop_token=9)
    s.append(1)
    assert s.tokens == [5, 6, 1] and s.num_tokens == 3 and not s.done and s.status is Status.WAITING
    s.append(9)
    assert s.done and s.status is Status.FINISHED
    with pytest.raises(ValueError, match="already done"):
        s.append(2)
    t = Sequence(1, [5], 1)
    t.append(9)
    assert t.done and t.output == [9]


# ------------------------------------------------------------------ keys and slots

def test_keys_chain_over_the_blocks_before():
    keys = block_keys([1, 2, 3, 4, 5], 2)
    assert len(keys) == 2 and all(len(k) == KEY_BYTES for k in keys)           # the partial block has no key
    assert keys[0] == chain_key(b"", [1, 2]) and keys[1] == chain_key(keys[0], [3, 4])
    other = block_keys([9, 9, 3, 4], 2)
    assert other[1] != keys[1]                                                  # same tokens, other prefix
    assert block_keys([1, 2, 3, 4, 7, 7], 2)[:2] == keys                        # a prefix's keys are a prefix


def test_slot_is_block_times_size_plus_offset():
    blocks = BlockManager(4, 8)
    s = seq(range(6))
    s.block_table[:] = [3, 0]
    assert blocks.slot(s, 0) == 12 and blocks.slot(s, 3) == 15 and blocks.slot(s, 5) == 1
    assert blocks.slots(s, 2, 6) == [14, 15, 0, 1]
    for bad in (-1, 8):
        with pytest.raises(IndexError, match="request 0 has no slot for position"):
            blocks.slot(s, bad)
    t = seq(range(3))
    t.block_table[:] = [5]
    table = blocks.slot_table([s, t], [6, 3])                          # rows padded with slot 0
    assert table.tolist() == [[12, 13, 14, 15, 0, 1], [20, 21, 22, 0, 0, 0]]


@given(st.integers(1, 5), st.lists(st.lists(st.integers(0, 15), min_size=1, max_size=4), min_size=1, max_size=4),
       st.data())
def test_slot_table_agrees_with_the_formula_position_by_position(size, tables, data):
    blocks = BlockManager(size, 16)
    seqs = [seq(range(len(t) * size)) for t in tables]
    for s, t in zip(seqs, tables):
        s.block_table[:] = t
    lengths = [data.draw(st.integers(1, len(t) * size)) for t in tables]
    got = blocks.slot_table(seqs, lengths)
    for r, (t, n) in enumerate(zip(tables, lengths)):
        want = [t[p // size] * size + p % size for p in range(n)]
        assert got[r, :n].tolist() == want and (got[r, n:] == 0).all()


# ------------------------------------------------------------------ allocation without caching

def test_allocate_reserves_the_first_chunk_and_reserve_grows_the_table():
    blocks = BlockManager(2, 4)
    s = seq(range(5))
    assert blocks.allocate(s, max_tokens=3) and s.block_table == [0, 1] and s.num_computed == 0
    assert blocks.num_used == 2 and blocks.num_free == 2
    assert not blocks.reserve(s, 9) and s.block_table == [0, 1]                 # 3 blocks more: refused, unchanged
    assert blocks.reserve(s, 5) and s.block_table == [0, 1, 2]
    blocks.free(s)
    assert s.block_table == [] and s.num_computed == 0 and blocks.num_free == 4 and blocks.peak_used == 3


def test_allocate_refuses_when_short_and_changes_nothing():
    blocks = BlockManager(2, 3)
    a = seq(range(5))
    assert blocks.allocate(a)
    b = seq(range(4), index=1)
    assert not blocks.allocate(b) and b.block_table == [] and blocks.num_used == 3
    with pytest.raises(ValueError, match="request 0 already holds blocks"):
        blocks.allocate(a)


def test_a_growing_pool_hands_out_new_ids_and_reuses_freed_ones():
    blocks = BlockManager(2, None)
    a, b = seq(range(3)), seq(range(5), index=1)
    assert blocks.allocate(a) and blocks.allocate(b)
    assert a.block_table == [0, 1] and b.block_table == [2, 3, 4] and blocks.capacity == 5
    blocks.free(a)
    c = seq(range(2), index=2)
    assert blocks.allocate(c) and c.block_table == [1] and blocks.capacity == 5   # freed backwards: 1 first


# ------------------------------------------------------------------ prefix caching

def test_a_shared_prefix_is_taken_from_the_cache_and_shared():
    blocks = BlockManager(2, 8, prefix_caching=True)
    a = admitted(blocks, [1, 2, 3, 4, 5])
    assert [blocks.is_cached(b) for b in a.block_table] == [True, True, False]  # only full blocks
    b = seq([1, 2, 3, 4, 9], index=1)
    assert blocks.allocate(b)
    assert b.block_table[:2] == a.block_table[:2] and b.block_table[2] != a.block_table[2]
    assert b.num_computed == b.num_cached == 4 and blocks.hits == 4
    assert [blocks.ref_count(x) for x in b.block_table] == [2, 2, 1]


def test_the_last_token_is_always_computed():
    blocks = BlockManager(2, 8, prefix_caching=True)
    admitted(blocks, [1, 2, 3, 4, 5])
    same = seq([1, 2, 3, 4], index=1)                  # two full cached blocks: only the first is a hit
    assert blocks.allocate(same) and same.num_computed == 2 and same.num_uncomputed == 2
    assert not blocks.is_cached(same.block_table[1])   # its last block is a fresh one, written by it alone


def test_the_same_tokens_after_another_prefix_are_a_miss():
    blocks = BlockManager(2, 8, prefix_caching=True)
    admitted(blocks, [1, 2, 3, 4, 5])
    b = seq([9, 9, 3, 4, 5], index=1)
    assert blocks.allocate(b) and b.num_computed == 0 and blocks.hits == 0


def test_a_block_computed_twice_is_cached_once():
    blocks = BlockManager(2, 8, prefix_caching=True)
    a, b = seq([1, 2, 3], index=0), seq([1, 2, 3], index=1)
    assert blocks.allocate(a) and blocks.allocate(b)    # admitted together: nothing cached yet
    computed(blocks, a), computed(blocks, b)
    assert blocks.is_cached(a.block_table[0]) and not blocks.is_cached(b.block_table[0])
    blocks.free(b)
    assert blocks.num_free == 8 - 2                     # b's blocks went back free, not evictable
    blocks.free(a)
    c = seq([1, 2, 7], index=2)
    assert blocks.allocate(c) and c.block_table[0] == 0 and blocks.hits == 2   # a's first block


def test_a_digest_collision_is_a_miss_never_a_wrong_block(monkeypatch):
    monkeypatch.setattr(blocks_module, "chain_key", lambda previous, block: bytes(KEY_BYTES))  # all collide
    blocks = BlockManager(2, 8, prefix_caching=True)
    admitted(blocks, [1, 2, 3, 4, 5])
    other = seq([3, 4, 3, 4, 5], index=1)
    assert blocks.allocate(other) and other.num_computed == 0
    same = seq([1, 2, 9], index=2)
    assert blocks.allocate(same) and same.num_computed == 2


def test_eviction_takes_free_blocks_first_then_the_least_recently_used():
    blocks = BlockManager(1, 4, prefix_caching=True)
    a, b, c = (admitted(blocks, [t], index=i) for i, t in enumerate([10, 20, 30]))
    assert [x.block_table for x in (a, b, c)] == [[0], [1], [2]]
    for x in (a, b, c):
        blocks.free(x)                                  # evictable, oldest first: 0, 1, 2; block 3 is free
    d = seq([40, 41], index=3)
    assert blocks.allocate(d) and d.block_table == [3, 0] and blocks.evictions == 1
    assert blocks.cached_prefix(seq([10, 5])) == ([], [])       # a's block was evicted
    hit = seq([20, 5], index=4)
    assert blocks.allocate(hit) and hit.block_table == [1, 2] and hit.num_cached == 1
    assert blocks.evictions == 2 and not blocks.is_cached(2)    # c's block went next


def test_a_hit_revives_an_evictable_block_and_makes_it_recent():
    blocks = BlockManager(1, 3, prefix_caching=True)
    a, b = admitted(blocks, [10], index=0), admitted(blocks, [20], index=1)
    blocks.free(a), blocks.free(b)                      # evictable, oldest first: 0, 1; block 2 is free
    revived = seq([10, 5], index=2)
    assert blocks.allocate(revived) and revived.block_table == [0, 2] and blocks.ref_count(0) == 1
    assert blocks.num_free == 1                         # only block 1 is left to take
    blocks.free(revived)                                # evictable now: 1, then 0
    taker = seq([7, 7], index=3)
    assert blocks.allocate(taker) and taker.block_table == [2, 1]
    assert blocks.is_cached(0) and not blocks.is_cached(1) and blocks.evictions == 1


def test_free_walks_backwards_so_a_prefix_outlives_its_tail():
    blocks = BlockManager(1, 3, prefix_caching=True)
    a = admitted(blocks, [1, 2, 3])                     # one token a block: all three cached
    blocks.free(a)
    b = seq([9, 9], index=1)
    assert blocks.allocate(b) and b.block_table == [2, 1]      # a's tail is evicted first
    assert blocks.is_cached(0) and not blocks.is_cached(1)


def test_a_growing_pool_never_evicts():
    blocks = BlockManager(1, None, prefix_caching=True)
    for i in range(20):
        blocks.free(admitted(blocks, [i, i, i], index=i))
    assert blocks.evictions == 0 and blocks.num_free == blocks.capacity and blocks.peak_used == 3
    again = seq([5, 5, 5, 5])
    assert blocks.allocate(again) and again.num_cached == 3


# ------------------------------------------------------------------ a property of the pool alone

@settings(max_examples=150, deadline=None)
@given(st.data())
def test_reference_counts_match_the_tables_under_any_operations(data):
    size = data.draw(st.integers(1, 3))
    blocks = BlockManager(size, data.draw(st.integers(2, 8)), prefix_caching=data.draw(st.booleans()))
    live: list[Sequence] = []
    for step in range(data.draw(st.integers(1, 30))):
        op = data.draw(st.sampled_from(["admit", "compute", "free"]))
        if op == "admit":
            s = seq(data.draw(st.lists(st.integers(0, 1), min_size=1, max_size=7)), index=step)
            if blocks.allocate(s, data.draw(st.none() | st.integers(0, 4))):
                live.append(s)
            else:
                assert s.block_table == [] and s.num_computed == 0
        elif op == "compute" and live:
            s = data.draw(st.sampled_from(live))
            n = data.draw(st.integers(0, s.num_uncomputed))
            if blocks.reserve(s, n):
                s.num_computed += n
                blocks.commit(s)
        elif op == "free" and live:
            s = live.pop(data.draw(st.integers(0, len(live) - 1)))
            blocks.free(s)
        held = [b for s in live for b in s.block_table]
        assert all(blocks.ref_count(b) == held.count(b) for b in range(blocks.capacity))
        assert blocks.num_used == len(set(held)) and blocks.num_used + blocks.num_free == blocks.capacity
        for s in live:                                  # what a sequence will write is its own and uncached
            assert len(s.block_table) >= blocks.blocks_for(s.num_computed)
            for b in s.block_table[s.num_computed // size:]:
                assert blocks.ref_count(b) == 1 and not blocks.is_cached(b)


def test_a_finished_requests_blocks_go_to_the_next_request_that_grows():
    """Section 6's picture: tables grow in turns, freed blocks are handed out after the
    never-used ones, so a request's blocks end up scattered; nothing is handed out twice."""
    blocks = BlockManager(4, 6)
    a, b = admitted(blocks, range(5)), admitted(blocks, range(3), index=1)
    assert (a.block_table, b.block_table, blocks.free_blocks) == ([0, 1], [2], [3, 4, 5])
    a.append(9), b.append(9)
    computed(blocks, a), computed(blocks, b)                   # a: 6 tokens in 2 blocks; b: 4 in 1
    blocks.free(b)
    assert blocks.free_blocks == [3, 4, 5, 2]
    c = admitted(blocks, range(13), index=2)                   # 4 blocks: the never-used ones, then b's
    assert c.block_table == [3, 4, 5, 2] and blocks.free_blocks == []
    assert blocks.slot(c, 12) == 2 * 4 + 0
    assert not blocks.reserve(a, 3)                            # a's third block: the pool is empty
    held = a.block_table + c.block_table
    assert len(held) == len(set(held))
