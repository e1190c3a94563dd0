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
@pytest.mark.parametrize("rotary", [("rope",), ("p-rope",), ("rope", "--pe-rope-resonance"),
                                    ("fope", "--pe-fope-train-length", "37")],
                         ids=["rope", "p-rope", "rope-resonance", "fope"])
def test_rope_rotations_are_the_float32_ones_rounded_once(rotary, dtype):
    reference, model, _ = fp32_and_half(dtype, "--pe-relative", *rotary, "--pe-absolute", "none")
    rope32 = reference.encoder.embed_positions.relative
    rope = model.encoder.embed_positions.relative
    assert all(t.dtype == torch.float32 for t in [*rope.parameters(), *rope.buffers()]  # frequencies, FoPE's series
               if t.is_floating_point())
    g = torch.Generator().manual_seed(0)
    q = torch.randn(4, LENGTH, rope.head_dim, generator=g).to(dtype)  # values the model's dtype can hold; 4 heads
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


# ---- biases past the dtype's range (issue 30, 1) --------------------------------------------------------------


def extreme(name):
    """A model whose position bias leaves fp16's range (±65504) within a few hundred tokens, as trained values can:
    KERPLE-power at the top of its range (−|i − j|², −65536 at distance 256), T5 with −1e5 in its far buckets and
    a constant −4e4 in one head (which a softmax does not see), FIRE with f(x) = −1e5·|x| − 4e4 in one head."""
    flags = {"kerple-power": [], "t5": [], "fire": ["--pe-fire-threshold", "64"]}[name]
    model, d = build_model("--pe-absolute", "none", "--pe-relative", name, "--dropout", "0",
                           "--attention-dropout", "0", *flags)
    with torch.no_grad():
        for side in (model.encoder, model.decoder):
            enc = side.embed_positions.relative
            if name == "kerple-power":
                enc.r1.fill_(1.0)
                enc.r2.fill_(2.0)
            elif name == "t5":
                enc.bias[:, enc.num_buckets // 4:enc.num_buckets // 2] = -1e5  # far to the left (encoder), far (decoder)
                enc.bias[:, enc.num_buckets * 3 // 4:] = -1e5
                enc.bias[:, :, 1] -= 4e4
            else:
                enc.w1.zero_(), enc.b1.zero_(), enc.w2.zero_(), enc.b2.zero_()
                enc.w1[:, 0], enc.w1[:, 1] = 1.0, -1.0  # relu(x) + relu(−x) = |x|
                enc.w2[:, :2, 0] = -1e5
                enc.b2[:, 1] = -4e4
    return model, d


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
@pytest.mark.parametrize("name", ["kerple-power", "t5", "fire"])
def test_a_bias_past_the_dtypes_range_changes_nothing_and_no_row_is_nan(name, dtype, train):
    """A 600-token batch with a 10-token sentence left-padded to it: its padding queries see only real keys more
    than 500 tokens away.  Before the fix that bias was −inf in fp16, those rows all −inf, their softmax NaN, and
    the NaN reached the short sentence's real tokens in the next layer (and the decoder's logits).  Now every
    output is finite, padding included, and the real tokens' outputs are float32's to rounding."""
    reference, d = extreme(name)
    model, _ = extreme(name)
    model = model.to(dtype).train(train)
    reference.train(train)
    length = 600
    src = random_tokens(d, 2, length, left_pad=(0, length - 10))
    lengths = torch.tensor([length, 10])
    prev = random_tokens(d, 2, 12, seed=1)
    prev[1, 8:] = d.pad()  # the target side right-padded, as fairseq batches it
    enc = model.encoder(src, lengths)["encoder_out"][0]
    out, _ = model(src, lengths, prev)
    assert torch.isfinite(enc).all() and torch.isfinite(out).all()
    with torch.no_grad():
        enc32 = reference.encoder(src, lengths)["encoder_out"][0]
        out32, _ = reference(src, lengths, prev)
    tolerance = {torch.float16: 2e-2, torch.bfloat16: 1.5e-1, torch.float32: 1e-5}[dtype]
    torch.testing.assert_close(enc[-10:, 1].float(), enc32[-10:, 1], rtol=tolerance, atol=tolerance)
    torch.testing.assert_close(out[:, :8].float(), out32[:, :8], rtol=tolerance, atol=tolerance * 5)


def test_a_bias_past_the_range_is_finite_where_a_key_is_visible_and_masks_stay_masks():
    """The merged mask of an fp16 model: −inf exactly where fairseq masks (padding, the future), finite elsewhere
    however large the bias, each row shifted so that its largest visible entry is 0."""
    from fairseq_pe.models.attention import merged_mask

    padding = torch.tensor([[False, False, True], [False, True, True]])
    bias = torch.tensor([[[-7e4, -1e5, -2e5], [-3e5, -4e5, 0.0]]])  # (H=1, T=2, S=3)
    for dtype in (torch.float16, torch.bfloat16, torch.float32):
        mask = merged_mask(None, padding, bias, 2, 2, 3, dtype)
        assert mask.dtype == dtype and mask.shape == (2, 1, 2, 3)
        assert torch.equal(torch.isinf(mask), padding.view(2, 1, 1, 3).expand(2, 1, 2, 3))
        assert mask[0, 0, 0, 0] == 0 and mask[0, 0, 1, 0] == 0 and mask[1, 0, :, 0].eq(0).all()
        torch.testing.assert_close(torch.softmax(mask.float(), -1), torch.softmax(bias.double() + torch.zeros(
            2, 1, 2, 3, dtype=torch.double).masked_fill(padding.view(2, 1, 1, 3), float("-inf")), -1).float())


@pytest.mark.parametrize("name", ["alibi", "rpe-learned", "rope"])
def test_a_query_with_every_key_masked_gives_zeros_not_nan(name):
    """A left-padded target (``--left-pad-target``): its padding queries see only padding keys (causal), a row of −inf
    on every path; their output is 0 as torch's fused kernels give, not fairseq's NaN, which probability 0 × NaN would
    carry to the real tokens of the next layer."""
    flags = {"alibi": ["--pe-relative", "alibi"], "rope": ["--pe-relative", "rope"],
             "rpe-learned": ["--pe-relative", "learned", "--pe-relative-max-distance", "4"]}[name]
    model, d = build_model("--pe-absolute", "none", *flags, "--dropout", "0", "--attention-dropout", "0")
    src = random_tokens(d, 2, 6)
    prev = random_tokens(d, 2, 7, seed=1)
    prev[1, :3] = d.pad()
    for train in (True, False):
        model.train(train)
        model.zero_grad()
        out, _ = model(src, torch.tensor([6, 6]), prev)
        assert torch.isfinite(out).all(), train
        if train:
            out.float().sum().backward()
            assert all(torch.isfinite(p.grad).all() for p in model.parameters() if p.grad is not None)
    model.eval()
    with torch.no_grad():
        enc = model.encoder(src, torch.tensor([6, 6]))
        state = {}
        for t in range(prev.size(1)):  # the explicit path, step by step
            step, _ = model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state)
            assert torch.isfinite(step).all(), t


# ---- xPos in fp16 (issue 30, 2) ---------------------------------------------------------------------------------


def test_xpos_in_fp16_at_5000_positions_is_float32s():
    """At a decoder length of 5,000 the scaled keys k·ζ^(−m/512) leave fp16's range: every attention row was NaN.
    Past FP16_SCALED_LENGTH the scaled queries and keys stay float32."""
    reference, d = build_model("--pe-absolute", "none", "--pe-relative", "xpos")
    model, _ = build_model("--pe-absolute", "none", "--pe-relative", "xpos")
    model = model.half()
    src, prev = random_tokens(d, 1, 10), random_tokens(d, 1, 5000, seed=1)
    with torch.no_grad():
        expected, _ = reference(src, torch.tensor([10]), prev)
        got, _ = model(src, torch.tensor([10]), prev)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got.float(), expected, rtol=2e-2, atol=2e-2)


def test_xpos_in_fp16_decodes_step_by_step_across_the_float32_switch(monkeypatch):
    """Decoding step by step across the length where the scaled keys switch to float32 (lowered to 4 here):
    the cached fp16 keys are promoted and every step equals the full fp16 pass."""
    import fairseq_pe.positional.rotary as rotary

    monkeypatch.setattr(rotary, "FP16_SCALED_LENGTH", 4)
    model, d = build_model("--pe-absolute", "none", "--pe-relative", "xpos")
    model = model.half()
    src, prev = random_tokens(d, 2, 6), random_tokens(d, 2, 9, seed=1)
    with torch.no_grad():
        enc = model.encoder(src, torch.tensor([6, 6]))
        full = model.get_normalized_probs(model.decoder(prev, encoder_out=enc), log_probs=True)
        state = {}
        for t in range(prev.size(1)):
            step = model.get_normalized_probs(model.decoder(prev[:, :t + 1], encoder_out=enc, incremental_state=state),
                                              log_probs=True)
            torch.testing.assert_close(step[:, -1].float(), full[:, t].float(), rtol=1e-2, atol=1e-2)
    assert any(v.dtype == torch.float32 for s in state.values() for v in s.values() if torch.is_tensor(v))
