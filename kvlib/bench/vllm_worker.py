"""vLLM's side of the serving comparison, run in vLLM's own environment (``make peer-vllm``).

    .venv-vllm/bin/python -P kvlib/bench/vllm_worker.py JOB.json RESULT.json

A script, not a kvlib module: it imports only the standard library, torch, transformers and
vLLM, because kvlib is not installed in vLLM's environment (``-P`` keeps this folder off
``sys.path``, so that no file here shadows a package). :mod:`kvlib.bench.serving_peer` writes
the job and reads the result; the JSON keys are the contract between the two.

The environment (``kvlib.bench.serving_peer.VLLM_ENV``) sets vLLM's CPU options. The job holds ``model_dir`` (the Hugging Face folder of :func:`kvlib.bench.serving_peer.export_hf`),
``threads``, an optional ``check`` (a prompt and the path of kvlib's logits for it, saved with
``torch.save``) and ``streams``: each a ``name``, its ``prompts`` (token ids), ``max_tokens`` and
the ``engine`` arguments of :class:`vllm.LLM`. Each stream gets an engine of its own (its
arguments differ), a warm-up on its first prompts, then ``repeats`` timed ``LLM.generate`` calls
of the whole stream (greedy, every request ``max_tokens`` long: EOS ignored), each from an
empty prefix cache; the result is the run of median time, with every run's time beside it.
The ``if __name__ == "__main__"`` guard matters: vLLM starts worker processes that import this file.
"""
from __future__ import annotations

import json
import sys
import time


def check_export(model_dir: str, check: dict) -> dict:
    """The exported folder read by transformers in float32 against kvlib's logits for ``check["prompt"]``."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([check["prompt"]])).logits[0]        # (positions, vocab)
    ref = torch.load(check["logits"]).detach()
    return {"max_abs_logit_difference": float((logits - ref).abs().max()),
            "same_argmax": bool((logits.argmax(-1) == ref.argmax(-1)).all()), "positions": len(check["prompt"])}


def _counters(llm) -> dict:
    """vLLM's own counters (its Prometheus metrics): totals, and histograms' counts and sums as
    ``<name>:count`` and ``<name>:sum``."""
    found = {}
    for m in llm.get_metrics():
        if hasattr(m, "value"):
            found[m.name] = found.get(m.name, 0) + m.value
        elif hasattr(m, "count"):
            found[m.name + ":count"] = found.get(m.name + ":count", 0) + m.count
            found[m.name + ":sum"] = found.get(m.name + ":sum", 0) + m.sum
    return found


def run_stream(stream: dict, model_dir: str) -> dict:
    """One engine for ``stream``: start it, warm it up, time one ``generate`` of the stream."""
    from vllm import LLM, SamplingParams

    started = time.perf_counter()
    llm = LLM(model=model_dir, dtype="float32", seed=0, disable_log_stats=False, **stream["engine"])
    start_up = time.perf_counter() - started
    prompts = [{"prompt_token_ids": p} for p in stream["prompts"]]
    greedy = SamplingParams(temperature=0.0, max_tokens=stream["max_tokens"], ignore_eos=True, detokenize=False)
    warm = time.perf_counter()
    llm.generate(prompts[:stream["engine"].get("max_num_seqs", 8)], greedy, use_tqdm=False)
    llm.reset_prefix_cache()
    warm_up = time.perf_counter() - warm
    runs = []
    for _ in range(stream.get("repeats", 1)):
        before = _counters(llm)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, greedy, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = _counters(llm)
        llm.reset_prefix_cache()                     # each timed run starts from an empty cache
        runs.append({"name": stream["name"], "outputs": [list(o.outputs[0].token_ids) for o in outs], "wall": wall,
                     "ttft": [o.metrics.first_token_latency if o.metrics else None for o in outs],
                     "cached_tokens": [o.num_cached_tokens or 0 for o in outs],
                     "counters": {k: v - before.get(k, 0) for k, v in after.items()}})
    llm.llm_engine.engine_core.shutdown()            # its processes would keep a core busy
    median = sorted(runs, key=lambda r: r["wall"])[len(runs) // 2]
    return {**median, "walls": [r["wall"] for r in runs], "start_up_seconds": start_up, "warm_up_seconds": warm_up}


def main(job_path: str, result_path: str) -> int:
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    import torch
    import vllm

    torch.set_num_threads(job["threads"])
    result = {"vllm": vllm.__version__, "torch": torch.__version__, "threads": job["threads"], "streams": []}
    if job.get("check"):
        result["check"] = check_export(job["model_dir"], job["check"])
    for stream in job["streams"]:
        result["streams"].append(run_stream(stream, job["model_dir"]))
        with open(result_path, "w", encoding="utf-8") as f:             # each stream as soon as it is done
            json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
