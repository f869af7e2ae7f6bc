"""Checks for the exercises of *Batching* (Exercises 7.1 and 7.2).

7.1 pads a batch of prompts on the left and says how much padding each row got; the check
names the usual slips (padding on the right, the wrong count, a float tensor). 7.2 is the
roofline's knee: the batch size from which a decode step stops being memory-bound; the
check tries machines of very different balance.
"""
from __future__ import annotations

from typing import Callable

import torch

from .framework import Case, diagnose, run_check

__all__ = ["check_left_pad", "check_roofline_knee"]


# --- Exercise 7.1 ----------------------------------------------------------------------------

def _left_pad(prompts, pad_id=0, *, right=False, count_real=False):
    width = max(len(p) for p in prompts)
    rows = [(p + [pad_id] * (width - len(p))) if right else ([pad_id] * (width - len(p)) + p) for p in prompts]
    pads = [len(p) if count_real else width - len(p) for p in prompts]
    return torch.tensor(rows, dtype=torch.long), torch.tensor(pads, dtype=torch.long)


_MISTAKES_PAD: list[tuple[str, Callable]] = [
    ("the padding went on the right. Pad on the left, so that every row's last prompt token sits in "
     "the last column and every row's next token goes to the same slot.",
     lambda prompts, pad_id=0: _left_pad(prompts, pad_id, right=True)),
    ("left_pad counts the real tokens of each row; it must count the padding: width - len(prompt).",
     lambda prompts, pad_id=0: _left_pad(prompts, pad_id, count_real=True)),
]


def _pad_cases() -> list[Case]:
    specs = [("3 prompts of 5, 2 and 3 tokens", [[5, 6, 7, 8, 9], [11, 12], [13, 14, 15]], 0),
             ("one prompt (no padding at all)", [[1, 2, 3]], 0),
             ("equal lengths", [[1, 2], [3, 4]], 0),
             ("a one-token prompt beside a long one, pad id 2", [[7], [1, 2, 3, 4, 5, 6]], 2)]
    return [Case(name, (prompts,), _left_pad(prompts, pad), kwargs={"pad_id": pad}) for name, prompts, pad in specs]


def check_left_pad(fn: Callable) -> None:
    """Exercise 7.1: ``fn(prompts, pad_id=0)`` returns ``(ids, left_pad)``, both ``torch.long``."""
    def checked(prompts, pad_id=0):
        got = fn([list(p) for p in prompts], pad_id=pad_id)
        if (isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got)
                and (got[0].dtype != torch.long or got[1].dtype != torch.long)):
            raise TypeError(f"token ids and counts must be torch.long, got {got[0].dtype} and {got[1].dtype} "
                            f"(torch.tensor(..., dtype=torch.long))")
        return got

    cases = _pad_cases()
    hint = diagnose(checked, cases, _MISTAKES_PAD) or ("ids has shape (len(prompts), longest prompt); row b is "
                                                       "[pad_id] * left_pad[b] + prompts[b].")
    run_check("Exercise 7.1", checked if callable(fn) else fn, cases, hint=hint)


# --- Exercise 7.2 ----------------------------------------------------------------------------

def _knee(weight_bytes, bandwidth, flops_per_token, flops_per_s):
    return weight_bytes / bandwidth * flops_per_s / flops_per_token


_MISTAKES_KNEE: list[tuple[str, Callable]] = [
    ("this is the inverse: the knee is where batch × FLOPs per token ÷ FLOP/s grows to weights ÷ bandwidth, "
     "so B = (weight_bytes / bandwidth) × (flops_per_s / flops_per_token).",
     lambda w, bw, f, fs: 1 / _knee(w, bw, f, fs)),
    ("bandwidth and FLOP/s are swapped: the memory time is weight_bytes / bandwidth, the arithmetic time "
     "batch × flops_per_token / flops_per_s.",
     lambda w, bw, f, fs: w / fs * bw / f),
]


def check_roofline_knee(fn: Callable) -> None:
    """Exercise 7.2: ``fn(weight_bytes, bandwidth, flops_per_token, flops_per_s)``, the batch size
    at which a decode step's arithmetic takes as long as reading its weights."""
    specs = [("SmolLM2-135M in float32 on a laptop CPU", (538e6, 20e9, 270e6, 100e9)),
             ("the same model in 4-bit weights", (96e6, 20e9, 270e6, 100e9)),
             ("a 7B model in 16-bit on a GPU", (14e9, 3.3e12, 14e9, 900e12)),
             ("memory as fast as arithmetic", (1e6, 1e9, 1e6, 1e9))]
    cases = [Case(name, args, _knee(*args), atol=1e-9) for name, args in specs]      # relative, for a float
    hint = diagnose(fn, cases, _MISTAKES_KNEE) or ("set the two times of the roofline equal: "
                                                   "batch × flops_per_token / flops_per_s = weight_bytes / bandwidth.")
    run_check("Exercise 7.2", fn, cases, hint=hint)
