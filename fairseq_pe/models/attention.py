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
from typing import Dict, NamedTuple, Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from fairseq import utils
from fairseq.modules import MultiheadAttention

from fairseq_pe.models import flex
from fairseq_pe.models.capabilities import DEVICE, DeviceCapabilities
from fairseq_pe.models.relative_vector_blocks import relative_vector_blocks
from fairseq_pe.positional.pass_state import BlockMaskKey, MaskKey, RelativeRows, current_pass

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
    """A position bias made safe for ``dtype``'s logits, in its own dtype (float32, float64 in a float64 model: the
    caller adds ``masking`` and casts).

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
    limit = min(torch.finfo(dtype).max, torch.finfo(bias.dtype).max) / 2
    if not shift:
        return bias.clamp(min=-limit)
    visible = bias if masking is None else bias + masking
    top = visible.detach().amax(dim=-1, keepdim=True)
    del visible
    top = torch.nan_to_num(top, nan=0.0, posinf=0.0, neginf=0.0)  # a row without a visible key: no shift
    return (bias - top).clamp(min=-limit)


def merged_mask(attn_mask: Optional[Tensor], key_padding_mask: Optional[Tensor], bias: Optional[Tensor],
                bsz: int, tgt_len: int, src_len: int, dtype, shift: bool = True,
                aligned: bool = False) -> Optional[Tensor]:
    """One additive mask of ``dtype`` for the logits, broadcastable to (B, H, T, S): fairseq's ``attn_mask``
    (T, S), the padding (B, S, True at padding) and a position bias (H, T, S), or (B, H, T, S) for a bias per
    row (:func:`saturated`), summed in float32 (float64 for a float64 ``dtype``: never below the logits' precision).
    Each keeps its own size ((1, 1, T, S), (B, 1, 1, S), (1, H, T, S)); the sum has the batch dimension only with
    padding."""
    summed = torch.float64 if dtype == torch.float64 else torch.float32  # torch.promote_types is an operator
    masking = None
    if attn_mask is not None:
        masking = attn_mask.to(summed).view(1, 1, tgt_len, src_len)
    if key_padding_mask is not None:
        padding = torch.zeros(bsz, 1, 1, src_len, device=key_padding_mask.device, dtype=summed).masked_fill_(
            key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        masking = padding if masking is None else masking + padding
    mask = masking
    if bias is not None:
        bias = bias.to(summed)
        bias = bias.unsqueeze(0) if bias.dim() == 3 else bias  # (B, H, T, S): a bias per row (FIRE's offsets)
        bias = saturated(bias, masking, dtype, shift)
        mask = bias if masking is None else bias + masking
    return None if mask is None else kernel_layout(mask, dtype, aligned)


#: the alignment (in elements) of a mask's rows that CUDA's memory-efficient kernel reads in place (torch's
#: ``preprocess_mask`` pads and copies a mask whose row stride is not a multiple of it, at every call)
MASK_ALIGNMENT = 16


def kernel_layout(mask: Tensor, dtype, aligned: bool = False) -> Tensor:
    """``mask`` in ``dtype`` laid out as torch's kernels read it without a copy: the last dimension contiguous and,
    where ``aligned`` (:meth:`~fairseq_pe.models.capabilities.DeviceCapabilities.aligned_rows`), each row starting
    at a multiple of :data:`MASK_ALIGNMENT` elements (a view of
    (..., S) into storage of (..., S rounded up)).  One copy, the cast's own."""
    src_len = mask.size(-1)
    if not aligned:
        return mask.to(dtype).contiguous()
    if mask.stride(-1) == 1 and mask.dtype == dtype and all(
            stride % MASK_ALIGNMENT == 0 or size == 1 for stride, size in zip(mask.stride()[:-1], mask.shape[:-1])):
        return mask
    width = -(-src_len // MASK_ALIGNMENT) * MASK_ALIGNMENT
    laid_out = mask.new_empty(*mask.shape[:-1], width, dtype=dtype)[..., :src_len]
    return laid_out.copy_(mask)


def safe_softmax(logits: Tensor) -> Tensor:
    """float32 softmax over the last dimension, 0 (and a zero gradient) for a row whose entries are all −inf, as
    torch's fused attention kernels give on CPU, where fairseq's softmax gives NaN."""
    if hasattr(torch.ops.aten, "_safe_softmax"):  # torch >= 2.5: SDPA's own
        if logits.requires_grad:  # its backward takes float32 input only
            return torch.ops.aten._safe_softmax(logits.float(), -1)
        return torch.ops.aten._safe_softmax(logits, -1, torch.float32)
    rows = logits.amax(dim=-1, keepdim=True).isneginf()
    return F.softmax(logits.masked_fill(rows, 0.0), dim=-1, dtype=torch.float32).masked_fill(rows, 0.0)


class Call(NamedTuple):
    """One attention call as the planner (:meth:`PositionAttention.plan`) normalised it: what every backend reads.

    ``q`` (B, H, T, d) rotated, scaled by 1/√d for the explicit backends (``blockwise``, ``explicit``) and not for
    SDPA's and FlexAttention's, which scale themselves; ``k``, ``v`` (B, H, S, d): every key, the cache's and this
    call's; ``query_offset``: the first query row's index among the keys (step-by-step decoding); ``attn_mask``:
    fairseq's (T, S) mask, or the stand-in of its future mask where ``causal``; ``key_padding_mask``: (B, S), True at
    padding, of every key, None where nothing is padded; ``relative``: the side's relative encoding (None: none) and
    ``rows`` what it reads of the pass (:class:`~fairseq_pe.positional.pass_state.RelativeRows`); ``key_state``: an
    ``own_logits`` encoding's state of every key; ``out_dtype``: the output projection's dtype; ``float32``: the
    encoding keeps q and k in float32, autocast must not lower them (:func:`autocast_off`)."""
    q: Tensor
    k: Tensor
    v: Tensor
    query_offset: int
    attn_mask: Optional[Tensor]
    key_padding_mask: Optional[Tensor]
    causal: bool
    relative: object
    rows: RelativeRows
    key_state: object
    out_dtype: torch.dtype
    float32: bool

    @property
    def sizes(self):
        """(B, H, T, S)."""
        bsz, heads, tgt_len, _ = self.q.shape
        return bsz, heads, tgt_len, self.k.size(2)


#: the backends (:meth:`PositionAttention.plan`'s choices) whose kernel scales the queries itself (``blocks``: where
#: it runs SDPA, not :func:`explicit_terms`)
SCALING_BACKENDS = ("sdpa", "flex", "blocks")


def explicit_terms(relative) -> bool:
    """Whether ``relative`` (None: none) needs the logits written out: query terms (the Shaw family) or its own logits
    (the logits hook: FoX, CoPE, DAPE, ReRoPE)."""
    return relative is not None and (relative.query_terms or relative.own_logits)


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
        #: the side's injector, whose passes only this attention reads (None: any; an attention used on its own)
        object.__setattr__(self, "pass_owner", None)
        #: decoder self-attention: the ``attn_mask`` fairseq hands it in a full pass is its future mask
        self.future_masked = False
        #: ``--pe-attention-kernel``: which backend a call takes where several compute it (:meth:`plan`)
        self.kernel = "auto"

    #: what the device's kernels can do (:mod:`fairseq_pe.models.capabilities`): the process's, unless an instrument
    #: injects others into this module for its block (:mod:`fairseq_pe.diagnostics.capabilities`)
    capabilities: DeviceCapabilities = DEVICE

    @classmethod
    def adopt(cls, attention: MultiheadAttention) -> "PositionAttention":
        """Make a MultiheadAttention that fairseq's ``build_*_attention`` built (with whatever arguments
        its version passes) a PositionAttention: same parameters, same state-dict keys."""
        if type(attention) is not MultiheadAttention:
            raise TypeError(f"expected fairseq's MultiheadAttention, got {type(attention).__name__}")
        attention.__class__ = cls
        attention._init_position_attention()
        return attention

    def attach_relative(self, relative, block: int, owner=None):
        """Use the side's relative encoding ``relative`` (shared by the side's layers, read from the pass under way)
        as block ``block``; ``owner``: the side's injector, the only one whose passes this attention reads."""
        if relative is not None:
            if not self.self_attention:
                raise ValueError("relative position encodings apply to self-attention only "
                                 "(--cross-self-attention is not supported with --pe-relative)")
            if self.bias_k is not None or self.add_zero_attn:
                raise ValueError("--pe-relative does not support add_bias_kv / add_zero_attn")
        self.uses_relative = relative is not None
        self.block = block
        object.__setattr__(self, "pass_owner", owner)  # a plain reference: the injector is its side's submodule

    def relative_of_pass(self):
        """The pass under way in this thread, whose relative encoding this attention uses (None where it uses
        none); a pass of another side or model is refused (:class:`~fairseq_pe.positional.pass_state
        .PassOwnerError`)."""
        if not self.uses_relative:
            return None
        position_pass = current_pass(self.pass_owner)
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
        if not self.uses_relative and (need_weights or need_head_weights or before_softmax or self.bias_k is not None
                                       or self.add_zero_attn or self.onnx_trace or key is None):
            # the weights or logits asked for without a relative encoding (the cross-attention of fairseq's
            # alignment layer, whose rows always have a real key), and what the plugin's backends do not compute:
            # fairseq's own Python implementation, as stock fairseq runs it
            if attn_mask is not None and self.is_future_mask(attn_mask, query.size(0), attn_mask.size(1)):
                # fairseq's own attention reads the mask whole: the future mask's rows, built (not the stand-in)
                attn_mask = self.mask_rows(attn_mask, 0, query.size(0), attn_mask.size(1), True).to(query.dtype)
            return super().forward(query, key, value, key_padding_mask, incremental_state, need_weights,
                                   static_kv, attn_mask, before_softmax, need_head_weights)
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim
        if key_padding_mask is not None and key_padding_mask.dim() == 0:
            key_padding_mask = None

        def split_heads(x):  # (T, B, E) -> (B, H, T, d)
            return x.view(-1, bsz, heads, head_dim).permute(1, 2, 0, 3)

        saved = None if incremental_state is None else self._get_input_buffer(incremental_state)
        cached = saved is not None and "prev_key" in saved
        q = split_heads(self.q_proj(query))
        if static_kv and cached:  # cross-attention while decoding: the source's keys and values, projected once
            k, v, new_padding = saved["prev_key"], saved["prev_value"], None
        else:
            source = query if self.self_attention else key
            k = split_heads(self.k_proj(source))
            v = split_heads(self.v_proj(source if self.self_attention else value))
            new_padding = key_padding_mask
        query_offset = saved["prev_key"].size(2) if cached and not static_kv else 0
        position_pass = self.relative_of_pass()
        relative = None if position_pass is None else position_pass.relative
        key_state = None
        if relative is not None and relative.own_logits:  # the logits hook's state of every key so far
            key_state = relative.key_state(query, new_padding, self.block,
                                           saved.get("pe_key_state") if query_offset > 0 else None)
        if saved is not None:  # the padding of every key, the cache's and this call's, before anything reads it
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask, prev_key_padding_mask=saved.get("prev_key_padding_mask"),
                batch_size=bsz, src_len=query_offset + k.size(2), static_kv=static_kv)
        # what the encoding reads of the pass: the rows' own positions where some key is padded (told by the masks
        # fairseq hands over, the cache's included: no host sync)
        rows = RelativeRows() if position_pass is None else \
            position_pass.relative_rows(padded=key_padding_mask is not None)
        src_len = query_offset + k.size(2)
        backend = self.plan(relative, bsz, tgt_len, src_len, attn_mask, key_padding_mask, q.device,
                            weights=need_weights or need_head_weights or before_softmax,
                            incremental=incremental_state is not None)
        # SDPA and FlexAttention scale the logits themselves; the explicit backends take the queries scaled (with
        # RoPE's rotation: no product of its own)
        scaled = backend not in SCALING_BACKENDS or (backend == "blocks" and explicit_terms(relative))
        if relative is not None:
            q, k = relative.rotate(q, k, query_offset, self.block, self.scaling if scaled else 1.0, rows=rows)
        elif scaled:
            q = q * self.scaling
        if saved is not None:
            if query_offset > 0:
                k = torch.cat([saved["prev_key"], k], dim=2)
                v = torch.cat([saved["prev_value"], v], dim=2)
            saved["prev_key"], saved["prev_value"] = k, v  # (B, H, S, d), as fairseq keeps them
            saved["prev_key_padding_mask"] = key_padding_mask
            if key_state is not None:  # batch first: beam search reorders it with the keys
                saved["pe_key_state"] = key_state
            self._set_input_buffer(incremental_state, saved)
        out_dtype = v.dtype
        # queries and keys kept in float32 by the encoding (xPos's scales in fp16, or under autocast): the attention
        # runs in float32, autocast off (autocast_off), and the output projection gets the values' dtype back
        float32 = q.dtype != v.dtype
        if float32:
            v = v.to(q.dtype)
        call = Call(q, k, v, query_offset, attn_mask, key_padding_mask,
                    self.is_future_mask(attn_mask, tgt_len, src_len), relative, rows, key_state, out_dtype, float32)
        if backend != "explicit":
            return getattr(self, "_" + backend)(call), None
        with autocast_off(q.device, float32):
            out, probs, logits = self._explicit(call, 0, tgt_len, need_probs=True, before_softmax=before_softmax)
        if before_softmax:
            return logits.view(bsz * heads, tgt_len, src_len), v.reshape(bsz * heads, src_len, head_dim)
        out = self.out_proj(out.permute(2, 0, 1, 3).reshape(tgt_len, bsz, embed_dim).to(out_dtype))
        weights = None
        if need_weights or need_head_weights:
            weights = probs.transpose(1, 0)  # (H, B, T, S), as fairseq returns them
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights

    def plan(self, relative, bsz: int, tgt_len: int, src_len: int, attn_mask, key_padding_mask, device,
             weights: bool = False, incremental: bool = False) -> str:
        """The backend of a call: ``explicit`` (the weights or the logits asked for; a relative encoding's decoding
        step), ``sdpa`` (one mask), ``blockwise`` (explicit blocks of query rows, checkpointed when autograd
        records), ``blocks`` (SDPA over blocks of query rows, evaluation) or ``flex`` (module docstring).

        Decided from the module's own state and the call's sizes and masks, by ``--pe-attention-kernel``
        (:attr:`kernel`): training is ``self.training``, never the grad mode, so that a forward under
        ``--checkpoint-activations`` (run without autograd) and its recomputation in backward (with it) take the
        same backend and draw the same dropout.  The choice is logged once per kind."""
        if weights or self.kernel == "explicit":  # "explicit": every call written out (the tests' reference)
            return "explicit"
        if incremental and explicit_terms(relative):
            # a decoding step: the Shaw family's terms folded into the keys and values of one query row, SDPA then
            # computes it (:meth:`_sdpa`); the logits hook's encodings write their logits out
            return "sdpa" if tgt_len == 1 and not relative.own_logits else "explicit"
        kernel, training, capabilities = self.kernel, self.training, self.capabilities
        query_terms = explicit_terms(relative)
        learns = training and relative is not None and relative.bias_requires_grad
        masked = query_terms or (relative is not None and relative.adds_bias) or \
            self.whole_mask(attn_mask, key_padding_mask, tgt_len, src_len)
        elements = bsz * self.num_heads * tgt_len * src_len
        if not incremental and (kernel == "flex" or (kernel == "auto" and learns and elements > AUTO_FLEX_ELEMENTS
                                                     and capabilities.flex_backward(device))):
            reason = flex.flex_supported(relative, device, dropout_p=self.dropout_p(), training=training,
                                         dtype=self.q_proj.weight.dtype, capabilities=capabilities)
            if reason is None and attn_mask is not None and not self.is_future_mask(attn_mask, tgt_len, src_len):
                reason = "an attention mask other than fairseq's future mask"
            if reason is None:
                log_choice_once(kernel, "flex", "FlexAttention, the bias computed inside the kernel")
                return "flex"
            log_choice_once(kernel, "not flex", reason)
        if training:
            if query_terms or (learns and (kernel == "blockwise" or not capabilities.mask_gradient_fused(device))):
                return "blockwise"
            return "sdpa"
        if kernel == "blockwise" or (kernel != "sdpa" and masked and elements > AUTO_BLOCKS_ELEMENTS):
            log_choice_once(kernel, "blocks of query rows in evaluation",
                            "requested" if kernel == "blockwise" else
                            f"masks of more than {AUTO_BLOCKS_ELEMENTS:,} elements are built per block")
            return "blocks"
        return "blockwise" if query_terms else "sdpa"

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

    # ---- the backends: one signature, (call) -> the (T, B, E) output projection ------------------------------------

    def _sdpa(self, call: Call) -> Tensor:
        """SDPA with one float mask, or ``is_causal`` (module docstring: the fused path)."""
        q, k, v, relative = call.q, call.k, call.v, call.relative
        bsz, _, tgt_len, src_len = call.sizes
        attn_mask, key_padding_mask, query_offset = call.attn_mask, call.key_padding_mask, call.query_offset
        aligned = self.capabilities.aligned_rows(q.device)
        if relative is not None and relative.query_terms:  # one query row (plan): q·(k_j + a^K), Σ α (v_j + a^V)
            key_vectors, value_vectors = relative.folded_vectors(src_len, query_offset, self.block, rows=call.rows)
            k, v = k + key_vectors.to(k.dtype), v + value_vectors.to(v.dtype)
        causal = False
        if call.causal and key_padding_mask is None and query_offset == 0 \
                and tgt_len == src_len and (relative is None or not relative.adds_bias):
            # fairseq's future mask is all this attention masks with: the kernel's own causal mask (top-left
            # aligned, the same for T = S) reaches FlashAttention, which takes no float mask
            mask, causal = None, True
        elif relative is not None:  # the same for the layers of a pass that share the bias: built once per pass
            def mask():
                bias = relative.position_bias(tgt_len, src_len, query_offset, self.block, rows=call.rows)
                return merged_mask(self.mask_rows(attn_mask, 0, tgt_len, src_len, call.causal), key_padding_mask,
                                   bias, bsz, tgt_len, src_len, q.dtype, aligned=aligned)

            gradient = torch.is_grad_enabled() and relative.bias_requires_grad
            key = MaskKey(bsz, tgt_len, src_len, query_offset, relative.bias_key(self.block), q.dtype,
                          attn_mask is not None, key_padding_mask is not None, gradient)
            mask = call.rows.shared(key, mask, keep_graph=gradient and not relative.recomputed)
        else:
            mask = merged_mask(self.mask_rows(attn_mask, 0, tgt_len, src_len, call.causal), key_padding_mask, None,
                               bsz, tgt_len, src_len, q.dtype, aligned=aligned)
        p = self.dropout_p()
        with autocast_off(q.device, call.float32):
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=p, is_causal=causal,
                                                 scale=self.scaling)
        return self.project_heads(out, call.out_dtype)

    def _blocks(self, call: Call) -> Tensor:
        """SDPA over blocks of query rows, each with the mask of its rows only (module docstring: the blocks path);
        the Shaw family's and the logits hook's blocks explicitly (:meth:`_blockwise`)."""
        relative = call.relative
        if explicit_terms(relative):
            if self.relative_vectors_on_sdpa(call):
                out = call.q.new_empty(call.q.size(2), call.q.size(0), call.q.size(1), call.q.size(3))
                with autocast_off(call.q.device, call.float32):
                    relative_vector_blocks(relative, self.block, call.q, call.k, call.v, call.query_offset,
                                           call.causal, call.key_padding_mask, out, EVAL_BLOCK_ELEMENTS,
                                           EVAL_BLOCK_MIN_ROWS)
                return self.project_heads(out.permute(1, 2, 0, 3), call.out_dtype)
            return self._blockwise(call, EVAL_BLOCK_ELEMENTS)
        q, k, v, rows = call.q, call.k, call.v, call.rows
        bsz, heads, tgt_len, src_len = call.sizes
        attn_mask, key_padding_mask, query_offset, causal = (call.attn_mask, call.key_padding_mask,
                                                             call.query_offset, call.causal)
        bias = relative is not None and relative.adds_bias
        aligned = self.capabilities.aligned_rows(q.device)
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
        unshared = rows.unshared()  # nothing of a block kept in the pass
        p = self.dropout_p()
        if vector is not None and padding is None:
            # the mask is a view of the vector, which SDPA's kernels read tile by tile, never whole: large blocks
            # (measured, T = 4096, 8 heads of 64, one thread: one call 1.05x the time of no mask, blocks of 512 rows
            # 1.10x, of 128 rows 1.22x), each with a copy of its reversed queries and output only
            per_block = EVAL_VIEW_BLOCK_ROWS
        else:
            per_block = max(EVAL_BLOCK_MIN_ROWS, EVAL_BLOCK_ELEMENTS // max(1, bsz * heads * src_len))
        out = q.new_empty(tgt_len, bsz, heads, q.size(-1))  # the output projection's layout: no copy of it at the end
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
                                   end - start, keys, q.dtype, shift=q.dtype != torch.float32, aligned=aligned)
                del block_bias
            block_q, block_k, block_v = q[:, :, start:end], k[:, :, :keys], v[:, :, :keys]
            if reverse:
                block_q = block_q.flip(2)
            with autocast_off(q.device, call.float32):
                block_out = F.scaled_dot_product_attention(block_q, block_k, block_v, attn_mask=mask, dropout_p=p,
                                                           scale=self.scaling)
            out[start:end] = (block_out.flip(2) if reverse else block_out).permute(2, 0, 1, 3)
            del mask, block_out
        out = out.view(tgt_len, bsz, heads * q.size(-1))
        return self.out_proj(out.to(call.out_dtype))

    def _flex(self, call: Call) -> Tensor:
        """FlexAttention with the encoding's score_mod (:mod:`fairseq_pe.models.flex`)."""
        p = self.dropout_p()
        with autocast_off(call.q.device, call.float32):
            out = flex.flex_attention_forward(call.relative, call.rows, self.block, call.q, call.k, call.v,
                                              scale=self.scaling, query_offset=call.query_offset, causal=call.causal,
                                              key_padding_mask=call.key_padding_mask, dropout_p=p)
        return self.project_heads(out, call.out_dtype)

    def relative_vectors_on_sdpa(self, call: Call) -> bool:
        """Whether the blocks of a Shaw-family encoding run on SDPA (:mod:`.relative_vector_blocks`): its distances
        are the indices' (no randomised positions), no attention mask but the causal one, no dropout, float32 or
        float64, and a kernel that returns the log-sum-exp (:class:`~.capabilities.DeviceCapabilities`)."""
        relative = call.relative
        return (relative.query_terms and not relative.own_logits and call.rows.positions is None
                and (call.attn_mask is None or call.causal) and self.dropout_p() == 0
                and call.q.dtype in (torch.float32, torch.float64) and call.v.dtype == call.q.dtype
                and not self.capabilities.relative_vectors_explicit(call.q.device))

    def _blockwise(self, call: Call, elements: int = BLOCK_ELEMENTS) -> Tensor:
        """The attention computed explicitly over blocks of query rows (about ``elements`` logits each): each block
        checkpointed where autograd records (backward recomputes one block at a time, with the forward's dropout),
        else written into the output projection's layout.  A block reads only the pass's values of O(T + S)
        (:meth:`~fairseq_pe.positional.pass_state.RelativeRows.unshared`): nothing of a block's T × S stays in the
        pass."""
        bsz, heads, tgt_len, src_len = call.sizes
        head_dim = call.q.size(-1)
        call = call._replace(rows=call.rows.unshared())
        per_block = max(1, elements // max(1, bsz * heads * src_len))
        record = torch.is_grad_enabled()
        with autocast_off(call.q.device, call.float32):
            if record:
                blocks = [checkpoint(self._block, call, start, min(tgt_len, start + per_block), use_reentrant=False)
                          for start in range(0, tgt_len, per_block)]
                out = (blocks[0] if len(blocks) == 1 else torch.cat(blocks, dim=2)).permute(2, 0, 1, 3)
            else:  # each block written into the output projection's layout (no list, no concatenation)
                out = call.q.new_empty(tgt_len, bsz, heads, head_dim)
                for start in range(0, tgt_len, per_block):
                    end = min(tgt_len, start + per_block)
                    out[start:end] = self._block(call, start, end).permute(2, 0, 1, 3)
        return self.out_proj(out.reshape(tgt_len, bsz, heads * head_dim).to(call.out_dtype))

    def _block(self, call: Call, start: int, end: int) -> Tensor:
        """Query rows start..end of the attention output (B, H, rows, d), computed explicitly."""
        return self._explicit(call, start, end)[0]

    def _explicit(self, call: Call, start: int, end: int, need_probs=False, before_softmax=False):
        """Rows start..end of the attention with every relative term: (output, probabilities, logits).

        ``call.q`` is scaled.  A single query row (a step of step-by-step decoding) takes a relative encoding's
        query terms into its keys and values instead
        (:meth:`~fairseq_pe.positional.relative_vectors._RelativeVectors.folded_vectors`: q·(k_j + a^K_{j−i}) and
        Σ_j α_ij (v_j + a^V_{j−i}), the same sums), and every layer reads the step's mask, built once.  An
        :attr:`~fairseq_pe.positional.base.RelativePositionEncoding.own_logits` encoding computes the logits itself
        (``attention_logits``, with ``key_state``, its state of every key, and the rows' masks), and no bias is
        merged into the mask.  A row whose every key is masked gets probabilities 0 (:func:`safe_softmax`), as
        SDPA gives, never NaN."""
        relative, rows, k, v = call.relative, call.rows, call.k, call.v
        q = call.q if start == 0 and end == call.q.size(2) else call.q[:, :, start:end]
        bsz, heads, count, head_dim = q.shape
        src_len = k.size(2)
        offset = call.query_offset + start
        attn_mask, key_padding_mask = call.attn_mask, call.key_padding_mask
        folded = relative is not None and relative.query_terms and count == 1
        if folded:
            key_vectors, value_vectors = relative.folded_vectors(src_len, offset, self.block, rows=rows)
            k = k + key_vectors.to(k.dtype)
            v = v + value_vectors.to(v.dtype)
        own_logits = relative is not None and relative.own_logits
        adds_bias = relative is not None and not own_logits

        def mask():
            bias = relative.position_bias(end - start, src_len, offset, self.block, rows=rows) if adds_bias else None
            return merged_mask(self.mask_rows(attn_mask, start, end, src_len, call.causal), key_padding_mask, bias,
                               bsz, count, src_len, q.dtype, shift=not before_softmax)

        mask = rows.shared(BlockMaskKey(bsz, start, end, offset, src_len,
                                        relative.bias_key(self.block) if relative is not None else None, q.dtype,
                                        attn_mask is not None, key_padding_mask is not None, before_softmax), mask)
        if own_logits:  # the logits hook (FoX, CoPE, DAPE): float32 or q's dtype; its terms are in its logits
            logits = relative.attention_logits(q, k, offset, self.block, rows=rows, state=call.key_state,
                                               masking=mask)
        else:
            flat_q = q.reshape(bsz * heads, count, head_dim)
            logits = torch.bmm(flat_q, k.reshape(bsz * heads, src_len, head_dim).transpose(1, 2))
            logits = logits.view(bsz, heads, count, src_len)
        # in place from here on: no more (B, H, rows, S) copies (bmm's backward needs q and k, not its output)
        if relative is not None and not folded and not own_logits:
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
        if relative is not None and not folded:
            values = relative.value_terms(flat_probs, count, src_len, offset, self.block, rows=rows)
            if values is not None:
                out = out + values.to(out.dtype)
        return out.view(bsz, heads, count, head_dim), (probs_float if need_probs else None), None
