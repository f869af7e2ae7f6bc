"""The fast path's tied output layer (kvlib.fast.TiedHead): the embedding, transposed, with its
one-row bfloat16 product kept whole under torch.compile."""
from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvlib.fast import TiedHead


@settings(max_examples=25, deadline=None)
@given(batch=st.integers(1, 3), k=st.integers(1, 3), width=st.sampled_from([8, 64, 576]),
       vocab=st.sampled_from([5, 300, 4099]), dtype=st.sampled_from([torch.float32, torch.bfloat16]),
       seed=st.integers(0, 10_000))
def test_the_tied_head_is_the_transposed_embedding_product(batch, k, width, vocab, dtype, seed):
    """The fast path's tied output layer: a single bfloat16 row goes through torch.mv, and must give
    F.linear's logits to bfloat16 rounding (both accumulate in float32); every other shape and
    dtype is F.linear itself, to the bit. Checked against the product computed in float64."""
    g = torch.Generator().manual_seed(seed)
    embedding = torch.randn(vocab, width, generator=g).to(dtype)
    x = torch.randn(batch, k, width, generator=g).to(dtype)
    with torch.no_grad():                     # a decode step: the one-row path needs no gradients
        logits = TiedHead(torch.nn.Embedding.from_pretrained(embedding))(x)
    assert logits.shape == (batch, k, vocab) and logits.dtype == dtype
    exact = x.double() @ embedding.double().T                               # (batch, k, vocab)
    step = exact.abs().amax().item() * 2 ** -7 + 1e-6                      # one bfloat16 step of the largest logit
    assert (logits.double() - exact).abs().max().item() <= step
    if dtype == torch.bfloat16 and batch * k == 1:
        torch.testing.assert_close(logits.float(), torch.nn.functional.linear(x, embedding).float(), rtol=2 ** -7,
                                   atol=step)
    else:
        assert torch.equal(logits, torch.nn.functional.linear(x, embedding))


def test_the_head_shares_the_embedding_and_the_lesson_model_stays_plain():
    """The head holds the model's own embedding weight (no copy); the lesson model, without it,
    computes its logits with F.linear, and the head gives the same logits for a batch."""
    from kvlib import Config, Decoder

    model = Decoder(Config.tiny()).eval()
    ids = torch.tensor([[1, 2, 3], [4, 5, 6]])
    with torch.no_grad():
        plain = model(ids)
        model.lm_head = TiedHead(model.embed)
        assert model.lm_head.weight is model.embed.weight
        assert torch.equal(model(ids), plain)
