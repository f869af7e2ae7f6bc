"""The benchmark command: its bandwidth probe and its report (the full run is `python -m kvlib.bench`)."""
from __future__ import annotations

import pytest

from kvlib.bench.run import Impl, _time_peer, best_peer_setting, to_markdown
from kvlib.bench.markdown import goals_markdown
from kvlib.bench.peer import first_difference, greedy_run, llama_cpp_missing
from kvlib.measure.hardware import machine_description, memory_bandwidth


def _result(same=True):
    rows = [
        {"name": "kvlib, with cache", "seconds": [2.0], "median_seconds": 2.0, "tokens_per_s": 24.0, "decode_tokens_per_s": 30.0},
        {"name": "transformers, with cache", "seconds": [4.0], "median_seconds": 4.0, "tokens_per_s": 12.0, "decode_tokens_per_s": 15.0},
        {"name": "kvlib, without cache", "seconds": [20.0], "median_seconds": 20.0, "tokens_per_s": 2.4, "decode_tokens_per_s": None},
        {"name": "transformers, without cache", "seconds": [40.0], "median_seconds": 40.0, "tokens_per_s": 1.2, "decode_tokens_per_s": None},
    ]
    return {
        "machine": {"cpu": "Test CPU", "vector_extensions": "AVX2", "logical_cpus": 2, "torch_threads": 2, "python": "3.11", "torch": "2.13", "os": "x"},
        "prompt_tokens": 284, "new_tokens": 48, "repeats": {"cached": 3, "uncached": 1},
        "bandwidth_gb_s": 20.0, "weight_bytes": 538_000_000, "bandwidth_limit_tokens_per_s": 37.2,
        "weight_read_floor_ms": 25.0, "compile_seconds": None,
        "rows": rows, "same_tokens": same,
        "ratios": {"kvlib_cached_vs_transformers_cached_decode": 2.0, "kvlib_cached_vs_transformers_cached_total": 2.0,
                   "kvlib_uncached_over_cached": 10.0, "transformers_uncached_over_cached": 10.0,
                   "kvlib_decode_share_of_bandwidth_limit": 0.81, "transformers_decode_share_of_bandwidth_limit": 0.4,
                   "weight_read_floor_share_of_bandwidth_limit": 1.075, "weight_read_floor_vs_transformers_cached_decode": 2.67},
        "answer": "x", "date": "2026-11-29",
    }


def test_markdown_report_names_machine_and_ratios():
    md = to_markdown(_result())
    assert "Test CPU (AVX2 vector instructions, 2 logical CPUs, 2 torch threads)" in md
    assert "| kvlib, with cache | 2.00 s | 24.0 | 30.0 | – | – |" in md
    assert "| transformers, without cache | 40.00 s | 1.2 | – | – | – |" in md
    assert "| kvlib cached decode, share of the bandwidth limit | 81 % |" in md
    assert "Same tokens from all 4 float32 implementations: **True**" in md
    assert "Same tokens from all 4 float32 implementations: **False**" in to_markdown(_result(same=False))
    assert "takes 25.0 ms" in md and "at best 40.0 tokens/s, 2.67× transformers' cached decode" in md
    assert "compiled" not in md
    # 25 ms of floor at 30 decode tokens/s: the step is 75 % floor
    assert "| kvlib, with cache: decode step, share of the weight-read floor | 75 % |" in md


def test_markdown_report_names_the_wall_from_the_measurement():
    """The sentence about what limits a step follows the measured floor, on either kind of machine."""
    result = _result()
    result["ratios"]["weight_read_floor_share_of_bandwidth_limit"] = 0.92
    assert "on this machine memory is the wall" in to_markdown(result)
    result["ratios"]["weight_read_floor_share_of_bandwidth_limit"] = 0.40
    md = to_markdown(result)
    assert "matrix-vector kernel, not memory, is the wall" in md and "memory is the wall" not in md


