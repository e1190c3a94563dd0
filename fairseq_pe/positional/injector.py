"""The module that feeds position information to a fairseq encoder or decoder.

:class:`PositionInjector` is installed as fairseq's ``embed_positions`` hook: the encoder's
``forward_embedding`` and the decoder's ``extract_features`` call it with the token batch
(and the incremental state while decoding step by step).  It computes the positions of the
batch once, returns the input block's absolute vectors, and keeps the positions so that
every later block (``--pe-all-blocks``) is served from the same computation by
:meth:`block_vectors`.  It also owns the side's relative encoding, which the
self-attention of every block uses (one module, shared by the layers), and FLOATER's Q/K/V
bias initial values (:mod:`.floater_bias`), whose biases it serves to the projections of
every block (:meth:`attention_bias`).
"""

from typing import Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_pe.errors import UserError

from .base import AbsolutePositionEncoding, PassState, RelativePositionEncoding, refuse_data_parallel
from .random_positions import (sample_positions, spaced_position_bound, spaced_positions,
                               spaced_source_length_of_largest)

#: what ``max_positions`` reports for encodings that work at any length (fairseq needs an int)
UNLIMITED_POSITIONS = 1 << 40


class PositionLimit(int):
    """A side's longest sequence, an int as fairseq needs it, that says which option sets it (``why``): fairseq's
    refusal of a longer sentence, or its skipping of longer training pairs, can then name the option to change
    (:mod:`fairseq_pe.compat`)."""

    def __new__(cls, value: int, why: str):
        limit = super().__new__(cls, value)
        limit.why = why
        return limit

    def __reduce__(self):
        return PositionLimit, (int(self), self.why)


def token_positions(tokens: torch.Tensor, padding_idx: int) -> torch.Tensor:
    """0-based positions of the non-padding tokens of each row, -1 at padding.

    Left padding is skipped, so the first real token of every row is at position 0.
    """
    mask = tokens.ne(padding_idx)
    return torch.cumsum(mask, dim=1) * mask - 1


