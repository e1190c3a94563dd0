"""Positions stay exact in fp16/bf16 models: they are computed in float32 from float32 frequencies
(or FLOATER states), and only the result takes the model's dtype.

A model converted with ``.half()`` / ``.bfloat16()`` (what fairseq's ``--fp16`` / ``--bf16`` do)
must give, at every position up to 8192, the float32 model's values rounded once to its dtype.
Before the fix the frequencies were converted too: in fp16 R(2048)x == R(2049)x, and sinusoids
of positions 256-1024 were off by up to 0.24.
"""

import pytest
import torch

from helpers import build_model, random_tokens

LENGTH = 8193  # positions 0 .. 8192
HALF = [torch.float16, torch.bfloat16]


def fp32_and_half(dtype, *flags):
    reference, d = build_model(*flags)
    converted, _ = build_model(*flags)
    return reference, converted.to(dtype), d


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("absolute", ["sinusoidal", "learnable-sinusoidal", "sinusoidal-fairseq"])
def test_sinusoidal_vectors_are_the_float32_ones_rounded_once(absolute, dtype):
    reference, model, _ = fp32_and_half(dtype, "--pe-absolute", absolute)
    expected = reference.encoder.embed_positions.absolute(LENGTH)
    assert expected.dtype == torch.float32
    injector = model.encoder.embed_positions
    assert all(p.dtype == torch.float32 for p in injector.absolute.parameters())
    tokens = torch.full((1, LENGTH), 4, dtype=torch.long)
    injected = injector(tokens)[0]  # what the embedding layer adds, in the model's dtype
    assert injected.dtype == dtype
    assert torch.equal(injected, expected.to(dtype))
    # the error that a half-precision computation had: far above one rounding at these positions
    assert (injected.double() - expected.double())[256:].abs().max() <= 4e-3


@pytest.mark.parametrize("dtype", HALF)
def test_rope_rotations_are_the_float32_ones_rounded_once(dtype):
    reference, model, _ = fp32_and_half(dtype, "--pe-relative", "rope", "--pe-absolute", "none")
    rope32 = reference.encoder.embed_positions.relative
    rope = model.encoder.embed_positions.relative
    assert rope.rotary.freqs.dtype == torch.float32
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, LENGTH, rope.head_dim, generator=g).to(dtype)  # values the model's dtype can hold
    rotated, _ = rope.rotate(q, q, 0, 1)
    expected, _ = rope32.rotate(q.float(), q.float(), 0, 1)
    assert rotated.dtype == dtype
    assert torch.equal(rotated, expected.to(dtype))
    # distinct positions get distinct rotations (in fp16 R(2048) was R(2049); in bf16 R(256) was R(257))
    ones = torch.ones(1, 1, rope.head_dim, dtype=dtype)
    for position in (256, 2048, 8191):
        a, _ = rope.rotate(ones, ones, position, 1)
        b, _ = rope.rotate(ones, ones, position + 1, 1)
        assert not torch.equal(a, b)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("relative", ["sinusoidal", "learnable-sinusoidal", "alibi"])
def test_relative_terms_are_computed_in_float32(relative, dtype):
    reference, model, _ = fp32_and_half(dtype, "--pe-relative", relative, "--pe-absolute", "none",
                                        *(["--pe-relative-max-distance", "4096"] if relative != "alibi" else []))
    enc32 = reference.encoder.embed_positions.relative
    enc = model.encoder.embed_positions.relative
    if relative == "alibi":
        got = enc.position_bias(1, LENGTH, LENGTH - 1, 1)
        expected = enc32.position_bias(1, LENGTH, LENGTH - 1, 1)
        assert got.dtype == torch.float32 and torch.equal(got, expected)
    else:
        got, _ = enc.vectors(1)
        expected, _ = enc32.vectors(1)
        assert got.dtype == torch.float32 and torch.equal(got, expected)


@pytest.mark.parametrize("dtype", HALF)
@pytest.mark.parametrize("flags", [("--pe-absolute", "floater", "--pe-all-blocks"), ("--pe-floater-bias",)])
def test_floater_states_are_solved_from_float32_parameters(flags, dtype):
    reference, model, _ = fp32_and_half(dtype, *flags)
    assert all(p.dtype == torch.float32 for p in model.floater.parameters())
    client = model.floater._clients[0][1]
    with torch.no_grad():
        got = model.floater.states(client, 300)
        expected = reference.floater.states(reference.floater._clients[0][1], 300)
    assert torch.equal(got, expected)


@pytest.mark.parametrize("flags", [("--pe-absolute", "sinusoidal"), ("--pe-relative", "rope"),
                                   ("--pe-relative", "learnable-sinusoidal"), ("--pe-relative", "alibi"),
                                   ("--pe-absolute", "floater", "--pe-all-blocks"), ("--pe-floater-bias",)])
def test_a_bfloat16_model_runs_and_stays_close_to_float32(flags):
    reference, model, d = fp32_and_half(torch.bfloat16, *flags)
    src, prev = random_tokens(d, 2, 12), random_tokens(d, 2, 9, seed=1)
    with torch.no_grad():
        expected, _ = reference(src, torch.tensor([12, 12]), prev)
        got, _ = model(src, torch.tensor([12, 12]), prev)
    assert got.dtype == torch.bfloat16
    assert (got.float() - expected).abs().max() < 0.1 * expected.abs().max()
