"""Relative position vectors in keys and values: Shaw, NEZHA and learnable-frequency RPEs.

Shaw et al. (2018), Eq. 3–4, with r = clip(j − i, −K, K):

    e_ij = (x_i W^Q)·(x_j W^K + a^K_r) / √d      (logit term  q_i·a^K_r)
    z_i  = Σ_j α_ij (x_j W^V + a^V_r)             (value term  Σ_j α_ij a^V_r)

* ``learned`` (Shaw et al.): a^K_r, a^V_r are free vectors, one per clipped distance, so
  forward and backward distances have separate entries (asymmetric).
* ``sinusoidal`` (NEZHA, Wei et al. 2019): a^K_r = a^V_r = P(r), the fixed sinusoid of the
  signed distance in the per-head dimension d (P as in :mod:`.sinusoidal`).
* ``learnable-sinusoidal`` (Wang et al. 2021): the same with trainable frequencies.

The sinusoidal vectors are multiplied by a scale S (:mod:`.sinusoid_scale`,
``--pe-relative-sinusoid-scale``; default 1): a^K_r = a^V_r = S·P(r).

As in Wang et al., one set of vectors is shared by all heads and layers; the options
``--pe-relative-untie-layers`` (one set per layer) and ``--pe-relative-untie-heads`` (one per
head; learned and learnable-sinusoidal only) untie them.  ``--pe-relative-max-distance K``
(default 64) sets the clipping, which also makes the encodings work at any length.

Efficiency: nothing of size T × S × d is built.  The logit term is q·a^K over the 2K+1
distinct distances, gathered to (T × S); the value term sums the attention probabilities
per distance (a scatter-add to T × (2K+1)) before multiplying by a^V.
"""

from typing import Tuple

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, option, register_position_encoding, relative_distances
from .pass_state import DistanceIndexKey, FoldedKey, RelativeRows, VectorsKey, as_rows
from .sinusoid_scale import ScaledSinusoids, scale_of
from .sinusoidal import sinusoid, transformer_frequencies

DEFAULT_MAX_DISTANCE = 64