def lookup(positions: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` at ``positions`` (B, T) -> (B, T, D); zero vectors at padding (-1)."""
    real = positions.ge(0)
    return F.embedding(positions.clamp(min=0), table) * real.unsqueeze(-1).to(table.dtype)


def gather_plan(positions: torch.Tensor):
    """What :func:`lookup_time_major` needs, computed once per forward pass: the row of each
    token in time-major order, shifted by one so that padding (-1) picks a zero row.  (Whether every row has
    the same positions is not asked: the answer would be a host sync.)
    """
    return (positions + 1).t().reshape(-1), positions.shape


def lookup_time_major(plan, table: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` (L, E) at the planned positions, (T, B, E) as fairseq's attention
    inputs; zero at padding.  An embedding lookup: its backward is a dense scatter-add."""
    index, (batch, time) = plan
    table = torch.cat([table.new_zeros(1, table.size(-1)), table])
    return F.embedding(index, table).view(time, batch, table.size(-1))


class PositionInjector(nn.Module):
    def __init__(self, absolute: Optional[AbsolutePositionEncoding], padding_idx: int,
                 relative: Optional[RelativePositionEncoding] = None,
                 self_bias: Optional[nn.Module] = None, cross_bias: Optional[nn.Module] = None,
                 random_positions: Optional[int] = None, causal: bool = False, spaced_in_evaluation: bool = False):
        super().__init__()
        #: ``--pe-random-positions`` L (:mod:`.random_positions`): sampled in training, and in evaluation on the
        #: encoder side (``causal`` False); None: positions 0 .. n−1
        self.random_positions = random_positions
        self.causal = causal
        #: ``--pe-random-eval-decoder spaced`` (decoder): in evaluation, the positions that training draws on average
        #: for a target as long as the source (:func:`.random_positions.spaced_positions`), else 0 .. n−1
        self.spaced_in_evaluation = spaced_in_evaluation and random_positions is not None
        self.source_lengths: Optional[torch.Tensor] = None  # (B,) the source's real tokens, for the spacing
        self.source_width = 0  # the source's padded length S (the sizes the spacing's bound is decided from)
        self.source_has_padding = False  # whether the source came with a padding mask
        self.absolute = absolute
        self.relative = relative  # used by the self-attention of every block
        self.self_bias = self_bias  # FLOATER Q/K/V biases of self-attention
        self.cross_bias = cross_bias  # FLOATER Q/K/V biases of cross-attention (decoder)
        self.source_positions: Optional[torch.Tensor] = None  # (B, S), for cross-attention keys/values
        self.source_length = 0
        self.padding_idx = padding_idx
        # follows the model's dtype (.half(), .bfloat16()) so returned zeros/vectors match it
        self.register_buffer("_dtype_probe", torch.zeros(0), persistent=False)
        self.positions: Optional[torch.Tensor] = None  # (B, T) of the current forward pass
        self.length = 0  # 1 + the largest position of the current forward pass
        self._plan = self._source_plan = None  # gather plans of this side's / the source's positions
        self._rows = PassState()  # FLOATER biases of the current pass: kind -> one (T, B, D) tensor per projection
        #: the encoder's pass under way: whether fairseq handed its layers a padding mask (None: no layer ran)
        self.source_padded: Optional[bool] = None

    def _replicate_for_data_parallel(self):
        refuse_data_parallel()

    @property
    def max_positions(self) -> int:
        limit = UNLIMITED_POSITIONS
        absolute = self.absolute
        if absolute is not None and absolute.max_positions is not None:
            limit = PositionLimit(absolute.max_positions, f"{absolute.max_positions_flag} {absolute.max_positions}, "
                                  f"the rows of --pe-absolute {absolute.registry_name}'s table (fixed at training "
                                  f"time: train with a larger {absolute.max_positions_flag}, or use an encoding "
                                  "without a length limit)")
        if self.random_positions is not None and self.random_positions < limit:
            limit = PositionLimit(self.random_positions, f"--pe-random-positions {self.random_positions} (n tokens "
                                  f"need n distinct positions in [0, {self.random_positions}): train with a larger "
                                  "--pe-random-positions)")
        return limit

    @property
    def all_blocks(self) -> bool:
        return self.absolute is not None and self.absolute.all_blocks

    def forward(self, tokens: torch.Tensor, incremental_state=None) -> torch.Tensor:
        """Absolute vectors of the input block, (B, T, D); (B, T, 1) zeros without one.

        With ``incremental_state`` only the last time step is returned.
        """
        positions = token_positions(tokens, self.padding_idx)
        sampled = self.random_positions is not None and (self.training or not self.causal)
        # every position is below this bound, known without reading them (a host sync): the table's length
        bound = self.random_positions if sampled else tokens.size(1)
        if sampled:  # evaluation: each sentence's own fixed draw (reproducible whatever the batch)
            positions = sample_positions(positions, self.random_positions, None if self.training else tokens)
        elif self.spaced_in_evaluation and not self.training:
            if self.source_lengths is None:
                raise UserError("--pe-random-eval-decoder spaced needs the source: the decoder was called without "
                                "encoder_out")
            positions = spaced_positions(positions, self.source_lengths, self.random_positions)
            # past the source's length 1 apart: a bound of the positions used, from the sizes (no host sync)
            sampled, bound = True, spaced_position_bound(self.random_positions, tokens.size(1), self.source_width,
                                                         self.source_has_padding)
            self._check_trained_rows(bound, tokens.size(1))
        if self.relative is not None:
            # a new pass of the side's relative encoding, with the rows' own positions where they are not the
            # indices: sampled, or for an encoding that needs more than their differences (FIRE), which uses them if
            # the pass is padded (the keys so far, while decoding)
            needed = sampled or self.relative.needs_positions
            self.relative.begin_pass(positions if needed else None, bound, sampled)
        self.length = max(bound, 1)
        if incremental_state is not None:
            positions = positions[:, -1:]
        self.positions = positions
        self._plan = gather_plan(positions)
        # FLOATER biases on this side's positions: every block's q/k/v (and cross-attention q) in one gather
        self._rows = PassState()
        for kind, bias in (("self", self.self_bias), ("cross", self.cross_bias)):
            if bias is not None:
                bias.begin_forward(max(self.length, self.source_length if kind == "cross" else 0))
                # cross-attention: the queries only; its keys and values live on the source positions
                tables = bias.all_tables(self.length) if kind == "self" else bias.query_tables(self.length)
                # unbind, not indexing: the backward of n selects would build n full-size zero tensors
                self._rows[kind] = lookup_time_major(self._plan, tables).unflatten(-1, (-1, bias.embed_dim)).unbind(2)
        if self.absolute is None:
            return positions.new_zeros(positions.shape + (1,), dtype=self._dtype_probe.dtype)
        return self.vectors(block=1)

    def _check_trained_rows(self, bound: int, target_length: int):
        """Spaced positions reach ``bound`` − 1: past L − 1 an absolute table's rows were never trained (training
        draws from [0, L)), so the pass is refused by name, never read or clamped.  Encodings without a table
        extrapolate past L as they would past any trained length."""
        limit, absolute = self.random_positions, self.absolute
        if bound <= limit or absolute is None or absolute.max_positions is None:
            return
        m = spaced_source_length_of_largest(limit, target_length, self.source_width, self.source_has_padding)
        source = (f"a source of {m} tokens" if not self.source_has_padding else
                  f"a source of {m} tokens, the worst case of this batch's sources padded to {self.source_width} "
                  "(their lengths are not read: a host sync at every step; one sentence at a time, --batch-size 1, "
                  "is decided on its own length)")
        raise UserError(f"--pe-random-eval-decoder spaced with --pe-random-positions {limit}: {target_length} target "
                        f"tokens after {source} need position {bound - 1}, past the range [0, {limit}) that training "
                        f"draws from, where --pe-absolute {absolute.registry_name}'s row {bound - 1} was never "
                        f"trained. Decode with --pe-random-eval-decoder indices, or shorter hypotheses "
                        f"(--max-len-a/--max-len-b), or train with a larger --pe-random-positions")

    def forget_source(self):
        """Before a decoder pass: nothing of an earlier pass's source is kept (a pass without ``encoder_out`` has
        none: the spacing then refuses it by name, FLOATER's cross-attention biases are not computed)."""
        self.source_lengths = self.source_positions = self._source_plan = None
        self.source_width, self.source_has_padding, self.source_length = 0, False, 0

    def vectors(self, block: int) -> torch.Tensor:
        """Block ``block``'s absolute vectors for the current positions, (B, T, D), 0 at padding."""
        return lookup(self.positions, self.absolute(self.length, block).to(self._dtype_probe.dtype))

    def set_source_lengths(self, src_len: int, encoder_padding_mask: Optional[torch.Tensor]):
        """The number of real source tokens of each row (decoder side, ``--pe-random-eval-decoder spaced``)."""
        self.source_width, self.source_has_padding = src_len, encoder_padding_mask is not None
        if encoder_padding_mask is None:
            self.source_lengths = torch.full((1,), src_len, device=self._dtype_probe.device)
        else:
            self.source_lengths = src_len - encoder_padding_mask.sum(dim=1)

    def set_source(self, encoder_padding_mask: Optional[torch.Tensor], src_len: int, batch: int, device):
        """Positions of the source tokens (decoder side: cross-attention keys and values)."""
        if encoder_padding_mask is None:
            self.source_positions = torch.arange(src_len, device=device).unsqueeze(0).expand(batch, src_len)
        else:
            self.source_positions = torch.cumsum(~encoder_padding_mask, dim=1) * (~encoder_padding_mask) - 1
        self.source_length = max(src_len, 1)  # a bound of the positions, known without reading them
        self._source_plan = gather_plan(self.source_positions)

    def attention_bias(self, kind: str, block: int, index: int) -> torch.Tensor:
        """FLOATER bias (T, B, D) of projection ``index`` (q, k, v) of ``kind`` attention in ``block``."""
        if kind == "self":
            return self._rows["self"][self.self_bias.row(block, index)]
        if index == 0:  # cross-attention queries: this side's positions
            return self._rows["cross"][block - 1]
        # cross-attention keys and values: the source's positions
        return lookup_time_major(self._source_plan, self.cross_bias.table(self.source_length, block, index))

    def block_vectors(self, block: int) -> torch.Tensor:
        """(T, B, D) vectors added at the input of 1-based ``block`` > 1 with ``--pe-all-blocks`` (block 1
        receives its vectors at the embedding layer)."""
        return lookup_time_major(self._plan, self.absolute(self.length, block).to(self._dtype_probe.dtype))
