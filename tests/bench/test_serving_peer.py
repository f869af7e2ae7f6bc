"""The serving comparison with vLLM (kvlib.bench.serving_peer): the export that gives vLLM kvlib's
own weights, the token comparison, the report's figures, the stored run, and (only when asked
for, with vLLM installed) a run through vLLM itself."""
from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
import torch

import kvlib
from kvlib.bench import serving_peer
from kvlib.bench.serving_peer import (Stream, compare_tokens, export_hf, hf_state_dict, streams, summary,
                                      vllm_missing)
from kvlib.data import reference_serving
from kvlib.fast.packed import KERNELS, PackedLinear, packing_kernel

from tiny_models import tiny_model


def test_the_export_holds_kvlib_weights_unrounded_and_transformers_computes_kvlib_logits(tmp_path):
    """transformers' Llama, read from the folder, gives kvlib's logits: the names, the row order
    of q and k (both rotate-half) and the tied output layer are right."""
    from transformers import AutoModelForCausalLM

    model = tiny_model()
    state = hf_state_dict(model)
    assert len(state) == 2 + 9 * model.config.n_layers and "lm_head.weight" not in state
    assert all(t.dtype == torch.float32 and t.is_contiguous() for t in state.values())
    assert torch.equal(state["model.layers.1.self_attn.k_proj.weight"], model.blocks[1].attn.wk.weight)
    export_hf(model, tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
    with torch.no_grad():
        ours, got = model(ids), theirs(ids).logits
    assert (ours - got).abs().max() < 1e-4


def test_a_wrong_export_is_caught(tmp_path):
    """The same check fails when q and k are written in llama.cpp's interleaved order."""
    from transformers import AutoModelForCausalLM

    from kvlib.smollm2.gguf import permute

    model = tiny_model()
    export_hf(model, tmp_path)
    theirs = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        for layer in theirs.model.layers:
            q = layer.self_attn.q_proj.weight
            q.copy_(permute(q, model.config.n_heads))
        ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8, 9, 7]])
        assert (model(ids) - theirs(ids).logits).abs().max() > 1e-3


def test_compare_tokens_reports_where_answers_part_and_the_margin_there():
    model = tiny_model()
    prompt = [1, 2, 3, 4]
    ours = kvlib.generate(model, prompt, 6)
    theirs = ours[:3] + [(ours[3] + 1) % 64] + ours[4:]
    same, parted = compare_tokens(model, [prompt, prompt], [ours, ours], [ours, theirs])
    assert same == {"identical": True}
    logits = kvlib.generate(model, prompt, 4, keep_logits=True).logits[3]
    top = logits.topk(2).values
    assert parted["identical"] is False and parted["first_difference"] == 3
    assert parted["margin"] == pytest.approx(float(top[0] - top[1]))


def _record() -> dict:
    engine = {"outputs": [[1, 2], [3, 4]], "wall": 0.5, "ttft": [0.1, 0.3], "cached_tokens": [0, 4]}
    return {"streams": [{"name": "s", "prompts": [[1] * 6, [1] * 6], "max_tokens": 2,
                         "kvlib": {**engine, "steps": 3, "preemptions": 1, "prefill_tokens": 8, "inter_token_mean": 0.2,
                                   "walls": [0.5, 0.4, 0.6], "ttft_medians": [0.2, 0.25, 0.4]},
                         "vllm": {**engine, "wall": 1.0, "walls": [1.2, 1.0, 0.9], "ttft_medians": [0.3, 0.2, 0.2],
                                  "counters": {"vllm:iteration_tokens_total:count": 4,
                                                                      "vllm:inter_token_latency_seconds:sum": 0.3,
                                                                      "vllm:inter_token_latency_seconds:count": 2}}}]}


def test_the_summary_reads_each_engine_in_its_own_words():
    mine, theirs = summary(_record())
    assert (mine["engine"], theirs["engine"]) == ("kvlib", "vllm")
    assert mine["tokens_per_s"] == 4 / 0.5 and theirs["tokens_per_s"] == 4 / 1.0
    assert mine["hit_rate"] == theirs["hit_rate"] == 4 / 12
    assert (mine["steps"], mine["preemptions"], mine["prompt_tokens_computed"]) == (3, 1, 8)
    assert (theirs["steps"], theirs["preemptions"], theirs["prompt_tokens_computed"]) == (4, 0, 8)
    assert mine["ttft_median"] == pytest.approx(0.2)
    assert (mine["inter_token_mean"], theirs["inter_token_mean"]) == (0.2, 0.15)
    assert mine["round_ratios"] == pytest.approx([2.4, 2.5, 1.5]) and mine["ratio_median"] == pytest.approx(2.4)
    assert theirs["round_ratios"] is None and theirs["ratio_median"] is None
    assert mine["ttft_round_ratios"] == pytest.approx([1.5, 0.8, 0.5]) and mine["ttft_ratio_median"] == pytest.approx(0.8)
    assert theirs["ttft_round_ratios"] is None and theirs["ttft_ratio_median"] is None


