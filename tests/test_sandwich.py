"""Sandwich (issue 18): the bias against a hand computation of the paper's dot product of sinusoids with
its per-head factor, its shape (0 at distance 0, negative, symmetric), no parameters, the flag's checks."""

import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional import build_position_encoding

from helpers import build_model, largest_tensor_created


def sandwich(heads=2, embed_dim=16, causal=False, **args):
    return build_position_encoding("relative", "sandwich", embed_dim=embed_dim, num_heads=heads, num_blocks=2,
                                   causal=causal, args=SimpleNamespace(**args))


def by_hand(distance, dim, head, heads):
    """(p_i·p_j − d̄/2)·H/(8h) with p_i the Vaswani sinusoids [sin(i·ω_k), cos(i·ω_k)], computed as a dot product."""
    def p(i):
        return [f(i * 10000 ** (-2 * k / dim)) for k in range(dim // 2) for f in (math.sin, math.cos)]

    i, j = 7, 7 + distance
    dot = sum(a * b for a, b in zip(p(i), p(j)))
    return (dot - dim / 2) * heads / (8 * head)


def test_bias_by_hand():
    enc = sandwich(heads=4, embed_dim=16, pe_sandwich_dim=6)
    bias = enc.position_bias(5, 5, 0, 1)
    assert bias.shape == (4, 5, 5)
    for h in (1, 4):
        for i, j in ((0, 3), (4, 1), (2, 2)):
            assert bias[h - 1, i, j].item() == pytest.approx(by_hand(j - i, 6, h, 4), abs=1e-5)
    assert torch.all(bias.diagonal(dim1=1, dim2=2).abs() < 1e-6)  # p_i·p_i = d̄/2
    torch.testing.assert_close(bias, bias.transpose(1, 2))  # symmetric in the encoder
    assert torch.all(bias.masked_fill(torch.eye(5, dtype=torch.bool), -1) < 0)
    torch.testing.assert_close(bias[0], 4 * bias[3])  # H/(8h): head 1 four times head 4's


def test_default_dim_is_the_models_and_decoding_rows_match():
    enc = sandwich(embed_dim=16, causal=True)
    assert enc.dim == 16
    full = enc.position_bias(6, 6, 0, 1)
    assert full[1, 5, 0].item() == pytest.approx(by_hand(-5, 16, 2, 2), abs=1e-5)
    torch.testing.assert_close(enc.position_bias(1, 6, 5, 1), full[:, 5:6])  # one decoding step
    # far away, the bias flattens near −d̄/2·H/(8h) and is close to a log decay nearby
    far = enc.position_bias(1, 5001, 5000, 1)[0, 0]
    assert -8 * 2 / 8 * 1.3 < far[:100].mean().item() < -8 * 2 / 8 * 0.7
    assert list(enc.parameters()) == []


@pytest.mark.parametrize("dim", [5, 0])
def test_odd_or_zero_dim_is_refused_naming_the_flag(dim):
    with pytest.raises(UserError, match="--pe-sandwich-dim"):
        sandwich(pe_sandwich_dim=dim)


def test_dim_flag_for_another_family_is_refused():
    with pytest.raises(UserError, match="--pe-sandwich-dim applies to --pe-relative sandwich"):
        build_model("--pe-relative", "alibi", "--pe-sandwich-dim", "8")
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", "sandwich", "--pe-sandwich-dim", "8")
    assert model.encoder.embed_positions.relative.dim == 8 and model.decoder.embed_positions.relative.dim == 8


def test_a_bias_per_row_is_gathered_from_the_distances_and_builds_nothing_larger():
    """With randomised positions each row has its own distances: the bias of every possible distance is computed once
    and gathered, the values of the dot products of those rows (before: a (B, T, S, d̄/2) float64 tensor, 2 GiB at
    4,096 tokens and T = 256, rebuilt in every layer)."""
    from fairseq_pe.positional.sandwich import sandwich_bias

    enc = sandwich(heads=2, embed_dim=64)
    torch.manual_seed(0)
    positions = torch.rand(3, 50).argsort(dim=1)[:, :40].sort(dim=1).values  # sorted draws from [0, 50)
    positions[2, :4] = -1  # padding
    enc.set_row_positions(positions, 50)
    with torch.no_grad():
        bias, largest = largest_tensor_created(lambda: enc.position_bias(40, 40, 0, 1))
    assert bias.shape == (3, 2, 40, 40) and largest <= bias.numel()
    distances = positions.unsqueeze(1) - positions.unsqueeze(2)  # j − i
    torch.testing.assert_close(bias, sandwich_bias(distances, 64, 2).transpose(0, 1))
