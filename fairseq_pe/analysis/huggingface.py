"""The position table of a Hugging Face model folder (``save_pretrained``, ``huggingface-cli download``).

Needs the optional extra ``pip install 'fairseq-pe[hf]'`` (transformers).  The folder's
``config.json`` is read with transformers' ``AutoConfig`` (offline: nothing is downloaded), and of
the weights only the position table, straight from ``model.safetensors`` (with safetensors, a
dependency of transformers; sharded checkpoints through their index) or ``pytorch_model.bin``
(``torch.load(weights_only=True)``, memory-mapped).  No model is built: that would read every
weight of a large model for one matrix, and import transformers' modelling code, which fails where
an incompatible torchaudio is installed (the torchaudio this project's lock pins is one).

Supported are the models whose absolute positions are one stored table, named in
:data:`POSITION_TABLES` (under any prefix: ``bert.``, ``roberta.``, ``transformer.``, ... as the
task heads' checkpoints store them):

* ``embeddings.position_embeddings.weight``: BERT, ALBERT, ELECTRA, DistilBERT (learned, or the
  sinusoids of ``sinusoidal_pos_embds``, which are stored too), RoBERTa, XLM-RoBERTa, CamemBERT;
* ``wpe.weight``: GPT-2, GPT-Neo.

RoBERTa and its kin number positions as fairseq does, from ``padding_idx + 1`` (``pad_token_id`` = 1:
position 0 is row 2); row ``padding_idx`` is the padding row and the rows before it are never used,
so those first ``pad_token_id + 1`` rows are dropped (:data:`OFFSET_BY_PADDING`).  Models whose
positions act inside attention (RoPE, ALiBi, T5's relative biases: LLaMA, BLOOM, T5, ...) have no
table to analyse and are refused, as is a BERT-like model whose ``position_embedding_type`` is not
``absolute`` (its table is not used).
"""

import json
import os

import torch

from .tables import PositionTable, TableError, as_matrix

EMBEDDINGS = "embeddings.position_embeddings.weight"
GPT = "wpe.weight"
#: model_type -> the name its position table is stored under (after a prefix, if any)
POSITION_TABLES = {"bert": EMBEDDINGS, "albert": EMBEDDINGS, "electra": EMBEDDINGS, "distilbert": EMBEDDINGS,
                   "roberta": EMBEDDINGS, "xlm-roberta": EMBEDDINGS, "camembert": EMBEDDINGS,
                   "gpt2": GPT, "gpt_neo": GPT}
#: model types whose position ids start at pad_token_id + 1
OFFSET_BY_PADDING = ("roberta", "xlm-roberta", "camembert")
INSTALL = "pip install 'fairseq-pe[hf]'"


def supported() -> str:
    return ", ".join(sorted(POSITION_TABLES))


def _config(folder: str):
    """The folder's configuration, through transformers (offline)."""
    try:
        from transformers import AutoConfig
    except ImportError:
        raise TableError(f"{folder}: a Hugging Face model folder (it has config.json); reading it needs "
                         f"transformers: {INSTALL}") from None
    try:
        with open(os.path.join(folder, "config.json")) as f:
            remote = json.load(f).get("auto_map")
    except (OSError, ValueError, AttributeError):
        remote = None  # transformers says what is wrong with it, below
    if remote:
        raise TableError(f"{folder}: refused: its config.json names code of its own to run (auto_map: "
                         f"{', '.join(sorted(remote)) if isinstance(remote, dict) else remote}); the analysis never "
                         "runs a model folder's code")
    try:
        return AutoConfig.from_pretrained(folder, local_files_only=True, trust_remote_code=False)
    except Exception as e:  # noqa: BLE001  (a broken config.json, a model type transformers does not know, ...)
        raise TableError(f"{folder}: its config.json cannot be read by transformers "
                         f"({type(e).__name__}: {str(e)[:300]})") from None