def test_a_record_without_the_rounds_first_tokens_has_no_first_token_ratios():
    record = _record()
    del record["streams"][0]["vllm"]["ttft_medians"]
    mine, _ = summary(record)
    assert mine["ttft_round_ratios"] is None and mine["ttft_ratio_median"] is None
    assert mine["ratio_median"] == pytest.approx(2.4)


def test_the_summary_has_a_row_for_each_engine_the_record_holds_in_order():
    record = _record()
    record["streams"][0]["kvlib_fast"] = {**record["streams"][0]["kvlib"], "wall": 0.25}
    rows = summary(record)
    assert [r["engine"] for r in rows] == ["kvlib", "kvlib_fast", "vllm"] and rows[1]["tokens_per_s"] == 16


def test_the_fast_layout_computes_the_models_logits():
    """fast_float32: the chapter's float32 model fused and packed for the kernel this machine packs
    for (kvlib's panels or oneDNN): the same function up to the order of float32 additions, and the
    original left as it was."""
    model = tiny_model()
    fast, layout = serving_peer.fast_float32(model)
    ids = torch.tensor([[3, 14, 15, 9, 26, 5, 35, 8]])
    with torch.no_grad():
        assert (fast(ids) - model(ids)).abs().max() < 1e-4
    kernel = packing_kernel()
    assert (layout == f"fused, packed for {KERNELS[kernel]}") if kernel else layout.startswith("fused; not packed: ")
    assert {m.kernel for m in fast.modules() if isinstance(m, PackedLinear)} == ({kernel} if kernel else set())
    assert model.lm_head is None and not kvlib.fast.is_fused(model)


def test_kvlib_fast_is_compiled_where_a_compiler_is_found(monkeypatch):
    model = tiny_model()
    engines, layout = serving_peer.kvlib_engines(model)
    assert list(engines) == list(serving_peer.KVLIB_ENGINES) and engines["kvlib"] == (model, {})
    options = engines["kvlib_fast"][1]
    assert options["compile"] == (serving_peer.compiler_missing() is None)
    assert options["paged_attention"] in (kvlib.fast.paged_attention, None)
    assert layout.endswith("; paged-attention kernel") == (options["paged_attention"] is not None)
    monkeypatch.setattr(serving_peer, "compiler_missing", lambda: "no C++ compiler here")
    monkeypatch.setattr(serving_peer, "paged_attention_choice", lambda model: (None, "no kernels here"))
    engines, layout = serving_peer.kvlib_engines(model)
    assert engines["kvlib_fast"][1] == {"compile": False, "paged_attention": None}
    assert layout.endswith("; not compiled: no C++ compiler here; no paged-attention kernel: no kernels here")


class _FakeWorker:
    """Stands in for VllmWorker: answers as the worker does, and logs what it was asked."""

    def __init__(self, log: list) -> None:
        self.log, self.walls, self.cpu = log, iter([3.0, 1.0, 2.0]), 0.0

    def ask(self, command: dict) -> dict:
        self.log.append(("vllm", next(iter(command))))
        if "start" in command:
            return {"start_up_seconds": 7.0, "warm_up_seconds": 1.5}
        if "run" not in command:
            return {"stopped": True}
        wall = next(self.walls)
        return {"wall": wall, "outputs": [[1]], "ttft": [wall / 4, wall / 2, wall]}

    def cpu_seconds(self) -> float:
        self.cpu += 0.01
        return self.cpu