def test_markdown_report_with_the_compiled_row():
    result = _result()
    result["rows"].insert(1, {"name": "kvlib, with cache, compiled", "seconds": [1.5], "median_seconds": 1.5,
                              "tokens_per_s": 32.0, "decode_tokens_per_s": 36.0})
    result["compile_seconds"] = 61.0
    result["ratios"].update({"kvlib_compiled_vs_transformers_cached_decode": 2.4,
                             "kvlib_compiled_decode_share_of_bandwidth_limit": 0.97,
                             "kvlib_uncached_over_compiled_cached": 13.3})
    md = to_markdown(result)
    assert "| kvlib, with cache, compiled | 1.50 s | 32.0 | 36.0 | – | – |" in md
    assert "| kvlib compiled cached decode / transformers cached decode (tokens/s) | 2.40× |" in md
    assert "| kvlib compiled cached decode, share of the bandwidth limit | 97 % |" in md
    assert "| kvlib: time without cache / with cache, compiled | 13.3× |" in md
    assert "took 61.00 s" in md and "C++ wrapper" not in md
    assert "Same tokens from all 5 float32 implementations" in md
    result["compile_seconds_fast"] = 70.0
    assert "fast 4-bit path's step is compiled with Inductor's C++ wrapper" in to_markdown(result)


def test_bandwidth_probe_is_plausible():
    gbs = memory_bandwidth(nbytes=64 * 2**20, repeats=3) / 1e9
    assert 0.1 < gbs < 10_000


def test_machine_description_has_threads():
    m = machine_description()
    assert m["torch_threads"] >= 1 and m["logical_cpus"] >= 1


def test_markdown_report_with_formats_and_the_peer():
    result = _result()
    result["rows"] += [
        {"name": "kvlib, with cache, native 4-bit", "library": "kvlib", "format": "native 4-bit", "seconds": [1.0],
         "median_seconds": 1.0, "tokens_per_s": 48.0, "decode_tokens_per_s": 60.0, "prefill_tokens_per_s": 250.0,
         "parts_from_float32_at": 6},
        {"name": "llama.cpp, with cache, Q4_1 file", "library": "llama.cpp", "format": "Q4_1 file", "seconds": [0.5],
         "median_seconds": 0.5, "tokens_per_s": 96.0, "decode_tokens_per_s": 120.0, "prefill_tokens_per_s": 340.0,
         "parts_from_float32_at": None},
    ]
    result["peer"] = {"name": "llama.cpp", "version": "0.3.36", "missing": None}
    result["fastest_kvlib"] = "kvlib, with cache, native 4-bit"
    result["ratios"].update({"kvlib_fastest_decode_vs_llama_cpp": 0.5, "kvlib_fastest_prefill_vs_llama_cpp": 0.74})
    md = to_markdown(result)
    assert "| kvlib, with cache, native 4-bit | 1.00 s | 48.0 | 60.0 | 250.0 | 6 |" in md
    assert "| llama.cpp, with cache, Q4_1 file | 500.0 ms | 96.0 | 120.0 | 340.0 | – |" in md
    assert "llama-cpp-python 0.3.36" in md
    assert "| kvlib's fastest decode (kvlib, with cache, native 4-bit) / llama.cpp decode (tokens/s) | 0.50× |" in md
    assert "| kvlib's fastest prefill / llama.cpp prefill (tokens/s) | 0.74× |" in md
    assert "Same tokens from all 4 float32 implementations" in md      # the other formats are not counted
    # the float32 floor says nothing about another format's step
    assert "native 4-bit: decode step, share of the weight-read floor" not in md
    result["formats"] = [{"format": "native 4-bit", "weight_bytes": 117.3 * 2**20, "weight_read_floor_ms": 20.0,
                          "decode_step_ms": 35.0}]
    assert "| native 4-bit | 117.3 MiB | 20.0 ms | 35.0 ms | 1.75× |" in to_markdown(result)


def test_markdown_report_says_how_to_add_a_missing_peer():
    result = _result()
    result["peer"] = {"name": "llama.cpp", "version": None, "missing": "llama.cpp is not installed here: `make peer` ..."}
    assert "No llama.cpp row: llama.cpp is not installed here: `make peer`" in to_markdown(result)


class FakeLlama:
    """llama_cpp.Llama's reset() and generate(), with a clock that advances by known steps."""

    def __init__(self, clock, prefill=0.5, step=0.01, script=(7, 8, 9, 10, 11, 12)):
        self.clock, self.prefill, self.step, self.script = clock, prefill, step, script
        self.resets, self.calls = 0, []

    def reset(self):
        self.resets += 1

    def generate(self, tokens, **sampling):
        self.calls.append((list(tokens), sampling))
        self.clock.t += self.prefill
        for i, token in enumerate(self.script):
            if i:
                self.clock.t += self.step
            yield token


