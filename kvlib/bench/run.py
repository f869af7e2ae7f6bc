"""``python -m kvlib.bench``: kvlib's decoders against Hugging Face transformers on the real model.

In one run, on the same prompt (the real-model section's demo), weights, thread count and
number of new tokens, it

1. measures this machine's memory bandwidth (reading a large buffer), and how fast the
   matrix-vector products alone read the model's weights (the *weight-read floor*: a decode
   step can be no faster with these kernels);
2. times kvlib ``generate`` with and without the cache (and, unless ``--no-compile``, with
   the cache and ``compile=True``), and transformers' ``generate`` with ``use_cache=True``
   and ``False`` (greedy; warm-up first; several repeats; medians);
3. times kvlib's other formats eager (bfloat16, every layer in int8, and the native 4-bit
   model that runs the file's own Q4_1 blocks), and llama.cpp on the same GGUF file when it
   is installed (``make peer``; :mod:`kvlib.bench.peer`), prefill and decode alike;
4. checks that the float32 implementations produce the same tokens, and says where each
   other format's greedy tokens part from float32's (after a near-tie they may);
5. prints a table of tokens/s, the ratios between them, and kvlib's share of the bandwidth
   limit (the rate at which decoding could go if every step only had to read the weights
   once at the measured bandwidth), and writes it as JSON and markdown.

transformers is a test dependency (``requirements.txt``); the notebooks never need it.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from ..clock import Stopwatch
from ..generate import generate
from ..measure.experiments import STEP_PARTS
from ..measure.hardware import machine_description, memory_bandwidth, weight_read_floor
from .peer import first_difference
from .goals import goals
from .markdown import goals_markdown, to_markdown


@dataclass(frozen=True)
class Impl:
    """Which implementation a row of the benchmark times."""

    library: str                 # "kvlib", "transformers" or "llama.cpp"
    cache: bool
    compiled: bool = False
    format: str = "float32"      # the weights' format: "float32", "bfloat16", "int8", "native 4-bit", "Q4_1 file"

    @property
    def label(self) -> str:
        return (f"{self.library}, {'with' if self.cache else 'without'} cache"
                + (", compiled" if self.compiled else "") + ("" if self.format == "float32" else f", {self.format}"))


@dataclass
class Row:
    """One implementation, both as tokens/s over the whole call and per decode step."""

    impl: Impl
    seconds: list[float]                 # wall-clock of each timed generate call
    decode_step_seconds: float | None    # median of the one-token steps (cached paths only)
    tokens: list[int] = field(repr=False, default_factory=list)
    prefill_seconds: float | None = None  # median time from the call to the first token

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _time_kvlib(model, prompt, n_new, use_cache, repeats, compile=False, format="float32") -> Row:
    generate(model, prompt, 4, use_cache=use_cache, compile=compile)     # warm-up (and compilation)
    seconds, steps, prefills, tokens = [], [], [], []
    for _ in range(repeats):
        with Stopwatch() as watch:
            out = generate(model, prompt, n_new, use_cache=use_cache, compile=compile)
        seconds.append(watch.seconds)
        steps += [r.seconds for r in out.records[1:]]
        prefills.append(out.records[0].seconds)
        tokens = out.tokens
    return Row(Impl("kvlib", use_cache, compile, format), seconds, statistics.median(steps) if use_cache else None,
               tokens, statistics.median(prefills))


def _time_peer(llm, prompt, n_new, repeats) -> Row:
    """llama.cpp (:func:`kvlib.bench.peer.greedy_run`): warm-up, then ``repeats`` timed runs."""
    from .peer import greedy_run

    greedy_run(llm, prompt, 4)
    runs = [greedy_run(llm, prompt, n_new) for _ in range(repeats)]
    return Row(Impl("llama.cpp", True, format="Q4_1 file"),
               [r.prefill_seconds + sum(r.step_seconds) for r in runs],
               statistics.median(s for r in runs for s in r.step_seconds), runs[-1].tokens,
               statistics.median(r.prefill_seconds for r in runs))


def best_peer_setting(tried: dict) -> tuple:
    """Of llama.cpp's settings ``{flash_attn: (llm, Row)}``, the one whose decode step is the
    shortest: ``(flash_attn, (llm, Row))``. The peer is compared at its best on this machine."""
    if not tried:
        raise ValueError("no llama.cpp setting was timed")
    return min(tried.items(), key=lambda item: item[1][1].decode_step_seconds)


def _time_transformers(hf_model, prompt, n_new, use_cache, repeats) -> Row:
    from transformers import LogitsProcessor, LogitsProcessorList

    class StepClock(LogitsProcessor):
        """Called once per generated token: its timestamps give the time of each step."""

        def __init__(self) -> None:
            self.stamps: list[float] = []

        def __call__(self, input_ids, scores):
            self.stamps.append(time.perf_counter())
            return scores

    x = torch.tensor([prompt])
    kwargs = dict(attention_mask=torch.ones_like(x), do_sample=False, use_cache=use_cache,
                  min_new_tokens=n_new, max_new_tokens=n_new, pad_token_id=0)
    with torch.no_grad():
        hf_model.generate(x, **{**kwargs, "min_new_tokens": 4, "max_new_tokens": 4})   # warm-up
        seconds, steps, prefills = [], [], []
        for _ in range(repeats):
            clock = StepClock()
            start = time.perf_counter()
            with Stopwatch() as watch:
                out = hf_model.generate(x, logits_processor=LogitsProcessorList([clock]), **kwargs)
            seconds.append(watch.seconds)
            steps += [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
            prefills.append(clock.stamps[0] - start)
    tokens = out[0, len(prompt):].tolist()
    return Row(Impl("transformers", use_cache), seconds, statistics.median(steps) if use_cache else None, tokens,
               statistics.median(prefills))


def profile_decode_step(model, context_len: int = 300, steps: int = 10, compile: bool = False,
                        label: str = "") -> dict:
    """Where the time of one cached decode step goes, from the torch profiler.

    Returns the wall time of a step unprofiled, the operators' time (``ms_per_step``), the
    matrix products' share of it (which read the weights) and their milliseconds, the
    attention's milliseconds, and the top operators as rows of (name, calls per step,
    milliseconds per step). ``compile=True`` profiles the compiled step: its fused kernels are
    not operators, so what is neither a matrix product nor attention is "the rest".
    """
    from torch.profiler import ProfilerActivity, profile

    from ..measure.flops import step_call

    step = step_call(model, context_len, use_cache=True, compile=compile)
    for _ in range(3):
        step()
    with Stopwatch() as watch:
        for _ in range(steps):
            step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in STEP_PARTS["matrix products"])
    attention = sum(e.self_cpu_time_total for e in events if e.key in STEP_PARTS["attention"])
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    return {
        "label": label or ("compiled" if compile else "eager"),
        "context_len": context_len,
        "ms_per_step": total / steps / 1e3,
        "wall_ms_per_step": watch.seconds / steps * 1e3,    # unprofiled: operators plus Python between them
        "matmul_share": matmul / total,
        "matmul_ms": matmul / steps / 1e3,
        "attention_ms": attention / steps / 1e3,
        "ops_per_step": sum(e.count for e in events) / steps,
        "top": [(e.key, e.count / steps, e.self_cpu_time_total / steps / 1e3) for e in top],
    }


def run(n_new: int = 48, repeats: int = 3, repeats_uncached: int = 1, threads: int | None = None,
        progress: bool = True, compile: bool = True, formats: bool = True, peer: bool = True,
        compile_formats: bool = False, batched: bool = True, quality_tokens: int = 1024, serving: bool = True) -> dict:
    """Run the whole benchmark and return its results as a JSON-ready dict.

    ``formats``: also time kvlib in bfloat16, int8, the native 4-bit model and the fast path
    (:func:`kvlib.fast.fast_model`: the native 4-bit model fused, its kernels chosen by
    measuring this machine), eager, with each one's quality against float32 on the first
    ``quality_tokens`` tokens of the evaluation text; with ``compile``, the fast path compiled
    too. ``compile_formats``: also compile each other format (a minute or more each).
    ``peer``: also time llama.cpp on the same file, when it is installed. ``batched``: also
    decode 1, 8 and 32 sequences together (:mod:`kvlib.bench.batched`). ``serving``: also serve
    the serving streams on kvlib's engine and on vLLM, when ``make peer-vllm`` has installed it
    (:mod:`kvlib.bench.serving_peer`).
    """
    if threads:
        torch.set_num_threads(threads)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if progress else (lambda *a: None)
    bench = _Bench(n_new, repeats, repeats_uncached, say)
    bench.load()
    bench.time_baselines()
    if compile:
        bench.time_compiled()
    if formats:
        bench.time_formats(compile_formats, compile)
    if bench.held:
        bench.measure_quality(quality_tokens)
    bench.time_peer(peer)
    if batched:
        bench.time_batched()
    bench.profile()
    bench.time_serving(serving)
    return bench.summary(quality_tokens)


class _Bench:
    """The phases of one :func:`run`, in the order it calls them, sharing what they load and measure.

    :meth:`load` sets the models (``model``, ``tok``, ``hf_model``), ``path``, ``prompt``,
    ``bandwidth``, ``floor`` and ``format_floors``; the timing phases add to ``rows``, ``held``
    (the other formats' models) and ``batched_rows``; :meth:`summary` turns it all into the result.
    """

    def __init__(self, n_new: int, repeats: int, repeats_uncached: int, say: Callable[..., None]) -> None:
        self.n_new, self.repeats, self.repeats_uncached, self.say = n_new, repeats, repeats_uncached, say
        self.rows: list[Row] = []
        self.held: dict[str, torch.nn.Module] = {}
        self.compile_seconds: float | None = None
        self.quality: dict[str, dict[str, float]] = {}
        self.peer_missing: str | None = None
        self.peer_version: str | None = None
        self.peer_setting: dict | None = None
        self.llm: Any = None
        self.batched_rows: list = []
        self.kernel_choice: dict | None = None
        self.compile_seconds_fast: float | None = None
        self.new_process: dict | None = None
        self.profiles: dict[str, dict] = {}
        self.serving: dict | None = None

    def load(self) -> None:
        """Measure the memory bandwidth, load the model in kvlib and transformers, time the weight-read floor."""
        import warnings

        from ..data import demo_prompt
        from ..smollm2 import load_smollm2, smollm2_path

        self.say("measuring memory bandwidth ...")
        self.bandwidth = memory_bandwidth()
        self.say("loading the model (kvlib, then transformers) ...")
        self.model, self.tok = load_smollm2(device="cpu")   # a CPU benchmark, beside llama.cpp and transformers
        from transformers import AutoModelForCausalLM
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
        self.path = path = smollm2_path()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            self.hf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                                 dtype=torch.float32).eval()
        self.prompt = demo_prompt(self.tok)
        self.say("timing the weight-read floor (every weight matrix once, back to back) ...")
        self.floor = weight_read_floor(self.model)
        self.format_floors = {"float32": (self.model.weight_bytes(), self.floor)}

    def time_baselines(self) -> None:
        """Time kvlib and transformers in float32, eager, with the cache and without."""
        for impl, reps in [(Impl("kvlib", True), self.repeats), (Impl("transformers", True), self.repeats),
                           (Impl("kvlib", False), self.repeats_uncached),
                           (Impl("transformers", False), self.repeats_uncached)]:
            self.say(f"timing {impl.label} ({reps} run{'s' if reps > 1 else ''}) ...")
            if impl.library == "kvlib":
                self.rows.append(_time_kvlib(self.model, self.prompt, self.n_new, impl.cache, reps))
            else:
                self.rows.append(_time_transformers(self.hf_model, self.prompt, self.n_new, impl.cache, reps))

    def time_compiled(self) -> None:
        """Time the first compiled call, then kvlib with the cache, compiled (the second row)."""
        from ..compiled import compiled_decode_step

        self.say("compiling kvlib's decode step with torch.compile (this takes a while the first time) ...")
        generate(self.model, self.prompt, 2, compile=True)
        self.compile_seconds = compiled_decode_step(self.model).compile_seconds
        self.say(f"  the first compiled call took {self.compile_seconds:.1f} s; now the same in a new process ...")
        self.new_process = new_process_first_compiled_call(torch.get_num_threads())
        self.say(f"timing kvlib, with cache, compiled ({self.repeats} runs) ...")
        self.rows.insert(1, _time_kvlib(self.model, self.prompt, self.n_new, True, self.repeats, compile=True))

    def time_formats(self, compile_formats: bool, compile_fast: bool = True) -> None:
        """Build each other format's model and time it with the cache, eager (and compiled: the
        fast path when ``compile_fast``, every format when ``compile_formats``), with its weight
        bytes and weight-read floor. The fast path's kernels are chosen by measurement first."""
        import copy

        from ..compiled import compiled_decode_step
        from ..quant import quantize
        from ..smollm2 import load_smollm2

        others = {"bfloat16": lambda: copy.deepcopy(self.model).to(torch.bfloat16),
                  "int8": lambda: quantize(self.model, "int8"),
                  "native 4-bit": lambda: load_smollm2(quantized=True, device="cpu")[0],
                  FAST: lambda: self._fast_model()}
        for name, build in others.items():
            self.say(f"timing kvlib, with cache, {name} ({self.repeats} runs), and its weight-read floor ...")
            self.held[name] = m = build()
            self.rows.append(_time_kvlib(m, self.prompt, self.n_new, True, self.repeats, format=name))
            self.format_floors[name] = (m.weight_bytes(), weight_read_floor(m))
            if name == FAST and compile_fast and not compile_formats:
                self.say(f"compiling (with Inductor's C++ wrapper) and timing kvlib, with cache, compiled, {name} ...")
                from ..fast import compile_fast_step
                compile_fast_step(m)
                self.rows.append(_time_kvlib(m, self.prompt, self.n_new, True, self.repeats, compile=True, format=name))
                self.compile_seconds_fast = compiled_decode_step(m).compile_seconds
            if compile_formats:
                self.say(f"compiling and timing kvlib, with cache, compiled, {name} ...")
                self.rows.append(_time_kvlib(m, self.prompt, self.n_new, True, self.repeats, compile=True,
                                             format=name))

    def _fast_model(self) -> torch.nn.Module:
        """The native 4-bit model fused, with the kernels this machine measured fastest (kept)."""
        from dataclasses import asdict

        from ..fast import apply_choice, fuse, kernel_choice

        self.say("choosing the fast path's kernels (measured once on this machine, then kept) ...")
        fast = fuse(self.held["native 4-bit"])
        choice = kernel_choice(fast)
        self.kernel_choice = asdict(choice)
        return apply_choice(fast, choice)

    def measure_quality(self, quality_tokens: int) -> None:
        """Each held format's predictions against float32's over ``quality_tokens`` tokens of text."""
        from ..data import evaluation_text
        from ..measure.quality import evaluate_many

        self.say(f"measuring each format's predictions against float32 over {quality_tokens} tokens of text ...")
        text_ids = self.tok.encode(evaluation_text())[:quality_tokens]
        self.quality = {name: {"kl_mean": q.kl_mean, "kl_p99": q.kl_p99, "top1": q.top1}
                        for name, q in evaluate_many(self.model, self.held, text_ids).items()}

    def time_peer(self, peer: bool) -> None:
        """Time llama.cpp on the same file when ``peer`` and it is installed; else say why not."""
        from .peer import llama_cpp_missing

        self.peer_missing = llama_cpp_missing() if peer else "not asked for (--no-peer)"
        if self.peer_missing is not None:
            return
        import llama_cpp

        from .peer import extra_buffers_work, open_llama_cpp

        self.peer_version = getattr(llama_cpp, "__version__", "?")
        extra = extra_buffers_work(str(self.path), torch.get_num_threads())
        if not extra:
            self.say("  llama.cpp's extra buffer types (AMX, repacked weights) crashed in a probe: running without them")
        tried = {}
        for flash in (False, True):
            self.say(f"timing llama.cpp (llama-cpp-python {self.peer_version}), flash attention "
                     f"{'on' if flash else 'off'}, on the same file ({self.repeats} runs) ...")
            llm = open_llama_cpp(self.path, torch.get_num_threads(), flash_attn=flash, extra_buffers=extra)
            tried[flash] = (llm, _time_peer(llm, self.prompt, self.n_new, self.repeats))
        flash, (self.llm, row) = best_peer_setting(tried)
        self.peer_setting = {"flash_attn": flash, "extra_buffers": extra, "decode_step_seconds": {
            ("on" if f else "off"): r.decode_step_seconds for f, (_, r) in tried.items()}}
        self.rows.append(row)

    def time_batched(self) -> None:
        """Batched decode at each batch size: kvlib float32, the fast path when held, llama.cpp when timed."""
        from ..data import evaluation_text
        from .batched import BATCH_SIZES, batch_prompts, time_kvlib_batched, time_peer_batched

        text_ids = self.tok.encode(evaluation_text())
        for size in BATCH_SIZES:
            prompts = batch_prompts(text_ids, size)
            self.say(f"batched decode, {size} sequence{'s' if size > 1 else ''} of 128 tokens, 32 new tokens each ...")
            self.batched_rows.append(time_kvlib_batched("kvlib, float32", self.model, prompts, 32))
            if FAST in self.held:
                self.batched_rows.append(time_kvlib_batched(f"kvlib, {FAST}", self.held[FAST], prompts, 32))
                if self.compile_seconds_fast is not None:
                    self.batched_rows.append(time_kvlib_batched(f"kvlib, {FAST}, compiled", self.held[FAST], prompts,
                                                                32, compile=True))
            if self.peer_missing is None:
                self.batched_rows.append(time_peer_batched(self.llm, prompts, 32))

    def time_serving(self, serving: bool) -> None:
        """kvlib's engine and vLLM on the same request streams, when ``serving`` and vLLM is installed."""
        from .serving_peer import default_model_dir, run as run_serving, summary, vllm_missing

        missing = vllm_missing() if serving else "not asked for (--no-serving)"
        if missing:
            self.say(f"no vLLM rows: {missing}")
            self.serving = {"missing": missing}
            return
        self.say("serving the request streams on kvlib's engine and on vLLM (a few minutes) ...")
        record = run_serving(self.model, self.tok, self.path, default_model_dir(), torch.get_num_threads(), self.say)
        self.serving = {"vllm": record["vllm"]["vllm"], "rows": summary(record), "repeats": record["repeats"],
                        "identical": {f"{s['name']}/{key}": [sum(t["identical"] for t in found), len(found)]
                                      for s in record["streams"] for key, found in s["tokens"].items()}}

    def profile(self) -> None:
        """Profile one decode step after the prompt: float32 eager, the native 4-bit model eager,
        and kvlib's fastest path (the fast path, compiled when it was)."""
        self.say("profiling one decode step ...")
        at = len(self.prompt) + 1
        self.prof = profile_decode_step(self.model, at, label="float32, eager")
        self.profiles = {"float32": self.prof}
        if "native 4-bit" in self.held:
            self.profiles["native 4-bit"] = profile_decode_step(self.held["native 4-bit"], at,
                                                                label="native 4-bit, eager")
        self.prof_fast = None
        if FAST in self.held:
            compiled = self.compile_seconds_fast is not None
            # The C++ wrapper calls the output layer and attention past the profiler's records.
            how = (", compiled with the C++ wrapper (the profiler sees its int4 products, not its other products "
                   "and attention)") if compiled else ", eager"
            self.prof_fast = profile_decode_step(self.held[FAST], at, compile=compiled, label=f"{FAST}{how}")
            self.profiles["fastest"] = self.prof_fast

    def summary(self, quality_tokens: int) -> dict:
        """Everything measured, as the JSON-ready dict :func:`run` returns."""
        weight_bytes = self.model.weight_bytes()
        limit_step = weight_bytes / self.bandwidth       # seconds per token if only the weights had to be read
        ratios, fastest = _ratios(self.rows, limit_step, self.floor)
        by = {r.impl: r for r in self.rows}
        reference_tokens = by[Impl("kvlib", True)].tokens
        n_new, prompt_len = self.n_new, len(self.prompt)
        return {
            "machine": machine_description(),
            "prompt_tokens": prompt_len,
            "new_tokens": n_new,
            "repeats": {"cached": self.repeats, "uncached": self.repeats_uncached},
            "bandwidth_gb_s": self.bandwidth / 1e9,
            "weight_bytes": weight_bytes,
            "bandwidth_limit_tokens_per_s": 1 / limit_step,
            "weight_read_floor_ms": self.floor * 1e3,
            "compile_seconds": self.compile_seconds,
            "compile_seconds_fast": self.compile_seconds_fast,
            "new_process": self.new_process,
            "kernel_choice": self.kernel_choice,
            "rows": [_row_dict(r, n_new, prompt_len, reference_tokens) for r in self.rows],
            "same_tokens": all(r.tokens == reference_tokens for r in self.rows if r.impl.format == "float32"),
            "formats": [{"format": name, "weight_bytes": nbytes, "weight_read_floor_ms": seconds * 1e3,
                         "decode_step_ms": 1e3 * by[Impl("kvlib", True, format=name)].decode_step_seconds}
                        for name, (nbytes, seconds) in self.format_floors.items()],
            "fastest_kvlib": fastest.impl.label,
            "peer": {"name": "llama.cpp", "version": self.peer_version, "missing": self.peer_missing,
                     "setting": self.peer_setting},
            "ratios": ratios,
            "profile": self.prof,
            "profile_fast": self.prof_fast,
            "quality": self.quality,
            "quality_tokens": quality_tokens,
            "batched": [r.as_dict() for r in self.batched_rows],
            "serving": self.serving,
            "goals": goals(self.rows, self.batched_rows, self.format_floors,
                           self.new_process and self.new_process["first_compiled_call_seconds"], self.profiles),
            "answer": self.tok.decode(reference_tokens),
            "date": time.strftime("%Y-%m-%d"),
        }


