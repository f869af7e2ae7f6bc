"""The machinery shared by every exercise check: cases, comparison, one clear verdict."""
from __future__ import annotations

import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..config import Config

# Small shapes the checks try besides Config.tiny() (which has grouped-query attention):
# plain multi-head attention (a key/value head per query head) and multi-query attention
# (one key/value head for all). The exercise checks of every section share them.
MULTI_HEAD = Config(vocab_size=48, d_model=24, n_layers=2, n_heads=3, n_kv_heads=3, d_mlp=40, max_seq_len=64)
MULTI_QUERY = Config(vocab_size=40, d_model=32, n_layers=3, n_heads=4, n_kv_heads=1, d_mlp=48, max_seq_len=64)


class CheckFailed(Exception):
    """An exercise check did not pass. Jupyter shows only the message, not a traceback."""

    def _render_traceback_(self) -> list[str]:     # IPython's hook for custom error display
        return [f"\x1b[31m✗ {self}\x1b[0m"]


@dataclass
class Case:
    """One input to try: a name a student understands, the arguments, and the expected output."""

    name: str
    args: tuple
    expected: Any
    kwargs: dict = field(default_factory=dict)
    atol: float = 1e-5


def describe(x: Any) -> str:
    """A short description of an input or output for a check's message: shape and dtype of a
    tensor (its values when small), a short repr otherwise."""
    if isinstance(x, torch.Tensor):
        if x.numel() <= 12:
            return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}: {x.tolist()}"
        return f"tensor of shape {tuple(x.shape)}, dtype {x.dtype}"
    if isinstance(x, (tuple, list)) and len(x) <= 6:
        return "(" + ", ".join(describe(i) for i in x) + ")"
    text = repr(x)
    return text if len(text) < 200 else text[:200] + "…"


def _first_difference(expected: Any, got: Any, atol: float) -> str | None:
    """``None`` if ``got`` matches ``expected``, else a sentence saying how it differs."""
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a tensor, got {type(got).__name__}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
        if expected.is_floating_point():
            if not got.is_floating_point():
                return f"expected a floating-point tensor, got dtype {got.dtype}"
            diff = (got.double() - expected.double()).abs()
            if not torch.isfinite(got).all():
                return "the result contains NaN or infinity"
            if diff.max() > atol:
                idx = tuple(int(i) for i in torch.nonzero(diff == diff.max())[0])
                return (f"values differ: at index {idx} expected {expected[idx].item():.6g}, "
                        f"got {got[idx].item():.6g} (largest difference {diff.max().item():.3g}, "
                        f"allowed {atol:g})")
            return None
        if not torch.equal(got.to(expected.dtype), expected):
            return f"expected {expected.tolist()}, got {got.tolist()}"
        return None
    if isinstance(expected, (tuple, list)):
        if not isinstance(got, (tuple, list)) or len(got) != len(expected):
            return f"expected {len(expected)} results ({describe(expected)}), got {describe(got)}"
        for i, (e, g) in enumerate(zip(expected, got)):
            why = _first_difference(e, g, atol)
            if why:
                return f"result {i}: {why}"
        return None
    if isinstance(expected, float):
        if not isinstance(got, (int, float)) or abs(got - expected) > atol * max(1.0, abs(expected)):
            return f"expected {expected:.6g}, got {describe(got)}"
        return None
    if got != expected:
        return f"expected {describe(expected)}, got {describe(got)}"
    return None


