"""``python -m kvlib.bench``: kvlib's decoders against Hugging Face transformers on the real model.

In one run, on the same prompt (the real-model section's demo), weights, thread count and
number of new tokens, it

1. measures this machine's memory bandwidth (reading a large buffer), and how fast the
   matrix-vector products alone read the model's weights (the *weight-read floor*: a decode
   step can be no faster with these kernels);
2. times kvlib ``generate`` with and without the cache (and, unless ``--no-compile``, with
   the cache and ``compile=True``), and transformers' ``generate`` with ``use_cache=True``
   and ``False`` (greedy; warm-up first; several repeats; medians);
3. checks that all of them produce the same tokens;
4. prints a table of tokens/s, the ratios between them, and kvlib's share of the bandwidth
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

import torch

from ..clock import Stopwatch
from ..generate import generate
from .hardware import machine_description, memory_bandwidth, weight_read_floor
from .timing import fmt_seconds


@dataclass(frozen=True)
class Impl:
    """Which implementation a row of the benchmark times."""

    library: str                 # "kvlib" or "transformers"
    cache: bool
    compiled: bool = False

    @property
    def label(self) -> str:
        return (f"{self.library}, {'with' if self.cache else 'without'} cache"
                + (", compiled" if self.compiled else ""))


@dataclass
class Row:
    """One implementation, both as tokens/s over the whole call and per decode step."""

    impl: Impl
    seconds: list[float]                 # wall-clock of each timed generate call
    decode_step_seconds: float | None    # median of the one-token steps (cached paths only)
    tokens: list[int] = field(repr=False, default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)


def _time_kvlib(model, prompt, n_new, use_cache, repeats, compile=False) -> Row:
    generate(model, prompt, 4, use_cache=use_cache, compile=compile)     # warm-up (and compilation)
    seconds, steps, tokens = [], [], []
    for _ in range(repeats):
        with Stopwatch() as watch:
            out = generate(model, prompt, n_new, use_cache=use_cache, return_records=True, compile=compile)
        seconds.append(watch.seconds)
        steps += [r.seconds for r in out.records[1:]]
        tokens = out.tokens
    return Row(Impl("kvlib", use_cache, compile), seconds, statistics.median(steps) if use_cache else None, tokens)


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
        seconds, steps = [], []
        for _ in range(repeats):
            clock = StepClock()
            with Stopwatch() as watch:
                out = hf_model.generate(x, logits_processor=LogitsProcessorList([clock]), **kwargs)
            seconds.append(watch.seconds)
            steps += [b - a for a, b in zip(clock.stamps, clock.stamps[1:])]
    tokens = out[0, len(prompt):].tolist()
    return Row(Impl("transformers", use_cache), seconds, statistics.median(steps) if use_cache else None, tokens)


def profile_decode_step(model, context_len: int = 300, steps: int = 10) -> dict:
    """Where the time of one cached decode step goes, from the torch profiler.

    Returns the share of self CPU time spent in matrix products (which read the weights)
    and the other operators' share (the per-operator overhead of running eagerly), plus
    the top operators as rows of (name, calls per step, milliseconds per step).
    """
    from torch.profiler import ProfilerActivity, profile

    from .flops import step_call

    step = step_call(model, context_len, use_cache=True)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    matmul = sum(e.self_cpu_time_total for e in events if e.key in ("aten::mm", "aten::addmm", "aten::bmm"))
    top = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)[:8]
    return {
        "context_len": context_len,
        "ms_per_step": total / steps / 1e3,
        "matmul_share": matmul / total,
        "ops_per_step": sum(e.count for e in events) / steps,
        "top": [(e.key, e.count / steps, e.self_cpu_time_total / steps / 1e3) for e in top],
    }


def run(n_new: int = 48, repeats: int = 3, repeats_uncached: int = 1, threads: int | None = None,
        progress: bool = True, compile: bool = True) -> dict:
    """Run the whole benchmark and return its results as a JSON-ready dict."""
    import warnings

    from ..data import demo_prompt
    from ..smollm2 import load_smollm2, smollm2_path

    if threads:
        torch.set_num_threads(threads)
    say = (lambda *a: print(*a, file=sys.stderr, flush=True)) if progress else (lambda *a: None)
    say("measuring memory bandwidth ...")
    bandwidth = memory_bandwidth()
    say("loading the model (kvlib, then transformers) ...")
    model, tok = load_smollm2()
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    path = smollm2_path()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf_model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                        dtype=torch.float32).eval()
    prompt = demo_prompt(tok)
    say("timing the weight-read floor (every weight matrix once, back to back) ...")
    floor = weight_read_floor(model)
    rows = []
    for impl, reps in [(Impl("kvlib", True), repeats), (Impl("transformers", True), repeats),
                       (Impl("kvlib", False), repeats_uncached), (Impl("transformers", False), repeats_uncached)]:
        say(f"timing {impl.label} ({reps} run{'s' if reps > 1 else ''}) ...")
        if impl.library == "kvlib":
            rows.append(_time_kvlib(model, prompt, n_new, impl.cache, reps))
        else:
            rows.append(_time_transformers(hf_model, prompt, n_new, impl.cache, reps))
    compile_seconds = None
    if compile:
        say("compiling kvlib's decode step with torch.compile (this takes a while the first time) ...")
        with Stopwatch() as watch:
            generate(model, prompt, 2, compile=True)
        compile_seconds = watch.seconds
        say(f"timing kvlib, with cache, compiled ({repeats} runs) ...")
        rows.insert(1, _time_kvlib(model, prompt, n_new, True, repeats, compile=True))
    say("profiling one decode step ...")
    prof = profile_decode_step(model)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    limit_step = weight_bytes / bandwidth            # seconds per token if only the weights had to be read
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
    return {
        "machine": machine_description(),
        "prompt_tokens": len(prompt),
        "new_tokens": n_new,
        "repeats": {"cached": repeats, "uncached": repeats_uncached},
        "bandwidth_gb_s": bandwidth / 1e9,
        "weight_bytes": weight_bytes,
        "bandwidth_limit_tokens_per_s": 1 / limit_step,
        "weight_read_floor_ms": floor * 1e3,
        "compile_seconds": compile_seconds,
        "rows": [{"name": r.impl.label, "seconds": r.seconds, "median_seconds": r.median,
                  "tokens_per_s": n_new / r.median,
                  "decode_tokens_per_s": (1 / r.decode_step_seconds) if r.decode_step_seconds else None}
                 for r in rows],
        "same_tokens": all(r.tokens == kv_c.tokens for r in rows),
        "ratios": ratios,
        "profile": prof,
        "answer": tok.decode(kv_c.tokens),
        "date": time.strftime("%Y-%m-%d"),
    }


def to_markdown(result: dict) -> str:
    """The results as a markdown table plus the facts needed to read it."""
    m, r = result["machine"], result["ratios"]
    lines = [
        f"Measured on {m['cpu']} ({m.get('vector_extensions', 'unknown')} vector instructions, "
        f"{m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads), "
        f"PyTorch {m['torch']}, Python {m['python']}, on {result['date']}.",
        "",
        f"Prompt: {result['prompt_tokens']} tokens (the real-model section's demo); {result['new_tokens']} new "
        f"greedy tokens; medians of {result['repeats']['cached']} runs with the cache and "
        f"{result['repeats']['uncached']} without. Same tokens from all {len(result['rows'])}: "
        f"**{result['same_tokens']}**.",
        "",
        "| implementation | time for all tokens | tokens/s (whole call) | decode tokens/s (one-token steps) |",
        "|---|---:|---:|---:|",
    ]
    for row in result["rows"]:
        decode = f"{row['decode_tokens_per_s']:.1f}" if row["decode_tokens_per_s"] else "–"
        lines.append(f"| {row['name']} | {fmt_seconds(row['median_seconds'])} | {row['tokens_per_s']:.1f} | {decode} |")
    lines += [
        "",
        f"Memory bandwidth (reading a 512 MiB buffer): {result['bandwidth_gb_s']:.1f} GB/s. The weights are "
        f"{result['weight_bytes'] / 1e6:.0f} MB, so reading them once per token allows at most "
        f"{result['bandwidth_limit_tokens_per_s']:.1f} tokens/s.",
        "",
        f"Weight-read floor: running every weight matrix once as a matrix-vector product, back to back, "
        f"with the same kernels and nothing in between, takes {result['weight_read_floor_ms']:.1f} ms, "
        f"{100 * r['weight_read_floor_share_of_bandwidth_limit']:.0f} % of the bandwidth limit. No decode step "
        f"made of these products can beat it: at best {1e3 / result['weight_read_floor_ms']:.1f} tokens/s, "
        f"{r['weight_read_floor_vs_transformers_cached_decode']:.2f}× transformers' cached decode. "
        + ("The floor is close to the bandwidth limit: on this machine memory is the wall."
           if r["weight_read_floor_share_of_bandwidth_limit"] > 0.7 else
           "The floor is well above the bandwidth limit: on this machine the float32 matrix-vector kernel, "
           "not memory, is the wall."),
        "",
        "| ratio | value |",
        "|---|---:|",
    ]
    compiled = "kvlib_compiled_vs_transformers_cached_decode" in r
    ratio_rows = [
        ("kvlib cached decode / transformers cached decode (tokens/s)", r["kvlib_cached_vs_transformers_cached_decode"], "x"),
        ("kvlib compiled cached decode / transformers cached decode (tokens/s)",
         r.get("kvlib_compiled_vs_transformers_cached_decode"), "x"),
        ("kvlib cached / transformers cached, whole call", r["kvlib_cached_vs_transformers_cached_total"], "x"),
        ("kvlib: time without cache / with cache", r["kvlib_uncached_over_cached"], "x1"),
        ("kvlib: time without cache / with cache, compiled", r.get("kvlib_uncached_over_compiled_cached"), "x1"),
        ("transformers: time without cache / with cache", r["transformers_uncached_over_cached"], "x1"),
        ("kvlib cached decode, share of the bandwidth limit", r["kvlib_decode_share_of_bandwidth_limit"], "%"),
        ("kvlib compiled cached decode, share of the bandwidth limit",
         r.get("kvlib_compiled_decode_share_of_bandwidth_limit"), "%"),
        ("transformers cached decode, share of the bandwidth limit", r["transformers_decode_share_of_bandwidth_limit"], "%"),
    ]
    floor_s = result["weight_read_floor_ms"] / 1e3
    for row in result["rows"]:
        if row["decode_tokens_per_s"]:
            ratio_rows.append((f"{row['name']}: decode step, share of the weight-read floor",
                               floor_s * row["decode_tokens_per_s"], "%"))
    for label, value, kind in ratio_rows:
        if value is None:
            continue
        shown = {"x": f"{value:.2f}×", "x1": f"{value:.1f}×", "%": f"{100 * value:.0f} %"}[kind]
        lines.append(f"| {label} | {shown} |")
    if compiled:
        lines += ["", f"The first compiled call (`generate(..., compile=True)`) took "
                      f"{fmt_seconds(result['compile_seconds'])}, compilation included; later calls reuse the "
                      "compiled code. torch keeps compiled code on disk, so this is shorter when an earlier run "
                      "on the same machine compiled the same step."]
    p = result.get("profile")
    if p:
        lines += [
            "",
            f"Profile of one kvlib decode step at {p['context_len']} tokens of context (torch profiler, "
            f"{p['ms_per_step']:.1f} ms of operator time, {p['ops_per_step']:.0f} operator calls): "
            f"{100 * p['matmul_share']:.0f} % in matrix products, which read the weights; the rest is the "
            "per-operator cost of running eagerly (norms, rotary embedding, reshapes, attention).",
            "",
            "| operator | calls per step | ms per step |",
            "|---|---:|---:|",
        ] + [f"| `{name}` | {calls:.0f} | {ms:.2f} |" for name, calls, ms in p["top"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kvlib.bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--repeats", type=int, default=3, help="timed runs with the cache (median)")
    parser.add_argument("--repeats-uncached", type=int, default=1, help="timed runs without the cache")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    parser.add_argument("--no-compile", action="store_true",
                        help="skip the torch.compile row (it needs a C++ compiler and time to compile)")
    parser.add_argument("--out", type=Path, default=Path("_build/bench"),
                        help="folder for bench.json and bench.md (default: _build/bench)")
    args = parser.parse_args(argv)
    result = run(args.new_tokens, args.repeats, args.repeats_uncached, args.threads, compile=not args.no_compile)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "bench.json").write_text(json.dumps(result, indent=2) + "\n")
    md = to_markdown(result)
    (args.out / "bench.md").write_text(md)
    print(md)
    print(f"written: {args.out / 'bench.json'} and {args.out / 'bench.md'}", file=sys.stderr)
    return 0 if result["same_tokens"] else 1


if __name__ == "__main__":
    sys.exit(main())
