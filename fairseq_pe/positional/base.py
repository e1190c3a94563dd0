"""The position-encoding interface and the one registry every model builds from.

Positions are 0-based indices of the non-padding tokens of a sequence (left padding is
skipped, so the first real token is position 0 whatever the padding); padding tokens get
position -1 and a zero vector.

Two kinds of encoding plug in:

* ``absolute`` encodings (:class:`AbsolutePositionEncoding`) map positions to vectors that
  are added to the hidden states at the input block, and with ``--pe-all-blocks`` at the
  input of every block (``block`` is 1-based, block 1 being the embedding layer);
* ``relative`` encodings act inside self-attention and register under the same registry
  with kind ``"relative"``.
"""

from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn as nn

from fairseq_pe.errors import UserError

from .pass_state import DistanceBiasKey, RelativeRows, as_rows

_REGISTRY: Dict[Tuple[str, str], Callable] = {}
KINDS = ("absolute", "relative")


def register_position_encoding(kind: str, name: str):
    """Class decorator: make ``name`` a choice of ``--pe-<kind>``."""
    if kind not in KINDS:
        raise ValueError(f"unknown position-encoding kind {kind!r}; expected one of {KINDS}")

    def wrap(cls):
        key = (kind, name)
        if key in _REGISTRY:
            raise ValueError(f"{kind} position encoding {name!r} is registered twice")
        _REGISTRY[key] = cls
        cls.registry_name = name
        return cls

    return wrap


def option(args, name: str, default):
    """``args.<name>``, or ``default`` when it is not set (None).  An explicit 0 stays 0 (and is then
    refused by the option's range check), never silently replaced by the default."""
    value = getattr(args, name, None)
    return default if value is None else value


def position_encoding_choices(kind: str):
    return ["none"] + sorted(name for k, name in _REGISTRY if k == kind)


