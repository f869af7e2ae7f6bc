"""Measuring helpers: formatting, FLOP counting, working-memory tracking."""
from __future__ import annotations

import re

import pytest

import torch

from kvlib.measure import (TensorMemoryTracker, closest_call, count_flops, fmt_approx, fmt_bytes, fmt_exponent,
                           fmt_ratio, fmt_seconds, fmt_verdict, median_seconds, peak_memory, top2_gap)


def test_formats_match_the_nbval_sanitizer():
    """Measured numbers are printed in exactly the forms tests/nbval_sanitize.cfg replaces."""
    cfg = open("tests/nbval_sanitize.cfg", encoding="utf-8").read()
    patterns = [re.compile(m) for m in re.findall(r"^regex: (.*)$", cfg, flags=re.M)]
    for text in (fmt_seconds(2e-5), fmt_seconds(0.0123), fmt_seconds(3.21), fmt_seconds(-0.0123), fmt_ratio(8.73),
                 fmt_ratio(1.2, "slower"), "-2.9 % of an uncached step", "71 % of the floor",
                 fmt_approx(8.3e-07), fmt_approx(0.0), fmt_approx(1234.5, ",.1f"), fmt_approx(0.973, ".1%"),
                 fmt_approx(-0.25, ".3f")):
        assert any(p.fullmatch(text) for p in patterns), text
    # ... and nothing else: exact numbers, counts, booleans and shapes stay compared.
    for text in ("8.3e-07", "0.007", "1,234", "True", "(1, 9, 64)", "29.3 GFLOP", "below 1e-5"):
        assert not any(p.search(text) for p in patterns), text
    assert fmt_exponent(1.43) == "measured exponent " + fmt_approx(1.43, ".2f")
    assert fmt_approx(8.3e-07) == "≈ 8.3e-07" and fmt_approx(0.973, ".1%") == "≈ 97.3%"
    assert fmt_seconds(0.0123) == "12.3 ms" and fmt_seconds(3.21) == "3.21 s" and fmt_seconds(-0.0123) == "-12.3 ms"
    assert fmt_ratio(8.73) == "8.7× faster"
    assert fmt_bytes(1536) == "1.5 KiB" and fmt_bytes(100) == "100 B"



def test_a_verdict_is_replaced_to_the_end_of_its_line():
    """fmt_verdict: a machine's conclusion ends its line and is compared as one word; what stands
    before it on the line (the measured figures, the question) is compared as usual."""
    line = f"2 rows against 1: {fmt_ratio(1.3, 'slower')}, {fmt_verdict('the step grows with the rows')}"
    other = f"2 rows against 1: {fmt_ratio(1.02, 'slower')}, {fmt_verdict('2 rows cost as much as 1')}"
    assert _sanitized(line) == _sanitized(other) == "2 rows against 1: RATIO× FASTER-OR-SLOWER, → VERDICT"
    assert _sanitized("rows: 2, " + fmt_verdict("x")) != _sanitized("rows: 3, " + fmt_verdict("x"))
    with pytest.raises(ValueError, match="one line"):
        fmt_verdict("two\nlines")


def test_closest_call_is_the_smallest_gap_of_the_greedy_steps():
    """closest_call's one teacher-forced pass gives the gaps a step-by-step greedy run sees."""
    import kvlib

    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    run = kvlib.generate(model, [3, 1, 4, 1, 5], 6, keep_logits=True)
    gaps = top2_gap(run.logits)
    assert gaps.shape == (6,) and (gaps >= 0).all()
    assert closest_call(model, [3, 1, 4, 1, 5], run.tokens) == pytest.approx(float(gaps.min()), abs=1e-5)
    with pytest.raises(ValueError, match="needs a prompt and at least one token"):
        closest_call(model, [3], [])


