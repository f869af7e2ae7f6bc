"""Loading a Llama-architecture GGUF file (llama.cpp's format) into a :class:`kvlib.Decoder`.

A GGUF file holds key/value metadata (``llama.block_count``, ``tokenizer.ggml.tokens``, ...)
and named, possibly quantized tensors (``blk.0.attn_q.weight`` in Q4_1, ...). Here the
metadata becomes a :class:`kvlib.Config`, every tensor is dequantized to float32 with the
``gguf`` package, renamed to kvlib's parameter names and checked for shape, and only then
put into a fresh model: a problem anywhere raises :class:`~kvlib.smollm2.ModelFileError`
and no half-loaded model is ever returned.

One subtlety: llama.cpp's converter (``convert_hf_to_gguf.py``, function ``permute``)
reorders the rows of ``attn_q`` and ``attn_k`` inside each head, because llama.cpp rotates
*adjacent* channel pairs ``(2i, 2i+1)`` while Hugging Face Llama and :mod:`kvlib.rope`
rotate the pairs ``(i, i + head_dim/2)`` (rotate-half). :func:`unpermute` undoes it.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..config import Config
from ..model import Decoder
from .weights import REFETCH_CMD, ModelFileError

try:  # the gguf package: the reader and dequantizers written by the llama.cpp project
    import gguf
    from gguf import GGUFReader
except ImportError as e:  # pragma: no cover - gguf is in requirements.txt
    raise ImportError("kvlib needs the `gguf` package to read model files: pip install gguf==0.19.0") from e

_MISSING = object()


class _Reader(GGUFReader):
    """``GGUFReader`` over a plain ``ndarray`` view of the memory map instead of the ``np.memmap`` itself.

    The reader slices its data hundreds of thousands of times (one string per token and
    per merge); every slice of an ``np.memmap`` runs a Python ``__array_finalize__`` hook,
    which a plain view of the same mapping does not, so parsing is several times faster.
    """

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        super().__init__(path)

    @property
    def data(self) -> np.ndarray:
        return self._data

    @data.setter
    def data(self, value: np.ndarray) -> None:
        self._data = np.asarray(value)   # same bytes, no copy; the view keeps the mapping alive


# GGUF tensor name (per layer: "blk.{i}." + key) -> kvlib parameter name (per layer: "blocks.{i}." + value)
_GLOBAL_NAMES = {"token_embd.weight": "embed.weight", "output_norm.weight": "norm.weight"}
_LAYER_NAMES = {
    "attn_norm.weight": "attn_norm.weight",
    "attn_q.weight": "attn.wq.weight",
    "attn_k.weight": "attn.wk.weight",
    "attn_v.weight": "attn.wv.weight",
    "attn_output.weight": "attn.wo.weight",
    "ffn_norm.weight": "mlp_norm.weight",
    "ffn_gate.weight": "mlp.gate.weight",
    "ffn_up.weight": "mlp.up.weight",
    "ffn_down.weight": "mlp.down.weight",
}


def _fix_hint(path: Path) -> str:
    return (f"If {path.name} is the cached SmolLM2 file, `{REFETCH_CMD}` downloads it again; "
            f"otherwise replace the file with a complete, unmodified copy.")


def open_gguf(path: str | os.PathLike) -> GGUFReader:
    """Parse the header, metadata and tensor table of a GGUF file (tensor data stays memory-mapped).

    Any failure (missing, empty, truncated, not GGUF, unsupported version) becomes a
    :class:`ModelFileError` naming the file; ``GGUFReader`` itself raises a mix of
    ``ValueError``, ``IndexError``, ``KeyError``... for those.
    """
    path = Path(path)
    if not path.is_file():
        raise ModelFileError(f"The GGUF file {path} does not exist.")
    try:
        reader = _Reader(path)
    except Exception as e:  # noqa: BLE001 - GGUFReader has no error type of its own
        raise ModelFileError(
            f"Could not read the GGUF file {path} ({path.stat().st_size:,} bytes): "
            f"{type(e).__name__}: {e}. The file is truncated, corrupt or not a GGUF file. "
            f"{_fix_hint(path)}") from e
    size = path.stat().st_size
    for t in reader.tensors:             # a file cut inside the tensor data parses, but comes up short
        if t.data_offset + t.n_bytes > size or t.data.nbytes != t.n_bytes:
            raise ModelFileError(
                f"The GGUF file {path} is truncated: tensor {t.name!r} needs bytes "
                f"{t.data_offset:,}..{t.data_offset + t.n_bytes:,} but the file has {size:,}. {_fix_hint(path)}")
    return reader


def metadata(reader: GGUFReader, key: str, default: Any = _MISSING, *, path: Path | None = None) -> Any:
    """The value of metadata ``key`` (a Python scalar, str or list); ``default`` if absent, else an error."""
    field = reader.get_field(key)
    if field is None:
        if default is _MISSING:
            raise ModelFileError(f"The GGUF file {path or '(unnamed)'} lacks the metadata key {key!r}.")
        return default
    try:
        return field.contents()
    except Exception as e:  # noqa: BLE001
        raise ModelFileError(f"The metadata key {key!r} of {path or 'the GGUF file'} cannot be read: {e}") from e


def _float32_to_float(value: float) -> float:
    """GGUF stores floats as float32: 1e-5 arrives as 9.99999974e-06. Return the shortest decimal instead."""
    return float(str(np.float32(value)))


def config_from_gguf(reader: GGUFReader, path: str | os.PathLike = "(unnamed)") -> Config:
    """Build a :class:`kvlib.Config` from the ``llama.*`` metadata; refuse what kvlib's decoder cannot run."""
    path = Path(path)
    arch = metadata(reader, "general.architecture", path=path)
    if arch != "llama":
        raise ModelFileError(f"{path} holds a {arch!r} model; kvlib only loads the 'llama' architecture.")

    def get(key: str, default: Any = _MISSING) -> Any:
        return metadata(reader, f"llama.{key}", default, path=path)

    n_heads = int(get("attention.head_count"))
    tokens = reader.get_field("tokenizer.ggml.tokens")
    vocab = get("vocab_size", len(tokens.data) if tokens is not None else None)
    if vocab is None:                    # last resort: the embedding's row count (GGUF shape is [d_model, vocab])
        embd = next((t for t in reader.tensors if t.name == "token_embd.weight"), None)
        vocab = int(embd.shape[-1]) if embd is not None else metadata(reader, "llama.vocab_size", path=path)
    try:
        config = Config(
            vocab_size=int(vocab),
            d_model=int(get("embedding_length")),
            n_layers=int(get("block_count")),
            n_heads=n_heads,
            n_kv_heads=int(get("attention.head_count_kv", n_heads)),
            d_mlp=int(get("feed_forward_length")),
            max_seq_len=int(get("context_length")),
            rope_theta=_float32_to_float(get("rope.freq_base", 10_000.0)),
            norm_eps=_float32_to_float(get("attention.layer_norm_rms_epsilon")),
        )
    except ValueError as e:
        raise ModelFileError(f"The metadata of {path} describes an impossible model: {e}") from e
    head_dim = config.head_dim
    for key in ("rope.dimension_count", "attention.key_length", "attention.value_length"):
        value = get(key, head_dim)
        if int(value) != head_dim:
            raise ModelFileError(f"{path}: llama.{key} = {value}, but kvlib's decoder needs it to equal "
                                 f"head_dim = {head_dim} (partial rotary / odd head sizes are not supported).")
    scaling = get("rope.scaling.type", "none")
    if scaling not in ("none", None):
        raise ModelFileError(f"{path} uses RoPE scaling {scaling!r}, which kvlib's RoPE does not implement.")
    return config


