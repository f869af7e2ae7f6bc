"""Checks for the exercises of *One token at a time* (Exercises 1.1 to 1.3): the generation loop.

The student's loop runs on small seeded random models (``kvlib.Decoder`` with tiny shapes,
grouped-query and multi-head attention) and must choose exactly the tokens the reference
greedy loop chooses. A wrong answer that is exactly one of the usual slips (the stop token
left out, padding on the wrong side or unmasked, the prompt returned too, ...) is named in the
hint. The check of Exercise 1.1 also watches what goes into the model: the loop *without* a
cache feeds the whole text at every step, and nothing after the stop token. Exercise 1.2's
check counts the tokens that ``kvlib.generate`` feeds (its records), against the student's
closed forms; Exercise 1.3 (prompts of different lengths) accepts a loop per prompt or one
padded batch.
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable

import torch

from ..config import Config
from ..model import Decoder
from .framework import MULTI_HEAD, MULTI_QUERY, Case, CheckFailed, diagnose, run_check

__all__ = ["check_greedy_until", "check_tokens_fed", "check_greedy_ragged"]


class _CheckModel(Decoder):
    """A seeded random decoder that prints as one short line in a check's message."""

    def __init__(self, config: Config, seed: int, label: str) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            super().__init__(config)
        self.eval()
        self._label = label

    def __repr__(self) -> str:
        return self._label


_TINY = Config.tiny()                                                    # 4 query heads share 2 kv heads


_LABELS = {id(_TINY): "Config.tiny() (4 query heads share 2 kv heads)",
           id(MULTI_HEAD): "a 2-layer multi-head config (3 heads, 3 kv heads)",
           id(MULTI_QUERY): "a 3-layer multi-query config (4 heads, 1 kv head)"}


