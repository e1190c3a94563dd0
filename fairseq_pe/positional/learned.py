"""Fully learnable absolute position embeddings (Gehring et al. 2017; BERT; Wang et al. Table 1).

Position x of block n has its own free vector P^(n)_x ∈ R^D, for x < L_max, where L_max is
``--max-source-positions`` / ``--max-target-positions``.  With ``--pe-all-blocks`` every
block has a separate table (FLOATER paper §2: N·L_max·D parameters).  A position ≥ L_max
raises :class:`~fairseq_pe.positional.base.PositionOutOfRangeError` naming the flag; it is
never clamped or wrapped.
"""

import torch
import torch.nn as nn

from .base import AbsolutePositionEncoding, register_position_encoding


@register_position_encoding("absolute", "learned")
class LearnedPositionEncoding(AbsolutePositionEncoding):
    """One (L_max × D) table per block, initialised N(0, init_std²) (fairseq: D^-1/2)."""

    has_length_limit = True

    def __init__(self, embed_dim, num_blocks=1, max_positions=1024, init_std=None, **kwargs):
        super().__init__(embed_dim, num_blocks=num_blocks, max_positions=max_positions, **kwargs)
        if max_positions is None or max_positions <= 0:
            raise ValueError(f"--pe-absolute learned needs a positive {self.max_positions_flag}")
        tables = num_blocks if self.all_blocks else 1
        self.weight = nn.Parameter(torch.empty(tables, max_positions, embed_dim))
        nn.init.normal_(self.weight, mean=0.0, std=embed_dim ** -0.5 if init_std is None else init_std)

    def forward(self, length: int, block: int = 1) -> torch.Tensor:
        self.check_range(length - 1)
        return self.weight[block - 1 if self.all_blocks else 0, :length]
