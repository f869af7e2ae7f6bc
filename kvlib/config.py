"""The shape of a Llama-style decoder, in one dataclass (after nanoGPT's GPTConfig)."""
from __future__ import annotations

from dataclasses import dataclass

from .checks import positive_int


@dataclass(frozen=True)
class Config:
    """Every number that fixes the shapes of a :class:`kvlib.Decoder`.

    ``n_kv_heads`` may be smaller than ``n_heads`` (grouped-query attention): each
    key/value head then serves ``n_heads // n_kv_heads`` query heads.
    """

    vocab_size: int = 256
    d_model: int = 64          # width of the residual stream
    n_layers: int = 2
    n_heads: int = 4           # query heads
    n_kv_heads: int = 2        # key/value heads (== n_heads: multi-head; 1: multi-query)
    d_mlp: int = 128           # hidden width of the SwiGLU MLP
    max_seq_len: int = 256     # longest sequence the model (and its RoPE tables) supports
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5

    def __post_init__(self) -> None:
        for name in ("vocab_size", "d_model", "n_layers", "n_heads", "n_kv_heads", "d_mlp", "max_seq_len"):
            # stored as a plain int (a NumPy integer is accepted and converted; a bool is not)
            object.__setattr__(self, name, positive_int(f"Config.{name}", getattr(self, name)))
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} must be divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(f"n_kv_heads={self.n_kv_heads} must divide n_heads={self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} must be even for rotary embeddings")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    @property
    def group_size(self) -> int:
        """How many query heads share one key/value head."""
        return self.n_heads // self.n_kv_heads

    @classmethod
    def tiny(cls) -> "Config":
        """Small enough that a test runs in milliseconds; still has GQA and two layers."""
        return cls(vocab_size=64, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2,
                   d_mlp=64, max_seq_len=128)

    @classmethod
    def small(cls) -> "Config":
        """A random model big enough that per-step cost visibly grows with the context on a CPU."""
        return cls(vocab_size=4096, d_model=256, n_layers=4, n_heads=8, n_kv_heads=4,
                   d_mlp=704, max_seq_len=2048)

    @classmethod
    def smollm2_135m(cls) -> "Config":
        """The shapes of SmolLM2-135M (a Llama architecture); weights come from :func:`kvlib.load_smollm2`."""
        return cls(vocab_size=49_152, d_model=576, n_layers=30, n_heads=9, n_kv_heads=3,
                   d_mlp=1536, max_seq_len=8192, rope_theta=100_000.0, norm_eps=1e-5)
