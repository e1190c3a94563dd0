"""Vectors and identical-word logits of freshly built models: the pattern of Wang et al.'s Table 1."""

import pytest
import torch

from helpers import build_model

from fairseq_pe.analysis.properties import property_scores, proximity
from fairseq_pe.analysis.vectors import absolute_vectors, floater_bias_vectors, identical_word_logits, relative_vectors


def scores(flags, length=24):
    model, d = build_model(*flags)
    return property_scores(identical_word_logits(model, d.nspecial + 3, length).mean(0), max_offset=8), model


def test_sinusoidal_ape_vectors_are_translation_invariant_and_symmetric():
    model, _ = build_model("--pe-absolute", "sinusoidal")
    vec = absolute_vectors(model, 30)
    assert list(vec) == [1] and vec[1].shape == (30, 64)
    s = property_scores(proximity(vec[1]))
    assert s["translation_invariance"] < 1e-5 and s["symmetry"] < 1e-12  # float32 vectors


def test_learned_ape_is_not_translation_invariant():
    model, _ = build_model("--pe-absolute", "learned")
    s = property_scores(proximity(absolute_vectors(model, 30)[1]))
    assert s["translation_invariance"] > 0.5


def test_identical_word_logits_of_learned_rpe_are_toeplitz_and_asymmetric():
    s, model = scores(["--pe-absolute", "none", "--pe-relative", "learned"])
    assert s["translation_invariance"] < 1e-5  # depends on j - i only (float32 logits)
    assert s["symmetry"] > 1e-3  # separate vectors for forward and backward distances
    rel = relative_vectors(model)
    assert rel[1][0].shape == (2 * 64 + 1, 16)


def test_no_position_encoding_gives_constant_identical_word_logits():
    model, d = build_model("--pe-absolute", "none")
    logits = identical_word_logits(model, d.nspecial + 3, 16)
    torch.testing.assert_close(logits, logits[:, :1, :1].expand_as(logits))


def test_every_block_of_floater_all_blocks():
    model, _ = build_model("--pe-absolute", "floater", "--pe-all-blocks")
    vec = absolute_vectors(model, 12)
    assert sorted(vec) == [1, 2] and all(v.shape == (12, 64) and torch.isfinite(v).all() for v in vec.values())
    assert not torch.allclose(vec[1], vec[2])


# Wang et al. Table 1 on untrained encodings: (flags, matrix, translation invariant, symmetric).
# APEs are judged on the dot products of their vectors (symmetric by construction: None), RPEs on
# identical-word logits (the proximity they add to attention) and on their vectors of r against -r;
# the word-position cross terms make APE logits not Toeplitz.
TABLE_1 = [
    (["--pe-absolute", "sinusoidal"], "absolute", True, None),
    (["--pe-absolute", "learnable-sinusoidal"], "absolute", True, None),
    (["--pe-absolute", "learned"], "absolute", False, None),
    (["--pe-absolute", "none", "--pe-relative", "learned"], "identical-word", True, False),
    (["--pe-absolute", "none", "--pe-relative", "sinusoidal"], "identical-word", True, False),
    (["--pe-absolute", "none", "--pe-relative", "learnable-sinusoidal"], "identical-word", True, False),
]


@pytest.mark.parametrize("flags,matrix,invariant,symmetric", TABLE_1, ids=[" ".join(t[0][1::2]) for t in TABLE_1])
def test_table_1_pattern(flags, matrix, invariant, symmetric):
    from fairseq_pe.analysis.properties import direction_asymmetry

    model, d = build_model(*flags)
    if matrix == "absolute":
        s = property_scores(proximity(absolute_vectors(model, 64)[1]), max_offset=16, gram=True)
    else:
        s = property_scores(identical_word_logits(model, d.nspecial + 5, 64).mean(0), max_offset=16)
        assert (s["symmetry"] < 1e-9) == symmetric, s
        key, _ = relative_vectors(model)[1]
        assert direction_asymmetry(key) > 0.3  # forward and backward distances differ (Table 1: ×)
    assert (s["translation_invariance"] < 1e-5) == invariant, s


