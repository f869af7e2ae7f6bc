"""The texts the chapter runs the real model on: the real-model section's demo prompt (five
paragraphs of the course's article and a question about them) and the evaluation text for
quality measurements (``eval_text.txt``, see ``README.md`` in this folder); and the benchmark
run the appendix shows (``bench.json``), which the quantization section quotes."""
from __future__ import annotations

import json
from importlib.resources import files

__all__ = ["DEMO_PASSAGE", "DEMO_QUESTION", "CHAT_QUESTIONS", "ASSISTANTS", "HELP_DESK", "HELP_DESK_RULES",
           "HELP_DESK_QUESTIONS", "demo_prompt", "evaluation_text", "reference_bench", "reference_serving"]

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


def reference_serving() -> dict:
    """The stored run of the page "From kvlib to vLLM": what ``python -m kvlib.bench.serving_peer``
    wrote (``serving_vllm.json``): both engines' tokens and measurements on the same streams, on
    the machine it names (``["machine"]``, ``["date"]``)."""
    return json.loads(files(__name__).joinpath("serving_vllm.json").read_text(encoding="utf-8"))


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

# The serving comparison's first stream: section 7's kind of traffic, each question asked of four
# small assistants (4 system prompts x 8 questions).
ASSISTANTS = (
    "You are a helpful assistant.",
    "You are a friendly tutor for children. Answer simply.",
    "You are a concise assistant. Answer in one sentence.",
    "You are a careful science teacher. Explain step by step.",
)

# Its second stream, section 9's kind: many users behind one long system prompt (the help desk
# of section 9) asking different questions.
HELP_DESK_RULES = " ".join(f"Rule {i}: {r}." for i, r in enumerate([
    "answer in plain words a twelve-year-old understands", "never invent a fact; say when you do not know",
    "give one example when it helps", "keep every answer under three sentences", "use metric units",
    "spell out abbreviations the first time", "when asked for code, give Python", "be kind and patient",
    "do not repeat the question", "end with the answer, not with a question", "prefer short words to long ones",
    "if a question has two readings, answer the likelier one and say so", "quote numbers with their units",
    "never give medical or legal advice beyond general facts", "say which source a figure comes from"], 1))
HELP_DESK = f"You are the help desk of a science museum. {HELP_DESK_RULES}"
HELP_DESK_QUESTIONS = (
    "What is a black hole?", "How far is the Moon?", "Why do we have seasons?", "What is DNA?",
    "How do bees make honey?", "What is a volcano?", "Why is the sea salty?", "What is a light year?",
    "How old are the dinosaur bones here?", "What makes a rainbow?", "How does a magnet work?",
    "Why do stars twinkle?", "What is the biggest animal ever?", "How do fossils form?",
    "What is electricity?", "Why is ice slippery?",
)
