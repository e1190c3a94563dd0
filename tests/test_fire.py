"""FIRE (issue 18): the bias against a hand computation of the paper's Eq. 3-4 (and of the encoder's signed form),
decoding rows, positions rather than indices under left padding, per-layer networks, the flag's checks."""

import argparse
import math
from types import SimpleNamespace

import pytest
import torch

from fairseq.models import ARCH_CONFIG_REGISTRY

from fairseq_pe import systems as catalogue
from fairseq_pe.errors import UserError
from fairseq_pe.models.options import upgrade_saved_options
from fairseq_pe.models.transformer_pe import TransformerPEModel
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.fire import EPS, HIDDEN
from fairseq_pe.positional.pass_state import RelativeRows

from helpers import build_model, dictionary, largest_tensor_created, random_tokens
from passes import recorded_passes


def fire(heads=2, blocks=2, causal=False, **args):
    torch.manual_seed(0)
    return build_position_encoding("relative", "fire", embed_dim=8 * heads, num_heads=heads, num_blocks=blocks,
                                   causal=causal, args=SimpleNamespace(**args))


def by_hand(enc, i, j, head, index=0, slope=0.0):
    """f(sign(i − j)·ψ(|i − j|)/ψ(max(i, j, L))), ψ(x) = log(c·x + 1), f = W₂ ReLU(W₁ x + b₁) + b₂, in plain Python
    (``slope``: LeakyReLU's below 0)."""
    c, lam = abs(enc.c[index].item()), abs(enc.threshold_scale[index].item())
    psi = lambda x: math.log(c * x + 1)  # noqa: E731
    x = math.copysign(1, i - j) * psi(abs(i - j)) / (psi(max(i, j, lam * enc.threshold)) + EPS) if i != j else 0.0
    w1, b1, w2, b2 = (p[index].tolist() for p in (enc.w1, enc.b1, enc.w2, enc.b2))
    act = lambda z: z if z > 0 else slope * z  # noqa: E731
    return sum(act(x * w1[k] + b1[k]) * w2[k][head] for k in range(HIDDEN)) + b2[head]


@pytest.mark.parametrize("activation, slope", [(None, 0.0), ("relu", 0.0), ("leaky-relu", 0.01)])
@pytest.mark.parametrize("causal", [True, False])
def test_bias_by_hand(causal, activation, slope):
    """ReLU units (the FIRE paper's, the default), or LeakyReLU of slope 0.01 (DAPE's FIRE)."""
    enc = fire(causal=causal, pe_fire_threshold=2.0, pe_fire_activation=activation)
    with torch.no_grad():
        enc.c.fill_(0.7)
        enc.threshold_scale.fill_(-1.5)  # L = |λ|·L₀ = 3
    bias = enc.position_bias(6, 6, 0, 1)
    assert bias.shape == (2, 6, 6)
    for i, j in ((5, 0), (5, 4), (2, 1), (1, 1), (4, 2)) + (() if causal else ((0, 5), (2, 4))):
        for h in range(2):
            assert bias[h, i, j].item() == pytest.approx(by_hand(enc, i, j, h, slope=slope), abs=1e-5), (i, j, h)
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
    with recorded_passes(model.encoder.embed_positions) as passes:
        model.encoder(src, torch.tensor([9, 6]))
        model.encoder(src[1:, 3:], torch.tensor([6]))
    # what FIRE reads: the rows' positions where the keys are padded (its attention is handed a padding mask)
    padded, unpadded = passes
    assert padded.relative_rows(padded=True).positions.tolist() == [list(range(9)), [-1] * 3 + list(range(6))]
    assert unpadded.relative_rows(padded=False).positions is None


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
    with pytest.raises(UserError, match="--pe-fire-activation must be one of relu, leaky-relu, got gelu"):
        fire(pe_fire_activation="gelu")
    with pytest.raises(UserError, match="--pe-fire-activation applies to --pe-relative fire"):
        build_model("--pe-relative", "alibi", "--pe-fire-activation", "leaky-relu")
    with pytest.raises(UserError, match="--pe-relative-untie-heads"):
        build_model("--pe-relative", "fire", "--pe-relative-untie-heads")


