"""``roberta_pe``: fairseq's RoBERTa (BERT-style masked-LM encoder) with pluggable position encodings.

It extends fairseq's ``RobertaModel`` and overrides hooks only: ``RobertaEncoder.build_encoder``
returns :class:`~fairseq_pe.models.transformer_pe.TransformerPEEncoder` (the encoder of
``transformer_pe``: the same ``--pe-*`` options, the same modules), so fairseq's ``masked_lm``
and ``sentence_prediction`` tasks work unchanged with ``--user-dir fairseq_pe --arch roberta_pe_*``.
For SQuAD the model also holds span heads (``--task span_prediction``).

Initialisation: fairseq's ``init_bert_params`` re-initialises every ``nn.Linear``,
``nn.Embedding`` and attention projection it finds (N(0, 0.02)).  The position encodings hold
plain parameters and buffers, so sinusoidal frequencies, FLOATER's dynamics and initial values,
relative vectors and T5 buckets keep their own initialisation; the one exception is by design:
a learned absolute table is drawn from BERT's N(0, 0.02), as stock RoBERTa's learned positions are.

Length: the learned table has ``--max-positions`` rows (the task's ``--tokens-per-sample`` when
not given).  BERT's schedule pretrains at 128 tokens and continues at 512: give
``--max-positions 512`` from the start, or continue from a checkpoint with a shorter table, which
is extended (the new rows initialised, a warning says how many); a checkpoint with *more* rows
than ``--max-positions`` is refused rather than cut.
"""

import logging

import torch
import torch.nn as nn

from fairseq.models import register_model, register_model_architecture
from fairseq.models.roberta.model import RobertaEncoder, RobertaModel
from fairseq.models.roberta import model as stock
from fairseq.models.transformer import TransformerConfig
from fairseq.modules.transformer_sentence_encoder import init_bert_params
from fairseq.utils import safe_hasattr

from fairseq_pe.errors import UserError, as_user_errors
from fairseq_pe.positional.floater import ROBERTA_BOUND_DEFAULTS
from fairseq_pe.positional.learned import LearnedPositionEncoding
from fairseq_pe.positional.sinusoid_scale import ROBERTA_DEFAULTS

from .floater_setup import apply_floater_freezing, build_floater_flow
from .layers import exact_retain_dropout_modules, numbered_layers, use_stock_dropout_names
from .options import (add_position_encoding_args, check_finite_position_args, position_encoding_defaults,
                      validate_position_args)
from .position_config import config_door
from .transformer_pe import TransformerPEEncoder

logger = logging.getLogger(__name__)

#: BERT's initialisation of embedding tables (fairseq's init_bert_params)
BERT_INIT_STD = 0.02
LEARNED_TABLE_KEY = "encoder.sentence_encoder.embed_positions.absolute.weight"


class RobertaSentenceEncoder(TransformerPEEncoder):
    """``transformer_pe``'s encoder; RoBERTa sets its length with ``--max-positions``."""

    max_positions_flag = "--max-positions"


class RobertaPEEncoder(RobertaEncoder):
    """fairseq's RoBERTa encoder whose sentence encoder is ``transformer_pe``'s encoder."""

    def build_encoder(self, args, dictionary, embed_tokens):
        encoder = RobertaSentenceEncoder(TransformerConfig.from_namespace(args), dictionary, embed_tokens)
        encoder.apply(init_bert_params)
        absolute = encoder.embed_positions.absolute
        if isinstance(absolute, LearnedPositionEncoding):
            nn.init.normal_(absolute.weight, mean=0.0, std=BERT_INIT_STD)
        return encoder

    @property
    def position_injector(self):
        return self.sentence_encoder.embed_positions


