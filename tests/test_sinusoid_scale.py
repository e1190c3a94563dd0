"""The sinusoids' scale (issue 17, part 2): P_S = S·P for every sinusoidal encoding, fixed or learnable;
transformer_pe's default leaves the vectors (and so stock conversions) unchanged; roberta_pe's default
gives them BERT's size; checkpoints record S, and one saved before the scale loads with S = 1."""

import argparse

import pytest
import torch

from helpers import assert_incremental_equals_full, build_model

from fairseq_pe.errors import UserError
from fairseq_pe.models.options import add_position_encoding_args, position_encoding_defaults, validate_position_args
from fairseq_pe.positional import build_position_encoding
from fairseq_pe.positional.sinusoid_scale import ROBERTA_DEFAULTS, SCALE_KEY
from test_roberta_pe import build as build_roberta


def options(*flags, defaults=None):
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    add_position_encoding_args(parser)
    args = parser.parse_args(list(flags))
    position_encoding_defaults(args, **({} if defaults is None else {"sinusoid_scales": defaults}))
    validate_position_args(args)
    return args


@pytest.mark.parametrize("name", ["sinusoidal", "learnable-sinusoidal", "sinusoidal-fairseq"])
@pytest.mark.parametrize("learnable", [False, True])
def test_absolute_sinusoids_are_scaled(name, learnable):
    flags = ["--pe-absolute", name, "--pe-sinusoid-scale", "0.25"] + (["--pe-sinusoid-scale-learnable"] * learnable)
    plain = build_position_encoding("absolute", name, embed_dim=32, num_blocks=3, all_blocks=True)
    scaled = build_position_encoding("absolute", name, embed_dim=32, num_blocks=3, all_blocks=True,
                                     args=options(*flags))
    for block in (1, 3):
        torch.testing.assert_close(scaled(40, block), 0.25 * plain(40, block))
    scale = scaled.sinusoid_scale
    assert isinstance(scale, torch.nn.Parameter) == learnable
    assert SCALE_KEY in scaled.state_dict() and float(scaled.state_dict()[SCALE_KEY]) == 0.25
    if learnable:  # it learns: the gradient of Σ P_S is Σ P
        scaled(10).sum().backward()
        torch.testing.assert_close(scale.grad, plain(10).sum())


@pytest.mark.parametrize("name", ["sinusoidal", "learnable-sinusoidal"])
def test_relative_sinusoids_are_scaled(name):
    args = options("--pe-relative", name, "--pe-relative-sinusoid-scale", "3", "--pe-relative-sinusoid-scale-learnable")
    plain = build_position_encoding("relative", name, embed_dim=64, num_heads=4, num_blocks=2, causal=False,
                                    args=options("--pe-relative", name))
    scaled = build_position_encoding("relative", name, embed_dim=64, num_heads=4, num_blocks=2, causal=False, args=args)
    for got, want in zip(scaled.vectors(1), plain.vectors(1)):
        torch.testing.assert_close(got, 3 * want)
    assert isinstance(scaled.sinusoid_scale, torch.nn.Parameter)
    assert float(plain.sinusoid_scale) == 1.0 and not isinstance(plain.sinusoid_scale, torch.nn.Parameter)


def test_defaults_per_model_and_only_for_the_sinusoids_used():
    args = options("--pe-absolute", "sinusoidal")  # transformer_pe: unscaled
    assert (args.pe_sinusoid_scale, args.pe_sinusoid_scale_learnable) == (1.0, False)
    assert args.pe_relative_sinusoid_scale is None
    args = options("--pe-absolute", "learnable-sinusoidal", "--pe-relative", "sinusoidal", defaults=ROBERTA_DEFAULTS)
    assert (args.pe_sinusoid_scale, args.pe_sinusoid_scale_learnable) == ROBERTA_DEFAULTS["absolute"]
    assert (args.pe_relative_sinusoid_scale, args.pe_relative_sinusoid_scale_learnable) == ROBERTA_DEFAULTS["relative"]
    args = options("--pe-absolute", "learned", defaults=ROBERTA_DEFAULTS)
    assert args.pe_sinusoid_scale is None and args.pe_sinusoid_scale_learnable is None


