"""Kernels chosen by measurement (kvlib.fast.choose): the rule, the file it is kept in, and that
whatever is chosen, the fast path writes the model's own greedy tokens."""
from __future__ import annotations

import json
from dataclasses import asdict

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib import Config, Decoder, generate
from kvlib.fast import DenseFrom, KernelChoice, Q8_0Linear, apply_choice, fuse, kernel_choice
from kvlib.fast import kernels
from kvlib.fast.choose import (DENSE_KERNELS, DENSE_MARGIN, LAYER_KERNELS, OUTPUT_MARGIN, choice_path, choose, dense_against_kernels,
                               dense_candidates, measure_kernels)
from kvlib.quant import Int4Linear, quantize
from kvlib import generate_batch

CFG = Config(vocab_size=97, d_model=128, n_layers=2, n_heads=4, n_kv_heads=2, d_mlp=128, max_seq_len=64)
OURS = kernels.kernels_missing() is None          # kvlib's own kernels built here (a C++ compiler)


@pytest.fixture(scope="module")
def native():
    torch.manual_seed(0)
    return quantize(Decoder(CFG).eval(), "int4")


def _layers(int4: dict[int, float], dense: dict[int, float], f32: dict[int, float] | None = None,
            q4_1: dict[int, float] | None = None) -> dict[str, dict[str, float]]:
    f32 = f32 or {b: 100.0 for b in int4}                     # float32 slow unless the test says otherwise
    q4_1 = q4_1 or {b: 100.0 for b in int4}                   # kvlib's kernel slow unless the test says otherwise
    return {str(b): {"int4": int4[b], "q4_1": q4_1[b], "dense bfloat16": dense[b], "dense float32": f32[b]}
            for b in int4}


def test_another_output_layer_only_when_clearly_faster():
    layers = _layers({1: 1.0}, {1: 2.0})
    assert choose({"tied": 3.0, "int8": 1.3, "q8_0": 2.0}, layers).output_layer == "int8"
    assert choose({"tied": 3.0, "int8": 1.3, "q8_0": 1.0}, layers).output_layer == "q8_0"
    assert choose({"tied": 3.0, "int8": 3.0 * OUTPUT_MARGIN + 0.01}, layers).output_layer == "tied"
    assert choose({"tied": 1.0, "int8": 2.0, "q8_0": 2.0}, layers).output_layer == "tied"


@settings(max_examples=60, deadline=None)
@given(st.floats(0.1, 10.0), st.floats(0.1, 10.0))
def test_the_packed_kernel_is_the_faster_at_one_row(int4, q4_1):
    choice = choose({"tied": 1.0}, _layers({1: int4, 8: 5.0}, {1: 100.0, 8: 100.0}, q4_1={1: q4_1, 8: 1.0}))
    assert choice.layer_kernel == ("q4_1" if q4_1 < int4 else "int4")
    assert choose({"tied": 1.0}, {"1": {"int4": int4}}).layer_kernel == "int4"      # where kvlib's kernel is missing


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3), st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3),
       st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3))
def test_dense_from_is_where_dense_wins_over_the_chosen_kernel_from_there_on(int4, q4_1, dense):
    sizes = [1, 8, 32]
    choice = choose({"tied": 1.0}, _layers(dict(zip(sizes, int4)), dict(zip(sizes, dense)),
                                           q4_1=dict(zip(sizes, q4_1))))
    packed = int4 if choice.layer_kernel == "int4" else q4_1
    wins = [d < DENSE_MARGIN * p for p, d in zip(packed, dense)]
    if choice.dense_from is None:
        assert not any(all(wins[k:]) for k in range(3))
    else:
        k = sizes.index(choice.dense_from)
        assert all(wins[k:]) and (k == 0 or not all(wins[k - 1:]))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3), st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3),
       st.lists(st.floats(0.1, 10.0), min_size=3, max_size=3))
def test_the_dense_product_is_the_faster_dtype_at_the_largest_batch(int4, bf16, f32):
    """An AVX2-only CPU converts bfloat16 before multiplying, so there a float32 product of the
    dequantized weights can beat both the int4 kernel and a bfloat16 product: the dense dtype is
    the one faster at 32 rows, and dense_from is judged against that one."""
    sizes = [1, 8, 32]
    choice = choose({"tied": 1.0}, _layers(dict(zip(sizes, int4)), dict(zip(sizes, bf16)), dict(zip(sizes, f32))))
    dense = choice.dense_kernel
    assert dense == ("dense float32" if f32[2] < bf16[2] else "dense bfloat16")
    times = f32 if dense == "dense float32" else bf16
    wins = [d < DENSE_MARGIN * i for i, d in zip(int4, times)]
    first = next((sizes[k] for k in range(3) if all(wins[k:])), None)
    assert choice.dense_from == first


