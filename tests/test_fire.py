"""FIRE (issue 18): the bias against a hand computation of the paper's Eq. 3-4 (and of the encoder's signed form),
decoding rows, positions rather than indices under left padding, per-layer networks, the flag's checks."""

import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.fire import EPS, HIDDEN

from helpers import build_model, random_tokens


def fire(heads=2, blocks=2, causal=False, **args):
    torch.manual_seed(0)
    return build_position_encoding("relative", "fire", embed_dim=8 * heads, num_heads=heads, num_blocks=blocks,
                                   causal=causal, args=SimpleNamespace(**args))


def by_hand(enc, i, j, head, index=0):
    """f(sign(i − j)·ψ(|i − j|)/ψ(max(i, j, L))), ψ(x) = log(c·x + 1), f = W₂ ReLU(W₁ x + b₁) + b₂, in plain Python."""
    c, lam = abs(enc.c[index].item()), abs(enc.threshold_scale[index].item())
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    x = math.copysign(1, i - j) * psi(abs(i - j)) / (psi(max(i, j, lam * enc.threshold)) + EPS) if i != j else 0.0
    w1, b1, w2, b2 = (p[index].tolist() for p in (enc.w1, enc.b1, enc.w2, enc.b2))
    return sum(max(0.0, x * w1[k] + b1[k]) * w2[k][head] for k in range(HIDDEN)) + b2[head]


@pytest.mark.parametrize("causal", [True, False])
def test_bias_by_hand(causal):
    enc = fire(causal=causal, pe_fire_threshold=2.0)
    with torch.no_grad():
        enc.c.fill_(0.7)
        enc.threshold_scale.fill_(-1.5)  # L = |λ|·L₀ = 3
    bias = enc.position_bias(6, 6, 0, 1)
    assert bias.shape == (2, 6, 6)
    for i, j in ((5, 0), (5, 4), (2, 1), (1, 1), (4, 2)) + (() if causal else ((0, 5), (2, 4))):
        for h in range(2):
            assert bias[h, i, j].item() == pytest.approx(by_hand(enc, i, j, h), abs=1e-5), (i, j, h)
    # below the threshold the bias depends on i − j only; past it the normaliser grows with the position
    assert bias[0, 2, 1].item() == pytest.approx(bias[0, 1, 0].item(), abs=1e-6)
    assert bias[0, 5, 4].item() != pytest.approx(bias[0, 4, 3].item(), abs=1e-4)


def test_decoding_rows_equal_the_full_pass():
    enc = fire(causal=True, pe_fire_threshold=2.0)
    full = enc.position_bias(7, 7, 0, 1)
    for step in (0, 3, 6):
        torch.testing.assert_close(enc.position_bias(1, step + 1, step, 1), full[:, step:step + 1, :step + 1])


def test_untied_layers_have_their_own_network():
    enc = fire(blocks=3, pe_relative_untie_layers=True)
    assert enc.w1.shape == (3, HIDDEN) and enc.w2.shape == (3, HIDDEN, 2)
    assert not torch.equal(enc.position_bias(4, 4, 0, 1), enc.position_bias(4, 4, 0, 2))
    shared = fire(blocks=3)
    torch.testing.assert_close(shared.position_bias(4, 4, 0, 1), shared.position_bias(4, 4, 0, 3))


def test_left_padding_uses_positions_not_indices():
    """With a threshold of 2 the normaliser depends on the query's position from position 2 on: a left-padded row
    must see the bias of its own positions (the injector's row offsets), as it would unpadded."""
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "fire", "--pe-fire-threshold", "2")
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    out = model.encoder(src, torch.tensor([9, 6]))["encoder_out"][0]
    alone = model.encoder(src[1:, 3:], torch.tensor([6]))["encoder_out"][0]
    torch.testing.assert_close(out[3:, 1], alone[:, 0], rtol=1e-5, atol=1e-5)
    relative = model.encoder.embed_positions.relative
    model.encoder(src, torch.tensor([9, 6]))
    assert relative.row_positions.tolist() == [list(range(9)), [-1] * 3 + list(range(6))]
    model.encoder(src[1:, 3:], torch.tensor([6]))
    assert relative.row_positions is None


def test_training_gives_every_parameter_a_gradient():
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "fire", "--pe-fire-threshold", "2")
    model.train()
    out, _ = model(random_tokens(d, 2, 9, left_pad=(0, 2)), torch.tensor([9, 7]), random_tokens(d, 2, 7, seed=1))
    out.float().pow(2).mean().backward()
    for side in (model.encoder, model.decoder):
        for name, p in side.embed_positions.relative.named_parameters():
            assert p.grad is not None and p.grad.abs().sum() > 0, name


def test_bad_threshold_and_other_family_are_refused():
    with pytest.raises(UserError, match="--pe-fire-threshold must be positive"):
        fire(pe_fire_threshold=0.0)
    with pytest.raises(UserError, match="--pe-fire-threshold applies to --pe-relative fire"):
        build_model("--pe-relative", "alibi", "--pe-fire-threshold", "8")
    with pytest.raises(UserError, match="--pe-relative-untie-heads"):
        build_model("--pe-relative", "fire", "--pe-relative-untie-heads")


@pytest.mark.parametrize("causal", [True, False])
def test_below_the_threshold_the_bias_is_computed_per_distance(causal):
    """All positions below L: f is evaluated once per distance (Toeplitz); the same values as per pair, also for
    a decoding step, and the threshold still gets a gradient."""
    enc = fire(causal=causal, pe_fire_threshold=20.0)
    fast = enc.position_bias(6, 9, 3, 1)
    enc.row_positions = torch.arange(9).unsqueeze(0)  # the per-pair path on the same positions
    torch.testing.assert_close(enc.position_bias(6, 9, 3, 1)[0], fast)
    enc.row_positions = None
    enc.position_bias(7, 7, 0, 1).sum().backward()
    assert enc.threshold_scale.grad.abs().sum() > 0 and enc.c.grad.abs().sum() > 0
