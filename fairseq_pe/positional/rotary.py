"""Rotary position embedding, RoPE (Su et al. 2021, RoFormer Eq. 34), and its context extension at inference.

Queries and keys of each head are rotated pairwise by angles proportional to their index:
q_m ↦ R(m)q_m, k_n ↦ R(n)k_n with R(m) = diag of 2×2 rotations by m·θ_i, θ_i = 10000^(−2i/d),
so that ⟨R(m)q, R(n)k⟩ depends on m − n only.  The rotation is done by the
``rotary-embedding-torch`` library, in float32 from float32 frequencies also in an fp16/bf16
model (the library's frequencies and cache are kept float32, :class:`~.base.Float32State`).  Cached keys are
stored rotated, so step-by-step decoding rotates only the new query and key.  No parameters,
no length limit.

Context extension (``--pe-rope-scaling``, factor s = ``--pe-rope-scaling-factor``), usable on a trained
checkpoint at generation time (``--model-overrides "{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}"``):

* ``linear``: Position Interpolation (Chen et al. 2023), R(m/s): positions are divided by s;
* ``ntk``: NTK-aware scaling (bloc97 2023): the base 10000 becomes 10000·s^(d/(d−2)), which stretches the
  low frequencies by about s and leaves the highest one unchanged.

The frequencies are a function of these options only.  The library keeps them as a (frozen) parameter,
so checkpoints hold a copy; loading ignores it and keeps the model's own (:meth:`_load_from_state_dict`),
so that a scaling given at load time is not overwritten by the unscaled copy.
"""

from rotary_embedding_torch import RotaryEmbedding

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, register_position_encoding

SCALINGS = ("none", "linear", "ntk")


def rope_scaling(args):
    """(kind, factor) from the model's options; ("none", 1) without them."""
    kind = getattr(args, "pe_rope_scaling", None) or "none"
    factor = getattr(args, "pe_rope_scaling_factor", None)
    if kind not in SCALINGS:
        raise UserError(f"--pe-rope-scaling {kind!r}: choose one of {', '.join(SCALINGS)}")
    if kind == "none":
        if factor is not None:
            raise UserError("--pe-rope-scaling-factor needs --pe-rope-scaling linear or ntk; remove it or add one")
        return kind, 1.0
    if factor is None or not factor >= 1:
        raise UserError(f"--pe-rope-scaling {kind} needs --pe-rope-scaling-factor of at least 1 (the ratio of the "
                        f"length to reach to the training length), got {factor}")
    return kind, float(factor)


@register_position_encoding("relative", "rope")
class RotaryPositionEncoding(Float32State, RelativePositionEncoding):
    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        if self.head_dim % 2:
            raise ValueError(f"--pe-relative rope needs an even head dimension, got {self.head_dim}")
        self.scaling, self.factor = rope_scaling(args)
        self.rotary = RotaryEmbedding(dim=self.head_dim,
                                      interpolate_factor=self.factor if self.scaling == "linear" else 1.0,
                                      theta_rescale_factor=self.factor if self.scaling == "ntk" else 1.0)

    def rotate(self, q, k, query_offset, block):
        # q, k: (..., T, d); new keys sit at the same indices as the queries
        rotated_q = self.rotary.rotate_queries_or_keys(q.float(), offset=query_offset).to(q.dtype)
        rotated_k = self.rotary.rotate_queries_or_keys(k.float(), offset=query_offset).to(k.dtype)
        return rotated_q, rotated_k

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        # the checkpoint's copy of the frequencies is replaced by this model's (its scaling may differ)
        key = prefix + "rotary.freqs"
        if key in state_dict:
            state_dict[key] = self.rotary.freqs.detach().clone()
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)
