"""``--criterion answer_cross_entropy``: a language model's cross-entropy on each sample's answer only.

For question-answer tasks written as one line per sample, ``CONTEXT QUESTION ANSWER``, and trained with fairseq's
``language_modeling`` task and ``--sample-break-mode eos``: the loss is the negative log-likelihood of the answer's
token(s) given everything before them, the context's own tokens are read but not predicted.  This is the
``--train-on answer`` of CoPE's reference trainer (Golovneva et al. 2024, ``facebookresearch/RAM``,
``projects/cope/run.sh``), which its counting task uses (:mod:`fairseq_pe.lm.counting`).

The answer is the last ``--answer-tokens`` tokens of each sample (default 1), those before its ``</s>``: in the
target of a ``--sample-break-mode eos`` sample, the positions followed, within that many positions, by ``</s>``.

Logged (fairseq's conventions, as ``sentence_prediction``): ``loss`` in base 2 per answer token, and ``accuracy``,
the percentage of samples whose every answer token is the model's argmax given the true tokens before it (with one
answer token: greedy decoding's exact match).  No host sync: fixed shapes (every position's NLL, masked), the counts
stay tensors until fairseq reduces them, and the sample size is the samples × ``--answer-tokens``, known on the host.
"""

import math
from dataclasses import dataclass, field

import torch

from fairseq import metrics
from fairseq.criterions import FairseqCriterion, register_criterion
from fairseq.dataclass import FairseqDataclass

from fairseq_pe.errors import UserError


@dataclass
class AnswerCrossEntropyConfig(FairseqDataclass):
    answer_tokens: int = field(default=1, metadata={
        "help": "the answer is each sample's last N tokens before its </s> (the loss and accuracy are theirs only)"})


def answer_positions(target: torch.Tensor, eos: int, answer_tokens: int) -> torch.Tensor:
    """(B, T) bool: the target positions of each sample's answer, the ``answer_tokens`` positions before ``</s>``.
    A sample with fewer tokens than that before its ``</s>`` gets as many as it has."""
    ends = target.eq(eos)
    answer = torch.zeros_like(ends)
    for shift in range(1, answer_tokens + 1):
        answer[:, :-shift] |= ends[:, shift:]
    return answer & ~ends


@register_criterion("answer_cross_entropy", dataclass=AnswerCrossEntropyConfig)
class AnswerCrossEntropyCriterion(FairseqCriterion):
    def __init__(self, task, answer_tokens: int = 1):
        super().__init__(task)
        if answer_tokens < 1:
            raise UserError(f"--answer-tokens {answer_tokens}: must be at least 1 (the tokens before </s> that are "
                            f"the answer)")
        self.answer_tokens = answer_tokens
        self.eos = task.target_dictionary.eos()

    def forward(self, model, sample, reduce=True):
        net_output = model(**sample["net_input"])
        target = sample["target"]
        answer = answer_positions(target, self.eos, self.answer_tokens)
        lprobs = model.get_normalized_probs(net_output, log_probs=True)
        # every position's NLL, kept at the answers: fixed shapes, no host sync (a boolean index would wait for the
        # device to know how many answers there are)
        nll = -lprobs.gather(-1, target.unsqueeze(-1)).squeeze(-1).float()
        nll = nll.masked_fill(~answer, 0.0)
        loss = nll.sum() if reduce else nll.sum(dim=1)
        with torch.no_grad():
            wrong = lprobs.argmax(dim=-1).ne(target) & answer
            has_answer = answer.any(dim=1)
            correct = (has_answer & ~wrong.any(dim=1)).sum()
            samples = has_answer.sum()
        # the answer tokens, as a number known on the host: every sample has --answer-tokens of them (the task's
        # lines: tokens before </s>)
        sample_size = target.size(0) * self.answer_tokens
        logging_output = {
            "loss": loss.data if reduce else loss.data.sum(),
            "ntokens": sample["ntokens"],
            "nsentences": target.size(0),
            "sample_size": sample_size,
            "answer_samples": samples.data,
            "answer_correct": correct.data,
        }
        return loss, sample_size, logging_output

    @staticmethod
    def reduce_metrics(logging_outputs) -> None:
        loss_sum = sum(log.get("loss", 0) for log in logging_outputs)
        sample_size = sum(log.get("sample_size", 0) for log in logging_outputs)
        metrics.log_scalar("loss", loss_sum / max(sample_size, 1) / math.log(2), sample_size, round=3)
        samples = sum(log.get("answer_samples", 0) for log in logging_outputs)
        correct = sum(log.get("answer_correct", 0) for log in logging_outputs)
        # counts (fairseq prints a sum meter's total: fairseq-validate's "answers" is every answer of the subset)
        metrics.log_scalar_sum("answers", samples, round=0)
        metrics.log_scalar_sum("answers_correct", correct, round=0)
        metrics.log_derived("accuracy", _accuracy)

    @staticmethod
    def logging_outputs_can_be_summed() -> bool:
        return True


def _accuracy(meters) -> float:
    """Percent of the samples whose answer is right (the derived metric fairseq prints as ``accuracy``)."""
    total = meters["answers"].sum
    return round(100.0 * float(meters["answers_correct"].sum) / float(total), 2) if total > 0 else float("nan")
