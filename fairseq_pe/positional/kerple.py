"""KERPLE (Chi et al. 2022, "Kernelized Relative Positional Embedding for Length Extrapolation"), §4:
a logit bias per head from a conditionally positive definite kernel of the distance,

    kerple-log:    logits_ij += −r₁·log(1 + r₂·|i − j|)        (Eq. 8, the "logarithmic variant")
    kerple-power:  logits_ij += −r₁·|i − j|^r₂,  0 < r₂ ≤ 2     (Eq. 7, the "power variant")

with r₁, r₂ > 0 learned for every head of every layer (as in the official implementation, one
module per attention layer).  Positivity is kept as the official code keeps it, by projection after each
update: r₁, r₂ into [ε, ∞), and r₂ of the power variant into [ε, 2], ε = 0.01 (a projected-gradient step; the
official code's ``param.data = param.data.clamp(...)``).  The projection is applied to the copy the optimizer
updates, also fairseq's float32 master copy under ``--fp16``/``--bf16`` (:func:`~.base.constrain`), so the
values stored, used and updated agree under every optimizer.  The forward pass uses the parameters clamped
into the same ranges (the identity after a projection; a guard for values set by other means, e.g. an
optimizer of another library).  Initialisation as the official code:
the log variant's r₁ ~ U(0, 2) and r₂ ~ U(0, 1); the power variant's r₁ ~ U(0, 1) and r₂ ~ U(0, 2)
(both then projected).

|i − j| makes the bias symmetric in the encoder; in the decoder the causal mask leaves j ≤ i, the
paper's causal form.  No length limit.
"""

import torch
import torch.nn as nn

from .base import Float32State, RelativePositionEncoding, constrain, register_position_encoding

EPS = 0.01
POWER_MAX = 2.0


class _Kerple(Float32State, RelativePositionEncoding):
    """r₁, r₂ of shape (layers, heads); subclasses define :meth:`kernel`."""

    already_untied = ("layers", "heads")  # per layer and head, as in the paper
    #: the largest r₂ (the power variant's exponent is at most 2; the log variant's r₂ is unbounded)
    r2_max = None
    #: U(0, scale) initialisation of r₁ and r₂ (the official code's)
    init_scales = (1.0, 1.0)

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.r1 = constrain(nn.Parameter(torch.rand(num_blocks, num_heads) * self.init_scales[0]), EPS)
        self.r2 = constrain(nn.Parameter(torch.rand(num_blocks, num_heads) * self.init_scales[1]), EPS, self.r2_max)

    @property
    def bias_requires_grad(self) -> bool:
        return self.r1.requires_grad or self.r2.requires_grad

    def bias_key(self, block):
        return block, self.r1._version, self.r2._version

    def parameters_in_range(self, block: int):
        """r₁, r₂ of ``block`` (H each) as the forward pass uses them: clamped into their ranges (no host sync)."""
        return self.r1[block - 1].clamp(min=EPS), self.r2[block - 1].clamp(min=EPS, max=self.r2_max)

    def kernel(self, distance: torch.Tensor, r1: torch.Tensor, r2: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def position_bias(self, tgt_len, src_len, query_offset, block):
        """(H, T, S) biases, from the T + S − 1 distinct distances (a Toeplitz view, as T5's); (B, H, T, S) from
        the rows' own positions when they have them."""
        r1, r2 = self.parameters_in_range(block)
        rows = self.row_distances(tgt_len, src_len, query_offset)
        if rows is not None:  # the rows' own positions (randomised): (B, H, T, S)
            r1, r2 = r1.view(1, -1, 1, 1), r2.view(1, -1, 1, 1)
            return self.kernel(rows.abs().unsqueeze(1).to(r1.dtype), r1, r2)
        r1, r2 = r1.view(-1, 1), r2.view(-1, 1)
        low = -(query_offset + tgt_len - 1)
        distance = torch.arange(low, src_len - query_offset, device=r1.device).abs().to(r1.dtype)
        per_distance = self.kernel(distance.unsqueeze(0), r1, r2)  # (H, T + S − 1)
        return per_distance.unfold(1, src_len, 1).flip(1)  # [h, i, j] = k(|j − (offset + i)|)


@register_position_encoding("relative", "kerple-log")
class KerpleLogBias(_Kerple):
    """−r₁·log(1 + r₂·|i − j|) (module docstring)."""

    init_scales = (2.0, 1.0)

    def kernel(self, distance, r1, r2):
        return -r1 * torch.log1p(r2 * distance)


@register_position_encoding("relative", "kerple-power")
class KerplePowerBias(_Kerple):
    """−r₁·|i − j|^r₂ with r₂ ≤ 2 (module docstring)."""

    init_scales = (1.0, 2.0)
    r2_max = POWER_MAX

    def kernel(self, distance, r1, r2):
        return -r1 * distance.pow(r2)
