"""The rotary encodings of 2024-2025 (issue 43): p-RoPE, Resonance RoPE, FoPE, ReRoPE, against direct implementations of their
papers' equations (rotation matrices built position by position, in float64), their limits, their refusals by name.
Step-by-step decoding, fp16/bf16, training and the language model run them through the catalogue's group
"encodings" (tests/helpers.py ALL_ENCODINGS)."""

import math

import pytest
import torch

from fairseq_pe import systems as catalogue
from fairseq_pe.errors import UserError
from fairseq_pe.positional.rotary import yarn_frequencies

from helpers import assert_incremental_equals_full, build_model, random_tokens

D = 16  # the tiny model's head dimension (64 dims, 4 heads)


def encoding(*flags, overrides=None):
    model, d = build_model("--pe-absolute", "none", *flags, overrides=overrides)
    return model.encoder.embed_positions.relative, model, d


def rotated_directly(x, positions, frequencies):
    """x (H, T, d) with pair (2i, 2i+1) at position t rotated by the angle t·θ_i: the 2×2 matrix
    [[cos, −sin], [sin, cos]] applied pair by pair, position by position, in float64."""
    out = torch.empty_like(x, dtype=torch.float64)
    for row, t in enumerate(positions):
        for i, theta in enumerate(frequencies):
            c, s = math.cos(t * theta), math.sin(t * theta)
            a, b = x[:, row, 2 * i].double(), x[:, row, 2 * i + 1].double()
            out[:, row, 2 * i], out[:, row, 2 * i + 1] = a * c - b * s, a * s + b * c
    return out


def rope_frequencies(base=10000.0):
    return [base ** (-2 * i / D) for i in range(D // 2)]


def decoder_output(model, d):
    src = random_tokens(d, 2, 7, left_pad=(0, 3))
    prev = random_tokens(d, 2, 6, seed=1)
    enc = model.encoder(src, torch.tensor([7, 4]))
    return model.decoder(prev, encoder_out=enc)[0]


# p-RoPE (Barbero et al. 2025)

@pytest.mark.parametrize("proportion", [0.3, 0.75])
def test_p_rope_rotates_the_highest_frequency_floor_p_d_over_2_pairs_at_ropes_frequencies(proportion):
    """Pairs i < floor(p·d/2) rotate by t·10000^(−2i/d), the exponent over the whole d; the others not at all."""
    p_rope, _, _ = encoding("--pe-relative", "p-rope", "--pe-rope-proportion", str(proportion))
    kept = math.floor(proportion * D / 2)
    assert kept == {0.3: 2, 0.75: 6}[proportion]
    frequencies = [theta if i < kept else 0.0 for i, theta in enumerate(rope_frequencies())]
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 4, 9, D, generator=g)
    offset = 300
    got_q, got_k = p_rope.rotate(q, k, offset, 1)
    positions = range(offset, offset + 9)
    torch.testing.assert_close(got_q.double(), rotated_directly(q, positions, frequencies), rtol=0, atol=2e-5)
    torch.testing.assert_close(got_k.double(), rotated_directly(k, positions, frequencies), rtol=0, atol=2e-5)
    assert torch.equal(got_q[..., 2 * kept:], q[..., 2 * kept:])  # the low-frequency pairs are untouched


def test_p_rope_at_1_is_rope_and_at_0_has_no_positions():
    rope, rope_model, d = encoding("--pe-relative", "rope")
    full, full_model, _ = encoding("--pe-relative", "p-rope", "--pe-rope-proportion", "1")
    none, none_model, _ = encoding("--pe-relative", "p-rope", "--pe-rope-proportion", "0")
    no_positions, _ = build_model("--pe-absolute", "none")
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 5, D, generator=g)
    assert all(torch.equal(a, b) for a, b in zip(full.rotate(q, q, 7, 1), rope.rotate(q, q, 7, 1)))
    assert all(torch.equal(a, q) for a in none.rotate(q, q, 7, 1))
    with torch.no_grad():
        assert torch.equal(decoder_output(full_model, d), decoder_output(rope_model, d))
        torch.testing.assert_close(decoder_output(none_model, d), decoder_output(no_positions, d), rtol=1e-6,
                                   atol=1e-6)
        # and p in between is neither
        between = decoder_output(encoding("--pe-relative", "p-rope", "--pe-rope-proportion", "0.25")[1], d)
        assert (between - decoder_output(rope_model, d)).abs().max() > 1e-3