def unpermute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Undo llama.cpp's ``permute`` of a query/key weight: interleaved RoPE rows back to rotate-half rows.

    ``w`` is ``(n_heads * head_dim, d_in)``. llama.cpp wrote row ``(h, 2j + k)`` from the
    original row ``(h, k * head_dim/2 + j)`` (``j < head_dim/2``, ``k`` in ``{0, 1}``).
    """
    out, d_in = w.shape
    half = out // n_heads // 2
    return (w.reshape(n_heads, half, 2, d_in)   # (head, j, k, d_in): the order in the file
             .transpose(1, 2)                    # (head, k, j, d_in): the rotate-half order
             .reshape(out, d_in))


def permute(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's ``permute`` (the inverse of :func:`unpermute`); for tests and for writing GGUF files."""
    out, d_in = w.shape
    half = out // n_heads // 2
    return w.reshape(n_heads, 2, half, d_in).transpose(1, 2).reshape(out, d_in)


def expected_shapes(config: Config) -> dict[str, tuple[str, tuple[int, ...]]]:
    """GGUF tensor name -> (kvlib parameter name, shape in PyTorch order ``(out, in)``)."""
    c = config
    q_out, kv_out = c.n_heads * c.head_dim, c.n_kv_heads * c.head_dim
    layer = {
        "attn_norm.weight": (c.d_model,),
        "attn_q.weight": (q_out, c.d_model),
        "attn_k.weight": (kv_out, c.d_model),
        "attn_v.weight": (kv_out, c.d_model),
        "attn_output.weight": (c.d_model, q_out),
        "ffn_norm.weight": (c.d_model,),
        "ffn_gate.weight": (c.d_mlp, c.d_model),
        "ffn_up.weight": (c.d_mlp, c.d_model),
        "ffn_down.weight": (c.d_model, c.d_mlp),
    }
    shapes = {"token_embd.weight": (_GLOBAL_NAMES["token_embd.weight"], (c.vocab_size, c.d_model)),
              "output_norm.weight": (_GLOBAL_NAMES["output_norm.weight"], (c.d_model,))}
    for i in range(c.n_layers):
        for key, shape in layer.items():
            shapes[f"blk.{i}.{key}"] = (f"blocks.{i}.{_LAYER_NAMES[key]}", shape)
    return shapes


