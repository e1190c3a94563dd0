"""Sandwich (issues 18, 33): the bias against a hand computation of the paper's sum of cosines with its
per-head factor (d̄ the head's dimension and k = 1..d̄/2, as NeMo's implementation of the paper; the
paper's constants 10000 and 8h/H), its shape (0 at distance 0, negative, symmetric), no parameters, the
flags' checks, and a checkpoint of fairseq-pe 0.1 (d̄ the model's, k from 0) computing what it computed."""

import os

import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_pe.errors import UserError
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.pass_state import RelativeRows

from helpers import build_model, largest_tensor_created


def sandwich(heads=2, embed_dim=16, causal=False, **args):
    return build_position_encoding("relative", "sandwich", embed_dim=embed_dim, num_heads=heads, num_blocks=2,
                                   causal=causal, args=SimpleNamespace(**args))


def by_hand(distance, dim, head, heads, first=1):
    """(p_i·p_j − d̄/2)/(8h/H) with p_i = [sin(i·ω_k), cos(i·ω_k)] for k = first .. first + d̄/2 − 1,
    ω_k = 10000^(−2k/d̄), computed as a dot product."""
    def p(i):
        return [f(i * 10000 ** (-2 * k / dim)) for k in range(first, first + dim // 2) for f in (math.sin, math.cos)]

    i, j = 7, 7 + distance
    dot = sum(a * b for a, b in zip(p(i), p(j)))
    return (dot - dim / 2) * heads / (8 * head)


@pytest.mark.parametrize("first", [1, 0])
def test_bias_by_hand(first):
    enc = sandwich(heads=4, embed_dim=16, pe_sandwich_dim=6, pe_sandwich_first_frequency=first)
    bias = enc.position_bias(5, 5, 0, 1)
    assert bias.shape == (4, 5, 5)
    for h in (1, 4):
        for i, j in ((0, 3), (4, 1), (2, 2)):
            assert bias[h - 1, i, j].item() == pytest.approx(by_hand(j - i, 6, h, 4, first), abs=1e-5)
    assert torch.all(bias.diagonal(dim1=1, dim2=2).abs() < 1e-6)  # p_i·p_i = d̄/2
    torch.testing.assert_close(bias, bias.transpose(1, 2))  # symmetric in the encoder
    assert torch.all(bias.masked_fill(torch.eye(5, dtype=torch.bool), -1) < 0)
    torch.testing.assert_close(bias[0], 4 * bias[3])  # H/(8h): head 1 four times head 4's


def test_the_paper_constants_at_e512_h8():
    """The issue's case: E = 512, H = 8.  The default (d̄ = 64, the head's; k = 1..32) against the sum by hand,
    and fairseq-pe 0.1's (d̄ = 512, k = 0..255) against the values the issue measured on it (−6.9, −206.6)."""
    enc = sandwich(heads=8, embed_dim=512, causal=True)
    assert (enc.dim, enc.first_frequency) == (64, 1)
    row = enc.position_bias(1, 1024, 1023, 1)[:, 0]  # query 1023 against keys 0..1023
    for h in (1, 8):
        for distance in (1, 2, 100, 1023):
            assert row[h - 1, 1023 - distance].item() == pytest.approx(by_hand(-distance, 64, h, 8), abs=2e-4)
    assert row[0, 1022].item() == pytest.approx(-0.6235, abs=1e-4) and row[0, 0].item() == pytest.approx(-23.867, abs=1e-3)
    old = sandwich(heads=8, embed_dim=512, causal=True, pe_sandwich_dim="model", pe_sandwich_first_frequency=0)
    old_row = old.position_bias(1, 1024, 1023, 1)[0, 0]
    assert old_row[1022].item() == pytest.approx(-6.898, abs=1e-3) and old_row[0].item() == pytest.approx(-206.59, abs=1e-2)
    assert old_row[1022].item() == pytest.approx(by_hand(-1, 512, 1, 8, first=0), abs=1e-4)


def test_default_dim_is_the_heads_and_decoding_rows_match():
    enc = sandwich(embed_dim=16, causal=True)
    assert enc.dim == 8
    full = enc.position_bias(6, 6, 0, 1)
    assert full[1, 5, 0].item() == pytest.approx(by_hand(-5, 8, 2, 2), abs=1e-5)
    torch.testing.assert_close(enc.position_bias(1, 6, 5, 1), full[:, 5:6])  # one decoding step
    # far past the longest wavelength (2π·10^4), the bias of head 1 averages −d̄/2·H/(8h) = −1
    from fairseq_pe.positional.sandwich import sandwich_bias
    far = sandwich_bias(torch.arange(10 ** 7, 10 ** 7 + 10 ** 6, 97), 8, 2)[0]
    assert -1.1 < far.mean().item() < -0.9
    assert list(enc.parameters()) == []


@pytest.mark.parametrize("dim", [5, 0])
def test_odd_or_zero_dim_is_refused_naming_the_flag(dim):
    with pytest.raises(UserError, match="--pe-sandwich-dim"):
        sandwich(pe_sandwich_dim=dim)


def test_a_head_dimension_that_is_odd_is_refused_naming_the_flag():
    with pytest.raises(UserError, match="--pe-sandwich-dim must be an even number .* got 'head', 3"):
        sandwich(heads=2, embed_dim=6)


def test_the_flags_on_the_command_line():
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", "sandwich", "--encoder-embed-dim", "32",
                           "--decoder-embed-dim", "32", "--encoder-attention-heads", "4", "--decoder-attention-heads", "4")
    rel = model.encoder.embed_positions.relative
    assert (rel.dim, rel.first_frequency) == (8, 1)
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", "sandwich", "--pe-sandwich-dim", "model",
                           "--pe-sandwich-first-frequency", "0")
    rel = model.decoder.embed_positions.relative
    assert (rel.dim, rel.first_frequency) == (model.decoder.embed_dim, 0)
    with pytest.raises(SystemExit):
        build_model("--pe-relative", "sandwich", "--pe-sandwich-dim", "half")
    with pytest.raises(SystemExit):
        build_model("--pe-relative", "sandwich", "--pe-sandwich-first-frequency", "2")
    with pytest.raises(UserError, match="--pe-sandwich-first-frequency applies to --pe-relative sandwich"):
        build_model("--pe-relative", "alibi", "--pe-sandwich-first-frequency", "0")


