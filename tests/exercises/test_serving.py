"""The checks of section 12 (12.1 the help desk's prompt tokens, 12.2 a knob under its vLLM name,
12.3 what a split step moves): the references pass, and agree with kvlib's engine and formulas;
stubs and the usual slips fail with the message that names them; kvlib's own code is refused."""
from __future__ import annotations

import pytest
import torch

import kvlib
from kvlib.exercises import CheckFailed
from kvlib.exercises.serving import (PARALLEL_CASE, check_batch_knob, check_first_wave_explanation,
                                     check_help_desk_computed, check_parallel_bytes, check_steps_with_four,
                                     help_desk_reference, steps_reference)
from kvlib.measure.scale_out import pipeline_parallel_bytes, tensor_parallel_bytes
from kvlib.serve import Engine, Request


@pytest.fixture(scope="module")
def streams():
    from kvlib.bench import serving_peer

    _, tokenizer = kvlib.load_smollm2()
    return serving_peer.streams(tokenizer)


def _engine_model() -> torch.nn.Module:
    """A tiny random model with the real vocabulary: the engine's counts do not depend on the weights."""
    torch.manual_seed(0)
    return kvlib.Decoder(kvlib.Config(vocab_size=49_152, d_model=16, n_layers=1, n_heads=2, n_kv_heads=1, d_mlp=16,
                                      max_seq_len=512)).eval()


def _stub():
    raise NotImplementedError("Exercise 12: write me")


@pytest.mark.slow
@pytest.mark.parametrize("block_size, new_tokens", [(32, 2), (16, 1)])
def test_the_help_desk_reference_is_what_the_engine_computes(streams, capsys, block_size, new_tokens):
    """Blocks of 32 are the stored run's (the page's table prints that count); the exercise asks for
    blocks of 16, and the page's experiment serves one new token each."""
    desk = streams[1]
    engine = Engine(_engine_model(), max_batch=desk.max_batch, block_size=block_size, prefill_chunk=4096,
                    prefix_caching=True)
    with torch.no_grad():
        report = engine.serve([Request(p, new_tokens) for p in desk.prompts])
    assert report.prefill_tokens == help_desk_reference(desk.prompts, block_size)
    check_help_desk_computed(lambda: report.prefill_tokens, desk, block_size=block_size)
    check_first_wave_explanation(lambda: "a")
    assert capsys.readouterr().out.count("✓") == 2


@pytest.mark.slow
def test_the_exercise_asks_for_a_count_the_page_does_not_print(streams):
    """The table under *Both engines' reports* prints the count for blocks of 32; the exercise's
    blocks of 16 give another."""
    desk = streams[1]
    assert help_desk_reference(desk.prompts, 16) != help_desk_reference(desk.prompts, 32)
    with pytest.raises(CheckFailed):
        check_help_desk_computed(lambda: help_desk_reference(desk.prompts, 32), desk, block_size=16)


@pytest.mark.slow
def test_the_help_desk_slips_are_named(streams):
    desk = streams[1]
    whole = sum(len(p) for p in desk.prompts)
    with pytest.raises(CheckFailed, match="the first wave's 8 requests do not each compute"):
        check_help_desk_computed(lambda: whole - 8 * 192, desk)
    with pytest.raises(CheckFailed, match="only whole blocks are cached"):
        check_help_desk_computed(lambda: whole - 15 * 210, desk)
    with pytest.raises(CheckFailed, match="write your prediction|not written yet"):
        check_help_desk_computed(_stub, desk)
    with pytest.raises(CheckFailed, match="the first wave's 8 requests do not each compute"):
        check_help_desk_computed(lambda: whole - 8 * 208, desk, block_size=16)
    with pytest.raises(CheckFailed, match="only whole blocks are cached"):
        check_help_desk_computed(lambda: whole - 15 * 210, desk, block_size=16)


def test_the_engine_is_refused_as_the_answer():
    def by_running_it():
        return Engine(None).serve([]).prefill_tokens

    with pytest.raises(CheckFailed, match="kvlib's `Engine`"):
        check_help_desk_computed(by_running_it, None)
    with pytest.raises(CheckFailed, match="kvlib's `tensor_parallel_bytes`"):
        check_parallel_bytes(lambda: (tensor_parallel_bytes(None, 1, 1), 0))


def test_the_steps_reference_is_what_the_engine_counts():
    model = _engine_model()
    prompts = [[1] * n for n in (24, 30, 34, 28, 25, 31, 26, 33)]              # unequal prompts, as the chat stream's
    engine = Engine(model, max_batch=4, block_size=32, prefill_chunk=4096)
    with torch.no_grad():
        report = engine.serve([Request(p, 6) for p in prompts])
    assert report.steps == steps_reference(8, 6, 4) == 12


def test_the_knob_and_the_steps(capsys):
    check_batch_knob(lambda: "a")
    check_steps_with_four(lambda: 256)
    assert capsys.readouterr().out.count("✓") == 2
    with pytest.raises(CheckFailed, match="prefill_chunk is vLLM's max_num_batched_tokens"):
        check_batch_knob(lambda: "b")
    for wrong, why in ((248, "also writes its first token"), (32, "come in 8 waves"), (1024, "one token for every")):
        with pytest.raises(CheckFailed, match=why):
            check_steps_with_four(lambda: wrong)


def test_the_parallel_bytes_agree_with_kvlibs_formulas(capsys):
    c = PARALLEL_CASE
    shape = kvlib.Config(vocab_size=8, d_model=c["d_model"], n_layers=c["n_layers"], n_heads=40, n_kv_heads=8,
                         d_mlp=8, max_seq_len=8)
    tensor = tensor_parallel_bytes(shape, c["rows"], c["devices"])
    pipeline = pipeline_parallel_bytes(shape, c["rows"], c["stages"])
    assert (tensor, pipeline) == (125_829_120, 1_966_080)
    check_parallel_bytes(lambda: (125_829_120, 1_966_080))
    assert "✓" in capsys.readouterr().out
    for wrong, why in (((tensor / 2, pipeline), "two all-reduces per layer"),
                       ((tensor * 2 / 3, pipeline), "not the tensor once"),
                       ((tensor, pipeline * 4 / 3), "p − 1 boundaries")):
        with pytest.raises(CheckFailed, match=why):
            check_parallel_bytes(lambda: wrong)
    with pytest.raises(CheckFailed, match="return two numbers"):
        check_parallel_bytes(lambda: 125_829_120)
