"""One forward pass (or one step of step-by-step decoding) of one side, as an explicit, immutable object (a named
tuple: typed fields, and what ``torch.compile`` traces without a graph break).

The encoder or decoder builds a :class:`PositionPass` from its tokens (:meth:`PositionInjector.build_pass
<fairseq_pe.positional.injector.PositionInjector.build_pass>`) and opens it around its own forward
(:func:`open_pass` ... :func:`close_pass` in ``try``/``finally``, or :func:`pass_scope`); its layers and attentions
read it with :func:`current_pass`, the relative encoding's methods get what they need of it as an argument
(:class:`RelativeRows`).  When the forward ends no module references it, nor any tensor of it: the next pass builds
its own.  Under activation checkpointing the pass is also an input of each
checkpointed call (``pe_pass``), so the recomputation in backward reopens its own pass, whatever ran in between.

As x-transformers computes its rotary angles and biases once per forward and hands them to each layer, what depends
on positions only (RoPE's rotations, a bias, the merged attention mask) is computed once per pass by the first layer
that asks, in the pass's :class:`PassMemo`, under a typed key (one small named tuple per kind of value).

The flow is drawn in ``docs/layout.md`` ("The flow of a pass").
"""

import contextlib
import threading
from typing import Callable, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import Tensor


class PassMemo:
    """What one pass computes from its positions alone, computed once by the first layer that asks and read by the
    others; created with its pass and dropped with it.

    The grad mode is part of every key: a value computed without autograd (evaluation, the forward of
    ``--checkpoint-activations``) is never handed to a computation that records it.  A value that carries a gradient
    is kept only where the caller says so (``keep_graph``: the fused path, where the layers' gradients add up in one
    graph), never where a layer's work is recomputed in backward, which needs a graph of its own.

    A block of query rows (the blocks and blockwise paths) reads the pass through :meth:`linear`: there only values
    of O(T + S) are kept (the kinds of key marked ``linear``: rotations, a Toeplitz bias's vector, one query's
    distance vectors), never a block's mask or bias, which would hold the whole T × S again across the blocks and
    stay alive while a checkpointed forward records."""

    def __init__(self, values: Optional[dict] = None, linear_only: bool = False):
        self._values = {} if values is None else values
        self.linear_only = linear_only
        #: the encoder's pass: whether fairseq handed its layers a padding mask (None: no layer ran)
        self.source_padded: Optional[bool] = None

    def linear(self) -> "PassMemo":
        """This memo as a block reads it: the same values, and only values of O(T + S) kept."""
        return self if self.linear_only else PassMemo(self._values, linear_only=True)

    def value(self, key, compute: Callable, keep_graph: bool = False):
        full_key = (type(key), key, torch.is_grad_enabled())  # keys of different kinds never equal
        if full_key in self._values:
            return self._values[full_key]
        value = compute()
        if self.linear_only and not getattr(key, "linear", False):
            return value
        values = value if isinstance(value, tuple) else (value,)
        if keep_graph or not any(torch.is_tensor(v) and v.requires_grad for v in values):
            self._values[full_key] = value
        return value

    def tensors(self):
        """Every tensor the memo keeps (for tests of what a pass holds)."""
        for value in self._values.values():
            for item in value if isinstance(value, tuple) else (value,):
                if torch.is_tensor(item):
                    yield item

    def __len__(self):
        return len(self._values)


# ---- the memo's keys: one named tuple per kind of value (the memo keys them with their kind) -------------------

class MaskKey(NamedTuple):
    """The fused path's merged mask (position bias + causal + padding) of one shape."""
    batch: int
    tgt_len: int
    src_len: int
    query_offset: int
    bias_key: object
    dtype: torch.dtype
    attn_mask: bool
    padded: bool
    gradient: bool


class BlockMaskKey(NamedTuple):
    """The explicit path's merged mask of query rows start .. end."""
    batch: int
    start: int
    end: int
    query_offset: int
    src_len: int
    bias_key: object
    dtype: torch.dtype
    attn_mask: bool
    padded: bool
    before_softmax: bool


class FlexBlockMaskKey(NamedTuple):
    """FlexAttention's block mask of the pass's sizes, causality and padding (built once per pass, as its documented
    use builds ``create_block_mask`` once per batch and reuses it in every layer)."""
    linear = True  # one entry per 128 × 128 block of the logits
    batch: int
    tgt_len: int
    src_len: int
    query_offset: int
    causal: bool
    padded: bool


