"""Checks for the exercises of *Batching* (section 7).

- 7.1, each row at its own length: ``slot_step(lengths, max_len)`` gives the RoPE position and
  the attention mask of one decode step of a batch whose rows hold their own numbers of tokens
  (and possibly keys of later positions beyond them: padding, or an earlier text). The check names the usual slips: one
  shared position, a mask that leaves out the new token or lets it read stale keys, a position
  off by one, one mask for all rows.
- 7.2, where throughput stops rising: ``levels_off_at`` is graded exactly on synthetic curves
  (the measured one depends on the machine), and the roofline's knee is explained with a letter.
- 7.3, counting the waste, is in :mod:`kvlib.exercises.batching_waste`.
"""
from __future__ import annotations

from typing import Any, Callable

import torch

from .framework import Case, CheckFailed, check_choice, describe, run_check, student_answer

__all__ = ["check_slot_step", "check_levels_off_at", "check_knee_explanation", "KNEE_CHOICES"]


# ---------------------------------------------------------------------------------------
# Exercise 7.1: each row at its own length
# ---------------------------------------------------------------------------------------

def _slot_step(lengths: torch.Tensor, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Reference: the new token of slot s is written at cache index lengths[s], which is also its
    position, and it sees indices 0 … lengths[s] of its own row."""
    return lengths.clone(), torch.arange(max_len) <= lengths[:, None]


def _slot_cases() -> list[Case]:
    g = torch.Generator().manual_seed(7)
    specs = [
        ("three rows holding 3, 7 and 1 tokens, max_len 10", [3, 7, 1], 10),
        ("one row", [5], 9),
        ("four rows of equal length", [4, 4, 4, 4], 6),
        ("a row at length 0 beside one at 5 (the new token sees only itself)", [0, 5], 6),
        ("a row one short of max_len beside a short one", [7, 2], 8),
        ("six rows, seeded random lengths, max_len 12", torch.randint(0, 12, (6,), generator=g).tolist(), 12),
    ]
    out = []
    for name, lengths, max_len in specs:
        lengths = torch.tensor(lengths, dtype=torch.long)
        out.append(Case(name, (lengths, max_len), _slot_step(lengths, max_len)))
    return out


_POSITION_MISTAKES: list[tuple[str, Callable]] = [
    ("every row got the same position, the longest row's length. Each row's new token sits at its own "
     "length: rotated by a shared position, a shorter row sees its own keys at the wrong distance (the "
     "shared-position bug of *Prompts of different lengths*, which wrote wrong words).",
     lambda lengths, max_len: lengths.max().expand_as(lengths)),
    ("the positions are off by one: a row holding lengths[s] tokens has stored positions 0 … lengths[s] - 1, "
     "so its new token's position is lengths[s] itself.",
     lambda lengths, max_len: lengths - 1),
    ("the positions are off by one: a row holding lengths[s] tokens has stored positions 0 … lengths[s] - 1, "
     "so its new token's position is lengths[s] itself.",
     lambda lengths, max_len: lengths + 1),
    ("those are the row numbers 0, 1, 2, …: a new token's position is how many tokens its row holds "
     "before it, lengths[s].",
     lambda lengths, max_len: torch.arange(len(lengths))),
    ("every row got position 0: a new token's position is how many tokens its row holds before it, "
     "lengths[s].",
     lambda lengths, max_len: torch.zeros_like(lengths)),
]

_MASK_MISTAKES: list[tuple[str, Callable]] = [
    ("the new token does not see itself. Its own key is written at index lengths[s] in this same step, and it "
     "must attend to it: indices 0 … lengths[s] inclusive (<=, not <). A row at length 0 would see nothing "
     "at all, and a softmax over nothing is NaN.",
     lambda lengths, max_len: torch.arange(max_len) < lengths[:, None]),
    ("the mask ignores the lengths. Beyond lengths[s] a row may still hold keys of positions it has not "
     "reached (padding, or an earlier, longer text); the new token must not read them: True only at indices "
     "0 … lengths[s].",
     lambda lengths, max_len: torch.ones(len(lengths), max_len, dtype=torch.bool)),
    ("every row got the same mask, built from the longest row: each row may see only its own indices "
     "0 … lengths[s]. Compare the key indices with each row's own length as a column, lengths[:, None].",
     lambda lengths, max_len: (torch.arange(max_len) <= lengths.max()).expand(len(lengths), max_len)),
    ("the new token sees only itself: it must also see the keys its row already holds, indices "
     "0 … lengths[s] - 1.",
     lambda lengths, max_len: torch.arange(max_len) == lengths[:, None]),
    ("the mask lets the new token see one index too many: index lengths[s] + 1 is beyond it, a stale key.",
     lambda lengths, max_len: torch.arange(max_len) <= lengths[:, None] + 1),
    ("the mask is inverted: True must mark the indices the new token may attend to (0 … lengths[s]), "
     "False the stale ones beyond.",
     lambda lengths, max_len: torch.arange(max_len) > lengths[:, None]),
    ("the mask is inverted: True must mark the indices the new token may attend to (0 … lengths[s]), "
     "False the stale ones beyond.",
     lambda lengths, max_len: torch.arange(max_len) >= lengths[:, None]),
]


def _named(mistakes: list[tuple[str, Callable]], case: Case, got: torch.Tensor, expected: torch.Tensor) -> str | None:
    """The sentence of the first mistake that gives ``got`` on this case (and not the right answer)."""
    got = got.to(expected.dtype)
    for sentence, mistake in mistakes:
        wrong = mistake(*case.args).to(expected.dtype)
        if not torch.equal(wrong, expected) and torch.equal(got, wrong):
            return sentence
    return None


_UNNAMED = "wrong, and no known mistake gives it"     # left to run_check, which shows the first mismatch


def _slot_step_problem(got: Any, case: Case) -> str | None:
    """What is wrong with ``got`` for ``case`` (type, shape, dtype, or a named mistake), ``None`` when
    it is right, or ``_UNNAMED`` when its values are wrong in a way no known mistake explains."""
    lengths, max_len = case.args
    positions_ok, mask_ok = case.expected
    batch = len(lengths)
    if not (isinstance(got, (tuple, list)) and len(got) == 2):
        return f"expected two results (positions, mask), got {describe(got)}"
    positions, mask = got
    if not isinstance(positions, torch.Tensor):
        return f"positions should be a tensor of shape ({batch},), got {describe(positions)}"
    if tuple(positions.shape) != (batch,):
        return (f"positions should have shape ({batch},), one position per row, got shape "
                f"{tuple(positions.shape)}")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        return (f"positions must hold integers (RoPE looks up each position's angles; torch.long as kvlib "
                f"uses), got dtype {positions.dtype}")
    if not isinstance(mask, torch.Tensor):
        return f"mask should be a tensor of shape ({batch}, {max_len}), got {describe(mask)}"
    if tuple(mask.shape) != (batch, max_len):
        why = f"mask should have shape ({batch}, {max_len}): one row per batch row, one column per cache index"
        if tuple(mask.shape) == (batch, 1, 1, max_len):
            why += "; kvlib.attention.visible has shape (batch, 1, q_len, k_len): this is its [:, 0, 0]"
        elif mask.dim() < 2 or mask.shape[0] != batch:
            why += "; each row's mask depends on its own length, so the mask needs one row per batch row"
        return why + f", got shape {tuple(mask.shape)}"
    if mask.dtype != torch.bool:
        return (f"mask must be a torch.bool tensor (True where the new token may attend), got dtype {mask.dtype}: "
                f"attention takes a bool mask (an integer one is an error there, a float one is added to the "
                f"scores). A comparison such as <= gives bool; .bool() converts")
    if not torch.equal(positions.long(), positions_ok):
        why = _named(_POSITION_MISTAKES, case, positions, positions_ok)
        if not why:
            return _UNNAMED
        return (f"positions: expected {positions_ok.tolist()}, got {positions.tolist()}\n"
                f"  input: lengths {lengths.tolist()}, max_len {max_len}\n  hint: {why}")
    if not torch.equal(mask, mask_ok):
        why = _named(_MASK_MISTAKES, case, mask, mask_ok)
        if not why:
            return _UNNAMED
        return f"the mask is wrong\n  input: lengths {lengths.tolist()}, max_len {max_len}\n  hint: {why}"
    return None


def check_slot_step(fn: Callable[[torch.Tensor, int], tuple[torch.Tensor, torch.Tensor]]) -> None:
    """Exercise 7.1: ``fn(lengths, max_len)`` returns ``(positions, mask)`` for one decode step of a
    batch whose rows hold their own numbers of tokens: ``positions`` (batch,) integers, the RoPE
    position of each row's new token (its row's length); ``mask`` (batch, max_len) bool, True at
    cache indices 0 … lengths[s]."""
    exercise = "Exercise 7.1"
    cases = _slot_cases()
    for i, case in enumerate(cases if callable(fn) else [], start=1):
        try:
            got = fn(case.args[0].clone(), case.args[1])
        except Exception:                       # run_check says "not written yet" or shows the error
            break
        why = _slot_step_problem(got, case)
        if why is _UNNAMED:
            break                               # run_check reports this case with the general hint
        if why:
            raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({case.name}) is wrong: {why}")

    def as_checked(lengths, max_len):
        positions, mask = fn(lengths, max_len)
        return positions.long(), mask            # any integer dtype will do for the positions

    run_check(exercise, as_checked if callable(fn) else fn, cases,
              hint="positions: each row's own length; mask: torch.arange(max_len) compared with each row's "
                   "length as a column (lengths[:, None]), True at indices 0 … lengths[s], the new token included.")


# ---------------------------------------------------------------------------------------
# Exercise 7.2: where does throughput stop rising?
# ---------------------------------------------------------------------------------------

def _levels_off_at(batches, tokens_per_s, gain=1.25, *, after=False, difference=False, first_stall=False):
    """Reference (defaults) and typical mistakes (the keywords): the smallest batch from which on no
    next batch raises throughput ``gain`` times; the largest batch if the last one still does."""
    def rises(i):
        this, nxt = tokens_per_s[i], tokens_per_s[i + 1]
        return nxt - this >= gain if difference else nxt >= gain * this

    pairs = range(len(batches) - 1)
    if first_stall:
        stalls = [i for i in pairs if not rises(i)]
        i = stalls[0] if stalls else len(batches) - 1
    else:
        ups = [i for i in pairs if rises(i)]
        i = ups[-1] + 1 if ups else 0
    return batches[min(i + 1, len(batches) - 1)] if after else batches[i]


_CURVES = [   # name, batches, tokens/s, keyword arguments
    ("rises, then flat", [1, 2, 4, 8, 16, 32], [10.0, 19.0, 37.0, 70.0, 80.0, 82.0], {}),
    ("a dip at batch 2, then a recovery", [1, 2, 4, 8, 16, 32], [12.0, 11.0, 25.0, 50.0, 95.0, 100.0], {}),
    ("hundreds of tokens/s, falling a little at the end", [1, 2, 4, 8, 16, 32],
     [100.0, 190.0, 370.0, 700.0, 650.0, 680.0], {}),
    ("never levels off", [1, 2, 4, 8], [5.0, 10.0, 20.0, 40.0], {}),
    ("flat from the start", [1, 2, 4, 8, 16], [50.0, 52.0, 51.0, 53.0, 52.0], {}),
    ("gain=1.5: a rise of 1.33 times no longer counts", [1, 2, 4, 8, 16, 32],
     [10.0, 14.0, 25.0, 45.0, 60.0, 66.0], {"gain": 1.5}),
    ("the same curve with the default gain 1.25", [1, 2, 4, 8, 16, 32], [10.0, 14.0, 25.0, 45.0, 60.0, 66.0], {}),
    ("batch sizes that do not double", [1, 3, 6, 12, 24], [8.0, 20.0, 30.0, 33.0, 34.0], {}),
    ("two batch sizes", [1, 2], [10.0, 30.0], {}),
    ("one batch size", [4], [40.0], {}),
]

_LEVEL_MISTAKES: list[tuple[str, Callable]] = [
    ("that is the batch after the level-off: return the batch FROM which throughput stops rising, the smaller "
     "of two neighbours, not the next one.",
     lambda b, t, gain=1.25: _levels_off_at(b, t, gain, after=True)),
    ("throughput rose again after that stall: the level-off is where it stops rising for good, the batch "
     "from which no later batch raises it gain times (a measured curve may dip once and recover, as batch 2 "
     "can on a CPU).",
     lambda b, t, gain=1.25: _levels_off_at(b, t, gain, first_stall=True)),
    ("compare a ratio, not a difference: the next batch raises throughput gain times when next >= gain × this "
     "(1.25: 25 % more), whatever the units of the throughput.",
     lambda b, t, gain=1.25: (_levels_off_at(b, t, gain, difference=True),
                              _levels_off_at(b, t, gain, difference=True, first_stall=True))),
    ("that is the batch with the highest throughput: past the level-off throughput may still creep up (by "
     "less than gain times a step), so the highest is often simply the largest batch measured.",
     lambda b, t, gain=1.25: b[max(range(len(t)), key=lambda i: t[i])]),
    ("that is a position in the list: return the batch size itself, batches[i].",
     lambda b, t, gain=1.25: b.index(_levels_off_at(b, t, gain))),
]


def _diagnose_levels(fn: Callable, cases: list[Case]) -> str | None:
    """The mistake ``fn`` makes, if one known mistake (and only one) gives its result on every case
    it gets wrong; ``None`` otherwise (``run_check`` then shows its general hint)."""
    candidates = None
    for case in cases:
        try:
            got = fn(*case.args, **case.kwargs)
        except Exception:
            return None
        if got == case.expected:
            continue
        matching = set()
        for k, (_, mistake) in enumerate(_LEVEL_MISTAKES):
            values = mistake(*case.args, **case.kwargs)
            values = values if isinstance(values, tuple) else (values,)
            if any(v != case.expected and got == v for v in values):
                matching.add(k)
        candidates = matching if candidates is None else candidates & matching
        if not candidates:
            return None
        if len(candidates) == 1:
            return _LEVEL_MISTAKES[candidates.pop()][0]
    return None if not candidates else _LEVEL_MISTAKES[min(candidates)][0]


def check_levels_off_at(fn: Callable[..., int]) -> None:
    """Exercise 7.2: ``fn(batches, tokens_per_s, gain=1.25)``, batches in increasing order, returns the
    smallest measured batch from which on no next measured batch raises throughput ``gain`` times
    (next < gain × this for every later pair); the largest batch if the last pair still does."""
    exercise = "Exercise 7.2"
    cases = [Case(name, (b, t), _levels_off_at(b, t, **kw), kwargs=kw) for name, b, t, kw in _CURVES]

    def with_copies(batches, tokens_per_s, **kwargs):       # a student's function may sort or change its lists
        return fn(list(batches), list(tokens_per_s), **kwargs)

    checked = with_copies if callable(fn) else fn
    hint = _diagnose_levels(checked, cases) if callable(fn) else None
    run_check(exercise, checked, cases,
              hint=hint or "find the last neighbours whose throughputs rise gain times or more (next >= gain × "
                           "this): the level-off is the larger batch of that pair; with no such pair, the first batch.")


KNEE_CHOICES = {
    "a": (False, "Twice the FLOP/s halves the arithmetic time B·f/π of every batch, while reading the weights "
                 "takes as long as before: arithmetic catches up at twice the batch. B* = (W/β)(π/f) doubles."),
    "b": (True, "4-bit weights are an eighth of 32-bit ones: reading them, W/β, takes an eighth of the time, "
                "while the arithmetic per token stays the same, so arithmetic catches up at an eighth of the "
                "batch. B* = (W/β)(π/f) shrinks eight times: each step is faster, but there is less to gain "
                "from batching."),
    "c": (False, "Twice the weights take twice as long to read, and twice the FLOPs per token twice as long to "
                 "compute: both sides of the roofline double, and they meet at the same batch. In "
                 "B* = (W/β)(π/f), W and f double together: the knee stays where it was."),
    "d": (False, "Half the bandwidth doubles the time W/β to read the weights, so arithmetic needs twice the "
                 "batch to catch up: the knee moves to a larger batch. B* = (W/β)(π/f) doubles."),
}


def check_knee_explanation(fn: Any) -> None:
    """Exercise 7.2, the explanation: ``fn()`` returns the letter of the change that moves the
    roofline's knee to a smaller batch."""
    exercise = "Exercise 7.2"
    check_choice(exercise, student_answer(exercise, fn, "the letter you choose"), KNEE_CHOICES)
