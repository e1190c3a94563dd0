"""Property scores on matrices with known answers, and ψ(m) windows (Wang et al. App. A)."""

import torch

from fairseq_pe.analysis.properties import (monotonicity, property_scores, proximity, psi_decreasing_window,
                                            symmetry, translation_invariance)
from fairseq_pe.positional.sinusoidal import transformer_frequencies


def toeplitz(values):
    n = len(values)
    idx = torch.arange(n)
    return torch.tensor(values, dtype=torch.float64)[(idx[None] - idx[:, None]).abs()]


def test_toeplitz_is_translation_invariant_symmetric_and_monotone():
    m = toeplitz([10.0 - i for i in range(12)])
    s = property_scores(m, max_offset=8)
    assert s["translation_invariance"] < 1e-12 and s["symmetry"] < 1e-12
    assert s["eq2_share"] == 1.0
    assert s["window_right"] == 6 and s["window_left"] == 6  # to the end of each row: median of 11, 10, ..., 1


def test_shuffled_matrix_breaks_the_properties():
    g = torch.Generator().manual_seed(0)
    m = toeplitz([10.0 - i for i in range(12)])
    perm = torch.randperm(12, generator=g)
    shuffled = m[perm][:, perm]
    assert translation_invariance(shuffled) > 0.3
    assert monotonicity(shuffled, 8)["eq2_share"] < 0.9
    asym = torch.randn(12, 12, generator=g, dtype=torch.float64)
    assert symmetry(asym) > 0.5 and symmetry(asym + asym.t()) < 1e-12


def test_sinusoidal_dot_products_are_toeplitz():
    d, length = 64, 40
    omega = transformer_frequencies(d).double()
    pos = torch.arange(length, dtype=torch.float64)[:, None] * omega[None]
    vectors = torch.cat([torch.sin(pos), torch.cos(pos)], dim=-1)
    assert translation_invariance(proximity(vectors)) < 1e-9


def test_psi_windows_of_the_paper():
    assert psi_decreasing_window(transformer_frequencies(64)) == 5
    assert psi_decreasing_window(transformer_frequencies(512)) == 43
    assert psi_decreasing_window(transformer_frequencies(768)) == 43
    assert psi_decreasing_window(transformer_frequencies(128)) == 11
    assert psi_decreasing_window(transformer_frequencies(16)) == 3


def test_probe_recovers_positions_from_sinusoids_and_fails_on_random_vectors():
    from fairseq_pe.analysis.probes import regression_probe

    d, length = 128, 200
    omega = transformer_frequencies(d).double()
    pos = torch.arange(length, dtype=torch.float64)[:, None] * omega[None]
    sinusoids = torch.cat([torch.sin(pos), torch.cos(pos)], dim=-1)
    fit = regression_probe(sinusoids)
    assert fit["exact_share"] == 1.0 and fit["max_abs_error"] < 0.5
    random = torch.randn(length, d, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    miss = regression_probe(random)
    assert miss["mean_abs_error"] > 10 and miss["exact_share"] < 0.2


def test_constant_matrix_is_invariant_but_not_monotone():
    # what a model without position encoding gives: rounding noise must not count as variation
    noise = torch.randn(16, 16, generator=torch.Generator().manual_seed(0)) * 1e-7
    m = torch.full((16, 16), 0.78, dtype=torch.float32) + noise.clamp(-3e-7, 3e-7)
    s = property_scores(m, max_offset=8)
    assert s["constant"] and s["translation_invariance"] == 0.0
    assert s["eq2_share"] < 0.6 and s["window_right"] <= 1
    assert not property_scores(toeplitz([10.0 - i for i in range(12)]))["constant"]


def test_causal_matrix_is_scored_on_the_entries_that_exist():
    # a decoder's identical-word logits: keys after the query do not exist (NaN)
    from fairseq_pe.analysis.properties import causal

    full = toeplitz([10.0 - i for i in range(12)])
    s = property_scores(causal(full), max_offset=8)
    assert s["translation_invariance"] == 0.0 and s["eq2_share"] == 1.0
    assert s["window_right"] is None and s["symmetry"] is None
    assert s["window_left"] == property_scores(full, max_offset=8)["window_left"]
    rising = causal(toeplitz([float(i) for i in range(12)]))  # attends more to far-away keys
    assert property_scores(rising, max_offset=8)["eq2_share"] == 0.0


def test_direction_asymmetry_of_relative_vectors():
    from fairseq_pe.analysis.properties import direction_asymmetry

    g = torch.Generator().manual_seed(0)
    half = torch.randn(5, 8, generator=g, dtype=torch.float64)  # a_1 .. a_5
    mirrored = torch.cat([half.flip(0), torch.randn(1, 8, generator=g, dtype=torch.float64), half])  # a_-r = a_r
    assert direction_asymmetry(mirrored) < 1e-12
    assert direction_asymmetry(torch.randn(11, 8, generator=g, dtype=torch.float64)) > 1.0  # independent vectors
    # sinusoids of the signed distance: the sines flip sign with r
    omega = transformer_frequencies(8).double()
    r = torch.arange(-5, 6, dtype=torch.float64)[:, None] * omega[None]
    sinusoid = torch.cat([torch.sin(r), torch.cos(r)], dim=-1)
    sines = torch.cat([torch.sin(r), torch.zeros_like(r)], dim=-1)
    expected = float(2 * sines[6:].norm() / sinusoid.norm())
    assert abs(direction_asymmetry(sinusoid) - expected) < 1e-12


def test_gram_matrices_get_no_symmetry_score():
    m = toeplitz([10.0 - i for i in range(12)])
    assert property_scores(m, gram=True)["symmetry"] is None
    assert property_scores(m)["symmetry"] == 0.0
