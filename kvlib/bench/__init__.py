"""The benchmark, a wing of its own on top of kvlib: ``python -m kvlib.bench``.

It times kvlib's decoders (every format, eager and compiled, and the fast path of
:mod:`kvlib.fast`) against Hugging Face transformers and llama.cpp on the real model, and
writes a report. Nothing of the chapter imports it; it imports the rest.

- :mod:`.run`: the phases of one run and the command line (:func:`run`, :func:`main`);
- :mod:`.peer`: llama.cpp through llama-cpp-python, the peer on the same GGUF file;
- :mod:`.batched`: decoding several sequences together, kvlib and llama.cpp alike;
- :mod:`.goals`: the project's performance goals, as one run measured them;
- :mod:`.markdown`: the markdown of ``bench.md`` and ``goals.md``.
"""
from __future__ import annotations

__all__ = ["run", "main"]


def run(*args, **kwargs) -> dict:
    """:func:`kvlib.bench.run.run` (imported on call: ``import kvlib.bench`` stays light)."""
    from .run import run as run_bench
    return run_bench(*args, **kwargs)


def main(argv: list[str] | None = None) -> int:
    """:func:`kvlib.bench.run.main`, the command line of ``python -m kvlib.bench``."""
    from .run import main as run_main
    return run_main(argv)
