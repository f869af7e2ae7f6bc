"""kvlib.serve.chat: a conversation kept as token ids reuses every earlier turn's blocks; its
prompts are the conversation's own ids, not its text encoded again."""
from __future__ import annotations

import pytest
import torch

import kvlib
from kvlib.serve import Engine
from kvlib.serve.chat import Chat

from tiny_models import tiny_model

SPECIAL = {"<s>": 1, "</s>": 2, "ab": 40}     # <|im_start|>, <|im_end|>, and one merged pair of letters


class ToyTokenizer:
    """Characters a-z, space, newline and ':' as ids 3.., two special tokens, one merge ("ab" is one
    token, as a BPE would make it), and a ChatML-like template."""

    chars = "abcdefghijklmnopqrstuvwxyz \n:"
    im_end_id = SPECIAL["</s>"]

    def encode(self, text: str) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            special = next((s for s in SPECIAL if text.startswith(s, i)), None)
            if special:
                ids.append(SPECIAL[special])
                i += len(special)
            else:
                ids.append(3 + self.chars.index(text[i]))
                i += 1
        return ids

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        names = {v: k for k, v in SPECIAL.items()}
        return "".join(("" if skip_special_tokens and i != 40 else names[i]) if i in names else
                       (self.chars[i - 3] if 3 <= i < 3 + len(self.chars) else "") for i in ids)

    def chat_prompt(self, messages, system=None, add_generation_prompt=True) -> str:
        msgs = ([{"role": "system", "content": system}] if system else []) + list(messages)
        text = "".join(f"<s>{m['role']}\n{m['content']}</s>\n" for m in msgs)
        return text + ("<s>assistant\n" if add_generation_prompt else "")


def test_each_turn_takes_the_earlier_turns_from_the_cache():
    model = tiny_model(torch.float64)
    chat = Chat(Engine(model, max_batch=1, block_size=4, prefix_caching=True), ToyTokenizer(), "be short")
    turns = [chat.ask(q, max_new_tokens=6) for q in ("hi there", "why", "and then what")]
    assert turns[0].cached_tokens == 0
    for before, turn in zip(turns, turns[1:]):
        held = before.prompt_tokens + len(before.answer_ids) - 1                # computed by the turn before
        assert turn.prompt_ids[:before.prompt_tokens] == before.prompt_ids
        assert turn.cached_tokens == min(held // 4, (turn.prompt_tokens - 1) // 4) * 4
        assert turn.computed_tokens == turn.prompt_tokens - turn.cached_tokens
    alone = [kvlib.generate(model, t.prompt_ids, 6, stop_token=2) for t in turns]
    assert [t.answer_ids for t in turns] == alone


def test_the_prompt_is_built_from_the_ids_not_the_text():
    """An answer whose ids are not what its text encodes to stays as generated."""
    chat = Chat(Engine(tiny_model(torch.float64), max_batch=1, block_size=4, prefix_caching=True), ToyTokenizer())
    first = chat.next_prompt("hello")
    answer = [3, 4, 5, 2]                                # "abc" written as a, b, c: not as "ab" + "c"
    chat.engine.serve([kvlib.serve.Request(first + answer, 1)])
    chat.messages += [{"role": "user", "content": "hello"}, {"role": "assistant", "content": "abc"}]
    chat.ids = first + answer
    by_ids, by_text = chat.next_prompt("more"), chat.ids_by_text("more")
    assert by_ids[:len(chat.ids)] == chat.ids and by_text[:len(first)] == first
    assert by_text[len(first):len(first) + 2] == [40, 5]  # the text gives the merged token back


def test_a_template_that_renders_the_past_otherwise_is_refused():
    class Forgetful(ToyTokenizer):
        def chat_prompt(self, messages, system=None, add_generation_prompt=True):
            return super().chat_prompt(messages[-1:], system, add_generation_prompt)

    chat = Chat(Engine(tiny_model(torch.float64), max_batch=1), Forgetful())
    chat.ask("hello", max_new_tokens=3)
    with pytest.raises(ValueError, match="cannot be continued token by token"):
        chat.next_prompt("again")
