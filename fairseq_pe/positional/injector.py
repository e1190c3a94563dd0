"""The module that feeds position information to a fairseq encoder or decoder.

:class:`PositionInjector` is installed as fairseq's ``embed_positions`` hook: the encoder's
``forward_embedding`` and the decoder's ``extract_features`` call it with the token batch
(and the incremental state while decoding step by step), within the pass that the encoder or
decoder built with :meth:`PositionInjector.build_pass` (:mod:`.pass_state`): the positions of the
batch, computed once, from which it returns the input block's absolute vectors and serves every
later block (``--pe-all-blocks``, :meth:`block_vectors`).  It also owns the side's relative
encoding, which the self-attention of every block uses (one module, shared by the layers), and
FLOATER's Q/K/V bias initial values (:mod:`.floater_bias`), whose biases it serves to the
projections of every block (:meth:`attention_bias`).  It keeps nothing of a pass.
"""

from typing import NamedTuple, Optional

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_pe.errors import UserError

from .base import AbsolutePositionEncoding, RelativePositionEncoding, refuse_data_parallel
from .pass_state import PassMemo, PositionPass, SourcePositions, current_pass
from .random_positions import (sample_positions, spaced_position_bound, spaced_positions,
                               spaced_source_length_of_largest)

#: what ``max_positions`` reports for encodings that work at any length (fairseq needs an int)
UNLIMITED_POSITIONS = 1 << 40


class PositionLimit(int):
    """A side's longest sequence, an int as fairseq needs it, that says which option sets it (``why``): fairseq's
    refusal of a longer sentence, or its skipping of longer training pairs, can then name the option to change
    (:mod:`fairseq_pe.compat.size_errors`)."""

    def __new__(cls, value: int, why: str, refuse: bool = False, fix: str = None):
        limit = super().__new__(cls, value)
        limit.why = why
        #: a longer sample is refused (a UserError that says ``fix``), not skipped: evaluation, where a skipped
        #: sample would leave a score over part of the data (``transformer_lm_pe`` in ``fairseq-eval-lm``)
        limit.refuse = refuse
        limit.fix = fix
        return limit

    def __reduce__(self):
        return PositionLimit, (int(self), self.why, self.refuse, self.fix)


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
    """What :func:`lookup_time_major` needs, computed once per forward pass: the row of each token in time-major
    order (padding's -1 reads row 0) and where the padding is.  (Whether every row has the same positions is not
    asked: the answer would be a host sync.)
    """
    time_major = positions.t().reshape(-1)
    return time_major.clamp(min=0), time_major.lt(0).unsqueeze(-1), positions.shape


def lookup_time_major(plan, table: torch.Tensor) -> torch.Tensor:
    """Rows of ``table`` (L, E) at the planned positions, (T, B, E) as fairseq's attention inputs; zero at padding.
    An embedding lookup (its backward is a dense scatter-add) of the rows the pass reads only: ``table`` may be a
    view (FLOATER's states of every position so far), which is neither copied nor extended, so that a step of
    step-by-step decoding reads one row per sentence whatever its length."""
    index, padding, (batch, time) = plan
    return F.embedding(index, table).masked_fill(padding, 0).view(time, batch, table.size(-1))


class Source(NamedTuple):
    """What the decoder's pass takes of its source (``encoder_out``): its padded length, its batch size and its
    padding mask (B, S), None where nothing is padded."""
    length: int
    batch: int
    padding_mask: Optional[torch.Tensor]


