"""Every attention of ``transformer_pe`` and ``roberta_pe``: fairseq's MultiheadAttention on torch's
fused kernels, with the hooks of a relative position encoding.

fairseq's own fast path (``F.multi_head_attention_forward``) reads the projection weights directly,
so it would bypass FLOATER's forward hooks on ``q_proj``/``k_proj``/``v_proj`` and every relative
term.  :class:`PositionAttention` keeps fairseq's parameters, state-dict keys, dropout, masks and
incremental-state buffers and computes, for queries Q, keys K, values V of one head
(Vaswani et al. 2017, Eq. 1, with the encoding's terms, see
:class:`~fairseq_pe.positional.base.RelativePositionEncoding`):

    Q, K   = rotate(Q, K)                                          (RoPE)
    A      = softmax(Q Kᵀ/√d + B + Lq + M)                         B = position_bias (ALiBi, T5),
    out    = A V + value_terms(A)                                  Lq = logit_terms(Q) (Shaw family),
                                                                   M = causal and padding masks

along three paths, whose results agree to float rounding:

* **fused** (training and full forward passes, no weights requested): the projections (hooks
  included), ``rotate``, then ``torch.nn.functional.scaled_dot_product_attention`` with B + M as
  one float ``attn_mask`` in the logits' dtype.  B depends on positions only: it is computed once
  per pass and shape and shared by the side's layers, and broadcasts over the batch (padding is
  merged in only where a batch has some).  Nothing of size B × H × T × S is kept for backward.
* **blockwise** (Lq or value terms, or a B that needs a gradient, while autograd records): torch's
  kernel gives no gradient for a float mask without materialising the probabilities (measured:
  6 layers, T = 2048, 8 heads: 1130 MiB and 13× the time of no mask), and the value term
  Σ_j A_ij a^V_{j−i} needs A itself.  The attention is computed explicitly over blocks of query
  rows (about ``BLOCK_ELEMENTS`` logits each), each block under ``torch.utils.checkpoint``: the
  forward pass keeps only Q, K, V; backward recomputes one block at a time.
* **blocks** (evaluation, no autograd: ``fairseq-generate``'s encoder, validation, ``fairseq-eval-lm``, when the
  whole mask would be large, or ``--pe-attention-kernel blockwise``): SDPA over blocks of query rows, each with its
  own mask (its rows of the bias, causal and padding masks), so memory stays linear in the length.  A Toeplitz bias
  (ALiBi, T5, KERPLE, Sandwich) is a window of one (H, T + S − 1) vector computed once per pass
  (:meth:`~fairseq_pe.positional.base.RelativePositionEncoding.distance_bias`); a causal block reads only the keys
  up to its last row.  The Shaw family computes its blocks explicitly, as the blockwise path.
* **flex** (``--pe-attention-kernel flex``, and ``auto`` for a bias that learns on CUDA when its mask would be
  large): torch's FlexAttention with the encoding's ``score_mod`` computed inside the kernel and causality and
  padding as a block mask (:mod:`fairseq_pe.models.flex`); no (B, H, T, S) tensor in forward or backward.
* **explicit** (step-by-step decoding, ``need_weights``, ``need_head_weights``, ``before_softmax``,
  ``--print-alignment``, the analysis): fairseq's own Python implementation when there is no
  relative encoding (the path stock fairseq takes there too), else the same computation as the
  blockwise path in one block, with the weights returned.

An encoding that computes the logits itself (``own_logits``: FoX, CoPE, DAPE; the logits hook of
:class:`~fairseq_pe.positional.base.RelativePositionEncoding`) takes the explicit path in decoding and the
blockwise path otherwise: its ``attention_logits`` replaces Q Kᵀ/√d + B in each block of rows, reading the
rows' causal and padding masks and the per-key state its ``key_state`` computed from this call's input (FoX's
cumulative forget gates), which step-by-step decoding keeps in fairseq's ``incremental_state`` beside the keys.
"""

import contextlib
import logging
from typing import Callable, Dict, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from fairseq import utils
from fairseq.modules import MultiheadAttention

from fairseq_pe.models import flex
from fairseq_pe.positional.pass_state import BlockMaskKey, MaskKey, current_pass

logger = logging.getLogger(__name__)

#: logits per block of the blockwise path (B·H·rows·S): 4M floats, 16 MiB in float32
BLOCK_ELEMENTS = 1 << 22

#: ``--pe-attention-kernel`` choices (:meth:`PositionAttention.path_of`)
KERNELS = ("auto", "sdpa", "blockwise", "flex")