class Clock:
    def __init__(self):
        self.t = 100.0

    def __call__(self):
        return self.t


def test_greedy_run_times_prefill_and_steps():
    clock = Clock()
    llm = FakeLlama(clock)
    run = greedy_run(llm, [1, 2, 3], 4, clock=clock)
    assert run.tokens == [7, 8, 9, 10]
    assert run.prefill_seconds == pytest.approx(0.5)
    assert run.step_seconds == pytest.approx([0.01, 0.01, 0.01])
    tokens, sampling = llm.calls[0]
    assert tokens == [1, 2, 3] and sampling["temp"] == 0.0 and sampling["top_k"] == 1   # greedy
    assert sampling["repeat_penalty"] == 1.0 and llm.resets == 1     # no penalty; the cache reset: prefill again


def test_greedy_run_refuses_what_it_cannot_do():
    clock = Clock()
    with pytest.raises(RuntimeError, match="stopped after 6 of 10 tokens"):
        greedy_run(FakeLlama(clock), [1], 10, clock=clock)
    with pytest.raises(ValueError, match="prompt is empty"):
        greedy_run(FakeLlama(clock), [], 3, clock=clock)
    with pytest.raises(ValueError, match="n_new must be at least 1"):
        greedy_run(FakeLlama(clock), [1], 0, clock=clock)


def test_peer_row_from_fake_runs(monkeypatch):
    import kvlib.bench.peer as peer

    clock = Clock()
    monkeypatch.setattr(peer.time, "perf_counter", clock)
    row = _time_peer(FakeLlama(clock, prefill=0.4, step=0.02), [1, 2], 5, repeats=3)
    assert row.impl == Impl("llama.cpp", True, format="Q4_1 file") and row.tokens == [7, 8, 9, 10, 11]
    assert row.prefill_seconds == pytest.approx(0.4) and row.decode_step_seconds == pytest.approx(0.02)
    assert row.seconds == pytest.approx([0.48] * 3)
    assert row.impl.label == "llama.cpp, with cache, Q4_1 file"


def test_the_peer_is_compared_at_its_best_setting(monkeypatch):
    """llama.cpp is timed with flash attention off and on; its rows are the faster setting's,
    whichever it is, and the report says which and what each decode step took."""
    import kvlib.bench.peer as peer

    clock = Clock()
    monkeypatch.setattr(peer.time, "perf_counter", clock)
    for off_step, on_step, want in [(0.015, 0.023, False), (0.030, 0.020, True)]:
        tried = {False: ("llm off", _time_peer(FakeLlama(clock, step=off_step), [1, 2], 5, repeats=3)),
                 True: ("llm on", _time_peer(FakeLlama(clock, step=on_step), [1, 2], 5, repeats=3))}
        flash, (llm, row) = best_peer_setting(tried)
        assert flash is want and llm == ("llm on" if want else "llm off")
        assert row.decode_step_seconds == pytest.approx(min(off_step, on_step))
    with pytest.raises(ValueError, match="no llama.cpp setting"):
        best_peer_setting({})
    result = _result()
    result["peer"] = {"name": "llama.cpp", "version": "0.3.36", "missing": None,
                      "setting": {"flash_attn": False, "decode_step_seconds": {"off": 0.015, "on": 0.023}}}
    assert ("Its rows use flash attention off, the faster of the two on this machine (decode step: off 15.0 ms, "
            "on 23.0 ms).") in to_markdown(result)
    assert "crashed" not in to_markdown(result)
    result["peer"]["setting"]["extra_buffers"] = False
    assert "crashed llama.cpp in a probe on this machine, so it runs without them" in to_markdown(result)


