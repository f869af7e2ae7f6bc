"""Checks for the exercises of *From kvlib to vLLM* (section 12).

- 12.1, the help desk's prompt tokens: a prediction of how many prompt tokens the engine computes
  for the help-desk stream with prefix caching, graded exactly against the count the blocks give
  (kvlib's engine and block keys refused), the usual slips named; then a letter for why the first
  wave already shares;
- 12.2, a knob under its vLLM name: the letter of kvlib's argument for vLLM's ``max_num_seqs``,
  and a prediction of the steps the chat stream then takes, graded exactly, slips named;
- 12.3, what a split step moves: the bytes one GPU sends in a tensor-parallel decode step and
  those crossing a pipeline's boundaries, for a model the page does not compute, within 1 %;
  kvlib's formulas refused.
"""
from __future__ import annotations

import math
import sys
from typing import Any, Sequence

from .framework import CheckFailed, check_choice, check_prediction, refuse_library_answer, student_answer

__all__ = ["check_help_desk_computed", "check_first_wave_explanation", "check_batch_knob", "check_steps_with_four",
           "check_parallel_bytes", "FIRST_WAVE_CHOICES", "BATCH_KNOB_CHOICES", "PARALLEL_CASE",
           "help_desk_reference", "steps_reference"]


def _library() -> dict:
    """kvlib's code that computes these answers: the checks refuse it. (The benchmark's serving
    functions too, where the page has loaded them: the exercises sit below the benchmark's wing
    and never import it.)"""
    from ..measure import scale_out
    from ..serve import BlockManager, Engine, block_keys, serve

    found = {"Engine": Engine, "BlockManager": BlockManager, "block_keys": block_keys, "serve": serve,
             "tensor_parallel_bytes": scale_out.tensor_parallel_bytes,
             "pipeline_parallel_bytes": scale_out.pipeline_parallel_bytes}
    bench = sys.modules.get("kvlib.bench.serving_peer")
    if bench is not None:
        found.update(run_kvlib=bench.run_kvlib, kvlib_server=bench.kvlib_server)
    return found


def _refuse(exercise: str, fn: Any) -> None:
    if callable(fn):
        refuse_library_answer(exercise, fn, _library())


# ---------------------------------------------------------------------------------------
# Exercise 12.1: the help desk's prompt tokens
# ---------------------------------------------------------------------------------------

def _shared(first: Sequence[int], other: Sequence[int]) -> int:
    """How many leading tokens two prompts share."""
    return next((i for i, (a, b) in enumerate(zip(first, other)) if a != b), min(len(first), len(other)))


