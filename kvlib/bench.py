"""``python -m kvlib.bench``: the benchmark command. It lives in :mod:`kvlib.measure.bench`."""
from __future__ import annotations

import sys

from .measure.bench import main

if __name__ == "__main__":
    sys.exit(main())