def test_the_extra_buffer_probe_reads_the_childs_exit(monkeypatch):
    """llama.cpp's extra buffer types are used only when a child process running them exits
    cleanly: a child killed by a segmentation fault (what its AMX kernel did on one Xeon) says no,
    and the probe runs once per file and thread count."""
    import subprocess

    import kvlib.bench.peer as peer

    calls = []

    def fake_run(cmd, **kwargs):
        calls.append(cmd)
        return subprocess.CompletedProcess(cmd, -11 if cmd[-2] == "crashes.gguf" else 0)

    monkeypatch.setattr(peer.subprocess, "run", fake_run)
    peer.extra_buffers_work.cache_clear()
    assert peer.extra_buffers_work("crashes.gguf", 2) is False
    assert peer.extra_buffers_work("works.gguf", 2) is True
    assert peer.extra_buffers_work("works.gguf", 2) is True and len(calls) == 2
    assert calls[0][1] == "-c" and calls[0][-1] == "2"
    peer.extra_buffers_work.cache_clear()


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 5, 3], [1, 2, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def test_missing_peer_says_how_to_add_it(monkeypatch):
    import importlib.util

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    message = llama_cpp_missing()
    assert "make peer" in message and "llama-cpp-python==0.3.36" in message and "cmake" in message


def test_goals_follow_the_measured_rows():
    """Each goal's value is computed from the rows; a missing peer or batch gives None, not a guess;
    an unmet goal says by how much and where its step's time goes."""
    from kvlib.bench.batched import BatchedRow
    from kvlib.bench.run import Row
    from kvlib.bench.goals import goals

    rows = [Row(Impl("kvlib", True), [1.0], 0.050, prefill_seconds=1.0),                          # 20 tok/s
            Row(Impl("kvlib", True, format="native 4-bit"), [1.0], 0.025, prefill_seconds=3.0),   # 2.0x float32
            Row(Impl("kvlib", True, True, format="fast 4-bit"), [1.0], 0.025, prefill_seconds=2.0),  # 40 tok/s
            Row(Impl("llama.cpp", True, format="Q4_1 file"), [1.0], 0.020, prefill_seconds=1.5),  # 50 tok/s
            Row(Impl("kvlib", True, format="fast 4-bit"), [1.0], 0.03, tokens=[9], prefill_seconds=2.0)]
    batched = [BatchedRow("kvlib, float32", 32, 1.0, [0.2] * 4, []), BatchedRow("kvlib, fast 4-bit", 32, 1.0, [0.1] * 4, []),
               BatchedRow("llama.cpp", 32, 1.0, [0.16] * 4, [])]
    profile = {"label": "fast 4-bit, compiled", "wall_ms_per_step": 25.0, "matmul_ms": 12.0, "attention_ms": 3.0}
    native = {"label": "native 4-bit, eager", "wall_ms_per_step": 25.0, "matmul_ms": 18.0, "attention_ms": 3.0}
    got = {g["goal"]: g for g in goals(rows, batched, {"float32": (0, 0.045)}, 20.0,
                                       {"fastest": profile, "native 4-bit": native})}
    one = got["batch-1 decode after the prompt, kvlib's fastest / llama.cpp"]
    assert one["value"] == pytest.approx(0.8) and one["met"] is False
    assert one["short_by"] == "5.0 ms per step"
    assert one["held_by"] == ("of its 25.0 ms step (fast 4-bit, compiled): matrix products 12.0 ms, attention 3.0 ms, "
                              "the rest 10.0 ms")
    b32 = got["batched decode of 32 sequences, kvlib's fastest / llama.cpp"]
    assert b32["value"] == pytest.approx(1.6) and b32["met"] is True and b32["short_by"] is None
    assert got["prefill, kvlib's fastest / llama.cpp"]["value"] == pytest.approx(1.5)
    ratio = got["kvlib.generate decode, native 4-bit / float32, default options"]
    assert ratio["value"] == pytest.approx(2.0) and ratio["met"] is False and ratio["short_by"] == "5.0 ms per step"
    # float32's 50 ms step / 2.5 allows 20 ms; the products and attention alone take 21 (the fastest's 15 < 20 above)
    assert ratio["held_by"].endswith("the products and attention alone take more than the 20.0 ms the goal allows, "
                                     "so it needs faster kernels, not less time between them")
    second = got["a new process's first compiled step (section 5's model), seconds"]
    assert second["at_most"] and second["met"] is False and second["short_by"] == "5.0 s"
    assert got["float32 eager decode, share of its weight-read floor"]["value"] == pytest.approx(0.9)
    tokens = got["compiled paths writing their format's eager greedy tokens"]
    assert tokens["value"] == 0.0 and tokens["short_by"] == "kvlib, with cache, compiled, fast 4-bit"
    rows[2].tokens = rows[4].tokens = [1, 2]
    same = {g["goal"]: g for g in goals(rows, batched, {"float32": (0, 0.045)})}
    assert same["compiled paths writing their format's eager greedy tokens"]["met"] is True
    alone = {g["goal"]: g for g in goals(rows[:3], [], {"float32": (0, 0.045)})}
    assert alone["batch-1 decode after the prompt, kvlib's fastest / llama.cpp"] == {
        "goal": "batch-1 decode after the prompt, kvlib's fastest / llama.cpp", "target": 1.0, "value": None,
        "met": None, "unit": "x", "at_most": False, "short_by": None, "held_by": None}
    assert alone["a new process's first compiled step (section 5's model), seconds"]["met"] is None


def test_batched_rows_from_a_fake_peer_and_prompts():
    from kvlib.bench.batched import batch_prompts, time_peer_batched
    from kvlib.bench.peer import BatchedPeerRun

    assert batch_prompts(list(range(10)), 3, prompt_len=3) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ValueError, match="need 12 ids, the text has 10"):
        batch_prompts(list(range(10)), 4, prompt_len=3)
    calls = []

    def fake_run(llm, prompts, n_new):
        calls.append((len(prompts), n_new))
        return BatchedPeerRun([[1] * n_new for _ in prompts], 0.5, [0.04] * (n_new - 1))

    row = time_peer_batched(object(), [[1, 2]] * 8, 5, run=fake_run)
    assert calls == [(8, 2), (8, 5)]                       # a warm-up, then the timed run
    assert row.decode_tokens_per_s == pytest.approx(8 / 0.04) and row.batch == 8 and row.name == "llama.cpp"