def test_a_packed_output_layer_leaves_its_kernel_where_dense_wins():
    """Its kernel pays off for one row; from the batch size where its dense weight wins (by the 4-bit
    layers' rule) it takes that. Only for int8 and Q8_0: the tied layer is dense already."""
    layers = _layers({1: 1.0}, {1: 2.0})
    rows = {"8": {"int8": 3.4, "q8_0": 3.5, "dense bfloat16": 2.8, "dense float32": 5.0},
            "32": {"int8": 13.7, "q8_0": 9.0, "dense bfloat16": 4.1, "dense float32": 6.0}}
    assert choose({"tied": 3.0, "int8": 1.0}, layers, "", rows).output_dense_from == 8
    rows["8"]["dense bfloat16"] = 3.3                     # not a clear win at 8: from 32
    assert choose({"tied": 3.0, "int8": 1.0}, layers, "", rows).output_dense_from == 32
    assert choose({"tied": 1.0, "int8": 1.0}, layers, "", rows).output_dense_from is None
    assert choose({"tied": 3.0, "int8": 2.0, "q8_0": 1.0}, layers, "", rows).output_dense_from == 32    # q8_0's own
    rows["8"]["q8_0"] = 9.0                               # judged against q8_0's time, not int8's
    assert choose({"tied": 3.0, "int8": 2.0, "q8_0": 1.0}, layers, "", rows).output_dense_from == 8
    rows["32"]["dense float32"] = 3.0                     # float32 faster at 32 rows: its product, from 32
    chosen = choose({"tied": 3.0, "int8": 1.0}, layers, "", rows)
    assert (chosen.output_dense_kernel, chosen.output_dense_from) == ("dense float32", 32)


def test_output_layers_are_timed_in_a_whole_decode_step(native):
    """Each output layer is timed inside a cached one-token step of the model (alone, a layer can
    sit in the processor's caches), and the model's own output layer is put back afterwards."""
    fast = fuse(native)
    seen = []

    def timer(fn):
        blocks: list[int] = []
        hook = fast.blocks[0].register_forward_pre_hook(lambda module, args: blocks.append(args[0].shape[1]))
        fn()
        hook.remove()
        seen.append((type(fast.lm_head).__name__, blocks))
        return 1e-3

    measure_kernels(fast, batch_sizes=(1,), timer=timer)
    in_steps = {name for name, blocks in seen if blocks == [1]}             # one token through the model
    assert in_steps == {"TiedHead", "Int8Linear"} | ({"Q8_0Linear"} if OURS else set())
    assert fast.lm_head is None


def _forward_calls(layers: list, fn) -> int:
    """Run ``fn`` and count the forward calls of ``layers`` in it (a packed kernel runs them; a dense
    product of their dequantized weights does not)."""
    seen: list[int] = []
    hooks = [m.register_forward_hook(lambda *_: seen.append(1)) for m in layers]
    try:
        fn()
    finally:
        for h in hooks:
            h.remove()
    return len(seen)


def test_measurement_names_every_candidate(native):
    """One timing per candidate and batch size; the 4-bit layers' timing runs every 4-bit layer of
    the model once (alone, one layer's weights stay in the caches, as they do not in a step)."""
    fast = fuse(native)
    layers = [m for m in fast.modules() if isinstance(m, Int4Linear)]
    runs = []

    def timer(fn):
        runs.append(_forward_calls(layers, fn))
        return 1e-3

    output_ms, layers_ms, output_rows_ms = measure_kernels(fast, batch_sizes=(1, 4), timer=timer)
    ours = ["q4_1"] if OURS else []
    assert output_ms == {"tied": 1.0, "int8": 1.0, **({"q8_0": 1.0} if OURS else {})}
    dense = {name: 1.0 for name in dense_candidates()}
    # every candidate at the largest size; no dense product faster there, so only the packed kernels at 1
    assert layers_ms == {"1": {"int4": 1.0, **{k: 1.0 for k in ours}}, "4": {"int4": 1.0, **{k: 1.0 for k in ours}, **dense}}
    assert output_rows_ms == {"4": {"int8": 1.0, **({"q8_0": 1.0} if OURS else {}), **dense}}   # one row: the step's
    # every layer once: the decode steps (each output layer, twice) and the int4 kernel at 1 and 4 rows
    assert runs.count(len(layers)) == 2 * len(output_ms) + 2 and len(layers) == 4 * CFG.n_layers


