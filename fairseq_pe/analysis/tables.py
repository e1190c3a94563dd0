"""Position tables without a model: what ``fairseq-pe-analyze`` reads besides fairseq checkpoints.

An input is one of

* a fairseq checkpoint (:mod:`.checkpoint`);
* a raw table, one row per position (positions × D): a ``.npy`` file, or a ``.pt`` file holding one
  2-D tensor (``torch.save(table, PATH)``) or a dict of exactly one (``embedding.state_dict()``);
* a Hugging Face model folder (one with ``config.json``): its position table is read by
  :mod:`.huggingface`, which needs ``pip install 'fairseq-pe[hf]'``.

:func:`input_kind` tells which (a ``.pt`` file is a checkpoint when it holds ``model``, ``cfg`` or
``args``, or cannot be read as plain tensors), :func:`load_raw_table` reads a raw table
(:func:`fairseq_pe.analysis.inputs.load_position_table` any table, this module's or :mod:`.huggingface`'s).  Only the
analyses of absolute position vectors apply to a table (``report.analyze_table``).
"""

import os
from dataclasses import dataclass
from typing import Optional

import torch

from .checkpoint import CheckpointError

#: what the command takes, for error messages
ACCEPTED = ("fairseq-pe-analyze takes fairseq checkpoints, position tables (a .npy file, or a .pt file holding one "
            "2-D tensor, positions × D) and Hugging Face model folders (with config.json)")
#: keys of a fairseq checkpoint (a .pt file holding one of them is no table)
CHECKPOINT_KEYS = ("model", "cfg", "args")
MIN_POSITIONS = 4  # the regression probe fits on the even positions and tests on the odd ones


class TableError(CheckpointError):
    """An input that cannot be read as a position table; the message names the file or folder."""


@dataclass
class PositionTable:
    path: str
    vectors: torch.Tensor  # (positions, D), float64: row i is position i
    kind: str  # "table" (a raw .npy/.pt table) or "huggingface"
    source: str  # what was read, e.g. "NumPy array" or "bert.embeddings.position_embeddings.weight"
    description: str  # the encoding, as the property table names it
    model_type: Optional[str] = None  # a Hugging Face model's config.model_type
    dropped_rows: int = 0  # rows of the stored table before position 0 (RoBERTa: padding_idx + 1)
    note: str = ""  # why rows were dropped


def _load_torch(path: str):
    """The content of a torch file read as plain tensors (``weights_only``; memory-mapped when the
    file allows it), or None when it holds anything else (a fairseq checkpoint pickles its options)."""
    for mmap in (True, False):  # files of the legacy (non-zip) format cannot be memory-mapped
        try:
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
        except Exception:  # noqa: BLE001  (not a torch file, or not plain tensors: see the caller)
            continue
    return None


def input_kind(path: str) -> str:
    """``"checkpoint"``, ``"table"`` or ``"huggingface"`` (module docstring); a missing path or a
    folder without ``config.json`` is an error naming it."""
    if os.path.isdir(path):
        if not os.path.isfile(os.path.join(path, "config.json")):
            raise TableError(f"{path}: a folder without config.json, so not a Hugging Face model folder ({ACCEPTED})")
        return "huggingface"
    if not os.path.isfile(path):
        raise TableError(f"{path}: no such file or folder")
    if path.lower().endswith(".npy"):
        return "table"
    content = _load_torch(path)
    if content is None or (isinstance(content, dict) and set(CHECKPOINT_KEYS) & set(content)):
        return "checkpoint"  # read (or refused, naming the file) by the checkpoint loader
    return "table"


def as_matrix(values, path: str, what: str) -> torch.Tensor:
    """``values`` (a NumPy array or a tensor) as a (positions, D) float64 tensor; anything that is no
    finite 2-D numeric table with at least 4 rows is an error naming ``path``."""
    import numpy as np

    shape = tuple(values.shape)
    if len(shape) != 2:
        raise TableError(f"{path}: the {what} is {len(shape)}-D, of shape {shape}; a position table is 2-D, one row "
                         "per position (positions × D)")
    if torch.is_tensor(values):
        numeric = not (values.is_complex() or values.dtype == torch.bool)
    else:
        numeric = np.issubdtype(values.dtype, np.number) and not np.issubdtype(values.dtype, np.complexfloating)
    if not numeric:
        raise TableError(f"{path}: the {what} holds {values.dtype} values, not real numbers")
    if shape[0] < MIN_POSITIONS or shape[1] < 1:
        raise TableError(f"{path}: the {what} has shape {shape}: a position table needs at least {MIN_POSITIONS} "
                         "positions (rows) of at least 1 dimension")
    matrix = values.detach().to(torch.float64) if torch.is_tensor(values) else \
        torch.from_numpy(np.asarray(values, dtype=np.float64))
    if not bool(torch.isfinite(matrix).all()):
        raise TableError(f"{path}: the {what} holds NaN or infinite values")
    return matrix.clone()


def load_raw_table(path: str) -> PositionTable:
    """A ``.npy`` file, or a ``.pt`` file of one tensor (or a dict of exactly one)."""
    import numpy as np

    if path.lower().endswith(".npy"):
        try:
            values = np.load(path, allow_pickle=False)
        except Exception as e:  # noqa: BLE001  (a truncated file, a pickled object array, ...)
            raise TableError(f"{path}: cannot be read as a NumPy array ({type(e).__name__}: {e})") from None
        what, suffix = "NumPy array", ".npy"
    else:
        content = _load_torch(path)
        suffix = os.path.splitext(path)[1] or "torch file"
        if isinstance(content, dict):
            if len(content) != 1 or not torch.is_tensor(next(iter(content.values()))):
                keys = ", ".join(repr(k) for k in list(content)[:5]) + (", ..." if len(content) > 5 else "")
                raise TableError(f"{path}: a dict of {len(content)} entries ({keys}); a position table file holds "
                                 "one 2-D tensor, or a dict of exactly one: save the table alone "
                                 "(torch.save(table, PATH))")
            key, content = next(iter(content.items()))
            what = f"tensor {key!r}"
        elif torch.is_tensor(content):
            what = "tensor"
        else:
            raise TableError(f"{path}: holds a {type(content).__name__}, neither a position table (a 2-D tensor) "
                             f"nor a fairseq checkpoint ({ACCEPTED})")
        values = content
    return PositionTable(path=path, vectors=as_matrix(values, path, what), kind="table", source=what,
                         description=f"position table ({suffix})")
