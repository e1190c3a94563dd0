"""CoPE, contextual position encoding (Golovneva et al. 2024, "Contextual Position Encoding: Learning to Count
What's Important", arXiv 2405.18719), Eq. 3-5: positions counted by gates that the query sets on the keys, and a
logit term of the query with the embedding of each (fractional) position:

    g_ij  = σ(q_i·k_j/√d)                             (the attention's own scaled logit)
    p_ij  = Σ_{t=j..i} g_it                           (causal: decoder, language model; p_ii = g_ii)
    e_ij  = z_i[⌊p_ij⌋]·(1 − w) + z_i[⌈p_ij⌉]·w,      w = p_ij − ⌊p_ij⌋,  z_i[n] = q_i·E[:, n]
    logits_ij = (q_i·k_j + e_ij)/√d

as the reference computes it (``facebookresearch/RAM``, ``projects/cope/src/cope/context_position.py``,
``ContextPosSelfAttn``): gates from the same q·k as the logits, times the 0/1 mask (causal × padding) before the
sum, so hidden keys neither count nor get a position; the sum is a reverse cumulative sum over the keys, including
the query's own gate and the key's; E (d × npos) starts at zeros (CoPE adds exactly 0 at initialisation), one per
layer, shared by the layer's heads; ⌊p⌋ and ⌈p⌉ carry no gradient, w does.  Choices of the reference that are
flags: ``--pe-cope-npos`` (the table's positions; the reference's default ``block_size + 1``: here the side's
``--max-target-positions`` + 1, ``--max-source-positions`` + 1 in the encoder, since p reaches at most the number
of keys) and ``--pe-cope-nodiv`` (the reference's ``--cope-nodiv``: e added after the 1/√d instead of before, as
the DAPE repository's CoPE does).

Positions past the table: p is clamped at npos − 1, as the reference's ``positions.clamp(max=self.npos - 1)``:
every key whose contextual position exceeds npos − 1 (a query that sees more than npos − 1 keys with open gates)
reads the last embedding E[:, npos − 1].  This is the method's definition (a bounded table of learned position
embeddings), not a refusal: telling whether any p reached it would be a host sync at every layer.

Encoder (bidirectional, which the paper does not define): the reference's own encoder (``EncoderCore`` in
``projects/cope/src/models/transformer.py`` runs the same layer with the padding mask only), whose sum runs over
every visible key from j to the end of the sequence, p_ij = Σ_{t ≥ j} g_it: positions counted back from the
sequence's end whatever the query.  fairseq's left padding (hidden keys before the first real token) changes
nothing of it.  Step-by-step decoding recomputes p from the cached keys at every step, as the reference does (no
state is kept but the keys).  Cross-attention: relative encodings never reach it.
"""

import math

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .base import (Float32State, RelativePositionEncoding, compute_dtype, option, query_key_products,
                   register_position_encoding)


@register_position_encoding("relative", "cope")
class ContextualPositions(Float32State, RelativePositionEncoding):
    """Gated contextual positions and their interpolated embeddings in the logits (module docstring)."""

    own_logits = True
    already_untied = ("layers",)  # one table per layer, as the reference; shared by the heads, as the reference
    untiable = ()

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        longest = getattr(args, "max_target_positions" if causal else "max_source_positions", None)
        default = None if longest is None else int(longest) + 1
        self.npos = option(args, "pe_cope_npos", default)
        if self.npos is None or self.npos < 2:
            raise UserError(f"--pe-cope-npos must be at least 2 (positions 0 .. npos − 1), got {self.npos}")
        #: the positional term added after the 1/√d (the reference's --cope-nodiv) instead of before it
        self.nodiv = bool(getattr(args, "pe_cope_nodiv", False))
        self.pos_emb = nn.Parameter(torch.zeros(num_blocks, self.head_dim, self.npos))

    def attention_logits(self, q, k, query_offset, block, rows=None, state=None, masking=None):
        """(q·k + e)/√d in float32 (float64 in a float64 model) for the scaled queries ``q`` (B, H, T', d); the
        gates see the visible keys of ``masking`` only."""
        dtype = compute_dtype(q.dtype)
        scaled = query_key_products(q, k).to(dtype)  # q·k/√d: the gates' argument and the logits
        gates = torch.sigmoid(scaled)
        if masking is not None:
            gates = gates * (masking == 0)
        positions = gates.flip(-1).cumsum(-1).flip(-1).clamp(max=self.npos - 1)
        # z = q·E: with the scaled queries it is z/√d, the reference's default (e added before the division); p is at
        # most the number of keys S, so the rows past S are never read (the reference computes them all)
        table = self.pos_emb[block - 1][:, :min(self.npos, k.size(2) + 1)]
        fixed = torch.matmul(q.to(dtype), table)  # (B, H, T', min(npos, S + 1))
        if self.nodiv:
            fixed = fixed * math.sqrt(self.head_dim)
        # z[⌊p⌋]·(1 − w) + z[⌈p⌉]·w as z[⌊p⌋] + w·(z[⌊p⌋ + 1] − z[⌊p⌋]): equal where p is not whole, and where it
        # is (w = 0); the step past the last position is 0 (p ≤ npos − 1 and p ≤ S).  Seven kernels where the
        # reference's form takes eleven (a step of step-by-step decoding runs it in every layer)
        floor = positions.detach().long()  # p ≥ 0: truncation is the floor
        weight = positions - floor
        steps = fixed.diff(dim=-1, append=fixed[..., -1:])
        return scaled.add_(torch.addcmul(fixed.gather(-1, floor), steps.gather(-1, floor), weight))
