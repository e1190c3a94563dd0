"""fairseq Transformer layers that take position information at their input.

They subclass fairseq's layers and override two hooks only: ``forward`` adds the block's
absolute vectors to the block input (``--pe-all-blocks``) before running fairseq's layer
unchanged, and ``build_self_attention`` / ``build_encoder_attention`` switch off fairseq's
fused attention fast path (``F.multi_head_attention_forward``), which bypasses the hooks of
attention subclasses and differs numerically from the step-by-step path used in
incremental decoding.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase


def python_attention_path(attention):
    """Make a fairseq MultiheadAttention always take its Python implementation."""
    attention._set_skip_embed_dim_check()
    return attention


def wrap_layer(layer, cfg):
    """Activation checkpointing and FSDP wrapping, as fairseq's ``build_*_layer`` do."""
    checkpoint = cfg.checkpoint_activations
    if checkpoint:
        layer = checkpoint_wrapper(layer, offload_to_cpu=cfg.offload_activations)
    return fsdp_wrap(layer, min_num_params=cfg.min_params_to_wrap if not checkpoint else 0)


class BlockPositionMixin:
    """Adds the block's position vectors to the layer input; see the module docstring."""

    position_injector = None
    block = 1

    def attach_positions(self, injector, block: int):
        # a plain reference: the injector is a submodule of the encoder/decoder already
        object.__setattr__(self, "position_injector", injector)
        self.block = block

    def forward(self, x, *args, **kwargs):
        if self.position_injector is not None:
            x = self.position_injector.add_block_vectors(x, self.block)
        return super().forward(x, *args, **kwargs)

    def build_self_attention(self, *args, **kwargs):
        return python_attention_path(super().build_self_attention(*args, **kwargs))


class PositionAwareEncoderLayer(BlockPositionMixin, TransformerEncoderLayerBase):
    pass


class PositionAwareDecoderLayer(BlockPositionMixin, TransformerDecoderLayerBase):
    def build_encoder_attention(self, *args, **kwargs):
        return python_attention_path(super().build_encoder_attention(*args, **kwargs))
