"""Sinusoidal absolute position encodings, fixed and with learnable frequencies.

Fixed (Vaswani et al. 2017; Wang et al. 2021, Table 1):

    P(x) = [sin(ω_1 x), ..., sin(ω_{D/2} x), cos(ω_1 x), ..., cos(ω_{D/2} x)],
    ω_i = 10000^(-2i/D),  i = 0 .. D/2-1.

The sines come first and the cosines second (fairseq's layout) rather than interleaved
as printed in the papers; this permutes the dimensions only, so every dot product
<P(x), P(y)> = Σ_i cos(ω_i (x - y)) is unchanged.  An odd D gets a zero last dimension.

Learnable (Wang et al. 2021, "learnable sinusoidal APE"): the same form with the D/2
frequencies ω_i trainable, initialised to the fixed values.

Per block (``--pe-all-blocks``; FLOATER paper Eq. 7, after Dehghani et al. 2018):
block n (1-based) receives p_i^(n) = P(i) + P(n).  The learnable variant shares its
frequencies across blocks, so every block uses the same ω and differs by P(n).
Both work at any length: there is no table size and no maximum position.

fairseq's own (``sinusoidal-fairseq``): what fairseq's stock ``transformer`` uses
(``SinusoidalPositionalEmbedding``), so that stock checkpoints convert exactly
(``scripts/warm_start_floater.py``): ω_i = 10000^(-i/(D/2-1)) and token x at position
x + padding_idx + 1.

Every variant is multiplied by a scale S (:mod:`.sinusoid_scale`): P_S(x) = S·P(x), fixed or learnable,
``--pe-sinusoid-scale`` (default 1 for ``transformer_pe``, so the vectors above are unchanged).
"""

import math

import torch
import torch.nn as nn

from .base import AbsolutePositionEncoding, Float32State, compute_dtype, register_position_encoding
from .sinusoid_scale import ScaledSinusoids, scale_of


def transformer_frequencies(embed_dim: int, base: float = 10000.0) -> torch.Tensor:
    """ω_i = base^(-2i/D) for i = 0 .. D/2 - 1."""
    half = embed_dim // 2
    return torch.exp(torch.arange(half, dtype=torch.float64) * (-2.0 * math.log(base) / embed_dim)).float()


def sinusoid(positions: torch.Tensor, frequencies: torch.Tensor, embed_dim: int) -> torch.Tensor:
    """[sin(ω x) | cos(ω x)] for float ``positions`` of any shape -> shape + (embed_dim,), in float32 (float64 for
    float64 ``frequencies``)."""
    dtype = compute_dtype(frequencies.dtype)
    angles = positions.to(dtype).unsqueeze(-1) * frequencies.to(dtype)
    out = torch.cat([torch.sin(angles), torch.cos(angles)], dim=-1)
    if embed_dim % 2 == 1:
        out = torch.cat([out, out.new_zeros(out.shape[:-1] + (1,))], dim=-1)
    return out


class _SinusoidalBase(ScaledSinusoids, Float32State, AbsolutePositionEncoding):
    """Sinusoids computed in float32 from float32 frequencies, whatever the model's dtype, times the
    scale S of ``args`` (``--pe-sinusoid-scale``, ``--pe-sinusoid-scale-learnable``; 1 without args)."""

    def __init__(self, embed_dim, args=None, **kwargs):
        super().__init__(embed_dim, args=args, **kwargs)
        self.init_scale(*scale_of(args, "absolute"))

    def frequencies(self) -> torch.Tensor:
        raise NotImplementedError

    def first_position(self) -> int:
        return 0

    def forward(self, length: int, block: int = 1) -> torch.Tensor:
        freqs = self.frequencies()
        start = self.first_position()
        positions = torch.arange(start, start + length, device=freqs.device)
        table = sinusoid(positions, freqs, self.embed_dim)
        if self.all_blocks:
            table = table + sinusoid(torch.tensor([float(block)], device=freqs.device), freqs, self.embed_dim)
        return self.scaled(table)


@register_position_encoding("absolute", "sinusoidal")
class FixedSinusoidalPositionEncoding(_SinusoidalBase):
    """Fixed sinusoids, ω_i = 10000^(-2i/D) (module docstring); no parameters."""

    def __init__(self, embed_dim, **kwargs):
        super().__init__(embed_dim, **kwargs)
        self.register_buffer("omega", transformer_frequencies(embed_dim), persistent=False)

    def frequencies(self):
        return self.omega


@register_position_encoding("absolute", "learnable-sinusoidal")
class LearnableSinusoidalPositionEncoding(_SinusoidalBase):
    """Sinusoids with D/2 trainable frequencies initialised to 10000^(-2i/D) (Wang et al.)."""

    def __init__(self, embed_dim, **kwargs):
        super().__init__(embed_dim, **kwargs)
        self.omega = nn.Parameter(transformer_frequencies(embed_dim))

    def frequencies(self):
        return self.omega


def fairseq_frequencies(embed_dim: int) -> torch.Tensor:
    """fairseq's ``SinusoidalPositionalEmbedding.get_embedding`` frequencies, computed as it does (float32)."""
    half = embed_dim // 2
    return torch.exp(torch.arange(half, dtype=torch.float) * -(math.log(10000) / (half - 1)))


@register_position_encoding("absolute", "sinusoidal-fairseq")
class FairseqSinusoidalPositionEncoding(_SinusoidalBase):
    """fairseq's stock sinusoids (module docstring): the same vectors as fairseq's ``transformer``."""

    def __init__(self, embed_dim, **kwargs):
        super().__init__(embed_dim, **kwargs)
        if embed_dim < 4:
            raise ValueError("--pe-absolute sinusoidal-fairseq needs an embedding dimension of at least 4")
        self.register_buffer("omega", fairseq_frequencies(embed_dim), persistent=False)

    def frequencies(self):
        return self.omega

    def first_position(self):
        return self.padding_idx + 1  # fairseq's offset
