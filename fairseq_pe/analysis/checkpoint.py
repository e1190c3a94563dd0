"""Load any fairseq translation or RoBERTa checkpoint for analysis, without its data.

``transformer_pe`` / ``roberta_pe`` checkpoints and fairseq's stock ``transformer`` / ``roberta``
(and their architectures) are rebuilt from the configuration stored in the checkpoint, as
``fairseq-generate`` does, except that no task is set up: the analysis needs no data directory.
The dictionaries are the task's own when its data folder is still there, else placeholders of
the stored sizes (position analysis feeds token ids, never words).  Every stored weight must
load; a checkpoint of another kind of model is refused with the reason.
"""

import argparse
import contextlib
import os
import re
from dataclasses import dataclass
from types import SimpleNamespace
from typing import List, Optional

import torch
from omegaconf import OmegaConf, open_dict

from fairseq_pe.errors import UserError

#: (embedding weight in the state dict, what it gives) for the models we know
_EMBEDDINGS = {
    "translation": ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight"),
    "roberta": ("encoder.sentence_encoder.embed_tokens.weight", None),
}


class CheckpointError(UserError):
    """A checkpoint that cannot be analysed; the message names the file and why."""


@dataclass
class LoadedCheckpoint:
    path: str
    model: torch.nn.Module
    dictionary: object  # the source dictionary (placeholder of the stored size without the data folder)
    target_dictionary: object  # the decoder's (the source one for RoBERTa)
    arch: str
    family: str  # "translation" or "roberta"
    model_cfg: object = None
    #: where the dictionaries came from: their files, or "placeholder (...)"
    dictionary_source: str = ""
    #: tokens per training sequence when the checkpoint records it (masked LM), else None
    trained_length: Optional[int] = None

    def encoding(self, side: str = "encoder") -> str:
        """The position encoding of ``side``, in command-line terms."""
        return describe_encoding(self.model, self.model_cfg, side)

    @property
    def description(self) -> str:
        return self.encoding("encoder")

    def non_words(self, side: str = "encoder") -> List[int]:
        """Ids of ``side``'s dictionary that are no words: specials, ``<mask>``, language tags
        (``__xx__``, ``<xx>``) and fairseq-preprocess's ``madeupword`` padding (rows never trained)."""
        d = self.dictionary if side == "encoder" else self.target_dictionary
        out = list(range(d.nspecial))
        for i in range(d.nspecial, len(d)):
            word = d[i]
            if word.startswith("madeupword") or re.fullmatch(r"<[^<>\s]+>|__[^_\s]+__", word):
                out.append(i)
        return out


def placeholder_dictionary(size: int, mask: bool = False):
    """A fairseq Dictionary with the 4 specials and ``size`` entries in all (the last ``<mask>``
    when ``mask``, as the masked-LM tasks append it)."""
    from fairseq.data import Dictionary

    d = Dictionary()
    if size < d.nspecial + int(mask):
        raise CheckpointError(f"an embedding table of {size} rows is smaller than fairseq's {d.nspecial} specials")
    for i in range(size - len(d) - int(mask)):
        d.add_symbol(f"placeholder{i}")
    if mask:
        d.add_symbol("<mask>")
    return d


def _model_config(state, path):
    cfg = state.get("cfg")
    model_cfg = cfg["model"] if cfg is not None and cfg.get("model") is not None else state.get("args")
    if model_cfg is None:
        raise CheckpointError(f"{path}: no model configuration stored (neither cfg.model nor args): "
                              "not a fairseq checkpoint")
    return model_cfg


def _get(cfg, key, default=None):
    if cfg is None:
        return default
    try:
        value = getattr(cfg, key, default) if isinstance(cfg, argparse.Namespace) else cfg.get(key, default)
    except Exception:  # an unresolvable interpolation
        return default
    return default if value is None else value


def describe_encoding(model, model_cfg, side: str = "encoder") -> str:
    """The position encoding of one side: the ``--pe-*`` flags that select it, or for a stock
    fairseq model the kind of its position module."""
    from fairseq.modules import LearnedPositionalEmbedding, SinusoidalPositionalEmbedding

    from .vectors import side_of

    if _get(model_cfg, "pe_absolute") is None:  # a stock fairseq model
        module = side_of(model, side).embed_positions
        if module is None:
            return "no positions (stock fairseq)"
        if isinstance(module, LearnedPositionalEmbedding):
            return "learned APE (stock fairseq)"
        if isinstance(module, SinusoidalPositionalEmbedding):
            return "sinusoidal APE (stock fairseq)"
        return f"{type(module).__name__} (stock fairseq)"
    parts = [f"--pe-absolute {_get(model_cfg, 'pe_absolute')}"]
    if _get(model_cfg, "pe_relative", "none") != "none":
        parts.append(f"--pe-relative {_get(model_cfg, 'pe_relative')}")
    for flag in ("pe_all_blocks", "pe_floater_bias"):
        if _get(model_cfg, flag, False):
            parts.append("--" + flag.replace("_", "-"))
    return " ".join(parts)