def build_position_encoding(kind: str, name: str, **kwargs) -> Optional[nn.Module]:
    """Instantiate the encoding registered as ``(kind, name)``; ``"none"`` gives ``None``."""
    if name in (None, "none"):
        return None
    try:
        cls = _REGISTRY[(kind, name)]
    except KeyError:
        raise UserError(
            f"unknown --pe-{kind} {name!r}; choose one of {position_encoding_choices(kind)}"
        ) from None
    return cls(**kwargs)


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype an encoding computes in for a model (or tensor) of ``dtype``: float32 for fp16, bf16 and float32
    (the precision of the positions, :class:`Float32State`), float64 for float64, which is never lowered (a float64
    model computes in float64 throughout: the reference of a differential test)."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def query_key_products(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q·kᵀ of (..., T, d) queries against (..., S, d) keys with the same leading dimensions: (..., T, S).  One
    ``bmm`` over the flattened leading dimensions (``torch.matmul`` of 4-D tensors adds two ``expand`` and a copy's
    view: two operators more in every decoding step of a logits hook)."""
    lead = q.shape[:-2]
    return torch.bmm(q.reshape(-1, q.size(-2), q.size(-1)),
                     k.reshape(-1, k.size(-2), k.size(-1)).transpose(1, 2)).view(*lead, q.size(-2), k.size(-2))


class Float32State(nn.Module):
    """Keeps this module's parameters and buffers (its children's too) in float32 when the model is
    converted to half precision (``.half()``, ``.bfloat16()``, ``.to(dtype)``, fairseq's ``--fp16`` and
    ``--bf16``).

    Positions are then computed in float32 from float32 frequencies or states and only the result
    takes the model's dtype.  In fp16 a frequency or a position angle loses its low bits: R(2048)x
    and R(2049)x would be the same rotation, and sinusoids of positions past a few hundred would be
    off by up to 0.2.  float64 is left as it is.
    """

    def _apply(self, fn, *args, **kwargs):
        def state():
            return list(self.named_parameters()) + list(self.named_buffers())

        # the float32 values before the conversion: converting back from fp16 would not restore their low bits
        originals = {name: t.data for name, t in state() if t.dtype == torch.float32}
        module = super()._apply(fn, *args, **kwargs)
        for name, tensor in state():
            if tensor.dtype in (torch.float16, torch.bfloat16) and name in originals:
                tensor.data = originals[name].to(tensor.device)
                if getattr(tensor, "grad", None) is not None:
                    tensor.grad = tensor.grad.float()
        return module


def constrain(parameter: nn.Parameter, low: Optional[float] = None, high: Optional[float] = None) -> nn.Parameter:
    """Keep ``parameter`` within [low, high] by projection (a projected-gradient step): it is projected now, and
    after every optimizer step, in the copy the optimizer updates: the parameter itself (plain optimizers,
    ``--memory-efficient-fp16``/``-bf16``, ``--amp``) and the float32 master copy of ``--fp16``/``--bf16``
    (fairseq's ``FP16Optimizer``), before it is copied back into the model
    (:mod:`fairseq_pe.compat.constrained_parameters`).  So the values stored, used and updated are the same under
    every optimizer, and a resumed run continues the run it resumes.  The bounds ride on the parameter object
    (``pe_bounds``), which conversions to half precision, DDP and checkpoint loading keep."""
    parameter.pe_bounds = (low, high)
    project_(parameter.data, parameter.pe_bounds)
    return parameter


def project_(tensor: torch.Tensor, bounds) -> torch.Tensor:
    """Clamp ``tensor`` into ``bounds`` (low, high; None: unbounded) in place, without a host sync."""
    low, high = bounds
    return tensor.clamp_(min=low, max=high)


def refuse_data_parallel():
    """``nn.DataParallel`` on two or more devices (``torch.nn.parallel.replicate``) is refused by name: its replicas
    are shallow copies run in threads, whose layers would reach the pass's positions through their plain references
    to the original model's modules (a layer's injector, FLOATER's flow): they would compute with the original's
    parameters, on the original's device.  fairseq's data parallelism is DDP (a process per device,
    each with its own model), which needs nothing of this."""
    raise UserError("nn.DataParallel on several devices is not supported by fairseq_pe models: its replicas run in "
                    "threads and would reach the original model's position encodings. Use fairseq's "
                    "DistributedDataParallel (fairseq-train on several GPUs: one process per GPU, "
                    "--distributed-world-size N), or run the model on one device")


class PositionOutOfRangeError(UserError):
    """A position beyond what an encoding can represent was requested."""


class AbsolutePositionEncoding(nn.Module):
    """Interface of absolute encodings: ``forward(length, block)`` is the (length × D) table
    of the vectors of positions 0 .. length-1 that block ``block`` receives.

    Args:
        embed_dim: size D of the vectors.
        num_blocks: how many blocks the model has (the number of layers).
        all_blocks: whether every block receives vectors (``--pe-all-blocks``) or only the
            input block (block 1).
        max_positions: the number of positions a table-based encoding holds; ignored by
            encodings that work at any length (``has_length_limit = False``).
        max_positions_flag: the command-line flag that sets ``max_positions``, named in the
            error raised for a longer sequence.
        padding_idx: the dictionary's padding index (fairseq's own encodings offset positions by it).
        args: the model's configuration, for a family's own options (e.g. the sinusoids' scale).
    """

    #: whether the encoding has a length limit (a table); sinusoids have none
    has_length_limit = False

    def __init__(self, embed_dim: int, num_blocks: int = 1, all_blocks: bool = False,
                 max_positions: Optional[int] = None, max_positions_flag: str = "--max-source-positions",
                 padding_idx: int = 1, args=None):
        super().__init__()
        self.padding_idx = padding_idx
        self.embed_dim = embed_dim
        self.num_blocks = num_blocks
        self.all_blocks = all_blocks
        self.max_positions = max_positions if self.has_length_limit else None
        self.max_positions_flag = max_positions_flag

    def check_range(self, max_position: int):
        """Raise a clear error if position ``max_position`` cannot be encoded."""
        if self.max_positions is not None and max_position >= self.max_positions:
            raise PositionOutOfRangeError(
                f"--pe-absolute {self.registry_name}: a sequence of {max_position + 1} tokens needs "
                f"position {max_position}, but the table was built with {self.max_positions} positions "
                f"({self.max_positions_flag} {self.max_positions} at training time). Train with a larger "
                f"{self.max_positions_flag}, or use an encoding without a length limit "
                f"(e.g. --pe-absolute sinusoidal)."
            )

    def forward(self, length: int, block: int = 1) -> torch.Tensor:
        """The (length × embed_dim) vectors of positions 0 .. length-1 for 1-based ``block``."""
        raise NotImplementedError


def relative_distances(tgt_len: int, src_len: int, query_offset: int, device=None) -> torch.Tensor:
    """(tgt_len × src_len) signed distances j - i between key j and query i.

    Query row r sits at index ``query_offset + r`` (while decoding step by step the query is
    the last of ``src_len`` keys).  Indices, not pad-aware positions, are enough: left
    padding shifts queries and keys alike, and padded keys are masked.
    """
    q = torch.arange(tgt_len, device=device) + query_offset
    k = torch.arange(src_len, device=device)
    return k.unsqueeze(0) - q.unsqueeze(1)


class RelativePositionEncoding(nn.Module):
    """Interface of relative encodings, used by :class:`~fairseq_pe.models.attention.PositionAttention`.

    Self-attention of block ``block`` (1-based) computes, for queries q and keys k of shape
    (B, H, T, d) and (B, H, S, d), query i at index ``query_offset + i``:

        q, k   = rotate(q, k, query_offset, block, query_scale)           (rotary encodings; q times query_scale)
        logits = q·kᵀ/√d + position_bias(T, S, query_offset, block)       (ALiBi, T5: positions only)
                         + logit_terms(q, T, S, query_offset, block)      (Shaw family: q·a^K_{j−i})
        out    = probs·v + value_terms(probs, T, S, query_offset, block)  (Shaw family: Σ_j α_ij a^V_{j−i})

    A method returning ``None`` contributes nothing.  ``position_bias`` is (H, T, S) and broadcasts
    over the batch, or is (B, H, T, S) when the rows have positions of their own (``rows.positions``,
    ``rows.distances``: randomised positions, or a padded pass for an encoding that needs positions);
    ``logit_terms`` takes the scaled queries flattened to (B·H, T, d) and returns a tensor that broadcasts
    to (B, H, T, S); ``value_terms`` takes (B·H, T, S) probabilities and returns (B·H, T, d).  ``causal``
    is True on the decoder side.

    What the attention can use depends on three class attributes: ``query_terms`` (the encoding has
    ``logit_terms``/``value_terms``, which need the probabilities: the attention computes them
    explicitly, block by block), :attr:`own_logits` (the encoding computes the logits themselves,
    :meth:`attention_logits`, from the queries and keys, the per-key state of :meth:`key_state` and the rows'
    masks: explicitly too) and :attr:`bias_requires_grad` (torch's fused kernel on the CPU gives no
    gradient for its mask).  An encoding with none of them runs entirely in torch's fused kernel.

    The logits hook, for encodings that read the logits or the layer's input (FoX, CoPE, DAPE, ReRoPE):

        state  = key_state(x, key_padding_mask, block, previous)        (per key, from the attention's input x;
                                                                         kept in fairseq's incremental_state)
        logits = attention_logits(q, k, query_offset, block, rows, state, masking)   (in place of q·kᵀ/√d + B)

    Every method takes, as ``rows``, what it reads of the pass under way
    (:class:`~fairseq_pe.positional.pass_state.RelativeRows`: the rows' positions where they are not the indices,
    and the pass's memo, where what depends on positions alone is computed once per pass or decoding step and shared
    by the side's layers); without it (an encoding called on its own) the positions are the indices and nothing is
    shared.  The encoding keeps nothing of a pass.

    Args:
        embed_dim: model dimension; ``head_dim`` = embed_dim / num_heads.
        num_heads, num_blocks: of the encoder or decoder this encoding serves.
        causal: decoder (True) or encoder (False).
        args: the model's configuration (for the family's own options).
    """

    #: what ``--pe-relative-untie-layers`` / ``--pe-relative-untie-heads`` can untie ("layers", "heads"):
    #: a family without parameters per layer or head refuses the flags (they would change nothing)
    untiable = ()
    #: what the encoding has separately per layer or head always (the untie flags are then refused as such)
    already_untied = ()
    #: whether the encoding has query-dependent terms (``logit_terms``, ``value_terms``)
    query_terms = False
    #: whether the encoding depends on positions beyond their differences (FIRE's normaliser): then it gets the
    #: rows' positions (``rows.positions``) also when padding is all that separates them from the indices
    needs_positions = False
    #: whether the encoding computes the attention logits itself (:meth:`attention_logits`, the logits hook): the
    #: attention then computes its probabilities explicitly (the explicit path in decoding and where weights are
    #: asked for, else blockwise: blocks of query rows, each under ``checkpoint`` in training), never in a fused
    #: kernel; its :meth:`position_bias` is not called (such an encoding adds any bias of its own in the hook)
    own_logits = False
    #: whether ``position_bias`` depends on the signed distance j − i alone (a Toeplitz matrix per head: ALiBi, T5,
    #: KERPLE, Sandwich): such an encoding defines :meth:`bias_of_distances`, and its bias of any block of rows is a
    #: window of one small (H, T + S − 1) vector (:meth:`distance_bias`)
    toeplitz = False

    def __init__(self, embed_dim: int, num_heads: int, num_blocks: int, causal: bool, args=None):
        super().__init__()
        for what in ("layers", "heads"):
            if getattr(args, f"pe_relative_untie_{what}", False) and what not in self.untiable:
                why = (f"its parameters are per {what[:-1]} already" if what in self.already_untied
                       else f"it has no parameters per {what[:-1]} to untie")
                raise UserError(f"--pe-relative-untie-{what} has no effect with --pe-relative {self.registry_name} "
                                f"({why}); remove it")
        if embed_dim % num_heads != 0:
            raise UserError(f"--pe-relative needs the embedding dimension ({embed_dim}) to be a multiple "
                             f"of the number of attention heads ({num_heads})")
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.num_blocks = num_blocks
        self.causal = causal
        #: whether the layers' forward is recomputed in backward (``--checkpoint-activations``)
        self.recomputed = bool(getattr(args, "checkpoint_activations", False))

    @property
    def adds_bias(self) -> bool:
        """Whether the encoding has a ``position_bias`` (the attention then passes a float mask, never only
        ``is_causal``)."""
        return type(self).position_bias is not RelativePositionEncoding.position_bias

    @property
    def bias_requires_grad(self) -> bool:
        """Whether ``position_bias`` depends on trainable parameters."""
        return False

    def bias_key(self, block: int):
        """Blocks with equal keys get the same ``position_bias`` (shared by all layers unless untied)."""
        return 0

    @property
    def device(self) -> torch.device:
        """Where the encoding's parameters and buffers are (the CPU for one without any)."""
        for tensor in self.parameters():
            return tensor.device
        for tensor in self.buffers():
            return tensor.device
        return torch.device("cpu")

    def bias_of_distances(self, distances: torch.Tensor, block: int) -> torch.Tensor:
        """(H, *distances.shape) float32 biases of the signed distances j − i ``distances`` (a :attr:`toeplitz`
        encoding's bias as a function of the distance alone)."""
        raise NotImplementedError(f"{type(self).__name__} is not a Toeplitz encoding")

    def distance_bias(self, low: int, high: int, block: int, rows: RelativeRows = None):
        """(H, high − low) float32 bias of the signed distances low .. high − 1, for a :attr:`toeplitz` encoding
        (None for the others): the bias of query index i and key j is ``distance_bias[h, j − i − low]``.  Linear in
        the length where the (H, T, S) bias is quadratic: computed once per pass (the memo), differentiable in the
        encoding's parameters; the blockwise and FlexAttention paths read their rows' bias from it."""
        if not self.toeplitz:
            return None
        return as_rows(rows).shared(
            DistanceBiasKey(low, high, self.bias_key(block)),
            lambda: self.bias_of_distances(torch.arange(low, high, device=self.device), block))

    def toeplitz_bias(self, tgt_len: int, src_len: int, query_offset: int, block: int, rows: RelativeRows = None):
        """(H, T, S) bias of query rows ``query_offset`` .. + T − 1 and keys 0 .. S − 1 of a :attr:`toeplitz`
        encoding, from :meth:`distance_bias` (the windows of the T + S − 1 distances)."""
        low = -(query_offset + tgt_len - 1)
        per_distance = self.distance_bias(low, src_len - query_offset, block, rows)
        # window a of length S starts at distance low + a, which is query T − 1 − a's distance to key 0
        return per_distance.unfold(1, src_len, 1).flip(1)  # [h, i, j] = b(j − (offset + i))

    def rotate(self, q, k, query_offset: int, block: int, query_scale: float = 1.0, rows: RelativeRows = None):
        """The queries and keys of the pass's new positions, rotated (RoPE); the queries also times
        ``query_scale`` (1/√d where the attention computes its logits itself: one product fewer per layer)."""
        return (q if query_scale == 1.0 else q * query_scale), k

    def position_bias(self, tgt_len: int, src_len: int, query_offset: int, block: int, rows: RelativeRows = None):
        return None

    def logit_terms(self, q, tgt_len: int, src_len: int, query_offset: int, block: int, rows: RelativeRows = None):
        return None

    def value_terms(self, probs, tgt_len: int, src_len: int, query_offset: int, block: int,
                    rows: RelativeRows = None):
        return None

    def key_state(self, x, key_padding_mask, block: int, previous=None):
        """What an :attr:`own_logits` encoding keeps per key, from the self-attention's input ``x`` (T, B, E) of the
        call's new tokens (the layer's input as the projections of q, k and v read it): a batch-first tensor
        (B, ..., S) over every key so far (S = the previous steps' keys + T), or None (nothing kept: the default).
        ``key_padding_mask``: (B, T) of the new tokens, True at padding, or None; ``previous``: what this method
        returned for the same attention at the previous step of step-by-step decoding (None in a full pass and at
        the first step).  The attention keeps it in fairseq's ``incremental_state`` (its input buffer, as stock
        fairseq keeps ``prev_key``; beam search reorders it with them) and hands it to :meth:`attention_logits`.
        FoX: the cumulative log forget gates."""
        return None

    def attention_logits(self, q, k, query_offset: int, block: int, rows: RelativeRows = None, state=None,
                         masking=None):
        """The logits hook of an :attr:`own_logits` encoding: (B, H, T', S) logits of the query rows ``q``
        (B, H, T', d), already times 1/√d and as :meth:`rotate` returned them, against every key so far ``k``
        (B, H, S, d; while decoding, the cached keys as :meth:`rotate` returned them at their step).  Row r is query
        index ``query_offset`` + r (a block of rows: the block's first; a decoding step: S − 1).  ``state``:
        :meth:`key_state`'s (B, ..., S) tensor, or None; ``masking``: the rows' causal and padding masks, additive
        (0 visible, −inf hidden), broadcastable to (B, 1, T', S), or None (every key visible): the attention adds
        it after this method, which reads it only where its own terms must not see hidden keys (CoPE's gates).
        The logits may be float32 whatever q's dtype (the softmax is float32; the probabilities take the values'
        dtype).  Default: q·kᵀ."""
        return query_key_products(q, k)

    def score_mod(self, tgt_len: int, src_len: int, query_offset: int, block: int, rows: RelativeRows = None,
                  q=None):
        """The bias as FlexAttention's ``score_mod(score, b, h, q_idx, kv_idx) -> score`` for query rows
        0 .. ``tgt_len`` − 1 (index ``query_offset`` + row) and keys 0 .. ``src_len`` − 1 (which may exceed the
        rows' positions: :func:`fairseq_pe.models.flex.flex_attention_forward` rounds them up to a bucket and masks
        the extra keys), or None (no bias).  Generic form for a :attr:`toeplitz` encoding: the kernel reads its
        (H, T + S − 1) :meth:`distance_bias` at ``kv − q + T − 1``; with rows of their own positions (randomised)
        the same vector over −bound .. bound at ``pos[b, kv] − pos[b, q] + bound``.  The captured tensors' shapes
        depend on ``tgt_len`` and ``src_len`` only (not on ``query_offset``): one compiled kernel per bucket."""
        if not self.toeplitz:
            return None
        rows = as_rows(rows)
        if rows.positions is None:  # the positions are the indices
            table = self.distance_bias(-(query_offset + tgt_len - 1), src_len - query_offset, block, rows)
            last = tgt_len - 1

            def toeplitz(score, b, h, q_idx, kv_idx):
                return score + table[h, kv_idx - q_idx + last]

            return toeplitz
        bound = rows.bound
        table = self.distance_bias(-bound, bound + 1, block, rows)
        positions = rows.positions
        keys = nn.functional.pad(positions[:, :src_len], (0, max(0, src_len - positions.size(1))))
        queries = positions[:, query_offset:query_offset + tgt_len]
        queries = nn.functional.pad(queries, (0, tgt_len - queries.size(1)))

        def own_positions(score, b, h, q_idx, kv_idx):
            return score + table[h, keys[b, kv_idx] - queries[b, q_idx] + bound]

        return own_positions
