"""A conversation on the engine, kept as token ids from turn to turn.

Each turn's prompt is the whole conversation so far. :class:`Chat` builds it from the token
ids the engine already holds, the previous prompt and the answer exactly as generated, then
the template's text for the next message, so that an engine with prefix caching finds every
earlier turn in its cache. Re-encoding the conversation's *text* instead can give other ids
than the ones generated (:meth:`Chat.ids_by_text`), and the cache misses from there on.

The chat format is the model's own (its tokenizer's ``chat_prompt``); only the tokenizer's
``chat_prompt``, ``encode``, ``decode`` and ``im_end_id`` are used.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .engine import Engine
from .report import Request, ServeReport

__all__ = ["Turn", "Chat"]


@dataclass
class Turn:
    """One turn: the question, the answer (text and ids), the prompt fed, and what serving it measured."""

    question: str
    answer: str
    answer_ids: list[int]
    prompt_ids: list[int]
    report: ServeReport

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)

    @property
    def computed_tokens(self) -> int:
        """Prompt tokens run through the model for this turn (the others came from the cache)."""
        return self.report.prefill_tokens

    @property
    def cached_tokens(self) -> int:
        return self.report.cached_tokens

    @property
    def ttft(self) -> float:
        """Seconds from the request to its first new token."""
        return self.report.ttft[0]


@dataclass
class Chat:
    """A conversation with ``engine``'s model, in ``tokenizer``'s chat format, after an optional
    ``system`` message: :meth:`ask` sends the next user message and returns the :class:`Turn`."""

    engine: Engine
    tokenizer: Any
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)

    def next_prompt(self, question: str) -> list[int]:
        """The ids of the whole conversation with ``question`` as the next user message: the ids
        so far (as generated), then the template's text that follows them, encoded."""
        after = self.tokenizer.chat_prompt(self.messages + [{"role": "user", "content": question}], self.system)
        if not self.ids:
            return self.tokenizer.encode(after)
        held = self.tokenizer.decode(self.ids)                  # the conversation so far, as the ids spell it
        if not after.startswith(held):
            raise ValueError("the chat template renders the earlier turns otherwise than their ids spell them: "
                             "the conversation cannot be continued token by token")
        return self.ids + self.tokenizer.encode(after[len(held):])    # (a newline, then the next message)

    def ids_by_text(self, question: str) -> list[int]:
        """The same prompt as :meth:`next_prompt`, but the whole conversation's text encoded again:
        an answer's text need not encode back to the ids that were generated."""
        return self.tokenizer.encode(
            self.tokenizer.chat_prompt(self.messages + [{"role": "user", "content": question}], self.system))

    def ask(self, question: str, max_new_tokens: int = 48) -> Turn:
        """Send ``question``, serve the whole conversation as one request, keep the answer's ids."""
        prompt = self.next_prompt(question)
        end = self.tokenizer.im_end_id
        report = self.engine.serve([Request(prompt, max_new_tokens, stop_token=end)])
        answer_ids = report.outputs[0]
        closed = answer_ids if answer_ids[-1:] == [end] else answer_ids + [end]   # an answer cut short is closed
        answer = self.tokenizer.decode(answer_ids, skip_special_tokens=True)
        self.messages += [{"role": "user", "content": question}, {"role": "assistant", "content": answer}]
        self.ids = prompt + closed
        turn = Turn(question, answer, answer_ids, prompt, report)
        self.turns.append(turn)
        return turn
