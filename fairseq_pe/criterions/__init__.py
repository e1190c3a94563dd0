"""Criterions of fairseq-pe: ``span_prediction`` (BERT's SQuAD start/end loss)."""

from . import span_prediction  # noqa: F401  (registers the criterion)