def test_the_options_a_new_model_saves_keep_its_defaults_and_a_0_1_models_keep_its_own():
    """The architecture function writes 'head' and 1 into the options a checkpoint saves, and a command line's
    --pe-sandwich-dim keeps k from 1; the options that fairseq-pe 0.1 saved (no pe_sandwich_first_frequency, which
    0.2 always saves) get k from 0 when a checkpoint is loaded, and d̄ the model's where 0.1 left it None."""
    from argparse import Namespace

    from fairseq_pe.models.options import position_encoding_defaults, upgrade_saved_options
    new = Namespace(pe_absolute="none", pe_relative="sandwich")  # a command line, as fairseq parses it
    position_encoding_defaults(new)
    assert (new.pe_sandwich_dim, new.pe_sandwich_first_frequency) == ("head", 1)
    upgrade_saved_options(new)  # saved in a checkpoint and loaded again
    position_encoding_defaults(new)
    assert (new.pe_sandwich_dim, new.pe_sandwich_first_frequency) == ("head", 1)
    old = Namespace(pe_absolute="none", pe_relative="sandwich", pe_sandwich_dim=None)
    position_encoding_defaults(old)
    assert (old.pe_sandwich_dim, old.pe_sandwich_first_frequency) == ("model", 0)
    given = Namespace(pe_absolute="none", pe_relative="sandwich", pe_sandwich_dim=16)  # a command line
    position_encoding_defaults(given)
    assert (given.pe_sandwich_dim, given.pe_sandwich_first_frequency) == (16, 1)
    upgrade_saved_options(given)  # then saved by 0.2: it has pe_sandwich_first_frequency
    assert (given.pe_sandwich_dim, given.pe_sandwich_first_frequency) == (16, 1)
    for dim in (None, 16, "model", "head"):  # 0.1's saved options, with or without --pe-sandwich-dim
        saved = Namespace(pe_absolute="none", pe_relative="sandwich", pe_sandwich_dim=dim)
        upgrade_saved_options(saved)
        position_encoding_defaults(saved)
        assert (saved.pe_sandwich_dim, saved.pe_sandwich_first_frequency) == ("model" if dim is None else dim, 0)
    other = Namespace(pe_absolute="none", pe_relative="alibi", pe_sandwich_dim=None)  # 0.1, not Sandwich
    upgrade_saved_options(other)
    position_encoding_defaults(other)
    assert (other.pe_sandwich_dim, other.pe_sandwich_first_frequency) == (None, None)


