"""llama.cpp, the benchmark's peer, on the real file: runs only where `make peer` installed it."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama.cpp is optional: `make peer` installs it")

pytestmark = pytest.mark.slow


def test_llama_cpp_reads_the_same_file_and_tokens_as_kvlib():
    """Same GGUF file, same token ids: every greedy token of llama.cpp is among kvlib's float32
    model's five most likely at that position (the two round differently, so near-ties may go
    either way), and most are its first choice."""
    from kvlib import load_smollm2, smollm2_path
    from kvlib.data import demo_prompt
    from kvlib.bench.peer import greedy_run, open_llama_cpp

    model, tokenizer = load_smollm2()
    prompt = demo_prompt(tokenizer)
    run = greedy_run(open_llama_cpp(smollm2_path(), threads=torch.get_num_threads()), prompt, 16)
    assert len(run.tokens) == 16 and run.prefill_seconds > 0 and len(run.step_seconds) == 15
    with torch.no_grad():
        logits = model(torch.tensor([prompt + run.tokens]))[0, len(prompt) - 1:-1]     # (16, vocab)
    top5 = logits.topk(5, dim=-1).indices
    assert all(t in row for t, row in zip(run.tokens, top5.tolist())), "llama.cpp chose a token kvlib ranks below 5th"
    assert sum(t == row[0] for t, row in zip(run.tokens, top5.tolist())) >= 12


@pytest.mark.parametrize("flash_attn", [False, True])
def test_batched_llama_cpp_decodes_every_sequence_as_alone(flash_attn):
    """The batch API run, with the same flash-attention setting as the Llama it is given (not
    llama.cpp's "auto", which chose another kernel and parted from greedy_run at the second token
    with flash attention off): one sequence gives greedy_run's first tokens (the two paths may
    round differently, so only until a near-tie could go either way); identical prompts in one
    batch give identical rows; every row's tokens are timed step by step."""
    from kvlib import load_smollm2, smollm2_path
    from kvlib.data import demo_prompt
    from kvlib.bench.peer import batched_greedy_run, greedy_run, open_llama_cpp

    _, tokenizer = load_smollm2()
    prompt = demo_prompt(tokenizer)
    llm = open_llama_cpp(smollm2_path(), threads=torch.get_num_threads(), flash_attn=flash_attn)
    alone = greedy_run(llm, prompt, 6).tokens
    one = batched_greedy_run(llm, [prompt], 6)
    assert one.tokens[0][:4] == alone[:4] and len(one.step_seconds) == 5
    four = batched_greedy_run(llm, [prompt[:40]] * 3 + [prompt[:60]], 5)
    assert four.tokens[0] == four.tokens[1] == four.tokens[2] != four.tokens[3]
    assert four.prefill_seconds > 0 and all(s > 0 for s in four.step_seconds)


def test_llama_cpp_without_its_extra_buffers_writes_the_same_first_tokens():
    """The fallback where llama.cpp's extra buffer types crash (its AMX kernel on one Xeon): the
    weights are loaded with ``use_extra_bufts`` off, the default is restored afterwards, and the
    first greedy tokens are those of the default path where that one runs (or of kvlib's
    reference test above where it does not)."""
    import llama_cpp.llama_cpp as lc

    from kvlib import load_smollm2, smollm2_path
    from kvlib.data import demo_prompt
    from kvlib.bench.peer import extra_buffers_work, greedy_run, open_llama_cpp

    _, tokenizer = load_smollm2()
    prompt = demo_prompt(tokenizer)
    threads = torch.get_num_threads()
    plain = greedy_run(open_llama_cpp(smollm2_path(), threads=threads, extra_buffers=False), prompt, 6).tokens
    assert lc.llama_model_default_params().use_extra_bufts, "the default parameters were not restored"
    if extra_buffers_work(str(smollm2_path()), threads):
        assert greedy_run(open_llama_cpp(smollm2_path(), threads=threads), prompt, 6).tokens[:4] == plain[:4]
