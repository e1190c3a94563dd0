"""Unit tests of the relative position encodings and of their attention (PositionAttention)."""

import math
from types import SimpleNamespace

import pytest
import torch

from fairseq_pe.models.attention import PositionAttention
from fairseq_pe.positional import build_position_encoding, position_encoding_choices
from fairseq_pe.positional.alibi import alibi_slopes
from fairseq_pe.positional.base import relative_distances
from fairseq_pe.positional.t5_bias import t5_bucket

from helpers import assert_incremental_equals_full, build_model, random_tokens

#: the registry's --pe-relative encodings (registry names, not the catalogue's systems), by kind
SHAW_FAMILY = ["learned", "sinusoidal", "learnable-sinusoidal"]
ROTARY = ["rope", "xpos", "p-rope", "fope"]
BIASES = ["alibi", "t5", "kerple-log", "kerple-power", "sandwich", "fire"]
OWN_LOGITS = ["fox", "cope"]  # the logits hook's (issue 43)
RELATIVE = SHAW_FAMILY + ROTARY + BIASES + OWN_LOGITS
#: the options an encoding cannot be built without (FoPE's training length)
REQUIRED = {"fope": ("--pe-fope-train-length", "16")}
PAIRS = [(a, r) for a in ("learned", "learnable-sinusoidal") for r in SHAW_FAMILY]  # Wang et al. Table 2


def encoding(name, heads=4, dim=32, blocks=2, causal=False, **opts):
    args = SimpleNamespace(pe_relative_max_distance=opts.get("max_distance"),
                           pe_relative_untie_layers=opts.get("untie_layers", False),
                           pe_relative_untie_heads=opts.get("untie_heads", False),
                           pe_t5_num_buckets=None, pe_t5_max_distance=None)
    return build_position_encoding("relative", name, embed_dim=dim, num_heads=heads, num_blocks=blocks,
                                   causal=causal, args=args)


def test_registry_lists_every_relative_encoding():
    assert position_encoding_choices("relative") == ["none"] + sorted(RELATIVE)


# --- Shaw / NEZHA / learnable-sinusoidal: efficient terms equal the materialised definition ----


def naive_terms(enc, q, probs, offset, block):
    """Shaw Eq. 3-4 with a^K_{clip(j-i)} materialised as a (T, S, d) tensor."""
    a_key, a_value = enc.vectors(block)
    bh, t, d = q.shape
    s = probs.shape[-1]
    idx = relative_distances(t, s, offset).clamp(-enc.max_distance, enc.max_distance) + enc.max_distance
    b = bh // enc.num_heads
    qv = q.view(b, enc.num_heads, t, d)
    pv = probs.view(b, enc.num_heads, t, s)
    if a_key.dim() == 2:
        ak, av = a_key[idx], a_value[idx]  # (T, S, d)
        logits = torch.einsum("bhtd,tsd->bhts", qv, ak)
        values = torch.einsum("bhts,tsd->bhtd", pv, av)
    else:  # per head: (H, 2K+1, d)
        ak, av = a_key[:, idx], a_value[:, idx]  # (H, T, S, d)
        logits = torch.einsum("bhtd,htsd->bhts", qv, ak)
        values = torch.einsum("bhts,htsd->bhtd", pv, av)
    return logits, values.reshape(bh, t, d)


