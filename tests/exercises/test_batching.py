"""Section 7 exercises: the references pass, stubs fail, typical mistakes fail with the right hint."""
from __future__ import annotations

import pytest
import torch

import kvlib
import kvlib.exercises as ex
from kvlib.exercises import (CheckFailed, check_knee_explanation, check_levels_off_at, check_predicted_steps,
                             check_predicted_useful_share, check_slot_step)
from kvlib.exercises.batching import KNEE_CHOICES, _slot_cases
from kvlib.exercises.batching_waste import WASTE_ANSWERS, WASTE_SLOTS, waste_runs


# ----------------------------------------------------------------- the reference solutions
# (the same code as the solution cells of chapters/07_batching.ipynb)

def slot_step(lengths, max_len):
    positions = lengths.clone()                             # no padding: a token's position is its index
    mask = torch.arange(max_len) <= lengths[:, None]        # its stored keys 0 … lengths-1, and its own new one
    return positions, mask


def levels_off_at(batches, tokens_per_s, gain=1.25):
    rises = [i for i in range(len(batches) - 1) if tokens_per_s[i + 1] >= gain * tokens_per_s[i]]
    return batches[rises[-1] + 1] if rises else batches[0]     # the batch after the last rise; none: the first


def knee_explanation():
    return "b"


def predicted_steps():
    static = 2 * 20                  # two batches of four, each waits for its 20-token answer
    continuous = 4 + 20              # request 7 gets a slot at step 5 (after requests 4, 5, 6), then writes 20 tokens
    return static, continuous


def predicted_useful_share():
    useful = sum([2, 2, 2, 20, 2, 2, 2, 20])                # one slot-step per token, the prefill's included
    static, continuous = predicted_steps()
    return useful / (4 * static), useful / (4 * continuous)


def not_written(*args, **kwargs):
    raise NotImplementedError("Exercise 7.x: ...")


CHECKS = [check_slot_step, check_levels_off_at, check_knee_explanation, check_predicted_steps,
          check_predicted_useful_share]


def test_references_pass(capsys):
    check_slot_step(slot_step)
    check_levels_off_at(levels_off_at)
    check_knee_explanation(knee_explanation)
    check_predicted_steps(predicted_steps)
    check_predicted_useful_share(predicted_useful_share)
    out = capsys.readouterr().out
    assert "✓ Exercise 7.1: all 6 cases pass" in out
    assert "✓ Exercise 7.2: all 10 cases pass" in out
    assert "✓ Exercise 7.2: (b) is right." in out
    assert ("✓ Exercise 7.3: you predicted 40 steps for static and 24 for continuous batching; "
            "serve took exactly 40 and 24.") in out
    assert "✓ Exercise 7.3: you predicted 0.325 for the share of useful slot-steps with static batching" in out
    assert "✓ Exercise 7.3: you predicted 0.5417 for the share of useful slot-steps with continuous batching" in out


def test_checks_are_found_by_name():
    assert {"check_slot_step", "check_levels_off_at", "check_knee_explanation", "check_predicted_steps",
            "check_predicted_useful_share"} <= set(ex.all_checks())
    assert not {"check_left_pad", "check_roofline_knee"} & set(ex.all_checks())


@pytest.mark.parametrize("check", CHECKS)
def test_stubs_fail(check):
    with pytest.raises(CheckFailed, match="not written yet"):
        check(not_written)


@pytest.mark.parametrize("check", [check_slot_step, check_levels_off_at])
def test_a_crashing_function_shows_its_error(check):
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check(lambda *args, **kwargs: 1 / 0)
    with pytest.raises(CheckFailed, match="expected a function"):
        check(42)


# ------------------------------------------------------------------------------ 7.1, slot_step

def kvlib_slot_step(lengths, max_len):
    """What kvlib computes for one decode step of a batch whose rows hold ``lengths`` tokens."""
    cache = kvlib.KVCache(n_layers=1, batch=len(lengths), n_kv_heads=1, max_len=max(max_len, 1), head_dim=2)
    cache.set_lengths(lengths.tolist())
    positions = cache.positions(1)                                              # (batch, 1)
    return positions[:, 0], kvlib.attention.visible(positions, torch.arange(max_len)[None])[:, 0, 0]


