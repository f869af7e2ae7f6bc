"""The command line: ``python -m book.student_edition [--out student] [--check | --leaks | --check-flow]``."""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .base import ROOT, StudentEditionError
from .edition import write_edition
from .flowcheck import check_flow
from .leaks import find_leaks
from .lint import consistency_problems, exercise_counts

USAGE = """\
    python -m book.student_edition [--out student]        # write the edition
    python -m book.student_edition --check                 # only the consistency check
    python -m book.student_edition --out student --leaks   # after a build: scan it for solution text
    python -m book.student_edition --out student --check-flow
        # write the edition, then check that every cell not tagged raises-exception runs with the stubs
"""


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m book.student_edition", epilog=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Write the student edition of the book: the same notebooks, without the solutions.")
    parser.add_argument("--out", default="student", help="where to write the edition (default: student/)")
    parser.add_argument("--root", default=str(ROOT), help="the book (default: this repository)")
    parser.add_argument("--check", action="store_true", help="only check that the exercises are consistent")
    parser.add_argument("--leaks", action="store_true",
                        help="only scan --out (the edition and its build) for solution text")
    parser.add_argument("--check-flow", action="store_true",
                        help="write the edition, then check (statically) that every cell of it that is not "
                             "tagged raises-exception runs with the stubs in place")
    parser.add_argument("--quiet", action="store_true")
    return parser


def _check(root: Path) -> int:
    problems = consistency_problems(root)
    for p in problems:
        print("✗", p)
    counts = exercise_counts(root)
    print("exercises per section:", ", ".join(f"{s}: {n}" for s, n in counts.items()))
    return 1 if problems else 0


def _leaks(root: Path, out: Path) -> int:
    leaks = find_leaks(root, out)
    for leak in leaks[:40]:
        print("✗ solution text in the student edition:", leak)
    if leaks:
        return 1
    print(f"✓ no solution text under {out}")
    return 0


def _check_flow(root: Path, out: Path, quiet: bool) -> int:
    write_edition(root, out, quiet=quiet)
    report = check_flow(out)
    for p in report.problems:
        print("✗", p)
    for w in report.warnings:
        print("warning:", w)
    if report.problems:
        return 1
    print(f"✓ every cell not tagged raises-exception runs with the stubs in place "
          f"({report.cells} code cells in {report.notebooks} notebooks under {out})")
    return 0


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    root = Path(args.root).resolve()
    out = Path(args.out)
    out = out if out.is_absolute() else root / out
    try:
        if args.check:
            return _check(root)
        if args.leaks:
            return _leaks(root, out)
        if args.check_flow:
            return _check_flow(root, out, args.quiet)
        write_edition(root, out, quiet=args.quiet)
    except StudentEditionError as e:
        print(f"student edition: {e}", file=sys.stderr)
        return 2
    return 0
