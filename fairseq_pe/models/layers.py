"""fairseq Transformer layers that take position information at their input.

They subclass fairseq's layers and override hooks only:

* ``forward`` adds the block's absolute vectors to the block input (``--pe-all-blocks``), then
  runs fairseq's layer unchanged; FLOATER's Q/K/V biases (``--pe-floater-bias``) are forward
  hooks on the attention projections, installed by ``attach_positions``;
* ``build_self_attention`` / ``build_encoder_attention`` take the attention fairseq builds and make
  it a :class:`~fairseq_pe.models.attention.PositionAttention` (torch's fused attention kernel,
  with the relative encoding's hooks; same parameters and state-dict keys).

A block's position tensors are computed once per pass by the side's
:class:`~fairseq_pe.positional.PositionInjector` (:meth:`BlockPositionMixin.position_inputs`); under
activation checkpointing they are inputs of the checkpointed call (:func:`wrap_layer`).
"""

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_pe.positional.floater_bias import install_projection_biases

from .attention import PositionAttention


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's ``build_*_layer`` do.

    With ``--checkpoint-activations`` the block's position tensors (FLOATER biases, per-block
    vectors), which are computed once per pass outside the layer, enter fairseq's checkpointed
    forward as explicit inputs: the recomputation then differentiates with respect to them and
    hands their gradients back to the shared computation (one ODE solve for all blocks), instead
    of running backward through that shared graph once per layer.
    """
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        checkpointed = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations).forward

        def forward(x, *args, **kwargs):
            return checkpointed(x, *args, **layer.position_inputs(), **kwargs)

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
        self.self_attn.attach_relative(injector.relative, block)
        if injector.self_bias is not None:
            install_projection_biases(self.self_attn, self, "self")
        if injector.cross_bias is not None and getattr(self, "encoder_attn", None) is not None:
            install_projection_biases(self.encoder_attn, self, "cross")

    #: the block's position tensors given as inputs (activation checkpointing), during a forward call
    given_positions = None

    def position_inputs(self):
        """This block's position tensors, computed from the pass's shared positions: the per-block
        absolute vectors (``pe_block``) and FLOATER's projection biases (``pe_self_0`` .. ``pe_cross_2``)."""
        injector, inputs = self.position_injector, {}
        if injector is None:
            return inputs
        if injector.all_blocks and self.block > 1:
            inputs["pe_block"] = injector.block_vectors(self.block)
        for kind, bias in (("self", injector.self_bias), ("cross", injector.cross_bias)):
            if bias is not None and (kind == "self" or getattr(self, "encoder_attn", None) is not None):
                for index in range(3):
                    inputs[f"pe_{kind}_{index}"] = injector.attention_bias(kind, self.block, index)
        return inputs

    def position_tensor(self, name: str, compute):
        """The position tensor ``name`` given to this call, else ``compute()``."""
        given = self.given_positions
        return given[name] if given is not None and name in given else compute()

    def forward(self, x, *args, **kwargs):
        given = {k: kwargs.pop(k) for k in [k for k in kwargs if k.startswith("pe_")]}
        self.given_positions = given or None
        try:
            injector = self.position_injector
            if injector is not None and injector.all_blocks and self.block > 1:
                x = x + self.position_tensor("pe_block", lambda: injector.block_vectors(self.block)).to(x.dtype)
            return super().forward(x, *args, **kwargs)
        finally:
            self.given_positions = None

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        # (a relative encoding refuses add_bias_kv / add_zero_attn in PositionAttention.attach_relative)
        extra = {"add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn} if add_bias_kv or add_zero_attn else {}
        return PositionAttention.adopt(super().build_self_attention(embed_dim, cfg, **extra))


class PositionAwareEncoderLayer(BlockPositionMixin, TransformerEncoderLayerBase):
    attention_heads = "encoder"


class PositionAwareDecoderLayer(BlockPositionMixin, TransformerDecoderLayerBase):
    attention_heads = "decoder"

    def build_encoder_attention(self, *args, **kwargs):
        return PositionAttention.adopt(super().build_encoder_attention(*args, **kwargs))