def test_the_reference_is_what_kvlib_computes():
    """slot_step agrees with kvlib on every case of the check: KVCache.positions and attention.visible."""
    for case in _slot_cases():
        lengths, max_len = case.args
        positions, mask = slot_step(lengths, max_len)
        kvlib_positions, kvlib_mask = kvlib_slot_step(lengths, max_len)
        assert torch.equal(positions, kvlib_positions) and torch.equal(mask, kvlib_mask)
        assert positions.dtype == torch.long and mask.dtype == torch.bool
    check_slot_step(kvlib_slot_step)


def test_a_ragged_batch_decodes_with_these_positions_and_masks(monkeypatch):
    """Every decode step of generate_batch over rows of different lengths attends with the mask of
    slot_step at the rows' lengths, and rotates by its positions."""
    from kvlib import attention

    seen = []
    real = attention.visible

    def spy(q_pos, k_pos, window=None, sinks=0):
        if q_pos.shape == (3, 1):
            seen.append((q_pos[:, 0].clone(), k_pos.shape[-1]))
        return real(q_pos, k_pos, window, sinks)

    monkeypatch.setattr(attention, "visible", spy)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    kvlib.generate_batch(model, [[1, 2, 3, 4, 5], [6], [7, 8, 9]], 4)
    assert seen and all(len(set(p.tolist())) > 1 for p, _ in seen)             # rows at different lengths
    for lengths, k_len in seen:
        positions, mask = slot_step(lengths, k_len)
        assert torch.equal(positions, lengths)
        assert torch.equal(mask, real(lengths[:, None], torch.arange(k_len)[None])[:, 0, 0])


def test_other_correct_slot_steps_pass(capsys):
    def with_int32_and_a_loop(lengths, max_len):
        mask = torch.zeros(len(lengths), max_len, dtype=torch.bool)
        for s, n in enumerate(lengths.tolist()):
            mask[s, :n + 1] = True
        return lengths.to(torch.int32), mask

    def with_less_than(lengths, max_len):
        return lengths + 0, torch.arange(max_len).unsqueeze(0) < (lengths + 1).unsqueeze(1)

    def as_a_list(lengths, max_len):
        return [lengths, torch.arange(max_len)[None, :].le(lengths[:, None])]

    for fn in (with_int32_and_a_loop, with_less_than, as_a_list):
        check_slot_step(fn)
    assert capsys.readouterr().out.count("✓ Exercise 7.1: all 6 cases pass") == 3


def _right_mask(l, m):
    return torch.arange(m) <= l[:, None]


@pytest.mark.parametrize("wrong, hint", [
    (lambda l, m: (l.max().expand_as(l), _right_mask(l, m)), "the shared-position bug"),
    (lambda l, m: (torch.full_like(l, int(l.max())), _right_mask(l, m)), "every row got the same position"),
    (lambda l, m: (l - 1, _right_mask(l, m)), "positions are off by one"),
    (lambda l, m: (l + 1, _right_mask(l, m)), "positions are off by one"),
    (lambda l, m: (torch.arange(len(l)), _right_mask(l, m)), "those are the row numbers"),
    (lambda l, m: (l, torch.arange(m) < l[:, None]), "the new token does not see itself"),
    (lambda l, m: (l, torch.ones(len(l), m, dtype=torch.bool)), "positions it has not reached"),
    (lambda l, m: (l, (torch.arange(m) <= l.max()).expand(len(l), m)), "every row got the same mask"),
    (lambda l, m: (l, torch.arange(m) == l[:, None]), "the new token sees only itself"),
    (lambda l, m: (l, torch.arange(m) <= l[:, None] + 1), "one index too many"),
    (lambda l, m: (l, torch.arange(m) > l[:, None]), "the mask is inverted"),
])
def test_typical_slot_step_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed, match="Exercise 7.1: case 1 of 6") as info:
        check_slot_step(wrong)
    assert hint in str(info.value)


def test_a_mask_that_ignores_the_lengths_names_the_stale_keys():
    with pytest.raises(CheckFailed) as info:
        check_slot_step(lambda l, m: (l, torch.ones(len(l), m, dtype=torch.bool)))
    assert "the mask ignores the lengths" in str(info.value) and "an earlier, longer text" in str(info.value)


