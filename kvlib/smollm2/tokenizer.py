"""SmolLM2's tokenizer, rebuilt from the metadata of its GGUF file with Hugging Face ``tokenizers``.

The file carries the vocabulary (``tokenizer.ggml.tokens``), the BPE merges, a type per
token (normal or control), the special ids and the chat template. llama.cpp names the
pre-tokenizer only by a tag, ``tokenizer.ggml.pre = "smollm"``; it stands for what the
original Hugging Face ``tokenizer.json`` of SmolLM2 spells out, reproduced here:

* no normalizer;
* pre-tokenizer: split every digit off on its own (``Digits(individual_digits=True)``),
  then GPT-2's byte-level regex split (``ByteLevel(add_prefix_space=False)``);
* byte-level BPE without an unknown token; byte-level decoder;
* the control tokens (``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>``, ...) are special
  tokens, matched whole in the text, so each encodes as one id.

No BOS token is added: SmolLM2 uses none (``tokenizer.ggml.add_bos_token`` is false).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from tokenizers import AddedToken, decoders, models, pre_tokenizers, processors
from tokenizers import Tokenizer as _HFTokenizer

from .weights import ModelFileError

TOKEN_TYPE_NORMAL, TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED = 1, 3, 4   # llama.cpp's token types
SUPPORTED_PRE = ("smollm",)

Message = Mapping[str, str]
Conversation = Union[str, Sequence[Message]]


class Tokenizer:
    """Text <-> token ids for SmolLM2, plus its ChatML chat format.

    Build it with :meth:`from_gguf` (or get it from :func:`kvlib.load_smollm2`).
    """

    def __init__(self, tokens: Sequence[str], merges: Sequence[str], token_types: Sequence[int], *,
                 eos_id: int, bos_id: int | None = None, pad_id: int | None = None,
                 chat_template: str | None = None, pre: str = "smollm") -> None:
        if pre not in SUPPORTED_PRE:
            raise ModelFileError(f"Unsupported tokenizer pre-tokenizer {pre!r}: kvlib knows {SUPPORTED_PRE}")
        if len(token_types) != len(tokens):
            raise ModelFileError(f"{len(tokens)} tokens but {len(token_types)} token types in the tokenizer metadata")
        vocab = {tok: i for i, tok in enumerate(tokens)}
        if len(vocab) != len(tokens):
            raise ModelFileError("the tokenizer vocabulary holds duplicate tokens")
        pairs = []
        for m in merges:                 # "Ġ t" -> ("Ġ", "t"); byte-level symbols never contain a space
            left, sep, right = m.partition(" ")
            if not sep:
                raise ModelFileError(f"malformed BPE merge {m!r} in the tokenizer metadata")
            pairs.append((left, right))
        tok = _HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False, byte_fallback=False))
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
        ])
        tok.post_processor = processors.ByteLevel(trim_offsets=False)   # offsets only; adds no tokens
        tok.decoder = decoders.ByteLevel()
        special = [t for t, kind in zip(tokens, token_types) if kind == TOKEN_TYPE_CONTROL]
        for i in (eos_id, bos_id, pad_id):      # the named special ids are special even if typed otherwise
            if i is not None and tokens[i] not in special:
                special.append(tokens[i])
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in special])
        user = [t for t, kind in zip(tokens, token_types) if kind == TOKEN_TYPE_USER_DEFINED]
        if user:
            tok.add_tokens([AddedToken(t, special=False, normalized=False) for t in user])
        self._tok = tok
        self._vocab_size = len(tokens)
        self._eos_id, self._bos_id, self._pad_id = eos_id, bos_id, pad_id
        self.special_tokens: tuple[str, ...] = tuple(special)
        self.chat_template = chat_template
        self._template: Any = None

    @classmethod
    def from_gguf(cls, path_or_reader: Any, path: str | os.PathLike | None = None) -> "Tokenizer":
        """Build the tokenizer from a GGUF file (a path, or a reader from :func:`kvlib.smollm2.open_gguf`)."""
        from .gguf import GGUFReader, metadata, open_gguf

        if isinstance(path_or_reader, GGUFReader):
            reader, where = path_or_reader, Path(path or getattr(path_or_reader, "path", "(unnamed)"))
        else:
            where = Path(path_or_reader)
            reader = open_gguf(where)

        def get(key: str, default: Any = None) -> Any:
            return metadata(reader, key, default, path=where)

        model = get("tokenizer.ggml.model")
        if model != "gpt2":
            raise ModelFileError(f"{where}: tokenizer.ggml.model is {model!r}; kvlib builds only byte-level "
                                 f"BPE ('gpt2') tokenizers.")
        tokens = metadata(reader, "tokenizer.ggml.tokens", path=where)
        return cls(
            tokens,
            metadata(reader, "tokenizer.ggml.merges", path=where),
            get("tokenizer.ggml.token_type", [TOKEN_TYPE_NORMAL] * len(tokens)),
            eos_id=int(metadata(reader, "tokenizer.ggml.eos_token_id", path=where)),
            bos_id=get("tokenizer.ggml.bos_token_id"),
            pad_id=get("tokenizer.ggml.padding_token_id"),
            chat_template=get("tokenizer.chat_template"),
            pre=get("tokenizer.ggml.pre", "smollm"),
        )

    # --- plain text ---------------------------------------------------------------------------
    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``; special tokens written in the text become their single ids. No BOS is added."""
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        return self._tok.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = False) -> str:
        """The text of ``ids`` (a list of ints or a 1-D tensor); special tokens are kept unless skipped."""
        if hasattr(ids, "tolist"):
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self._vocab_size]
        if bad:
            raise ValueError(f"token ids must lie in 0..{self._vocab_size - 1}, got {bad[:5]}")
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    # --- chat ---------------------------------------------------------------------------------
    def chat_prompt(self, messages_or_user_text: Conversation, system: str | None = None,
                    add_generation_prompt: bool = True) -> str:
        """The conversation as text in the model's chat format (ChatML), rendered with its own template.

        Pass one user message as a string, or a list of ``{"role": ..., "content": ...}``
        dicts. ``system`` puts a system message first; without one the template inserts
        SmolLM2's default ("You are a helpful AI assistant named SmolLM, trained by Hugging
        Face"). ``add_generation_prompt`` ends the text with ``<|im_start|>assistant\\n`` so
        that the model answers next.
        """
        if isinstance(messages_or_user_text, str):
            messages = [{"role": "user", "content": messages_or_user_text}]
        else:
            messages = [dict(m) for m in messages_or_user_text]
        for i, m in enumerate(messages):
            if not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
                raise ValueError(f"message {i} must be a dict with str 'role' and 'content', got {m!r}")
        if system is not None:
            if messages and messages[0]["role"] == "system":
                raise ValueError("system= given, but the messages already start with a system message")
            messages.insert(0, {"role": "system", "content": system})
        if not messages:
            raise ValueError("chat_prompt needs at least one message")
        return self._compiled_template().render(messages=messages, add_generation_prompt=add_generation_prompt)

    def encode_chat(self, messages_or_user_text: Conversation, system: str | None = None,
                    add_generation_prompt: bool = True) -> list[int]:
        """``encode(chat_prompt(...))``: the token ids to feed the model for a chat turn."""
        return self.encode(self.chat_prompt(messages_or_user_text, system, add_generation_prompt))

    def _compiled_template(self) -> Any:
        """The chat template compiled by jinja2 the way ``transformers`` does (sandboxed, trimmed blocks).

        jinja2 is always there: torch itself depends on it.
        """
        if self._template is None:
            if not self.chat_template:
                raise ValueError("this tokenizer's model file carries no chat template (tokenizer.chat_template)")
            from jinja2.exceptions import TemplateError
            from jinja2.sandbox import ImmutableSandboxedEnvironment

            def raise_exception(message: str) -> None:
                raise TemplateError(message)

            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                extensions=["jinja2.ext.loopcontrols"])
            env.globals["raise_exception"] = raise_exception
            self._template = env.from_string(self.chat_template)
        return self._template

    # --- ids ----------------------------------------------------------------------------------
    @property
    def eos_id(self) -> int:
        """The id that ends an answer (``<|im_end|>`` for SmolLM2-Instruct): stop generating there."""
        return self._eos_id

    @property
    def bos_id(self) -> int | None:
        return self._bos_id

    @property
    def pad_id(self) -> int | None:
        return self._pad_id

    @property
    def im_end_id(self) -> int:
        """The id of ``<|im_end|>``, which closes every chat message."""
        i = self._tok.token_to_id("<|im_end|>")
        if i is None:
            raise ValueError("this vocabulary has no <|im_end|> token")
        return i

    @property
    def vocab_size(self) -> int:
        """Number of token ids (the model's embedding rows)."""
        return self._vocab_size

    def __len__(self) -> int:
        return self._vocab_size

    def __repr__(self) -> str:
        return (f"Tokenizer(vocab_size={self._vocab_size}, eos_id={self._eos_id}, "
                f"special_tokens={len(self.special_tokens)}, chat_template={'yes' if self.chat_template else 'no'})")
