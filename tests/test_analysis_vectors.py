"""Vectors and identical-word logits of freshly built models: the pattern of Wang et al.'s Table 1."""

import torch

from helpers import build_model

from fairseq_pe.analysis.properties import property_scores, proximity
from fairseq_pe.analysis.vectors import absolute_vectors, identical_word_logits, relative_vectors


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
