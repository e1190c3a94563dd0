"""RoPE context extension (issue 18): Position Interpolation and NTK-aware scaling, against their formulas,
in step-by-step decoding, and at generation time on a trained checkpoint (--model-overrides)."""

import math
import os

import pytest
import torch

from fairseq_pe.errors import UserError

from helpers import PLUGIN, assert_incremental_equals_full, build_model, cli, synthetic_data_bin


def rope(*flags):
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "rope", *flags)
    return model.encoder.embed_positions.relative, model, d


def test_linear_scaling_divides_positions_by_the_factor():
    """Position Interpolation: R_s(m) = R(m / s), so position 10 with s = 2 rotates as position 5 unscaled."""
    plain, _, _ = rope()
    scaled, _, _ = rope("--pe-rope-scaling", "linear", "--pe-rope-scaling-factor", "2")
    torch.manual_seed(0)
    q = torch.randn(1, 4, 1, plain.head_dim)
    torch.testing.assert_close(scaled.rotate(q, q, 10, 1)[0], plain.rotate(q, q, 5, 1)[0], rtol=1e-5, atol=1e-5)
    assert not torch.allclose(scaled.rotate(q, q, 10, 1)[0], plain.rotate(q, q, 10, 1)[0])


def test_ntk_scaling_stretches_the_lowest_frequency_by_the_factor_and_keeps_the_highest():
    plain, _, _ = rope()
    scaled, _, _ = rope("--pe-rope-scaling", "ntk", "--pe-rope-scaling-factor", "4")
    d = plain.head_dim
    f0, f1 = plain.rotary.freqs.detach(), scaled.rotary.freqs.detach()
    assert f1[0].item() == pytest.approx(f0[0].item()) == 1.0
    assert f1[-1].item() == pytest.approx(f0[-1].item() / 4, rel=1e-5)
    base = 10000 * 4 ** (d / (d - 2))
    torch.testing.assert_close(f1, base ** (-torch.arange(0, d, 2).float() / d))
    assert math.isclose(float(f1[1] / f0[1]), 4 ** (-(2 / d) * d / (d - 2)), rel_tol=1e-5)


