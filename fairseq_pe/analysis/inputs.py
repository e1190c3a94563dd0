"""A position table from any input that is not a checkpoint: a raw table (:mod:`.tables`) or a Hugging Face
model folder (:mod:`.huggingface`).  Above both, so that neither imports the other."""

import os

from .huggingface import load_huggingface_table
from .tables import PositionTable, input_kind, load_raw_table


def load_position_table(path: str) -> PositionTable:
    """The position table of ``path``: a raw table, or a Hugging Face model folder's."""
    if os.path.isdir(path):
        input_kind(path)  # a folder without config.json: an error naming it
        return load_huggingface_table(path)
    return load_raw_table(path)