def _weight_names(folder: str):
    """(file, its tensor names) of each weight file of the folder, safetensors first."""
    from transformers.utils import SAFE_WEIGHTS_INDEX_NAME, SAFE_WEIGHTS_NAME, WEIGHTS_INDEX_NAME, WEIGHTS_NAME

    for single, index in ((SAFE_WEIGHTS_NAME, SAFE_WEIGHTS_INDEX_NAME), (WEIGHTS_NAME, WEIGHTS_INDEX_NAME)):
        if os.path.isfile(os.path.join(folder, single)):
            return {single: None}
        if os.path.isfile(os.path.join(folder, index)):
            with open(os.path.join(folder, index)) as f:
                files = {}
                inside = os.path.realpath(folder)
                for name, file in json.load(f)["weight_map"].items():
                    path = os.path.realpath(os.path.join(folder, file))
                    if os.path.commonpath([path, inside]) != inside:
                        raise TableError(f"{folder}: refused: its {index} names {file!r}, outside the folder")
                    files.setdefault(file, []).append(name)
                return files
    raise TableError(f"{folder}: no PyTorch weights ({SAFE_WEIGHTS_NAME}, {SAFE_WEIGHTS_INDEX_NAME}, {WEIGHTS_NAME} "
                     f"or {WEIGHTS_INDEX_NAME})")


def _read_tensor(path: str, name: str = None):
    """(names in the file, the tensor ``name`` or None) of one weight file."""
    if path.endswith(".safetensors"):
        from safetensors import safe_open

        with safe_open(path, framework="pt") as f:
            names = list(f.keys())
            return names, (f.get_tensor(name) if name in names else None)
    try:
        state = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception:  # noqa: BLE001  (the legacy non-zip format cannot be memory-mapped)
        state = torch.load(path, map_location="cpu", weights_only=True)
    return list(state), state.get(name)


def read_weight(folder: str, suffix: str):
    """(stored name, tensor) of the one weight whose name is ``suffix`` or ends in ``.suffix``."""
    def matching(names):
        return [n for n in names if n == suffix or n.endswith("." + suffix)]

    found = []
    try:
        for file, names in _weight_names(folder).items():
            if names is None:
                names, _ = _read_tensor(os.path.join(folder, file))
            found += [(file, n) for n in matching(names)]
        if len(found) != 1:
            what = "no weight" if not found else f"{len(found)} weights ({', '.join(n for _, n in found)})"
            raise TableError(f"{folder}: {what} named {suffix} (or *.{suffix}) in its weights, where its model "
                             "type keeps the position table")
        file, name = found[0]
        _, tensor = _read_tensor(os.path.join(folder, file), name)
    except TableError:
        raise
    except Exception as e:  # noqa: BLE001  (a truncated or corrupt weight file)
        from fairseq_pe.safe_load import refused_global

        needs = refused_global(e)
        if needs is not None:
            raise TableError(f"{folder}: refused: its weights' pickle needs {needs}, which a file of weights never "
                             "holds, and loading it could run code (the analysis reads weights only)") from None
        raise TableError(f"{folder}: its weights cannot be read ({type(e).__name__}: {str(e)[:300]})") from None
    return name, tensor


def load_huggingface_table(folder: str) -> PositionTable:
    """The position table of a Hugging Face model folder, row i = position i (module docstring)."""
    config = _config(folder)
    model_type = getattr(config, "model_type", None)
    if model_type not in POSITION_TABLES:
        raise TableError(f"{folder}: a Hugging Face {model_type!r} model, which has no position table to analyse; "
                         f"supported are the models with a table of absolute positions: {supported()} (models whose "
                         "positions act inside attention, RoPE, ALiBi or relative biases, have none)")
    position_type = getattr(config, "position_embedding_type", None) or "absolute"
    if position_type != "absolute":
        raise TableError(f"{folder}: its config.json says position_embedding_type {position_type!r}: the model does "
                         "not add its position table to the words (only 'absolute' can be analysed)")
    name, weight = read_weight(folder, POSITION_TABLES[model_type])
    vectors = as_matrix(weight, folder, f"position table {name}")
    dropped, note = 0, ""
    if model_type in OFFSET_BY_PADDING:
        pad = int(config.pad_token_id)
        dropped = pad + 1
        note = (f"rows 0..{pad} of {name} dropped: {model_type} numbers positions from pad_token_id + 1 = {dropped} "
                f"(fairseq's convention); row {pad} is the padding row" + (", the rows before it are never used"
                                                                           if pad else ""))
        vectors = as_matrix(vectors[dropped:], folder, f"position table {name} without its first {dropped} rows")
    kind = "sinusoidal" if getattr(config, "sinusoidal_pos_embds", False) else "learned"
    return PositionTable(path=folder, vectors=vectors, kind="huggingface", source=name,
                         description=f"{kind} APE (Hugging Face {model_type})", model_type=model_type,
                         dropped_rows=dropped, note=note)