class BiasKey(NamedTuple):
    """A relative encoding's position bias (ALiBi, T5, KERPLE, Sandwich, FIRE), per row or shared by the rows."""
    tgt_len: int
    src_len: int
    query_offset: int
    bias_key: object
    per_row: bool


class DistanceBiasKey(NamedTuple):
    """A Toeplitz encoding's bias of each signed distance low .. high − 1 (ALiBi, T5, KERPLE, Sandwich)."""
    linear = True  # O(T + S): kept for blocks too (PassMemo.linear)
    low: int
    high: int
    bias_key: object


class RotationKey(NamedTuple):
    """RoPE's (xPos's) rotations of the pass's new queries and keys."""
    linear = True  # O(T + S): kept for blocks too (PassMemo.linear)
    length: int
    query_offset: int
    per_row: bool
    query_scale: float


class DistanceIndexKey(NamedTuple):
    """The Shaw family's index of every (query, key) pair into its 2K + 1 distance vectors."""
    tgt_len: int
    src_len: int
    query_offset: int


class FoldedKey(NamedTuple):
    """The Shaw family's distance vectors of one query (a decoding step), to add to the keys and values."""
    linear = True  # O(T + S): kept for blocks too (PassMemo.linear)
    src_len: int
    query_offset: int
    table: int


class HiddenKeysKey(NamedTuple):
    """DAPE v2's masks of the keys and hidden units its convolutions zero, from the positions and the step's masks
    (the same mask for every layer of a pass: none of these encodings adds a bias of its own to it)."""
    batch: int
    tgt_len: int
    src_len: int
    query_offset: int
    masking: Optional[tuple]


class VectorsKey(NamedTuple):
    """The sinusoidal Shaw vectors of one table."""
    linear = True  # O(T + S): kept for blocks too (PassMemo.linear)
    table: int


# ---- what a relative encoding reads of a pass ---------------------------------------------------------------

class RelativeRows(NamedTuple):
    """What a relative encoding's methods read of the pass, for one attention call: the rows' positions of every key
    index (B, S), −1 at padding, where they are not the indices (else None), an exclusive bound of them known without
    reading them, and the pass's memo."""
    positions: Optional[Tensor] = None
    bound: Optional[int] = None
    memo: Optional[PassMemo] = None  # None: nothing is shared (an encoding called on its own)

    def distances(self, tgt_len: int, src_len: int, query_offset: int) -> Optional[Tensor]:
        """(B, T, S) signed distances j − i between the rows' positions of key j and query i (query row r at index
        ``query_offset + r``), or None when the positions are the indices."""
        if self.positions is None:
            return None
        queries = self.positions[:, query_offset:query_offset + tgt_len]
        return self.positions[:, :src_len].unsqueeze(1) - queries.unsqueeze(2)

    def unshared(self) -> "RelativeRows":
        """What a block of query rows reads: the same, with the memo keeping values of O(T + S) only
        (:meth:`PassMemo.linear`)."""
        return self if self.memo is None else self._replace(memo=self.memo.linear())

    def shared(self, key, compute: Callable, keep_graph: bool = False):
        """The pass's value of ``key`` (:class:`PassMemo`)."""
        return compute() if self.memo is None else self.memo.value(key, compute, keep_graph)


def as_rows(rows: Optional[RelativeRows]) -> RelativeRows:
    """``rows``, or for an encoding called outside any pass (on its own, in a test): the indices, nothing shared."""
    return RelativeRows() if rows is None else rows


class SourcePositions(NamedTuple):
    """The decoder's source in this pass, for FLOATER's cross-attention keys and values: the gather plan of the
    source's positions, their exclusive bound (the source's padded length) and FLOATER's cross-attention states of
    the pass."""
    plan: Tuple
    length: int
    floater_states: Optional[Tensor] = None