class _RelativeVectors(RelativePositionEncoding):
    """Shared machinery; subclasses define :meth:`vectors`."""

    untiable = ("layers", "heads")
    query_terms = True

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.max_distance = option(args, "pe_relative_max_distance", DEFAULT_MAX_DISTANCE)
        if self.max_distance < 1:
            raise UserError(f"--pe-relative-max-distance must be at least 1, got {self.max_distance}")
        self.untie_layers = bool(getattr(args, "pe_relative_untie_layers", False))
        self.untie_heads = bool(getattr(args, "pe_relative_untie_heads", False))
        self.num_tables = num_blocks if self.untie_layers else 1
        self.num_distances = 2 * self.max_distance + 1

    def table(self, block: int) -> int:
        return block - 1 if self.untie_layers else 0

    def vectors(self, block: int, rows: RelativeRows = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(a^K, a^V) of distances −K..K: each (2K+1, d), or (H, 2K+1, d) when untied per head."""
        raise NotImplementedError

    def distance_index(self, tgt_len, src_len, query_offset, device, rows: RelativeRows = None) -> torch.Tensor:
        """(T × S) index into the 2K+1 vectors: clip(j − i, −K, K) + K (shared by the layers of a pass); (B, 1, T, S)
        from the rows' own positions when they have them (randomised positions)."""
        rows = as_rows(rows)

        def compute():
            own = rows.distances(tgt_len, src_len, query_offset)
            dist = relative_distances(tgt_len, src_len, query_offset, device) if own is None else own.unsqueeze(1)
            return dist.to(device).clamp(-self.max_distance, self.max_distance) + self.max_distance

        return rows.shared(DistanceIndexKey(tgt_len, src_len, query_offset), compute)

    def folded_vectors(self, src_len, query_offset, block, rows: RelativeRows = None):
        """For one query at index ``query_offset``: (a^K, a^V) of its distance to every key, (S, d), or (H, S, d)
        per head, or (B, ·, S, d) for rows with positions of their own, to be added to the keys and values
        (q·(k_j + a^K_{j−i}) is q·k_j + the logit term, Σ_j α_ij (v_j + a^V_{j−i}) the output plus the value term).
        Once per decoding step (when the vectors do not learn)."""
        rows = as_rows(rows)

        def compute():
            a_key, a_value = self.vectors(block, rows)
            index = self.distance_index(1, src_len, query_offset, a_key.device, rows)  # (1, S) or (B, 1, 1, S)
            index = index.reshape(-1, src_len) if index.dim() == 4 else index.view(src_len)
            if a_key.dim() == 3:  # per head: (H, 2K+1, d) -> (H, S, d), or (B, H, S, d) per row
                return tuple(v[:, index].movedim(0, 1) if index.dim() == 2 else v[:, index] for v in (a_key, a_value))
            return tuple(v[index].unsqueeze(-3) if index.dim() == 2 else v[index] for v in (a_key, a_value))

        return rows.shared(FoldedKey(src_len, query_offset, self.table(block)), compute)

    def logit_terms(self, q, tgt_len, src_len, query_offset, block, rows=None):
        rows = as_rows(rows)
        a_key, _ = self.vectors(block, rows)
        bsz = q.size(0) // self.num_heads
        q = q.view(bsz, self.num_heads, tgt_len, self.head_dim)
        # q·a^K for every distinct distance: (B, H, T, 2K+1)
        per_distance = torch.matmul(q, a_key.to(q.dtype).transpose(-1, -2))
        index = self.distance_index(tgt_len, src_len, query_offset, q.device, rows)
        return per_distance.gather(-1, index.expand(bsz, self.num_heads, tgt_len, src_len))

    def value_terms(self, probs, tgt_len, src_len, query_offset, block, rows=None):
        rows = as_rows(rows)
        _, a_value = self.vectors(block, rows)
        bsz = probs.size(0) // self.num_heads
        probs = probs.view(bsz, self.num_heads, tgt_len, src_len)
        index = self.distance_index(tgt_len, src_len, query_offset, probs.device, rows)
        # Σ_{j: r(i,j)=r} α_ij for each distance r, then times a^V_r
        per_distance = probs.new_zeros(bsz, self.num_heads, tgt_len, self.num_distances)
        per_distance.scatter_add_(-1, index.expand(bsz, self.num_heads, tgt_len, src_len), probs)
        out = torch.matmul(per_distance, a_value.to(probs.dtype))
        return out.reshape(bsz * self.num_heads, tgt_len, self.head_dim)

    def score_mod(self, tgt_len, src_len, query_offset, block, rows=None, q=None):
        """The key term q_i·a^K_{r(i, j)} as FlexAttention's score_mod (:mod:`fairseq_pe.models.flex`), for the
        queries ``q`` (B, H, T', d) as :meth:`logit_terms` takes them (scaled), T' ≤ ``tgt_len`` (padded with 0 to
        it): a per-distance logit table (B, H, T, 2K + 1) = q·a^K, read at clip(kv − q − offset, −K, K) + K (the
        rows' own positions where they have them).  Key terms only: the value term Σ_j α_ij a^V_r needs the
        probabilities, so FlexAttention does not run these encodings
        (:func:`~fairseq_pe.models.flex.flex_supported`); this is their logit term's in-kernel form."""
        if q is None:
            return None
        rows = as_rows(rows)
        a_key, _ = self.vectors(block, rows)
        q = nn.functional.pad(q, (0, 0, 0, tgt_len - q.size(2)))
        per_distance = torch.matmul(q, a_key.to(q.dtype).transpose(-1, -2))  # (B, H, T, 2K + 1)
        most = self.max_distance
        if rows.positions is None:
            offset = torch.full((), query_offset, dtype=torch.long, device=q.device)

            def shaw_indices(score, b, h, q_idx, kv_idx):
                return score + per_distance[b, h, q_idx, (kv_idx - q_idx - offset).clamp(-most, most) + most]

            return shaw_indices
        positions = rows.positions.to(q.device)
        keys = nn.functional.pad(positions[:, :src_len], (0, max(0, src_len - positions.size(1))))
        queries = positions[:, query_offset:query_offset + tgt_len]
        queries = nn.functional.pad(queries, (0, tgt_len - queries.size(1)))

        def shaw_positions(score, b, h, q_idx, kv_idx):
            return score + per_distance[b, h, q_idx, (keys[b, kv_idx] - queries[b, q_idx]).clamp(-most, most) + most]

        return shaw_positions


@register_position_encoding("relative", "learned")
class ShawRelativePositionEncoding(_RelativeVectors):
    """Shaw et al. 2018: learnable a^K_r and a^V_r for r = −K..K (module docstring)."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        heads = (num_heads,) if self.untie_heads else ()
        shape = (self.num_tables,) + heads + (self.num_distances, self.head_dim)
        self.key_vectors = nn.Parameter(torch.empty(shape))
        self.value_vectors = nn.Parameter(torch.empty(shape))
        for p in (self.key_vectors, self.value_vectors):
            nn.init.normal_(p, mean=0.0, std=self.head_dim ** -0.5)

    def vectors(self, block, rows=None):
        t = self.table(block)
        return self.key_vectors[t], self.value_vectors[t]


class _SinusoidalRelative(ScaledSinusoids, Float32State, _RelativeVectors):
    """Vectors computed in float32 from float32 frequencies, whatever the model's dtype, times the scale S
    of ``--pe-relative-sinusoid-scale`` (``-learnable``)."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.init_scale(*scale_of(args, "relative"))

    def frequencies(self, block) -> torch.Tensor:
        raise NotImplementedError

    def vectors(self, block, rows=None):
        def compute():
            omega = self.frequencies(block)
            distances = torch.arange(-self.max_distance, self.max_distance + 1, device=omega.device)
            if omega.dim() == 2:  # per head: (H, d/2) -> (H, 2K+1, d)
                table = torch.stack([sinusoid(distances, w, self.head_dim) for w in omega])
            else:
                table = sinusoid(distances, omega, self.head_dim)
            return self.scaled(table)

        table = as_rows(rows).shared(VectorsKey(self.table(block)), compute)  # once per pass when nothing learns
        return table, table


@register_position_encoding("relative", "sinusoidal")
class NezhaRelativePositionEncoding(_SinusoidalRelative):
    """NEZHA (Wei et al. 2019): a^K_r = a^V_r = fixed sinusoid of r, ω_i = 10000^(-2i/d)."""

    untiable = ()  # fixed vectors: nothing to untie

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.register_buffer("omega", transformer_frequencies(self.head_dim), persistent=False)

    def frequencies(self, block):
        return self.omega


@register_position_encoding("relative", "learnable-sinusoidal")
class LearnableSinusoidalRelativePositionEncoding(_SinusoidalRelative):
    """Wang et al. 2021: a^K_r = a^V_r = sinusoid of r with trainable frequencies (init 10000^(-2i/d))."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        heads = (num_heads,) if self.untie_heads else ()
        init = transformer_frequencies(self.head_dim)
        self.omega = nn.Parameter(init.expand((self.num_tables,) + heads + init.shape).clone())

    def frequencies(self, block):
        return self.omega[self.table(block)]
