"""Criterions of fairseq-pe: ``span_prediction`` (BERT's SQuAD start/end loss) and ``answer_cross_entropy`` (a
language model's loss on each sample's answer only: CoPE's counting task)."""

from . import answer_cross_entropy, span_prediction  # noqa: F401  (register the criteria)
