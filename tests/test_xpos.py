"""xPos (issue 18): RoPE times ζ_i^((n−m)/B) in the decoder, plain RoPE in the encoder (see its docstring)."""

import pytest
import torch

from fairseq_pe.errors import UserError

from helpers import assert_incremental_equals_full, build_model


def sides():
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "xpos")
    return model.encoder.embed_positions.relative, model.decoder.embed_positions.relative, model, d


def logit(enc, q, k, n, m):
    """q at position n, k at position m, each rotated (and scaled) as the attention does."""
    rq, _ = enc.rotate(q, q, n, 1)
    _, rk = enc.rotate(k, k, m, 1)
    return float((rq * rk).sum())


def test_each_frequency_pair_decays_as_zeta_to_the_distance_over_b():
    """A query and a key living on frequency pair i only: the xPos logit is ζ_i^((n−m)/512) times RoPE's,
    ζ_i = (2i/d + 0.4)/1.4, by hand for d = 16: ζ_0 = 0.4/1.4, ζ_3 = (6/16 + 0.4)/1.4."""
    encoder, decoder, _, _ = sides()
    d = decoder.head_dim
    torch.manual_seed(0)
    for i, zeta in ((0, 0.4 / 1.4), (3, (6 / 16 + 0.4) / 1.4)):
        q, k = torch.zeros(1, 1, 1, d), torch.zeros(1, 1, 1, d)
        q[..., 2 * i:2 * i + 2], k[..., 2 * i:2 * i + 2] = torch.randn(2), torch.randn(2)
        for n, m in ((700, 100), (40, 40), (1500, 3)):
            rope = logit(encoder, q, k, n, m)  # the encoder side is plain RoPE
            assert logit(decoder, q, k, n, m) == pytest.approx(zeta ** ((n - m) / 512) * rope, rel=1e-4, abs=1e-7)


def test_the_decay_depends_on_the_distance_only():
    _, decoder, _, _ = sides()
    torch.manual_seed(1)
    q, k = torch.randn(1, 1, 1, decoder.head_dim), torch.randn(1, 1, 1, decoder.head_dim)
    values = [logit(decoder, q, k, m + 37, m) for m in (0, 100, 2000, 9000)]
    assert max(values) - min(values) < 1e-4 * max(abs(v) for v in values)


def test_step_by_step_decoding_equals_the_full_pass():
    _, _, model, d = sides()
    assert_incremental_equals_full(model, d)


def test_beyond_float32s_range_is_an_error_naming_the_flag():
    _, decoder, _, _ = sides()
    q = torch.randn(1, 1, 1, decoder.head_dim)
    decoder.rotate(q, q, decoder.max_length - 1, 1)
    with pytest.raises(UserError, match="--pe-relative xpos: position"):
        decoder.rotate(q, q, decoder.max_length, 1)