@pytest.mark.parametrize("flags, message", [
    (["--pe-absolute", "learned", "--pe-sinusoid-scale", "0.1"], "--pe-sinusoid-scale applies to --pe-absolute"),
    (["--pe-absolute", "floater", "--pe-sinusoid-scale-learnable"], "--pe-sinusoid-scale-learnable applies to"),
    (["--pe-relative", "rope", "--pe-relative-sinusoid-scale", "2"], "--pe-relative-sinusoid-scale applies to"),
    (["--pe-absolute", "sinusoidal", "--pe-sinusoid-scale", "0"], "--pe-sinusoid-scale must be positive"),
    (["--pe-absolute", "sinusoidal", "--pe-sinusoid-scale", "-1"], "--pe-sinusoid-scale must be positive"),
])
def test_a_scale_with_nothing_to_scale_or_not_positive_is_refused(flags, message):
    with pytest.raises(UserError, match=message):
        options(*flags)


def test_transformer_pe_default_is_fairseqs_own_vectors():
    """The default S = 1 multiplies by exactly 1: sinusoidal-fairseq stays bit-identical to fairseq's
    SinusoidalPositionalEmbedding (stock checkpoints convert exactly)."""
    from fairseq.modules import SinusoidalPositionalEmbedding

    model, d = build_model("--pe-absolute", "sinusoidal-fairseq")
    ours = model.encoder.embed_positions.absolute
    assert float(ours.sinusoid_scale) == 1.0
    stock = SinusoidalPositionalEmbedding(64, d.pad(), init_size=60)
    tokens = torch.full((1, 50), 5)
    assert torch.equal(ours(50), stock(tokens)[0])


def test_roberta_sinusoids_get_berts_size():
    """roberta_pe's default: each sinusoid has the norm of a BERT-initialised row (0.02·√D), not √(D/2)."""
    model, _ = build_roberta("--pe-absolute", "sinusoidal")
    absolute = model.encoder.position_injector.absolute
    norms = absolute(50).norm(dim=-1)
    torch.testing.assert_close(norms, torch.full_like(norms, 0.02 * 128 ** 0.5))
    assert isinstance(absolute.sinusoid_scale, torch.nn.Parameter) == ROBERTA_DEFAULTS["absolute"][1]
    table = build_roberta()[0].encoder.position_injector.absolute.weight.detach()  # the learned APE, for comparison
    assert abs(float(table[0, :50].norm(dim=-1).mean()) - 0.02 * 128 ** 0.5) < 0.03


def test_a_checkpoint_from_before_the_scale_loads_unscaled_as_trained():
    """roberta_pe's default S is not 1: a state dict without ``sinusoid_scale`` (saved before it existed)
    must load with S = 1, the model it was, not with the new default."""
    old, d = build_roberta("--pe-absolute", "sinusoidal", "--pe-sinusoid-scale", "1", seed=3)
    state = {k: v for k, v in old.state_dict().items() if not k.endswith(SCALE_KEY)}
    new, _ = build_roberta("--pe-absolute", "sinusoidal", seed=4)
    assert float(new.encoder.position_injector.absolute.sinusoid_scale) != 1.0
    new.load_state_dict(state)
    assert float(new.encoder.position_injector.absolute.sinusoid_scale) == 1.0
    tokens = torch.randint(4, 40, (2, 30))
    with torch.no_grad():
        torch.testing.assert_close(new(tokens)[0], old(tokens)[0])
    # a checkpoint with a scale keeps it, whatever the model's default
    with torch.no_grad():
        old.encoder.position_injector.absolute.sinusoid_scale.fill_(0.3)
    new.load_state_dict(old.state_dict())
    assert float(new.encoder.position_injector.absolute.sinusoid_scale) == pytest.approx(0.3)


def test_the_scale_stays_float32_in_half_precision():
    model, _ = build_roberta("--pe-absolute", "learnable-sinusoidal")
    model.half()
    assert model.encoder.position_injector.absolute.sinusoid_scale.dtype == torch.float32


def test_relative_scale_in_a_model_and_its_incremental_decoding():
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "learnable-sinusoidal",
                           "--pe-relative-sinusoid-scale", "0.5", "--pe-relative-sinusoid-scale-learnable")
    assert float(model.decoder.embed_positions.relative.sinusoid_scale) == 0.5
    assert_incremental_equals_full(model, d)