class PositionPass(NamedTuple):
    """One forward pass or decoding step of one side (module docstring).

    Attributes:
        owner: the side's :class:`~fairseq_pe.positional.injector.PositionInjector`, which built it.
        positions: (B, T) positions of this call's tokens (the last one while decoding step by step), −1 at padding.
        plan: their gather plan (:func:`~fairseq_pe.positional.injector.gather_plan`) where the pass looks rows up
            (FLOATER's biases, ``--pe-all-blocks``); else None.
        length: an exclusive bound of the positions, known without reading them (a table's length).
        memo: values of the pass that depend on positions only (:class:`PassMemo`).
        relative: the side's relative encoding, used by the self-attention of every block (None: none).
        rows: (B, S) positions of every key index, kept where the relative encoding may need them (sampled
            positions, or an encoding that :attr:`~.base.RelativePositionEncoding.needs_positions`); else None.
        sampled: whether ``rows`` are not the indices whatever the padding (randomised or spaced positions).
        floater_rows: FLOATER's biases of this side's positions: "self" -> one (T, B, D) tensor per block and
            projection, "cross" -> the cross-attention queries' per block.
        source: the decoder's source (FLOATER's cross-attention keys and values), None without one.
        given: within a checkpointed layer's call, the block's position tensors handed to it as inputs (FLOATER's
            biases ``pe_self_0`` .., ``pe_block``), read by :meth:`~fairseq_pe.models.layers.BlockPositionMixin
            .position_tensor`; else empty.
    """
    owner: object
    positions: Tensor
    plan: Optional[Tuple]
    length: int
    memo: PassMemo
    relative: Optional[object] = None
    rows: Optional[Tensor] = None
    sampled: bool = False
    floater_rows: Mapping[str, Tuple[Tensor, ...]] = {}
    source: Optional[SourcePositions] = None
    given: Mapping[str, Tensor] = {}

    def relative_rows(self, padded: bool) -> RelativeRows:
        """What the relative encoding reads for an attention whose keys are ``padded`` (it was handed a padding
        mask: fairseq has already decided, no host sync here): the rows' own positions where they are sampled, or
        where the pass is padded and the encoding needs positions (with left padding they are not the indices)."""
        needed = self.sampled or (padded and self.relative is not None and self.relative.needs_positions)
        return RelativeRows(self.rows if needed else None, self.length, self.memo)


class PassOwnerError(RuntimeError):
    """An attention or layer read a pass that another side or model built (:func:`current_pass` with ``owner``)."""


#: the innermost pass under way, per thread (:func:`pass_scope`): two models evaluated in two threads, or one model
#: in a pool of threads (as stock fairseq models can be), each read their own pass.  Reading it names its owner
#: (:func:`current_pass`), so that a pass read by a module of another side or model fails loudly instead of mixing.
#: ``nn.DataParallel``'s replicas are refused by name (:func:`~fairseq_pe.positional.base.refuse_data_parallel`).
_local = threading.local()


def open_pass(position_pass: Optional[PositionPass]) -> Optional[PositionPass]:
    """Make ``position_pass`` this thread's pass under way (None: leave it as it is); returns the one it replaces,
    for :func:`close_pass`.  ``try``/``finally`` around the side's forward (what :func:`pass_scope` does), written out
    where ``torch.compile`` traces it: a graph break inside a generator's ``with`` block is not resumable."""
    outer = getattr(_local, "current", None)
    if position_pass is not None:
        _local.current = position_pass
    return outer


def close_pass(outer: Optional[PositionPass]):
    """End the pass that :func:`open_pass` opened: ``outer`` (what it returned) is under way again."""
    _local.current = outer


@contextlib.contextmanager
def pass_scope(position_pass: Optional[PositionPass]):
    """Within the block, :func:`current_pass` is ``position_pass`` in this thread (the innermost scope wins); at its
    end the scope that was open before is restored.  ``None`` opens nothing."""
    outer = open_pass(position_pass)
    try:
        yield position_pass
    finally:
        close_pass(outer)


def current_pass(owner: object = None) -> Optional[PositionPass]:
    """This thread's pass under way (:func:`pass_scope`), or None outside every pass.  With ``owner`` (the side's
    :class:`~fairseq_pe.positional.injector.PositionInjector` that the caller belongs to), a pass that another
    injector built is refused (:class:`PassOwnerError`): a module never computes with another model's or side's
    positions."""
    position_pass = getattr(_local, "current", None)
    if owner is not None and position_pass is not None and position_pass.owner is not owner:
        raise PassOwnerError(
            f"the pass under way in this thread was built by another side or model ({position_pass.owner!r:.80}); "
            "a module reads only its own side's pass (open it with pass_scope(injector.build_pass(tokens)))")
    return position_pass