def _row_dict(r: Row, n_new: int, prompt_len: int, reference_tokens: list[int]) -> dict:
    """One row of the result: its timings as rates, and where its tokens part from ``reference_tokens``."""
    return {"name": r.impl.label, "library": r.impl.library, "format": r.impl.format,
            "seconds": r.seconds, "median_seconds": r.median,
            "tokens_per_s": n_new / r.median,
            "decode_tokens_per_s": (1 / r.decode_step_seconds) if r.decode_step_seconds else None,
            "prefill_tokens_per_s": (prompt_len / r.prefill_seconds) if r.prefill_seconds else None,
            "parts_from_float32_at": first_difference(r.tokens, reference_tokens)}


def _ratios(rows: list[Row], limit_step: float, floor: float) -> tuple[dict[str, float], Row]:
    """The result's ratios between rows, to the bandwidth limit (``limit_step`` seconds per token)
    and to the weight-read floor (``floor`` seconds), and kvlib's fastest cached row."""
    by = {r.impl: r for r in rows}
    kv_c, hf_c = by[Impl("kvlib", True)], by[Impl("transformers", True)]
    kv_u, hf_u = by[Impl("kvlib", False)], by[Impl("transformers", False)]
    kv_cc = by.get(Impl("kvlib", True, compiled=True))
    ratios = {
        "kvlib_cached_vs_transformers_cached_decode": hf_c.decode_step_seconds / kv_c.decode_step_seconds,
        "kvlib_cached_vs_transformers_cached_total": hf_c.median / kv_c.median,
        "kvlib_uncached_over_cached": kv_u.median / kv_c.median,
        "transformers_uncached_over_cached": hf_u.median / hf_c.median,
        "kvlib_decode_share_of_bandwidth_limit": limit_step / kv_c.decode_step_seconds,
        "transformers_decode_share_of_bandwidth_limit": limit_step / hf_c.decode_step_seconds,
        "weight_read_floor_share_of_bandwidth_limit": limit_step / floor,
        "weight_read_floor_vs_transformers_cached_decode": hf_c.decode_step_seconds / floor,
    }
    if kv_cc is not None:
        ratios.update({
            "kvlib_compiled_vs_transformers_cached_decode": hf_c.decode_step_seconds / kv_cc.decode_step_seconds,
            "kvlib_compiled_decode_share_of_bandwidth_limit": limit_step / kv_cc.decode_step_seconds,
            "kvlib_uncached_over_compiled_cached": kv_u.median / kv_cc.median,
        })
    peer_row = by.get(Impl("llama.cpp", True, format="Q4_1 file"))
    kvlib_cached = [r for r in rows if r.impl.library == "kvlib" and r.impl.cache]
    fastest = min(kvlib_cached, key=lambda r: r.decode_step_seconds)
    if peer_row is not None:
        fastest_prefill = min(kvlib_cached, key=lambda r: r.prefill_seconds)
        ratios.update({
            "kvlib_fastest_decode_vs_llama_cpp": peer_row.decode_step_seconds / fastest.decode_step_seconds,
            "kvlib_fastest_prefill_vs_llama_cpp": peer_row.prefill_seconds / fastest_prefill.prefill_seconds,
        })
    return ratios, fastest


