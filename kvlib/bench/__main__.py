"""``python -m kvlib.bench``: the benchmark command (:mod:`kvlib.bench.run`)."""
from __future__ import annotations

import sys

from .run import main

if __name__ == "__main__":
    sys.exit(main())