def test_sinusoidal_ape_is_monotone_exactly_over_the_psi_window():
    # D = 64: ψ decreases up to m = 5 (App. A), so every row away from the edges has window 5
    model, _ = build_model("--pe-absolute", "sinusoidal")
    s = property_scores(proximity(absolute_vectors(model, 64)[1]), max_offset=5)
    assert s["window_right"] == 5 and s["window_left"] == 5 and s["eq2_share"] == 1.0
    learned, _ = build_model("--pe-absolute", "learned")
    assert property_scores(proximity(absolute_vectors(learned, 64)[1]), max_offset=5)["eq2_share"] < 0.8


def test_batched_identical_word_logits_equal_one_token_at_a_time():
    model, d = build_model("--pe-absolute", "learned", "--pe-relative", "t5")
    tokens = [d.nspecial, d.nspecial + 3, d.nspecial + 7]
    batched = identical_word_logits(model, tokens, 20)
    for i, t in enumerate(tokens):
        torch.testing.assert_close(batched[i], identical_word_logits(model, t, 20))
    assert not torch.allclose(batched[0], batched[1])  # the word matters, only its average is word-free


def test_decoder_identical_word_logits_are_the_first_layers_own():
    # q·k/√d of the decoder's first layer, computed by hand from its embedding and projections
    model, d = build_model("--pe-absolute", "learned")
    dec = model.decoder
    tokens = torch.full((1, 10), d.nspecial + 2)
    with torch.no_grad():
        x = dec.embed_scale * dec.embed_tokens(tokens) + dec.embed_positions(tokens)
        x = x.transpose(0, 1)
        layer = dec.layers[0]
        if layer.normalize_before:
            x = layer.self_attn_layer_norm(x)
        attn = layer.self_attn
        q = attn.q_proj(x)[:, 0].view(10, attn.num_heads, -1).transpose(0, 1) * attn.scaling
        k = attn.k_proj(x)[:, 0].view(10, attn.num_heads, -1).transpose(0, 1)
        expected = (q @ k.transpose(1, 2)).double()
    got = identical_word_logits(model, d.nspecial + 2, 10, side="decoder")
    future = torch.ones(10, 10, dtype=torch.bool).triu(1)
    assert got[:, future].isnan().all()
    torch.testing.assert_close(got[:, ~future], expected[:, ~future])
    # the encoder's are another stack's
    assert not torch.allclose(identical_word_logits(model, d.nspecial + 2, 10)[:, ~future], got[:, ~future])


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_floater_biases_reach_the_identical_word_logits(side):
    model, d = build_model("--pe-absolute", "sinusoidal", "--pe-floater-bias")
    with_dynamics = identical_word_logits(model, d.nspecial + 1, 16, side)
    with torch.no_grad():
        model.floater.zero_dynamics()  # h ≡ 0: every position gets its initial value as bias
    without = identical_word_logits(model, d.nspecial + 1, 16, side)
    assert (with_dynamics - without).nan_to_num().abs().max() > 1e-3


@pytest.mark.parametrize("side", ["encoder", "decoder"])
def test_floater_bias_vectors_are_the_flows_q_k_v_biases_of_every_block(side):
    model, _ = build_model("--pe-absolute", "sinusoidal", "--pe-floater-bias")
    client = getattr(model, side).embed_positions.self_bias
    with torch.no_grad():
        client.initial.normal_()  # every block, q/k/v its own starting point
        biases = floater_bias_vectors(model, 30, side)
        states = client.states(30)
        for block in (1, 2):
            for index in range(3):
                torch.testing.assert_close(biases[block][:, index].float(), client.table(30, block, index, states))
    assert sorted(biases) == [1, 2] and biases[1].shape == (30, 3, 64)
    assert floater_bias_vectors(build_model("--pe-absolute", "floater")[0], 30, side) == {}
