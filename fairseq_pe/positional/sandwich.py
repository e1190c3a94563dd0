"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive
Field Analysis", §5): a parameter-free logit bias from the dot product of two sinusoidal position
vectors, scaled per head,

    logits_ij += (p_i · p_j − d̄/2) / (8h/H) = (Σ_{k=0}^{d̄/2−1} cos((i − j)·ω_k) − d̄/2) · H/(8h),

with p the sinusoids of Vaswani et al. in d̄ dimensions (``--pe-sandwich-dim``, default the model's
dimension), ω_k = 10000^(−2k/d̄), head h = 1..H.  p_i · p_i = d̄/2, so the bias is 0 at distance 0
and negative elsewhere; it decays with the distance like a log (the paper's reading: a temporal
bias that Sandwich shares with KERPLE and ALiBi), and flattens around −d̄/2·H/(8h) far away.  The per-head
factor H/(8h) is the paper's compensation, the same 8h/H as ALiBi's slopes 2^(−8h/H) but
linear (as the NeMo implementation of Sandwich, whose sum omits the cosine; here it is the dot product
the paper defines).

Symmetric in the encoder (cos is even); in the decoder the causal mask leaves j ≤ i, the paper's
causal form.  No parameters, no length limit.
"""

import torch

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, option, register_position_encoding


def sandwich_bias(distance: torch.Tensor, dim: int, num_heads: int) -> torch.Tensor:
    """(H, *distance.shape) biases for the signed distances ``distance`` (float32)."""
    omega = 10000.0 ** (-torch.arange(0, dim, 2, dtype=torch.float64, device=distance.device) / dim)
    dots = torch.cos(distance.double().unsqueeze(-1) * omega).sum(-1) - dim / 2  # p_i·p_j − d̄/2
    heads = torch.arange(1, num_heads + 1, dtype=torch.float64, device=distance.device)
    scale = (num_heads / (8.0 * heads)).view(-1, *([1] * distance.dim()))
    return (dots.unsqueeze(0) * scale).float()


@register_position_encoding("relative", "sandwich")
class SandwichPositionBias(Float32State, RelativePositionEncoding):
    """(p_i·p_j − d̄/2)·H/(8h) added to the attention logits (module docstring)."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        dim = option(args, "pe_sandwich_dim", None)
        self.dim = embed_dim if dim is None else dim
        if self.dim < 2 or self.dim % 2:
            raise UserError(f"--pe-sandwich-dim must be an even number of at least 2 (the sinusoids' dimension), "
                            f"got {self.dim}")
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows the model's device

    def position_bias(self, tgt_len, src_len, query_offset, block):
        rows = self.row_distances(tgt_len, src_len, query_offset)
        if rows is not None:  # the rows' own positions (randomised): (B, H, T, S)
            def per_row():
                # the bias of each of the 2·bound + 1 possible distances (positions in [−1, bound): −1 is padding),
                # then gathered: nothing of size (B, T, S, d̄/2) is built (2 GiB at 4,096 tokens and T = 256)
                bound = self.row_position_bound
                table = sandwich_bias(torch.arange(-bound, bound + 1, device=rows.device), self.dim, self.num_heads)
                return table[:, rows + bound].transpose(0, 1)

            return self.shared(("sandwich-rows", tgt_len, src_len, query_offset), per_row)

        def bias():
            # T + S − 1 distinct distances, viewed as (H, T, S) (a Toeplitz view, as T5's)
            low = -(query_offset + tgt_len - 1)
            distance = torch.arange(low, src_len - query_offset, device=self.anchor.device)
            return sandwich_bias(distance, self.dim, self.num_heads).unfold(1, src_len, 1).flip(1)

        # the same bias serves every layer of a pass
        return self.shared(("sandwich", tgt_len, src_len, query_offset), bias)
