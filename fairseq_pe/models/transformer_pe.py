"""``transformer_pe``: fairseq's encoder-decoder Transformer with pluggable position encodings.

It extends fairseq's ``TransformerModel`` and overrides its hooks only: ``build_encoder`` /
``build_decoder`` return subclasses of fairseq's encoder and decoder whose ``embed_positions``
is a :class:`~fairseq_pe.positional.PositionInjector` and whose ``build_*_layer`` return
the position-aware layers of :mod:`fairseq_pe.models.layers`.  Everything else (embeddings,
layers, incremental decoding, checkpoints, the CLI) is fairseq's.
"""

from fairseq.models import register_model, register_model_architecture
from fairseq.models.transformer import TransformerDecoderBase, TransformerEncoderBase, TransformerModel
from fairseq.models.transformer import transformer_legacy as stock

from fairseq_pe.errors import UserError, as_user_errors
from fairseq_pe.positional import PositionInjector, build_position_encoding
from fairseq_pe.positional.dape import with_dape
from fairseq_pe.positional.floater_bias import FloaterAttentionBias
from fairseq_pe.positional.injector import Source
from fairseq_pe.positional.pass_state import close_pass, open_pass

from .floater_setup import apply_floater_freezing, build_floater_flow, floater_pass, flow_of
from .layers import (PositionAwareDecoderLayer, PositionAwareEncoderLayer, blocks_of, exact_retain_dropout_modules,
                     numbered_layers, use_stock_dropout_names, wrap_layer)
from .options import (add_position_encoding_args, check_finite_position_args, position_encoding_defaults,
                      validate_position_args)
from .position_config import config_door
from .task_fit import check_translation_task


def build_position_injector(cfg, num_blocks: int, embed_dim: int, num_heads: int, padding_idx: int, side: str,
                            cross_attention: bool = False, max_positions_flag: str = None):
    """The ``embed_positions`` module of the encoder (``side="source"``) or decoder (``"target"``);
    ``max_positions_flag`` is the option that sets the table length (named in errors)."""
    max_positions = cfg.max_source_positions if side == "source" else cfg.max_target_positions
    absolute = build_position_encoding(
        "absolute", cfg.pe_absolute,
        embed_dim=embed_dim,
        num_blocks=num_blocks,
        all_blocks=cfg.pe_all_blocks,
        max_positions=max_positions,
        max_positions_flag=max_positions_flag or f"--max-{side}-positions",
        padding_idx=padding_idx,
        args=cfg,
    )
    random_positions = getattr(cfg, "pe_random_positions", None)
    if random_positions is not None and absolute is not None and absolute.max_positions is not None \
            and random_positions > absolute.max_positions:
        raise UserError(f"--pe-random-positions {random_positions} draws positions up to {random_positions - 1}, past "
                        f"the {absolute.max_positions} rows of the learned table: set "
                        f"{max_positions_flag or f'--max-{side}-positions'} {random_positions} (or more), or lower "
                        "--pe-random-positions")
    relative = build_position_encoding(
        "relative", cfg.pe_relative,
        embed_dim=embed_dim, num_heads=num_heads, num_blocks=num_blocks, causal=side == "target", args=cfg,
    )
    relative = with_dape(relative, cfg)  # --pe-dape: DAPE's network over the logits and the bias
    bias = getattr(cfg, "pe_floater_bias", False)
    return PositionInjector(
        absolute, padding_idx, relative=relative,
        self_bias=FloaterAttentionBias(embed_dim, num_blocks) if bias else None,
        cross_bias=FloaterAttentionBias(embed_dim, num_blocks) if bias and cross_attention else None,
        random_positions=random_positions, causal=side == "target",
        spaced_in_evaluation=side == "target" and getattr(cfg, "pe_random_eval_decoder", None) == "spaced",
        attention_kernel=getattr(cfg, "pe_attention_kernel", None) or "auto",
    )


