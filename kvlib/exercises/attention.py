"""Checks for the exercises of *Attention, step by step* (Exercises 2.1, 2.2 and 2.4).

Each check compares a student's function with a written-out reference on seeded random
inputs. When the answer is wrong, the check also tries the usual mistakes (no scaling,
mask off by one, softmax over the wrong axis, keys and values swapped, ...) and, if the
student's result is exactly what one of them gives, names that mistake in the hint. The check of
Exercise 2.2 also watches every tensor the student's function makes (a ``TorchDispatchMode``): a key
or value copied out to one head per query head (``repeat_interleave``, ``repeat``,
``expand(...).contiguous()``, an indexing, or a broadcasting ``matmul`` that copies its operand)
fails, with what was copied and by which operation.
"""
from __future__ import annotations

import math
from typing import Callable

import torch

from torch.utils._python_dispatch import TorchDispatchMode

from .framework import Case, CheckFailed, check_choice, diagnose, run_check

__all__ = ["check_one_head_causal_attention", "check_sliding_window_attention", "check_gqa_attention",
           "check_which_outputs_change"]


# --- references and the usual mistakes, written out --------------------------------------

def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: bool = True,
            mask_diagonal: int | None = 1, softmax_dim: int = -1) -> torch.Tensor:
    """Causal attention on the last two dimensions; the keywords switch in the usual mistakes.

    ``mask_diagonal`` is the ``diagonal`` of ``triu`` that marks the forbidden entries:
    1 is right (query ``i`` sees keys ``0..i``), 0 also hides the token from itself,
    2 lets it see one token ahead, ``None`` masks nothing.
    """
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    if mask_diagonal is not None:
        n, m = scores.shape[-2], scores.shape[-1]
        forbidden = torch.ones(n, m, dtype=torch.bool).triu(diagonal=mask_diagonal)
        scores = scores.masked_fill(forbidden, float("-inf"))
    return scores.softmax(dim=softmax_dim) @ v


def _one_head_causal_attention(q, k, v):
    """Reference for Exercise 2.1: ``q, k, v`` of shape ``(seq, head_dim)``."""
    return _attend(q, k, v)


def _expand_kv(k: torch.Tensor, n_heads: int, *, tiled: bool = False) -> torch.Tensor:
    """``(batch, kv_heads, seq, d) -> (batch, heads, seq, d)``: query head ``h`` reads kv head ``h // group``."""
    group = n_heads // k.shape[1]
    if tiled:                     # the mistake: head h reads kv head h % kv_heads
        return k.repeat(1, group, 1, 1)
    return k.repeat_interleave(group, dim=1)


def _gqa_attention(q, k, v, **mistake):
    """Reference for Exercise 2.2: ``q`` is ``(batch, heads, seq, d)``, ``k, v`` are ``(batch, kv_heads, seq, d)``."""
    tiled = mistake.pop("tiled", False)
    k, v = _expand_kv(k, q.shape[1], tiled=tiled), _expand_kv(v, q.shape[1], tiled=tiled)
    return _attend(q, k, v, **mistake)


# --- Exercise 2.1 ----------------------------------------------------------------------------

_HINT_ONE_HEAD = ("the usual mistakes: forgetting to divide the scores by sqrt(head_dim); masking the "
                  "diagonal too (a token must see itself: mask only key j > query i, triu(diagonal=1)); "
                  "softmax over the wrong dimension (each query's row must sum to 1: dim=-1); "
                  "using the values to score and the keys to mix (scores are q @ k.T, the output is weights @ v).")

_MISTAKES_ONE_HEAD: list[tuple[str, Callable]] = [
    ("the scores are not scaled: divide q @ k.T by sqrt(head_dim) (here sqrt of q.shape[-1]).",
     lambda q, k, v: _attend(q, k, v, scale=False)),
    ("the mask hides the diagonal too, so token 0 has nothing left to look at (NaN). A token sees "
     "itself: mask only key j > query i, i.e. triu(diagonal=1).",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=0)),
    ("the mask is one step too generous: each token also sees the next one. Mask key j > query i, "
     "i.e. triu(diagonal=1) (or keep tril(diagonal=0)).",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=2)),
    ("there is no causal mask: every token also sees the tokens after it. Set the scores of "
     "key j > query i to -inf before the softmax.",
     lambda q, k, v: _attend(q, k, v, mask_diagonal=None)),
    ("the softmax runs over the wrong dimension: each query's weights (a row of the score matrix) "
     "must sum to 1, so use softmax(dim=-1).",
     lambda q, k, v: _attend(q, k, v, softmax_dim=-2)),
    ("keys and values are swapped: score with the keys (q @ k.T) and take the weighted sum of the values.",
     lambda q, k, v: _attend(q, v, k)),
]