@contextlib.contextmanager
def _one_thread():
    """The check models are tiny: one thread is faster than several (far faster on a busy machine)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _model(config: Config, seed: int) -> _CheckModel:
    return _CheckModel(config, seed, f"<random decoder, {_LABELS[id(config)]}, seed {seed}>")


def _prompt(seed: int, length: int, vocab: int) -> list[int]:
    return torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(seed)).tolist()


# --- the uncached greedy loop, the reference of every check here ---------------------------------

@torch.no_grad()
def _greedy(model, prompt_ids, n_new, *, position=-1, append=True, feed_last_only=False,
            keep_prompt=False, steps_shift=0):
    """The uncached greedy loop (reference for Exercise 1.1); the keywords switch in the usual slips."""
    text = list(prompt_ids)
    new = []
    for _ in range(n_new + steps_shift):
        feed = text[-1:] if feed_last_only else text
        logits = model(torch.tensor([feed]))                  # (1, seq, vocab)
        token = int(logits[0, position].argmax())
        new.append(token)
        if append:
            text.append(token)
    return list(prompt_ids) + new if keep_prompt else new


def _greedy_uncached(model, prompt_ids, n_new):
    """Reference for Exercise 1.1: ``n_new`` greedy tokens after ``prompt_ids``, without a cache."""
    return _greedy(model, prompt_ids, n_new)


def _run(exercise: str, fn: Callable, cases: list[Case], hint: str) -> None:
    """:func:`run_check`, with its "result i:" spelt out as prompts and tokens."""
    try:
        run_check(exercise, fn, cases, hint=hint)
    except CheckFailed as e:
        text = re.sub(r"^(.*?)result (\d+): result (\d+): ", r"\1prompt \2, new token \3: ", str(e), count=1)
        text = re.sub(r"^(.*?)result (\d+): ", r"\1new token \2: " if exercise == "Exercise 1.1" else
                      r"\1prompt \2: ", text, count=1)
        if exercise == "Exercise 1.1":
            text = re.sub(r"is wrong: expected (\d+) results \((.*?)\), got", r"is wrong: expected \1 token ids \2, got",
                          text, count=1)
        else:
            text = re.sub(r"is wrong: expected (\d+) results \((.*?)\), got",
                          r"is wrong: expected \1 lists, one per prompt, \2, got", text, count=1)
            text = re.sub(r"prompt (\d+): expected (\d+) results \((.*?)\), got",
                          r"prompt \1: expected \2 token ids \3, got", text, count=1)
        raise CheckFailed(text) from None


def _as_token_list(result):
    """A list of ints from what a student may reasonably return (list, tuple, 1-D tensor)."""
    if isinstance(result, torch.Tensor) and result.dim() == 1 and not result.is_floating_point():
        return [int(t) for t in result]
    if isinstance(result, (list, tuple)):
        out = []
        for t in result:
            if isinstance(t, torch.Tensor) and t.numel() == 1 and not t.is_floating_point():
                out.append(int(t))
            elif isinstance(t, int) and not isinstance(t, bool):
                out.append(t)
            else:
                return result                      # left as it is: the check says what it expected
        return out
    return result


def _calls_of(fn: Callable, model: torch.nn.Module, *args):
    """Run ``fn(model, *args)`` and record the shape of every batch of token ids that went into ``model``."""
    shapes: list[tuple[int, ...]] = []

    def record(module, args, kwargs):
        ids = args[0] if args else kwargs.get("ids")
        shapes.append(tuple(ids.shape) if isinstance(ids, torch.Tensor) else ())

    handle = model.register_forward_pre_hook(record, with_kwargs=True)
    try:
        result = fn(model, *args)
    finally:
        handle.remove()
    return result, shapes


def _check_calls(exercise: str, fn: Callable, cases: list[Case], expected_shapes: Callable, advice: str) -> None:
    """Where ``fn`` gets the tokens right, it must also have called the model as the exercise asks:
    once per new token, on the whole text so far (``expected_shapes(case)``)."""
    def show(shapes):
        text = ", ".join(str(s) for s in shapes[:6])
        return text + (", …" if len(shapes) > 6 else "") if shapes else "none"

    for i, case in enumerate(cases, start=1):
        try:
            got, shapes = _calls_of(fn, *case.args)
        except Exception:
            return                                   # run_check reports it
        if got != case.expected:
            return                                   # run_check reports the wrong tokens
        expected = expected_shapes(case)
        if shapes != expected:
            raise CheckFailed(
                f"{exercise}: case {i} of {len(cases)} ({case.name}): the tokens are right, but the model was "
                f"called {len(shapes)} times, with token ids of shape {show(shapes)}; the loop this exercise "
                f"asks for calls it {len(expected)} times, with shape {show(expected)}.\n  hint: {advice}")


# --- Exercise 1.1 (since issue 17): stop at a token -------------------------------------------

@torch.no_grad()
def _greedy_until(model, prompt_ids, max_new, stop_id, *, include=True, ignore=False, late=False):
    """Reference for Exercise 1.1: the uncached greedy loop that stops once it has written ``stop_id``
    (kept as the last token) or ``max_new`` tokens. The keywords switch in the usual slips."""
    text, new = list(prompt_ids), []
    stopped = False
    for _ in range(max_new):
        token = int(model(torch.tensor([text]))[0, -1].argmax())
        text.append(token)
        if stopped:                      # ``late``: one step after the stop token
            new.append(token)
            break
        if token == stop_id and not ignore:
            if include:
                new.append(token)
            if late:
                stopped = True
                continue
            break
        new.append(token)
    return new


_MISTAKES_UNTIL: list[tuple[str, Callable]] = [
    ("the stop token is left out. It is a token the model wrote: return it as the last one.",
     lambda m, p, n, s: _greedy_until(m, p, n, s, include=False)),
    ("the loop never stops at stop_id: after appending each token, leave the loop if it is stop_id.",
     lambda m, p, n, s: _greedy_until(m, p, n, s, ignore=True)),
    ("one token too many after the stop token: test the token you just appended, and leave the loop "
     "at once (break), before the next model call.",
     lambda m, p, n, s: _greedy_until(m, p, n, s, late=True)),
    ("the prompt is returned too. Return only the tokens the loop wrote.",
     lambda m, p, n, s: list(p) + _greedy_until(m, p, n, s)),
]

_HINT_UNTIL = ("the usual mistakes: leaving the stop token out of the result; testing the stop condition "
               "before the model call, on the prompt's last token; running one more step after the stop "
               "token; reading the scores of the first position (logits[0, -1] is the last).")


def _until_cases() -> list[Case]:
    # (name, config, seed, prompt length, max_new, index in the unstopped run of the token used as stop_id)
    specs = [
        ("stops at the 4th new token", _TINY, 30, 5, 10, 3),
        ("stops at the first new token", _TINY, 31, 3, 6, 0),
        ("stop_id never written: max_new tokens", _TINY, 32, 4, 7, None),
        ("stops on the last allowed token", MULTI_HEAD, 26, 3, 6, 5),
        ("multi-query model, stops at the 6th new token", MULTI_QUERY, 22, 12, 9, 5),
        ("max_new = 0", _TINY, 4, 4, 0, None),
    ]
    cases = []
    for name, config, seed, prompt_len, max_new, at in specs:
        model = _model(config, seed)
        prompt = _prompt(100 + seed, prompt_len, config.vocab_size)
        free = _greedy_uncached(model, prompt, max_new)
        if at is None:
            stop = next(t for t in range(config.vocab_size) if t not in free)
        else:
            stop = free[at]
        cases.append(Case(name, (model, prompt, max_new, stop), _greedy_until(model, prompt, max_new, stop)))
    return cases


def check_greedy_until(fn: Callable) -> None:
    """Exercise 1.1: ``fn(model, prompt_ids, max_new, stop_id)`` writes greedy tokens without a cache
    and stops after writing ``stop_id`` (returned as the last token) or after ``max_new`` tokens."""
    with _one_thread():
        exercise = "Exercise 1.1"
        cases = _until_cases()
        wrapped = ((lambda model, prompt, n, stop: _as_token_list(fn(model, list(prompt), n, stop)))
                   if callable(fn) else fn)
        if callable(fn):
            _check_calls(exercise, wrapped, cases,
                         lambda case: [(1, len(case.args[1]) + t) for t in range(len(case.expected))],
                         "one model call per token written, on the whole text so far, and none after the stop "
                         "token: write the loop yourself with model(ids), no cache and no kvlib.generate.")
        hint = diagnose(wrapped, cases, _MISTAKES_UNTIL) or _HINT_UNTIL
        _run(exercise, wrapped, cases, hint)


# --- Exercise 1.2: how many tokens go in? (predict, then count) ---------------------------------

def _tokens_fed(p: int, n: int, use_cache: bool) -> int:
    """Reference for Exercise 1.2: tokens fed through the model to write ``n`` tokens after ``p``."""
    return p + n - 1 if use_cache else n * p + n * (n - 1) // 2


_MISTAKES_FED: list[tuple[str, Callable]] = [
    ("without the cache, only the prompt is counted at every step (n * p): step t also feeds the t tokens "
     "written so far.", lambda p, n, c: p + n - 1 if c else n * p),
    ("without the cache, one step too many is counted (the sum runs to t = n): the n-th new token is chosen "
     "at step n - 1 and never fed back in.", lambda p, n, c: p + n - 1 if c else n * p + n * (n + 1) // 2),
    ("with the cache, the last new token is counted as fed (p + n): it is chosen at the last step and "
     "never fed back in, so the cached loop feeds p + n - 1.", lambda p, n, c: p + n if c else _tokens_fed(p, n, c)),
    ("with the cache, the prompt is left out (n or n - 1): the prefill feeds all p prompt tokens, once.",
     lambda p, n, c: n - 1 if c else _tokens_fed(p, n, c)),
]

_HINT_FED = ("step t (t = 0 .. n - 1) of the uncached loop feeds the prompt and the t tokens written so far; "
             "the cached loop feeds the prompt once, then one token per later step; the n-th new token "
             "is never fed back in.")


def _count_fed(model, p: int, n: int, use_cache: bool) -> int:
    """What the experiment counts: ``tokens_in`` over the records of ``kvlib.generate``."""
    from ..generate import generate
    prompt = _prompt(500 + p, p, model.config.vocab_size)
    run = generate(model, prompt, n, use_cache=use_cache)
    return sum(r.tokens_in for r in run.records)


def _fed_cases() -> list[Case]:
    model = _model(_TINY, 7)
    cases = []
    for p, n in [(5, 6), (1, 1), (1, 12), (8, 20)]:
        for use_cache in (False, True):
            name = f"prompt {p}, {n} new, {'with' if use_cache else 'without'} the cache"
            cases.append(Case(name, (p, n, use_cache), _count_fed(model, p, n, use_cache)))
    return cases


def check_tokens_fed(fn: Callable, records_without=None, records_with=None) -> None:
    """Exercise 1.2: ``fn(p, n, use_cache)`` predicts how many tokens go through the model to write ``n``
    tokens after a ``p``-token prompt. The check counts them in runs of ``kvlib.generate`` on a tiny
    model; given the section's records (``without_cache.records``, ``with_cache.records``), it also
    grades the predicted ratio for that run against the ratio counted there."""
    exercise = "Exercise 1.2"
    with _one_thread():
        cases = _fed_cases()
    wrapped = (lambda p, n, c: (lambda r: int(r) if isinstance(r, (int, float)) and not isinstance(r, bool)
                                and float(r).is_integer() else r)(fn(p, n, c))) if callable(fn) else fn
    hint = diagnose(wrapped, cases, _MISTAKES_FED) or _HINT_FED
    run_check(exercise, wrapped, cases, hint=hint)
    if records_without is not None and records_with is not None:
        from .framework import check_prediction
        fed_without = sum(r.tokens_in for r in records_without)
        fed_with = sum(r.tokens_in for r in records_with)
        p = records_with[0].tokens_in                    # the cached run's first step is the prefill
        n = len(records_with)
        check_prediction(exercise, fn(p, n, False) / fn(p, n, True), fed_without / fed_with, rel_tol=0.01,
                         what=f"the ratio of tokens fed without and with the cache (p = {p}, n = {n})",
                         why=_HINT_FED)


def _as_rows(result):
    if isinstance(result, torch.Tensor) and result.dim() == 2 and not result.is_floating_point():
        return result.tolist()
    if isinstance(result, (list, tuple)):
        rows = [_as_token_list(r) for r in result]
        return rows if all(isinstance(r, list) for r in rows) else result
    return result


# --- Exercise 1.3 (since issue 17): prompts of different lengths --------------------------------

@torch.no_grad()
def _greedy_padded(model, prompts, n_new, *, side="right", mask=False, keep_prompt=False):
    """Padding with token 0: on one side, reading the last column (the usual slips); or, with
    ``mask=True``, on the right, telling the model each row's length (``n_tokens``)."""
    rows = [list(p) for p in prompts]
    for _ in range(n_new):
        width = max(len(r) for r in rows)
        padded = [([0] * (width - len(r)) + r) if side == "left" else (r + [0] * (width - len(r))) for r in rows]
        ids = torch.tensor(padded, dtype=torch.long)
        if mask:
            logits = model(ids, last_only=True, n_tokens=[len(r) for r in rows])
        else:
            logits = model(ids)[:, -1:]
        for r, token in zip(rows, logits[:, -1].argmax(dim=-1).tolist()):
            r.append(token)
    new = [r[len(p):] for r, p in zip(rows, prompts)]
    return [list(p) + r for p, r in zip(prompts, new)] if keep_prompt else new


