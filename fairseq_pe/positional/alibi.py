"""ALiBi (Press et al. 2022, "Train Short, Test Long"): a linear distance penalty per head.

    logits_ij += −m_h · |j − i|

Symmetric (|j − i|) in the encoder; in the decoder the causal mask leaves j ≤ i, which is the
paper's causal form −m_h·(i − j).  Slopes m_h are the paper's geometric sequence: for n heads
a power of two, m_h = 2^(−8h/n), h = 1..n; otherwise those of the nearest smaller power of
two followed by every other slope of the next power of two.  No parameters, no length limit.
"""

import math
from typing import List

import torch

from .base import Float32State, RelativePositionEncoding, register_position_encoding
from .pass_state import BiasKey, as_rows


def alibi_slopes(num_heads: int) -> List[float]:
    def power_of_two(n):
        start = 2 ** (-(2 ** -(math.log2(n) - 3)))
        return [start * start ** i for i in range(n)]

    if math.log2(num_heads).is_integer():
        return power_of_two(num_heads)
    closest = 2 ** math.floor(math.log2(num_heads))
    return power_of_two(closest) + alibi_slopes(2 * closest)[0::2][: num_heads - closest]


@register_position_encoding("relative", "alibi")
class ALiBiPositionBias(Float32State, RelativePositionEncoding):
    """−m_h·|j − i| added to the attention logits (module docstring)."""

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        self.register_buffer("slopes", torch.tensor(alibi_slopes(num_heads)), persistent=False)

    toeplitz = True

    def bias_of_distances(self, distances, block):
        return -self.slopes.view((-1,) + (1,) * distances.dim()) * distances.abs().float()

    def position_bias(self, tgt_len, src_len, query_offset, block, rows=None):
        rows = as_rows(rows)
        distances = rows.distances(tgt_len, src_len, query_offset)
        if distances is not None:  # the rows' own positions (randomised): (B, H, T, S)
            return rows.shared(BiasKey(tgt_len, src_len, query_offset, 0, True),
                               lambda: self.bias_of_distances(distances, block).transpose(0, 1))
        # the same bias serves every layer of a pass
        return rows.shared(BiasKey(tgt_len, src_len, query_offset, 0, False),
                           lambda: self.toeplitz_bias(tgt_len, src_len, query_offset, block, rows))
