"""A checkpoint given to a tool of the other kind of model: one line naming what fits, not a traceback.

fairseq builds a checkpoint's model with the task of the command line: ``fairseq-eval-lm`` (``--task
language_modeling``) built a translation checkpoint's encoder-decoder and failed on ``supported_targets``;
``fairseq-generate`` (``--task translation``) built a language model over the translation dictionaries and failed
loading its weights (size mismatch).  Each of the plugin's models checks the task it is built for.
"""

from fairseq_pe.errors import UserError


def check_translation_task(task):
    """``transformer_pe`` (an encoder-decoder) is built for a task with a source and a target, not a language
    model's."""
    from fairseq.tasks.language_modeling import LanguageModelingTask

    if isinstance(task, LanguageModelingTask):
        raise UserError("the checkpoint's model is transformer_pe, an encoder-decoder translation model, and --task "
                        "language_modeling (fairseq-eval-lm's default) scores a language model: evaluate it with "
                        "fairseq-generate, fairseq-validate or fairseq-pe-bucket-loss on its translation data, or "
                        "train a language model (--arch transformer_lm_pe)")


def check_language_modeling_task(task):
    """``transformer_lm_pe`` (a decoder alone) is built for a language model's task, not a translation task."""
    from fairseq.tasks.translation import TranslationTask

    if isinstance(task, TranslationTask):
        raise UserError("the checkpoint's model is transformer_lm_pe, a language model, and --task translation "
                        "translates with an encoder-decoder: evaluate it with fairseq-eval-lm, or generate from it "
                        "with fairseq-generate --task language_modeling (or fairseq-interactive) on its own data")
