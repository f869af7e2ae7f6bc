"""Exercise checks: ``check_<name>(fn)`` runs a student's function against the reference.

Each check feeds the student's function several seeded random inputs, including edge
cases (one token, grouped-query attention, batch > 1), and prints one clear verdict:
which cases passed, or the first mismatch with its input, the expected and the received
value or shape. A failure raises :class:`CheckFailed`, which Jupyter shows as that short
message instead of a long traceback.

The checks live in one module per section, named after it (``one_token``, ``attention``,
``kv_cache``, ``quadratic_vs_linear``, ``real_model``, ``price_of_memory``, ``batching`` and
``batching_waste``, ``quantization`` and ``quantization_flip``, ``reuse``, ``speculative``, ``levers``, ``serving``: a section whose checks outgrow
one short module gets a second); they are looked up here lazily, so ``from kvlib.exercises import check_x`` works for all of them.
"""
from __future__ import annotations

import importlib

from .framework import Case, CheckFailed, run_check

__all__ = ["Case", "CheckFailed", "run_check"]

# Section modules that define check_* functions, in chapter order. A module that is not
# there (yet) is skipped.
_SECTION_MODULES = ("one_token", "attention", "kv_cache", "quadratic_vs_linear", "real_model", "price_of_memory",
                    "batching", "batching_waste", "quantization", "quantization_flip", "reuse",
                    "speculative", "levers", "serving")


def _section_modules():
    for name in _SECTION_MODULES:
        try:
            yield importlib.import_module(f"{__name__}.{name}")
        except ModuleNotFoundError as e:
            if e.name != f"{__name__}.{name}":
                raise


def __getattr__(name: str):
    if name.startswith("check_"):
        for module in _section_modules():
            if hasattr(module, name):
                return getattr(module, name)
    raise AttributeError(f"kvlib.exercises has no {name!r}")


def all_checks() -> dict[str, object]:
    """Every ``check_*`` function of every section, by name."""
    return {n: getattr(m, n) for m in _section_modules() for n in dir(m) if n.startswith("check_")}
