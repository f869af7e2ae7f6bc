"""The figures of sections 9 and 10: a prompt's tokens in blocks, chained keys beside a radix tree,
and the tree attention mask. Each draws on the Axes it returns, from the data it is given."""
from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from kvlib.widgets.diagrams_reuse import (chained_keys, plot_hashed_blocks, plot_radix_tree,  # noqa: E402
                                          plot_token_blocks, radix_tree, token_label)
from kvlib.widgets.diagrams_speculative import (plot_token_tree, plot_tree_mask, tree_attention_mask,  # noqa: E402
                                                tree_paths)


def decode(ids):
    return " ".join(f"t{i}" for i in ids)


def test_a_token_is_labelled_short_and_visible():
    assert token_label(" the") == "·the" and token_label("\n") == "⏎"
    assert token_label(" conversation", 7) == "·conve…"


def test_the_blocks_hold_every_token_and_mark_where_a_message_starts_inside_one():
    texts = [f"w{i}" for i in range(20)]
    ax = plot_token_blocks(texts, 8, 8, [("first", 0, 11), ("second", 11, 20)], title="t")
    written = [t.get_text() for t in ax.texts]
    assert all(w in written for w in texts)
    assert [t.get_text() for t in ax.get_yticklabels()] == ["block 0: from the cache", "block 1: computed",
                                                            "block 2: computed, partly filled"]
    assert len(ax.lines) == 1                      # token 11 starts "second" at slot 3 of block 1
    plt.close("all")
    with pytest.raises(ValueError, match="cached"):
        plot_token_blocks(texts, 8, 21, [])


def test_chained_keys_name_everything_before_them():
    a, b = chained_keys([1, 2, 3, 4, 5, 6, 7], 2), chained_keys([9, 2, 3, 4], 2)
    assert len(a) == 3 and a[:2] == chained_keys([1, 2, 3, 4], 2)
    assert a[1] != b[1]                             # the same block after another first block


def test_the_radix_tree_splits_where_prompts_part_or_end():
    tree = radix_tree([[1, 2, 3, 4], [1, 2, 5], [1, 2], [7]])
    assert set(tree) == {1, 7}
    edge, sub = tree[1]
    assert edge == (1, 2) and set(sub) == {3, 5}
    assert sub[3] == ((3, 4), {}) and tree[7] == ((7,), {})
    assert radix_tree([[1, 2, 3]]) == {1: ((1, 2, 3), {})}


def test_hashed_blocks_and_the_radix_tree_are_drawn():
    prompts = [[1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 9, 9, 9], [1, 2, 8]]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    ax = plot_hashed_blocks(prompts, 2, decode, ax=left)
    keys = [t.get_text() for t in ax.texts]
    assert keys.count(chained_keys(prompts[0], 2)[0]) == 3 and "(no key)" in keys
    ax = plot_radix_tree(prompts, decode, ax=right)
    assert any("t1 t2" in t.get_text() and "(2 tokens)" in t.get_text() for t in ax.texts)
    plt.close("all")


def test_the_tree_mask_lets_a_candidate_see_its_ancestors_only():
    parents = [-1, -1, 0, 0, 1]
    mask = tree_attention_mask(parents)
    assert mask[2] == [True, False, True, False, False]       # itself and its parent
    assert mask[4] == [False, True, False, False, True]
    assert not mask[2][3] and not mask[3][2]                  # siblings never
    assert tree_paths(parents) == [[0, 2], [0, 3], [1, 4]]
    with pytest.raises(ValueError, match="earlier candidate"):
        tree_attention_mask([-1, 2, 0])


def test_the_tree_and_its_mask_are_drawn():
    labels, parents = ["a", "b", "c", "d", "e"], [-1, -1, 0, 0, 1]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3))
    ax = plot_token_tree(labels, parents, ax=left)
    assert {"0: a", "4: e"} <= {t.get_text() for t in ax.texts}
    ax = plot_tree_mask(labels, parents, ax=right)
    assert len(ax.patches) == 5 * 6 and [t.get_text() for t in ax.get_xticklabels()][0] == "cache"
    plt.close("all")
