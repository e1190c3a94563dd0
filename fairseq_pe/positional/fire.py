"""FIRE (Li et al. 2023, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"), Eq. 3-4: a logit bias per head from a small network of the distance, normalised by the
query's position (progressive interpolation), with a log transform:

    logits_ij += f_θ( ψ(i − j) / ψ(max(i, L)) ),   ψ(x) = log(c·x + 1),

f_θ: R → R^H an MLP with one hidden layer of 32 ReLU units (its output h is head h's bias), c > 0 and the
threshold L learned (as the paper: c starts at 0.1; L = |λ|·L₀, λ learned from 1, L₀ = 512 by
``--pe-fire-threshold``).  Below the threshold the bias depends on i − j only (normaliser ψ(L)); past it,
distances are interpolated into [0, 1] by the query's position, so that a longer input shows f the same
range it was trained on.  The small ε = 1e-6 of the paper's code keeps the quotient finite.

DAPE's FIRE (Zheng et al. 2024, the FIRE under DAPE's network, their Eq. 4): LeakyReLU units of slope 0.01
(``--pe-fire-activation leaky-relu``) and L₀ = 64, as the DAPE reference (``chuanyang-Zheng/DAPE`` @ bde344a:
``DAPE.py``'s ``FIRE_DAPE``, and ``megatron/model/positional_embeddings.py``'s ``FIRE_C`` with the released config
``configs/125M/512/125M_fire_c.yml``: L₀ = noise_seq_length // 2 = 64); the catalogue's ``fire-dape``.

Positions are the tokens' own (0 for a row's first real token), not their indices: with fairseq's
left-padded source the normaliser of a padded row would otherwise start late (the injector hands the
rows' positions over, ``rows.positions``, as it does for randomised positions).

Evaluation.  f is a (Leaky)ReLU network of one scalar with one hidden layer, so it is piecewise linear in its input
x, with at most 33 pieces, cut where a hidden unit switches (x = −b₁ₖ/w₁ₖ): on each piece f(x) = A·x + B, with A and
B the sums of g·w₂·w₁ and g·w₂·b₁ over the units, g = 1 for the units on there and the negative slope (0 for ReLU)
for the others.  The bias of every (query, key) pair is computed
that way (:meth:`FirePositionBias.network_at`, but for a few hundred pairs, such as one step of step-by-step
decoding): the quotient x of each pair, its piece, then one multiply-add per head, instead of the 32 hidden units of
every pair: no (B, T, S, 32) tensor (512 MiB per layer at T = 1024 and
B = 4), the values of :meth:`FirePositionBias.network` to float rounding, and the same gradients (those of the
units on at x).  Nothing is read back to the host: the bias is computed per pair whatever the threshold.

Decoder (causal, the paper's form): j ≤ i, so i − j ≥ 0 and max(i, j, L) = max(i, L).  Encoder
(bidirectional, which the paper does not define): the signed quotient
sign(i − j)·ψ(|i − j|)/ψ(max(i, j, L)), in [−1, 1], so f tells left from right, and the normaliser
max(i, j, L) is the causal one whenever j ≤ i and symmetric in i and j.  One network per side, shared by
all layers (``--pe-relative-untie-layers``: one per layer).  No length limit.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, compute_dtype, option, register_position_encoding
from .pass_state import BiasKey, as_rows

HIDDEN = 32
C_INIT = 0.1
EPS = 1e-6
DEFAULT_THRESHOLD = 512
#: ``--pe-fire-activation``: the hidden units' slope below 0 (ReLU, the FIRE paper's; LeakyReLU, DAPE's FIRE)
NEGATIVE_SLOPES = {"relu": 0.0, "leaky-relu": 0.01}
#: the largest threshold L₀: it and log(c·L + 1) stay finite in float32 (the parameters' dtype)
MAX_THRESHOLD = 1e30
#: without autograd, biases of more elements than this are computed one head at a time (no (H, ...) temporaries)
HEADWISE_ELEMENTS = 1 << 22
#: inputs of at most this many hidden activations (elements × 32) go through the network itself (:meth:`network_at`)
DIRECT_ELEMENTS = 1 << 14


@register_position_encoding("relative", "fire")
class FirePositionBias(Float32State, RelativePositionEncoding):
    """f_θ(ψ(i − j)/ψ(max(i, L))) per head (module docstring)."""

    untiable = ("layers",)  # per head already: f has one output per head
    needs_positions = True  # the normaliser takes the query's position, not only i − j

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.threshold = float(option(args, "pe_fire_threshold", DEFAULT_THRESHOLD))
        if not 0 < self.threshold <= MAX_THRESHOLD:
            raise UserError(f"--pe-fire-threshold must be positive and at most {MAX_THRESHOLD:g} (L = |λ|·L₀ and the "
                            f"normaliser log(c·L + 1) are float32: an infinite one leaves the bias no position), got "
                            f"{self.threshold:g}")
        activation = option(args, "pe_fire_activation", "relu")
        if activation not in NEGATIVE_SLOPES:
            raise UserError(f"--pe-fire-activation must be one of {', '.join(NEGATIVE_SLOPES)}, got {activation}")
        self.negative_slope = NEGATIVE_SLOPES[activation]
        self.untie_layers = bool(getattr(args, "pe_relative_untie_layers", False))
        n = num_blocks if self.untie_layers else 1
        # nn.Linear(1, 32) and nn.Linear(32, H) per set, stacked (nn.Linear's own initialisation)
        layers = [(nn.Linear(1, HIDDEN), nn.Linear(HIDDEN, num_heads)) for _ in range(n)]
        self.w1 = nn.Parameter(torch.stack([a.weight[:, 0].detach() for a, _ in layers]))  # (n, 32)
        self.b1 = nn.Parameter(torch.stack([a.bias.detach() for a, _ in layers]))  # (n, 32)
        self.w2 = nn.Parameter(torch.stack([b.weight.t().detach() for _, b in layers]))  # (n, 32, H)
        self.b2 = nn.Parameter(torch.stack([b.bias.detach() for _, b in layers]))  # (n, H)
        self.c = nn.Parameter(torch.full((n,), C_INIT))
        self.threshold_scale = nn.Parameter(torch.ones(n))  # λ: L = |λ|·L₀

    @property
    def bias_requires_grad(self) -> bool:
        return any(p.requires_grad for p in self.parameters())

    def bias_key(self, block):
        return block - 1 if self.untie_layers else 0

    def activation(self, z: torch.Tensor) -> torch.Tensor:
        """The hidden units' ReLU, or LeakyReLU with ``--pe-fire-activation leaky-relu`` (module docstring)."""
        return torch.relu(z) if self.negative_slope == 0 else F.leaky_relu(z, self.negative_slope)

    def function_input(self, i: torch.Tensor, j: torch.Tensor, index: int) -> torch.Tensor:
        """The quotient fed to f for query positions ``i`` and key positions ``j`` (broadcastable)."""
        c = self.c[index].abs()
        threshold = self.threshold_scale[index].abs() * self.threshold
        dtype = compute_dtype(c.dtype)  # float32, float64 in a float64 model
        distance = (i - j).to(dtype)
        normaliser = torch.maximum(torch.maximum(i, j).to(dtype), threshold)
        return distance.sign() * torch.log1p(c * distance.abs()) / (torch.log1p(c * normaliser) + EPS)

    def index_function_input(self, tgt_len: int, src_len: int, query_offset: int, index: int) -> torch.Tensor:
        """:meth:`function_input` of query indices ``query_offset`` .. + T − 1 and key indices 0 .. S − 1, (T, S),
        from two vectors: sign(i − j)·ψ(|i − j|) of the T + S − 1 distances (a Toeplitz matrix) and 1/ψ(max(n, L))
        of the indices n, non-increasing in n, so that the normaliser of max(i, j) is the smaller of row i's and
        column j's.  Three passes over (T, S) instead of a dozen: the blocks path computes it per block of rows."""
        device = self.w1.device
        c = self.c[index].abs()
        threshold = self.threshold_scale[index].abs() * self.threshold
        low = -(query_offset + tgt_len - 1)  # the smallest j − i
        dtype = compute_dtype(c.dtype)  # float32, float64 in a float64 model
        distance = -torch.arange(low, src_len - query_offset, device=device, dtype=dtype)  # i − j, from the largest
        numerators = distance.sign() * torch.log1p(c * distance.abs())
        # window a starts at j − i = low + a: query T − 1 − a's row; flipped to row order
        numerators = numerators.unfold(0, src_len, 1).flip(0)
        indices = torch.arange(max(query_offset + tgt_len, src_len), device=device, dtype=dtype)
        inverse = 1.0 / (torch.log1p(c * torch.maximum(indices, threshold)) + EPS)
        rows = inverse[query_offset:query_offset + tgt_len].view(-1, 1)
        return numerators * torch.minimum(rows, inverse[:src_len].view(1, -1))

    def network(self, x: torch.Tensor, index: int) -> torch.Tensor:
        """f_θ of every element of ``x``: (..., H), written as the network it is (the reference of
        :meth:`network_at`)."""
        hidden = self.activation(x.unsqueeze(-1) * self.w1[index] + self.b1[index])
        return hidden @ self.w2[index] + self.b2[index]

    def pieces(self, index: int):
        """f_θ as a piecewise-linear function (module docstring): the sorted cuts (33 − 1,) between its pieces and
        the slope and intercept of each piece, (33, H) each (differentiable in θ)."""
        w1, b1, w2, b2 = self.w1[index], self.b1[index], self.w2[index], self.b2[index]
        # a unit switches at x = −b₁/w₁; x lies in [−1, 1], so cuts outside [−2, 2] (and units with w₁ = 0, which
        # never switch) can all sit at the ends
        switching = w1 != 0
        cuts = torch.where(switching, -b1 / torch.where(switching, w1, torch.ones_like(w1)), torch.full_like(b1, 2.0))
        cuts = cuts.detach().clamp(-2.0, 2.0).sort().values
        inside = torch.cat([cuts[:1] - 1, (cuts[1:] + cuts[:-1]) / 2, cuts[-1:] + 1])  # a point of every piece
        # (pieces, 32): each unit's slope in each piece, 1 where it is on, else the negative slope
        on = torch.where(inside.unsqueeze(1) * w1 + b1 > 0, 1.0, self.negative_slope).to(w1.dtype)
        return cuts, (on * w1) @ w2, (on * b1) @ w2 + b2

    def network_at(self, x: torch.Tensor, index: int, one_lookup: bool = False) -> torch.Tensor:
        """f_θ of every element of ``x``, head first: (H, *x.shape); the values of :meth:`network` to rounding.
        Few elements (a step of step-by-step decoding: one query row) go through the network itself, in fewer
        operations than finding the pieces.  ``one_lookup`` (evaluation, a block of rows): every head's slope and
        intercept in one embedding lookup of the piece, 2.5× faster than two gathers per head (64 × 4,096 pairs,
        4 heads: 5.8 ms against 14.7), at the price of a temporary twice the result's size."""
        if x.numel() * HIDDEN <= DIRECT_ELEMENTS:  # act(x·w₁ + b₁)·w₂ + b₂, head first: three kernels
            hidden = self.activation(torch.addcmul(self.b1[index], x.unsqueeze(-1), self.w1[index]))
            out = torch.addmm(self.b2[index].unsqueeze(1), self.w2[index].t(), hidden.reshape(-1, HIDDEN).t())
            return out.view((self.num_heads,) + x.shape)
        cuts, slopes, intercepts = self.pieces(index)
        piece = torch.searchsorted(cuts, x.detach().contiguous(), out_int32=True)
        if one_lookup and not torch.is_grad_enabled():
            looked_up = F.embedding(piece, torch.cat([slopes, intercepts], dim=1)).movedim(-1, 0)  # (2H, *x.shape)
            return torch.addcmul(looked_up[self.num_heads:], looked_up[:self.num_heads], x)
        slopes, intercepts = slopes.t(), intercepts.t()  # (H, pieces)
        if torch.is_grad_enabled() or x.numel() * self.num_heads <= HEADWISE_ELEMENTS:
            return torch.addcmul(intercepts[:, piece], slopes[:, piece], x)
        out = x.new_empty((self.num_heads,) + x.shape)  # large and without autograd: one head at a time
        for h in range(self.num_heads):
            torch.addcmul(intercepts[h][piece], slopes[h][piece], x, out=out[h])
        return out

    def position_bias(self, tgt_len, src_len, query_offset, block, rows=None):
        """(H, T, S) biases, or (B, H, T, S) when the rows have positions of their own (left padding, randomised
        positions; padding's −1 is masked)."""
        index = block - 1 if self.untie_layers else 0
        rows = as_rows(rows)
        positions = rows.positions

        def bias():
            device = self.w1.device
            if positions is None:
                return self.network_at(self.index_function_input(tgt_len, src_len, query_offset, index), index,
                                       one_lookup=rows.memo is None)  # a block of rows of the blocks path
            i = positions[:, query_offset:query_offset + tgt_len].to(device).unsqueeze(2)
            j = positions[:, :src_len].to(device).unsqueeze(1)
            return self.network_at(self.function_input(i, j, index), index).transpose(0, 1)

        # once per pass without a gradient to carry; in training a new graph for every layer (and block of rows)
        return rows.shared(BiasKey(tgt_len, src_len, query_offset, index, positions is not None), bias)

    def score_mod(self, tgt_len, src_len, query_offset, block, rows=None, q=None):
        """f_θ(x) computed inside FlexAttention's kernel (:mod:`fairseq_pe.models.flex`) for query rows 0 ..
        ``tgt_len`` − 1 and keys 0 .. ``src_len`` − 1: x from the query's and key's positions (the indices, or the
        rows' own, padded with 0 past them: the kernel's extra keys are masked), then the network with its 32 units
        unrolled: b₂[h] + Σ_k w₂[k, h]·act(w₁[k]·x + b₁[k]), reading θ, c and λ as captured tensors, so
        that FlexAttention's backward gives their gradients.  What :meth:`position_bias` computes, to rounding."""
        index = block - 1 if self.untie_layers else 0
        w1, b1, w2, b2 = self.w1[index], self.b1[index], self.w2[index], self.b2[index]
        c = self.c[index].abs()
        threshold = self.threshold_scale[index].abs() * self.threshold
        positions = as_rows(rows).positions
        slope = self.negative_slope  # a float: no module inside the kernel's function
        activation = torch.relu if slope == 0 else (lambda z: F.leaky_relu(z, slope))

        def network(score, h, i, j):
            distance = i - j
            normaliser = torch.maximum(torch.maximum(i, j), threshold)
            x = torch.sign(distance) * torch.log1p(c * distance.abs()) / (torch.log1p(c * normaliser) + EPS)
            out = score + b2[h]
            for k in range(HIDDEN):
                out = out + w2[k, h] * activation(w1[k] * x + b1[k])
            return out

        if positions is None:
            offset = torch.full((), float(query_offset), device=w1.device)  # a tensor: one kernel for any offset

            def fire_indices(score, b, h, q_idx, kv_idx):
                return network(score, h, q_idx.float() + offset, kv_idx.float())

            return fire_indices
        positions = positions.to(w1.device)
        keys = nn.functional.pad(positions[:, :src_len], (0, max(0, src_len - positions.size(1)))).float()
        queries = positions[:, query_offset:query_offset + tgt_len]
        queries = nn.functional.pad(queries, (0, tgt_len - queries.size(1))).float()

        def fire_positions(score, b, h, q_idx, kv_idx):
            return network(score, h, queries[b, q_idx], keys[b, kv_idx])

        return fire_positions