def test_smaller_batches_time_only_the_dense_product_that_won_the_largest(native, monkeypatch):
    """From the largest batch size down: all dense candidates there, then only the faster one, for
    as long as it beats the packed kernel (here always: the fake timer makes every dense product
    twice as fast as the int4 kernel, so they tie and the first is kept)."""
    monkeypatch.setattr("kvlib.fast.choose.bfloat16_is_fast", lambda device: True)     # both dtypes candidates
    layers = [m for m in fuse(native).modules() if isinstance(m, Int4Linear)]

    def timer(fn):
        return 2e-3 if _forward_calls(layers, fn) else 1e-3       # the int4 kernel runs the layers' forward

    ms = dense_against_kernels({"int4": layers}, [layer.dequantized() for layer in layers], (1, 8, 32), timer)
    assert list(ms) == ["1", "8", "32"] and set(ms["32"]) == {"int4", *DENSE_KERNELS}
    assert set(ms["8"]) == set(ms["1"]) == {"int4", "dense bfloat16"}
    assert choose({"tied": 1.0}, ms).dense_from == 1


def test_no_bfloat16_candidate_where_the_cpu_has_no_bfloat16_arithmetic(monkeypatch):
    monkeypatch.setenv("KVLIB_CPU_BFLOAT16", "0")
    assert dense_candidates() == ["dense float32"]
    monkeypatch.setenv("KVLIB_CPU_BFLOAT16", "1")
    assert dense_candidates() == ["dense bfloat16", "dense float32"]


def test_choice_is_kept_per_machine_and_measured_once(native, monkeypatch, tmp_path):
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    calls = []

    def timer(fn):
        calls.append(1)
        fn()
        return 1e-3

    fast = fuse(native)
    first = kernel_choice(fast, timer=timer)
    n = len(calls)
    assert n > 0 and choice_path().exists()
    assert kernel_choice(fast, timer=timer) == first and len(calls) == n          # read back, not measured
    kept = json.loads(choice_path().read_text())
    assert list(kept) == [first.machine] and "threads" in first.machine
    kernel_choice(fast, refresh=True, timer=timer)
    assert len(calls) == 2 * n


CHOICES = [KernelChoice("tied", "int4", None), KernelChoice("tied", "int4", 1),
           KernelChoice("tied", "int4", 4, "dense bfloat16"), KernelChoice("int8", "int4", 4),
           KernelChoice("int8", "int4", None, output_dense_from=4, output_dense_kernel="dense bfloat16")]
OUR_CHOICES = [KernelChoice("tied", "q4_1", None), KernelChoice("q8_0", "q4_1", 4),
               KernelChoice("q8_0", "int4", None, output_dense_from=4)]


@pytest.mark.parametrize("choice", CHOICES + (OUR_CHOICES if OURS else []))
def test_every_choice_writes_its_formats_tokens(native, choice):
    """Batch 1 and 6: each packed kernel, the dense weight (from 1 or 4 rows on), each output layer.
    The tied and dense choices compute what the native model computes (up to rounding): the same
    greedy tokens. An int8 or Q8_0 output layer rounds the embedding again: compared with the same
    format eager (``fuse`` with its int8 output layer, or the Q8_0 layer put in by hand). kvlib's
    kernels also round the activations to 8 bits, and a dense weight is the blocks' exact values
    where PyTorch's kernel rounds their scales to bfloat16: their logits move more, up to near-ties."""
    fast = apply_choice(fuse(native), choice)
    layers = [m for m in fast.modules() if isinstance(m, Int4Linear)]
    packed = [m.kernel.kernel if isinstance(m.kernel, DenseFrom) else m.kernel for m in layers]
    assert len(layers) == 4 * CFG.n_layers and all(k is LAYER_KERNELS[choice.layer_kernel] for k in packed)
    if choice.output_dense_from is not None:           # 6 rows at once take the dense weight, 1 row the kernel
        assert fast.lm_head.dense.dtype == DENSE_KERNELS[choice.output_dense_kernel]
    if choice.dense_from is not None:                  # the dense weight built beforehand, in the chosen dtype
        assert {m.dense.dtype for m in layers} == {DENSE_KERNELS[choice.dense_kernel]}
    reference = native if choice.output_layer == "tied" else fuse(native, int8_output_layer=True)
    if choice.output_layer == "q8_0":
        reference.lm_head = Q8_0Linear(native.embed.weight.float())
    # PyTorch's int4 kernel multiplies by the blocks' scales and zeros rounded to bfloat16, a dense
    # weight by their exact values: a dense choice moves the logits about as much as kvlib's kernels do
    moved = choice.layer_kernel == "q4_1" or choice.output_layer == "q8_0" or choice.dense_from is not None
    rel = 0.08 if moved else 0.03
    prompts = [[(7 * i + j) % 97 for j in range(5 + i)] for i in range(6)]
    _same_or_tie(generate(fast, prompts[0], 12, keep_logits=True), generate(reference, prompts[0], 12, keep_logits=True),
                 rel)
    for a, b in zip(generate_batch(fast, prompts, 8, keep_logits=True),
                    generate_batch(reference, prompts, 8, keep_logits=True)):
        _same_or_tie(a, b, rel)


