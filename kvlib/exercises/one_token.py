"""Checks for the exercises of *One token at a time* (Exercises 1.1 and 1.3): the generation loop.

The student's loop runs on small seeded random models (``kvlib.Decoder`` with tiny shapes,
grouped-query and multi-head attention) and must choose exactly the tokens the reference
greedy loop chooses. A wrong answer that is exactly one of the usual slips (the prompt
returned too, the scores of the first position used, the chosen token never appended, one
step too few, ...) is named in the hint. Both checks also watch what goes into the model:
Exercise 1.1 asks for the loop *without* a cache, which feeds the whole text at every step,
and Exercise 1.3 for one call per step on the whole batch, so the right tokens reached
another way (through a cache, one prompt at a time) do not pass.
"""
from __future__ import annotations

import contextlib
import re
from typing import Callable

import torch

from ..config import Config
from ..model import Decoder
from .framework import MULTI_HEAD, MULTI_QUERY, Case, CheckFailed, diagnose, run_check

__all__ = ["check_greedy_uncached", "check_greedy_batch"]


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


# --- Exercise 1.1: the uncached greedy loop ----------------------------------------------------

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


_MISTAKES_LOOP: list[tuple[str, Callable]] = [
    ("the prompt is returned too. Return only the n_new tokens the loop wrote.",
     lambda m, p, n: _greedy(m, p, n, keep_prompt=True)),
    ("the next token is read from the scores of the first position. The scores for what comes "
     "next are at the last position: logits[0, -1].",
     lambda m, p, n: _greedy(m, p, n, position=0)),
    ("the chosen token is never appended to the text, so every step sees the same input and "
     "picks the same token. Append it before the next step.",
     lambda m, p, n: _greedy(m, p, n, append=False)),
    ("only the last token goes into the model at each step. Without a cache the model knows "
     "nothing of the earlier tokens: feed the whole text so far, every step.",
     lambda m, p, n: _greedy(m, p, n, feed_last_only=True)),
    ("one token too few: the loop must run n_new steps, one per new token.",
     lambda m, p, n: _greedy(m, p, n, steps_shift=-1) if n > 0 else None),
    ("one token too many: the loop must run n_new steps, one per new token.",
     lambda m, p, n: _greedy(m, p, n, steps_shift=+1)),
]

_HINT_LOOP = ("the usual mistakes: returning the prompt as well as the new tokens; reading the scores "
              "of the first position instead of the last (logits[0, -1]); forgetting to append the "
              "chosen token; feeding only the newest token (without a cache the model needs the whole "
              "text every step); running n_new - 1 or n_new + 1 steps.")


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


def _loop_cases() -> list[Case]:
    specs = [
        ("5-token prompt, 6 new tokens", _TINY, 30, 5, 6),
        ("one-token prompt, 8 new tokens", _TINY, 31, 1, 8),
        ("one new token", _TINY, 3, 7, 1),
        ("no new tokens", _TINY, 4, 4, 0),
        ("multi-head model, 3-token prompt, 10 new tokens", MULTI_HEAD, 26, 3, 10),
        ("multi-query model with 3 layers, 12-token prompt, 7 new tokens", MULTI_QUERY, 22, 12, 7),
    ]
    cases = []
    for name, config, seed, prompt_len, n_new in specs:
        model = _model(config, seed)
        prompt = _prompt(100 + seed, prompt_len, config.vocab_size)
        cases.append(Case(name, (model, prompt, n_new), _greedy_uncached(model, prompt, n_new)))
    return cases


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


def check_greedy_uncached(fn: Callable) -> None:
    """Exercise 1.1: ``fn(model, prompt_ids, n_new)`` returns the ``n_new`` greedy token ids
    (a list of ints) that follow ``prompt_ids``, running the model on the whole text every step."""
    with _one_thread():
        _check_loop(fn)


def _check_loop(fn: Callable) -> None:
    exercise = "Exercise 1.1"
    cases = _loop_cases()
    wrapped = (lambda model, prompt, n_new: _as_token_list(fn(model, list(prompt), n_new))) if callable(fn) else fn
    if callable(fn):
        _check_calls(exercise, wrapped, cases,
                     lambda case: [(1, len(case.args[1]) + t) for t in range(case.args[2])],
                     "without a cache every step runs the model on the whole text so far, one call per "
                     "new token: write the loop yourself with model(ids), no cache and no kvlib.generate.")
    hint = diagnose(wrapped, cases, _MISTAKES_LOOP) or _HINT_LOOP
    _run(exercise, wrapped, cases, hint)


