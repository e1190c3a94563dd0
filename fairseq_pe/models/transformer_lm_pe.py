"""``transformer_lm_pe``: fairseq's decoder-only language model with pluggable position encodings.

It extends fairseq's ``TransformerLanguageModel`` (``--task language_modeling``, ``fairseq-eval-lm``, the hub's
``sample``) and reuses ``transformer_pe``'s decoder (:class:`~fairseq_pe.models.transformer_pe.TransformerPEDecoder`:
the same ``--pe-*`` options, injector, layers and attention) without cross-attention.  fairseq's own builder makes
the token embeddings (plain, adaptive input or character), which the plugin's decoder takes over; nothing of the
stock decoder is kept.

Length: a decoder-only model is where length extrapolation is measured (Press et al. 2022, ALiBi, §4: train at L
tokens, ``fairseq-eval-lm --tokens-per-sample`` at L, 2L, ...).  Stock fairseq bounds evaluation by
``--max-target-positions`` (the task's ``--tokens-per-sample`` at training) and skips longer samples with a warning;
here only an encoding with a length limit (a learned table, ``--pe-random-positions``) bounds it, and in evaluation
(``prepare_for_inference_``: ``fairseq-eval-lm``, ``fairseq-generate``, ``fairseq-interactive``, the hub) a sample
beyond it is refused by name instead of skipped (:mod:`fairseq_pe.compat.size_errors`).
"""

import copy

from fairseq.models import register_model, register_model_architecture
from fairseq.models import transformer_lm as stock
from fairseq.models.transformer import TransformerConfig
from fairseq.models.transformer_lm import TransformerLanguageModel, TransformerLanguageModelConfig
from fairseq.dataclass.utils import gen_parser_from_dataclass
from fairseq.utils import safe_getattr

from fairseq_pe.errors import UserError, as_user_errors
from fairseq_pe.positional.injector import PositionLimit

from .floater_setup import apply_floater_freezing, build_floater_flow
from .layers import exact_retain_dropout_modules, numbered_layers, use_stock_dropout_names
from .options import (add_position_encoding_args, check_finite_position_args, position_encoding_defaults,
                      validate_position_args)
from .position_config import config_door
from .task_fit import check_language_modeling_task
from .transformer_pe import TransformerPEDecoder


class TransformerPELanguageModelDecoder(TransformerPEDecoder):
    """``transformer_pe``'s decoder without cross-attention: a language model's decoder."""

    def __init__(self, cfg, dictionary, embed_tokens):
        super().__init__(cfg, dictionary, embed_tokens, no_encoder_attn=True)