def test_a_fire_dape_checkpoint_saved_before_fire_had_an_activation_option_keeps_relu_and_its_threshold():
    """The catalogue's fire-dape was ``--pe-relative fire --pe-dape v1`` (ReLU, L₀ = 512) before it followed the DAPE
    reference (LeakyReLU, L₀ = 64): the options such a checkpoint saved have no pe_fire_activation; upgraded as the
    loader upgrades them (upgrade_saved_options), then the architecture and the model, its FIRE keeps ReLU units and
    the saved L₀."""
    assert catalogue.flags("fire-dape")[-6:] == ["--pe-fire-activation", "leaky-relu", "--pe-fire-threshold", "64",
                                                 "--pe-dape", "v1"]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)  # as fairseq does
    TransformerPEModel.add_args(parser)
    saved = parser.parse_args(["--pe-absolute", "none", "--pe-relative", "fire", "--pe-dape", "v1"])
    saved.pe_fire_threshold = 512.0  # what the architecture function saved then, and no pe_fire_activation
    upgrade_saved_options(saved)
    ARCH_CONFIG_REGISTRY["transformer_pe_tiny"](saved)
    d = dictionary(20)
    loaded = TransformerPEModel.build_model(saved, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    for side in (loaded.encoder, loaded.decoder):
        fire_bias = side.embed_positions.relative.base
        assert (fire_bias.negative_slope, fire_bias.threshold) == (0.0, 512.0)
    today = build_model(*catalogue.flags("fire-dape"))[0].decoder.embed_positions.relative.base
    assert (today.negative_slope, today.threshold) == (0.01, 64.0)


@pytest.mark.parametrize("activation", ["relu", "leaky-relu"])
def test_the_piecewise_linear_evaluation_is_the_network(activation):
    """f evaluated piece by piece (network_at) gives the network's values and gradients, at random inputs, at the
    cuts between pieces and at the ends of [−1, 1], for the initial network and one with units that never switch;
    ReLU units and LeakyReLU ones (piecewise linear too)."""
    enc = fire(heads=3, pe_fire_activation=activation)
    x = torch.cat([torch.rand(500) * 2 - 1, torch.tensor([-1.0, 0.0, 1.0])])
    for variant in ("initial", "flat units"):
        if variant == "flat units":
            with torch.no_grad():
                enc.w1[0, :5] = 0.0  # constant units, on (b₁ > 0) or off
                enc.b1[0, :3] = 0.4
        cuts = (-enc.b1[0] / enc.w1[0]).detach()
        points = torch.cat([x, cuts[(cuts.abs() <= 1) & torch.isfinite(cuts)]]).requires_grad_()
        expected = enc.network(points, 0).t()
        got = enc.network_at(points, 0)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        # gradients off the cuts (at a cut the two one-sided derivatives differ, as relu's at 0)
        inputs = x.clone().requires_grad_()
        weights = torch.randn(3, inputs.numel())
        wrt = [inputs, enc.w1, enc.b1, enc.w2, enc.b2]
        grads = torch.autograd.grad((enc.network(inputs, 0).t() * weights).sum(), wrt)
        for a, b in zip(torch.autograd.grad((enc.network_at(inputs, 0) * weights).sum(), wrt), grads):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    with torch.no_grad():  # without autograd, a large input is computed one head at a time: the same values
        large = torch.rand(3, 700, 700) * 2 - 1
        torch.testing.assert_close(enc.network_at(large, 0), enc.network(large, 0).movedim(-1, 0), rtol=1e-5,
                                   atol=1e-6)


def test_a_bias_per_row_builds_nothing_larger_than_itself():
    """With positions per row (left padding, randomised positions) the bias is (B, H, T, S); before, the network
    ran on a (B, T, S, 32) hidden tensor (512 MiB per layer at T = 1024 and B = 4, 8 heads), 16 times the bias here."""
    enc = fire(heads=2, pe_fire_threshold=4.0)
    positions = torch.arange(40).repeat(3, 1)
    positions[1, :7] = -1
    positions[1, 7:] -= 7
    with torch.no_grad():
        bias, largest = largest_tensor_created(lambda: enc.position_bias(40, 40, 0, 1, rows=RelativeRows(positions,
                                                                                                         40)))
    assert bias.shape == (3, 2, 40, 40)
    assert largest <= bias.numel()
    torch.testing.assert_close(bias[0], enc.position_bias(40, 40, 0, 1))  # the indices' own bias