FAST = "fast 4-bit"     # the fast path's format: kvlib.fast.fast_model of the native 4-bit model


NEW_PROCESS = """
import sys, time, torch
torch.set_num_threads(int(sys.argv[1]))
from kvlib import generate, load_smollm2
from kvlib.compiled import compiled_decode_step
from kvlib.data import demo_prompt
model, tokenizer = load_smollm2(device="cpu")
start = time.perf_counter()
generate(model, demo_prompt(tokenizer), 2, compile=True)
print(time.perf_counter() - start, compiled_decode_step(model).compile_seconds)
headers, values = torch._dynamo.utils.compile_times(repr="csv", aggregate=True)
print(dict(zip(headers, values)))
"""


def new_process_first_compiled_call(threads: int) -> dict:
    """Section 5's compiled cell as a learner's second run makes it: a new Python process that
    loads the float32 model and calls ``generate(..., compile=True)``, after this process compiled
    the same step (so torch's on-disk cache holds it). The seconds of that call, of its first
    compiled step, and torch's own breakdown of the compile (the phases over 0.5 s)."""
    import ast
    import subprocess

    out = subprocess.run([sys.executable, "-c", NEW_PROCESS, str(threads)], capture_output=True, text=True,
                         check=True).stdout.strip().splitlines()
    call, step = map(float, out[-2].split())
    phases = {k: float(str(v).split(",")[0]) for k, v in ast.literal_eval(out[-1]).items()}
    return {"generate_seconds": call, "first_compiled_call_seconds": step,
            "phases": {k: v for k, v in sorted(phases.items(), key=lambda kv: -kv[1]) if v >= 0.5}}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlib.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs with the cache (median)")
    parser.add_argument("--repeats-uncached", type=int, default=1, help="timed runs without the cache")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile row (it needs a C++ compiler and time to compile)")
    parser.add_argument("--no-formats", action="store_true", help="skip kvlib's bfloat16, int8 and 4-bit rows")
    parser.add_argument("--no-peer", action="store_true", help="skip llama.cpp even when it is installed")
    parser.add_argument("--no-batched", action="store_true", help="skip batched decode at 1, 8 and 32 sequences")
    parser.add_argument("--no-serving", action="store_true", help="skip the serving streams on vLLM even when installed")
    parser.add_argument("--compile-formats", action="store_true",
                        help="also compile every other format (several minutes each)")
    parser.add_argument("--out", type=Path, default=Path("_build/bench"),
                        help="folder for bench.json, bench.md and goals.md (default: _build/bench)")
    args = parser.parse_args(argv)
    result = run(args.new_tokens, args.repeats, args.repeats_uncached, args.threads, compile=not args.no_compile,
                 formats=not args.no_formats, peer=not args.no_peer, compile_formats=args.compile_formats,
                 batched=not args.no_batched, serving=not args.no_serving)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    md, goals_md = to_markdown(result), goals_markdown(result)
    (args.out / "bench.md").write_text(md)
    (args.out / "goals.md").write_text(goals_md)
    print(md)
    print(goals_md)
    print(f"written: {args.out / 'bench.json'}, {args.out / 'bench.md'} and {args.out / 'goals.md'}", file=sys.stderr)
    return 0 if result["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