def _real_dictionaries(task_cfg, family: str, sizes, checkpoint_path: str):
    """The task's dictionaries from its data folder, when it is there and they fit the stored
    embedding sizes; else None (and why).  A relative folder is looked for from the current
    directory, then from the checkpoint's folder and its parent (where a recipe ran)."""
    from fairseq.data import Dictionary

    data = _get(task_cfg, "data")
    if not data:
        return None, "no data folder recorded"
    folder = str(data).split(":")[0]
    if not os.path.isabs(folder):
        here = os.path.dirname(os.path.abspath(checkpoint_path))
        candidates = [folder, os.path.join(here, folder), os.path.join(os.path.dirname(here), folder)]
        folder = next((c for c in candidates if os.path.isdir(c)), folder)
    if family == "translation":
        from fairseq.data import data_utils

        src, tgt = _get(task_cfg, "source_lang"), _get(task_cfg, "target_lang")
        if (not src or not tgt) and os.path.isdir(folder):  # inferred from the data, as fairseq does
            src, tgt = data_utils.infer_language_pair(folder)
        files = [os.path.join(folder, f"dict.{lang}.txt") for lang in (src, tgt)] if src and tgt else []
        mask = False
    else:
        files = [os.path.join(folder, name) for name in ("dict.txt", os.path.join("input0", "dict.txt"))]
        files = [f for f in files if os.path.isfile(f)][:1]
        mask = True
    if not files or not all(os.path.isfile(f) for f in files):
        return None, f"no dictionary in {folder}"
    dicts = [Dictionary.load(f) for f in files]
    if mask:
        dicts[0].add_symbol("<mask>")
    if family == "roberta":
        dicts = [dicts[0], dicts[0]]
    if [len(d) for d in dicts] != list(sizes):
        return None, f"{', '.join(files)} do not match the stored embeddings ({list(sizes)} rows)"
    return dicts, ", ".join(dict.fromkeys(files))


def load_checkpoint(path: str) -> LoadedCheckpoint:
    """Rebuild the model of ``path`` (CPU, eval mode) with all its weights."""
    import fairseq_pe  # noqa: F401  (registers the models; loads checkpoints on current torch)
    from fairseq import checkpoint_utils
    from fairseq.models import build_model

    from fairseq_pe.safe_load import CheckpointRefused

    if not os.path.isfile(path):
        raise CheckpointError(f"{path}: no such file")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(path)
    except CheckpointRefused:  # it would run code as it loads: its own message names what and how to trust it
        raise
    except Exception as e:  # a truncated file, not a torch pickle, ...
        raise CheckpointError(f"{path}: cannot be read as a fairseq checkpoint ({type(e).__name__}: {e}), nor as a "
                              "position table (a .npy file, or a .pt file holding one 2-D tensor)") from None
    model_cfg = _model_config(state, path)
    task_cfg = state["cfg"].get("task") if state.get("cfg") is not None else state.get("args")
    weights = state.get("model") or {}
    if _EMBEDDINGS["roberta"][0] in weights:
        family = "roberta"
    elif _EMBEDDINGS["translation"][0] in weights:
        family = "translation"
    else:
        raise CheckpointError(f"{path}: neither a translation model (no encoder.embed_tokens.weight) nor a RoBERTa "
                              "model (no encoder.sentence_encoder.embed_tokens.weight): nothing to analyse")
    src_key, tgt_key = _EMBEDDINGS[family]
    sizes = (weights[src_key].size(0), weights[tgt_key].size(0) if tgt_key and tgt_key in weights
             else weights[src_key].size(0))
    dicts, source = _real_dictionaries(task_cfg, family, sizes, path)
    if dicts is None:
        source = f"placeholder ({source})"
        src_dict = placeholder_dictionary(sizes[0], mask=family == "roberta")
        tgt_dict = src_dict if family == "roberta" else placeholder_dictionary(sizes[1])
    else:
        src_dict, tgt_dict = dicts
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
                              "that plugin imported first (--user-dir)") from None
    trained = _get(task_cfg, "tokens_per_sample") if _get(task_cfg, "_name", _get(task_cfg, "task")) == "masked_lm" \
        else None
    return LoadedCheckpoint(path=path, model=model.eval(), dictionary=src_dict, target_dictionary=tgt_dict,
                            arch=arch, family=family, model_cfg=model_cfg, dictionary_source=source,
                            trained_length=int(trained) if trained else None)


def save_untrained_checkpoint(path: str, arch: str, flags=(), vocab: int = 1000, seed: int = 0,
                              max_positions: int = 512, task: Optional[dict] = None):
    """Write a fairseq checkpoint of a freshly initialised model of ``arch`` (``roberta_pe*``,
    ``transformer_pe*`` or a stock fairseq architecture) with command-line ``flags``: the
    untrained encodings of Wang et al.'s Table 1, and base-size checkpoints for benchmarks.
    ``task``: the task configuration to record (e.g. ``{"_name": "masked_lm", "tokens_per_sample": 128}``)."""
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
    from fairseq.models.roberta import RobertaModel

    mask = issubclass(cls, RobertaModel)  # the masked-LM tasks append <mask>
    d = Dictionary()
    for i in range(vocab - len(d) - int(mask)):
        d.add_symbol(f"w{i}")
    if mask:
        d.add_symbol("<mask>")
    torch.manual_seed(seed)
    model = cls.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
    cfg = {"model": args} if task is None else {"model": args, "task": task}
    torch.save({"cfg": cfg, "model": model.state_dict(), "extra_state": {},
                "optimizer_history": [{"criterion_name": "none", "optimizer_name": "none",
                                       "lr_scheduler_state": {"best": None}, "num_updates": 0}],
                "last_optimizer_state": None}, path)
    return model
