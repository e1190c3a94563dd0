"""Sandwich (Chi et al. 2023, "Dissecting Transformer Length Extrapolation via the Lens of Receptive
Field Analysis", ACL 2023, arXiv 2212.10356, §5): a parameter-free logit bias from the dot product of two
sinusoidal position vectors, scaled per head,

    logits_ij += (p_i · p_j − d̄/2) / (8h/H) = (Σ_{k=1}^{d̄/2} cos((i − j)·ω_k) − d̄/2) · H/(8h),

ω_k = 10000^(−2k/d̄), head h = 1..H.  p_i · p_i = d̄/2, so the bias is 0 at distance 0 and negative
elsewhere; it decays with the distance like a log (the paper's reading: a temporal bias that Sandwich
shares with KERPLE and ALiBi), and flattens around −d̄/2·H/(8h) far away.

Choices follow NVIDIA NeMo's ``SandwichRelativePositionEmbedding`` (docs/encodings.md says why and what
fairseq-pe 0.1 computed): d̄ = one head's dimension (``--pe-sandwich-dim head``), k = 1 .. d̄/2
(``--pe-sandwich-first-frequency 1``), the factor H/(8h).  E = 512, H = 8: −0.62 for head 1 at distance 1,
−23.9 at 1,023 (tests/test_sandwich.py).

Symmetric in the encoder (cos is even); in the decoder the causal mask leaves j ≤ i, the paper's
causal form.  No parameters, no length limit.
"""

import torch

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, compute_dtype, option, register_position_encoding
from .pass_state import BiasKey, as_rows


def sandwich_bias(distance: torch.Tensor, dim: int, num_heads: int, first_frequency: int = 1,
                  dtype=torch.float32) -> torch.Tensor:
    """(H, *distance.shape) biases for the signed distances ``distance`` (computed in float64, returned in
    ``dtype``): the sum of cosines over k = ``first_frequency`` .. ``first_frequency`` + d̄/2 − 1."""
    k = torch.arange(first_frequency, first_frequency + dim // 2, dtype=torch.float64, device=distance.device)
    omega = 10000.0 ** (-2 * k / dim)
    dots = torch.cos(distance.double().unsqueeze(-1) * omega).sum(-1) - dim / 2  # p_i·p_j − d̄/2
    heads = torch.arange(1, num_heads + 1, dtype=torch.float64, device=distance.device)
    scale = (num_heads / (8.0 * heads)).view(-1, *([1] * distance.dim()))
    return (dots.unsqueeze(0) * scale).to(dtype)


@register_position_encoding("relative", "sandwich")
class SandwichPositionBias(Float32State, RelativePositionEncoding):
    """(p_i·p_j − d̄/2)·H/(8h) added to the attention logits (module docstring)."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        dim = option(args, "pe_sandwich_dim", "head")
        self.dim = {"head": embed_dim // num_heads, "model": embed_dim}.get(dim, dim)
        if not isinstance(self.dim, int) or self.dim < 2 or self.dim % 2:
            given = f"'{dim}', {self.dim}" if dim in ("head", "model") else repr(dim)
            raise UserError(f"--pe-sandwich-dim must be an even number of at least 2 (the sinusoids' dimension), "
                            f"got {given}")
        self.first_frequency = option(args, "pe_sandwich_first_frequency", 1)
        if self.first_frequency not in (0, 1):
            raise UserError(f"--pe-sandwich-first-frequency must be 0 or 1, got {self.first_frequency}")
        self.register_buffer("anchor", torch.zeros(0), persistent=False)  # follows the model's device

    toeplitz = True

    @property
    def dtype(self) -> torch.dtype:
        """The bias's dtype: float32, float64 in a float64 model (the anchor follows the model's conversions)."""
        return compute_dtype(self.anchor.dtype)

    def bias_of_distances(self, distances, block):
        return sandwich_bias(distances, self.dim, self.num_heads, self.first_frequency, self.dtype)

    def position_bias(self, tgt_len, src_len, query_offset, block, rows=None):
        view = as_rows(rows)
        rows = view.distances(tgt_len, src_len, query_offset)
        if rows is not None:  # the rows' own positions (randomised): (B, H, T, S)
            def per_row():
                # the bias of each of the 2·bound + 1 possible distances (positions in [−1, bound): −1 is padding),
                # then gathered: nothing of size (B, T, S, d̄/2) is built (2 GiB at 4,096 tokens and T = 256)
                bound = view.bound
                table = sandwich_bias(torch.arange(-bound, bound + 1, device=rows.device), self.dim, self.num_heads,
                                      self.first_frequency, self.dtype)
                return table[:, rows + bound].transpose(0, 1)

            return view.shared(BiasKey(tgt_len, src_len, query_offset, 0, True), per_row)

        def bias():  # T + S − 1 distinct distances, viewed as (H, T, S) (a Toeplitz view, as T5's)
            return self.toeplitz_bias(tgt_len, src_len, query_offset, block, view)

        # the same bias serves every layer of a pass
        return view.shared(BiasKey(tgt_len, src_len, query_offset, 0, False), bias)