# --- Exercise 1.3: several prompts at once -----------------------------------------------------

@torch.no_grad()
def _greedy_batch(model, prompts, n_new, *, per_row=True, transpose=False, keep_prompt=False, position=-1):
    """Reference for Exercise 1.3: one batch ``(len(prompts), seq)``, one greedy token per row per step."""
    ids = torch.tensor(prompts, dtype=torch.long)                     # (batch, prompt_len)
    for _ in range(n_new):
        logits = model(ids)                                           # (batch, seq, vocab)
        nxt = logits[:, position].argmax(dim=-1, keepdim=True)        # (batch, 1)
        if not per_row:
            nxt = nxt[:1].expand(len(prompts), 1)
        ids = torch.cat([ids, nxt], dim=1)
    out = ids if keep_prompt else ids[:, len(prompts[0]):]
    return (out.T if transpose else out).tolist()


def _reference_batch(model, prompts, n_new):
    return _greedy_batch(model, prompts, n_new)


_MISTAKES_BATCH: list[tuple[str, Callable]] = [
    ("every prompt gets the token chosen for the first one. Each row picks its own next token: "
     "logits[:, -1].argmax(dim=-1) gives one id per row.",
     lambda m, p, n: _greedy_batch(m, p, n, per_row=False)),
    ("the result is one list per step. Return one list per prompt: result[b] holds the n_new "
     "tokens written after prompts[b].",
     lambda m, p, n: _greedy_batch(m, p, n, transpose=True)),
    ("the prompts are returned too. Return only the new tokens of each row.",
     lambda m, p, n: _greedy_batch(m, p, n, keep_prompt=True)),
    ("the next tokens are read from the scores of the first position. They are at the last "
     "position: logits[:, -1].",
     lambda m, p, n: _greedy_batch(m, p, n, position=0)),
]

_HINT_BATCH = ("the usual mistakes: one argmax over the whole batch instead of one per row "
               "(argmax(dim=-1)); giving every row the first row's token; concatenating the new tokens "
               "on the wrong dimension (they go after the last token of each row: dim=1); returning one "
               "list per step instead of one per prompt; returning the prompts as well.")


def _as_rows(result):
    if isinstance(result, torch.Tensor) and result.dim() == 2 and not result.is_floating_point():
        return result.tolist()
    if isinstance(result, (list, tuple)):
        rows = [_as_token_list(r) for r in result]
        return rows if all(isinstance(r, list) for r in rows) else result
    return result


def _batch_cases() -> list[Case]:
    specs = [
        ("3 prompts of 4 tokens, 5 new tokens", _TINY, 11, 3, 4, 5),
        ("one prompt (batch 1), 6 new tokens", _TINY, 12, 1, 6, 6),
        ("2 one-token prompts, 7 new tokens", _TINY, 13, 2, 1, 7),
        ("4 prompts, one new token", _TINY, 14, 4, 5, 1),
        ("multi-head model, 2 prompts of 3 tokens, 9 new tokens", MULTI_HEAD, 15, 2, 3, 9),
        ("multi-query model, 5 prompts of 6 tokens, 4 new tokens", MULTI_QUERY, 16, 5, 6, 4),
    ]
    cases = []
    for name, config, seed, batch, prompt_len, n_new in specs:
        model = _model(config, seed)
        prompts = [_prompt(200 + 10 * seed + b, prompt_len, config.vocab_size) for b in range(batch)]
        cases.append(Case(name, (model, prompts, n_new), _reference_batch(model, prompts, n_new)))
    return cases


def check_greedy_batch(fn: Callable) -> None:
    """Exercise 1.3: ``fn(model, prompts, n_new)`` continues several equally long prompts at once,
    one batch through the model per step, and returns one list of ``n_new`` token ids per prompt."""
    with _one_thread():
        _check_batch(fn)


def _check_batch(fn: Callable) -> None:
    exercise = "Exercise 1.3"
    cases = _batch_cases()
    wrapped = (lambda model, prompts, n_new: _as_rows(fn(model, [list(p) for p in prompts], n_new))
               if callable(fn) else fn)
    if callable(fn):
        _check_calls(exercise, wrapped, cases,
                     lambda case: [(len(case.args[1]), len(case.args[1][0]) + t) for t in range(case.args[2])],
                     "put all the prompts in one (batch, seq) tensor and call the model once per step on "
                     "all of them, not once per prompt.")
    hint = diagnose(wrapped, cases, _MISTAKES_BATCH) or _HINT_BATCH
    _run(exercise, wrapped, cases, hint)
