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


@pytest.mark.parametrize("kind", ["linear", "ntk"])
def test_step_by_step_decoding_equals_the_full_pass(kind):
    _, model, d = rope("--pe-rope-scaling", kind, "--pe-rope-scaling-factor", "3")
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
    ntk = cli("fairseq-generate", *common, "--model-overrides",
              "{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4.0}").stdout
    scores = [[float(line.split("\t")[1]) for line in out.splitlines() if line.startswith("H-")] for out in (plain, ntk)]
    assert len(scores[0]) == len(scores[1]) == 8
    assert scores[0] != scores[1]  # the override reached the model