def test_a_ratio_below_one_is_turned_round():
    """0.9 times faster is 1.1 times slower: fmt_ratio never reads backwards, and the sanitizer
    replaces the word too (near 1, machines differ in which it is)."""
    assert fmt_ratio(0.8) == "1.2× slower" and fmt_ratio(0.5, "slower") == "2.0× faster"
    assert fmt_ratio(1.0) == "1.0× faster"
    assert _sanitized(fmt_ratio(0.97)) == _sanitized(fmt_ratio(1.03)) == "RATIO× FASTER-OR-SLOWER"
    with pytest.raises(ValueError, match="word must be 'faster' or 'slower'"):
        fmt_ratio(2.0, "quicker")


def _sanitized(text: str) -> str:
    """``text`` as nbval compares it: every pattern of tests/nbval_sanitize.cfg, in the file's order."""
    from nbval.plugin import get_sanitize_patterns
    for regex, replace in get_sanitize_patterns(open("tests/nbval_sanitize.cfg", encoding="utf-8").read()):
        text = re.sub(regex, replace, text)
    return text


def test_table_rows_from_two_machines_compare_equal():
    """A padded column holds a measured number of another width on another machine (CI: 9.8 against 13.3)."""
    def row(rate: float, step: float, ratio: float) -> str:
        return (f"{1:>5} {fmt_seconds(step):>10} {rate:>12.1f} tok/s "
                f"{fmt_approx(ratio, '.1f') + '×':>10}   {fmt_seconds(0.0282)}, 35.4 tok/s")
    assert _sanitized(row(13.3, 0.0755, 1.0)) == _sanitized(row(9.8, 0.1021, 14.0))
    assert _sanitized(f"{'static':>11} {14.4:>5.1f} tok/s") == _sanitized(f"{'static':>11} {9.8:>5.1f} tok/s")
    # What is not measured still counts: another word, count or verdict is a difference.
    assert _sanitized(row(13.3, 0.0755, 1.0)) != _sanitized(row(13.3, 0.0755, 1.0).replace("    1", "    2"))
    assert _sanitized("same tokens:  True") != _sanitized("same tokens: False")
    assert _sanitized("a  b   c") == "a b c"


def test_count_flops_of_a_matmul():
    a, b = torch.randn(3, 5), torch.randn(5, 7)
    assert count_flops(lambda: a @ b) == 2 * 3 * 5 * 7


def test_median_seconds_is_positive_and_there_is_one():
    from kvlib import clock

    assert median_seconds(lambda: sum(range(1000)), repeats=3) > 0
    assert median_seconds is clock.median_seconds            # one timer, whatever the import


@pytest.mark.parametrize("sleep, budget, calls", [(0.02, 0.1, 2 + 5), (0.05, 0.01, 2 + 3), (0.001, 10.0, 2 + 30)])
def test_a_budget_calls_a_slow_function_fewer_times(sleep, budget, calls):
    """kvlib.clock.median_seconds (the fast path's kernel choice times with it): with budget_s, as
    many calls as fit in it by the last warm-up call's time, 3 to repeats."""
    import time

    from kvlib import clock

    seen = []
    clock.median_seconds(lambda: (seen.append(1), time.sleep(sleep)), repeats=30, warmup=2, budget_s=budget)
    assert len(seen) in (calls, calls - 1)        # the sleep may overrun a little: one call fewer


def test_peak_memory_counts_new_tensors_once():
    x = torch.ones(1000)                              # made before: not counted
    assert peak_memory(lambda: x.add_(1)) == 0        # in place: no new memory
    assert peak_memory(lambda: x[10:]) == 0           # a view of old memory
    assert peak_memory(lambda: torch.ones(250)) == 1000

    def two_at_once():
        a = torch.ones(1000)       # 4000 bytes
        b = a * 2                  # 4000 more while a is alive
        del a, b
        c = torch.ones(500)        # after both are freed
        return c
    assert peak_memory(two_at_once) == 8000


def test_tracker_reports_live_bytes():
    with TensorMemoryTracker() as mem:
        keep = torch.zeros(100, dtype=torch.float64)
        assert mem.live_bytes == 800
        del keep
        assert mem.live_bytes == 0
    assert mem.peak_bytes == 800
