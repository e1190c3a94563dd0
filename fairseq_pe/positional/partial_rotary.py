"""p-RoPE (Barbero et al. 2025, "Round and Round We Go! What makes Rotary Positional Encodings useful?", ICLR 2025,
§6 and its ``apply_p_rope``): RoPE on the highest-frequency share p of the pairs of dimensions only,

    R = floor(p·d/2) pairs rotate with RoPE's own θ_i = 10000^(−2i/d), i < R (the exponent over the whole d);
    the other d/2 − R pairs, the lowest frequencies, get θ_i = 0: they are not rotated (NoPE channels),

so p = 1 is RoPE and p = 0 no position information.  It is not GPT-NeoX's ``rotary_pct`` (Hugging Face's default
``partial_rotary_factor``), which spreads the whole spectrum 10000^(−2i/(p·d)) over fewer dimensions and keeps the
lowest frequencies.  R is computed as the paper's pseudocode and Gemma's ``apply_rope(rope_proportion=p)``
(github.com/google-deepmind/gemma @ 7691fd4, ``gemma/gm/math/_positional_embeddings.py``) compute it,
``int(p * d // 2)``.  The pairs are rotary-embedding-torch's (dimensions 2i, 2i + 1; Gemma pairs i with i + d/2):
a fixed permutation of a head's dimensions, which the projections absorb.

``--pe-rope-proportion P`` (default 0.75: the paper trains p = 0.25 and 0.75; Gemma's default argument is 1, RoPE).
The RoPE options apply as to RoPE: ``--pe-rope-scaling`` (PI divides the positions, as Gemma's ``scale_factor``) and
``--pe-rope-resonance``, each on the rotated pairs; the unrotated ones stay unrotated.  Everything else is
:class:`~.rotary.RotaryPositionEncoding`'s: float32 rotations, cached keys stored rotated (step-by-step decoding
rotates the new position only), encoder and decoder self-attention, no parameters, no length limit.
"""

import math

from fairseq_pe.errors import UserError

from .base import option, register_position_encoding
from .rotary import RotaryPositionEncoding, _number

#: the share of pairs that rotate when --pe-rope-proportion is not given
DEFAULT_PROPORTION = 0.75


def rotated_pair_count(proportion: float, head_dim: int) -> int:
    """floor(p·d/2), as the paper's ``apply_p_rope`` and Gemma's ``apply_rope`` compute it."""
    return int(proportion * head_dim // 2)


@register_position_encoding("relative", "p-rope")
class PartialRotaryPositionEncoding(RotaryPositionEncoding):
    """p-RoPE: RoPE whose d/2 − floor(p·d/2) lowest-frequency pairs do not rotate (module docstring)."""

    def rotated_pairs(self, args) -> int:
        proportion = _number(option(args, "pe_rope_proportion", DEFAULT_PROPORTION), "--pe-rope-proportion", float)
        if not math.isfinite(proportion) or not 0 <= proportion <= 1:
            raise UserError(f"--pe-rope-proportion must be a number from 0 (no pair rotates) to 1 (RoPE), got "
                            f"{proportion!r}")
        self.proportion = float(proportion)
        return rotated_pair_count(self.proportion, self.head_dim)
