"""The benchmark's report: :func:`to_markdown` turns what :func:`kvlib.bench.run.run` measured
(a JSON-ready dict) into the tables and sentences of ``bench.md``, the book's appendix."""
from __future__ import annotations

from ..measure.timing import fmt_seconds

__all__ = ["to_markdown", "goals_markdown"]


def to_markdown(result: dict) -> str:
    """The results as a markdown table plus the facts needed to read it (``bench.md``, the appendix's page)."""
    sections = [_timings, _formats, _kernel_choice, _batched, _peer, _serving, _bandwidth, _ratios, _compile_note,
                _profile, _profile_fast]
    lines = [line for section in sections for line in section(result)]
    return "\n".join(lines) + "\n"


def goals_markdown(result: dict) -> str:
    """The project's performance goals as this run measured them (``goals.md``: tracking, not the appendix)."""
    m = result["machine"]
    head = [f"Goals of one `python -m kvlib.bench` run on {m['cpu']} ({m.get('vector_extensions', 'unknown')}), "
            f"{m['torch_threads']} threads, {result['date']}."]
    return "\n".join(head + _goals(result)) + "\n"


def _shown(value, spec=".1f") -> str:
    """``value`` formatted with ``spec``, or a dash for ``None``."""
    return "–" if value is None else format(value, spec)


