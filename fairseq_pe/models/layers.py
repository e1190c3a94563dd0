"""fairseq Transformer layers that take position information at their input.

They subclass fairseq's layers and override two hooks only: ``forward`` adds the block's
absolute vectors to the block input (``--pe-all-blocks``) before running fairseq's layer
unchanged (FLOATER's Q/K/V biases, ``--pe-floater-bias``, are forward hooks on the attention
projections, installed by ``attach_positions``), and ``build_self_attention`` / ``build_encoder_attention`` build
:class:`~fairseq_pe.models.attention.RelativeSelfAttention` when ``--pe-relative`` is set,
and otherwise fairseq's attention with its fused fast path switched off (``F.multi_head_attention_forward``), which bypasses the hooks of
attention subclasses and differs numerically from the step-by-step path used in
incremental decoding.
"""

from fairseq.distributed import fsdp_wrap
from fairseq.modules.checkpoint_activations import checkpoint_wrapper
from fairseq.modules.transformer_layer import TransformerDecoderLayerBase, TransformerEncoderLayerBase

from fairseq_pe.positional.floater_bias import install_projection_biases

from .attention import RelativeSelfAttention


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
    attention_heads = None  # "encoder" or "decoder": where the layer's head count is configured

    def attach_positions(self, injector, block: int):
        # a plain reference: the injector is a submodule of the encoder/decoder already
        object.__setattr__(self, "position_injector", injector)
        self.block = block
        if isinstance(self.self_attn, RelativeSelfAttention):
            self.self_attn.attach_relative(injector.relative, block)
        if injector.self_bias is not None:
            install_projection_biases(self.self_attn, self, "self")
        if injector.cross_bias is not None and getattr(self, "encoder_attn", None) is not None:
            install_projection_biases(self.encoder_attn, self, "cross")

    def forward(self, x, *args, **kwargs):
        if self.position_injector is not None:
            x = self.position_injector.add_block_vectors(x, self.block)
        return super().forward(x, *args, **kwargs)

    def build_self_attention(self, embed_dim, cfg, add_bias_kv=False, add_zero_attn=False):
        if getattr(cfg, "pe_relative", "none") != "none":
            if add_bias_kv or add_zero_attn:
                raise ValueError("--pe-relative does not support add_bias_kv / add_zero_attn")
            return RelativeSelfAttention(
                embed_dim,
                getattr(cfg, self.attention_heads).attention_heads,
                dropout=cfg.attention_dropout,
                self_attention=True,
                q_noise=self.quant_noise,
                qn_block_size=self.quant_noise_block_size,
            )
        extra = {"add_bias_kv": add_bias_kv, "add_zero_attn": add_zero_attn} if add_bias_kv or add_zero_attn else {}
        return python_attention_path(super().build_self_attention(embed_dim, cfg, **extra))


class PositionAwareEncoderLayer(BlockPositionMixin, TransformerEncoderLayerBase):
    attention_heads = "encoder"


class PositionAwareDecoderLayer(BlockPositionMixin, TransformerDecoderLayerBase):
    attention_heads = "decoder"

    def build_encoder_attention(self, *args, **kwargs):
        return python_attention_path(super().build_encoder_attention(*args, **kwargs))