#: mask elements per block of the blocks path (B·H·rows·S): 1M, 4 MiB in float32; the masks of a block and their
#: temporaries stay a small part of one layer's activations at long lengths (a (T, E) float32 tensor is 32 MiB at
#: T = 16,384, E = 512)
EVAL_BLOCK_ELEMENTS = 1 << 20
#: query rows per block where the mask is a view of one vector (a Toeplitz bias without padding): nothing of the mask
#: per block, a copy of the block's reversed queries and outputs
EVAL_VIEW_BLOCK_ROWS = 1024
#: at least this many query rows per block (fewer calls of SDPA, whose CPU kernel works in tiles of query rows)
EVAL_BLOCK_MIN_ROWS = 16
#: ``auto`` in evaluation: a whole-call mask (B·H·T·S) larger than this (16M elements, 64 MiB in float32) is built
#: per block of query rows instead
AUTO_BLOCKS_ELEMENTS = 1 << 24
#: ``auto`` in training on CUDA: a bias that learns goes to FlexAttention when its (B, H, T, S) mask would hold more
#: than this (the mask, its gradient and the merged copy SDPA keeps for backward: about 3 × 2 bytes each in fp16)
AUTO_FLEX_ELEMENTS = 1 << 26

#: the kernel choices already logged (one line per kind of choice and process)
_logged_choices = set()


def log_choice_once(requested: str, chosen: str, why: str):
    """Log ``--pe-attention-kernel``'s choice once per kind of choice (requested, chosen, why)."""
    key = (requested, chosen, why)
    if key not in _logged_choices:
        _logged_choices.add(key)
        logger.info(f"--pe-attention-kernel {requested}: {chosen} ({why})")

#: within :func:`observing`, called as ``observer(attention, path, **details)`` by every call of a
#: :class:`PositionAttention`, with the path it takes ("fused", "blockwise", "explicit", or "fairseq": fairseq's own
#: Python implementation) and, on the fused path, what it hands to torch's kernel (q, k, v, attn_mask, dropout_p,
#: is_causal); see :mod:`fairseq_pe.models.attention_probe`.  A module variable set only by :func:`observing` (not a
#: ContextVar, whose ``get`` breaks ``torch.compile``'s graph at every attention)
_observer: Optional[Callable] = None


@contextlib.contextmanager
def observing(observer: Callable):
    """Within the block, every call of a :class:`PositionAttention` is reported to ``observer``; the observer of an
    enclosing block is restored at its end."""
    global _observer
    outer, _observer = _observer, observer
    try:
        yield observer
    finally:
        _observer = outer


def autocast_off(device: torch.device, off: bool = True):
    """A region where autocast (fairseq's ``--amp``: CUDA's autocast to fp16) leaves the dtypes as they are, where
    ``off``.  Autocast runs SDPA and ``bmm`` in its lower precision whatever their inputs' dtype: it would cast the
    queries and keys an encoding keeps in float32 (xPos's scaled ones, whose keys leave fp16's range past a few
    thousand positions) back to fp16.  A device type autocast does not know (meta) has nothing to turn off."""
    if off:
        try:
            return torch.autocast(device.type, enabled=False)
        except RuntimeError:
            pass
    return contextlib.nullcontext()


def saturated(bias: Tensor, masking: Optional[Tensor], dtype, shift: bool = True) -> Tensor:
    """A float32 position bias made safe for ``dtype``'s logits (float32; the caller adds ``masking`` and casts).

    A bias can exceed fp16's range (KERPLE-power's −r₁·|i−j|^r₂ passes −65504 at a few hundred tokens; ALiBi,
    FIRE or a trained T5 can too): cast as it is, it becomes −inf, a padding query whose real keys are all that far
    away gets a row of −inf only, the softmax of that row is NaN, and probability 0 × NaN carries it into the real
    tokens of the next layer.  So each row of the bias is shifted by the largest value it has at a key that
    ``masking`` (the causal and padding masks, 0 or −inf) leaves visible, which the softmax does not see (its
    weights are unchanged), and clamped from below at −max/2 of ``dtype`` (fp16: −32752): exp of an entry that far
    below the row's maximum is 0 in any precision, as exp(−inf) is, so the result is unchanged to rounding, and
    the margin keeps q·k + bias finite.  The masks themselves stay −inf, as fairseq's: a query always has a visible
    key (its own, or the first one), so no row is all −inf.  Without ``shift`` (the logits themselves are asked
    for: ``before_softmax``) the bias is only clamped."""
    limit = torch.finfo(dtype).max / 2
    if not shift:
        return bias.clamp(min=-limit)
    visible = bias if masking is None else bias + masking
    top = visible.detach().amax(dim=-1, keepdim=True)
    del visible
    top = torch.nan_to_num(top, nan=0.0, posinf=0.0, neginf=0.0)  # a row without a visible key: no shift
    return (bias - top).clamp(min=-limit)