def _timings(result: dict) -> list[str]:
    """The machine, the prompt, and the table of every implementation's timings."""
    m = result["machine"]
    lines = [
        f"Measured on {m['cpu']} ({m.get('vector_extensions', 'unknown')} vector instructions, "
        f"{m['logical_cpus']} logical CPUs, {m['torch_threads']} torch threads), "
        f"PyTorch {m['torch']}, Python {m['python']}, on {result['date']}.",
        "",
        f"Prompt: {result['prompt_tokens']} tokens (the real-model section's demo); {result['new_tokens']} new "
        f"greedy tokens; medians of {result['repeats']['cached']} runs with the cache and "
        f"{result['repeats']['uncached']} without. Same tokens from all "
        f"{sum(row.get('format', 'float32') == 'float32' for row in result['rows'])} float32 implementations: "
        f"**{result['same_tokens']}**. The other formats round differently, so their greedy tokens may part "
        "from float32's after a near-tie: the last column says where (– where they do not).",
        "",
        "| implementation | time for all tokens | tokens/s (whole call) | decode tokens/s (one-token steps) "
        "| prefill tokens/s | parts from float32 at token |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in result["rows"]:
        lines.append(f"| {row['name']} | {fmt_seconds(row['median_seconds'])} | {row['tokens_per_s']:.1f} "
                     f"| {_shown(row['decode_tokens_per_s'])} | {_shown(row.get('prefill_tokens_per_s'))} "
                     f"| {_shown(row.get('parts_from_float32_at'), 'd')} |")
    return lines


def _formats(result: dict) -> list[str]:
    """The table of kvlib's formats (weights, floor, decode step, quality); none without formats."""
    if not result.get("formats"):
        return []
    quality = result.get("quality") or {}
    lines = ["", "Each kvlib format's weights as it holds them, its weight-read floor (every matrix once, "
                 "back to back, in that format's kernels), its decode step, with the cache, eager, and its "
                 f"predictions against float32's over the first {result.get('quality_tokens')} tokens of the "
                 "evaluation text (KL divergence, mean and 99th percentile, and the share of positions whose "
                 "most likely token is float32's). The fast 4-bit path is the native 4-bit model with its "
                 "matrices fused at load time (`kvlib.fast.fuse`: q, k and v as one matrix, gate and up as "
                 "one) and its kernels chosen by measuring this machine (`kvlib.fast.fast_model`, below).", "",
             "| format | weights | weight-read floor | decode step | step / floor | KL mean | KL p99 "
             "| same top-1 |", "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for f in result["formats"]:
        q = quality.get(f["format"])
        judged = (f"{q['kl_mean']:.4f} | {q['kl_p99']:.3f} | {100 * q['top1']:.1f} %" if q else
                  "(the reference) | |" if f["format"] == "float32" else "– | – | –")
        lines.append(f"| {f['format']} | {f['weight_bytes'] / 2**20:.1f} MiB | {f['weight_read_floor_ms']:.1f} ms "
                     f"| {f['decode_step_ms']:.1f} ms | {f['decode_step_ms'] / f['weight_read_floor_ms']:.2f}× "
                     f"| {judged} |")
    return lines


KERNEL_NAMES = {"int4": "PyTorch's int4 kernel", "q4_1": "kvlib's Q4_1 kernel", "int8": "int8 (PyTorch's kernel)",
                "q8_0": "Q8_0 (kvlib's kernel)", "tied": "the tied embedding"}


def _kernel_choice(result: dict) -> list[str]:
    """What the fast path chose on this machine, and the timings it chose from; none without a choice."""
    c = result.get("kernel_choice")
    if not c:
        return []
    out = ", ".join(f"{name} {ms:.2f} ms" for name, ms in c["output_ms"].items())
    sizes = "; ".join(f"{b} row{'s' if b != '1' else ''}: " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in t.items())
                      for b, t in c["layers_ms"].items())
    packed = KERNEL_NAMES.get(c.get("layer_kernel", "int4"), c.get("layer_kernel"))
    dense = (f"{packed} at every batch size measured" if c["dense_from"] is None else
             f"the {c['dense_kernel']} weights from {c['dense_from']} rows on, {packed} below")
    return ["", f"The fast path's kernels, measured on this machine (`kvlib.fast.kernel_choice`, kept in kvlib's "
                f"folder for the next run): output layer **{KERNEL_NAMES.get(c['output_layer'], c['output_layer'])}** "
                f"(a decode step with each: {out}; another than the tied one only when the step is clearly faster "
                f"with it, as it rounds the embedding again){_packed_rows(c)}; 4-bit layers: **{dense}** (every 4-bit "
                f"layer once, back to back: {sizes})."]


def _packed_rows(c: dict) -> str:
    """Where an int8 or Q8_0 output layer leaves its kernel for its dense weight (none for the tied layer)."""
    if c["output_layer"] == "tied" or not c.get("output_rows_ms"):
        return ""
    at = "; ".join(f"{b} rows: " + ", ".join(f"{k} {ms:.2f} ms" for k, ms in t.items())
                   for b, t in c["output_rows_ms"].items())
    where = ("its kernel at every batch size measured" if c.get("output_dense_from") is None else
             f"its weight dequantized to {c['output_dense_kernel'].removeprefix('dense ')} "
             f"from {c['output_dense_from']} rows on, its kernel below")
    return f", **{where}** (the layer alone: {at})"


def _batched(result: dict) -> list[str]:
    """The table of batched decode rates, one column per batch size; none without batched rows."""
    if not result.get("batched"):
        return []
    sizes = sorted({b["batch"] for b in result["batched"]})
    names = list(dict.fromkeys(b["name"] for b in result["batched"]))
    rate = {(b["name"], b["batch"]): b["decode_tokens_per_s"] for b in result["batched"]}
    lines = ["", "Batched decode, as llama.cpp's `llama-batched-bench` measures it: each sequence a prompt of "
                 "128 tokens (distinct pieces of the evaluation text), prefilled, then 32 greedy tokens for "
                 "every sequence, one per sequence per step. Decode tokens/s: every sequence's new tokens over "
                 "the time of the one-token steps.", "",
             "| implementation | " + " | ".join(f"batch {n}" for n in sizes) + " |",
             "|---|" + "---:|" * len(sizes)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_shown(rate.get((name, n))) for n in sizes) + " |")
    return lines


def _peer(result: dict) -> list[str]:
    """What llama.cpp ran, or why it has no row; none when the result says nothing of a peer."""
    peer = result.get("peer")
    if peer and peer.get("missing"):
        return ["", f"No llama.cpp row: {peer['missing']}."]
    if peer:
        return ["", f"llama.cpp: llama-cpp-python {peer['version']}, its vendored llama.cpp, on the same GGUF "
                    "file (Q4_1 layers, a Q8_0 embedding), with the same threads, greedy, its own KV cache "
                    "reset before every run." + _peer_setting(peer.get("setting"))]
    return []