@pytest.mark.parametrize("wrong, message", [
    (lambda l, m: (l.float(), _right_mask(l, m)), "positions must hold integers"),
    (lambda l, m: (l[:, None], _right_mask(l, m)), r"positions should have shape \(3,\)"),
    (lambda l, m: (l.tolist(), _right_mask(l, m)), "positions should be a tensor"),
    (lambda l, m: (l, _right_mask(l, m).int()), "mask must be a torch.bool tensor"),
    (lambda l, m: (l, _right_mask(l, m).float()), "mask must be a torch.bool tensor"),
    (lambda l, m: (l, _right_mask(l, m)[:, None, None]), r"kvlib.attention.visible has shape \(batch, 1, q_len, k_len\)"),
    (lambda l, m: (l, torch.arange(m) <= l.max()), "the mask needs one row per batch row"),
    (lambda l, m: (l, _right_mask(l, m).T), r"mask should have shape \(3, 10\)"),
    (lambda l, m: l, r"expected two results \(positions, mask\)"),
])
def test_wrong_types_and_shapes_are_told_clearly(wrong, message):
    with pytest.raises(CheckFailed, match=message):
        check_slot_step(wrong)


def test_an_unknown_slip_gets_the_first_mismatch_and_the_general_hint():
    with pytest.raises(CheckFailed, match=r"Exercise 7.1: case 1 of 6 .* is wrong: result 0: expected \[3, 7, 1\], "
                                          r"got \[6, 14, 2\](.|\n)*hint: positions: each row's own length"):
        check_slot_step(lambda l, m: (l * 2, torch.arange(m) <= 2 * l[:, None]))


# -------------------------------------------------------------------------- 7.2, levels_off_at

def test_levels_off_at_as_the_statement_says():
    assert levels_off_at([1, 2, 4, 8], [10.0, 19.0, 23.0, 26.0]) == 2          # the statement's example
    assert levels_off_at([1, 2, 4, 8, 16, 32], [12.5, 15.5, 25.7, 57.0, 105.1, 122.2]) == 16   # a dip at batch 2
    assert levels_off_at([1, 2, 4], [1.0, 2.0, 4.0]) == 4                      # never stops rising: the largest
    assert levels_off_at([1, 2, 4], [3.0, 3.0, 3.0]) == 1                      # flat: the first


def test_other_correct_levels_off_at_pass(capsys):
    def walking_back(batches, tokens_per_s, gain=1.25):
        at = batches[-1]
        for i in range(len(batches) - 2, -1, -1):
            if tokens_per_s[i + 1] / tokens_per_s[i] >= gain:
                break
            at = batches[i]
        return at

    def sorting_first(batches, tokens_per_s, gain=1.25):
        pairs = sorted(zip(batches, tokens_per_s))
        b, t = [p[0] for p in pairs], [p[1] for p in pairs]
        last = max((i for i in range(len(b) - 1) if t[i + 1] >= gain * t[i]), default=-1)
        return b[last + 1]

    def with_numpy(batches, tokens_per_s, gain=1.25):
        import numpy as np
        t = np.asarray(tokens_per_s)
        up = np.nonzero(t[1:] >= gain * t[:-1])[0]
        return int(batches[up[-1] + 1]) if len(up) else int(batches[0])

    for fn in (walking_back, sorting_first, with_numpy):
        check_levels_off_at(fn)
    assert capsys.readouterr().out.count("✓ Exercise 7.2: all 10 cases pass") == 3


def _first_stall(batches, tokens_per_s, gain=1.25):
    for b, this, nxt in zip(batches, tokens_per_s, tokens_per_s[1:]):
        if nxt < gain * this:
            return b
    return batches[-1]


def _next_batch(batches, tokens_per_s, gain=1.25):
    i = batches.index(levels_off_at(batches, tokens_per_s, gain))
    return batches[min(i + 1, len(batches) - 1)]


def _difference(batches, tokens_per_s, gain=1.25):
    rises = [i for i in range(len(batches) - 1) if tokens_per_s[i + 1] - tokens_per_s[i] >= gain]
    return batches[rises[-1] + 1] if rises else batches[0]


def _difference_first_stall(batches, tokens_per_s, gain=1.25):
    for b, this, nxt in zip(batches, tokens_per_s, tokens_per_s[1:]):
        if nxt - this < gain:
            return b
    return batches[-1]


