"""The module that feeds position information to a fairseq encoder or decoder.

:class:`PositionInjector` is installed as fairseq's ``embed_positions`` hook: the encoder's
``forward_embedding`` and the decoder's ``extract_features`` call it with the token batch
(and the incremental state while decoding step by step).  It computes the positions of the
batch once, returns the input block's absolute vectors, and keeps the positions so that
every later block (``--pe-all-blocks``) is served from the same computation by
:meth:`add_block_vectors`.  It also owns the side's relative encoding, which the
self-attention of every block uses (one module, shared by the layers).
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from .base import AbsolutePositionEncoding, RelativePositionEncoding

#: what ``max_positions`` reports for encodings that work at any length (fairseq needs an int)
UNLIMITED_POSITIONS = 1 << 40


def token_positions(tokens: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """0-based positions of the non-padding tokens of each row, -1 at padding.

    Left padding is skipped, so the first real token of every row is at position 0.
    """
    mask = tokens.ne(padding_idx)
    return torch.cumsum(mask, dim=1) * mask - 1


class PositionInjector(nn.Module):
    def __init__(self, absolute: Optional[AbsolutePositionEncoding], padding_idx: int,
                 relative: Optional[RelativePositionEncoding] = None):
        super().__init__()
        self.absolute = absolute
        self.relative = relative  # used by the self-attention of every block
        self.padding_idx = padding_idx
        # follows the model's dtype (.half(), .bfloat16()) so returned zeros/vectors match it
        self.register_buffer("_dtype_probe", torch.zeros(0), persistent=False)
        self.positions: Optional[torch.Tensor] = None  # (B, T) of the current forward pass
        self.length = 0  # 1 + the largest position of the current forward pass

    @property
    def max_positions(self) -> int:
        if self.absolute is not None and self.absolute.max_positions is not None:
            return self.absolute.max_positions
        return UNLIMITED_POSITIONS

    @property
    def all_blocks(self) -> bool:
        return self.absolute is not None and self.absolute.all_blocks

    def forward(self, tokens: torch.Tensor, incremental_state=None) -> torch.Tensor:
        """Absolute vectors of the input block, (B, T, D); (B, T, 1) zeros without one.

        With ``incremental_state`` only the last time step is returned.
        """
        positions = token_positions(tokens, self.padding_idx)
        self.length = max(int(positions.max()) + 1, 1) if positions.numel() else 1
        if incremental_state is not None:
            positions = positions[:, -1:]
        self.positions = positions
        if self.absolute is None:
            return positions.new_zeros(positions.shape + (1,), dtype=self._dtype_probe.dtype)
        return self.vectors(block=1)

    def vectors(self, block: int) -> torch.Tensor:
        """Block ``block``'s absolute vectors for the current positions, (B, T, D), 0 at padding."""
        table = self.absolute(self.length, block).to(self._dtype_probe.dtype)
        real = self.positions.ge(0)
        return F.embedding(self.positions.clamp(min=0), table) * real.unsqueeze(-1).to(table.dtype)

    def add_block_vectors(self, x: torch.Tensor, block: int) -> torch.Tensor:
        """x (T, B, D) at the input of 1-based ``block`` plus its vectors when every block gets them.

        Block 1 received its vectors at the embedding layer already.
        """
        if block == 1 or not self.all_blocks:
            return x
        return x + self.vectors(block).transpose(0, 1)
