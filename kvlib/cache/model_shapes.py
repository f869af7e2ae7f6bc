"""The shapes of a few published models, as data: enough to size their KV caches and weights.

Each entry is a :class:`kvlib.Config` (so every function that takes a config takes it)
with the numbers from the model's ``config.json`` on its Hugging Face model card (the
source is given with each entry), plus the parameter count. No weights are involved.

The parameter counts are computed from the shapes by :func:`count_parameters` (embedding,
per-layer attention and MLP matrices and norms, final norm, and the output layer unless it
is tied to the embedding); they equal the totals the model cards report (e.g. 6.74B for
Llama-2-7B, 8.03B for Llama-3-8B, 70.6B for Llama-3-70B), which ``tests/cache/test_memory.py`` checks.

Models with *multi-head latent attention* (DeepSeek-V2 and V3) cache no per-head keys and values
but one latent vector per token and layer: they are :class:`MLAShape` entries of
:data:`MLA_SHAPES`, apart from the Llama-style :data:`MODEL_SHAPES` (whose every entry is a
:class:`kvlib.Config` that a :class:`kvlib.Decoder` can be built from). The size formula
(:func:`kvlib.cache.kv_bytes_per_token`) takes either kind.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import Config

__all__ = ["ModelShape", "MODEL_SHAPES", "MLAShape", "MLA_SHAPES", "count_parameters", "model_shape"]


@dataclass(frozen=True)
class ModelShape:
    """A published model's name, its shapes as a :class:`kvlib.Config`, its parameter count,
    whether its output layer is tied to the embedding, and where the numbers come from."""

    name: str
    config: Config
    n_params: int
    tied_embeddings: bool
    source: str
    sliding_window: int | None = None    # positions each token sees, if the model uses sliding-window attention

    @property
    def n_layers(self) -> int:
        return self.config.n_layers

    @property
    def n_heads(self) -> int:
        return self.config.n_heads

    @property
    def n_kv_heads(self) -> int:
        return self.config.n_kv_heads

    @property
    def head_dim(self) -> int:
        return self.config.head_dim

    @property
    def max_context(self) -> int:
        """The longest context the model was released for (``max_position_embeddings``)."""
        return self.config.max_seq_len


def count_parameters(config: Config, tied_embeddings: bool) -> int:
    """Parameters of a Llama-style decoder of these shapes (what :class:`kvlib.Decoder` holds,
    plus a separate output layer when ``tied_embeddings`` is False)."""
    d, hd = config.d_model, config.head_dim
    attention = d * config.n_heads * hd + 2 * d * config.n_kv_heads * hd + config.n_heads * hd * d
    mlp = 3 * d * config.d_mlp
    per_layer = attention + mlp + 2 * d                  # two RMSNorm gains
    embedding = config.vocab_size * d
    return embedding * (1 if tied_embeddings else 2) + config.n_layers * per_layer + d


MODEL_SHAPES: dict[str, ModelShape] = {
    # https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json
    # (hidden_size 576, num_hidden_layers 30, num_attention_heads 9, num_key_value_heads 3,
    #  intermediate_size 1536, vocab_size 49152, max_position_embeddings 8192, tie_word_embeddings true)
    "SmolLM2-135M": ModelShape(
        "SmolLM2-135M", Config.smollm2_135m(), 134_515_008, True,
        "https://huggingface.co/HuggingFaceTB/SmolLM2-135M/blob/main/config.json"),
    # https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json
    # (hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 32,
    #  intermediate_size 11008, vocab_size 32000, max_position_embeddings 4096)
    "Llama-2-7B": ModelShape(
        "Llama-2-7B", Config(vocab_size=32_000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32,
                             d_mlp=11_008, max_seq_len=4096, rope_theta=10_000.0, norm_eps=1e-5),
        6_738_415_616, False, "https://huggingface.co/meta-llama/Llama-2-7b-hf/blob/main/config.json"),
    # https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json
    # (hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
    #  intermediate_size 14336, vocab_size 128256, max_position_embeddings 8192, rope_theta 500000)
    "Llama-3-8B": ModelShape(
        "Llama-3-8B", Config(vocab_size=128_256, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                             d_mlp=14_336, max_seq_len=8192, rope_theta=500_000.0, norm_eps=1e-5),
        8_030_261_248, False, "https://huggingface.co/meta-llama/Meta-Llama-3-8B/blob/main/config.json"),
    # https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json
    # (hidden_size 4096, num_hidden_layers 32, num_attention_heads 32, num_key_value_heads 8,
    #  intermediate_size 14336, vocab_size 32000, max_position_embeddings 32768, sliding_window 4096)
    "Mistral-7B": ModelShape(
        "Mistral-7B", Config(vocab_size=32_000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=8,
                             d_mlp=14_336, max_seq_len=32_768, rope_theta=10_000.0, norm_eps=1e-5),
        7_241_732_096, False, "https://huggingface.co/mistralai/Mistral-7B-v0.1/blob/main/config.json",
        sliding_window=4096),
    # https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json
    # (hidden_size 8192, num_hidden_layers 80, num_attention_heads 64, num_key_value_heads 8,
    #  intermediate_size 28672, vocab_size 128256, max_position_embeddings 8192, rope_theta 500000)
    "Llama-3-70B": ModelShape(
        "Llama-3-70B", Config(vocab_size=128_256, d_model=8192, n_layers=80, n_heads=64, n_kv_heads=8,
                              d_mlp=28_672, max_seq_len=8192, rope_theta=500_000.0, norm_eps=1e-5),
        70_553_706_496, False, "https://huggingface.co/meta-llama/Meta-Llama-3-70B/blob/main/config.json"),
}


@dataclass(frozen=True)
class MLAShape:
    """A published model with multi-head latent attention (DeepSeek-V2 and V3), its cache's shapes
    as its ``config.json`` names them.

    Per token and layer the cache holds one latent vector of ``kv_lora_rank`` numbers, from which
    every head's keys and values are projected back up, and one key of ``qk_rope_head_dim``
    numbers that carries the rotary position, shared by all heads: ``(kv_lora_rank +
    qk_rope_head_dim) × n_layers`` numbers a token, whatever the number of heads. The heads
    themselves attend with keys of ``qk_nope_head_dim + qk_rope_head_dim`` numbers and values of
    ``v_head_dim``, what a cache of separate keys and values would hold (:attr:`head_numbers_per_token`).
    ``n_params`` is the published total (a mixture of experts, not counted from these shapes).
    """

    name: str
    n_layers: int
    n_heads: int
    kv_lora_rank: int
    qk_rope_head_dim: int
    qk_nope_head_dim: int
    v_head_dim: int
    max_context: int
    n_params: int
    source: str

    @property
    def latent_numbers_per_token(self) -> int:
        """Numbers the cache keeps per token: the latent and the rotated key, in every layer."""
        return (self.kv_lora_rank + self.qk_rope_head_dim) * self.n_layers

    @property
    def head_numbers_per_token(self) -> int:
        """Numbers per token of the same heads' keys and values stored separately, in every layer."""
        return self.n_layers * self.n_heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim)


MLA_SHAPES: dict[str, MLAShape] = {
    # https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json
    # (num_hidden_layers 61, num_attention_heads 128, kv_lora_rank 512, qk_rope_head_dim 64,
    #  qk_nope_head_dim 128, v_head_dim 128, max_position_embeddings 163840); parameters: the
    # technical report's 671B in total, 37B active per token (arXiv:2412.19437).
    "DeepSeek-V3": MLAShape(
        "DeepSeek-V3", n_layers=61, n_heads=128, kv_lora_rank=512, qk_rope_head_dim=64, qk_nope_head_dim=128,
        v_head_dim=128, max_context=163_840, n_params=671_000_000_000,
        source="https://huggingface.co/deepseek-ai/DeepSeek-V3/blob/main/config.json"),
}


def model_shape(name: str) -> ModelShape | MLAShape:
    """The entry of :data:`MODEL_SHAPES` or :data:`MLA_SHAPES` called ``name`` (a clear error for an
    unknown one)."""
    try:
        return MODEL_SHAPES[name] if name in MODEL_SHAPES else MLA_SHAPES[name]
    except KeyError:
        raise KeyError(f"no model shape {name!r}; known: {', '.join([*MODEL_SHAPES, *MLA_SHAPES])}") from None
