"""pytest settings shared by every run, the notebook runs above all (`pytest --nbval chapters/*.ipynb`,
and the student edition's `student/chapters/*.ipynb`).

nbval waits at most 5 seconds (a constant in nbval) for each output message of a cell after the
cell has finished. A notebook run beside others on a loaded machine (`make test` runs three at
once, one thread each), whose progress bars send hundreds of widget updates, can exceed that,
and nbval then fails a cell whose outputs were right ("Timeout of 5 seconds exceeded waiting
for output"). The notebooks' cells wait for outputs up to NBVAL_OUTPUT_TIMEOUT seconds instead;
a cell that never finishes still stops at nbval's cell timeout.
"""
from __future__ import annotations

NBVAL_OUTPUT_TIMEOUT = 120


def pytest_collection_modifyitems(items) -> None:
    for item in items:
        if hasattr(item, "output_timeout"):          # nbval's IPyNbCell
            item.output_timeout = NBVAL_OUTPUT_TIMEOUT