def test_yarn_keeps_fast_frequencies_interpolates_slow_ones_and_sets_the_temperature():
    """YaRN with L = 64, s = 4, d = 16 (the tiny model's heads): θ_i = 10000^(−2i/16) makes L/λ_i turns.
    Frequencies with more than 32 turns (i = 0: 64/2π ≈ 10.2 turns, so none here) are kept, those with fewer
    than 1 turn are divided by s, and q·k is multiplied by (0.1·ln 4 + 1)²."""
    plain, _, _ = rope()
    yarn, _, _ = rope("--pe-rope-scaling", "yarn", "--pe-rope-scaling-factor", "4",
                      "--pe-rope-scaling-original-length", "64")
    d = plain.head_dim
    theta = 10000 ** (-torch.arange(0, d, 2, dtype=torch.float64) / d)
    turns = 64 * theta / (2 * math.pi)
    got = yarn.rotary.freqs.detach().double()
    slow = turns < 1
    assert slow.any() and not slow.all()
    torch.testing.assert_close(got[slow], theta[slow] / 4, rtol=1e-6, atol=0)
    assert torch.all(got <= theta * (1 + 1e-6)) and torch.all(got >= theta / 4 * (1 - 1e-6))
    # the reference's boundaries: index d·ln(L/(2π·turns))/(2 ln 10000) for 32 and 1 turns, floored and ceiled
    low = max(math.floor(d * math.log(64 / (32 * 2 * math.pi)) / (2 * math.log(10000))), 0)
    high = min(math.ceil(d * math.log(64 / (1 * 2 * math.pi)) / (2 * math.log(10000))), d - 1)
    ramp = ((torch.arange(d // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    torch.testing.assert_close(got, theta * (1 - ramp) + theta / 4 * ramp, rtol=1e-6, atol=0)
    torch.manual_seed(0)
    q = torch.randn(1, 4, 1, d)
    scale = 0.1 * math.log(4) + 1
    torch.testing.assert_close(yarn.rotate(q, q, 0, 1)[0].norm(dim=-1), scale * q.norm(dim=-1), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kind", ["linear", "ntk", "yarn"])
def test_step_by_step_decoding_equals_the_full_pass(kind):
    extra = ("--pe-rope-scaling-original-length", "16") if kind == "yarn" else ()
    _, model, d = rope("--pe-rope-scaling", kind, "--pe-rope-scaling-factor", "3", *extra)
    assert_incremental_equals_full(model, d)


def test_loading_a_checkpoint_keeps_the_models_own_scaling():
    """The library stores its frequencies in the state dict; a scaled model loading an unscaled checkpoint
    keeps its scaled frequencies (what --model-overrides asks for), and every other weight is loaded."""
    _, plain, _ = rope()
    _, scaled, _ = rope("--pe-rope-scaling", "ntk", "--pe-rope-scaling-factor", "4")
    before = scaled.encoder.embed_positions.relative.rotary.freqs.detach().clone()
    scaled.load_state_dict(plain.state_dict())
    torch.testing.assert_close(scaled.encoder.embed_positions.relative.rotary.freqs.detach(), before)
    key = "encoder.layers.0.self_attn.q_proj.weight"
    torch.testing.assert_close(scaled.state_dict()[key], plain.state_dict()[key])


@pytest.mark.parametrize("flags,message", [
    (("--pe-relative", "rope", "--pe-rope-scaling-factor", "2"), "--pe-rope-scaling-factor needs --pe-rope-scaling"),
    (("--pe-relative", "rope", "--pe-rope-scaling", "ntk"), "needs --pe-rope-scaling-factor"),
    (("--pe-relative", "rope", "--pe-rope-scaling", "linear", "--pe-rope-scaling-factor", "0.5"), "at least 1"),
    (("--pe-relative", "alibi", "--pe-rope-scaling", "linear"), "--pe-rope-scaling applies to --pe-relative rope"),
    (("--pe-relative", "rope", "--pe-rope-scaling", "yarn", "--pe-rope-scaling-factor", "2"),
     "needs --pe-rope-scaling-original-length"),
    (("--pe-relative", "rope", "--pe-rope-scaling", "ntk", "--pe-rope-scaling-factor", "2",
      "--pe-rope-scaling-original-length", "64"), "used by --pe-rope-scaling yarn only"),
])
def test_bad_scaling_options_are_refused(flags, message):
    with pytest.raises(UserError, match=message):
        build_model("--pe-absolute", "none", *flags)


def test_scaling_at_generation_time_on_a_trained_checkpoint(tmp_path):
    data = synthetic_data_bin(tmp_path, train_size=200, valid_size=10, test_buckets=[(1, 6), (20, 30)],
                              test_per_bucket=4, seed=3)
    save = str(tmp_path / "ckpt")
    cli("fairseq-train", data, "--user-dir", PLUGIN, "--arch", "transformer_pe_tiny", "--pe-absolute", "none",
        "--pe-relative", "rope", "--optimizer", "adam", "--lr", "0.005", "--max-tokens", "1000", "--max-update", "5",
        "--no-epoch-checkpoints", "--cpu", "--num-workers", "0", "--share-all-embeddings", "--disable-validation",
        "--save-dir", save)
    common = [data, "--user-dir", PLUGIN, "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test",
              "--score-reference", "--batch-size", "4", "--cpu", "--num-workers", "0"]
    plain = cli("fairseq-generate", *common).stdout
    scaled = [cli("fairseq-generate", *common, "--model-overrides", overrides).stdout for overrides in (
        "{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4.0}",
        "{'pe_rope_scaling': 'yarn', 'pe_rope_scaling_factor': 4.0, 'pe_rope_scaling_original_length': 6}",
        # Resonance RoPE at generation time, with NTK's frequencies (rounded after the scaling)
        "{'pe_rope_resonance': True, 'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4.0}",
        # Leaky ReRoPE (the relative position capped at 4, then growing by 1/8; queries log-scaled past 6 tokens)
        "{'pe_rerope_window': 4, 'pe_rerope_train_length': 6, 'pe_rerope_leaky_factor': 8.0}")]
    scores = [[float(line.split("\t")[1]) for line in out.splitlines() if line.startswith("H-")]
              for out in [plain] + scaled]
    assert all(len(s) == 8 for s in scores)
    assert len({tuple(s) for s in scores}) == len(scores)  # the overrides reached it: five different scorings