@register_model("transformer_lm_pe")
class TransformerPELanguageModel(TransformerLanguageModel):
    """fairseq's ``transformer_lm`` with ``--pe-*`` position encodings (module docstring; ``docs/lm.md``)."""

    def __init__(self, decoder, args=None):
        super().__init__(decoder)
        #: set by prepare_for_inference_ (evaluation, generation): a sample past the length limit is refused there
        self.evaluating = False
        # FLOATER: one flow (dynamics networks) for the decoder; None without FLOATER
        self.floater = build_floater_flow(args, {"decoder": decoder.embed_positions}) if args is not None else None
        if args is not None:
            apply_floater_freezing(self, self.floater, args)
        use_stock_dropout_names(self)

    @classmethod
    def hub_models(cls):
        return {}  # the stock names are stock checkpoints: load those with TransformerLanguageModel

    @classmethod
    def add_args(cls, parser):
        # registered without a dataclass, so that cfg.model keeps the --pe-* options (as transformer_pe): fairseq's
        # LM options without their defaults, which the architectures fill in
        gen_parser_from_dataclass(parser, TransformerLanguageModelConfig(), delete_default=True)
        add_position_encoding_args(parser)

    @classmethod
    def build_model(cls, args, task):
        # a bad option is the user's to fix: one line, exit 2 (fairseq_pe.errors), naming the flag or YAML key
        with config_door(args) as args, as_user_errors():
            check_language_modeling_task(task)
            base_lm_architecture(args)
            validate_position_args(args)
            if getattr(args, "character_embeddings", False):
                raise UserError("--character-embeddings is not supported by transformer_lm_pe (fairseq builds its "
                                "character filters with eval(--character-filters)); remove it")
            # fairseq's builder makes the token embeddings (and sets --max-target-positions from
            # --tokens-per-sample); its decoder is built with no layer and dropped
            shell = copy.copy(args)
            shell.decoder_layers, shell.decoder_layers_to_keep = 0, None
            embed_tokens = super().build_model(shell, task).decoder.embed_tokens
            args.max_target_positions = shell.max_target_positions
            if args.decoder_layers_to_keep:
                args.decoder_layers = len(args.decoder_layers_to_keep.split(","))
            with numbered_layers(args, sides=("decoder",)):
                decoder = TransformerPELanguageModelDecoder(TransformerConfig.from_namespace(args),
                                                            task.target_dictionary, embed_tokens)
            check_finite_position_args(args)
            return cls(decoder, args)

    def max_positions(self):
        """The decoder's limit; in evaluation it says that a longer sample is refused, not skipped."""
        limit = self.decoder.max_positions()
        if self.evaluating and isinstance(limit, PositionLimit):
            return PositionLimit(limit, limit.why, refuse=True,
                                 fix="evaluate with a --tokens-per-sample (plus --context-window) of at most "
                                     f"{int(limit)}")
        return limit

    def prepare_for_inference_(self, cfg):
        self.evaluating = True
        with as_user_errors():
            self._check_evaluation_options(cfg)
            self._check_sliding_window(cfg)
            self._report_document_separators(cfg)
            super().prepare_for_inference_(cfg)

    @staticmethod
    def _check_evaluation_options(cfg):
        """``fairseq-eval-lm``'s window, batch and split options, each one line naming it (fairseq evaluated a
        negative --context-window as none, and failed later with a traceback for the others)."""
        import os

        from fairseq import utils

        context = getattr(getattr(cfg, "eval_lm", None), "context_window", 0) or 0
        scored = getattr(getattr(cfg, "task", None), "tokens_per_sample", None)  # fairseq took the context from it
        if context < 0:
            raise UserError(f"--context-window must be 0 or more (0: each block scored without context), got "
                            f"{context}")
        if isinstance(scored, int) and scored <= 0:
            if context > 0:
                raise UserError(f"--context-window {context} must be smaller than --tokens-per-sample "
                                f"{scored + context}: each window scores its last --tokens-per-sample − "
                                "--context-window tokens")
            raise UserError(f"--tokens-per-sample must be at least 1, got {scored}")
        dataset = getattr(cfg, "dataset", None)
        max_tokens = getattr(dataset, "max_tokens", None)
        # fairseq batches a sliding window by its scored tokens (LMContextWindowDataset.num_tokens is its block's):
        # --max-tokens must hold those, the window's context comes on top
        if isinstance(scored, int) and max_tokens is not None and max_tokens < scored:
            raise UserError(f"--max-tokens {max_tokens} cannot hold one window's {scored} scored tokens ("
                            + (f"--tokens-per-sample {scored + context} − --context-window {context}; fairseq counts "
                               "a window's scored tokens, not its context" if context else "--tokens-per-sample")
                            + f"): give at least {scored}")
        subset, data = getattr(dataset, "gen_subset", None), getattr(getattr(cfg, "task", None), "data", None)
        if subset and data:
            folder = utils.split_paths(data)[0]
            prefix = os.path.join(folder, subset)
            if os.path.isdir(folder) and not any(os.path.exists(prefix + ext) for ext in (".bin", ".idx", "")):
                splits = sorted({name.rsplit(".", 1)[0] for name in os.listdir(folder) if name.endswith(".idx")})
                raise UserError(f"--gen-subset {subset}: no such split in {folder} (it has: "
                                f"{', '.join(splits) or 'none'})")

    @staticmethod
    def _report_document_separators(cfg):
        """``--sample-break-mode complete_doc`` takes the empty lines of the split as document boundaries and leaves
        them out of every block (fairseq's ``TokenBlockDataset``): ``fairseq-eval-lm`` then evaluated fewer tokens
        than the split holds without a word.  One line says how many are left out, and why."""
        import logging
        import os

        from fairseq import utils
        from fairseq.data import data_utils

        task = getattr(cfg, "task", None)
        subset = getattr(getattr(cfg, "dataset", None), "gen_subset", None)
        if getattr(task, "sample_break_mode", None) != "complete_doc" or not subset or not getattr(task, "data", None):
            return
        dataset = data_utils.load_indexed_dataset(os.path.join(utils.split_paths(task.data)[0], subset), None)
        if dataset is None:
            return  # fairseq reports the missing split
        sizes = dataset.sizes
        separators, total = int((sizes == 1).sum()), int(sizes.sum())
        if separators:
            logging.getLogger("fairseq_pe").warning(
                f"--sample-break-mode complete_doc: the {separators:,} empty lines of {subset} separate documents and "
                f"are not scored (fairseq leaves them out of every block): {total - separators:,} of {total:,} tokens "
                "are evaluated; --sample-break-mode eos, complete or none score them")

    def _check_sliding_window(self, cfg):
        """``fairseq-eval-lm --context-window C``: each window holds ``--tokens-per-sample`` tokens (fairseq has taken C
        from it already) plus C of context, which must fit the length limit (the other windows are checked when the
        data is batched, :mod:`fairseq_pe.compat.size_errors`)."""
        limit = self.decoder.max_positions()
        context = getattr(getattr(cfg, "eval_lm", None), "context_window", 0) or 0
        scored = getattr(getattr(cfg, "task", None), "tokens_per_sample", None)
        if isinstance(limit, PositionLimit) and context > 0 and isinstance(scored, int) and scored + context > limit:
            raise UserError(f"--tokens-per-sample {scored + context} with --context-window {context}: windows of "
                            f"{scored + context} tokens are longer than the model's limit, {int(limit)} tokens: "
                            f"evaluate with a --tokens-per-sample of at most {int(limit)} (the limit is {limit.why})")

    def make_generation_fast_(self, **kwargs):
        """``--retain-dropout-modules`` matched exactly, by class names (:func:`.layers.retained_dropout_modules`)."""
        super().make_generation_fast_(**exact_retain_dropout_modules(self, kwargs))

    def __prepare_scriptable__(self):
        raise UserError("torch.jit.script: transformer_lm_pe cannot be exported to TorchScript; export works for "
                        "transformer_pe with an absolute encoding (docs/encodings.md)")


