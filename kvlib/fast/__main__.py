"""``python -m kvlib.fast``: build kvlib's CPU kernels now, ahead of their first use (``make setup``
and Binder's image do), and say where they are, or why they cannot be built here (the fast path
then uses PyTorch's kernels alone, as it would have anyway). Exit status 0 both ways."""
from __future__ import annotations

import sys

from . import kernels


def main() -> int:
    if kernels.load():
        print(f"kvlib's CPU kernels: {kernels.library_path()} ({kernels.simd()}; panels: {kernels.panel_simd()})")
    else:
        print(f"kvlib's CPU kernels are not built: {kernels.kernels_missing()}; kvlib uses PyTorch's kernels alone")
    return 0


if __name__ == "__main__":
    sys.exit(main())
