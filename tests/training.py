"""fairseq's own trainer in this process, on a tiny translation model and hand-made batches: what
``fairseq-train`` does for one update (its criterion, optimizer wrappers, loss scaling, overflow handling)
without its data loading and start-up."""

import logging
import os

import torch
from fairseq import options, tasks
from fairseq.data import Dictionary
from fairseq.dataclass.utils import convert_namespace_to_omegaconf
from fairseq.trainer import Trainer

from fairseq_pe.synthetic import random_batch

from helpers import PLUGIN

#: a 1+1-layer model of 16 dimensions and 2 heads: the attention and position code of the real ones, fast on CPU
TINY = ["--arch", "transformer_pe_tiny", "--encoder-layers", "1", "--decoder-layers", "1", "--encoder-embed-dim",
        "16", "--decoder-embed-dim", "16", "--encoder-ffn-embed-dim", "32", "--decoder-ffn-embed-dim", "32",
        "--encoder-attention-heads", "2", "--decoder-attention-heads", "2"]


def dictionary_dir(root, vocab: int = 40) -> str:
    """A translation task's data folder with only its dictionaries (``src``, ``tgt``; the same symbols)."""
    d = Dictionary()
    for i in range(vocab):
        d.add_symbol(f"w{i}")
    for lang in ("src", "tgt"):
        d.save(os.path.join(root, f"dict.{lang}.txt"))
    return str(root)


def build_trainer(data_dir, *flags, seed: int = 1):
    """fairseq's Trainer, task, model and criterion for ``fairseq-train DATA --user-dir fairseq_pe --cpu ... FLAGS``
    (label-smoothed cross-entropy, Adam, no dropout), the model initialised from ``seed``."""
    return _trainer(convert_namespace_to_omegaconf(_training_args(data_dir, flags, seed)), seed)


def build_trainers(data_dir, variants, *flags, seed: int = 1):
    """{key: :func:`build_trainer` (data_dir, *flags, *variant flags)} for each ``key: variant flags`` of
    ``variants``, with fairseq's configuration converted once (the conversion takes 2 s a trainer): the variants
    may differ only in ``cfg.common`` (the precision flags, ``--fp16-init-scale``), which is checked."""
    import copy

    base = _training_args(data_dir, flags, seed)
    cfg = convert_namespace_to_omegaconf(base)
    trainers = {}
    for key, extra in variants.items():
        args = _training_args(data_dir, [*flags, *extra], seed)
        changed = {k for k in set(vars(args)) | set(vars(base)) if getattr(args, k, None) != getattr(base, k, None)}
        assert changed <= set(cfg.common), f"{extra} changes options outside cfg.common: {changed - set(cfg.common)}"
        variant = copy.deepcopy(cfg)
        for k in changed:
            variant.common[k] = getattr(args, k)
        trainers[key] = _trainer(variant, seed)
    return trainers


def _training_args(data_dir, flags, seed):
    parser = options.get_training_parser()
    return options.parse_args_and_arch(parser, [
        str(data_dir), "--user-dir", PLUGIN, "--task", "translation", "-s", "src", "-t", "tgt", "--cpu",
        "--optimizer", "adam", "--lr", "0.003", "--criterion", "label_smoothed_cross_entropy",
        "--label-smoothing", "0.1", "--dropout", "0", "--seed", str(seed), "--max-tokens", "100000", *flags])


def _trainer(cfg, seed):
    previous = logging.root.manager.disable
    logging.disable(logging.INFO)  # the trainer's model summary
    try:
        task = tasks.setup_task(cfg.task)
        torch.manual_seed(seed)
        model = task.build_model(cfg.model)
        trainer = Trainer(cfg, task, model, task.build_criterion(cfg.criterion))
    finally:
        logging.disable(previous)
    return trainer


def batch(dictionary: Dictionary, source_lengths, target_lengths, seed: int = 0):
    """fairseq's collated batch of random sentences of these lengths (EOS included): the source left-padded and
    the target right-padded, as fairseq's translation task batches them."""
    return random_batch(dictionary, source_lengths, target_lengths, seed)