class TransformerPEEncoder(TransformerEncoderBase):
    max_positions_flag = "--max-source-positions"  # the option that sets a learned table's length

    def __init__(self, cfg, dictionary, embed_tokens, return_fc=False):
        super().__init__(cfg, dictionary, embed_tokens, return_fc=return_fc)
        num_blocks, blocks = blocks_of("encoder", len(self.layers))  # LayerDrop pruning keeps the blocks' numbers
        self.embed_positions = build_position_injector(
            cfg, num_blocks, embed_tokens.embedding_dim, cfg.encoder.attention_heads, self.padding_idx, "source",
            max_positions_flag=self.max_positions_flag,
        )
        # by index: iterating a LayerDropModuleList (--encoder-layerdrop) in training mode drops layers at random
        for block, layer in zip(blocks, (self.layers[i] for i in range(len(self.layers)))):
            layer.attach_positions(self.embed_positions, block)

    def build_encoder_layer(self, cfg):
        return wrap_layer(PositionAwareEncoderLayer(cfg, return_fc=self.return_fc), cfg)

    def forward(self, src_tokens, *args, **kwargs):
        injector = self.embed_positions
        # a direct call (not through the model) still solves FLOATER's ODE once for all blocks; the pass of this
        # forward is read by the layers within the scope, and dropped with it
        with floater_pass(flow_of(injector), src_tokens.size(1)):
            position_pass = injector.build_pass(src_tokens)
            outer = open_pass(position_pass)
            try:
                out = super().forward(src_tokens, *args, **kwargs)
            finally:
                close_pass(outer)
        if position_pass.memo.source_padded is False:
            # nothing is padded (fairseq's encoder has looked, and handed its layers no mask): no mask for the
            # cross-attention either, which then runs without one (fairseq returns an all-False mask, which keeps
            # every cross-attention from torch's FlashAttention kernel); fairseq's decoder and beam search read an
            # empty list as no padding
            out["encoder_padding_mask"] = []
        return out

    def max_positions(self):
        # no hidden cap: only a table-based encoding limits the length
        return self.embed_positions.max_positions


class TransformerPEDecoder(TransformerDecoderBase):
    def __init__(self, cfg, dictionary, embed_tokens, no_encoder_attn=False, output_projection=None):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=no_encoder_attn,
                         output_projection=output_projection)
        num_blocks, blocks = blocks_of("decoder", len(self.layers))
        self.embed_positions = build_position_injector(
            cfg, num_blocks, cfg.decoder.embed_dim, cfg.decoder.attention_heads, self.padding_idx, "target",
            cross_attention=not no_encoder_attn,
        )
        # by index: iterating a LayerDropModuleList (--encoder-layerdrop) in training mode drops layers at random
        for block, layer in zip(blocks, (self.layers[i] for i in range(len(self.layers)))):
            layer.attach_positions(self.embed_positions, block)

    def build_decoder_layer(self, cfg, no_encoder_attn=False):
        return wrap_layer(PositionAwareDecoderLayer(cfg, no_encoder_attn), cfg)

    def extract_features(self, prev_output_tokens, encoder_out=None, incremental_state=None, **kwargs):
        injector = self.embed_positions
        length = prev_output_tokens.size(1)
        source = None  # a pass without encoder_out has no source
        if encoder_out is not None and len(encoder_out["encoder_out"]) > 0:
            enc = encoder_out["encoder_out"][0]  # (S, B, C)
            mask = encoder_out["encoder_padding_mask"]
            source = Source(enc.size(0), enc.size(1), mask[0] if len(mask) > 0 else None)
            if injector.cross_bias is not None:
                length = max(length, enc.size(0))
        # this forward's (or decoding step's) pass, read by the layers within the scope and dropped with it
        with floater_pass(flow_of(injector), length):
            outer = open_pass(injector.build_pass(prev_output_tokens, incremental_state is not None, source))
            try:
                return super().extract_features(prev_output_tokens, encoder_out=encoder_out,
                                                incremental_state=incremental_state, **kwargs)
            finally:
                close_pass(outer)

    def max_positions(self):
        return self.embed_positions.max_positions

    def buffered_future_mask(self, tensor):
        """fairseq's future mask of a full pass, as a stand-in of no storage: its self-attentions
        (:class:`~fairseq_pe.models.attention.PositionAttention`) know it by its shape and build the rows they need
        (``mask_rows``), so that a pass of T tokens never holds fairseq's T × T float mask (1 GiB at 16,384 tokens, cached
        by fairseq at the longest length seen).  The stand-in is −inf everywhere: whatever read it as a mask would mask
        every key, loudly.  With ``--cross-self-attention`` (fairseq concatenates it with the source's mask) it is
        fairseq's own, as for attentions that do not know it (``future_masked`` off)."""
        if self.cross_self_attention or not all(getattr(self.layers[i].self_attn, "future_masked", False)
                                                for i in range(len(self.layers))):
            return super().buffered_future_mask(tensor)
        dim = tensor.size(0)
        return tensor.new_full((1, 1), float("-inf")).expand(dim, dim)