def _qkv(seed: int, *shape: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(*shape, generator=g) for _ in range(3))


def _one_head_cases() -> list[Case]:
    cases = []
    for name, seed, seq, d in [("5 tokens, head_dim 4", 21, 5, 4),
                               ("one token", 22, 1, 4),
                               ("12 tokens, head_dim 16", 23, 12, 16),
                               ("2 tokens, head_dim 2", 24, 2, 2)]:
        q, k, v = _qkv(seed, seq, d)
        cases.append(Case(name, (q, k, v), _one_head_causal_attention(q, k, v)))
    return cases


def check_one_head_causal_attention(fn: Callable) -> None:
    """Exercise 2.1: ``fn(q, k, v)`` for one head, ``(seq, head_dim)`` tensors, causal."""
    cases = _one_head_cases()
    hint = diagnose(fn, cases, _MISTAKES_ONE_HEAD) or _HINT_ONE_HEAD
    run_check("Exercise 2.1", fn, cases, hint=hint)


# --- Exercise 2.1 (since issue 17): sliding-window attention --------------------------------

def _sliding(q, k, v, window, *, lo_shift=0, causal=True, scale=True):
    """Reference for Exercise 2.1: query ``i`` sees keys ``j`` with ``i - window < j <= i``.
    ``lo_shift=-1`` lets it see one key more (``window + 1`` keys); ``causal=False`` drops ``j <= i``."""
    n = q.shape[-2]
    i = torch.arange(n)[:, None]
    j = torch.arange(n)[None, :]
    allowed = (j > i - window + lo_shift)
    if causal:
        allowed &= (j <= i)
    else:
        allowed &= (j < i + window)
    scores = q @ k.transpose(-2, -1)
    if scale:
        scores = scores / math.sqrt(q.shape[-1])
    return scores.masked_fill(~allowed, float("-inf")).softmax(dim=-1) @ v


_MISTAKES_SLIDING: list[tuple[str, Callable]] = [
    ("each query sees window + 1 keys: with the window W, query i sees keys i - W + 1 .. i, itself "
     "included (W keys), so mask j <= i - W.",
     lambda q, k, v, w: _sliding(q, k, v, w, lo_shift=-1)),
    ("each query sees window - 1 keys: query i sees keys i - W + 1 .. i (W keys, itself included).",
     lambda q, k, v, w: _sliding(q, k, v, w, lo_shift=+1)),
    ("the window is ignored: that is plain causal attention. Also mask the keys j <= i - window.",
     lambda q, k, v, w: _sliding(q, k, v, len(q))),
    ("the window is not causal: it reaches window - 1 tokens ahead too. Mask every key j > i as well.",
     lambda q, k, v, w: _sliding(q, k, v, w, causal=False)),
    ("the scores are not scaled: divide q @ k.T by sqrt(head_dim).",
     lambda q, k, v, w: _sliding(q, k, v, w, scale=False)),
]

_HINT_SLIDING = ("query i sees exactly the keys j with i - window < j <= i: mask the future (j > i) and the "
                 "keys that fell out of the window (j <= i - window) with -inf before the softmax; window 1 "
                 "leaves each token only itself; a window as long as the sequence is plain causal attention.")


def _sliding_cases() -> list[Case]:
    cases = []
    for name, seed, seq, d, window in [("8 tokens, window 3", 61, 8, 4, 3),
                                       ("window 1: each token sees only itself", 62, 5, 4, 1),
                                       ("window longer than the text: plain causal attention", 63, 6, 8, 10),
                                       ("one token, window 4", 64, 1, 4, 4),
                                       ("16 tokens, head_dim 16, window 5", 65, 16, 16, 5)]:
        q, k, v = _qkv(seed, seq, d)
        cases.append(Case(name, (q, k, v, window), _sliding(q, k, v, window)))
    return cases