@pytest.mark.parametrize("flags", [
    ("--pe-rope-proportion", "0.5"),
    ("--pe-rope-proportion", "0.5", "--pe-rope-scaling", "yarn", "--pe-rope-scaling-factor", "3",
     "--pe-rope-scaling-original-length", "16", "--pe-rope-resonance"),
], ids=["p-rope", "p-rope-yarn-resonance"])
def test_p_rope_decodes_step_by_step_as_the_full_pass(flags):
    _, model, d = encoding("--pe-relative", "p-rope", *flags)
    assert_incremental_equals_full(model, d)


# Resonance RoPE (Wang et al. 2024)

def resonance(frequencies):
    """θ̃_i = 2π / round(2π/θ_i) (Eq. 5), in float64."""
    return [2 * math.pi / round(2 * math.pi / theta) for theta in frequencies]


@pytest.mark.parametrize("scaling", ["none", "linear", "ntk", "yarn"])
def test_resonance_rounds_every_wavelength_after_the_scaling(scaling):
    """The frequencies are the scaled RoPE frequencies (PI: θ/s, NTK: base·s^(d/(d−2)), YaRN's blend), each then
    moved to the nearest whole wavelength (sheryc/resonance_rope: the rounding comes last)."""
    flags = {"none": (), "linear": ("--pe-rope-scaling", "linear", "--pe-rope-scaling-factor", "3"),
             "ntk": ("--pe-rope-scaling", "ntk", "--pe-rope-scaling-factor", "3"),
             "yarn": ("--pe-rope-scaling", "yarn", "--pe-rope-scaling-factor", "3",
                      "--pe-rope-scaling-original-length", "64")}[scaling]
    rope, _, _ = encoding("--pe-relative", "rope", "--pe-rope-resonance", *flags)
    scaled = {"none": rope_frequencies(), "linear": [t / 3 for t in rope_frequencies()],
              "ntk": rope_frequencies(10000 * 3 ** (D / (D - 2))),
              "yarn": yarn_frequencies(D, 3, 64).double().tolist()}[scaling]
    expected = resonance(scaled)
    assert expected != scaled
    torch.testing.assert_close(rope.rotary.freqs.double(), torch.tensor(expected, dtype=torch.float64), rtol=1e-6,
                               atol=0)
    # the rotations are those of the rounded frequencies at integer positions, far past any training length too
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 4, 3, D, generator=g)
    for offset in (0, 1000, 123_457):  # the angle's float32 product t·θ̃ would be off by up to 8e-3 at 123,457
        got, _ = rope.rotate(q, q, offset, 1)
        scale = (0.1 * math.log(3) + 1) if scaling == "yarn" else 1.0
        torch.testing.assert_close(got[0].double(), scale * rotated_directly(q[0], range(offset, offset + 3), expected),
                                   rtol=0, atol=2e-5)


def test_resonance_repeats_each_pair_exactly_every_rounded_wavelength():
    rope, _, _ = encoding("--pe-relative", "rope", "--pe-rope-resonance")
    wavelengths = [round(2 * math.pi / theta) for theta in rope_frequencies()]
    q = torch.ones(1, 1, 1, D)
    for i, wavelength in enumerate(wavelengths):
        for t in (0, 5, 50_000):
            a, _ = rope.rotate(q, q, t, 1)
            b, _ = rope.rotate(q, q, t + wavelength, 1)
            assert torch.equal(a[..., 2 * i:2 * i + 2], b[..., 2 * i:2 * i + 2]), (i, t)