def _highest(batches, tokens_per_s, gain=1.25):
    return batches[max(range(len(batches)), key=lambda i: tokens_per_s[i])]


def _index(batches, tokens_per_s, gain=1.25):
    return batches.index(levels_off_at(batches, tokens_per_s, gain))


@pytest.mark.parametrize("wrong, hint", [
    (_next_batch, "that is the batch after the level-off"),
    (_first_stall, "throughput rose again after that stall"),
    (_difference, "compare a ratio, not a difference"),
    (_difference_first_stall, "compare a ratio, not a difference"),
    (_highest, "that is the batch with the highest throughput"),
    (_index, "that is a position in the list"),
])
def test_typical_levels_off_mistakes_get_their_hint(wrong, hint):
    with pytest.raises(CheckFailed, match="Exercise 7.2: case .* is wrong") as info:
        check_levels_off_at(wrong)
    assert hint in str(info.value)


def test_ignoring_gain_fails():
    with pytest.raises(CheckFailed, match=r"gain=1.5.* is wrong: expected 8, got 16"):
        check_levels_off_at(lambda b, t, gain=1.25: levels_off_at(b, t))


def test_a_function_without_gain_shows_its_error():
    with pytest.raises(CheckFailed, match="raised TypeError"):
        check_levels_off_at(lambda batches, tokens_per_s: levels_off_at(batches, tokens_per_s))


def test_a_function_that_changes_its_lists_does_not_change_the_cases(capsys):
    def destructive(batches, tokens_per_s, gain=1.25):
        answer = levels_off_at(batches, tokens_per_s, gain)
        batches.clear()
        tokens_per_s.reverse()
        return answer

    check_levels_off_at(destructive)
    assert "✓ Exercise 7.2: all 10 cases pass" in capsys.readouterr().out


# ------------------------------------------------------------------------ 7.2, the explanation

def test_the_right_explanation_passes_in_any_case(capsys):
    check_knee_explanation(lambda: " B ")
    check_knee_explanation("b")
    assert capsys.readouterr().out.count("(b) is right.") == 2


@pytest.mark.parametrize("letter, why", [("a", "doubles"), ("c", "stays where it was"), ("d", "larger batch")])
def test_wrong_explanations_are_told_why(letter, why):
    with pytest.raises(CheckFailed, match=rf"\({letter}\) is not it\. ") as info:
        check_knee_explanation(lambda: letter)
    assert KNEE_CHOICES[letter][1] in str(info.value) and why in str(info.value)


@pytest.mark.parametrize("answer, message", [(None, "choose one of"), ("e", "should be one of"),
                                             (2, "should be one of")])
