"""FoPE, Fourier Position Embedding (Hua et al. 2024, "Fourier Position Embedding: Enhancing Attention's Periodic
Extension for Length Generalization", arXiv 2412.17739, §4): RoPE whose every pair of dimensions carries a Fourier
series over the frequencies instead of one frequency, and whose frequencies too low to complete a period within the
training length L are clipped to 0.

With RoPE's frequencies ω_k = 10000^(−2k/d), k < d/2, the M of them with ω_k ≥ 2π/L (the highest) make the series;
for each layer l and head h, position t and output pair o < O:

    c_o(t) = Σ_{k<M} cos(t·ω_k)·C^cos_{l,h}[k, o],   s_o(t) = Σ_{k<M} sin(t·ω_k)·C^sin_{l,h}[k, o],
    (x_{2o}, x_{2o+1}) ↦ (x_{2o}·c_o − x_{2o+1}·s_o,  x_{2o}·s_o + x_{2o+1}·c_o)       (the rotation's form)

applied to the queries and keys of the layer's self-attention at their own positions: absolute, and unlike RoPE's
the product of a query and a key depends on both positions, not on their distance alone (left padding: the rows'
positions are read, not the indices, :attr:`needs_positions`).  The
pairs o ≥ O carry the clipped (zero) frequencies.  What the paper leaves to its code follows the authors' code as
fetched (github.com/TsinghuaC3I/Fourier-Position-Embedding @ bd94b20, ``olmo/model.py``: ``RotaryEmbedding.get_inv_freq``,
``FourierEmbedding``; the settings of every released FoPE config, ``configs/*/length-*/ce-fourier/*.yaml``):

* ω_k < 2π/L is set to 0 and dropped (``rope_clamp_floor_freq``, ``rope_clamp_floor_to_zero``, ``fourier_ignore_zero``);
  L = ``--pe-fope-train-length`` (the reference's ``max_sequence_length``; no default: it is the model's training
  length, and must be at least 7, since below 2π every frequency would be clipped);
* O = min(M, d/4) output pairs (the reference's ``min(input_dim, head_dim // 4)``), or ``--pe-fope-pairs O``;
* separate cos and sin coefficients, per head and per layer (``fourier_separate_basis``, ``fourier_separate_head``,
  one ``FourierEmbedding`` per block), initialised as ``eye_xavier_norm``: ``xavier_normal_`` of each layer's
  (H, M, O) tensor with gain ``--pe-fope-init-gain`` (0.3, the configs' default and their 60M models'; 0.4 and 0.6
  at 180M and 1.2B), plus the "step eye" (1 at [k = o·⌈M/O⌉, o] where k < M; the identity when M = O);
* fixed: the coefficients are not trained (``fourier_learnable`` is False in every released config; they are
  ``requires_grad=False`` parameters, saved with the model); ``--pe-fope-learnable`` trains them;
* the pairs o ≥ O get c = s = 1, as the reference pads both with the constant 1 (``F.pad(..., value=1)``): such a
  pair is scaled by √2 and turned by 45° at every position, so its query-key product is twice the plain one (a
  NoPE pair of doubled weight), not the identity a zero frequency would give (cos 0 = 1, sin 0 = 0).  Reproduced
  because it is what the published models computed; ``--pe-fope-unused-pairs unrotated`` gives the identity;
* computed in float32 (``rope_full_precision``), the result in the model's dtype; RoPE's base 10000 (``rope_theta``).

The reference pairs dimension o with o + d/2 (``rotate_half``); here, as in rotary-embedding-torch, 2o with 2o + 1:
a fixed permutation of a head's dimensions, which the projections absorb.  Keys are cached transformed (step-by-step
decoding transforms the new position only; the reference transforms its whole cache again at every step, at the
same absolute positions: the same values).  Encoder and decoder self-attention; cross-attention has no relative
term, as for every relative encoding.
"""

import math
from typing import NamedTuple

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, option, register_position_encoding
from .pass_state import RelativeRows, as_rows
from .rotary import _number, rotated

#: RoPE's base (the reference's rope_theta)
BASE = 10000.0
#: the reference's fourier_init_norm_gain default (its 60M configs)
DEFAULT_INIT_GAIN = 0.3
UNUSED_PAIRS = ("ones", "unrotated")


