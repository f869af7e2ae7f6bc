"""The texts the chapter runs the real model on: the real-model section's demo prompt (five
paragraphs of the course's article and a question about them) and the evaluation text for
quality measurements (``eval_text.txt``, see ``README.md`` in this folder); and the benchmark
run the appendix shows (``bench.json``), which the quantization section quotes."""
from __future__ import annotations

import json
from importlib.resources import files

__all__ = ["DEMO_PASSAGE", "DEMO_QUESTION", "CHAT_QUESTIONS", "demo_prompt", "evaluation_text", "reference_bench"]

# The real-model section's demo: five paragraphs of the course's article and a question
# about them, a chat turn with a little context (a few hundred tokens with the template).
# The speed-up depends on this length; the section measures how. `python -m kvlib.bench`
# uses the same prompt.
DEMO_PASSAGE = (
    "A language model writes one token at a time. A token is a word or a piece of a word. To "
    "choose each new token, the model looks back over everything it has written so far. For "
    "every earlier token it builds two small lists of numbers: a key, which works like a "
    "label saying what that token is about, and a value, the information it hands over when a "
    "later token looks it up."
    "\n\n"
    "The KV cache (K for keys, V for values) simply keeps those lists in memory. They are "
    "built once and reused, instead of being rebuilt from scratch at every step."
    "\n\n"
    "The video compares two ways of producing the same AI answer: with the cache it takes "
    "about 9 seconds, without it about 79, and the words come out identical. In the course's "
    "test behind it, the answer is 48 tokens long and the exact times are 8.85 s and 78.95 s. "
    "Nothing was lost. Only repeated work was removed, and the answer arrived roughly nine "
    "times sooner."
    "\n\n"
    "The trick depends on a rule built into these models: a token can only look backwards, "
    "never forwards. Experts call this the causal mask. So when token number 8 arrives, token "
    "number 7 cannot see it, and its key and value stay exactly as they were. Recomputing "
    "them gives the same numbers again, so storing them is pure savings."
    "\n\n"
    "With the cache, each step feeds the model just the one new token. That token compares "
    "itself against all the stored keys and collects what it needs from the stored values."
)
DEMO_QUESTION = "In two sentences: what does the KV cache keep, and why does that make writing faster?"


def evaluation_text() -> str:
    """The chapter's evaluation text: an original text of about 4,000 words written for this
    project (``kvlib/data/eval_text.txt``; its README says what it is and how it may be used).
    Quality measurements run over it; nothing is downloaded."""
    return files(__name__).joinpath("eval_text.txt").read_text(encoding="utf-8")


def reference_bench() -> dict:
    """The benchmark run the appendix shows: what ``python -m kvlib.bench`` wrote to its
    ``bench.json`` on the machine it names (``["machine"]``, ``["date"]``), kept with the
    package (``kvlib/data/bench.json``) so that a notebook opened anywhere can quote it. Its
    figures are that machine's, quoted as reference figures, not this machine's."""
    return json.loads(files(__name__).joinpath("bench.json").read_text(encoding="utf-8"))


def demo_prompt(tokenizer) -> list[int]:
    """Token ids of the demo chat turn: :data:`DEMO_PASSAGE`, a blank line, :data:`DEMO_QUESTION`."""
    return tokenizer.encode_chat(DEMO_PASSAGE + "\n\n" + DEMO_QUESTION)


# Short chat requests for the batching section: a stream a small assistant might serve.
CHAT_QUESTIONS = (
    "What is the capital of France?",
    "Give me three tips for sleeping better.",
    "Explain what a prime number is.",
    "Write a haiku about autumn.",
    "What is photosynthesis?",
    "How do I boil an egg?",
    "Name the planets of the solar system.",
    "What does a compiler do?",
    "Why is the sky blue?",
    "Suggest a name for a grey cat.",
    "What is the difference between weather and climate?",
    "How many legs does a spider have?",
)