def check_sliding_window_attention(fn: Callable) -> None:
    """Exercise 2.1: ``fn(q, k, v, window)`` for one head, ``(seq, head_dim)`` tensors: query ``i``
    attends to the keys ``i - window + 1 .. i``."""
    cases = _sliding_cases()
    hint = diagnose(fn, cases, _MISTAKES_SLIDING) or _HINT_SLIDING
    run_check("Exercise 2.1", fn, cases, hint=hint)


# --- Exercise 2.2 ----------------------------------------------------------------------------

_HINT_GQA = ("the usual mistakes: query head h must read key/value head h // (heads // kv_heads) "
             "(repeat_interleave on dim 1, not repeat); forgetting the 1/sqrt(head_dim) scale; a causal "
             "mask off by one (mask key j > query i only); softmax over the wrong dimension (dim=-1); "
             "keys and values swapped.")

_MISTAKES_GQA: list[tuple[str, Callable]] = [
    ("the query heads are matched to the wrong key/value heads: heads 0 and 1 share kv head 0, heads "
     "2 and 3 share kv head 1 (head h reads kv head h // group). Use k.repeat_interleave(group, dim=1), "
     "not k.repeat(1, group, 1, 1).",
     lambda q, k, v: _gqa_attention(q, k, v, tiled=True)),
    ("the scores are not scaled: divide them by sqrt(head_dim).",
     lambda q, k, v: _gqa_attention(q, k, v, scale=False)),
    ("the mask hides the diagonal too (NaN in the first position). A token sees itself: "
     "mask only key j > query i, i.e. triu(diagonal=1).",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=0)),
    ("the mask is one step too generous: each token also sees the next one. Use triu(diagonal=1) "
     "for the forbidden entries.",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=2)),
    ("there is no causal mask: every token also sees the tokens after it.",
     lambda q, k, v: _gqa_attention(q, k, v, mask_diagonal=None)),
    ("the softmax runs over the wrong dimension: each query's weights must sum to 1 (softmax(dim=-1)).",
     lambda q, k, v: _gqa_attention(q, k, v, softmax_dim=-2)),
    ("keys and values are swapped: score with the keys and take the weighted sum of the values.",
     lambda q, k, v: _gqa_attention(q, v, k)),
]


def _gqa_cases() -> list[Case]:
    cases = []
    for name, seed, batch, heads, kv_heads, seq, d in [
            ("batch 1, 4 query heads sharing 2 kv heads, 6 tokens", 31, 1, 4, 2, 6, 4),
            ("multi-head: 3 query heads, 3 kv heads", 32, 1, 3, 3, 5, 4),
            ("multi-query: 4 query heads, 1 kv head", 33, 1, 4, 1, 5, 8),
            ("batch 2, 6 query heads sharing 2 kv heads", 34, 2, 6, 2, 7, 4),
            ("one token, 4 query heads, 2 kv heads", 35, 2, 4, 2, 1, 4)]:
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(batch, heads, seq, d, generator=g)
        k = torch.randn(batch, kv_heads, seq, d, generator=g)
        v = torch.randn(batch, kv_heads, seq, d, generator=g)
        cases.append(Case(name, (q, k, v), _gqa_attention(q, k, v)))
    return cases


class _CopyWatch(TorchDispatchMode):
    """Watches every tensor an operation makes: does one hold ``k`` or ``v`` copied out to the size
    of the query heads (each key/value head ``group`` times, in any layout)?"""

    def __init__(self, k: torch.Tensor, v: torch.Tensor, group: int) -> None:
        super().__init__()
        self.group = group
        self.targets = {name: (t.numel() * group, torch.sort(t.detach().flatten().repeat(group)).values)
                        for name, t in (("k", k), ("v", v))}
        self.found: list[tuple[str, str, tuple[int, ...]]] = []      # (k or v, the operation, its shape)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.group > 1:
            for t in (out if isinstance(out, (tuple, list)) else (out,)):
                if isinstance(t, torch.Tensor) and t.is_floating_point():
                    self._look(func, t)
        return out

    def _look(self, func, t: torch.Tensor) -> None:
        for name, (numel, values) in self.targets.items():
            if t.numel() != numel or t.untyped_storage().nbytes() < numel * t.element_size():
                continue                        # another size, or a view that copies nothing (expand)
            with torch.utils._python_dispatch._disable_current_modes():
                same = torch.equal(torch.sort(t.detach().flatten()).values, values)
            if same and not any(f[0] == name for f in self.found):
                op = getattr(func, "__name__", str(func)).split(".")[0]
                self.found.append((name, op, tuple(t.shape)))