class FourierRotationKey(NamedTuple):
    """FoPE's transforms of the pass's new positions for every block (times the queries' scale)."""
    linear = True  # O(T): kept for blocks too (PassMemo.linear)
    length: int
    query_offset: int
    own_positions: bool
    query_scale: float


class FourierBasisKey(NamedTuple):
    """FoPE's cos(t·ω_k), sin(t·ω_k) of the pass's new positions (shared by the side's layers)."""
    linear = True  # O(T): kept for blocks too (PassMemo.linear)
    length: int
    query_offset: int
    own_positions: bool


def kept_frequencies(head_dim: int, train_length: int) -> torch.Tensor:
    """RoPE's frequencies at or above 2π/L (the others clipped to 0 and dropped), float32 as the reference."""
    frequencies = 1.0 / (BASE ** (torch.arange(0, head_dim, 2, dtype=torch.float) / head_dim))
    return frequencies[frequencies >= 2 * math.pi / train_length]


def step_eye(inputs: int, outputs: int) -> torch.Tensor:
    """(inputs, outputs): 1 at [o·⌈inputs/outputs⌉, o] where that row exists (the reference's ``get_step_eye``)."""
    eye = torch.zeros(inputs, outputs)
    step = math.ceil(inputs / outputs)
    for o in range(outputs):
        if o * step < inputs:
            eye[o * step, o] = 1.0
    return eye