def _reference_ragged(model, prompts, n_new):
    """Reference for Exercise 1.3: each prompt continued as if it were alone."""
    return [_greedy_uncached(model, p, n_new) for p in prompts]


_MISTAKES_RAGGED: list[tuple[str, Callable]] = [
    ("the shorter prompts are padded at the end and the batch's last column is read: for a padded row "
     "that is the score after a padding token, not after its own last token. Read each row at its own "
     "last token (model(ids, last_only=True, n_tokens=...)), or continue each prompt on its own.",
     lambda m, p, n: _greedy_padded(m, p, n, side="right")),
    ("the shorter prompts are padded on the left: the real tokens attend to the padding, and their "
     "positions are shifted by it. Pad on the right and tell the model each row's length "
     "(model(ids, last_only=True, n_tokens=...)), or continue each prompt on its own.",
     lambda m, p, n: _greedy_padded(m, p, n, side="left")),
    ("the prompts are returned too. Return only the n_new new tokens of each row.",
     lambda m, p, n: [list(q) + r for q, r in zip(p, _reference_ragged(m, p, n))]),
]

_HINT_RAGGED = ("each row must get exactly the tokens its prompt gets alone: the usual mistakes are padding "
                "on the right and reading the last column, padding on the left (the padding is attended to and "
                "shifts the positions; model(ids, last_only=True, n_tokens=...) reads each row at its own last "
                "token), and returning one list per step instead of one per prompt.")