def _no_copies(exercise: str, fn: Callable, cases: list[Case]) -> None:
    """Fail if ``fn`` makes a tensor holding the keys or values copied out for every query head."""
    for i, case in enumerate(cases, start=1):
        q, k, v = (a.clone() for a in case.args)
        group = q.shape[1] // k.shape[1]
        if group == 1 or q.shape[2] == 1:     # one token: the output itself is v, once per query head
            continue
        watch = _CopyWatch(k, v, group)
        try:
            with watch:
                fn(q, k, v)
        except Exception:
            return                                        # run_check reports it
        if watch.found:
            what = "; ".join(f"{'the keys k' if n == 'k' else 'the values v'} (shape {tuple(case.args[1 if n == 'k' else 2].shape)}) "
                             f"were copied to shape {shape} by aten.{op}" for n, op, shape in watch.found)
            raise CheckFailed(
                f"{exercise}: case {i} of {len(cases)} ({case.name}): the result may be right, but {what}: "
                f"every key/value head copied once per query head of its group ({group} copies), which is the "
                f"memory grouped-query attention is there to save.\n  hint: view the queries so that no operand "
                f"is broadcast: torch.matmul copies an expanded operand (such as k[:, :, None] against queries "
                f"of shape (batch, kv_heads, group, seq, d)) before it multiplies. Could the query heads of a "
                f"group be rows of one matrix per key/value head?")


def check_gqa_attention(fn: Callable) -> None:
    """Exercise 2.2: causal grouped-query attention, ``q`` ``(batch, heads, seq, d)``, ``k, v``
    ``(batch, kv_heads, seq, d)``, without copying a key/value head once per query head."""
    cases = _gqa_cases()
    hint = diagnose(fn, cases, _MISTAKES_GQA) or _HINT_GQA
    run_check("Exercise 2.2", fn, cases, hint=hint)
    _no_copies("Exercise 2.2", fn, cases)
    print("  No key or value was copied out to the query heads.")


# --- Exercise 2.4: which outputs change? (an experiment) ---------------------------------------

_CHOICES_CHANGE = {
    "a": (False, "In the second layer each position still attends only over its own and earlier positions' "
                 "outputs: positions 0 to 4 never read position 5's, in any layer. The experiment's list "
                 "starts at 5."),
    "b": (True, "The causal mask gives every earlier position a weight of exactly 0 for key 5, and all the "
                "layers above see only what the layer below computed at the same or earlier positions, so "
                "positions 0 to 4 come out the same; from position 5 on everything can change. That is what "
                "makes the cache possible: what a token computed never depends on what comes after it."),
    "c": (False, "A position's last hidden state is not its own token alone: attention mixed in the keys and "
                 "values of every earlier position, so positions 6 and 7, which attend to position 5, change too."),
    "d": (False, "Position 5's logits are computed from position 5's hidden state, which starts from its token: "
                 "a new token there gives a new state and new logits, even though they predict the next token."),
}


def check_which_outputs_change(fn: Callable) -> None:
    """Exercise 2.4: ``fn()`` returns the letter of the prediction (``"a"`` .. ``"d"``)."""
    if not callable(fn):
        raise CheckFailed(f"Exercise 2.4: expected a function, got {type(fn).__name__}")
    try:
        answer = fn()
    except NotImplementedError:
        raise CheckFailed("Exercise 2.4: not written yet — return the letter of your prediction.") from None
    check_choice("Exercise 2.4", answer, _CHOICES_CHANGE)