@register_model("roberta_pe")
class RobertaPEModel(RobertaModel):
    """fairseq's RoBERTa with ``--pe-*`` position encodings (see the module docstring)."""

    def __init__(self, args, encoder):
        super().__init__(args, encoder)
        self.span_heads = nn.ModuleDict()  # SQuAD start/end heads (--task span_prediction)
        # FLOATER: one flow for the encoder; None without FLOATER
        self.floater = build_floater_flow(args, {"encoder": encoder.position_injector})
        apply_floater_freezing(self, self.floater, args)
        use_stock_dropout_names(self)

    def __prepare_scriptable__(self):
        raise UserError("torch.jit.script: roberta_pe cannot be exported to TorchScript (fairseq's RoBERTa is not "
                        "scriptable either); export works for transformer_pe with an absolute encoding "
                        "(docs/encodings.md)")

    def prepare_for_inference_(self, cfg):
        with as_user_errors():
            super().prepare_for_inference_(cfg)

    def make_generation_fast_(self, **kwargs):
        """``--retain-dropout-modules`` matched exactly, by class names (:func:`.layers.retained_dropout_modules`)."""
        super().make_generation_fast_(**exact_retain_dropout_modules(self, kwargs))

    @classmethod
    def add_args(cls, parser):
        super().add_args(parser)
        add_position_encoding_args(parser)

    @classmethod
    def build_model(cls, args, task):
        # a bad option is the user's to fix: one line, exit 2 (fairseq_pe.errors), naming the flag or YAML key
        with config_door(args) as args, as_user_errors():
            return cls._build_model(args, task)

    @classmethod
    def _build_model(cls, args, task):
        base_architecture(args)
        if not safe_hasattr(args, "max_positions") or args.max_positions is None:
            if not safe_hasattr(args, "tokens_per_sample"):
                args.tokens_per_sample = task.max_positions()
            args.max_positions = args.tokens_per_sample
        args.max_source_positions = args.max_positions  # the learned table's rows
        validate_position_args(args)
        if args.pe_relative == "xpos":
            raise UserError("--pe-relative xpos scales causal attention only (Sun et al. 2022): in roberta_pe's "
                            "encoder it would be plain RoPE; use --pe-relative rope")
        if getattr(args, "pe_random_eval_decoder", None) not in (None, "indices"):
            raise UserError(f"--pe-random-eval-decoder {args.pe_random_eval_decoder} sets a decoder's positions: "
                            "roberta_pe has no decoder; remove it")
        tokens_per_sample = getattr(args, "tokens_per_sample", None)
        if isinstance(tokens_per_sample, int) and tokens_per_sample > args.max_positions:
            raise ValueError(f"--tokens-per-sample {tokens_per_sample} exceeds --max-positions "
                             f"{args.max_positions}: raise --max-positions")
        with numbered_layers(args, sides=("encoder",)):
            encoder = RobertaPEEncoder(args, task.source_dictionary)
        check_finite_position_args(args)
        return cls(args, encoder)

    def register_span_head(self, name: str):
        """A start/end head for span prediction (:mod:`fairseq_pe.models.span_head`)."""
        from .span_head import SpanPredictionHead

        if name not in self.span_heads:
            head = SpanPredictionHead(self.args.encoder_embed_dim)
            head.apply(init_bert_params)
            self.span_heads[name] = head

    def upgrade_state_dict_named(self, state_dict, name):
        super().upgrade_state_dict_named(state_dict, name)
        prefix = name + "." if name != "" else ""
        self._upgrade_span_heads(state_dict, prefix)
        self._fit_learned_table(state_dict, prefix)

    def _upgrade_span_heads(self, state_dict, prefix):
        """As fairseq does for classification heads: a checkpoint's span heads are kept when the
        model has them (or ``--load-checkpoint-heads``), the model's new heads keep their weights."""
        head_prefix = prefix + "span_heads."
        in_checkpoint = {k[len(head_prefix):].split(".")[0] for k in state_dict if k.startswith(head_prefix)}
        for head in sorted(in_checkpoint):
            if head not in self.span_heads:
                if getattr(self.args, "load_checkpoint_heads", False):
                    self.register_span_head(head)
                else:
                    logger.warning(f"deleting span head {head!r} from the checkpoint: not in the current model")
                    for k in [k for k in state_dict if k.startswith(f"{head_prefix}{head}.")]:
                        del state_dict[k]
        for k, v in self.span_heads.state_dict().items():
            if head_prefix + k not in state_dict:
                logger.info(f"new span head weights: {head_prefix + k}")
                state_dict[head_prefix + k] = v

    def _fit_learned_table(self, state_dict, prefix):
        """A learned table of a shorter run (e.g. pretrained at 128) grows to ``--max-positions``."""
        key = prefix + LEARNED_TABLE_KEY
        absolute = self.encoder.position_injector.absolute
        if key not in state_dict or not isinstance(absolute, LearnedPositionEncoding):
            return
        old, new = state_dict[key], absolute.weight
        if old.shape == new.shape:
            return
        if old.dim() != 3 or old.size(0) != new.size(0) or old.size(2) != new.size(2):
            return  # a different layout: the ordinary load reports the mismatch
        if old.size(1) > new.size(1):
            raise UserError(f"the checkpoint's learned position table has {old.size(1)} positions but "
                             f"--max-positions is {new.size(1)}: set --max-positions {old.size(1)} (or more); "
                             "the table is not cut")
        logger.warning(f"learned position table extended from {old.size(1)} to {new.size(1)} positions "
                       f"(--max-positions); rows {old.size(1)}..{new.size(1) - 1} are newly initialised "
                       f"N(0, {BERT_INIT_STD}²)")
        state_dict[key] = torch.cat([old, new.detach()[:, old.size(1):].to(old.dtype)], dim=1)


# architectures: RoBERTa's defaults plus the position-encoding defaults.  fairseq's RoBERTa sets
# --encoder-learned-pos; here positions come from --pe-absolute (default learned, as BERT's).


def _pe_defaults(args):
    args.pe_absolute = getattr(args, "pe_absolute", None) or "learned"
    position_encoding_defaults(args, sinusoid_scales=ROBERTA_DEFAULTS, floater_bounds=ROBERTA_BOUND_DEFAULTS)
    args.encoder_learned_pos = getattr(args, "encoder_learned_pos", False)


@register_model_architecture("roberta_pe", "roberta_pe")
def base_architecture(args):
    _pe_defaults(args)
    stock.base_architecture(args)


@register_model_architecture("roberta_pe", "roberta_pe_base")
def roberta_pe_base(args):
    """RoBERTa/BERT base: 12 layers × 768, 12 heads, FFN 3072."""
    base_architecture(args)


@register_model_architecture("roberta_pe", "roberta_pe_medium")
def roberta_pe_medium(args):
    """Wang et al.'s from-scratch BERT runs: 8 layers, otherwise base (768, 12 heads, FFN 3072)."""
    args.encoder_layers = getattr(args, "encoder_layers", 8)
    base_architecture(args)


@register_model_architecture("roberta_pe", "roberta_pe_large")
def roberta_pe_large(args):
    _pe_defaults(args)
    stock.roberta_large_architecture(args)


@register_model_architecture("roberta_pe", "roberta_pe_tiny")
def roberta_pe_tiny(args):
    """For tests and CPU runs: 4 layers × 128, 4 heads, FFN 512."""
    args.encoder_layers = getattr(args, "encoder_layers", 4)
    args.encoder_embed_dim = getattr(args, "encoder_embed_dim", 128)
    args.encoder_ffn_embed_dim = getattr(args, "encoder_ffn_embed_dim", 512)
    args.encoder_attention_heads = getattr(args, "encoder_attention_heads", 4)
    base_architecture(args)
