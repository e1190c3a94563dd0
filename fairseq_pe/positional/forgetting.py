"""Forgetting attention, FoX (Lin et al. 2025, "Forgetting Transformer: Softmax Attention with a Forget Gate",
ICLR 2025), Eq. 4-6: a data-dependent forget gate per head and token, whose log-products down-weight the logits of
distant keys:

    f_t,h   = σ(w_h·x_t + b_h)                        x_t: the attention's input at token t (the layer's normalised
                                                      input, from which q, k and v are projected)
    Λ_t,h   = Σ_{l ≤ t} log f_l,h                     (cumulative, float32)
    logits_ij += Λ_i − Λ_j = Σ_{l=j+1..i} log f_l     (causal: decoder, language model; 0 on the diagonal)

added after the 1/√d scaling (the reference: ``zhixuan-lin/forgetting-transformer``,
``src/forgetting_transformer/ops/forgetting_attention.py``, which takes ``log_fgate`` in float32 and adds
``Λ_i − Λ_j`` to ``sm_scale·q·k``; ``modeling_forgetting_transformer.py``: ``fgate_proj = nn.Linear(hidden, heads,
bias=True)`` on the attention's input, ``logsigmoid(fgate_logit.float())``).  Choices the paper leaves open follow
that reference and are flags: the gate's weights start N(0, 0.02) and its bias at 0 (the model's ``_init_weights``
for every Linear, ``fgate_proj`` included: ``--pe-fox-gate-std``, ``--pe-fox-gate-bias``); no other position
encoding (every FoX configuration sets ``use_rope: false``: the catalogue's ``fox`` has ``--pe-absolute none``).
One gate per layer (``fgate_proj`` is per attention layer); the encoding of a side holds the gates of its layers.
Padding tokens' log-gates are 0 (the reference zeroes those before ``seq_start``), so that left padding changes
nothing of the real tokens' sums.

Encoder (bidirectional, not defined by the paper): the form of x-transformers' ``DataDependentAlibi`` with
``causal=False`` (``lucidrains/x-transformers``, ``x_transformers/x_transformers.py``): a second set of gates r for
the keys after the query, ``linear = nn.Linear(dim, 2·heads)`` split into forward and backward halves,

    logits_ij += Σ_{l=j+1..i} log f_l   (j ≤ i),      Σ_{l=i+1..j} log r_l   (j ≥ i)

(0 on the diagonal), initialised as the decoder's gates (FoX's init; x-transformers starts its biases at 5.0: set
``--pe-fox-gate-bias 5`` for its init).

Step-by-step decoding keeps Λ of the keys so far in fairseq's ``incremental_state`` (the attention's
``key_state``: Λ_t = Λ_{t−1} + log f_t), where the reference keeps every step's log f and sums them again at
every step: the same sums to float rounding.  Cross-attention: relative encodings never reach it (self-attention
only), as for every encoding of the plugin.  The gate runs in float32 (its parameters stay float32 in a half
model, as every position parameter), in float64 in a float64 model.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F

from fairseq_pe.errors import UserError

from .base import (Float32State, RelativePositionEncoding, compute_dtype, option, query_key_products,
                   register_position_encoding)

#: the reference's initializer_range (N(0, 0.02) weights) and its gate bias (0)
GATE_STD = 0.02
GATE_BIAS = 0.0


@register_position_encoding("relative", "fox")
class ForgettingGate(Float32State, RelativePositionEncoding):
    """Σ log σ(w·x + b) between key and query added to the logits, per head (module docstring)."""

    own_logits = True
    already_untied = ("layers", "heads")  # a gate per layer and per head, as the reference

    def __init__(self, embed_dim, num_heads, num_blocks, causal, args=None):
        super().__init__(embed_dim, num_heads, num_blocks, causal, args)
        std = float(option(args, "pe_fox_gate_std", GATE_STD))
        bias = float(option(args, "pe_fox_gate_bias", GATE_BIAS))
        if not (std >= 0 and math.isfinite(std)):
            raise UserError(f"--pe-fox-gate-std must be a finite standard deviation ≥ 0, got {std}")
        if not math.isfinite(bias):
            raise UserError(f"--pe-fox-gate-bias must be finite, got {bias}")
        #: gate sets per head: the decoder's forward gates f; the encoder's f and backward gates r
        self.directions = 1 if causal else 2
        gates = self.directions * num_heads
        self.gate_weight = nn.Parameter(torch.randn(num_blocks, gates, embed_dim) * std)
        self.gate_bias = nn.Parameter(torch.full((num_blocks, gates), bias))

    def key_state(self, x, key_padding_mask, block, previous=None):
        """(B, directions·H, S) float32 (float64 in a float64 model): Λ, the cumulative log forget gates of every key
        so far (the backward gates' too in the encoder), from the attention's input ``x`` (T, B, E) of the new
        tokens; 0 log-gates at padding."""
        index = block - 1
        x = x.to(compute_dtype(x.dtype))
        log_gates = F.logsigmoid(F.linear(x, self.gate_weight[index], self.gate_bias[index]))  # (T, B, gH)
        log_gates = log_gates.permute(1, 2, 0)  # (B, gH, T)
        if key_padding_mask is not None:
            log_gates = log_gates.masked_fill(key_padding_mask.unsqueeze(1).to(torch.bool), 0.0)
        cumulative = log_gates if log_gates.size(-1) == 1 else log_gates.cumsum(-1)
        if previous is None:
            return cumulative
        # a decoding step: Λ continues from the last key's
        return torch.cat([previous, previous[..., -1:] + cumulative], dim=-1)

    def forgetting_bias(self, state, query_offset: int, rows: int):
        """(B, H, rows, S) float32 bias of query indices ``query_offset`` .. + rows − 1 from Λ (``state``):
        Λ_i − Λ_j for j ≤ i; the encoder's backward sums Λʳ_j − Λʳ_i for j > i; 0 (masked) above the diagonal in
        the decoder."""
        heads = self.num_heads
        forward = state[:, :heads]
        src_len = state.size(-1)
        queries = forward[..., query_offset:query_offset + rows].unsqueeze(-1)
        if self.directions == 1 and query_offset + rows == src_len and rows == 1:  # a decoding step: no key after
            return queries - forward.unsqueeze(-2)
        above = (torch.arange(src_len, device=state.device)
                 > torch.arange(query_offset, query_offset + rows, device=state.device).unsqueeze(1))  # (rows, S)
        bias = queries - forward.unsqueeze(-2)
        if self.directions == 1:
            return bias.masked_fill(above, 0.0)
        backward = state[:, heads:]
        after = backward.unsqueeze(-2) - backward[..., query_offset:query_offset + rows].unsqueeze(-1)
        return torch.where(above, after, bias)

    def attention_logits(self, q, k, query_offset, block, rows=None, state=None, masking=None):
        logits = query_key_products(q, k).to(compute_dtype(q.dtype))
        return logits.add_(self.forgetting_bias(state, query_offset, q.size(2)))