@register_position_encoding("relative", "fope")
class FourierPositionEncoding(Float32State, RelativePositionEncoding):
    """FoPE (module docstring): per layer and head, a Fourier series of RoPE's frequencies above 2π/L per pair."""

    already_untied = ("layers", "heads")
    #: the transform is a function of the absolute position (not of j − i alone, as RoPE's product is): under left
    #: padding it reads the rows' positions, not the indices
    needs_positions = True

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        d = self.head_dim
        if d % 2 or d < 4:
            raise UserError(f"--pe-relative fope needs an even head dimension of at least 4 (pairs of dimensions), "
                            f"got {d} ({embed_dim} dimensions / {num_heads} heads)")
        length = _number(option(args, "pe_fope_train_length", None), "--pe-fope-train-length", int)
        if length is None or length < 7:
            raise UserError("--pe-relative fope needs --pe-fope-train-length N, the longest sequence the model trains "
                            "on (frequencies below 2π/N are clipped to 0), at least 7 (below 2π every frequency "
                            f"would be), got {length}")
        self.train_length = length
        frequencies = kept_frequencies(d, length)
        terms = frequencies.numel()
        pairs = _number(option(args, "pe_fope_pairs", None), "--pe-fope-pairs", int)
        if pairs is None:
            pairs = min(terms, d // 4)
        elif not 1 <= pairs <= d // 2:
            raise UserError(f"--pe-fope-pairs must be from 1 to {d // 2} (the pairs of a head of {d} dimensions), "
                            f"got {pairs}")
        gain = _number(option(args, "pe_fope_init_gain", DEFAULT_INIT_GAIN), "--pe-fope-init-gain", float)
        if not math.isfinite(gain) or gain < 0:
            raise UserError(f"--pe-fope-init-gain must be a finite number of at least 0, got {gain}")
        self.unused_pairs = option(args, "pe_fope_unused_pairs", "ones")
        if self.unused_pairs not in UNUSED_PAIRS:
            raise UserError(f"--pe-fope-unused-pairs {self.unused_pairs!r}: choose one of {', '.join(UNUSED_PAIRS)}")
        self.register_buffer("frequencies", frequencies, persistent=False)
        learnable = bool(getattr(args, "pe_fope_learnable", False))
        # C[l, h, o, k]: layer, head, output pair, frequency (the reference's [h, k, o] per layer, transposed: the
        # series of every layer and head is then one product with the (M, T) basis)
        shape = (num_blocks, num_heads, pairs, terms)
        self.cos_coefficients = nn.Parameter(torch.empty(shape), requires_grad=learnable)
        self.sin_coefficients = nn.Parameter(torch.empty(shape), requires_grad=learnable)
        with torch.no_grad():
            eye = step_eye(terms, pairs)
            for block in range(num_blocks):  # the reference's order: each layer's sin, then its cos
                for coefficients in (self.sin_coefficients, self.cos_coefficients):
                    reference_layout = torch.empty(num_heads, terms, pairs)  # its fans: M·O in, H·O out
                    nn.init.xavier_normal_(reference_layout, gain=gain)
                    coefficients[block] = (reference_layout + eye).transpose(1, 2)

    def basis(self, length: int, query_offset: int, device, rows: RelativeRows = None):
        """cos(t·ω_k), sin(t·ω_k) of the pass's new positions t, float32: (M, T), or (B, 1, M, T) for rows with
        positions of their own; computed once per pass and shared by the side's layers."""
        rows = as_rows(rows)
        positions = rows.positions
        if positions is not None:
            positions = positions[:, query_offset:query_offset + length].to(device)

        def compute():
            if positions is None:
                t = torch.arange(length, device=device, dtype=torch.float32) + query_offset
            else:
                t = positions.float().unsqueeze(1).unsqueeze(-2)  # (B, 1, 1, T)
            angles = self.frequencies.unsqueeze(-1) * t
            return angles.cos(), angles.sin()

        return rows.shared(FourierBasisKey(length, query_offset, positions is not None), compute)

    def rotations(self, length: int, query_offset: int, device, block: int, rows: RelativeRows = None,
                  query_scale: float = 1.0):
        """The queries' and the keys' c_o(t) + i·s_o(t) per head and pair of block ``block`` (1-based), the queries'
        times ``query_scale``, the unused pairs filled: complex (H, T, d/2), or (B, H, T, d/2) for rows of their own
        positions.  Fixed coefficients (or no autograd): every block's at once, once per pass (the memo), each layer
        reading its own (no operator per layer: a decoding step stays within the operators' target); coefficients
        that learn: the block's own, in the layer's graph."""
        rows = as_rows(rows)
        if self.cos_coefficients.requires_grad and torch.is_grad_enabled():
            cos, sin = self.basis(length, query_offset, device, rows)  # (M, T), or (B, 1, M, T)
            rotation = self.filled(self.cos_coefficients[block - 1] @ cos, self.sin_coefficients[block - 1] @ sin)
            return (rotation if query_scale == 1.0 else rotation * query_scale), rotation

        def every_block():
            cos, sin = self.basis(length, query_offset, device, rows)
            blocks, heads, pairs, terms = self.cos_coefficients.shape
            # one product for every block, head and pair: (L·H·O, M) times (M, T)
            series = [(c.view(-1, terms) @ b).unflatten(-2, (blocks, heads, pairs))
                      for c, b in ((self.cos_coefficients, cos), (self.sin_coefficients, sin))]
            if cos.dim() == 4:  # rows of their own positions: (B, 1, L, H, O, T) -> (L, B, H, O, T)
                series = [x.squeeze(1).movedim(1, 0) for x in series]
            rotation = self.filled(*series)
            keys = rotation.unbind(0)
            return (keys if query_scale == 1.0 else (rotation * query_scale).unbind(0)), keys

        queries, keys = rows.shared(FourierRotationKey(length, query_offset, rows.positions is not None, query_scale),
                                    every_block)
        return queries[block - 1], keys[block - 1]

    def filled(self, series_cos, series_sin):
        """c + i·s of the series (..., O, T), the unused pairs O .. d/2 − 1 filled (module docstring): (..., T, d/2)."""
        fill = self.head_dim // 2 - series_cos.size(-2)
        series_cos = nn.functional.pad(series_cos, (0, 0, 0, fill), value=1.0)
        series_sin = nn.functional.pad(series_sin, (0, 0, 0, fill), value=1.0 if self.unused_pairs == "ones" else 0.0)
        return torch.complex(series_cos, series_sin).transpose(-1, -2)

    def rotate(self, q, k, query_offset, block, query_scale=1.0, rows=None):
        # q, k: (B, H, T, d), the new keys at the queries' indices: each pair times c + i·s, in float32
        rotate_q, rotate_k = self.rotations(q.size(-2), query_offset, q.device, block, rows, query_scale)
        return rotated(q, rotate_q, q.dtype), rotated(k, rotate_k, k.dtype)