@pytest.mark.parametrize("scaling", [(), ("--pe-rope-scaling", "ntk", "--pe-rope-scaling-factor", "4")],
                         ids=["resonance", "resonance-ntk"])
def test_resonance_decodes_step_by_step_as_the_full_pass(scaling):
    _, model, d = encoding("--pe-relative", "rope", "--pe-rope-resonance", *scaling)
    assert_incremental_equals_full(model, d)


def test_resonance_at_generation_time_changes_a_rope_model_and_keeps_its_weights():
    """--model-overrides "{'pe_rope_resonance': True}" on a RoPE model: the same weights, the rounded frequencies."""
    _, plain, d = encoding("--pe-relative", "rope")
    _, resonant, _ = encoding("--pe-relative", "rope", overrides={"pe_rope_resonance": True})
    resonant.load_state_dict(plain.state_dict())
    torch.testing.assert_close(resonant.encoder.embed_positions.relative.rotary.freqs.double(), torch.tensor(
        resonance(rope_frequencies()), dtype=torch.float64), rtol=1e-6, atol=0)
    with torch.no_grad():
        assert not torch.allclose(decoder_output(resonant, d), decoder_output(plain, d), atol=1e-4)


# FoPE (Hua et al. 2024)

def fope_directly(x, positions, model_encoding, block, train_length, unused="ones"):
    """FoPE of x (H, T, d) at ``positions`` by its equations, in float64 with loops: the frequencies
    10000^(−2k/d) at or above 2π/L, for pair o < O of head h c_o(t) = Σ_k cos(t·ω_k)·C^cos[k, o] and
    s_o(t) = Σ_k sin(t·ω_k)·C^sin[k, o] (the module's coefficients of the block), the pair times
    [[c, −s], [s, c]]; the pairs o ≥ O with c = s = 1 (the authors' code) or c = 1, s = 0."""
    omegas = [w for w in rope_frequencies() if w >= 2 * math.pi / train_length]
    cos_c = model_encoding.cos_coefficients[block - 1].double().transpose(1, 2)  # stored [h, o, k]
    sin_c = model_encoding.sin_coefficients[block - 1].double().transpose(1, 2)
    series = cos_c.size(-1)
    out = torch.empty_like(x, dtype=torch.float64)
    for h in range(x.size(0)):
        for row, t in enumerate(positions):
            for o in range(D // 2):
                if o < series:
                    c = sum(math.cos(t * w) * cos_c[h, k, o].item() for k, w in enumerate(omegas))
                    s = sum(math.sin(t * w) * sin_c[h, k, o].item() for k, w in enumerate(omegas))
                else:
                    c, s = 1.0, (1.0 if unused == "ones" else 0.0)
                a, b = x[h, row, 2 * o].double(), x[h, row, 2 * o + 1].double()
                out[h, row, 2 * o], out[h, row, 2 * o + 1] = a * c - b * s, a * s + b * c
    return out


@pytest.mark.parametrize("length,unused", [(37, "ones"), (64, "unrotated")])
def test_fope_is_a_fourier_series_of_the_frequencies_above_2pi_over_l_per_layer_and_head(length, unused):
    fope, _, _ = encoding("--pe-relative", "fope", "--pe-fope-train-length", str(length),
                          "--pe-fope-unused-pairs", unused)
    terms = {37: 2, 64: 3}[length]  # ω = 1, 0.316, 0.1, ... against 2π/37 = 0.17, 2π/64 = 0.098
    assert fope.cos_coefficients.shape == (2, 4, min(terms, D // 4), terms)  # layers, heads, O, M
    assert not fope.cos_coefficients.requires_grad  # fixed, as the authors' configs
    assert not torch.equal(fope.cos_coefficients[0], fope.cos_coefficients[1])  # a set per layer
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, 4, D, generator=g)
    for block, offset in ((1, 0), (2, 0), (2, 500)):
        got, _ = fope.rotate(q, q, offset, block)
        torch.testing.assert_close(got[0].double(), fope_directly(q[0], range(offset, offset + 4), fope, block,
                                                                  length, unused), rtol=0, atol=2e-5)


def test_fope_initialises_each_series_at_the_step_identity_plus_noise_of_the_gain():
    """Gain 0 leaves the reference's step eye: the identity when M = O; with O < M, 1 at [o·⌈M/O⌉, o]."""
    square, _, _ = encoding("--pe-relative", "fope", "--pe-fope-train-length", "64", "--pe-fope-init-gain", "0")
    assert torch.equal(square.cos_coefficients, torch.eye(3).expand(2, 4, 3, 3))
    narrow, _, _ = encoding("--pe-relative", "fope", "--pe-fope-train-length", "64", "--pe-fope-init-gain", "0",
                            "--pe-fope-pairs", "2")
    assert torch.equal(narrow.sin_coefficients, torch.tensor([[1.0, 0], [0, 0], [0, 1]]).t().expand(2, 4, 2, 3))
    noisy, _, _ = encoding("--pe-relative", "fope", "--pe-fope-train-length", "64")
    assert 0 < (noisy.cos_coefficients - torch.eye(3)).abs().max() < 1


def test_fope_with_the_identity_series_and_unrotated_pairs_is_p_rope_on_the_kept_frequencies():
    fope, _, _ = encoding("--pe-relative", "fope", "--pe-fope-train-length", "64", "--pe-fope-init-gain", "0",
                          "--pe-fope-unused-pairs", "unrotated")
    p_rope, _, _ = encoding("--pe-relative", "p-rope", "--pe-rope-proportion", str(3 / 8))
    q = torch.randn(2, 4, 6, D)
    torch.testing.assert_close(fope.rotate(q, q, 40, 2)[0], p_rope.rotate(q, q, 40, 1)[0], rtol=0, atol=1e-6)


def test_fope_learnable_trains_its_coefficients_and_decodes_step_by_step_as_the_full_pass():
    _, model, d = encoding("--pe-relative", "fope", "--pe-fope-train-length", "37", "--pe-fope-learnable",
                           "--pe-fope-unused-pairs", "unrotated")
    fope = model.encoder.embed_positions.relative
    assert fope.cos_coefficients.requires_grad and fope.sin_coefficients.requires_grad
    model.train()
    decoder_output(model, d).sum().backward()
    assert fope.cos_coefficients.grad.abs().sum() > 0
    model.eval()
    assert_incremental_equals_full(model, d)


@pytest.mark.parametrize("name", catalogue.ROTARY_2024)
def test_left_padding_changes_nothing(name):
    """FoPE's transform is a function of the absolute position, not of the distance alone: under left padding it
    reads the rows' positions, not the indices (as RoPE may)."""
    model, d = build_model(*catalogue.flags(name))
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    with torch.no_grad():
        out = model.encoder(src, torch.tensor([9, 6]))["encoder_out"][0]
        alone = model.encoder(src[1:, 3:], torch.tensor([6]))["encoder_out"][0]
    torch.testing.assert_close(out[3:, 1], alone[:, 0], rtol=1e-5, atol=1e-5)


# ReRoPE, Leaky ReRoPE (Su 2023)

def rerope_directly(q, k, window, train_length, factor, causal):
    """Logits by the definition, in float64: query i times max(1, log(i + 1)/log L), rotated by the capped relative
    position r(i, j) (i − j below w; w, or w + (i − j − w)/k, past it; in both directions in the encoder), dotted
    with the unrotated key j."""
    H, T, _ = q.shape
    out = torch.empty(H, T, T, dtype=torch.float64)
    for i in range(T):
        scale = max(1.0, math.log(i + 1) / math.log(train_length))
        for j in range(T):
            distance = i - j
            r = distance
            if abs(distance) >= window and (distance > 0 or not causal):
                far = window if factor is None else window + (abs(distance) - window) / factor
                r = math.copysign(far, distance)
            rotated_q = rotated_directly(q[:, i:i + 1] * scale, [r], rope_frequencies())[:, 0]
            out[:, i, j] = (rotated_q * k[:, j].double()).sum(-1)
    return out


@pytest.mark.parametrize("factor", [None, 4.0], ids=["rerope", "leaky"])
@pytest.mark.parametrize("side", ["decoder", "encoder"])
def test_rerope_logits_are_ropes_at_the_capped_relative_position(factor, side):
    leaky = {"pe_rerope_leaky_factor": factor} if factor else {}
    _, model, _ = encoding("--pe-relative", "rope", overrides={"pe_rerope_window": 3, "pe_rerope_train_length": 4,
                                                                **leaky})
    rope = getattr(model, side).embed_positions.relative
    assert rope.own_logits and rope.causal == (side == "decoder")
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(2, 1, 4, 10, D, generator=g)
    q_rotated, k_rotated = rope.rotate(q, k, 0, 1)
    assert torch.equal(q_rotated, q) and torch.equal(k_rotated, k)  # rotated in the logits; cached unrotated
    got = rope.attention_logits(q, k, 0, 1)[0]
    expected = rerope_directly(q[0], k[0], 3, 4, factor, side == "decoder")
    visible = torch.ones(10, 10, dtype=torch.bool).tril() if side == "decoder" else torch.ones(10, 10, dtype=torch.bool)
    torch.testing.assert_close(got.double()[:, visible], expected[:, visible], rtol=0, atol=5e-5)
    # a block of rows further on (the blockwise path, a decoding step) gives its rows of the same matrix
    torch.testing.assert_close(rope.attention_logits(q[:, :, 6:8], k, 6, 1)[0], got[:, 6:8], rtol=0, atol=1e-5)


@pytest.mark.parametrize("factor", [None, 4.0], ids=["rerope", "leaky"])
def test_rerope_decodes_step_by_step_as_the_full_pass(factor):
    leaky = {"pe_rerope_leaky_factor": factor} if factor else {}
    _, model, d = encoding("--pe-relative", "rope", overrides={"pe_rerope_window": 3, "pe_rerope_train_length": 4,
                                                                **leaky})
    assert_incremental_equals_full(model, d)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_rerope_logits_in_half_precision_are_the_float32_ones_within_its_rounding(dtype):
    _, model, _ = encoding("--pe-relative", "rope", overrides={"pe_rerope_window": 3, "pe_rerope_train_length": 4})
    rope = model.decoder.embed_positions.relative
    q, k = torch.randn(2, 1, 4, 12, D, generator=torch.Generator().manual_seed(0))
    expected = rope.attention_logits(q, k, 0, 1)
    got = rope.attention_logits(q.to(dtype), k.to(dtype), 0, 1)
    assert got.dtype == dtype
    torch.testing.assert_close(got.float(), expected, rtol=0, atol=8 * torch.finfo(dtype).eps * expected.abs().max())


def test_rerope_with_a_window_past_every_distance_is_rope():
    _, rope_model, d = encoding("--pe-relative", "rope")
    _, capped, _ = encoding("--pe-relative", "rope", overrides={"pe_rerope_window": 50, "pe_rerope_train_length": 50})
    with torch.no_grad():
        torch.testing.assert_close(decoder_output(capped, d), decoder_output(rope_model, d), rtol=1e-5, atol=1e-5)
    _, short, _ = encoding("--pe-relative", "rope", overrides={"pe_rerope_window": 2, "pe_rerope_train_length": 50})
    with torch.no_grad():
        assert (decoder_output(short, d) - decoder_output(rope_model, d)).abs().max() > 1e-3


# refusals by name

@pytest.mark.parametrize("flags,overrides,message", [
    (("--pe-relative", "p-rope", "--pe-rope-proportion", "1.5"), None, "--pe-rope-proportion must be a number from 0"),
    (("--pe-relative", "p-rope", "--pe-rope-proportion", "nan"), None, "--pe-rope-proportion must be a number from 0"),
    (("--pe-relative", "rope", "--pe-rope-proportion", "0.5"), None,
     "--pe-rope-proportion applies to --pe-relative p-rope only"),
    (("--pe-relative", "alibi", "--pe-rope-resonance"), None, "--pe-rope-resonance applies to --pe-relative rope / "
                                                              "p-rope only, not to --pe-relative alibi"),
    (("--pe-relative", "xpos"), {"pe_rope_resonance": True}, "--pe-rope-resonance applies to --pe-relative rope"),
    (("--pe-relative", "t5", "--pe-rope-scaling", "ntk"), None, "--pe-rope-scaling applies to --pe-relative rope"),
    (("--pe-relative", "fope"), None, "--pe-relative fope needs --pe-fope-train-length N"),
    (("--pe-relative", "fope", "--pe-fope-train-length", "6"), None, "at least 7"),
    (("--pe-relative", "fope", "--pe-fope-train-length", "37", "--pe-fope-pairs", "9"), None,
     "--pe-fope-pairs must be from 1 to 8"),
    (("--pe-relative", "rope", "--pe-fope-train-length", "37"), None, "--pe-fope-train-length applies to "
                                                                      "--pe-relative fope only"),
    (("--pe-relative", "fope", "--pe-fope-train-length", "37", "--pe-rope-resonance"), None,
     "--pe-rope-resonance applies to --pe-relative rope / p-rope only, not to --pe-relative fope"),
    (("--pe-relative", "fope", "--pe-fope-train-length", "37"), {"pe_rope_scaling": "ntk"},
     "--pe-rope-scaling applies to --pe-relative rope / p-rope only, not to --pe-relative fope"),
    (("--pe-relative", "fope", "--pe-fope-train-length", "37", "--pe-relative-untie-layers"), None,
     "its parameters are per layer already"),
    (("--pe-relative", "alibi"), {"pe_rerope_window": 8, "pe_rerope_train_length": 16},
     "--pe-rerope-window applies to --pe-relative rope / p-rope only, not to --pe-relative alibi"),
    (("--pe-relative", "xpos", "--pe-rerope-window", "8"), None, "--pe-rerope-window applies to --pe-relative rope"),
    (("--pe-relative", "rope", "--pe-rerope-window", "8"), None, "needs --pe-rerope-train-length L"),
    (("--pe-relative", "rope", "--pe-rerope-leaky-factor", "16"), None,
     "--pe-rerope-leaky-factor needs --pe-rerope-window W"),
    (("--pe-relative", "rope", "--pe-rerope-window", "8", "--pe-rerope-train-length", "16",
      "--pe-rerope-leaky-factor", "1"), None, "--pe-rerope-leaky-factor must be a number above 1"),
    (("--pe-relative", "rope", "--pe-rerope-window", "0", "--pe-rerope-train-length", "16"), None,
     "--pe-rerope-window must be at least 1"),
], ids=["proportion-above-1", "proportion-nan", "proportion-on-rope", "resonance-on-alibi",
        "resonance-override-on-xpos", "scaling-on-t5", "fope-without-length", "fope-length-6", "fope-pairs-9",
        "fope-length-on-rope", "resonance-on-fope", "scaling-override-on-fope", "untie-fope", "rerope-override-on-alibi",
        "rerope-on-xpos", "rerope-without-length", "leaky-without-window", "leaky-1", "rerope-window-0"])
def test_rotary_options_on_the_wrong_encoding_or_out_of_range_are_refused_by_name(flags, overrides, message):
    with pytest.raises(UserError, match=message):
        build_model("--pe-absolute", "none", *flags, overrides=overrides)
