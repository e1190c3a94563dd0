"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer Eq. 34).

Queries and keys of each head are rotated pairwise by angles proportional to their index:
q_m ↦ R(m)q_m, k_n ↦ R(n)k_n with R(m) = diag of 2×2 rotations by m·θ_i, θ_i = 10000^(−2i/d),
so that ⟨R(m)q, R(n)k⟩ depends on m − n only.  The rotation is done by the
``rotary-embedding-torch`` library, in float32 from float32 frequencies also in an fp16/bf16
model (the library's frequencies and cache are kept float32, :class:`~.base.Float32State`).  Cached keys are
stored rotated, so step-by-step decoding rotates only the new query and key.  No parameters,
no length limit.
"""

from rotary_embedding_torch import RotaryEmbedding

from .base import Float32State, RelativePositionEncoding, register_position_encoding


@register_position_encoding("relative", "rope")
class RotaryPositionEncoding(Float32State, RelativePositionEncoding):
    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        if self.head_dim % 2:
            raise ValueError(f"--pe-relative rope needs an even head dimension, got {self.head_dim}")
        self.rotary = RotaryEmbedding(dim=self.head_dim)

    def rotate(self, q, k, query_offset, block):
        # q, k: (..., T, d); new keys sit at the same indices as the queries
        rotated_q = self.rotary.rotate_queries_or_keys(q.float(), offset=query_offset).to(q.dtype)
        rotated_k = self.rotary.rotate_queries_or_keys(k.float(), offset=query_offset).to(k.dtype)
        return rotated_q, rotated_k
