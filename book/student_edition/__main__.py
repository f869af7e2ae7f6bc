"""``python -m book.student_edition``: see :mod:`book.student_edition.cli`."""
import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
