"""Warm start ``roberta_pe`` from a RoBERTa checkpoint with another position encoding
(Liu et al. 2020, FLOATER §4.2 and supplementary: "download a pretrained RoBERTa model, plug in
some flow-based encoding layers, and re-train the encoding layers ... then finetune").

    fairseq-pe-warm-start-roberta roberta.base/model.pt roberta_floater.pt --data roberta.base
    # 1. train only FLOATER's dynamics on text, the body frozen
    fairseq-train TEXT-BIN --user-dir fairseq_pe --task masked_lm --criterion masked_lm \\
        --arch roberta_pe_base --pe-floater-bias --pe-floater-freeze-body \\
        --restore-file roberta_floater.pt --reset-optimizer --reset-dataloader --reset-meters ...
    # 2. fine-tune (GLUE: --task sentence_prediction; SQuAD: --task span_prediction)

Input: a checkpoint of fairseq's stock ``roberta`` (any architecture: learned positions) or of
``roberta_pe``.  Output: a ``roberta_pe`` checkpoint with the encoding given by ``--pe-*``
(default: the checkpoint's learned table kept, ``--pe-absolute learned``, plus FLOATER's Q/K/V
biases, ``--pe-floater-bias``: the paper's plug-in):

* every weight of the checkpoint is copied (token embeddings, layers, LM head, classification
  heads); a stock learned table becomes ``--pe-absolute learned`` (the same rows: fairseq offsets
  positions by ``padding_idx + 1``) when that is the target, and is dropped otherwise (printed);
* the new encoding's parameters keep their own initialisation (sinusoidal frequencies, relative
  vectors, ...).  FLOATER's biases start at zero with h ≡ 0 (the last layer of h zero), so with
  ``--pe-absolute learned --pe-floater-bias`` the converted model computes exactly what the
  original did: the script checks the masked-LM log-probabilities on a random padded batch and
  refuses to write a checkpoint that differs by more than ``--tolerance``.  For a conversion
  that changes the encoding (e.g. ``--pe-relative learned``) the difference is printed: it is
  what fine-tuning has to absorb;
* the optimizer state is dropped.

OUTPUT is never CHECKPOINT itself, and an existing OUTPUT is replaced only with ``--force``; it is
written atomically (a temporary file in its folder, renamed when complete).
"""

import argparse
import copy
import logging

import torch

from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.models.roberta import RobertaModel

import fairseq_pe  # noqa: F401  (registers roberta_pe)
from fairseq_pe.errors import cli
from fairseq_pe.models.options import add_position_encoding_args
from fairseq_pe.models.roberta_pe import LEARNED_TABLE_KEY, RobertaPEModel
from fairseq_pe.positional.learned import LearnedPositionEncoding
from fairseq_pe.positional.sinusoid_scale import SCALE_KEY
from fairseq_pe.warm_start.floater import (WarmStartError, _model_args, check_paths, load_original, read_checkpoint,
                                           registered_model_class, save_converted)

logger = logging.getLogger("fairseq_pe.warm_start.roberta")

STOCK_TABLE_KEY = "encoder.sentence_encoder.embed_positions.weight"


def converted_args(model_args, pe_options: dict):
    """``roberta_pe`` arguments: the checkpoint's sizes and options, the ``--pe-*`` given."""
    cls = registered_model_class(model_args, RobertaModel, "roberta", "roberta_pe", "fairseq RoBERTa",
                                 " (transformer checkpoints: fairseq-pe-warm-start-floater)")
    args = copy.deepcopy(model_args)
    stock = not issubclass(cls, RobertaPEModel)
    if stock:
        if getattr(args, "no_token_positional_embeddings", False):
            raise WarmStartError("this RoBERTa checkpoint has no position embeddings "
                                 "(--no-token-positional-embeddings): nothing to warm start from")
        args.encoder_learned_pos = False
        args.pe_absolute = "learned"
        args.pe_relative = "none"
    if not pe_options:  # the paper's plug-in: keep the table, add FLOATER's Q/K/V biases
        pe_options = {"pe_floater_bias": True}
    for name, value in pe_options.items():
        setattr(args, name, value)
    args.arch = args._name = "roberta_pe"
    args.load_checkpoint_heads = True  # keep the checkpoint's classification/span heads
    return args, stock


def map_state(old_state: dict, new_model, padding_idx: int, stock: bool):
    """The checkpoint's weights under the new model's names; what was dropped."""
    mapped, dropped = {}, []
    target_learned = isinstance(new_model.encoder.position_injector.absolute, LearnedPositionEncoding)
    new_keys = set(new_model.state_dict())
    for key, value in old_state.items():
        if stock and key == STOCK_TABLE_KEY:
            if target_learned:
                mapped[LEARNED_TABLE_KEY] = value[padding_idx + 1:].unsqueeze(0)
            else:
                dropped.append(key)
            continue
        if (key == LEARNED_TABLE_KEY and not target_learned) or (".embed_positions." in key and key not in new_keys):
            dropped.append(key)  # the old encoding's own state (a table, frequencies, a scale): replaced
            continue
        mapped[key] = value
    unexpected = sorted(k for k in mapped if k not in new_keys and not k.startswith(("classification_heads.",
                                                                                      "span_heads.")))
    if unexpected:
        raise WarmStartError(f"weights of the checkpoint have no place in the roberta_pe model: {unexpected[:8]}")
    return mapped, dropped


def _is_position_parameter(name: str) -> bool:
    return ".embed_positions." in name or name.startswith("floater.")


def exact_by_construction(args, stock_or_same_encoding: bool) -> bool:
    """Whether the converted model must compute what the original did (only FLOATER biases added)."""
    return (stock_or_same_encoding and args.pe_absolute == "learned" and not args.pe_all_blocks
            and args.pe_relative == "none")


