"""fairseq Transformer layers that take position information at their input.

They subclass fairseq's layers and override hooks only:

* ``forward`` adds the block's absolute vectors to the block input (``--pe-all-blocks``), then
  runs fairseq's layer unchanged; FLOATER's Q/K/V biases (``--pe-floater-bias``) are forward
  hooks on the attention projections, installed by ``attach_positions``;
* ``build_self_attention`` / ``build_encoder_attention`` take the attention fairseq builds and make
  it a :class:`~fairseq_pe.models.attention.PositionAttention` (torch's fused attention kernel,
  with the relative encoding's hooks; same parameters and state-dict keys).

A block's position tensors are computed once per pass by the side's
:class:`~fairseq_pe.positional.PositionInjector`, from the pass under way
(:class:`~fairseq_pe.positional.pass_state.PositionPass`, :meth:`BlockPositionMixin.position_inputs`); under
activation checkpointing they, and the pass, are inputs of the checkpointed call (:func:`wrap_layer`).
"""

import contextlib
import contextvars
from typing import Dict, List, Tuple

from fairseq.distributed import fsdp_wrap
from fairseq.modules import FairseqDropout
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_pe.errors import UserError
from fairseq_pe.positional.base import refuse_data_parallel
from fairseq_pe.positional.floater_bias import install_projection_biases
from fairseq_pe.positional.pass_state import PositionPass, close_pass, current_pass, open_pass

from .attention import PositionAttention

#: side -> (the side's number of blocks, the 1-based block of each of its layers) of the model being built
_LAYER_BLOCKS: contextvars.ContextVar = contextvars.ContextVar("fairseq_pe_layer_blocks", default=None)


def layer_blocks(args, side: str) -> Tuple[int, List[int]]:
    """LayerDrop pruning (``--model-overrides "{'encoder_layers_to_keep': '0,2'}"`` at generation, fairseq's
    ``--encoder-layers-to-keep``): the side's number of blocks as trained and the block of each layer kept.

    A kept layer stays the block it was: its position parameters (a learned table per block, FLOATER's initial
    values, untied relative tables, KERPLE's r₁, r₂ ...) are its own rows of tensors that keep their trained size
    (fairseq renumbers the ``.layers.N.`` keys only), and what depends on the block number (the sinusoids' P(n) of
    ``--pe-all-blocks``) is unchanged, so the pruned model computes what the full one does with the other layers
    dropped."""
    layers = getattr(args, f"{side}_layers")
    keep = getattr(args, f"{side}_layers_to_keep", None)
    if not keep:
        return layers, list(range(1, layers + 1))
    flag = f"--{side}-layers-to-keep"
    try:  # a string from --model-overrides ("0,2"), a list from fairseq's parser
        kept = sorted(int(i) for i in (keep.split(",") if isinstance(keep, str) else keep))  # prune_state_dict's order
    except (TypeError, ValueError):
        raise UserError(f"{flag} {keep!r}: give comma-separated layer numbers, e.g. 0,2") from None
    if len(set(kept)) < len(kept) or kept[0] < 0 or kept[-1] >= layers:
        raise UserError(f"{flag} {keep!r}: each of the {layers} {side} layers (0 to {layers - 1}) at most once")
    return layers, [i + 1 for i in kept]


@contextlib.contextmanager
def numbered_layers(args, sides=("encoder", "decoder")):
    """While a model is built: its layers get the blocks of :func:`layer_blocks` (read by :func:`blocks_of`)."""
    blocks: Dict[str, Tuple[int, List[int]]] = {side: layer_blocks(args, side) for side in sides}
    token = _LAYER_BLOCKS.set(blocks)
    try:
        yield blocks
    finally:
        _LAYER_BLOCKS.reset(token)


