"""``--criterion span_prediction``: BERT's SQuAD loss on start/end logits.

Devlin et al. (2019), §4.2: "The training objective is the sum of the log-likelihoods of the correct
start and end positions"; their ``run_squad.py`` averages the two cross-entropies:

    L = (CE(start_logits, y_start) + CE(end_logits, y_end)) / 2,

with the softmax over the positions of the feature.  Padding positions get -inf logits, so the
softmax runs over the real tokens only.  An answer outside the window, or a v2.0 impossible
question, has the target (0, 0): the ``<s>`` position (BERT §4.3).

Logged (fairseq's conventions, as ``sentence_prediction``): ``loss`` in base 2 per feature, and
``start_acc``, ``end_acc``, ``span_acc`` (both right) in percent of features, from the argmax of
each softmax.
"""

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass


@dataclass
class SpanPredictionCriterionConfig(FairseqDataclass):
    pass


def span_logits(model, net_input: dict, head_name: str, padding_idx: int):
    """The span head's ``(start_logits, end_logits)`` (float, each (B, T)), padding at -inf."""
    if not hasattr(model, "span_heads") or head_name not in model.span_heads:
        raise ValueError(f"model has no span head {head_name!r} (--span-head-name): use --task "
                         f"span_prediction, which registers it")
    features, _ = model(**net_input, features_only=True)
    start, end = model.span_heads[head_name](features)
    pad = net_input["src_tokens"].eq(padding_idx)
    return start.float().masked_fill(pad, float("-inf")), end.float().masked_fill(pad, float("-inf"))


@register_criterion("span_prediction", dataclass=SpanPredictionCriterionConfig)
class SpanPredictionCriterion(FairseqCriterion):
    def __init__(self, cfg: SpanPredictionCriterionConfig, task):
        super().__init__(task)
        self.head_name = task.cfg.span_head_name
        self.padding_idx = task.source_dictionary.pad()

    def forward(self, model, sample, reduce=True):
        start_logits, end_logits = span_logits(model, sample["net_input"], self.head_name, self.padding_idx)
        target_start, target_end = sample["target_start"].view(-1), sample["target_end"].view(-1)
        reduction = "sum" if reduce else "none"
        loss_start = F.cross_entropy(start_logits, target_start, reduction=reduction)
        loss_end = F.cross_entropy(end_logits, target_end, reduction=reduction)
        loss = (loss_start + loss_end) / 2

        with torch.no_grad():
            start_ok = start_logits.argmax(dim=-1).eq(target_start)
            end_ok = end_logits.argmax(dim=-1).eq(target_end)
        sample_size = target_start.numel()
        logging_output = {
            "loss": loss.data if reduce else loss.data.sum(),
            "ntokens": sample["ntokens"],
            "nsentences": sample_size,
            "sample_size": sample_size,
            "start_correct": int(start_ok.sum()),
            "end_correct": int(end_ok.sum()),
            "span_correct": int((start_ok & end_ok).sum()),
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        nsentences = sum(log.get("nsentences", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        if nsentences:
            for key in ("start", "end", "span"):
                correct = sum(log.get(f"{key}_correct", 0) for log in logging_outputs)
                metrics.log_scalar(f"{key}_acc", 100.0 * correct / nsentences, nsentences, round=1)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True
