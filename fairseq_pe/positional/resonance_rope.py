"""Resonance RoPE (Wang et al. 2024, "Resonance RoPE: Improving Context Length Generalization of Large Language
Models", §3, Eq. 5): every frequency θ_i of RoPE is moved to the nearest one whose wavelength is a whole number of
tokens,

    λ̃_i = round(2π / θ_i),   θ̃_i = 2π / λ̃_i,

so that the rotation of each pair repeats exactly every λ̃_i positions: a position past the training length gets
the angles of a position seen in training (modulo λ̃_i), pair by pair.

``--pe-rope-resonance`` turns it on for ``--pe-relative rope`` and ``p-rope``, in training (the system
``rope-resonance``) or at generation time on a RoPE checkpoint (``--model-overrides "{'pe_rope_resonance': True}"``),
alone or with the scaling of ``--pe-rope-scaling`` (PI, NTK, YaRN).  What the paper leaves to its code follows the
authors' code (github.com/sheryc/resonance_rope @ 4a7f5a7, ``rotary_resonance.py``: ``ResonanceRotaryEmbedding``,
``ResonanceNTKScaledRotaryEmbedding``, ``ResonanceYaRNScaledRotaryEmbedding``):

* every pair is rounded (no cut-off at a critical dimension), with ``torch.round`` (halves to even), of 2π/θ_i computed
  in float32 as there;
* the rounding comes last, on the scaled frequencies: NTK's base, YaRN's blend of θ_i and θ_i/s (and YaRN's
  temperature, which multiplies cos and sin, is kept).  The reference's Position-Interpolation variant
  (``ResonanceLinearScaledRotaryEmbedding``) reads attributes it never sets and cannot run; the same rule, round last,
  is applied to PI's effective frequency θ_i/s (positions are then integers, as in training);
* the angle of position t is computed as (t mod λ̃_i)·θ̃_i, as the reference's table tiles arange(λ̃_i)·θ̃_i: the same
  value, exact periodicity in float32 at any position.

p-RoPE's unrotated pairs (θ = 0) keep θ̃ = 0.
"""

import math

import torch


def resonance_wavelengths(frequencies: torch.Tensor) -> torch.Tensor:
    """λ̃_i = round(2π/θ_i), float32 as the reference computes it (θ_i = 0: infinite)."""
    return torch.round(2 * math.pi / frequencies.float())


def resonance_frequencies(wavelengths: torch.Tensor) -> torch.Tensor:
    """θ̃_i = 2π/λ̃_i (λ̃ infinite: 0)."""
    return 2 * math.pi / wavelengths


def resonance_angles(positions: torch.Tensor, frequencies: torch.Tensor, periods: torch.Tensor) -> torch.Tensor:
    """(t mod λ̃_i)·θ̃_i for positions t (..., T) float32, (..., T, pairs): ``periods`` is λ̃ where θ̃ ≠ 0, and 1 where
    θ̃ = 0 (any finite value: the angle is 0)."""
    return torch.remainder(positions.unsqueeze(-1), periods) * frequencies
