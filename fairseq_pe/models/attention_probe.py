"""Which path, and which of torch's attention kernels, every attention of a model takes.

:func:`recording` watches the :class:`~fairseq_pe.models.attention.PositionAttention` modules of a model (through
:func:`fairseq_pe.models.attention.observing`) and records one :class:`AttentionCall` per call: the attention's role
(encoder self-attention, decoder self-attention, cross-attention), the path it took, and on the fused path what it
handed to ``torch.nn.functional.scaled_dot_product_attention`` (the mask's shape, dtype and layout, ``is_causal``,
dropout) with the kernel torch chooses for those arguments on their device (``torch._fused_sdp_choice``, the choice
``scaled_dot_product_attention`` makes itself: flash, memory-efficient, cuDNN or math).  ``scripts/gpu_check.py``
reports it, and the table of ``docs/speed.md`` is checked against it.
"""

import contextlib
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch

from .attention import PositionAttention, observing

ROLES = ("encoder-self", "decoder-self", "cross")


def role_of(name: str) -> str:
    """The role of the attention module called ``name`` in its model (``decoder.layers.0.encoder_attn`` ...)."""
    if name.endswith("encoder_attn"):
        return "cross"
    return "decoder-self" if name.startswith("decoder") or ".decoder." in name else "encoder-self"


@dataclass
class AttentionCall:
    role: str
    path: str  # fused, blockwise, explicit, fairseq
    mask_shape: Optional[Tuple[int, ...]] = None  # None: no mask
    mask_dtype: Optional[str] = None
    mask_requires_grad: bool = False
    mask_contiguous_last: bool = True  # the last dimension has stride 1
    mask_stride: Optional[Tuple[int, ...]] = None  # CUDA's memory-efficient kernel wants multiples of 8 or 16
    is_causal: bool = False
    dropout: bool = False
    backend: Optional[str] = None  # torch's choice for these arguments: FLASH_ATTENTION, EFFICIENT_ATTENTION, ...

    def mask_aligned(self, alignment: int) -> bool:
        """Whether the mask's rows (and the other dimensions it has) start at multiples of ``alignment`` elements,
        as CUDA's memory-efficient kernel reads a mask without copying it."""
        return self.mask_shape is None or all(stride % alignment == 0 for stride, size in
                                              zip(self.mask_stride[:-1], self.mask_shape[:-1]) if size > 1)

    def as_dict(self):
        return asdict(self)


def chosen_backend(q, k, v, attn_mask, dropout_p, is_causal) -> Optional[str]:
    """The kernel ``scaled_dot_product_attention`` picks for these arguments (None where torch cannot say)."""
    choose = getattr(torch, "_fused_sdp_choice", None)
    if choose is None:
        return None
    from torch.nn.attention import SDPBackend

    try:
        return SDPBackend(choose(q, k, v, attn_mask, dropout_p, is_causal)).name
    except (RuntimeError, ValueError) as e:  # no kernel takes these arguments
        return f"none ({e})"


@contextlib.contextmanager
def recording(model):
    """Within the block, every call of an attention of ``model`` appends an :class:`AttentionCall` to the list
    yielded."""
    roles = {id(m): role_of(name) for name, m in model.named_modules() if isinstance(m, PositionAttention)}
    calls: List[AttentionCall] = []

    def observe(module, path, q=None, k=None, v=None, attn_mask=None, dropout_p=0.0, is_causal=False):
        role = roles.get(id(module))
        if role is None:
            return
        call = AttentionCall(role, path, is_causal=is_causal, dropout=dropout_p > 0)
        if path == "fused":
            if attn_mask is not None:
                call.mask_shape = tuple(attn_mask.shape)
                call.mask_dtype = str(attn_mask.dtype).replace("torch.", "")
                call.mask_requires_grad = attn_mask.requires_grad
                call.mask_contiguous_last = attn_mask.stride(-1) == 1 or attn_mask.size(-1) == 1
                call.mask_stride = tuple(attn_mask.stride())
            call.backend = chosen_backend(q, k, v, attn_mask, dropout_p, is_causal)
        calls.append(call)

    with observing(observe):
        yield calls


def argument_code(call: AttentionCall) -> str:
    """What a call handed to SDPA, independent of sizes and device: ``none`` (no mask: FlashAttention's arguments),
    ``causal`` (``is_causal=True``, no mask), ``mask DIMS`` (a float mask; DIMS says which of B, H, T, S it has, 1
    where it broadcasts) with `` ∇`` when the mask carries a gradient, or the path taken without SDPA
    (``blockwise``, ``explicit``, ``fairseq``)."""
    if call.path != "fused":
        return call.path
    if call.is_causal:
        return "causal"
    if call.mask_shape is None:
        return "none"
    dims = "".join("1" if size == 1 else letter for letter, size in zip("BHTS", call.mask_shape))
    return f"mask {dims}" + (" ∇" if call.mask_requires_grad else "")


def argument_summary(calls: List[AttentionCall]) -> dict:
    """role -> the distinct :func:`argument_code` of its calls, in the order of the layers, joined by ' + '."""
    seen = {}
    for call in calls:
        codes = seen.setdefault(call.role, [])
        code = argument_code(call)
        if code not in codes:
            codes.append(code)
    return {role: " + ".join(codes) for role, codes in seen.items()}