def test_the_engines_take_turns_and_each_keeps_its_median_run(monkeypatch):
    """take_turns: every engine warmed up before any is timed, then rounds of vLLM and each of
    kvlib's engines in turn; per engine the median run and every round's time in round order."""
    log = []

    def server(model, stream, **options):
        log.append((model, "warm-up"))
        walls = iter({"a": [2.0, 0.5, 1.0], "b": [4.0, 6.0, 5.0]}[model])
        def once():
            log.append((model, "run"))
            wall = next(walls)
            return {"wall": wall, "outputs": [[1]], "ttft": [wall / 2, wall / 2]}
        return once

    monkeypatch.setattr(serving_peer, "kvlib_server", server)
    found = serving_peer.take_turns(_FakeWorker(log), {"kvlib": ("a", {}), "kvlib_fast": ("b", {})},
                                    Stream("s", [[1]], 1, 1, False), repeats=3)
    assert log == [("vllm", "start"), ("a", "warm-up"), ("b", "warm-up"),
                   *[("vllm", "run"), ("a", "run"), ("b", "run")] * 3, ("vllm", "stop")]
    assert [found[k]["wall"] for k in ("vllm", "kvlib", "kvlib_fast")] == [2.0, 1.0, 5.0]
    assert found["kvlib"]["walls"] == [2.0, 0.5, 1.0] and found["vllm"]["walls"] == [3.0, 1.0, 2.0]
    assert found["kvlib"]["ttft_medians"] == [1.0, 0.25, 0.5] and found["vllm"]["ttft_medians"] == [1.5, 0.5, 1.0]
    assert found["vllm"]["start_up_seconds"] == 7.0
    assert found["vllm"]["cpu_seconds_while_kvlib_ran"] == pytest.approx(0.03)


_STAND_IN_VLLM = """
from types import SimpleNamespace as NS
__version__ = "stand-in"
print("INFO a log line of vLLM's own, on standard output")

class SamplingParams:
    def __init__(self, **kw):
        self.max_tokens = kw["max_tokens"]

class LLM:
    def __init__(self, model, **kw):
        self.kw, self.generated = kw, 0
        self.llm_engine = NS(engine_core=NS(shutdown=lambda: print("shut down")))

    def generate(self, prompts, params, use_tqdm):
        self.generated += 1
        return [NS(outputs=[NS(token_ids=[len(p["prompt_token_ids"])] * params.max_tokens)],
                   metrics=NS(first_token_latency=0.5), num_cached_tokens=self.kw["block_size"]) for p in prompts]

    def get_metrics(self):
        return [NS(name="vllm:num_preemptions", value=self.generated)]

    def reset_prefix_cache(self):
        pass
"""


