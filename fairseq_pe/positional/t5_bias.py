"""T5 relative attention bias (Raffel et al. 2020, §2.1): a learned scalar per distance bucket and head.

    logits_ij += b_h[bucket(j − i)]

Buckets: half of them for each direction in the encoder (bidirectional), all for the past in
the decoder; distances below half the buckets get their own bucket, larger ones share
logarithmically wider buckets up to ``--pe-t5-max-distance`` (128), beyond which they all
fall in the last bucket, so there is no length limit.  One table is shared by all layers
(as in T5) unless ``--pe-relative-untie-layers``.
"""

import math

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .base import Float32State, RelativePositionEncoding, option, register_position_encoding
from .pass_state import BiasKey, as_rows

DEFAULT_NUM_BUCKETS = 32
DEFAULT_MAX_DISTANCE = 128


def exact_buckets(num_buckets: int, bidirectional: bool) -> int:
    """How many buckets hold a single distance: half of one direction's buckets."""
    return (num_buckets // 2 if bidirectional else num_buckets) // 2


def t5_bucket(relative_position: torch.Tensor, bidirectional: bool, num_buckets: int, max_distance: int):
    """T5's bucket of each signed distance j − i (as in the reference implementation)."""
    buckets = torch.zeros_like(relative_position)
    if bidirectional:
        num_buckets //= 2
        buckets += (relative_position > 0).long() * num_buckets
        n = relative_position.abs()
    else:
        n = (-relative_position).clamp(min=0)
    max_exact = num_buckets // 2
    is_small = n < max_exact
    large = max_exact + (
        torch.log(n.float().clamp(min=1) / max_exact) / math.log(max_distance / max_exact) * (num_buckets - max_exact)
    ).long()
    large = large.clamp(max=num_buckets - 1)
    return buckets + torch.where(is_small, n, large)


@register_position_encoding("relative", "t5")
class T5PositionBias(Float32State, RelativePositionEncoding):
    """Learned bucketed scalar bias per head (module docstring); the table stays float32 in an fp16/bf16 model, as
    every position parameter here (a bias beyond fp16's range would otherwise be stored as −inf)."""

    untiable = ("layers",)  # per head already

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.num_buckets = option(args, "pe_t5_num_buckets", DEFAULT_NUM_BUCKETS)
        self.max_distance = option(args, "pe_t5_max_distance", DEFAULT_MAX_DISTANCE)
        if self.num_buckets < 4 or self.num_buckets % 2:
            raise UserError(f"--pe-t5-num-buckets must be an even number of at least 4, got {self.num_buckets}")
        exact = exact_buckets(self.num_buckets, bidirectional=not causal)
        if self.max_distance <= exact:
            side = "decoder (--pe-t5-num-buckets / 2)" if causal else "encoder (--pe-t5-num-buckets / 4)"
            raise UserError(f"--pe-t5-max-distance must be greater than {exact}, the number of exact (one-distance) "
                            f"buckets of the {side}, got {self.max_distance}: the logarithmic buckets start there "
                            f"(allowed: {exact + 1} or more)")
        self.untie_layers = bool(getattr(args, "pe_relative_untie_layers", False))
        tables = num_blocks if self.untie_layers else 1
        self.bias = nn.Parameter(torch.empty(tables, self.num_buckets, num_heads))
        nn.init.normal_(self.bias, mean=0.0, std=embed_dim ** -0.5)

    @property
    def bias_requires_grad(self) -> bool:
        return self.bias.requires_grad

    def bias_key(self, block):
        return block if self.untie_layers else 0

    def position_bias(self, tgt_len, src_len, query_offset, block, rows=None):
        """(H, T, S) biases b_h[bucket(j − i)].  They depend on j − i only: the T + S − 1 distances are
        bucketed and looked up once, and the (T, S) matrix is a view of their windows (Toeplitz)."""
        rows = as_rows(rows)
        return rows.shared(BiasKey(tgt_len, src_len, query_offset, self.bias_key(block), rows.positions is not None),
                           lambda: self._bias(tgt_len, src_len, query_offset, block, rows))

    toeplitz = True

    def bias_of_distances(self, distances, block):
        table = self.bias[block - 1 if self.untie_layers else 0].t()  # (H, buckets)
        return table[:, t5_bucket(distances, not self.causal, self.num_buckets, self.max_distance)]

    def _bias(self, tgt_len, src_len, query_offset, block, rows):
        distances = rows.distances(tgt_len, src_len, query_offset)
        if distances is not None:  # the rows' own positions (randomised): (B, H, T, S)
            return self.bias_of_distances(distances, block).transpose(0, 1)
        return self.toeplitz_bias(tgt_len, src_len, query_offset, block, rows)
