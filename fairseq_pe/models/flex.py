"""Attention with a relative encoding's bias computed inside FlexAttention (Dong et al. 2024, "Flex Attention: A
Programming Model for Generating Optimized Attention Kernels", arXiv 2412.05496; ``torch.nn.attention.flex_attention``).

FlexAttention takes the attention as two small functions of the indices (batch b, head h, query q, key kv) that it
compiles into a fused kernel:

* a ``score_mod(score, b, h, q, kv)``: here the encoding's bias added to the scaled logit.  Nothing of size
  (B, H, T, S) exists: the kernel reads, per logit, one entry of the encoding's small state, as the torch docs'
  ALiBi and T5 examples do ("FlexAttention: The Flexibility of PyTorch with the Performance of FlashAttention"):

  - a Toeplitz encoding (ALiBi, T5, KERPLE log/power, Sandwich): its (H, T + S − 1) bias of each signed distance
    (:meth:`~fairseq_pe.positional.base.RelativePositionEncoding.distance_bias`), read at ``kv − q + T − 1``;
    with randomised positions the same vector over −bound .. bound, read at ``pos[b, kv] − pos[b, q] + bound``
    (:meth:`~fairseq_pe.positional.base.RelativePositionEncoding.score_mod`);
  - FIRE: f_θ of the quotient of the query's and key's positions, the MLP's 32 ReLU units unrolled in the kernel
    (:meth:`~fairseq_pe.positional.fire.FirePositionBias.score_mod`);
  - the Shaw family's key term q·a^K as a per-distance logit table (B, H, T, 2K + 1); their value term
    Σ_j α_ij a^V_{j−i} needs the probabilities, which a score_mod never sees: :func:`flex_supported` refuses them.

  The gradients of the captured tensors (T5's table, KERPLE's r₁ r₂, FIRE's θ) are computed by FlexAttention's
  backward (CUDA; the CPU has no FlexAttention backward).
* a block mask (:class:`~torch.nn.attention.flex_attention.BlockMask`): fairseq's causal mask and the key padding,
  built per (query block, key block) from the padding mask (B, S) and the sizes (:func:`block_mask`), never from a
  (B, T, S) tensor: blocks with no visible key are skipped, blocks with every key visible run without the mask.

Compilation is bounded: one compiled ``flex_attention`` for the process (:func:`compiled_flex_attention`), the
lengths rounded up to a few buckets (:func:`bucket`: multiples of 128 up to 1,024, then eight per octave), the extra
keys masked and the extra query rows dropped, and the batch too (:func:`batch_bucket`: exact up to 4, then four per
octave; the extra rows are zeros, dropped); every per-call value the kernels read (the bias vector, the positions,
the padding, the query offset) is a captured tensor whose shape depends on the buckets only.  Measured on the CPU
(2 cores): about 8 s per new kernel (17 s for the first), 10 kernels for 20 batches of 4,096 tokens of random
lengths 20 .. 600.

:func:`dense_score_bias` evaluates a score_mod densely on small shapes: the tests compare it, values and gradients,
with the encoding's ``position_bias`` (tests/test_flex.py).
"""

import functools
import logging
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from fairseq_pe.models.capabilities import DEVICE, DeviceCapabilities
from fairseq_pe.positional.pass_state import FlexBlockMaskKey

try:
    from torch.nn.attention.flex_attention import BlockMask, flex_attention
except ImportError:  # torch < 2.5
    BlockMask = flex_attention = None

logger = logging.getLogger(__name__)

#: FlexAttention's block (query rows and keys per block of the block mask)
BLOCK = 128
#: lengths up to this are rounded up to multiples of BLOCK; longer ones to eight buckets per power of two
LINEAR_BUCKETS_UP_TO = 1024


def flex_supported(relative, device, dropout_p: float = 0.0, training: bool = False,
                   dtype: Optional[torch.dtype] = None, capabilities: DeviceCapabilities = DEVICE) -> Optional[str]:
    """None when :func:`flex_attention_forward` computes this attention (``relative``: the side's relative encoding,
    None for none) on ``device``, else why not (for the log).  ``training``: the module's mode (never the grad mode,
    which differs between a checkpointed forward and its recomputation): the CPU has FlexAttention's forward only.
    ``capabilities``: the attention's (:mod:`fairseq_pe.models.capabilities`)."""
    if flex_attention is None:
        return f"torch without flex_attention (torch {torch.__version__}; FlexAttention needs torch 2.5 or newer)"
    if relative is not None and relative.query_terms:
        return (f"--pe-relative {getattr(relative, 'registry_name', type(relative).__name__)} has value vectors: "
                "its value terms Σ_j α_ij a^V_(j−i) need the probabilities, which a score_mod cannot give")
    if relative is not None and relative.own_logits:
        return (f"--pe-relative {getattr(relative, 'registry_name', type(relative).__name__)} computes the logits "
                "itself (from all of a row's logits, or the layer's input), which a score_mod of one logit cannot")
    if relative is not None and relative.adds_bias and not has_score_mod(relative):
        return f"{type(relative).__name__} has no score_mod (its bias is neither Toeplitz nor computed in-kernel)"
    if dropout_p > 0:
        return "FlexAttention has no attention dropout (--attention-dropout > 0)"
    if dtype == torch.float64 and not capabilities.flex_float64(torch.device(device)):
        return "FlexAttention on the CPU computes in float32, fp16 and bf16 only (torch 2.13), not float64"
    if training and not capabilities.flex_backward(torch.device(device)):
        return "FlexAttention does not support backward on CPU (training on the CPU)"
    return None


