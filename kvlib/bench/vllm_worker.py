"""vLLM's side of the serving comparison, run in vLLM's own environment (``make peer-vllm``).

    .venv-vllm/bin/python -P kvlib/bench/vllm_worker.py JOB.json

A script, not a kvlib module: it imports only the standard library, torch, transformers and
vLLM, because kvlib is not installed in vLLM's environment (``-P`` keeps this folder off
``sys.path``, so that no file here shadows a package). :class:`kvlib.bench.serving_peer.VllmWorker`
starts it and talks to it; the JSON keys are the contract between the two.

The environment (``kvlib.bench.serving_peer.VLLM_ENV``) sets vLLM's CPU options. The job holds
``model_dir`` (the Hugging Face folder of :func:`kvlib.bench.serving_peer.export_hf`), ``threads``
and an optional ``check`` (a prompt and the path of kvlib's logits for it, saved with
``torch.save``). The worker answers each command, a JSON line on its standard input, with a JSON
line on its standard output after :data:`MARK` (vLLM's own log lines go there too):

- first, unasked: ``{"vllm", "torch", "threads", "check"}``;
- ``{"start": stream}`` (a ``name``, its ``prompts`` as token ids, ``max_tokens``, the ``engine``
  arguments of :class:`vllm.LLM`): an engine for the stream, warmed up on its first prompts;
  answers ``{"start_up_seconds", "warm_up_seconds"}``;
- ``{"run": true}``: one timed ``LLM.generate`` of the whole stream, greedy, every request
  ``max_tokens`` long (EOS ignored), from an empty prefix cache; answers the run: ``outputs``,
  ``wall``, ``ttft``, ``cached_tokens`` and vLLM's ``counters`` for it;
- ``{"stop": true}``: the engine shut down; answers ``{"stopped": true}``.

Between commands it waits on its input, using no processor, so the engine that runs meanwhile
has the cores to itself. The ``if __name__ == "__main__"`` guard matters: vLLM starts worker
processes that import this file.
"""
from __future__ import annotations

import json
import sys
import time

MARK = "@kvlib-worker "          # starts each answer line


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


class StreamEngine:
    """One stream's vLLM engine, started and warmed up; :meth:`run` times the stream once."""

    def __init__(self, stream: dict, model_dir: str) -> None:
        from vllm import LLM, SamplingParams

        started = time.perf_counter()
        self.llm = LLM(model=model_dir, seed=0, disable_log_stats=False, **stream["engine"])   # dtype among them
        self.start_up = time.perf_counter() - started
        self.stream = stream
        self.prompts = [{"prompt_token_ids": p} for p in stream["prompts"]]
        self.greedy = SamplingParams(temperature=0.0, max_tokens=stream["max_tokens"], ignore_eos=True,
                                     detokenize=False)
        warm = time.perf_counter()
        self.llm.generate(self.prompts[:stream["engine"].get("max_num_seqs", 8)], self.greedy, use_tqdm=False)
        self.llm.reset_prefix_cache()
        self.warm_up = time.perf_counter() - warm

    def run(self) -> dict:
        before = _counters(self.llm)
        t0 = time.perf_counter()
        outs = self.llm.generate(self.prompts, self.greedy, use_tqdm=False)
        wall = time.perf_counter() - t0
        after = _counters(self.llm)
        self.llm.reset_prefix_cache()                     # each timed run starts from an empty cache
        return {"name": self.stream["name"], "outputs": [list(o.outputs[0].token_ids) for o in outs], "wall": wall,
                "ttft": [o.metrics.first_token_latency if o.metrics else None for o in outs],
                "cached_tokens": [o.num_cached_tokens or 0 for o in outs],
                "counters": {k: v - before.get(k, 0) for k, v in after.items()}}

    def stop(self) -> None:
        self.llm.llm_engine.engine_core.shutdown()


def answer(found: dict) -> None:
    print(MARK + json.dumps(found), flush=True)


def main(job_path: str) -> int:
    with open(job_path, encoding="utf-8") as f:
        job = json.load(f)
    import torch
    import vllm

    torch.set_num_threads(job["threads"])
    hello = {"vllm": vllm.__version__, "torch": torch.__version__, "threads": job["threads"]}
    if job.get("check"):
        hello["check"] = check_export(job["model_dir"], job["check"])
    answer(hello)
    engine = None
    for line in sys.stdin:
        command = json.loads(line)
        if "start" in command:
            engine = StreamEngine(command["start"], job["model_dir"])
            answer({"start_up_seconds": engine.start_up, "warm_up_seconds": engine.warm_up})
        elif "run" in command:
            answer(engine.run())
        elif "stop" in command:
            engine.stop()
            engine = None
            answer({"stopped": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