@register_model("transformer_pe")
class TransformerPEModel(TransformerModel):
    """fairseq's Transformer with ``--pe-*`` position encodings (see ``docs/encodings.md``)."""

    def __init__(self, args, encoder, decoder):
        super().__init__(args, encoder, decoder)
        # FLOATER: one flow (dynamics networks) for the whole model; None without FLOATER
        self.floater = build_floater_flow(args, {"encoder": encoder.embed_positions,
                                                 "decoder": decoder.embed_positions})
        apply_floater_freezing(self, self.floater, args)
        use_stock_dropout_names(self)

    def __prepare_scriptable__(self):
        """``torch.jit.script``: fairseq's scriptable ``transformer`` with these weights, or an error naming the
        option that keeps this model from it (:mod:`.export`)."""
        from .export import stock_equivalent

        return stock_equivalent(self)

    def prepare_for_inference_(self, cfg):
        with as_user_errors():
            super().prepare_for_inference_(cfg)

    def make_generation_fast_(self, **kwargs):
        """``--retain-dropout-modules`` matched exactly, by class names (:func:`.layers.retained_dropout_modules`)."""
        super().make_generation_fast_(**exact_retain_dropout_modules(self, kwargs))

    def forward(self, src_tokens, src_lengths, prev_output_tokens, **kwargs):
        # one ODE solve serves the encoder and the decoder of this pass
        with floater_pass(self.floater, max(src_tokens.size(1), prev_output_tokens.size(1))):
            return super().forward(src_tokens, src_lengths, prev_output_tokens, **kwargs)

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_position_encoding_args(parser)

    @classmethod
    def build_model(cls, args, task):
        # a bad option is the user's to fix: one line, exit 2 (fairseq_pe.errors), naming the flag or YAML key
        with config_door(args) as args, as_user_errors():
            check_translation_task(task)
            base_architecture(args)
            validate_position_args(args)
            with numbered_layers(args):
                model = super().build_model(args, task)
            check_finite_position_args(args)
            return model

    @classmethod
    def build_encoder(cls, cfg, src_dict, embed_tokens):
        return TransformerPEEncoder(cfg, src_dict, embed_tokens)

    @classmethod
    def build_decoder(cls, cfg, tgt_dict, embed_tokens):
        return TransformerPEDecoder(cfg, tgt_dict, embed_tokens, no_encoder_attn=cfg.no_cross_attention)


# architectures: fairseq's own, plus the position-encoding defaults


@register_model_architecture("transformer_pe", "transformer_pe")
def base_architecture(args):
    position_encoding_defaults(args)
    stock.base_architecture(args)


@register_model_architecture("transformer_pe", "transformer_pe_tiny")
def transformer_pe_tiny(args):
    """For tests and demos: 2+2 layers, 64 dims, 4 heads, FFN 256."""
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 64)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 256)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    args.encoder_layers = getattr(args, "encoder_layers", 2)
    args.decoder_embed_dim = getattr(args, "decoder_embed_dim", 64)
    args.decoder_ffn_embed_dim = getattr(args, "decoder_ffn_embed_dim", 256)
    args.decoder_attention_heads = getattr(args, "decoder_attention_heads", 4)
    args.decoder_layers = getattr(args, "decoder_layers", 2)
    base_architecture(args)


@register_model_architecture("transformer_pe", "transformer_pe_iwslt_de_en")
def transformer_pe_iwslt_de_en(args):
    position_encoding_defaults(args)
    stock.transformer_iwslt_de_en(args)


@register_model_architecture("transformer_pe", "transformer_pe_wmt_en_de")
def transformer_pe_wmt_en_de(args):
    position_encoding_defaults(args)
    stock.transformer_wmt_en_de(args)


@register_model_architecture("transformer_pe", "transformer_pe_vaswani_wmt_en_de_big")
def transformer_pe_vaswani_wmt_en_de_big(args):
    position_encoding_defaults(args)
    stock.transformer_vaswani_wmt_en_de_big(args)


@register_model_architecture("transformer_pe", "transformer_pe_vaswani_wmt_en_fr_big")
def transformer_pe_vaswani_wmt_en_fr_big(args):
    position_encoding_defaults(args)
    stock.transformer_vaswani_wmt_en_fr_big(args)


@register_model_architecture("transformer_pe", "transformer_pe_wmt_en_de_big")
def transformer_pe_wmt_en_de_big(args):
    position_encoding_defaults(args)
    stock.transformer_wmt_en_de_big(args)