def test_markdown_report_with_quality_batched_and_goals():
    result = _result()
    result["formats"] = [{"format": "float32", "weight_bytes": 513 * 2**20, "weight_read_floor_ms": 70.0, "decode_step_ms": 80.0},
                         {"format": "fast 4-bit", "weight_bytes": 145 * 2**20, "weight_read_floor_ms": 15.0, "decode_step_ms": 30.0},
                         {"format": "int8", "weight_bytes": 155 * 2**20, "weight_read_floor_ms": 20.0, "decode_step_ms": 40.0}]
    result["quality"] = {"fast 4-bit": {"kl_mean": 0.0312, "kl_p99": 0.25, "top1": 0.912}}
    result["quality_tokens"] = 1024
    result["batched"] = [{"name": "kvlib, float32", "batch": 1, "decode_tokens_per_s": 10.0},
                         {"name": "kvlib, float32", "batch": 32, "decode_tokens_per_s": 150.0},
                         {"name": "llama.cpp", "batch": 1, "decode_tokens_per_s": 60.0}]
    result["goals"] = [{"goal": "prefill, kvlib's fastest / llama.cpp", "target": 2.0, "value": 1.91, "met": False,
                        "unit": "x", "short_by": None, "held_by": None},
                       {"goal": "float32 eager decode, share of its weight-read floor", "target": 0.9, "value": None,
                        "met": None, "unit": "%"},
                       {"goal": "a new process's first compiled step", "target": 15.0, "value": 16.4, "met": False,
                        "unit": "s", "at_most": True, "short_by": "1.4 s", "held_by": None}]
    result["kernel_choice"] = {"output_layer": "int8", "layer_kernel": "int4", "dense_from": None,
                               "dense_kernel": "dense float32", "output_ms": {"tied": 2.75, "int8": 1.4},
                               "layers_ms": {"1": {"int4": 0.2, "dense bfloat16": 0.37}}}
    result["profile_fast"] = {"context_len": 300, "ms_per_step": 20.0, "wall_ms_per_step": 30.0, "matmul_share": 0.6,
                              "ops_per_step": 5000, "top": [("aten::_weight_int4pack_mm_for_cpu", 120, 9.5)]}
    md = to_markdown(result)
    assert "| float32 | 513.0 MiB | 70.0 ms | 80.0 ms | 1.14× | (the reference) | | |" in md
    assert "| fast 4-bit | 145.0 MiB | 15.0 ms | 30.0 ms | 2.00× | 0.0312 | 0.250 | 91.2 % |" in md
    assert "| int8 | 155.0 MiB | 20.0 ms | 40.0 ms | 2.00× | – | – | – |" in md          # not measured: no number
    assert "| implementation | batch 1 | batch 32 |" in md
    assert "| kvlib, float32 | 10.0 | 150.0 |" in md and "| llama.cpp | 60.0 | – |" in md
    assert "30.0 ms per step unprofiled, of which 20.0 ms in 5000 PyTorch operator calls (60 % of it" in md
    assert "| `aten::_weight_int4pack_mm_for_cpu` | 120 | 9.50 |" in md
    goals_md = goals_markdown(result)                    # the goals go to goals.md, not to the appendix's page
    assert "| prefill, kvlib's fastest / llama.cpp | 2.00× | 1.91× | no |  |  |" in goals_md
    assert "| float32 eager decode, share of its weight-read floor | 90 % | not measured | – |" in goals_md
    assert "| a new process's first compiled step | ≤ 15.0 s | 16.4 s | no | 1.4 s |  |" in goals_md
    assert "Goals of one `python -m kvlib.bench` run on Test CPU (AVX2), 2 threads" in goals_md
    assert "performance goals" not in md
    assert "output layer **int8 (PyTorch's kernel)** (a decode step with each: tied 2.75 ms, int8 1.40 ms;" in md
    assert "4-bit layers: **PyTorch's int4 kernel at every batch size measured** (" in md
    assert "as it rounds the embedding again); 4-bit" in md          # no rows measured for the int8 layer: no clause
    result["kernel_choice"].update(output_dense_from=8, output_dense_kernel="dense bfloat16",
                                   output_rows_ms={"8": {"int8": 3.4, "dense bfloat16": 2.8}})
    assert ("again), **its weight dequantized to bfloat16 from 8 rows on, its kernel below** (the layer alone: 8 rows: "
            "int8 3.40 ms, dense bfloat16 2.80 ms); 4-bit") in to_markdown(result)