class PositionInjector(nn.Module):
    def __init__(self, absolute: Optional[AbsolutePositionEncoding], padding_idx: int,
                 relative: Optional[RelativePositionEncoding] = None,
                 self_bias: Optional[nn.Module] = None, cross_bias: Optional[nn.Module] = None,
                 random_positions: Optional[int] = None, causal: bool = False, spaced_in_evaluation: bool = False,
                 attention_kernel: str = "auto"):
        super().__init__()
        #: ``--pe-attention-kernel``, handed to the side's attentions (:meth:`PositionAttention.plan
        #: <fairseq_pe.models.attention.PositionAttention.plan>`)
        self.attention_kernel = attention_kernel
        #: ``--pe-random-positions`` L (:mod:`.random_positions`): sampled in training, and in evaluation on the
        #: encoder side (``causal`` False); None: positions 0 .. n−1
        self.random_positions = random_positions
        self.causal = causal
        #: ``--pe-random-eval-decoder spaced`` (decoder): in evaluation, the positions that training draws on average
        #: for a target as long as the source (:func:`.random_positions.spaced_positions`), else 0 .. n−1
        self.spaced_in_evaluation = spaced_in_evaluation and random_positions is not None
        self.absolute = absolute
        self.relative = relative  # used by the self-attention of every block
        self.self_bias = self_bias  # FLOATER Q/K/V biases of self-attention
        self.cross_bias = cross_bias  # FLOATER Q/K/V biases of cross-attention (decoder)
        self.padding_idx = padding_idx
        # follows the model's dtype (.half(), .bfloat16()) so returned zeros/vectors match it
        self.register_buffer("_dtype_probe", torch.zeros(0), persistent=False)

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
        """Absolute vectors of the input block, (B, T, D); (B, T, 1) zeros without one: fairseq's
        ``embed_positions`` hook, called within this side's pass (:meth:`build_pass`).  Called on its own (no pass
        of this side under way) it builds a pass for the vectors alone.

        With ``incremental_state`` only the last time step is returned.
        """
        position_pass = current_pass()
        if position_pass is None or position_pass.owner is not self:  # on its own, or the other side's pass
            position_pass = self.build_pass(tokens, incremental_state is not None)
        if self.absolute is None:
            positions = position_pass.positions
            return positions.new_zeros(positions.shape + (1,), dtype=self._dtype_probe.dtype)
        return self.vectors(position_pass, block=1)

    def build_pass(self, tokens: torch.Tensor, incremental: bool = False,
                   source: Optional[Source] = None) -> PositionPass:
        """The pass of ``tokens`` (B, T): a forward pass, or with ``incremental`` a step of step-by-step decoding
        (every token so far, the last one new); ``source``: the decoder's source, None without ``encoder_out``."""
        positions = token_positions(tokens, self.padding_idx)
        sampled = self.random_positions is not None and (self.training or not self.causal)
        # every position is below this bound, known without reading them (a host sync): the table's length
        bound = self.random_positions if sampled else tokens.size(1)
        if sampled:  # evaluation: each sentence's own fixed draw (reproducible whatever the batch)
            positions = sample_positions(positions, self.random_positions, None if self.training else tokens)
        elif self.spaced_in_evaluation and not self.training:
            if source is None:
                raise UserError("--pe-random-eval-decoder spaced needs the source: the decoder was called without "
                                "encoder_out")
            positions = spaced_positions(positions, self.source_lengths(source), self.random_positions)
            # past the source's length 1 apart: a bound of the positions used, from the sizes (no host sync)
            has_padding = source.padding_mask is not None
            sampled, bound = True, spaced_position_bound(self.random_positions, tokens.size(1), source.length,
                                                         has_padding)
            self._check_trained_rows(bound, tokens.size(1), source.length, has_padding)
        relative = self.relative
        # the rows' own positions where they are not the indices: sampled, or for an encoding that needs more than
        # their differences (FIRE), which uses them if the pass is padded (the keys so far, while decoding)
        rows = positions if relative is not None and (sampled or relative.needs_positions) else None
        length = max(bound, 1)
        if incremental:
            positions = positions[:, -1:]
        # the gather plan of the lookups of this pass (FLOATER's biases, the blocks' vectors), if it has any
        plan = gather_plan(positions) if self.self_bias is not None or self.cross_bias is not None or \
            self.all_blocks else None
        cross = self.cross_bias is not None and source is not None
        source_positions = self.source_positions(source) if cross else None
        # FLOATER biases on this side's positions: every block's q/k/v (and cross-attention q) in one gather
        floater_rows = {}
        for kind, bias in (("self", self.self_bias), ("cross", self.cross_bias if cross else None)):
            if bias is not None:
                states = bias.states(max(length, source_positions.length) if kind == "cross" else length)
                if kind == "cross":  # the source's keys and values read them too (attention_bias)
                    source_positions = source_positions._replace(floater_states=states)
                # the rows of this pass's positions of every block's biases (a view of the states: no copy)
                rows = lookup_time_major(plan, bias.all_tables(states, length)).unflatten(-1, (-1, bias.embed_dim))
                if kind == "cross":  # the queries only; its keys and values live on the source positions
                    rows = rows[:, :, bias.query_rows()]
                # unbind, not indexing: the backward of n selects would build n full-size zero tensors
                floater_rows[kind] = rows.unbind(2)
        return PositionPass(owner=self, positions=positions, plan=plan, length=length, memo=PassMemo(),
                            relative=relative, rows=rows,
                            sampled=sampled and rows is not None, floater_rows=floater_rows, source=source_positions)

    def _check_trained_rows(self, bound: int, target_length: int, source_width: int, source_has_padding: bool):
        """Spaced positions reach ``bound`` − 1: past L − 1 an absolute table's rows were never trained (training
        draws from [0, L)), so the pass is refused by name, never read or clamped.  Encodings without a table
        extrapolate past L as they would past any trained length."""
        limit, absolute = self.random_positions, self.absolute
        if bound <= limit or absolute is None or absolute.max_positions is None:
            return
        m = spaced_source_length_of_largest(limit, target_length, source_width, source_has_padding)
        source = (f"a source of {m} tokens" if not source_has_padding else
                  f"a source of {m} tokens, the worst case of this batch's sources padded to {source_width} "
                  "(their lengths are not read: a host sync at every step; one sentence at a time, --batch-size 1, "
                  "is decided on its own length)")
        raise UserError(f"--pe-random-eval-decoder spaced with --pe-random-positions {limit}: {target_length} target "
                        f"tokens after {source} need position {bound - 1}, past the range [0, {limit}) that training "
                        f"draws from, where --pe-absolute {absolute.registry_name}'s row {bound - 1} was never "
                        f"trained. Decode with --pe-random-eval-decoder indices, or shorter hypotheses "
                        f"(--max-len-a/--max-len-b), or train with a larger --pe-random-positions")

    def vectors(self, position_pass: PositionPass, block: int) -> torch.Tensor:
        """Block ``block``'s absolute vectors for the pass's positions, (B, T, D), 0 at padding."""
        return lookup(position_pass.positions,
                      self.absolute(position_pass.length, block).to(self._dtype_probe.dtype))

    def source_lengths(self, source: Source) -> torch.Tensor:
        """The number of real source tokens of each row (decoder side, ``--pe-random-eval-decoder spaced``)."""
        if source.padding_mask is None:
            return torch.full((1,), source.length, device=self._dtype_probe.device)
        return source.length - source.padding_mask.sum(dim=1)

    def source_positions(self, source: Source) -> SourcePositions:
        """Positions of the source tokens (decoder side: FLOATER's cross-attention keys and values)."""
        mask = source.padding_mask
        if mask is None:
            positions = torch.arange(source.length, device=self._dtype_probe.device).unsqueeze(0).expand(
                source.batch, source.length)
        else:
            positions = torch.cumsum(~mask, dim=1) * (~mask) - 1
        # a bound of the positions, known without reading them
        return SourcePositions(plan=gather_plan(positions), length=max(source.length, 1))

    def attention_bias(self, position_pass: PositionPass, kind: str, block: int, index: int) -> torch.Tensor:
        """FLOATER bias (T, B, D) of projection ``index`` (q, k, v) of ``kind`` attention in ``block``."""
        if kind == "self":
            return position_pass.floater_rows["self"][self.self_bias.row(block, index)]
        if index == 0:  # cross-attention queries: this side's positions
            return position_pass.floater_rows["cross"][block - 1]
        # cross-attention keys and values: the source's positions
        source = position_pass.source
        return lookup_time_major(source.plan, self.cross_bias.table(source.length, block, index,
                                                                    source.floater_states))

    def block_vectors(self, position_pass: PositionPass, block: int) -> torch.Tensor:
        """(T, B, D) vectors added at the input of 1-based ``block`` > 1 with ``--pe-all-blocks`` (block 1
        receives its vectors at the embedding layer)."""
        return lookup_time_major(position_pass.plan,
                                 self.absolute(position_pass.length, block).to(self._dtype_probe.dtype))