def max_output_difference(original, converted, dictionary, seed: int = 0) -> float:
    """Largest |log-prob difference| of the masked-LM outputs on a random right-padded batch."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(dictionary.nspecial, len(dictionary), (4, 29), generator=g)
    tokens[:, 0] = dictionary.bos()
    tokens[1, 20:] = dictionary.pad()
    tokens[3, 7:] = dictionary.pad()
    outs = []
    for model in (original, converted):
        model.eval()
        with torch.no_grad():
            logits, _ = model(tokens)
            outs.append(torch.log_softmax(logits.float(), dim=-1)[tokens.ne(dictionary.pad())])
    return float((outs[0] - outs[1]).abs().max())


def main(argv=None):
    p = argparse.ArgumentParser(prog="fairseq-pe-warm-start-roberta", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    p.add_argument("checkpoint", help="fairseq roberta or roberta_pe checkpoint")
    p.add_argument("output", help="where to write the roberta_pe checkpoint")
    p.add_argument("--data", help="directory with the checkpoint's dict.txt (default: the one it was trained on)")
    p.add_argument("--tolerance", type=float, default=1e-4,
                   help="largest allowed log-probability difference when the conversion is exact by "
                        "construction (learned table kept, only FLOATER biases added)")
    p.add_argument("--seed", type=int, default=1, help="seed of the new encoding's initialisation")
    p.add_argument("--force", action="store_true", default=False,
                   help="replace OUTPUT if it exists (it is never allowed to be CHECKPOINT itself)")
    add_position_encoding_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    pe_options = {k: v for k, v in vars(args).items() if k.startswith("pe_")}
    if pe_options.get("pe_floater_dynamics", "ode") != "ode" and pe_options.get("pe_floater_bias"):
        raise WarmStartError("--pe-floater-dynamics: the exact warm start needs the ODE (h ≡ 0)")
    check_paths(args)

    state = read_checkpoint(args.checkpoint)
    old_args = _model_args(state)
    new_args, stock = converted_args(old_args, pe_options)
    same_encoding = stock or (getattr(old_args, "pe_absolute", None) == "learned"
                              and getattr(old_args, "pe_relative", "none") == "none"
                              and not getattr(old_args, "pe_all_blocks", False))

    models, _, task = load_original(args.checkpoint, getattr(args, "data", None))
    original = models[0]
    if stock:
        rows = original.encoder.sentence_encoder.embed_positions.weight.size(0)
        new_args.max_positions = rows - task.source_dictionary.pad() - 1
    torch.manual_seed(args.seed)
    converted = ARCH_MODEL_REGISTRY["roberta_pe"].build_model(new_args, task)
    mapped, dropped = map_state(original.state_dict(), converted, task.source_dictionary.pad(), stock)
    # a new sinusoidal encoding keeps its own scale (loading would take a missing one for an old checkpoint's S = 1)
    own_scales = {k: v for k, v in converted.state_dict().items() if k.endswith(SCALE_KEY) and k not in mapped}
    missing, _ = converted.load_state_dict({**mapped, **own_scales}, strict=False)
    missing = list(missing) + list(own_scales)
    not_positions = [k for k in missing if not _is_position_parameter(k)]
    if not_positions:
        raise WarmStartError(f"the roberta_pe model has weights the checkpoint lacks: {not_positions[:8]}")
    if converted.floater is not None and getattr(new_args, "pe_floater_bias", False):
        converted.floater.zero_dynamics()
        bias = converted.encoder.position_injector.self_bias
        with torch.no_grad():
            bias.initial.zero_()
    missing = set(missing)
    new_params = {n: p for n, p in converted.named_parameters() if n in missing}
    for key in dropped:
        logger.info(f"dropped {key}: the new encoding replaces it")
    logger.info(f"copied {len(mapped)} tensors; new position-encoding parameters "
                f"({sum(p.numel() for p in new_params.values()):,}): {sorted(new_params) or 'none'}")

    diff = max_output_difference(original, converted, task.source_dictionary)
    logger.info(f"max |log p(original) - log p(converted)| on a random batch: {diff:.3g}")
    if exact_by_construction(new_args, same_encoding):
        if diff > args.tolerance:
            raise WarmStartError(f"the converted model differs from the original by {diff:.3g} > --tolerance "
                                 f"{args.tolerance:g}; not writing {args.output}")
    else:
        logger.info("the encoding changed, so the outputs differ: continue pretraining or fine-tune")

    save_converted(state, converted, new_args, args.output)
    flags = [f"--pe-absolute {new_args.pe_absolute}"]
    if new_args.pe_relative != "none":
        flags.append(f"--pe-relative {new_args.pe_relative}")
    if new_args.pe_all_blocks:
        flags.append("--pe-all-blocks")
    if getattr(new_args, "pe_floater_bias", False):
        flags.append("--pe-floater-bias")
    logger.info(f"wrote {args.output}. Continue with: fairseq-train ... --user-dir fairseq_pe --arch roberta_pe "
                f"--max-positions {new_args.max_positions} {' '.join(flags)} --restore-file {args.output} "
                "--reset-optimizer --reset-dataloader --reset-meters"
                + (" --pe-floater-freeze-body (train the dynamics only, paper §4.2)"
                   if getattr(new_args, "pe_floater_bias", False) else ""))
    return diff


@cli
def cli_main(argv=None):
    """The console script: a :class:`~fairseq_pe.errors.UserError` ends as ``PROG: error: ...``, status 2."""
    main(argv)


if __name__ == "__main__":
    cli_main()
