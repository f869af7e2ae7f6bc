"""pytest settings shared by every run, the notebook runs above all (`pytest --nbval chapters/*.ipynb`,
and the student edition's `student/chapters/*.ipynb`).

nbval waits at most 5 seconds (a constant in nbval) for each output message of a cell after the
cell has finished. A notebook run beside others on a loaded machine (`make test` runs three at
once, one thread each), whose progress bars send hundreds of widget updates, can exceed that,
and nbval then fails a cell whose outputs were right ("Timeout of 5 seconds exceeded waiting
for output"). The notebooks' cells wait for outputs up to NBVAL_OUTPUT_TIMEOUT seconds instead;
a cell that never finishes still stops at nbval's cell timeout.

Binder gives a notebook 2 GB of memory. After a notebook run, the largest resident memory any
of its kernels reached (the operating system's own count, ``RUSAGE_CHILDREN``) is written to
``_build/notebook-memory/`` (``make test`` runs one notebook per process, so each figure is one
notebook's; ``make test-times`` prints them). With ``KVLIB_NOTEBOOK_MEMORY_LIMIT`` set (bytes;
``make test-binder`` sets Binder's 2 GiB), a notebook that grows past it fails the run, saying
which and by how much. ``make test`` does not set it: the heaviest notebooks (sections 8 and 12)
peak within about 0.2 GiB of it, and a peak moves by as much between runs.
"""
from __future__ import annotations

import os
import resource
from pathlib import Path

NBVAL_OUTPUT_TIMEOUT = 120
BINDER_MEMORY = 2 * 1024 ** 3                  # Binder's 2 GB, as bytes of resident memory
# The limit a notebook run is held to (bytes), when one is set: make test-binder sets BINDER_MEMORY.
NOTEBOOK_MEMORY_LIMIT = int(os.environ["KVLIB_NOTEBOOK_MEMORY_LIMIT"]) if os.environ.get("KVLIB_NOTEBOOK_MEMORY_LIMIT") else None
MEMORY_REPORTS = Path(__file__).resolve().parent / "_build" / "notebook-memory"


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if hasattr(item, "output_timeout"):          # nbval's IPyNbCell
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT


def pytest_sessionfinish(session, exitstatus) -> None:
    """After a notebook run: record the peak resident memory of its kernels, and fail the run if it
    passed ``KVLIB_NOTEBOOK_MEMORY_LIMIT`` (when set)."""
    if not getattr(session.config.option, "nbval", False) and not getattr(session.config.option, "nbval_lax", False):
        return
    notebooks = sorted({Path(str(item.fspath)).stem for item in session.items if hasattr(item, "output_timeout")})
    if not notebooks:
        return
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024        # KiB on Linux
    MEMORY_REPORTS.mkdir(parents=True, exist_ok=True)
    (MEMORY_REPORTS / f"{'+'.join(notebooks)[:120]}.txt").write_text(f"{peak}\n")
    if NOTEBOOK_MEMORY_LIMIT is not None and peak > NOTEBOOK_MEMORY_LIMIT:
        print(f"\nerror: the kernel of {', '.join(notebooks)} reached {peak / 2**30:.2f} GiB of resident memory, "
              f"more than the limit of {NOTEBOOK_MEMORY_LIMIT / 2**30:.2f} GiB (Binder's is {BINDER_MEMORY / 2**30:.0f}): make its heaviest cell scale itself to "
              "the memory there is, and say so, or skip it with a message")
        session.exitstatus = 1