@dataclass(frozen=True)
class RawTensor:
    """A tensor of the file left in its stored blocks: its GGML type name (``"Q4_1"``), its raw
    bytes (a read-only view of the file), its shape ``(out, in)``, and, for a query or key
    weight, the number of heads whose rows :func:`unpermute` must put back in order."""

    kind: str
    data: np.ndarray
    shape: tuple[int, int]
    permuted_heads: int | None


def read_state_dict(reader: GGUFReader, config: Config, path: str | os.PathLike = "(unnamed)", *,
                    raw: frozenset[str] = frozenset()) -> dict[str, torch.Tensor | RawTensor]:
    """Every weight of the file as a float32 tensor under its kvlib name, checked for presence,
    shape and finiteness, with ``attn_q`` and ``attn_k`` put back in rotate-half order (:func:`unpermute`).

    Tensors stored in one of the GGML types named in ``raw`` (e.g. ``{"Q4_1"}``) are not
    decoded: they come back as :class:`RawTensor`, for a loader that keeps the blocks."""
    path = Path(path)
    wanted = expected_shapes(config)
    tensors = {t.name: t for t in reader.tensors}
    missing = [name for name in wanted if name not in tensors]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise ModelFileError(f"The GGUF file {path} lacks the tensor {missing[0]!r}{more}; "
                             f"a llama model with {config.n_layers} layers needs it.")
    extra = sorted(set(tensors) - set(wanted))
    if extra:   # e.g. output.weight (an untied output layer) or rope_freqs.weight (RoPE scaling)
        raise ModelFileError(f"The GGUF file {path} has tensors kvlib's decoder has no place for: "
                             f"{', '.join(extra[:5])}{' ...' if len(extra) > 5 else ''}")
    state: dict[str, torch.Tensor] = {}
    for gguf_name, (name, shape) in wanted.items():
        t = tensors[gguf_name]
        file_shape = tuple(int(d) for d in reversed(t.shape.tolist()))   # GGUF lists dims fastest-first
        if file_shape != shape:
            raise ModelFileError(f"Tensor {gguf_name!r} in {path} has shape {file_shape}, expected {shape} "
                                 f"for {name} (from the metadata).")
        is_qk = gguf_name.endswith(("attn_q.weight", "attn_k.weight"))
        heads = (config.n_heads if gguf_name.endswith("attn_q.weight") else config.n_kv_heads) if is_qk else None
        if t.tensor_type.name in raw:
            state[name] = RawTensor(t.tensor_type.name, np.asarray(t.data), shape, heads)
            continue
        try:
            # np.asarray: a plain view, in case the reader is a stock GGUFReader handing out np.memmap
            arr = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)   # float32, shape == file_shape
        except Exception as e:  # noqa: BLE001
            raise ModelFileError(f"Cannot dequantize tensor {gguf_name!r} ({t.tensor_type.name}) "
                                 f"in {path}: {e}") from e
        arr = arr.reshape(shape)
        if not arr.flags.writeable:
            arr = arr.copy()             # F32 tensors come back as views of the read-only memory map
        # One NaN or inf makes the sum non-finite (a whole-tensor isfinite is ~50x slower here).
        if not np.isfinite(arr.sum(dtype=np.float64)):
            raise ModelFileError(f"Tensor {gguf_name!r} in {path} holds NaN or infinite values: the file is "
                                 f"corrupt. {_fix_hint(path)}")
        w = torch.from_numpy(arr)
        if heads is not None:
            w = unpermute(w, heads).contiguous()
        state[name] = w
    return state


def load_gguf_decoder(path_or_reader: str | os.PathLike | GGUFReader, *, dtype: torch.dtype = torch.float32,
                      device: torch.device | str | None = None, path: str | os.PathLike | None = None) -> Decoder:
    """A :class:`kvlib.Decoder` holding the weights of a llama GGUF file, in eval mode.

    Pass a path, or an already opened reader (then ``path`` only names it in messages).
    The weights are dequantized to float32 and then cast to ``dtype`` and moved to ``device``.
    """
    if isinstance(path_or_reader, GGUFReader):
        reader, path = path_or_reader, Path(path or getattr(path_or_reader, "path", "(unnamed)"))
    else:
        path = Path(path_or_reader)
        reader = open_gguf(path)
    config = config_from_gguf(reader, path)
    state = read_state_dict(reader, config, path)
    model = Decoder.empty(config)
    model.load_state_dict(state, strict=True, assign=True)   # strict: every parameter gets a file tensor
    return model.to(device=device, dtype=dtype).eval()