def _ragged_cases() -> list[Case]:
    specs = [
        ("3 prompts of 4, 1 and 6 tokens, 5 new tokens", _TINY, 11, (4, 1, 6), 5),
        ("2 prompts of 2 and 7 tokens, 6 new tokens", _TINY, 12, (2, 7), 6),
        ("one prompt (batch 1), 4 new tokens", _TINY, 13, (5,), 4),
        ("2 prompts of the same length, 3 new tokens", _TINY, 14, (3, 3), 3),
        ("multi-head model, 3 prompts of 5, 2 and 3 tokens, 7 new tokens", MULTI_HEAD, 15, (5, 2, 3), 7),
        ("multi-query model, 4 prompts of 6, 1, 9 and 4 tokens, one new token", MULTI_QUERY, 16, (6, 1, 9, 4), 1),
    ]
    cases = []
    for name, config, seed, lengths, n_new in specs:
        model = _model(config, seed)
        prompts = [_prompt(300 + 10 * seed + b, n, config.vocab_size) for b, n in enumerate(lengths)]
        cases.append(Case(name, (model, prompts, n_new), _reference_ragged(model, prompts, n_new)))
    return cases


def check_greedy_ragged(fn: Callable) -> None:
    """Exercise 1.3: ``fn(model, prompts, n_new)`` continues prompts of different lengths, and returns
    one list of ``n_new`` greedy token ids per prompt, each as its prompt alone would get."""
    with _one_thread():
        exercise = "Exercise 1.3"
        cases = _ragged_cases()
        wrapped = (lambda model, prompts, n_new: _as_rows(fn(model, [list(p) for p in prompts], n_new))
                   if callable(fn) else fn)
        hint = diagnose(wrapped, cases, _MISTAKES_RAGGED) or _HINT_RAGGED
        _run(exercise, wrapped, cases, hint)
