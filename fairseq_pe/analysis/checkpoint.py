"""Load any fairseq translation or RoBERTa checkpoint for analysis, without its data.

``transformer_pe`` / ``roberta_pe`` checkpoints and fairseq's stock ``transformer`` / ``roberta``
(and their architectures) are rebuilt from the configuration stored in the checkpoint, as
``fairseq-generate`` does, except that no task is set up: the analysis needs no data
directory, so the dictionaries are placeholders of the stored sizes (position analysis feeds
token ids, never words).  Every encoder weight must load; a checkpoint of another kind of
model is refused with the reason.
"""

import argparse
import contextlib
import os
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Dict, List

import torch
from omegaconf import OmegaConf, open_dict

#: (embedding weight in the state dict, what it gives) for the models we know
_EMBEDDINGS = {
    "translation": ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
    "roberta": ("encoder.sentence_encoder.embed_tokens.weight", None),
}


class CheckpointError(ValueError):
    """A checkpoint that cannot be analysed; the message names the file and why."""


@dataclass
class LoadedCheckpoint:
    path: str
    model: torch.nn.Module
    dictionary: object  # placeholder source dictionary of the stored size
    target_dictionary: object  # the decoder's (the source one for RoBERTa)
    arch: str
    family: str  # "translation" or "roberta"
    description: str  # the position encodings, in command-line terms
    #: token ids that are not words: specials, and RoBERTa's <mask> (the last entry)
    non_words: List[int] = field(default_factory=list)
    config: Dict[str, object] = field(default_factory=dict)


def placeholder_dictionary(size: int):
    """A fairseq Dictionary with the 4 specials and ``size`` entries in all."""
    from fairseq.data import Dictionary

    d = Dictionary()
    if size < d.nspecial:
        raise CheckpointError(f"an embedding table of {size} rows is smaller than fairseq's {d.nspecial} specials")
    for i in range(size - len(d)):
        d.add_symbol(f"<word{i}>")
    return d


def _model_config(state, path):
    cfg = state.get("cfg")
    model_cfg = cfg["model"] if cfg is not None and cfg.get("model") is not None else state.get("args")
    if model_cfg is None:
        raise CheckpointError(f"{path}: no model configuration stored (neither cfg.model nor args): "
                              "not a fairseq checkpoint")
    return model_cfg


def describe_encoding(model_cfg) -> str:
    """The position encodings of a configuration, as the flags that select them."""
    get = (lambda k, d=None: getattr(model_cfg, k, d)) if isinstance(model_cfg, argparse.Namespace) else \
        (lambda k, d=None: model_cfg.get(k, d))
    if get("pe_absolute") is None:  # a stock fairseq model
        if get("no_token_positional_embeddings", False):
            return "no positions (stock)"
        learned = get("encoder_learned_pos", False) or str(get("arch", "")).startswith("roberta") \
            or get("_name") == "roberta"
        return "learned APE (stock fairseq)" if learned else "sinusoidal APE (stock fairseq)"
    parts = [f"--pe-absolute {get('pe_absolute')}"]
    if get("pe_relative", "none") not in (None, "none"):
        parts.append(f"--pe-relative {get('pe_relative')}")
    for flag in ("pe_all_blocks", "pe_floater_bias"):
        if get(flag, False):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(parts)


def load_checkpoint(path: str) -> LoadedCheckpoint:
    """Rebuild the model of ``path`` (CPU, eval mode) with all its encoder weights."""
    import fairseq_pe  # noqa: F401  (registers the models; loads checkpoints on current torch)
    from fairseq import checkpoint_utils
    from fairseq.models import build_model

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except Exception as e:  # a truncated file, not a torch pickle, ...
        raise CheckpointError(f"{path}: cannot be read as a fairseq checkpoint ({type(e).__name__}: {e})") from None
    model_cfg = _model_config(state, path)
    weights = state.get("model") or {}
    if _EMBEDDINGS["roberta"][0] in weights:
        family = "roberta"
    elif _EMBEDDINGS["translation"][0] in weights:
        family = "translation"
    else:
        raise CheckpointError(f"{path}: neither a translation model (no encoder.embed_tokens.weight) nor a RoBERTa "
                              "model (no encoder.sentence_encoder.embed_tokens.weight): nothing to analyse")
    src_key, tgt_key = _EMBEDDINGS[family]
    src_dict = placeholder_dictionary(weights[src_key].size(0))
    tgt_dict = placeholder_dictionary(weights[tgt_key].size(0)) if tgt_key and tgt_key in weights else src_dict
    arch = getattr(model_cfg, "arch", None) or getattr(model_cfg, "_name", None) or "?"
    task = SimpleNamespace(source_dictionary=src_dict, target_dictionary=tgt_dict, dictionary=src_dict)
    with open_dict(model_cfg) if OmegaConf.is_config(model_cfg) else contextlib.nullcontext():
        model_cfg.load_checkpoint_heads = True  # keep RoBERTa's classification and span heads, as stored
    try:
        model = build_model(model_cfg, task)
        model.load_state_dict(weights, strict=True, model_cfg=model_cfg)
    except Exception as e:
        raise CheckpointError(f"{path}: cannot rebuild its model (--arch {arch}) with every stored weight: "
                              f"{type(e).__name__}: {str(e)[:500]}. A checkpoint of another plugin's model needs "
                              "that plugin imported first") from None
    non_words = list(range(src_dict.nspecial))
    if family == "roberta":
        non_words.append(len(src_dict) - 1)  # <mask>, appended by the masked_lm task
    return LoadedCheckpoint(path=path, model=model.eval(), dictionary=src_dict, target_dictionary=tgt_dict,
                            arch=arch, family=family,
                            description=describe_encoding(model_cfg), non_words=non_words,
                            config={"arch": arch, "family": family, "vocabulary": len(src_dict)})


def save_untrained_checkpoint(path: str, arch: str, flags=(), vocab: int = 1000, seed: int = 0,
                              max_positions: int = 512):
    """Write a fairseq checkpoint of a freshly initialised model of ``arch`` (``roberta_pe*``,
    ``transformer_pe*`` or a stock fairseq architecture) with command-line ``flags``: the
    untrained encodings of Wang et al.'s Table 1, and base-size checkpoints for benchmarks."""
    from fairseq.data import Dictionary
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY

    import fairseq_pe  # noqa: F401

    if arch not in ARCH_MODEL_REGISTRY:
        raise CheckpointError(f"--arch {arch}: not a registered architecture")
    cls = ARCH_MODEL_REGISTRY[arch]
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    cls.add_args(parser)
    args = parser.parse_args(list(flags))
    args.arch = arch
    for name in ("max_positions", "tokens_per_sample", "max_source_positions", "max_target_positions"):
        if not hasattr(args, name):
            setattr(args, name, max_positions)
    ARCH_CONFIG_REGISTRY[arch](args)
    d = Dictionary()
    for i in range(vocab - len(d)):
        d.add_symbol(f"w{i}")
    torch.manual_seed(seed)
    model = cls.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    torch.save({"cfg": {"model": args}, "model": model.state_dict(), "extra_state": {},
                "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "last_optimizer_state": None}, path)
    return model