# architectures: fairseq's own, plus the position-encoding defaults


@register_model_architecture("transformer_lm_pe", "transformer_lm_pe")
def base_lm_architecture(args):
    position_encoding_defaults(args)
    stock.base_lm_architecture(args)


@register_model_architecture("transformer_lm_pe", "transformer_lm_pe_tiny")
def transformer_lm_pe_tiny(args):
    """For tests and CPU runs: 2 layers, 64 dims, 4 heads, FFN 256."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 2)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 64)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 256)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 4)
    base_lm_architecture(args)


@register_model_architecture("transformer_lm_pe", "transformer_lm_pe_small")
def transformer_lm_pe_small(args):
    """The CPU reproduction's language model at the scale where position matters (docs/lm.md): 4 layers, 128 dims,
    4 heads, FFN 512."""
    args.decoder_layers = safe_getattr(args, "decoder_layers", 4)
    args.decoder_embed_dim = safe_getattr(args, "decoder_embed_dim", 128)
    args.decoder_ffn_embed_dim = safe_getattr(args, "decoder_ffn_embed_dim", 512)
    args.decoder_attention_heads = safe_getattr(args, "decoder_attention_heads", 4)
    base_lm_architecture(args)


@register_model_architecture("transformer_lm_pe", "transformer_lm_pe_wiki103")
def transformer_lm_pe_wiki103(args):
    """fairseq's ``transformer_lm_wiki103`` (Baevski & Auli 2019: 16 layers of 1024, adaptive input and softmax), the
    model ALiBi's experiments train (Press et al. 2022, §4)."""
    position_encoding_defaults(args)
    stock.transformer_lm_baevski_wiki103(args)


@register_model_architecture("transformer_lm_pe", "transformer_lm_pe_gpt2_small")
def transformer_lm_pe_gpt2_small(args):
    """fairseq's ``transformer_lm_gpt2_small`` (24 layers of 1024, 16 heads, GELU)."""
    position_encoding_defaults(args)
    stock.transformer_lm_gpt2_small(args)