def test_a_choice_that_needs_kvlibs_kernels_says_so_where_they_are_missing(native, monkeypatch):
    monkeypatch.setattr(kernels, "load", lambda: False)
    monkeypatch.setattr(kernels, "kernels_missing", lambda: "no C++ compiler (a test)")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler \\(a test\\).*refresh=True"):
        apply_choice(fuse(native), KernelChoice("q8_0", "int4", None))


def _same_or_tie(fast, reference, rel: float = 0.03):
    """The same greedy tokens, or a first difference at a tie: where the reference's best two
    logits lie closer than twice the two paths' largest difference there (another kernel's
    rounding may order them either way). Until then the logits agree to ``rel`` of the largest
    (bfloat16 rounding through the layers, a few of its steps; a wrong weight moves them by ~1)."""
    part = next((i for i, (a, b) in enumerate(zip(fast, reference)) if a != b), None)
    upto = len(reference) if part is None else part + 1
    diff = (fast.logits[:upto] - reference.logits[:upto]).abs()
    assert diff.max() <= rel * reference.logits[:upto].abs().max()
    if part is not None:
        best_two = reference.logits[part].topk(2).values
        assert best_two[0] - best_two[1] <= 2 * diff[part].max(), f"parted at token {part}, not at a tie"


@pytest.mark.parametrize("text", ["{not json", '{"a key": {"output_layer": "tied"}}', "[]"])
def test_a_corrupt_choice_file_is_measured_again_with_a_warning(native, monkeypatch, tmp_path, text):
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path))
    choice_path().parent.mkdir(parents=True)
    choice_path().write_text(text)
    fast = fuse(native)
    with pytest.warns(UserWarning, match="ignores its kernel choices"):
        choice = kernel_choice(fast, timer=lambda fn: 1e-3)
    assert json.loads(choice_path().read_text()) == {choice.machine: asdict(choice)}   # written whole, anew


def test_a_choice_file_that_cannot_be_written_warns_and_the_choice_holds(native, monkeypatch, tmp_path):
    (tmp_path / "a-file").write_text("")
    monkeypatch.setenv("KVLIB_CACHE_DIR", str(tmp_path / "a-file"))
    with pytest.warns(UserWarning, match="could not keep its kernel choice"):
        choice = kernel_choice(fuse(native), timer=lambda fn: 1e-3)
    assert isinstance(choice, KernelChoice)


def _tensor_bytes(module) -> int:
    return sum(t.numel() * t.element_size() for t in [*module.parameters(), *module.buffers()])


@pytest.mark.parametrize("choice", CHOICES + (OUR_CHOICES if OURS else []))
def test_the_fast_models_bytes_are_what_one_row_reads(native, choice):
    """Each 4-bit matrix counted once, in the kernel one row uses (a dense copy for many rows is
    not read by a decode step): 5 bits a weight, whether kvlib's kernel reads the Q4_1 blocks or
    PyTorch's its own packing of them; the output layer's own, and the embedding's one row where the
    output layer is not the embedding: a broken count that added the dense copies read
    several times these bytes."""
    fast = apply_choice(fuse(native), choice)
    expected = sum(m.in_features * m.out_features * 5 // 8 for m in fast.modules() if isinstance(m, Int4Linear))
    expected += sum(_tensor_bytes(m) for b in fast.blocks for m in b.modules() if isinstance(m, torch.nn.RMSNorm)
                    or type(m).__name__ == "RMSNorm") + _tensor_bytes(fast.norm)
    table = fast.embed.weight
    if choice.output_layer == "tied":
        expected += table.numel() * table.element_size()
    else:
        vocab, width = table.shape                     # int8: a byte a weight and a bf16 scale a row; Q8_0: 34 bytes per 32
        head = vocab * width + 2 * vocab if choice.output_layer == "int8" else vocab * width // 32 * 34
        expected += head + width * table.element_size()
    assert fast.weight_bytes() == expected
    assert fast.weight_bytes() <= native.weight_bytes() * (1.05 if choice.output_layer == "tied" else 1.0)


def test_the_floor_runs_every_matrix_once(native):
    """weight_read_floor calls each layer once a pass and the output layer once (a broken walk ran
    each switch's kernel again inside it, and the head three times)."""
    from collections import Counter

    from kvlib.measure.hardware import weight_read_floor

    fast = apply_choice(fuse(native), KernelChoice("int8", "int4", 4))
    calls = Counter()
    handles = [m.register_forward_hook(lambda mod, args, out: calls.update([id(mod)]))
               for m in fast.modules() if hasattr(m, "in_features")]
    weight_read_floor(fast, repeats=1)
    for h in handles:
        h.remove()
    layers = [m for m in fast.modules() if isinstance(m, Int4Linear)]
    passes = calls[id(fast.lm_head)]
    assert passes >= 1 and len(layers) == 4 * CFG.n_layers and all(calls[id(m)] == passes for m in layers)
