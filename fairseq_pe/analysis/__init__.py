"""Analysis of position encodings (Wang et al. 2021 §2-§5, App. A; the regression probe of Wang &
Chen 2020) for any ``transformer_pe``/``roberta_pe`` or stock fairseq checkpoint.

    from fairseq_pe.analysis import AnalysisOptions, analyze_checkpoints
    analyze_checkpoints(["ckpt/a.pt", "ckpt/b.pt"], "analysis", options=AnalysisOptions(length=128))

writes what ``fairseq-pe-analyze`` writes.  Lower level: :func:`load_checkpoint`, :func:`analyze`,
:mod:`.properties` (scores of any proximity matrix), :mod:`.vectors`, :mod:`.probes`, :mod:`.frequencies`.
"""

from .checkpoint import CheckpointError, LoadedCheckpoint, load_checkpoint
from .report import Analysis, AnalysisError, AnalysisOptions, analyze, analyze_checkpoints

__all__ = ["Analysis", "AnalysisError", "AnalysisOptions", "CheckpointError", "LoadedCheckpoint", "analyze",
           "analyze_checkpoints", "load_checkpoint"]