def test_unanswered_or_unknown_explanations_are_refused(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_knee_explanation(lambda: answer)


def test_the_explanations_agree_with_the_roofline():
    def knee(weight_bytes, bandwidth, flops_per_token, flops_per_s):
        return weight_bytes / bandwidth * flops_per_s / flops_per_token

    base = knee(538e6, 20e9, 270e6, 100e9)
    changed = {"a": knee(538e6, 20e9, 270e6, 200e9), "b": knee(538e6 / 8, 20e9, 270e6, 100e9),
               "c": knee(2 * 538e6, 20e9, 2 * 270e6, 100e9), "d": knee(538e6, 10e9, 270e6, 100e9)}
    smaller = {k for k, v in changed.items() if v < base * (1 - 1e-9)}
    assert smaller == {k for k, (right, _) in KNEE_CHOICES.items() if right} == {"b"}


# ---------------------------------------------------------------------- 7.3, counting the waste

def test_the_counts_are_what_serve_does():
    runs = waste_runs()
    for r in runs.values():
        assert [len(o) for o in r.outputs] == list(WASTE_ANSWERS)
    for name, steps, first7 in (("static", 40, 21), ("continuous", 24, 5)):
        r = runs[name]
        assert r.steps == steps and r.row_steps == WASTE_SLOTS * steps
        assert r.useful_row_steps == sum(WASTE_ANSWERS) == 52          # a prefill slot-step writes the first token
        assert sum(kind == "prefill" for s in r.timeline for _, kind, _ in s.work) == 8
        assert next(k + 1 for k, s in enumerate(r.timeline) if any(i == 7 for i, _, _ in s.work)) == first7


def test_waste_runs_leaves_the_global_random_state_alone():
    torch.manual_seed(123)
    before = torch.rand(3)
    torch.manual_seed(123)
    waste_runs()
    assert torch.equal(torch.rand(3), before)


def test_other_forms_of_a_right_prediction_pass(capsys):
    check_predicted_steps(lambda: [40.0, 24.0])
    check_predicted_steps((40, 24))                          # a plain tuple, not a function
    check_predicted_useful_share(lambda: (52 / 160, 52 / 96))
    check_predicted_useful_share(lambda: [0.33, 0.53])        # within 3 %
    out = capsys.readouterr().out
    assert out.count("serve took exactly 40 and 24") == 2
    assert out.count("✓ Exercise 7.3: you predicted") == 6


@pytest.mark.parametrize("steps, hint", [
    ((20, 24), "that is one batch only"),
    ((22, 24), "each batch of four holds one 20-token answer"),
    ((42, 24), "not one more (2 × 20, not 2 × 21)"),
    ((52, 24), "that is the number of tokens written"),
    ((40, 13), "as if one request could use several slots"),
    ((40, 40), "requests 4, 5 and 6 start at step 3, not after the whole first batch"),
    ((40, 20), "request 7 cannot start at step 1"),
    ((40, 22), "request 7 waits longer"),
    ((40, 23), "off by one"),
    ((40, 25), "off by one"),
    ((41, 24), "an answer of n tokens takes n steps"),          # none of them: the general hint
    ((40, 30), "a slot is refilled at the step after its request is done"),
])
def test_wrong_step_predictions_are_told_why(steps, hint):
    with pytest.raises(CheckFailed, match=r"Exercise 7.3: you predicted \d+ steps for (static|continuous) batching, "
                                          r"but serve took \d+: too (many|few)") as info:
        check_predicted_steps(lambda: steps)
    assert hint in str(info.value)


def test_swapped_predictions_are_named():
    with pytest.raises(CheckFailed, match="the other way round. Return \\(static, continuous\\)"):
        check_predicted_steps(lambda: (24, 40))


@pytest.mark.parametrize("answer, message", [
    (None, "write your prediction of the number of steps first"),
    (..., "write your prediction of the number of steps first"),
    (40, r"return two numbers, \(static, continuous\)"),
    ((40, 24, 13), r"return two numbers, \(static, continuous\)"),
    ((40, None), "write your prediction for continuous batching first"),
    (("40", 24), "should be a number"),
    ((True, 24), "should be a number"),
])
def test_malformed_step_predictions_are_refused(answer, message):
    with pytest.raises(CheckFailed, match=message):
        check_predicted_steps(lambda: answer)


@pytest.mark.parametrize("shares", [(0.325 * 1.0299, 52 / 96), (0.325 * 0.9701, 52 / 96),
                                    (0.325, 52 / 96 * 1.0299), (0.325, 52 / 96 * 0.9701)])
def test_shares_within_3_percent_pass(shares, capsys):
    check_predicted_useful_share(lambda: shares)
    assert capsys.readouterr().out.count("(within 3 %)") == 2


@pytest.mark.parametrize("shares, hint", [
    ((0.325 * 1.035, 0.5417), "useful slot-steps are one per token written"),
    ((0.325, 52 / 96 * 0.965), "useful slot-steps are one per token written"),
    ((44 / 160, 52 / 96), "its slot-step is useful too: 52, not 44"),
    ((0.325, 44 / 96), "its slot-step is useful too: 52, not 44"),
    ((32.5, 54.2), "not a percentage"),
    ((0.325, 54), "not a percentage"),
    ((1.3, 2.2), "steps × 4 slots"),
])
def test_wrong_shares_are_told_why(shares, hint):
    with pytest.raises(CheckFailed, match=r"Exercise 7.3: you predicted .* too (high|low)") as info:
        check_predicted_useful_share(lambda: shares)
    assert hint in str(info.value)


def test_malformed_share_predictions_are_refused():
    with pytest.raises(CheckFailed, match="write your prediction of the share of useful slot-steps first"):
        check_predicted_useful_share(lambda: None)
    with pytest.raises(CheckFailed, match=r"return two numbers"):
        check_predicted_useful_share(lambda: 0.5)
    with pytest.raises(CheckFailed, match="raised ZeroDivisionError"):
        check_predicted_useful_share(lambda: 1 / 0)