def help_desk_reference(prompts: Sequence[Sequence[int]], block_size: int) -> int:
    """Reference: the first request computes its whole prompt; every later one takes from the cache
    the whole blocks it shares with it from the start (never its own last token, which must be
    computed to give the first new token), and computes the rest."""
    first, total = prompts[0], len(prompts[0])
    for p in prompts[1:]:
        blocks = min(_shared(first, p) // block_size, (len(p) - 1) // block_size)
        total += len(p) - blocks * block_size
    return total


def _help_desk_mistakes(prompts: Sequence[Sequence[int]], block_size: int, wave: int) -> dict[str, int]:
    whole, n = sum(len(p) for p in prompts), len(prompts)
    shared = _shared(prompts[0], prompts[1])
    blocks = shared // block_size * block_size
    return {
        "the first request finds an empty cache: it computes its whole prompt, the others take the shared blocks.":
            whole - n * blocks,
        f"only whole blocks are cached: the {shared} shared tokens fill {shared // block_size} blocks of "
        f"{block_size}, and the rest of the last one is computed.": whole - (n - 1) * shared,
        f"the first wave's {wave} requests do not each compute the shared prompt: a block is in the cache from the "
        "step that allocates it (see the second part).": whole - (n - wave) * blocks,
        "with prefix caching on, the later requests take the shared blocks from the cache.": whole,
    }


def check_help_desk_computed(fn: Any, stream: Any, block_size: int = 32) -> None:
    """Exercise 12.1: ``fn()`` returns the prompt tokens the engine computes for ``stream`` (the
    help desk: a :class:`kvlib.bench.serving_peer.Stream`) with prefix caching and blocks of ``block_size``."""
    exercise = "Exercise 12.1"
    _refuse(exercise, fn)
    predicted = student_answer(exercise, fn, "your number of prompt tokens")
    expected = help_desk_reference(stream.prompts, block_size)
    why = ("count each request's prompt, less the whole blocks of the shared start it finds in the cache: none for the "
           "first request, the same number for every later one.")
    for sentence, value in _help_desk_mistakes(stream.prompts, block_size, stream.max_batch).items():
        if predicted == value and value != expected:
            why = sentence
    check_prediction(exercise, predicted, expected, rel_tol=1e-9, what="the prompt tokens the help desk computes",
                     why=why)


FIRST_WAVE_CHOICES = {
    "a": (True, "the scheduler registers a request's full blocks in the prefix cache when it allocates them (vLLM "
                "does the same), so the next request admitted in that step already finds them; it is safe because one "
                "forward pass writes every layer's new keys and values into the pool before any request of the step "
                "reads that layer."),
    "b": (False, "nothing is computed before the first request arrives: both engines start from an empty prefix "
                 "cache in every timed run."),
    "c": (False, "the engines admit up to eight requests in one step (the batch limit), not one: the table's steps "
                 "count the waves."),
    "d": (False, "a block's key names its tokens and every token before it (chained hashes): two requests share a "
                 "block only when they agree from the very start, which is why the shared system prompt comes first."),
}


def check_first_wave_explanation(fn: Any) -> None:
    """Exercise 12.1: the letter of why requests admitted in the same step share the system prompt."""
    check_choice("Exercise 12.1", student_answer("Exercise 12.1", fn, "the letter of your choice"), FIRST_WAVE_CHOICES)


# ---------------------------------------------------------------------------------------
# Exercise 12.2: a knob under its vLLM name
# ---------------------------------------------------------------------------------------

BATCH_KNOB_CHOICES = {
    "a": (True, "max_num_seqs caps the requests running at once: kvlib's max_batch. The others wait in the queue "
                "and are admitted as running ones finish."),
    "b": (False, "prefill_chunk is vLLM's max_num_batched_tokens: the tokens one step may run, not the requests."),
    "c": (False, "num_blocks sizes the KV pool (vLLM's gpu_memory_utilization, VLLM_CPU_KVCACHE_SPACE on a CPU): it "
                 "limits how many requests fit, but only through their memory."),
    "d": (False, "block_size is the token slots per KV block, the same name in both engines."),
}


def check_batch_knob(fn: Any) -> None:
    """Exercise 12.2: the letter of kvlib's Engine argument that vLLM calls ``max_num_seqs``."""
    check_choice("Exercise 12.2", student_answer("Exercise 12.2", fn, "the letter of your choice"), BATCH_KNOB_CHOICES)


def steps_reference(requests: int, new_tokens: int, max_batch: int) -> int:
    """Reference: requests of equal prompts and answers run in waves of ``max_batch``; a wave's first
    step prefills its prompts and writes their first token, and each later token takes one decode
    step, so a wave takes ``new_tokens`` steps, and the next wave is admitted when it ends."""
    return math.ceil(requests / max_batch) * new_tokens


def check_steps_with_four(fn: Any, requests: int = 32, new_tokens: int = 32, max_batch: int = 4) -> None:
    """Exercise 12.2: ``fn()`` returns the steps the chat stream takes with at most ``max_batch`` at once."""
    exercise = "Exercise 12.2"
    _refuse(exercise, fn)
    predicted = student_answer(exercise, fn, "your number of steps")
    waves = math.ceil(requests / max_batch)
    expected = steps_reference(requests, new_tokens, max_batch)
    mistakes = {waves * (new_tokens - 1): "the step that prefills a wave also writes its first token: a wave takes "
                                          f"{new_tokens} steps, not {new_tokens - 1}.",
                waves * (new_tokens + 1): "the prefill step writes the first token: no separate decode step for it.",
                new_tokens: f"only {max_batch} requests run at once: the {requests} come in {waves} waves.",
                requests * new_tokens: "a step writes one token for every running request, not one token in all."}
    why = mistakes.get(predicted, f"{requests} requests in waves of {max_batch}; each wave runs until its "
                                  f"{new_tokens} tokens are written, one per step.")
    check_prediction(exercise, predicted, expected, rel_tol=1e-9, what="the steps of the chat stream", why=why)


# ---------------------------------------------------------------------------------------
# Exercise 12.3: what a split step moves
# ---------------------------------------------------------------------------------------

PARALLEL_CASE = {"d_model": 5120, "n_layers": 64, "rows": 64, "devices": 4, "stages": 4, "dtype_bytes": 2}


def _parallel(d_model: int, n_layers: int, rows: int, devices: int, stages: int, dtype_bytes: int) -> tuple[float, float]:
    """Reference: two ring all-reduces of rows × d_model numbers per layer, each sending 2 (t − 1) / t
    times its size from every device; and each row's d_model activations over each of the p − 1
    stage boundaries."""
    tensor = rows * d_model * dtype_bytes
    return 2 * n_layers * tensor * 2 * (devices - 1) / devices, (stages - 1) * tensor


def check_parallel_bytes(fn: Any) -> None:
    """Exercise 12.3: ``fn()`` returns (bytes one GPU sends per tensor-parallel step, bytes crossing
    the pipeline's boundaries per step) for :data:`PARALLEL_CASE`."""
    exercise = "Exercise 12.3"
    _refuse(exercise, fn)
    got = student_answer(exercise, fn, "your two numbers")
    if not isinstance(got, (tuple, list)) or len(got) != 2:
        raise CheckFailed(f"{exercise}: return two numbers, (tensor-parallel bytes, pipeline bytes); got {got!r}")
    c = PARALLEL_CASE
    tensor, pipeline = _parallel(**c)
    t, rows, d, layers = c["devices"], c["rows"], c["d_model"], c["n_layers"]
    size = rows * d * c["dtype_bytes"]
    tp_slips = {layers * size * 2 * (t - 1) / t: "two all-reduces per layer: one after attention, one after the MLP.",
                2 * layers * size: "a ring all-reduce sends 2 (t − 1) / t times the tensor from each GPU, not the tensor once.",
                2 * layers * size * (t - 1): "the ring's 2 (t − 1) / t is a fraction of the tensor, not (t − 1) copies of it.",
                tensor * 2: "16-bit activations: 2 bytes a number."}
    pp_slips = {c["stages"] * size: "p stages have p − 1 boundaries between them.", pipeline * 2: "2 bytes a number."}
    check_prediction(exercise, got[0], tensor, rel_tol=0.01, what="the bytes one GPU sends in a tensor-parallel step",
                     why=tp_slips.get(got[0], "per layer: two all-reduces of rows × d_model numbers, each a ring"))
    check_prediction(exercise, got[1], pipeline, rel_tol=0.01, what="the bytes crossing the pipeline's boundaries",
                     why=pp_slips.get(got[1], "each row's d_model activations cross every boundary once"))
