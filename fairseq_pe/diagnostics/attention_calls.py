"""Which backend, and which of torch's attention kernels, every attention of a model takes.

:func:`recording` watches the :class:`~fairseq_pe.models.attention.PositionAttention` modules of a model from
outside and records what each call did: the attention's role (encoder self-attention, decoder self-attention,
cross-attention), the backend its planner chose, and on the SDPA backends what it handed to
``torch.nn.functional.scaled_dot_product_attention`` (the mask's shape, dtype and layout, ``is_causal``, dropout)
with the kernel torch chooses for those arguments on their device (``torch._fused_sdp_choice``, the choice
``scaled_dot_product_attention`` makes itself: flash, memory-efficient, cuDNN or math).  ``fairseq-pe-gpu-check``
reports it, and the table of ``docs/speed.md`` is checked against it.

How it sees, with nothing on the model's hot path:

* forward pre- and post-hooks on each attention module open and close a frame per call (the calls of a
  checkpointed layer's recomputation are calls too);
* each module's :meth:`~fairseq_pe.models.attention.PositionAttention.plan` is wrapped for the block (an attribute
  of the instance, removed at its end): the backend of the frame.  A call that never plans is fairseq's own code
  (``fairseq``: the weights without a relative encoding, bias_kv, zero_attn, onnx);
* a ``TorchFunctionMode``, entered by the pre-hook and left by the post-hook (so that it is there in a checkpointed
  layer's recomputation too, which the autograd engine runs without the modes of the code that called
  ``backward``), sees every call of ``scaled_dot_product_attention`` and hands its arguments to the open frame:
  one record per SDPA call of the ``sdpa`` (named ``fused``, as docs/speed.md's table does) and ``blocks``
  backends; the other backends (``blockwise``, ``explicit``, ``flex``, ``fairseq``) one record per call, without
  arguments.
"""

import contextlib
from dataclasses import asdict, dataclass
from typing import List, Optional, Tuple

import torch
import torch.nn.functional as F

from fairseq_pe.models.attention import PositionAttention

ROLES = ("encoder-self", "decoder-self", "cross")


def role_of(name: str) -> str:
    """The role of the attention module called ``name`` in its model (``decoder.layers.0.encoder_attn`` ...)."""
    if name.endswith("encoder_attn"):
        return "cross"
    return "decoder-self" if name.startswith("decoder") or ".decoder." in name else "encoder-self"


@dataclass
class AttentionCall:
    role: str
    path: str  # fused (the planner's sdpa), blocks, blockwise, explicit, flex, fairseq
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


#: the planner's backend -> the path recorded (docs/speed.md's names)
PATH_NAMES = {"sdpa": "fused"}
#: the backends whose SDPA calls are recorded one by one, with their arguments
SDPA_BACKENDS = ("sdpa", "blocks")


class _Frame:
    __slots__ = ("module", "backend", "sdpa_calls", "mode")

    def __init__(self, module, mode):
        self.module, self.backend, self.sdpa_calls, self.mode = module, None, 0, mode


@contextlib.contextmanager
def recording(model):
    """Within the block, every call of an attention of ``model`` appends one :class:`AttentionCall` (or one per SDPA
    call on the ``fused`` and ``blocks`` paths) to the list yielded."""
    from torch.overrides import TorchFunctionMode

    roles = {m: role_of(name) for name, m in model.named_modules() if isinstance(m, PositionAttention)}
    calls: List[AttentionCall] = []
    frames: List[_Frame] = []

    def opened(module, args):
        mode = SdpaArguments()
        mode.__enter__()
        frames.append(_Frame(module, mode))

    def closed(module, args, output):
        frame = frames.pop()
        frame.mode.__exit__(None, None, None)
        path = "fairseq" if frame.backend is None else frame.backend
        if path not in SDPA_BACKENDS or frame.sdpa_calls == 0:  # a blocks call that ran its blocks explicitly too
            calls.append(AttentionCall(roles[module], PATH_NAMES.get(path, path)))

    def planner(module):
        plan = module.plan

        def planned(*args, **kwargs):
            backend = plan(*args, **kwargs)
            if frames and frames[-1].module is module:
                frames[-1].backend = backend
            return backend
        return planned

    class SdpaArguments(TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func is F.scaled_dot_product_attention and frames and frames[-1].backend in SDPA_BACKENDS:
                frame = frames[-1]
                frame.sdpa_calls += 1
                q, k, v = args[:3]
                call = AttentionCall(roles[frame.module], PATH_NAMES.get(frame.backend, frame.backend),
                                     is_causal=kwargs.get("is_causal", False),
                                     dropout=kwargs.get("dropout_p", 0.0) > 0)
                attn_mask = kwargs.get("attn_mask")
                if attn_mask is not None:
                    call.mask_shape = tuple(attn_mask.shape)
                    call.mask_dtype = str(attn_mask.dtype).replace("torch.", "")
                    call.mask_requires_grad = attn_mask.requires_grad
                    call.mask_contiguous_last = attn_mask.stride(-1) == 1 or attn_mask.size(-1) == 1
                    call.mask_stride = tuple(attn_mask.stride())
                call.backend = chosen_backend(q, k, v, attn_mask, kwargs.get("dropout_p", 0.0),
                                              kwargs.get("is_causal", False))
                calls.append(call)
            return func(*args, **kwargs)

    handles = []
    try:
        for module in roles:
            handles.append(module.register_forward_pre_hook(opened))
            handles.append(module.register_forward_hook(closed, always_call=True))
            module.plan = planner(module)
        yield calls
    finally:
        for handle in handles:
            handle.remove()
        for module in roles:
            module.__dict__.pop("plan", None)


def argument_code(call: AttentionCall) -> str:
    """What a call handed to SDPA, independent of sizes and device: ``none`` (no mask: FlashAttention's arguments),
    ``causal`` (``is_causal=True``, no mask), ``mask DIMS`` (a float mask; DIMS says which of B, H, T, S it has, 1
    where it broadcasts) with `` ∇`` when the mask carries a gradient, or the path taken without SDPA
    (``blockwise``, ``blocks`` run explicitly, ``explicit``, ``flex``, ``fairseq``)."""
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