def _serving(result: dict) -> list[str]:
    """kvlib's engine beside vLLM on the serving streams, or why there is no such table; none when
    the result says nothing of serving (a run from before it existed)."""
    serving = result.get("serving")
    if not serving:
        return []
    if serving.get("missing"):
        return ["", f"No vLLM rows: {serving['missing']}."]
    lines = ["", f"Serving, kvlib's `Engine` beside vLLM {serving['vllm']} (`kvlib.bench.serving_peer`, the page "
                 "\"From kvlib to vLLM\"): the same float32 weights, the same streams, greedy, the same block size, "
                 f"batch limit and prefix caching; {serving['repeats']} rounds, each engine once a round in turn, the run of median time; "
                 "kvlib / vLLM is the median of the rounds' ratios (vLLM's time over kvlib's: above 1, kvlib is "
                 "faster), for the first token too where the run kept each round's. `kvlib`: "
                 "the model as loaded, eager; `kvlib_fast`: as vLLM's CPU build runs its model, the matrices fused and "
                 "packed once for a matrix kernel (kvlib's panels where kvlib's kernels build with AVX2 or AVX-512, else oneDNN), "
                 "the forward pass compiled with attention as one operator.", "",
             "| stream | engine | kvlib tok/s | vLLM tok/s | kvlib / vLLM | first token, median (kvlib / vLLM) | "
             "from the prefix cache (kvlib / vLLM) | answers identical to vLLM's |", "|---|---|---:|---:|---:|---|---|---|"]
    rows = {(r["stream"], r["engine"]): r for r in serving["rows"]}
    for name, (same, total) in serving["identical"].items():
        stream, engine = name.split("/")
        a, b = rows[(stream, engine)], rows[(stream, "vllm")]
        lines.append(f"| {stream} | {engine} | {a['tokens_per_s']:.1f} | {b['tokens_per_s']:.1f} | "
                     f"{a['ratio_median']:.2f}× | {fmt_seconds(a['ttft_median'])} / "
                     f"{fmt_seconds(b['ttft_median'])}{_first_token_ratio(a)} | {a['hit_rate']:.0%} / {b['hit_rate']:.0%} | {same} of {total} |")
    return lines


def _first_token_ratio(row: dict) -> str:
    """`` (1.03×)``: the median of the rounds' first-token ratios (vLLM's wait over kvlib's), where
    the row has it; nothing for a record made before the rounds' first tokens were kept."""
    ratio = row.get("ttft_ratio_median")
    return "" if ratio is None else f" ({ratio:.2f}×)"


def _peer_setting(setting: dict | None) -> str:
    """Which flash-attention setting the peer's rows use, and the decode step of each tried."""
    if not setting:
        return ""
    steps = ", ".join(f"{name} {seconds * 1e3:.1f} ms" for name, seconds in setting["decode_step_seconds"].items())
    crashed = ("" if setting.get("extra_buffers", True) else
               " Its extra buffer types (weights repacked for its AMX and other special kernels, on by default) "
               "crashed llama.cpp in a probe on this machine, so it runs without them, with its ordinary CPU kernels.")
    return (f" Its rows use flash attention {'on' if setting['flash_attn'] else 'off'}, the faster of the two "
            f"on this machine (decode step: {steps}).{crashed}")