def merged_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], bias: Optional[Tensor],
                bsz: int, tgt_len: int, src_len: int, dtype, shift: bool = True) -> Optional[Tensor]:
    """One additive mask of ``dtype`` for the logits, broadcastable to (B, H, T, S): fairseq's ``attn_mask``
    (T, S), the padding (B, S, True at padding) and a position bias (H, T, S), or (B, H, T, S) for a bias per
    row (:func:`saturated`), summed in float32.  Each keeps its own size ((1, 1, T, S), (B, 1, 1, S),
    (1, H, T, S)); the sum has the batch dimension only with padding."""
    masking = None
    if attn_mask is not None:
        masking = attn_mask.float().view(1, 1, tgt_len, src_len)
    if key_padding_mask is not None:
        padding = torch.zeros(bsz, 1, 1, src_len, device=key_padding_mask.device).masked_fill_(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        masking = padding if masking is None else masking + padding
    mask = masking
    if bias is not None:
        bias = bias.float()
        bias = bias.unsqueeze(0) if bias.dim() == 3 else bias  # (B, H, T, S): a bias per row (FIRE's offsets)
        bias = saturated(bias, masking, dtype, shift)
        mask = bias if masking is None else bias + masking
    return None if mask is None else kernel_layout(mask, dtype)


#: the alignment (in elements) of a mask's rows that CUDA's memory-efficient kernel reads in place (torch's
#: ``preprocess_mask`` pads and copies a mask whose row stride is not a multiple of it, at every call)
MASK_ALIGNMENT = 16


def aligned_rows(device) -> bool:
    """Whether masks on ``device`` are laid out with aligned rows (:func:`kernel_layout`): on CUDA."""
    return device.type == "cuda"


def kernel_layout(mask: Tensor, dtype) -> Tensor:
    """``mask`` in ``dtype`` laid out as torch's kernels read it without a copy: the last dimension contiguous and,
    where :func:`aligned_rows`, each row starting at a multiple of :data:`MASK_ALIGNMENT` elements (a view of
    (..., S) into storage of (..., S rounded up)).  One copy, the cast's own."""
    src_len = mask.size(-1)
    if not aligned_rows(mask.device):
        return mask.to(dtype).contiguous()
    if mask.stride(-1) == 1 and mask.dtype == dtype and all(
            stride % MASK_ALIGNMENT == 0 or size == 1 for stride, size in zip(mask.stride()[:-1], mask.shape[:-1])):
        return mask
    width = -(-src_len // MASK_ALIGNMENT) * MASK_ALIGNMENT
    laid_out = mask.new_empty(*mask.shape[:-1], width, dtype=dtype)[..., :src_len]
    return laid_out.copy_(mask)


def mask_gradient_fused(device) -> bool:
    """Whether torch's fused kernels on ``device`` give the gradient of a float mask: CUDA's memory-efficient kernel
    does (T5, KERPLE and FIRE then train on the fused path); on the CPU the gradient needs the probabilities, and
    the blockwise path computes them in blocks (module docstring)."""
    return device.type == "cuda"


def safe_softmax(logits: Tensor) -> Tensor:
    """float32 softmax over the last dimension, 0 (and a zero gradient) for a row whose entries are all −inf, as
    torch's fused attention kernels give on CPU, where fairseq's softmax gives NaN."""
    if hasattr(torch.ops.aten, "_safe_softmax"):  # torch >= 2.5: SDPA's own
        if logits.requires_grad:  # its backward takes float32 input only
            return torch.ops.aten._safe_softmax(logits.float(), -1)
        return torch.ops.aten._safe_softmax(logits, -1, torch.float32)
    rows = logits.amax(dim=-1, keepdim=True).isneginf()
    return F.softmax(logits.masked_fill(rows, 0.0), dim=-1, dtype=torch.float32).masked_fill(rows, 0.0)


class PositionAttention(MultiheadAttention):
    """fairseq's attention on SDPA, with a relative encoding's hooks (module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._init_position_attention()

    def _init_position_attention(self):
        # fairseq's fused path reads the projection weights itself (it would skip FLOATER's projection
        # hooks); this class calls torch's kernel itself, so super().forward is always the Python path
        self._set_skip_embed_dim_check()
        #: whether this self-attention uses its side's relative encoding, which it reaches through the pass under
        #: way (:class:`~fairseq_pe.positional.pass_state.PositionPass`), as block :attr:`block`
        self.uses_relative = False
        self.block = 1
        #: decoder self-attention: the ``attn_mask`` fairseq hands it in a full pass is its future mask
        self.future_masked = False
        #: ``--pe-attention-kernel``: which path a call takes where several compute it (:meth:`path_of`)
        self.kernel = "auto"

    @classmethod
    def adopt(cls, attention: MultiheadAttention) -> "PositionAttention":
        """Make a MultiheadAttention that fairseq's ``build_*_attention`` built (with whatever arguments
        its version passes) a PositionAttention: same parameters, same state-dict keys."""
        if type(attention) is not MultiheadAttention:
            raise TypeError(f"expected fairseq's MultiheadAttention, got {type(attention).__name__}")
        attention.__class__ = cls
        attention._init_position_attention()
        return attention

    def attach_relative(self, relative, block: int):
        """Use the side's relative encoding ``relative`` (shared by the side's layers, read from the pass under way)
        as block ``block``."""
        if relative is not None:
            if not self.self_attention:
                raise ValueError("relative position encodings apply to self-attention only "
                                 "(--cross-self-attention is not supported with --pe-relative)")
            if self.bias_k is not None or self.add_zero_attn:
                raise ValueError("--pe-relative does not support add_bias_kv / add_zero_attn")
        self.uses_relative = relative is not None
        self.block = block

    def relative_of_pass(self):
        """The side's relative encoding, from the pass under way (None where this attention uses none)."""
        if not self.uses_relative:
            return None
        position_pass = current_pass()
        if position_pass is None:
            raise RuntimeError("a PositionAttention with a relative encoding was called outside a pass of its encoder "
                               "or decoder: open one with fairseq_pe.positional.pass_state.pass_scope("
                               "injector.build_pass(tokens))")
        return position_pass

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ):
        explicit = need_weights or need_head_weights or before_softmax or incremental_state is not None
        observer = _observer
        if not self.uses_relative and (explicit or self.bias_k is not None or self.add_zero_attn
                                       or self.onnx_trace or key is None):
            if observer is not None:
                observer(self, "fairseq")
            if attn_mask is not None and self.is_future_mask(attn_mask, query.size(0), attn_mask.size(1)):
                # fairseq's own attention reads the mask whole: the future mask's rows, built (not the stand-in)
                attn_mask = self.mask_rows(attn_mask, 0, query.size(0), attn_mask.size(1), True).to(query.dtype)
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                   static_kv, attn_mask, before_softmax, need_head_weights)
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim

        def split_heads(x):  # (T, B, E) -> (B, H, T, d)
            return x.view(-1, bsz, heads, head_dim).permute(1, 2, 0, 3)

        q = split_heads(self.q_proj(query))
        source = query if self.self_attention else key
        k = split_heads(self.k_proj(source))
        v = split_heads(self.v_proj(source if self.self_attention else value))
        position_pass = self.relative_of_pass()
        if position_pass is None:  # cross-attention, or self-attention without a relative encoding
            path = self.path_of(q, None, False, bsz, tgt_len, k.size(2),
                                masked=self.whole_mask(attn_mask, key_padding_mask, tgt_len, k.size(2)))
            run = {"blocks": self._blocks, "flex": self._flex}.get(path, self._fused)
            return run(q, k, v, 0, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim), None

        relative = position_pass.relative
        # what the encoding reads of the pass: the rows' own positions where the keys are padded (a padding mask is
        # what fairseq hands over when it found padding: told without reading the tokens)
        rows = position_pass.relative_rows(padded=key_padding_mask is not None)
        query_offset = 0
        if incremental_state is not None:
            saved = self._get_input_buffer(incremental_state)
            if "prev_key" in saved:
                query_offset = saved["prev_key"].size(2)
        key_state = None
        if relative.own_logits:  # the logits hook's state of every key so far, from this call's input
            new_padding = key_padding_mask if key_padding_mask is not None and key_padding_mask.dim() > 0 else None
            key_state = relative.key_state(query, new_padding, self.block,
                                           saved.get("pe_key_state") if query_offset > 0 else None)
        bias_gradient = torch.is_grad_enabled() and relative.bias_requires_grad
        path = "explicit" if explicit else self.path_of(
            q, relative, bias_gradient, bsz, tgt_len, tgt_len,
            masked=self.whole_mask(attn_mask, key_padding_mask, tgt_len, tgt_len))
        fused = path in ("fused", "flex") or (path == "blocks" and not relative.query_terms
                                               and not relative.own_logits)
        # SDPA scales the logits itself; the other paths take the queries scaled (with RoPE's rotation: no product)
        q, k = relative.rotate(q, k, query_offset, self.block, 1.0 if fused else self.scaling, rows=rows)
        if incremental_state is not None:
            if query_offset > 0:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask, prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz, src_len=k.size(2), static_kv=False)
            saved["prev_key"], saved["prev_value"] = k, v  # (B, H, S, d), as fairseq keeps them
            saved["prev_key_padding_mask"] = key_padding_mask
            if key_state is not None:  # batch first: beam search reorders it with the keys
                saved["pe_key_state"] = key_state
            self._set_input_buffer(incremental_state, saved)

        value_dtype = v.dtype
        # queries and keys kept in float32 by the encoding (xPos's scales in fp16, or under autocast): the attention
        # runs in float32, autocast off (autocast_off), and the output projection gets the values' dtype back
        float32 = q.dtype != v.dtype
        if float32:
            v = v.to(q.dtype)
        if fused:
            run = {"fused": self._fused, "blocks": self._blocks, "flex": self._flex}[path]
            return run(q, k, v, query_offset, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim, value_dtype,
                       float32, relative, rows), None

        src_len = k.size(2)
        if observer is not None:
            observer(self, path)
        rows_out = None
        with autocast_off(q.device, float32):
            if explicit:
                out, probs, logits = self._explicit(relative, rows, q, k, v, attn_mask, key_padding_mask, query_offset,
                                                    0, tgt_len, need_probs=True, before_softmax=before_softmax,
                                                    key_state=key_state)
                if before_softmax:
                    return logits.view(bsz * heads, tgt_len, src_len), v.reshape(bsz * heads, src_len, head_dim)
            else:
                record = torch.is_grad_enabled()
                elements = EVAL_BLOCK_ELEMENTS if path == "blocks" else BLOCK_ELEMENTS
                per_block = max(1, elements // max(1, bsz * heads * src_len))
                if not record and path == "blocks":  # evaluation in linear memory: nothing kept per block
                    rows = rows._replace(memo=None)
                blocks = []
                # evaluation: each block written into the output projection's layout (no list, no concatenation)
                rows_out = None if record else q.new_empty(tgt_len, bsz, heads, head_dim)
                for start in range(0, tgt_len, per_block):
                    end = min(tgt_len, start + per_block)
                    args = (relative, rows, q[:, :, start:end], k, v, attn_mask, key_padding_mask, query_offset, start,
                            end, key_state)
                    if record:
                        blocks.append(checkpoint(self._block, *args, use_reentrant=False))
                    else:
                        rows_out[start:end] = self._block(*args).permute(2, 0, 1, 3)
                out = rows_out if not record else blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)
                probs = None
        if rows_out is not None:  # (T, B, H, d) already
            out = out.view(tgt_len, bsz, embed_dim)
        else:
            out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim)
        out = self.out_proj(out.to(value_dtype))
        weights = None
        if need_weights or need_head_weights:
            weights = probs.transpose(1, 0)  # (H, B, T, S), as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def dropout_p(self) -> float:
        """The attention dropout of this call (fairseq's: in training, or in evaluation with retained dropout)."""
        dropout = self.dropout_module
        return dropout.p if (self.training or dropout.apply_during_inference) else 0.0

    def project_heads(self, out: Tensor, out_dtype=None) -> Tensor:
        """The output projection of the heads' outputs (B, H, T, d): (T, B, E), in ``out_dtype`` where given."""
        bsz, heads, tgt_len, head_dim = out.shape
        out = out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, heads * head_dim)
        return self.out_proj(out if out_dtype is None else out.to(out_dtype))

    def whole_mask(self, attn_mask, key_padding_mask, tgt_len: int, src_len: int) -> bool:
        """Whether the fused path would build a mask of T × S for this call's own masks: fairseq's future mask
        with padding (or a mask other than it); the future mask alone is SDPA's ``is_causal``, padding alone
        (B, 1, 1, S)."""
        if attn_mask is None:
            return False
        padded = key_padding_mask is not None and key_padding_mask.dim() > 0
        return padded or not self.is_future_mask(attn_mask, tgt_len, src_len)

    def is_future_mask(self, attn_mask, tgt_len: int, src_len: int) -> bool:
        """Whether ``attn_mask`` is fairseq's future mask of this call (a decoder self-attention's (T, S) mask in a
        full pass): key j visible iff j ≤ query_offset + i."""
        return self.future_masked and attn_mask is not None and tuple(attn_mask.shape) == (tgt_len, src_len)

    def mask_rows(self, attn_mask, start: int, end: int, keys: int, causal: bool) -> Optional[Tensor]:
        """Rows start..end, keys 0..keys, of fairseq's ``attn_mask``.  Of its future mask (``causal``: key j visible
        iff j ≤ i, a full pass), built for those rows only: the plugin's decoders hand a stand-in of no storage
        (:meth:`~fairseq_pe.models.transformer_pe.TransformerPEDecoder.buffered_future_mask`), never a T × T tensor."""
        if attn_mask is None:
            return None
        if not causal:
            return attn_mask[start:end, :keys]
        rows = torch.arange(start, end, device=attn_mask.device).unsqueeze(1)
        return torch.zeros(end - start, keys, device=attn_mask.device).masked_fill_(
            torch.arange(keys, device=attn_mask.device) > rows, float("-inf"))

    def path_of(self, q: Tensor, relative, bias_gradient: bool, bsz: int, tgt_len: int, src_len: int,
                masked: bool = False) -> str:
        """The path of a call that several paths can compute (not the explicit one), by ``--pe-attention-kernel``
        (:attr:`kernel`): "fused" (SDPA with one mask), "blockwise" (explicit blocks of rows, which training takes
        for query terms, and on the CPU for a bias that learns), "blocks" or "flex" (module docstring).  ``masked``:
        the call's own masks would be built whole (:meth:`whole_mask`); a bias or query terms always are."""
        kernel = self.kernel
        training = torch.is_grad_enabled()
        explicit = relative is not None and (relative.query_terms or relative.own_logits)
        if relative is not None and (explicit or relative.adds_bias):
            masked = True
        elements = bsz * self.num_heads * tgt_len * src_len
        if kernel == "flex" or (kernel == "auto" and training and bias_gradient and flex.flex_backward(q.device)
                                and elements > AUTO_FLEX_ELEMENTS):
            reason = flex.flex_supported(relative, q.device, dropout_p=self.dropout_p())
            if reason is None:
                log_choice_once(kernel, "flex", "FlexAttention, the bias computed inside the kernel")
                return "flex"
            log_choice_once(kernel, "not flex", reason)
        if training:
            if explicit:
                return "blockwise"
            if bias_gradient and (kernel == "blockwise" or not mask_gradient_fused(q.device)):
                return "blockwise"
            return "fused"
        if kernel == "blockwise" or (kernel != "sdpa" and masked and elements > AUTO_BLOCKS_ELEMENTS):
            log_choice_once(kernel, "blocks of query rows in evaluation",
                            "requested" if kernel == "blockwise" else
                            f"masks of more than {AUTO_BLOCKS_ELEMENTS:,} elements are built per block")
            return "blocks"
        return "blockwise" if explicit else "fused"

    def _fused(self, q, k, v, query_offset, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim, out_dtype=None,
               float32=False, relative=None, rows=None):
        """SDPA with one float mask, or ``is_causal`` (module docstring); returns the (T, B, E) output projection.
        ``float32``: the encoding keeps q and k in float32, autocast must not lower them (:func:`autocast_off`);
        ``relative``, ``rows``: the side's relative encoding and what it reads of the pass (None: none)."""
        src_len = k.size(2)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        causal = False
        future = self.is_future_mask(attn_mask, tgt_len, src_len)
        if future and key_padding_mask is None and query_offset == 0 \
                and tgt_len == src_len and (relative is None or not relative.adds_bias):
            # fairseq's future mask is all this attention masks with: the kernel's own causal mask (top-left
            # aligned, the same for T = S) reaches FlashAttention, which takes no float mask
            mask, causal = None, True
        elif relative is not None:  # the same for the layers of a pass that share the bias: built once per pass
            def mask():
                bias = relative.position_bias(tgt_len, src_len, query_offset, self.block, rows=rows)
                return merged_mask(self.mask_rows(attn_mask, 0, tgt_len, src_len, future), key_padding_mask, bias,
                                   bsz, tgt_len, src_len, q.dtype)

            gradient = torch.is_grad_enabled() and relative.bias_requires_grad
            key = MaskKey(bsz, tgt_len, src_len, query_offset, relative.bias_key(self.block), q.dtype,
                          attn_mask is not None, key_padding_mask is not None, gradient)
            mask = rows.shared(key, mask, keep_graph=gradient and not relative.recomputed)
        else:
            mask = merged_mask(self.mask_rows(attn_mask, 0, tgt_len, src_len, future), key_padding_mask, None, bsz,
                               tgt_len, src_len, q.dtype)
        p = self.dropout_p()
        observer = _observer
        if observer is not None:
            observer(self, "fused", q=q, k=k, v=v, attn_mask=mask, dropout_p=p, is_causal=causal)
        with autocast_off(q.device, float32):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                 scale=self.scaling)
        return self.project_heads(out, out_dtype)

    def _blocks(self, q, k, v, query_offset, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim, out_dtype=None,
                float32=False, relative=None, rows=None):
        """SDPA over blocks of query rows, each with the mask of its rows only (module docstring: the blocks path);
        evaluation only (no autograd).  Returns the (T, B, E) output projection."""
        heads, src_len = self.num_heads, k.size(2)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        causal = self.is_future_mask(attn_mask, tgt_len, src_len)
        bias = relative is not None and relative.adds_bias
        vector = padding = low = None
        if bias and relative.toeplitz and rows.positions is None:
            # one (H, T + S − 1) vector of the pass's distances, with the causal mask in it (distances j − i > 0) and
            # made finite in the logits' dtype (as saturated() does; each row keeps its own key, so the shift is not
            # needed for a row to stay finite); each block reads its rows in reverse order, so that its bias
            # [h, a, j] = vector[h, first + a + j] is an unfold view, which SDPA reads in place: no copy per block
            low, high = -(query_offset + tgt_len - 1), src_len - query_offset
            vector = relative.distance_bias(low, high, self.block, rows)
            if causal:
                vector = vector.masked_fill(torch.arange(low, high, device=vector.device) > 0, float("-inf"))
            vector = vector.clamp(min=-torch.finfo(q.dtype).max / 2).to(q.dtype)
            if key_padding_mask is not None:
                padding = torch.zeros(bsz, 1, 1, src_len, device=q.device, dtype=q.dtype).masked_fill_(
                    key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        unshared = None if rows is None else rows._replace(memo=None)  # nothing of a block kept in the pass
        p = self.dropout_p()
        if vector is not None and padding is None:
            # the mask is a view of the vector, which SDPA's kernels read tile by tile, never whole: large blocks
            # (measured, T = 4096, 8 heads of 64, one thread: one call 1.05x the time of no mask, blocks of 512 rows
            # 1.10x, of 128 rows 1.22x), each with a copy of its reversed queries and output only
            per_block = EVAL_VIEW_BLOCK_ROWS
        else:
            per_block = max(EVAL_BLOCK_MIN_ROWS, EVAL_BLOCK_ELEMENTS // max(1, bsz * heads * src_len))
        out = q.new_empty(tgt_len, bsz, heads, q.size(-1))  # the output projection's layout: no copy of it at the end
        observer = _observer
        for start in range(0, tgt_len, per_block):
            end = min(tgt_len, start + per_block)
            offset = query_offset + start
            keys = min(src_len, query_offset + end) if causal else src_len  # later keys are masked for every row
            reverse = vector is not None
            if reverse:  # rows end − 1 .. start: distances from −(offset + rows − 1) on
                first = -(query_offset + end - 1) - low
                mask = vector[:, first:first + (end - start) + keys - 1].unfold(1, keys, 1).unsqueeze(0)
                if padding is not None:
                    mask = mask + padding[..., :keys]
                if attn_mask is not None and not causal:
                    mask = mask + attn_mask[start:end, :keys].flip(0).to(q.dtype)
            else:
                block_bias = relative.position_bias(end - start, keys, offset, self.block, rows=unshared) \
                    if bias else None
                mask = merged_mask(self.mask_rows(attn_mask, start, end, keys, causal),
                                   None if key_padding_mask is None else key_padding_mask[:, :keys], block_bias, bsz,
                                   end - start, keys, q.dtype, shift=q.dtype != torch.float32)
                del block_bias
            block_q, block_k, block_v = q[:, :, start:end], k[:, :, :keys], v[:, :, :keys]
            if reverse:
                block_q = block_q.flip(2)
            if observer is not None:
                observer(self, "blocks", q=block_q, k=block_k, v=block_v, attn_mask=mask, dropout_p=p,
                         is_causal=False)
            with autocast_off(q.device, float32):
                block_out = F.scaled_dot_product_attention(block_q, block_k, block_v, attn_mask=mask, dropout_p=p,
                                                           scale=self.scaling)
            out[start:end] = (block_out.flip(2) if reverse else block_out).permute(2, 0, 1, 3)
            del mask, block_out
        out = out.view(tgt_len, bsz, embed_dim)
        return self.out_proj(out if out_dtype is None else out.to(out_dtype))

    def _flex(self, q, k, v, query_offset, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim, out_dtype=None,
              float32=False, relative=None, rows=None):
        """FlexAttention with the encoding's score_mod (:mod:`fairseq_pe.models.flex`); returns the (T, B, E) output
        projection."""
        src_len = k.size(2)
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None
        causal = self.is_future_mask(attn_mask, tgt_len, src_len)
        if attn_mask is not None and not causal:  # a mask of the caller's own: not a block mask of the lengths
            log_choice_once(self.kernel, "fused", "an attention mask other than fairseq's future mask")
            return self._fused(q, k, v, query_offset, attn_mask, key_padding_mask, tgt_len, bsz, embed_dim,
                               out_dtype, float32, relative, rows)
        p = self.dropout_p()
        observer = _observer
        if observer is not None:
            observer(self, "flex", q=q, k=k, v=v, attn_mask=None, dropout_p=p, is_causal=causal)
        with autocast_off(q.device, float32):
            out = flex.flex_attention_forward(relative, rows, self.block, q, k, v, scale=self.scaling,
                                         query_offset=query_offset, causal=causal, key_padding_mask=key_padding_mask,
                                         dropout_p=p)
        return self.project_heads(out, out_dtype)

    def _block(self, relative, rows, q, k, v, attn_mask, key_padding_mask, query_offset, start, end, key_state=None):
        """Query rows start..end of the attention output (B, H, rows, d), computed explicitly."""
        return self._explicit(relative, rows, q, k, v, attn_mask, key_padding_mask, query_offset, start, end,
                              key_state=key_state)[0]

    def _explicit(self, relative, rows, q, k, v, attn_mask, key_padding_mask, query_offset, start, end,
                  need_probs=False, before_softmax=False, key_state=None):
        """Rows start..end of the attention with every relative term: (output, probabilities, logits).

        ``relative``: the side's relative encoding, ``rows`` what it reads of the pass; ``q`` (B, H, rows, d) is
        scaled; ``k``, ``v`` (B, H, S, d) hold every key.  A single query row (a step of
        step-by-step decoding) takes a relative encoding's query terms into its keys and values instead
        (:meth:`~fairseq_pe.positional.relative_vectors._RelativeVectors.folded_vectors`: q·(k_j + a^K_{j−i}) and
        Σ_j α_ij (v_j + a^V_{j−i}), the same sums), and every layer reads the step's mask, built once.  An
        :attr:`~fairseq_pe.positional.base.RelativePositionEncoding.own_logits` encoding computes the logits itself
        (``attention_logits``, with ``key_state``, its state of every key, and the rows' masks), and no bias is
        merged into the mask."""
        bsz, heads, count, head_dim = q.shape
        src_len = k.size(2)
        offset = query_offset + start
        future = attn_mask is not None and self.is_future_mask(attn_mask, attn_mask.size(0), src_len)
        folded = relative.query_terms and count == 1
        if folded:
            key_vectors, value_vectors = relative.folded_vectors(src_len, offset, self.block, rows=rows)
            k = k + key_vectors.to(k.dtype)
            v = v + value_vectors.to(v.dtype)
        own_logits = relative.own_logits

        def mask():
            bias = None if own_logits else relative.position_bias(end - start, src_len, offset, self.block, rows=rows)
            return merged_mask(self.mask_rows(attn_mask, start, end, src_len, future), key_padding_mask, bias, bsz,
                               count, src_len, q.dtype, shift=not before_softmax)

        mask = rows.shared(BlockMaskKey(bsz, start, end, offset, src_len, relative.bias_key(self.block), q.dtype,
                                        attn_mask is not None, key_padding_mask is not None, before_softmax), mask)
        flat_q = q.reshape(bsz * heads, count, head_dim)
        if own_logits:  # the logits hook (FoX, CoPE, DAPE): float32 or q's dtype
            logits = relative.attention_logits(q, k, offset, self.block, rows=rows, state=key_state, masking=mask)
        else:
            logits = torch.bmm(flat_q, k.reshape(bsz * heads, src_len, head_dim).transpose(1, 2))
            logits = logits.view(bsz, heads, count, src_len)
        # in place from here on: no more (B, H, rows, S) copies (bmm's backward needs q and k, not its output)
        if not folded:
            term = relative.logit_terms(flat_q, count, src_len, offset, self.block, rows=rows)
            if term is not None:
                logits.add_(term.to(logits.dtype))
                del term
        if mask is not None:
            logits.add_(mask)
        if before_softmax:
            return None, None, logits
        probs_float = utils.softmax(logits, dim=-1, onnx_trace=True) if self.onnx_trace else safe_softmax(logits)
        probs = self.dropout_module(probs_float.to(v.dtype))
        flat_probs = probs.view(bsz * heads, count, src_len)
        out = torch.bmm(flat_probs, v.reshape(bsz * heads, src_len, head_dim))
        if not folded:
            values = relative.value_terms(flat_probs, count, src_len, offset, self.block, rows=rows)
            if values is not None:
                out = out + values.to(out.dtype)
        return out.view(bsz, heads, count, head_dim), (probs_float if need_probs else None), None