def test_the_worker_answers_each_command_and_passes_vllms_own_lines_on(tmp_path, capsys):
    """The real worker script and VllmWorker's protocol, with a stand-in vllm package on the path."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(_STAND_IN_VLLM)
    os.environ["PYTHONPATH"], old = str(tmp_path), os.environ.get("PYTHONPATH")
    try:
        stream = Stream("s", [[1, 2, 3], [4, 5]], 2, 2, True)
        with serving_peer.VllmWorker(tmp_path, threads=1, python=Path(sys.executable)) as vllm:
            assert vllm.hello == {"vllm": "stand-in", "torch": torch.__version__, "threads": 1}
            assert set(vllm.ask({"start": serving_peer._vllm_stream(stream)})) == {"start_up_seconds",
                                                                                   "warm_up_seconds"}
            first, second = vllm.ask({"run": True}), vllm.ask({"run": True})
            assert vllm.ask({"stop": True}) == {"stopped": True}
            assert vllm.cpu_seconds() is None or vllm.cpu_seconds() > 0
        assert vllm.process.returncode == 0
    finally:
        os.environ.pop("PYTHONPATH") if old is None else os.environ.__setitem__("PYTHONPATH", old)
    assert first["outputs"] == [[3, 3], [2, 2]] and first["cached_tokens"] == [32, 32]
    assert first["ttft"] == [0.5, 0.5] and second["counters"] == {"vllm:num_preemptions": 1}
    assert "a log line of vLLM's own" in capsys.readouterr().out


def test_vllm_missing_says_what_to_do(tmp_path):
    assert "make peer-vllm" in vllm_missing(tmp_path / "no-python")
    if serving_peer.subprocess.run([sys.executable, "-c", "import vllm"], capture_output=True).returncode:
        assert "cannot import vllm" in vllm_missing(Path(sys.executable))


def test_the_engine_settings_translate_to_vllm_words():
    s = Stream("x", [[1]], 4, 8, True)
    assert s.vllm_engine() == {"block_size": 32, "max_num_seqs": 8, "max_num_batched_tokens": serving_peer.STEP_TOKENS,
                               "enable_prefix_caching": True, "max_model_len": 2048, "dtype": "float32"}


def test_standing_calls_a_lead_only_where_every_round_agrees():
    assert serving_peer.standing([1.1, 1.03, 1.3]) == "ahead in every round"
    assert serving_peer.standing([0.9, 0.97]) == "behind in every round"
    assert serving_peer.standing([1.02, 1.07, 0.92, 1.03, 0.99]) == "level: rounds on both sides of 1"


def test_standing_calls_a_round_within_two_percent_of_1_level():
    """A round within STANDING_TOLERANCE of 1 is no lead: the stored run's help desk had rounds of
    1.33, 1.05, 1.18, 1.0026 and 1.13, a 0.3 % round among them."""
    assert serving_peer.STANDING_TOLERANCE == 0.02
    assert serving_peer.standing([1.33, 1.05, 1.18, 1.0026, 1.13]) == "level: a round within 2 % of 1"
    assert serving_peer.standing([1.33, 1.05, 1.0]) == "level: a round within 2 % of 1"       # a tie is no lead
    assert serving_peer.standing([0.9, 0.99]) == "level: a round within 2 % of 1"
    assert serving_peer.standing([1.021, 1.5]) == "ahead in every round"
    assert serving_peer.standing([1.1, 1.01], tolerance=0.0) == "ahead in every round"


def test_step_products_runs_every_weight_once_and_the_output_layer():
    """The products of a decode step: 7 per layer and the tied output layer for the model as loaded."""
    import kvlib

    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    outs = serving_peer.step_products(model, 3)()
    c = model.config
    assert len(outs) == 7 * c.n_layers + 1 and outs[-1].shape == (1, 3, c.vocab_size)
    assert all(o.shape[:2] == (1, 3) for o in outs)


@pytest.mark.slow
def test_the_stored_run_is_of_these_streams_and_says_what_it_compared():
    """The page's stored run: its prompts are today's streams, its 'identical' flags agree with its
    outputs, and every difference it reports is a near-tie."""
    tokenizer = kvlib.load_smollm2()[1]
    run = reference_serving()
    assert [s.prompts for s in streams(tokenizer)] == [s["prompts"] for s in run["streams"]]
    for s in run["streams"]:
        assert set(s["tokens"]) == set(serving_peer.KVLIB_ENGINES)
        for key, found in s["tokens"].items():
            for t, a, b in zip(found, s[key]["outputs"], s["vllm"]["outputs"], strict=True):
                assert t["identical"] == (a == b) and (t["identical"] or t["margin"] <= 1e-3)
        assert all(len(o) == s["max_tokens"] for e in serving_peer.ENGINES for o in s[e]["outputs"])
    assert run["machine"] and run["date"] and run["vllm"]["check"]["max_abs_logit_difference"] < 1e-3


@pytest.mark.skipif(os.environ.get("KVLIB_TEST_VLLM") != "1" or bool(vllm_missing()),
                    reason="vLLM itself runs only with KVLIB_TEST_VLLM=1 and make peer-vllm done "
                           "(a minute or more of start-up); make test never needs it")
def test_vllm_serves_a_small_stream_with_kvlibs_tokens(tmp_path):
    model, tokenizer = kvlib.load_smollm2()
    folder = tmp_path / "hf"
    export_hf(model, folder, kvlib.smollm2_path())
    stream = Stream("small", streams(tokenizer)[1].prompts[:4], 8, 4, True)
    theirs = serving_peer.run_vllm([stream], folder, threads=2, repeats=1)[0]
    ours = serving_peer.run_kvlib(model, stream, repeats=1)
    found = compare_tokens(model, stream.prompts, ours["outputs"], theirs["outputs"])
    assert all(t["identical"] or t["margin"] <= 1e-3 for t in found), json.dumps(found)
    assert sum(theirs["cached_tokens"]) == sum(ours["cached_tokens"])


def test_the_benchmark_report_shows_the_serving_rows_or_why_not():
    from kvlib.bench.markdown import _serving

    assert _serving({}) == []
    assert _serving({"serving": {"missing": "no vLLM environment"}}) == ["", "No vLLM rows: no vLLM environment."]
    lines = _serving({"serving": {"vllm": "0.32.0", "repeats": 3, "rows": summary(_record()),
                                  "identical": {"s/kvlib": [2, 2]}}})
    assert lines[-1] == "| s | kvlib | 8.0 | 4.0 | 2.40× | 200.0 ms / 200.0 ms (0.80×) | 33% / 33% | 2 of 2 |"


@pytest.mark.parametrize("prompts", [[[1, 2, 3, 9], [1, 2, 3, 4, 5, 6], [1, 2, 3]],      # a shared start
                                     [[1, 2, 3], [4, 5, 6, 7], [8]]])                   # none
def test_closest_calls_are_closest_call_for_each_request(prompts):
    """The page's closest call: the prompts' shared start run once, the rest in padded batches,
    gives each request's closest_call (one pass over it), up to rounding."""
    from kvlib.measure import closest_call

    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    answers = [[3, 4], [5], [6, 7, 8]]
    expected = [closest_call(model, p, a) for p, a in zip(prompts, answers)]
    assert serving_peer.closest_calls(model, prompts, answers, rows=2) == pytest.approx(expected, abs=1e-5)
