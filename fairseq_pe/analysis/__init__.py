"""Analysis of position encodings (Wang et al. 2021 §2-§5, App. A; the regression probe of Wang &
Chen 2020) for any ``transformer_pe``/``roberta_pe`` or stock fairseq checkpoint.

    from fairseq_pe.analysis import AnalysisOptions, analyze_checkpoints
    analyze_checkpoints(["ckpt/a.pt", "ckpt/b.pt"], "analysis", options=AnalysisOptions(length=128))

writes what ``fairseq-pe-analyze`` writes; its inputs may also be position tables (``.npy``, ``.pt``)
and Hugging Face model folders (:mod:`.tables`, :mod:`.huggingface`).  Lower level:
:func:`load_checkpoint`, :func:`analyze`, :func:`load_position_table`, :func:`analyze_table`,
:mod:`.properties` (scores of any proximity matrix), :mod:`.vectors`, :mod:`.probes`, :mod:`.frequencies`.
"""

from .checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint
from .report import Analysis, AnalysisError, AnalysisOptions, analyze, analyze_checkpoints, analyze_table
from .inputs import load_position_table
from .tables import PositionTable, TableError

__all__ = ["Analysis", "AnalysisError", "AnalysisOptions", "CheckpointError", "LoadedCheckpoint", "PositionTable",
           "TableError", "analyze", "analyze_checkpoints", "analyze_table", "load_checkpoint", "load_position_table"]