def test_new_process_measurement_reads_the_childs_report(monkeypatch):
    """The second-run figure comes from a child process's two lines: its times, and torch's own
    compile phases (those under half a second left out, the rest longest first)."""
    import subprocess

    from kvlib.bench import run as bench

    seen = {}

    def fake_run(cmd, **kwargs):
        seen["cmd"] = cmd
        out = "noise\n12.5 9.25\n{'bytecode_tracing': '4.1', 'build_guards': '0.2', '_compile.compile_inner': '8.9'}\n"
        return subprocess.CompletedProcess(cmd, 0, stdout=out)

    monkeypatch.setattr(subprocess, "run", fake_run)
    got = bench.new_process_first_compiled_call(2)
    assert seen["cmd"][-1] == "2" and "compile=True" in seen["cmd"][-2]
    assert got == {"generate_seconds": 12.5, "first_compiled_call_seconds": 9.25,
                   "phases": {"_compile.compile_inner": 8.9, "bytecode_tracing": 4.1}}


def test_the_appendix_and_section_8_quote_one_run():
    """The appendix includes chapters/benchmark/bench.md; section 8 reads kvlib/data/bench.json
    (kvlib.data.reference_bench, shipped with the package). Both must be the same run: the
    markdown is what the report writes from that JSON, and the rows section 8 reads are there."""
    from pathlib import Path

    from kvlib.data import reference_bench

    run = reference_bench()
    appendix = Path(__file__).resolve().parents[2] / "chapters" / "benchmark" / "bench.md"
    assert to_markdown(run) == appendix.read_text(), (
        "chapters/benchmark/bench.md is not the report of kvlib/data/bench.json: copy both files of one "
        "`python -m kvlib.bench` run (or, after changing the report, write bench.md again with "
        "kvlib.bench.markdown.to_markdown(kvlib.data.reference_bench()))")
    names = {r["name"] for r in run["rows"]}
    assert {"kvlib, with cache", "kvlib, with cache, compiled", "kvlib, with cache, native 4-bit",
            "kvlib, with cache, compiled, fast 4-bit"} <= names, names
    assert any(r["library"] == "llama.cpp" for r in run["rows"])
    assert run["machine"]["cpu"] in appendix.read_text()


def test_the_appendix_avx2_run_is_the_report_of_its_json():
    """The appendix's AVX2 run (emulated on an AVX-512 machine until a real AVX2 machine runs it):
    chapters/benchmark/bench-avx2-emulated.md is what the report writes from the JSON beside it,
    and the run says it ran with PyTorch lowered to AVX2."""
    import json
    from pathlib import Path

    folder = Path(__file__).resolve().parents[2] / "chapters" / "benchmark"
    run = json.loads((folder / "bench-avx2-emulated.json").read_text())
    assert to_markdown(run) == (folder / "bench-avx2-emulated.md").read_text(), (
        "bench-avx2-emulated.md is not the report of bench-avx2-emulated.json: copy both files of one run")
    assert run["machine"]["vector_extensions"].startswith("AVX2")