def _bandwidth(result: dict) -> list[str]:
    """The bandwidth limit and the weight-read floor, then the head of the ratio table."""
    r = result["ratios"]
    return [
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


def _ratios(result: dict) -> list[str]:
    """The rows of the ratio table: every ratio measured (those absent skipped), then each float32
    implementation's decode step as a share of the weight-read floor."""
    r = result["ratios"]
    ratio_rows = [
        ("kvlib cached decode / transformers cached decode (tokens/s)", r["kvlib_cached_vs_transformers_cached_decode"], "x"),
        ("kvlib compiled cached decode / transformers cached decode (tokens/s)",
         r.get("kvlib_compiled_vs_transformers_cached_decode"), "x"),
        ("kvlib cached / transformers cached, whole call", r["kvlib_cached_vs_transformers_cached_total"], "x"),
        (f"kvlib's fastest decode ({result.get('fastest_kvlib')}) / llama.cpp decode (tokens/s)",
         r.get("kvlib_fastest_decode_vs_llama_cpp"), "x"),
        ("kvlib's fastest prefill / llama.cpp prefill (tokens/s)", r.get("kvlib_fastest_prefill_vs_llama_cpp"), "x"),
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
        if row["decode_tokens_per_s"] and row.get("format", "float32") == "float32" and row.get("library") != "llama.cpp":
            ratio_rows.append((f"{row['name']}: decode step, share of the weight-read floor",
                               floor_s * row["decode_tokens_per_s"], "%"))
    lines = []
    for label, value, kind in ratio_rows:
        if value is None:
            continue
        shown = {"x": f"{value:.2f}×", "x1": f"{value:.1f}×", "%": f"{100 * value:.0f} %"}[kind]
        lines.append(f"| {label} | {shown} |")
    return lines


def _compile_note(result: dict) -> list[str]:
    """How long the first compiled call took; none when nothing was compiled."""
    if "kvlib_compiled_vs_transformers_cached_decode" not in result["ratios"]:
        return []
    lines = ["", f"The first compiled call (`generate(..., compile=True)`, float32) took "
                 f"{fmt_seconds(result['compile_seconds'])}, compilation included; later calls reuse the "
                 "compiled code. torch keeps compiled code on disk (kvlib's folder), so it is shorter when an "
                 "earlier run on the same machine compiled the same step."]
    if result.get("compile_seconds_fast") is not None:
        lines[-1] += (" The fast 4-bit path's step is compiled with Inductor's C++ wrapper (`kvlib.fast.compile_fast_step`"
                      ": its kernels called from C++, not Python; a longer first compile); its first "
                      f"compiled call took {fmt_seconds(result['compile_seconds_fast'])}.")
    new = result.get("new_process")
    if new:
        phases = ", ".join(f"{name} {sec:.1f} s" for name, sec in list(new["phases"].items())[:6])
        lines += ["", f"A learner's second run, in a new process (section 5's cell: load the float32 model, "
                      f"`generate(..., compile=True)`): the whole call {fmt_seconds(new['generate_seconds'])}, its "
                      f"first compiled step {fmt_seconds(new['first_compiled_call_seconds'])}, nothing compiled "
                      f"again; torch's own account of that step's compile phases (nested, so they overlap): {phases}."]
    return lines


def _operator_table(top: list) -> list[str]:
    """A profile's top operators as a table: name, calls per step, milliseconds per step."""
    return [
        "",
        "| operator | calls per step | ms per step |",
        "|---|---:|---:|",
    ] + [f"| `{name}` | {calls:.0f} | {ms:.2f} |" for name, calls, ms in top]


def _profile(result: dict) -> list[str]:
    """The float32 decode step's profile; none without one."""
    p = result.get("profile")
    if not p:
        return []
    return [
        "",
        f"Profile of one kvlib decode step at {p['context_len']} tokens of context (torch profiler, "
        f"{p['ms_per_step']:.1f} ms of operator time, {p['ops_per_step']:.0f} operator calls): "
        f"{100 * p['matmul_share']:.0f} % in matrix products, which read the weights; the rest is the "
        "per-operator cost of running eagerly (norms, rotary embedding, reshapes, attention).",
    ] + _operator_table(p["top"])


def _profile_fast(result: dict) -> list[str]:
    """The fast 4-bit path's decode step profile; none without one."""
    pf = result.get("profile_fast")
    if not pf:
        return []
    return [
        "",
        f"Profile of one decode step of the {pf.get('label', 'fast 4-bit path')} at {pf['context_len']} tokens "
        f"of context: {pf['wall_ms_per_step']:.1f} ms per step unprofiled, of which {pf['ms_per_step']:.1f} ms in "
        f"{pf['ops_per_step']:.0f} PyTorch operator calls ({100 * pf['matmul_share']:.0f} % of it in the weight-only "
        "kernels); the rest is code between them (Python, and a compiled step's own fused kernels, which the "
        "profiler does not list).",
    ] + _operator_table(pf["top"])


def _goals(result: dict) -> list[str]:
    """The performance goals as this run measured them; none without goals."""
    if not result.get("goals"):
        return []
    lines = ["", "The performance goals, as this run measured them (where one is not met: by how much, and where "
                 "the time of that step goes, from this run's profile of it):", "",
             "| goal | target | measured | met | short by | where the step's time goes |", "|---|---:|---:|---|---|---|"]
    for g in result["goals"]:
        unit = g.get("unit", "%" if g["target"] < 1 else "x")
        show = {"%": lambda v: f"{100 * v:.0f} %", "x": lambda v: f"{v:.2f}×", "s": lambda v: f"{v:.1f} s"}[unit]
        value = "not measured" if g["value"] is None else show(g["value"])
        target = ("≤ " if g.get("at_most") else "") + show(g["target"])
        met = "–" if g["met"] is None else ("yes" if g["met"] else "no")
        lines.append(f"| {g['goal']} | {target} | {value} | {met} | {g.get('short_by') or ''} | {g.get('held_by') or ''} |")
    return lines
