"""The start/end head of extractive question answering (SQuAD), as in BERT.

Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language Understanding"
(NAACL 2019), §4.2 (SQuAD v1.1) and §4.3 (SQuAD v2.0): fine-tuning adds only a start vector
S ∈ R^H and an end vector E ∈ R^H.  With T_i ∈ R^H the final hidden vector of token i,

    P_start(i) = exp(S·T_i) / Σ_j exp(S·T_j),      P_end(i) likewise with E,

and a span (i, j), j >= i, scores S·T_i + E·T_j.  For v2.0 the no-answer span is the span (0, 0)
at the first token (``<s>``, BERT's [CLS]), scoring s_null = S·C + E·C.

Here S and E are the two rows of one ``Linear(embed_dim, 2)`` (with a bias, which adds a constant
per row and leaves the softmax over positions unchanged).  The softmax and the cross-entropy are
the criterion's (:mod:`fairseq_pe.criterions.span_prediction`), which also masks the padding.
"""

from typing import Tuple

import torch
from torch import nn


class SpanPredictionHead(nn.Module):
    """``features`` (B, T, C) -> ``(start_logits, end_logits)``, each (B, T): S·T_i and E·T_i."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.qa_outputs = nn.Linear(embed_dim, 2)
        # BERT initialises its fine-tuning layers with N(0, 0.02) (``initializer_range``)
        nn.init.normal_(self.qa_outputs.weight, mean=0.0, std=0.02)
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, features: torch.Tensor, **kwargs) -> Tuple[torch.Tensor, torch.Tensor]:
        if features.dim() != 3 or features.size(-1) != self.embed_dim:
            raise ValueError(f"SpanPredictionHead expects features of shape (batch, time, {self.embed_dim}), "
                             f"got {tuple(features.shape)}")
        logits = self.qa_outputs(features)
        start_logits, end_logits = logits.unbind(dim=-1)
        return start_logits.contiguous(), end_logits.contiguous()