def blocks_of(side: str, num_layers: int) -> Tuple[int, List[int]]:
    """(number of blocks, block of each layer) of the side being built with ``num_layers`` layers: those of
    :func:`numbered_layers`, else 1 .. num_layers."""
    blocks = (_LAYER_BLOCKS.get() or {}).get(side)
    if blocks is None or len(blocks[1]) != num_layers:
        return num_layers, list(range(1, num_layers + 1))
    return blocks


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's ``build_*_layer`` do.

    With ``--checkpoint-activations`` the block's position tensors (FLOATER biases, per-block
    vectors), which are computed once per pass outside the layer, enter fairseq's checkpointed
    forward as explicit inputs: the recomputation then differentiates with respect to them and
    hands their gradients back to the shared computation (one ODE solve for all blocks), instead
    of running backward through that shared graph once per layer.  So does the pass itself
    (:class:`~fairseq_pe.positional.pass_state.PositionPass`, ``pe_pass``): the recomputation in backward,
    which runs after the pass's scope has ended, reopens its own pass, also when another forward pass (with
    positions of its own: randomised positions) ran between the two.
    """
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        checkpointed = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations).forward

        def forward(x, *args, **kwargs):
            position_pass = current_pass(layer.position_injector)
            inputs = {} if position_pass is None else {**layer.position_inputs(position_pass), "pe_pass": position_pass}
            return checkpointed(x, *args, **inputs, **kwargs)

        layer.forward = forward
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class BlockPositionMixin:
    """Adds the block's position vectors to the layer input; see the module docstring."""

    position_injector = None
    block = 1
    attention_heads = None  # "encoder" or "decoder": where the layer's head count is configured

    def attach_positions(self, injector, block: int):
        # a plain reference: the injector is a submodule of the encoder/decoder already
        object.__setattr__(self, "position_injector", injector)
        self.block = block
        self.self_attn.attach_relative(injector.relative, block, owner=injector)
        self.self_attn.kernel = injector.attention_kernel
        if getattr(self, "encoder_attn", None) is not None:
            self.encoder_attn.kernel = injector.attention_kernel
        if injector.self_bias is not None:
            install_projection_biases(self.self_attn, self, "self")
        if injector.cross_bias is not None and getattr(self, "encoder_attn", None) is not None:
            install_projection_biases(self.encoder_attn, self, "cross")

    def position_inputs(self, position_pass: PositionPass):
        """This block's position tensors, computed from the pass's positions: the per-block absolute vectors
        (``pe_block``) and FLOATER's projection biases (``pe_self_0`` .. ``pe_cross_2``)."""
        injector, inputs = self.position_injector, {}
        if injector is None:
            return inputs
        if injector.all_blocks and self.block > 1:
            inputs["pe_block"] = injector.block_vectors(position_pass, self.block)
        for kind, bias in (("self", injector.self_bias), ("cross", injector.cross_bias)):
            # cross-attention runs (and its biases are computed) only in a pass with a source
            if bias is not None and (kind == "self" or (getattr(self, "encoder_attn", None) is not None
                                                        and position_pass.source is not None)):
                for index in range(3):
                    inputs[f"pe_{kind}_{index}"] = injector.attention_bias(position_pass, kind, self.block, index)
        return inputs

    def _replicate_for_data_parallel(self):
        refuse_data_parallel()

    def position_tensor(self, name: str, compute):
        """The position tensor ``name`` given to this call (activation checkpointing: the pass this call opened holds
        them, :attr:`~fairseq_pe.positional.pass_state.PositionPass.given`), else ``compute()``."""
        position_pass = current_pass(self.position_injector)
        given = position_pass.given if position_pass is not None else {}
        return given[name] if name in given else compute()

    def forward(self, x, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in [k for k in kwargs if k.startswith("pe_")]}
        # a checkpointed call brings its pass (maybe recomputed in backward, after the pass's scope ended, or in
        # autograd's own thread) and this block's position tensors, which the pass it opens carries: nothing of the
        # call is written on the module, which threads may share
        position_pass = given.pop("pe_pass", None)
        if position_pass is not None and given:
            position_pass = position_pass._replace(given=given)
        outer = open_pass(position_pass)
        try:
            injector = self.position_injector
            if injector is not None and injector.all_blocks and self.block > 1:
                x = x + self.position_tensor("pe_block", lambda: injector.block_vectors(
                    current_pass(injector), self.block)).to(x.dtype)
            return super().forward(x, *args, **kwargs)
        finally:
            close_pass(outer)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        # (a relative encoding refuses add_bias_kv / add_zero_attn in PositionAttention.attach_relative)
        extra = {"add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn} if add_bias_kv or add_zero_attn else {}
        return PositionAttention.adopt(super().build_self_attention(embed_dim, cfg, **extra))


class PositionAwareEncoderLayer(BlockPositionMixin, TransformerEncoderLayerBase):
    attention_heads = "encoder"

    def forward(self, x, encoder_padding_mask=None, *args, **kwargs):
        # what fairseq's encoder decided for this pass (it hands the layers no mask when nothing is padded):
        # read by TransformerPEEncoder, which then returns no padding mask to the cross-attention either
        position_pass = kwargs.get("pe_pass") or current_pass(self.position_injector)
        if position_pass is not None:
            position_pass.memo.source_padded = encoder_padding_mask is not None
        return super().forward(x, encoder_padding_mask, *args, **kwargs)


class PositionAwareDecoderLayer(BlockPositionMixin, TransformerDecoderLayerBase):
    attention_heads = "decoder"

    def build_self_attention(self, *args, **kwargs):
        attention = super().build_self_attention(*args, **kwargs)
        attention.future_masked = True  # its attn_mask in a full pass is fairseq's future mask
        return attention

    def build_encoder_attention(self, *args, **kwargs):
        return PositionAttention.adopt(super().build_encoder_attention(*args, **kwargs))


#: fairseq matches ``--retain-dropout-modules`` against the name each dropout module was given, its owner's class
#: name; the plugin's subclasses answer to the names of the stock modules they extend (what users pass for stock)
STOCK_DROPOUT_NAMES = {
    "TransformerPEEncoder": "TransformerEncoder",
    "RobertaSentenceEncoder": "TransformerEncoder",
    "TransformerPEDecoder": "TransformerDecoder",
    "PositionAwareEncoderLayer": "TransformerEncoderLayerBase",
    "PositionAwareDecoderLayer": "TransformerDecoderLayerBase",
}


def use_stock_dropout_names(model):
    """Give every dropout module of ``model`` the name stock fairseq's module in its place has."""
    for module in model.modules():
        if isinstance(module, FairseqDropout) and module.module_name in STOCK_DROPOUT_NAMES:
            module.module_name = STOCK_DROPOUT_NAMES[module.module_name]


def _class_names(owner) -> set:
    """The names ``owner`` answers to in ``--retain-dropout-modules``: its class's and every base class's (up to
    ``nn.Module``), and for fairseq 0.12's ``XBase`` classes also ``X``, the legacy subclass users name
    (``TransformerEncoderLayer`` of ``TransformerEncoderLayerBase``, as fairseq's tests/test_inference_dropout.py)."""
    import torch.nn as nn

    names = set()
    for cls in type(owner).__mro__:
        if cls is nn.Module or cls is object or issubclass(nn.Module, cls):
            continue
        names.add(cls.__name__)
        if cls.__name__.endswith("Base"):
            names.add(cls.__name__[:-len("Base")])
    return names


def retained_dropout_modules(model, names):
    """``--retain-dropout-modules NAMES`` as the exact list of dropout ``module_name``s fairseq should retain.

    fairseq passes the option on as it was given, a string on the command line, and tests ``module_name in NAMES``:
    a substring test, so that ``'["TransformerEncoder"]'`` works by accident, ``TransformerEncoderLayerBase`` also
    selects ``TransformerEncoder``, and ``TransformerEncoderLayer`` (the name fairseq's own tests use) selects no
    layer of 0.12, whose layers are ``TransformerEncoderLayerBase``.  Here the string is read as fairseq's
    documentation writes it (a list, ``'["A", "B"]'``, or names separated by commas), and a name selects the dropout
    modules whose owner's class, or a base class of it, has that name (:func:`_class_names`: stock fairseq's names,
    0.12's legacy ones and the plugin's own); a name that no owner answers to would be ignored by fairseq (no
    dropout, no message) and is refused, with the names there are.  None: all, or none (option not given)."""
    import ast

    if not names:
        return None
    if isinstance(names, str):
        try:
            parsed = ast.literal_eval(names)
        except (ValueError, SyntaxError):
            parsed = names.split(",")
        names = [parsed] if isinstance(parsed, str) else list(parsed)
    names = [str(name).strip() for name in names if str(name).strip()]
    owners = {}  # module_name of each dropout module -> the names its owner answers to
    for path, module in model.named_modules():
        if isinstance(module, FairseqDropout) and module.module_name:
            owner = model.get_submodule(path.rpartition(".")[0]) if "." in path else model
            owners.setdefault(module.module_name, {module.module_name}).update(_class_names(owner))
    unknown = [name for name in names if not any(name in answers for answers in owners.values())]
    if unknown:
        raise UserError(f"--retain-dropout-modules: no dropout module of this model is called "
                        f"{', '.join(map(repr, unknown))} (its class or a base class); its dropout modules are "
                        f"{', '.join(sorted(owners))}")
    return sorted(module_name for module_name, answers in owners.items() if answers.intersection(names))


def exact_retain_dropout_modules(model, kwargs: dict) -> dict:
    """``make_generation_fast_``'s keyword arguments (fairseq's ``prepare_for_inference_`` builds them from
    ``--retain-dropout``/``--retain-dropout-modules``) with the module names :func:`retained_dropout_modules` reads:
    the model's own override of fairseq's ``make_generation_fast_`` passes them on, leaving ``cfg`` as it is."""
    if not kwargs.get("retain_dropout") or not kwargs.get("retain_dropout_modules"):
        return kwargs
    return {**kwargs, "retain_dropout_modules": retained_dropout_modules(model, kwargs["retain_dropout_modules"])}