def run_check(exercise: str, fn: Callable, cases: list[Case], *, hint: str = "") -> None:
    """Run ``fn`` on every case; print a verdict; raise :class:`CheckFailed` on the first problem.

    ``exercise`` names the exercise as the page does (e.g. ``"Exercise 2.1"``); ``hint``
    is added to a failure message when it helps (e.g. the common mistakes to look for).
    """
    if not callable(fn):
        raise CheckFailed(f"{exercise}: expected a function, got {type(fn).__name__}")
    for i, case in enumerate(cases, start=1):
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
        try:
            got = fn(*args, **case.kwargs)
        except NotImplementedError:
            raise CheckFailed(f"{exercise}: not written yet — replace the NotImplementedError "
                              f"in your function with your code.") from None
        except Exception as e:                            # show the student's own error, briefly
            raise CheckFailed(f"{exercise}: case {i} of {len(cases)} ({case.name}) raised "
                              f"{type(e).__name__}: {e}\n  input: {describe(case.args)}") from None
        why = _first_difference(case.expected, got, case.atol)
        if why:
            message = (f"{exercise}: case {i} of {len(cases)} ({case.name}) is wrong: {why}\n"
                       f"  input: {describe(case.args)}")
            if hint:
                message += f"\n  hint: {hint}"
            raise CheckFailed(message)
    names = ", ".join(c.name for c in cases)
    print(f"✓ {exercise}: all {len(cases)} cases pass ({names}).")


def _names_called(fn: Callable) -> set[str]:
    """The global and attribute names ``fn``'s code uses, nested functions and lambdas included."""
    fn = getattr(fn, "func", fn)                       # a functools.partial wraps the real function
    code = getattr(fn, "__code__", None)
    names: set[str] = set()
    stack = [code] if code is not None else []
    while stack:
        code = stack.pop()
        names.update(code.co_names)
        stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
    return names


def refuse_library_answer(exercise: str, fn: Callable, answers: dict[str, Callable]) -> None:
    """Raise :class:`CheckFailed` when ``fn`` is one of kvlib's ``answers`` (name -> function) or
    calls one, by its name or through a global that holds it: the exercise asks the learner to
    write what that function computes, so calling it passes without learning anything."""
    inner = getattr(fn, "func", fn)
    used = _names_called(fn)
    env = getattr(inner, "__globals__", {})
    for name, answer in answers.items():
        # ``name`` in the code means the library's function unless the learner defined a helper of
        # that name (their function itself counts: ``kvlib.cache.quantize_int8`` inside their own).
        bound = env.get(name)
        by_name = name in used and (bound is None or bound is answer or bound is inner)
        aliases = {n for n in used if env.get(n) is answer}
        if inner is answer or by_name or aliases:
            how = "is" if inner is answer else "calls"
            raise CheckFailed(f"{exercise}: your function {how} kvlib's `{name}`, which computes the answer "
                              f"(the check compares against it). Write it yourself from the shapes and the "
                              f"formula in the text, without `{name}`.")


# --- naming the mistake ----------------------------------------------------------------------

def _same(expected, got, atol: float) -> bool:
    """``got`` equals ``expected`` within ``atol``; NaN matches NaN (a mistake may produce NaN)."""
    if isinstance(expected, torch.Tensor):
        return (isinstance(got, torch.Tensor) and got.shape == expected.shape
                and got.is_floating_point() == expected.is_floating_point()
                and torch.allclose(got.double(), expected.double(), atol=atol, rtol=0, equal_nan=True))
    if isinstance(expected, (tuple, list)):
        return (isinstance(got, (tuple, list)) and len(got) == len(expected)
                and all(_same(e, g, atol) for e, g in zip(expected, got)))
    numbers = (int, float)
    if isinstance(expected, float) and isinstance(got, numbers) and not isinstance(got, bool):
        return abs(got - expected) <= atol or (expected != expected and got != got)      # NaN matches NaN
    return got == expected


def diagnose(fn: Callable, cases: list[Case], mistakes: list[tuple[str, Callable]]) -> str | None:
    """On the first case that ``fn`` gets wrong, name the mistake whose result ``fn`` reproduces.

    ``mistakes`` pairs a sentence with a function computing what that mistake gives. Returns
    ``None`` when ``fn`` is right, raises, or matches none of them (the check then shows its
    general hint). Errors are left for :func:`run_check` to report.
    """
    for case in cases:
        args = tuple(a.clone() if isinstance(a, torch.Tensor) else a for a in case.args)
        try:
            got = fn(*args, **case.kwargs)
        except Exception:
            return None
        if _same(case.expected, got, case.atol):
            continue
        for sentence, mistake in mistakes:
            try:
                wrong = mistake(*case.args, **case.kwargs)
            except Exception:
                continue
            if _same(wrong, got, case.atol):
                return "this looks like a known slip: " + sentence
        return None
    return None


