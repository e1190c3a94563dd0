"""KERPLE (issue 18): the two kernels against a hand computation of the paper's Eq. 7-8, the projection
that keeps r₁, r₂ in range, parameters per layer and head, and a trained model that reloads exactly."""

import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.kerple import EPS

from helpers import build_model, random_tokens


def kerple(name, heads=2, blocks=2, causal=False, **args):
    return build_position_encoding("relative", name, embed_dim=8 * heads, num_heads=heads, num_blocks=blocks,
                                   causal=causal, args=SimpleNamespace(**args))


def set_params(enc, r1, r2):
    with torch.no_grad():
        enc.r1.copy_(torch.tensor(r1))
        enc.r2.copy_(torch.tensor(r2))


def test_log_kernel_by_hand():
    """−r₁·log(1 + r₂·|i − j|): head 0 with r₁ = 0.5, r₂ = 2; head 1 with r₁ = 1, r₂ = 0.25 (block 1)."""
    enc = kerple("kerple-log")
    set_params(enc, [[0.5, 1.0], [3.0, 3.0]], [[2.0, 0.25], [3.0, 3.0]])
    bias = enc.position_bias(3, 3, 0, 1)
    assert bias[0, 0, 2].item() == pytest.approx(-0.5 * math.log(5))   # |0 − 2| = 2: 1 + 2·2
    assert bias[0, 2, 1].item() == pytest.approx(-0.5 * math.log(3))
    assert bias[1, 1, 0].item() == pytest.approx(-math.log(1.25))
    assert torch.all(bias.diagonal(dim1=1, dim2=2) == 0)
    torch.testing.assert_close(bias, bias.transpose(1, 2))  # symmetric in the encoder
    assert enc.position_bias(3, 3, 0, 2)[0, 0, 1].item() == pytest.approx(-3 * math.log(4))  # block 2's own


def test_power_kernel_by_hand():
    """−r₁·|i − j|^r₂: r₁ = 0.5, r₂ = 1.5 and r₁ = 2, r₂ = 1 (ALiBi with slope 2)."""
    enc = kerple("kerple-power", causal=True)
    set_params(enc, [[0.5, 2.0], [1.0, 1.0]], [[1.5, 1.0], [1.0, 1.0]])
    bias = enc.position_bias(4, 4, 0, 1)
    assert bias[0, 3, 0].item() == pytest.approx(-0.5 * 3 ** 1.5)
    assert bias[1, 3, 1].item() == pytest.approx(-4.0)
    # one decoding step: the query at index 3 sees the row of the full pass
    torch.testing.assert_close(enc.position_bias(1, 4, 3, 1), bias[:, 3:4])


@pytest.mark.parametrize("name,high", [("kerple-log", None), ("kerple-power", 2.0)])
def test_parameters_are_projected_into_range_before_use(name, high):
    enc = kerple(name)
    set_params(enc, [[-1.0, 0.0], [5.0, 0.3]], [[-2.0, 7.0], [0.001, 1.0]])
    enc.position_bias(2, 2, 0, 1)
    assert enc.r1[0].tolist() == pytest.approx([EPS, EPS]) and enc.r1[1].tolist() == pytest.approx([5.0, 0.3])
    assert enc.r2[0, 0].item() == pytest.approx(EPS) and enc.r2[1, 0].item() == pytest.approx(EPS)
    assert enc.r2[0, 1].item() == (7.0 if high is None else high)


def test_initialisation_follows_the_official_code():
    torch.manual_seed(0)
    log, power = kerple("kerple-log", heads=64, blocks=4), kerple("kerple-power", heads=64, blocks=4)
    for enc, (s1, s2) in ((log, (2, 1)), (power, (1, 2))):
        assert EPS <= enc.r1.min() and enc.r1.max() <= s1 and enc.r1.max() > 0.8 * s1
        assert EPS <= enc.r2.min() and enc.r2.max() <= s2 and enc.r2.max() > 0.8 * s2
        assert not torch.equal(enc.r1[0], enc.r1[1])  # per layer


@pytest.mark.parametrize("flag", ["--pe-relative-untie-layers", "--pe-relative-untie-heads"])
def test_untie_flags_are_refused_as_already_untied(flag):
    with pytest.raises(UserError, match="already"):
        build_model("--pe-absolute", "none", "--pe-relative", "kerple-log", flag)


@pytest.mark.parametrize("name", ["kerple-log", "kerple-power"])
def test_trained_parameters_reload_exactly(name, tmp_path):
    model, d = build_model("--pe-absolute", "none", "--pe-relative", name)
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    for step in range(3):
        out, _ = model(random_tokens(d, 2, 9, seed=step), torch.tensor([9, 9]), random_tokens(d, 2, 7, seed=9))
        out.float().pow(2).mean().backward()
        opt.step()
        opt.zero_grad()
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    again, _ = build_model("--pe-absolute", "none", "--pe-relative", name, seed=5)
    again.load_state_dict(torch.load(path))
    model.eval(), again.eval()
    src, prev = random_tokens(d, 2, 11), random_tokens(d, 2, 6, seed=1)
    with torch.no_grad():
        torch.testing.assert_close(again(src, torch.tensor([11, 11]), prev)[0], model(src, torch.tensor([11, 11]), prev)[0])