def test_a_checkpoint_of_fairseq_pe_0_1_loads_and_computes_what_it_computed():
    """tests/fixtures/checkpoints-0.1-sandwich: 16 dimensions, 2 heads, saved with d̄ = 16 and k from 0."""
    from fairseq import checkpoint_utils

    from helpers import FIXTURES
    folder = os.path.join(FIXTURES, "checkpoints-0.1-sandwich")
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [os.path.join(folder, "checkpoint.pt")], arg_overrides={"data": folder, "source_lang": "src", "target_lang": "tgt"})
    model.eval()
    expected = torch.load(os.path.join(folder, "expected.pt"))
    rel = model.encoder.embed_positions.relative
    assert (rel.dim, rel.first_frequency) == (16, 0)
    src = expected["src_tokens"]
    with torch.no_grad():
        out = model(src, torch.full((src.size(0),), src.size(1)), expected["prev_output_tokens"])
        log_probs = model.get_normalized_probs(out, log_probs=True)
    torch.testing.assert_close(log_probs, expected["log_probs"], rtol=1e-6, atol=1e-6)
    # and today's defaults would compute something else on it: the test can fail
    for side in (model.encoder, model.decoder):
        side.embed_positions.relative.dim, side.embed_positions.relative.first_frequency = 8, 1
    with torch.no_grad():
        other = model.get_normalized_probs(model(src, torch.full((src.size(0),), src.size(1)),
                                                 expected["prev_output_tokens"]), log_probs=True)
    assert (other - expected["log_probs"]).abs().max() > 1e-3


def _fixture_with_options(tmp_path, **options):
    """tests/fixtures/checkpoints-0.1-sandwich's checkpoint with its saved model options changed (or removed: None)."""
    from helpers import FIXTURES
    folder = os.path.join(FIXTURES, "checkpoints-0.1-sandwich")
    state = torch.load(os.path.join(folder, "checkpoint.pt"), weights_only=False)
    saved = state["cfg"]["model"]
    for name, value in options.items():
        if value is None:
            delattr(saved, name)
        else:
            setattr(saved, name, value)
    path = tmp_path / "checkpoint.pt"
    torch.save(state, path)
    for name in ("dict.src.txt", "dict.tgt.txt"):
        (tmp_path / name).write_bytes(open(os.path.join(folder, name), "rb").read())
    return path, torch.load(os.path.join(folder, "expected.pt"))


def _load(path):
    from fairseq import checkpoint_utils
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [str(path)], arg_overrides={"data": str(path.parent), "source_lang": "src", "target_lang": "tgt"})
    return model.eval()


def _log_probs(model, expected):
    src = expected["src_tokens"]
    with torch.no_grad():
        out = model(src, torch.full((src.size(0),), src.size(1)), expected["prev_output_tokens"])
        return model.get_normalized_probs(out, log_probs=True)


def test_a_0_1_checkpoint_trained_with_an_explicit_dim_loads_with_k_from_0(tmp_path):
    """Issue 39 4b: fairseq-pe 0.1 always summed k from 0, whatever --pe-sandwich-dim; a 0.1 checkpoint trained with
    --pe-sandwich-dim 16 (the fixture's 16 dimensions given explicitly, as 0.1 saved it: pe_sandwich_dim 16, no
    pe_sandwich_first_frequency) loads with k from 0 and computes what 0.1 computed.  The same options as 0.2 saves
    them (with pe_sandwich_first_frequency 1) keep k from 1, which computes something else."""
    path, expected = _fixture_with_options(tmp_path, pe_sandwich_dim=16)
    model = _load(path)
    for side in (model.encoder, model.decoder):
        assert (side.embed_positions.relative.dim, side.embed_positions.relative.first_frequency) == (16, 0)
    torch.testing.assert_close(_log_probs(model, expected), expected["log_probs"], rtol=1e-6, atol=1e-6)
    path, _ = _fixture_with_options(tmp_path, pe_sandwich_dim=16, pe_sandwich_first_frequency=1)
    model = _load(path)
    assert model.encoder.embed_positions.relative.first_frequency == 1
    assert (_log_probs(model, expected) - expected["log_probs"]).abs().max() > 1e-3
    # an override at load time (fairseq-generate --model-overrides) is an option given: it is kept
    from fairseq import checkpoint_utils
    path, _ = _fixture_with_options(tmp_path, pe_sandwich_dim=16)
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [str(path)], arg_overrides={"data": str(tmp_path), "source_lang": "src", "target_lang": "tgt",
                                    "pe_sandwich_first_frequency": 1})
    assert model.encoder.embed_positions.relative.first_frequency == 1


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
    with torch.no_grad():
        bias, largest = largest_tensor_created(lambda: enc.position_bias(40, 40, 0, 1, rows=RelativeRows(positions,
                                                                                                         50)))
    assert bias.shape == (3, 2, 40, 40) and largest <= bias.numel()
    distances = positions.unsqueeze(1) - positions.unsqueeze(2)  # j − i
    torch.testing.assert_close(bias, sandwich_bias(distances, enc.dim, 2, enc.first_frequency).transpose(0, 1))