@pytest.mark.parametrize("untie", [{}, {"untie_layers": True}, {"untie_heads": True}])
@pytest.mark.parametrize("name", SHAW_FAMILY)
def test_relative_terms_equal_the_materialised_definition(name, untie):
    if untie and name == "sinusoidal":
        pytest.skip("fixed vectors cannot be untied")
    enc = encoding(name, max_distance=3, **untie)
    if name == "learnable-sinusoidal":
        with torch.no_grad():
            enc.omega.mul_(1 + torch.rand_like(enc.omega))
    torch.manual_seed(0)
    for t, s, offset in [(9, 9, 0), (1, 6, 5)]:  # full pass and one incremental step
        q = torch.randn(2 * 4, t, 8)
        probs = torch.softmax(torch.randn(2 * 4, t, s), -1)
        for block in (1, 2):
            logits, values = naive_terms(enc, q, probs, offset, block)
            torch.testing.assert_close(enc.logit_terms(q, t, s, offset, block), logits, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(enc.value_terms(probs, t, s, offset, block), values, rtol=1e-5, atol=1e-5)


def test_untied_layers_have_their_own_vectors():
    enc = encoding("learned", untie_layers=True)
    assert not torch.allclose(enc.vectors(1)[0], enc.vectors(2)[0])
    shared = encoding("learned")
    assert shared.vectors(1)[0] is not None and torch.equal(shared.vectors(1)[0], shared.vectors(2)[0])


@pytest.mark.parametrize("name", SHAW_FAMILY)
def test_distances_beyond_k_are_clipped(name):
    enc = encoding(name, max_distance=4)
    q = torch.randn(4, 1, 8)
    logits = enc.logit_terms(q, 1, 20, 10, 1)[0, :, 0]  # query at index 10, keys 0..19
    for h in range(4):
        # keys 0..6 are at distance <= -4 and 14..19 at >= +4: each group shares one vector
        assert torch.allclose(logits[h, :7], logits[h, 6].expand(7))
        assert torch.allclose(logits[h, 14:], logits[h, 14].expand(6))
        assert not torch.allclose(logits[h, 7], logits[h, 8])


def identical_query_logits(enc, length=12):
    """Position-only logit term for a query equal to a^K_0: B[i, j] = a^K_0 · a^K_{j-i}."""
    a_key, _ = enc.vectors(1)
    q = a_key[enc.max_distance].expand(1, length, -1).repeat(enc.num_heads, 1, 1)
    return enc.logit_terms(q.contiguous(), length, length, 0, 1)[0, 0]


def test_nezha_logit_term_is_symmetric_and_shaw_is_not():
    """Wang et al. §3: sinusoidal vectors give a^K_0·a^K_m = Σ cos(ω m), even in m; Shaw's are free."""
    nezha = identical_query_logits(encoding("sinusoidal", max_distance=8))
    torch.testing.assert_close(nezha, nezha.t(), rtol=1e-5, atol=1e-5)
    shaw = identical_query_logits(encoding("learned", max_distance=8))
    assert (shaw - shaw.t()).abs().max() > 0.1


# --- ALiBi, RoPE, T5 -----------------------------------------------------------------------------


def test_alibi_slopes_for_8_and_12_heads():
    assert alibi_slopes(8) == pytest.approx([2 ** -i for i in range(1, 9)])
    twelve = [2 ** -i for i in range(1, 9)] + [2 ** -0.5, 2 ** -1.5, 2 ** -2.5, 2 ** -3.5]
    assert alibi_slopes(12) == pytest.approx(twelve)


@pytest.mark.parametrize("causal", [False, True])
def test_alibi_bias_is_minus_slope_times_distance(causal):
    enc = encoding("alibi", heads=8, causal=causal)
    bias = enc.position_bias(5, 5, 0, 1)
    slopes = torch.tensor(alibi_slopes(8))
    for i in range(5):
        for j in range(5):
            torch.testing.assert_close(bias[:, i, j], -slopes * abs(j - i))


def test_rope_dot_products_depend_only_on_the_offset():
    enc = encoding("rope", heads=1, dim=16)
    torch.manual_seed(0)
    q, k = torch.randn(1, 1, 16), torch.randn(1, 1, 16)

    def score(m, n):
        rq, _ = enc.rotate(q, q, m, 1)
        rk, _ = enc.rotate(k, k, n, 1)
        return float((rq * rk).sum())

    for delta in (0, 3, -7):
        values = [score(m, m + delta) for m in (7, 12, 40, 300)]  # positions are never negative
        assert max(values) - min(values) < 1e-4
    assert abs(score(0, 3) - score(0, 4)) > 1e-3


def test_t5_buckets():
    d = torch.arange(-300, 301)
    bi = t5_bucket(d, True, 32, 128)
    assert bi.min() >= 0 and bi.max() <= 31
    assert torch.all(bi[d > 0] >= 16) and torch.all(bi[d <= 0] < 16)  # directions have their own half
    assert torch.equal(bi[(d >= -7) & (d <= 0)], torch.arange(7, -1, -1))  # exact small distances
    assert bi[d == 200].item() == bi[d == 300].item() == 31  # far distances share the last bucket
    causal = t5_bucket(d, False, 32, 128)
    assert torch.all(causal[d >= 0] == 0) and causal[d == -300].item() == 31


# --- in the model -------------------------------------------------------------------------------


def model_flags(absolute, relative, *extra):
    return ["--pe-absolute", absolute, "--pe-relative", relative, *REQUIRED.get(relative, ()), *extra]


@pytest.mark.parametrize("absolute,relative,extra", [("none", r, ()) for r in RELATIVE]
                         + [(a, r, ()) for a, r in PAIRS]
                         + [("none", "learned", ("--pe-relative-untie-layers", "--pe-relative-untie-heads")),
                            ("sinusoidal", "t5", ("--pe-relative-untie-layers",)),
                            ("learned", "rope", ("--pe-all-blocks",))])
def test_incremental_decoding_equals_full_forward(absolute, relative, extra):
    model, d = build_model(*model_flags(absolute, relative, *extra))
    layer = model.decoder.layers[1]
    assert isinstance(layer.self_attn, PositionAttention) and isinstance(layer.encoder_attn, PositionAttention)
    assert layer.self_attn.uses_relative  # the decoder's encoding, read from its pass
    assert not layer.encoder_attn.uses_relative  # no cross-attention term
    assert_incremental_equals_full(model, d)


@pytest.mark.parametrize("relative", RELATIVE)
def test_left_padding_does_not_change_the_encoding(relative):
    model, d = build_model(*model_flags("none", relative))
    src = random_tokens(d, 2, 9, left_pad=(0, 3))
    out = model.encoder(src, torch.tensor([9, 6]))["encoder_out"][0]
    alone = model.encoder(src[1:, 3:], torch.tensor([6]))["encoder_out"][0]
    torch.testing.assert_close(out[3:, 1], alone[:, 0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("relative", RELATIVE)
def test_relative_encodings_have_no_length_limit(relative):
    model, d = build_model(*model_flags("none", relative), "--max-source-positions", "64")
    src = random_tokens(d, 1, 1500)
    out = model.encoder(src, torch.tensor([1500]))["encoder_out"][0]
    assert out.shape[0] == 1500 and torch.isfinite(out).all()
    assert model.max_positions()[0] > 10 ** 9


@pytest.mark.parametrize("relative", RELATIVE)
def test_relative_encoding_makes_the_encoder_order_aware(relative):
    model, d = build_model(*model_flags("none", relative))
    if relative == "cope":  # its tables start at zero (CoPE adds nothing at initialisation): trained ones, say
        with torch.no_grad():
            model.encoder.embed_positions.relative.pos_emb.normal_(generator=torch.Generator().manual_seed(0))
    src = random_tokens(d, 1, 10)
    perm = torch.randperm(10, generator=torch.Generator().manual_seed(3))
    out = model.encoder(src, torch.tensor([10]))["encoder_out"][0]
    out_perm = model.encoder(src[:, perm], torch.tensor([10]))["encoder_out"][0]
    assert (out_perm - out[perm]).abs().max() > 1e-3


@pytest.mark.parametrize("relative", ["learned", "learnable-sinusoidal", "t5", "kerple-log", "kerple-power", "fire", "fox",
                                      "cope"])
def test_learnable_relative_parameters_get_gradients(relative):
    model, d = build_model(*model_flags("none", relative))
    model.train()
    out, _ = model(random_tokens(d, 2, 9), torch.tensor([9, 9]), random_tokens(d, 2, 7, seed=1))
    out.float().pow(2).mean().backward()
    for side in (model.encoder, model.decoder):
        grads = [p.grad for p in side.embed_positions.relative.parameters() if p.requires_grad]
        assert grads and all(g is not None and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("flags,message", [
    (("--pe-relative", "alibi", "--pe-relative-max-distance", "8"), "--pe-relative-max-distance applies"),
    (("--pe-relative", "learned", "--pe-t5-num-buckets", "16"), "--pe-t5-num-buckets applies"),
    (("--pe-relative", "sinusoidal", "--pe-relative-untie-heads"), "no effect"),
    (("--pe-relative", "t5", "--pe-relative-untie-heads"), "no effect"),
    (("--pe-relative-untie-layers",), "need --pe-relative"),
    (("--encoder-xformers-att-config", '{"name": "scaled_dot_product"}'), "xformers"),
])
def test_ineffective_options_are_refused(flags, message):
    with pytest.raises(ValueError, match=message):
        build_model(*flags)


def test_clipping_distance_option_is_used():
    model, _ = build_model("--pe-relative", "learned", "--pe-relative-max-distance", "5")
    assert model.encoder.embed_positions.relative.key_vectors.shape[-2] == 11