def has_score_mod(relative) -> bool:
    """Whether ``relative``'s bias has a score_mod: a Toeplitz encoding (the generic one), or its own."""
    from fairseq_pe.positional.base import RelativePositionEncoding

    return relative.toeplitz or type(relative).score_mod is not RelativePositionEncoding.score_mod


def batch_bucket(batch: int) -> int:
    """``batch`` rounded up to a bucket: itself up to 4, then a multiple of a quarter of the power of two below it
    (at most 25% more rows; 4 buckets per octave).  The extra rows are zeros (their output is 0 and is dropped)."""
    step = max(1, (1 << (batch.bit_length() - 1)) // 4)
    return -(-batch // step) * step


def bucket(length: int) -> int:
    """``length`` rounded up to a bucket: a multiple of :data:`BLOCK` up to :data:`LINEAR_BUCKETS_UP_TO`, then a
    multiple of an eighth of the power of two below it (at most 12.5% more; 8 buckets per octave)."""
    if length <= LINEAR_BUCKETS_UP_TO:
        step = BLOCK
    else:
        step = max(BLOCK, (1 << (length.bit_length() - 1)) // 8)
    return -(-length // step) * step


@functools.lru_cache(maxsize=None)
def compiled_flex_attention() -> Callable:
    """The process's one compiled ``flex_attention`` (compiled lazily, on its first call; dynamo compiles it once
    per bucket of batch size and lengths, kind of mask and score_mod: :func:`_call_compiled`).  Shapes are static:
    ``dynamic=True`` fails on the CPU with torch 2.13 (inductor's C++ for FlexAttention with symbolic sizes does not
    compile: "'cur_qSplitSize9' was not declared in this scope")."""
    return torch.compile(flex_attention, dynamic=False)


#: the compilations dynamo may keep for ``flex_attention`` (its default, 8, would leave the 9th shape to eager
#: flex_attention, which materialises the scores: a silent quadratic fallback); the buckets keep the count below it
RECOMPILE_LIMIT = 64
#: (device, dtype, padded batch, padded T, padded S, score_mod, mask) of every compiled kernel of this process, and
#: the seconds its first call took (compilation included): what tests/benchmarks read to count compilations
COMPILED = {}


def _call_compiled(q, k, v, score_mod, mask, scale):
    """The compiled ``flex_attention``, with dynamo's recompile limit raised to :data:`RECOMPILE_LIMIT`.  Shapes
    are static (the buckets bound them): a dynamic batch dimension fails on the CPU as dynamic lengths do
    (measured with the padding mask's batch marked dynamic: the same C++ compile error)."""
    key = (q.device.type, q.dtype, q.size(0), q.size(2), k.size(2),
           None if score_mod is None else score_mod.__qualname__,
           None if mask is None else (mask.mask_mod.__qualname__, mask.kv_num_blocks.size(0)))
    started = time.monotonic() if key not in COMPILED else None
    with torch._dynamo.config.patch(recompile_limit=RECOMPILE_LIMIT):
        out = compiled_flex_attention()(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    if started is not None:
        COMPILED[key] = time.monotonic() - started
        logger.info(f"FlexAttention compiled for {key} in {COMPILED[key]:.1f} s ({len(COMPILED)} kernels so far)")
    return out


def block_mask(key_padding: Optional[Tensor], batch: int, tgt_len: int, src_len: int, query_offset: int,
               causal: bool, device) -> Optional[BlockMask]:
    """The block mask of query rows 0 .. ``tgt_len`` − 1 (index ``query_offset`` + row) and keys
    0 .. ``src_len`` − 1, both multiples of :data:`BLOCK`: key j is visible iff not ``key_padding[b, j]`` (B, S, True at padding; None:
    none) and, if ``causal``, j ≤ query_offset + i.  Each (query block, key block) is skipped (no visible key), full
    (all visible: the kernel applies no mask there) or partial, computed from the padding's blocks (B, S/128) and
    the block indices: nothing of size T × S.  None: every key visible."""
    if key_padding is None and not causal:
        return None
    q_blocks, kv_blocks = tgt_len // BLOCK, src_len // BLOCK
    first_key = torch.arange(kv_blocks, device=device).view(1, 1, 1, -1) * BLOCK
    first_query = torch.arange(q_blocks, device=device).view(1, 1, -1, 1) * BLOCK + query_offset
    full = torch.ones(1, 1, q_blocks, kv_blocks, dtype=torch.bool, device=device)
    visible = full
    if causal:
        full = first_key + BLOCK - 1 <= first_query  # every key ≤ the block's first query
        visible = first_key <= first_query + BLOCK - 1  # some key ≤ its last query
    if key_padding is not None:
        blocks = key_padding.view(batch, 1, 1, kv_blocks, BLOCK)
        full = full & ~blocks.any(-1)
        visible = visible & ~blocks.all(-1)
    partial = visible & ~full
    offset = torch.full((), query_offset, dtype=torch.int64, device=device)  # a tensor: one kernel for any offset

    if key_padding is None:
        def mask_mod(b, h, q_idx, kv_idx):
            return kv_idx <= q_idx + offset
    elif causal:
        def mask_mod(b, h, q_idx, kv_idx):
            return (kv_idx <= q_idx + offset) & ~key_padding[b, kv_idx]
    else:
        def mask_mod(b, h, q_idx, kv_idx):
            return ~key_padding[b, kv_idx]

    def indices(chosen):  # (B, 1, nQ, nKV) bool -> the count per row and the chosen key blocks first
        order = torch.argsort((~chosen).to(torch.int8), dim=-1, stable=True)
        return chosen.sum(-1, dtype=torch.int32), order.to(torch.int32)

    partial_count, partial_index = indices(partial)
    full = full.expand_as(partial)
    full_count, full_index = indices(full)
    return BlockMask.from_kv_blocks(partial_count, partial_index, full_count, full_index, BLOCK_SIZE=BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(tgt_len, src_len))


def _pad_length(x: Tensor, length: int, dim: int, value=0) -> Tensor:
    extra = length - x.size(dim)
    if extra == 0:
        return x
    pad = [0, 0] * (x.dim() - 1 - (dim % x.dim())) + [0, extra]
    return F.pad(x, pad, value=value)


def flex_attention_forward(relative, rows, block: int, q: Tensor, k: Tensor, v: Tensor, *, scale: float,
                           query_offset: int, causal: bool, key_padding_mask: Optional[Tensor] = None,
                           dropout_p: float = 0.0, compiled: bool = True) -> Tensor:
    """softmax(scale·q·kᵀ + bias + masks)·v (B, H, T, d) with the bias of ``relative`` (None: none) computed in
    FlexAttention's kernel (module docstring).  ``q`` (B, H, T, d), ``k``, ``v`` (B, H, S, d): rotated, not scaled;
    query row i is at index ``query_offset`` + i; ``causal``: fairseq's future mask (key j visible iff
    j ≤ query_offset + i); ``key_padding_mask`` (B, S), True at padding.  ``compiled=False`` runs eager
    ``flex_attention`` (the same semantics with the scores materialised: small shapes, tests)."""
    if dropout_p > 0:
        raise ValueError("flex_attention_forward: FlexAttention has no attention dropout (flex_supported says so)")
    batch, heads, tgt_len, _ = q.shape
    src_len = k.size(2)
    if key_padding_mask is not None and key_padding_mask.dim() == 0:
        key_padding_mask = None
    b_pad, t_pad, s_pad = batch_bucket(batch), bucket(tgt_len), bucket(src_len)
    key_padding = None
    if key_padding_mask is not None or s_pad > src_len:
        key_padding = (key_padding_mask.to(torch.bool) if key_padding_mask is not None
                       else torch.zeros(batch, src_len, dtype=torch.bool, device=q.device))
        key_padding = _pad_length(key_padding, s_pad, 1, value=True)  # the bucket's extra keys: masked
        key_padding = _pad_length(key_padding, b_pad, 0, value=False)  # the extra rows see every (zero) key
    if rows is not None and rows.positions is not None and b_pad > batch:
        rows = rows._replace(positions=_pad_length(rows.positions, b_pad, 0))
    def build():
        return block_mask(key_padding, b_pad, t_pad, s_pad, query_offset, causal, q.device)

    # the same for every layer of a pass: built once (a call on its own builds its own)
    mask = build() if rows is None else rows.shared(
        FlexBlockMaskKey(b_pad, t_pad, s_pad, query_offset, causal, key_padding_mask is not None), build)
    score_mod = None if relative is None else relative.score_mod(t_pad, s_pad, query_offset, block, rows)
    q, k, v = _pad_length(q, t_pad, 2), _pad_length(k, s_pad, 2), _pad_length(v, s_pad, 2)
    q, k, v = (_pad_length(x, b_pad, 0) for x in (q, k, v))
    if compiled:
        out = _call_compiled(q, k, v, score_mod, mask, scale)
    else:
        out = flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)
    return out[:batch, :, :tgt_len]


def dense_score_bias(score_mod: Callable, batch: int, heads: int, tgt_len: int, src_len: int, device=None) -> Tensor:
    """(B, H, T, S) ``score_mod`` evaluated with score 0 on broadcast index grids: the bias the kernel adds, densely
    (for tests on small shapes; differentiable in what the score_mod captures)."""
    b = torch.arange(batch, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads, device=device).view(1, -1, 1, 1)
    q = torch.arange(tgt_len, device=device).view(1, 1, -1, 1)
    kv = torch.arange(src_len, device=device).view(1, 1, 1, -1)
    score = torch.zeros((), device=device)
    return score_mod(score, b, h, q, kv).expand(batch, heads, tgt_len, src_len)
