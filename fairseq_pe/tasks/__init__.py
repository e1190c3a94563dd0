"""Tasks of fairseq-pe: ``span_prediction`` (SQuAD v1.1 / v2.0)."""

from . import span_prediction  # noqa: F401  (registers the task)