# --- grading a prediction or an explanation ----------------------------------------------------

def student_answer(exercise: str, fn: Any, what: str) -> Any:
    """The student's answer: ``fn()`` if it is a function (a stub raises), else ``fn`` itself."""
    if not callable(fn):
        return fn
    try:
        return fn()
    except NotImplementedError:
        raise CheckFailed(f"{exercise}: not written yet — replace the NotImplementedError in your function "
                          f"with {what}.") from None
    except Exception as e:                                  # show the student's own error, briefly
        raise CheckFailed(f"{exercise}: your function raised {type(e).__name__}: {e}") from None


def fmt_number(x: float) -> str:
    """A predicted or measured number as a learner reads it: a whole number with thousands separators
    (``143,025,408``, not ``1.43e+08``), anything else to four significant digits (``3.259``)."""
    if isinstance(x, int) or (isinstance(x, float) and x.is_integer() and abs(x) < 1e15):
        return f"{int(x):,}"
    return f"{x:.4g}"


def check_prediction(exercise: str, predicted: Any, measured: float, *, rel_tol: float, what: str,
                     why: str = "") -> None:
    """Grade a predicted number against what the experiment ``measured`` (or what a formula gives).

    Passes within ``rel_tol`` (relative: 0.25 is 25 %); otherwise says how far off, in which
    direction, and ``why`` (what the prediction most likely left out). ``what`` names the
    quantity ("the achieved GFLOP/s of a cached step"). An unanswered prediction (``None``,
    ``...``) is refused with a reminder to write a number first."""
    if predicted is None or predicted is Ellipsis:
        raise CheckFailed(f"{exercise}: write your prediction of {what} first (a number), then run this check.")
    if isinstance(predicted, bool) or not isinstance(predicted, (int, float)):
        raise CheckFailed(f"{exercise}: your prediction of {what} should be a number, got {describe(predicted)}")
    if not rel_tol > 0:
        raise ValueError(f"rel_tol must be positive, got {rel_tol!r}")
    if measured:
        error = (predicted - measured) / abs(measured)
    else:
        error = 0.0 if predicted == 0 else (float("inf") if predicted > 0 else -float("inf"))
    if abs(error) <= rel_tol:
        print(f"✓ {exercise}: you predicted {fmt_number(predicted)} for {what}; it is {fmt_number(measured)} "
              f"(within {100 * rel_tol:.0f} %).")
        return
    direction = "too high" if predicted > measured else "too low"
    message = (f"{exercise}: you predicted {fmt_number(predicted)} for {what}, but it is {fmt_number(measured)}: "
               f"{direction} by {100 * abs(error):.0f} % (within {100 * rel_tol:.0f} % passes).")
    raise CheckFailed(message + (f"\n  hint: {why}" if why else ""))


def check_choice(exercise: str, answer: Any, choices: dict[str, tuple[bool, str]]) -> None:
    """Grade one choice among explanations: ``choices`` maps each letter to (is it right, why).
    Every answer, right or wrong, is told why, so that a guess still teaches something."""
    letters = ", ".join(map(repr, choices))
    if answer is None or answer is Ellipsis:
        raise CheckFailed(f"{exercise}: choose one of {letters} first, then run this check.")
    key = answer.strip().lower() if isinstance(answer, str) else answer
    if key not in choices:
        raise CheckFailed(f"{exercise}: the answer should be one of {letters}, got {describe(answer)}")
    right, why = choices[key]
    if not right:
        raise CheckFailed(f"{exercise}: ({key}) is not it. {why}")
    print(f"✓ {exercise}: ({key}) is right. {why}")
