"""Self-attention with a relative position encoding, as a subclass of fairseq's MultiheadAttention.

fairseq's attention has no hook that sees the queries or the attention probabilities, which
Shaw-style encodings need (q_i·a^K_{j-i} in the logits, Σ_j α_ij a^V_{j-i} in the output), so
this subclass overrides ``forward`` with a self-attention-only implementation that calls the
encoding's three hooks (see :class:`~fairseq_pe.positional.base.RelativePositionEncoding`).
It keeps fairseq's parameters (``q_proj``, ``k_proj``, ``v_proj``, ``out_proj``), dropout,
masks and incremental-state buffers (``prev_key``, ``prev_value``, ``prev_key_padding_mask``),
so fairseq's ``reorder_incremental_state`` serves beam search unchanged.  Cross-attention
keeps fairseq's stock module: it has no relative term.
"""

from typing import Dict, Optional

import torch
from torch import Tensor

from fairseq import utils
from fairseq.modules import MultiheadAttention


class RelativeSelfAttention(MultiheadAttention):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not self.self_attention:
            raise ValueError("relative position encodings apply to self-attention only "
                             "(--cross-self-attention is not supported with --pe-relative)")
        if self.bias_k is not None or self.add_zero_attn:
            raise ValueError("--pe-relative does not support add_bias_kv / add_zero_attn")
        self._set_skip_embed_dim_check()  # never the fused path: it would skip the relative terms
        self.relative = None
        self.block = 1

    def attach_relative(self, relative, block: int):
        # a plain reference: the encoding is a submodule of the encoder/decoder, shared by its layers
        object.__setattr__(self, "relative", relative)
        self.block = block

    def forward(
        self,
        query: Tensor,
        key: Optional[Tensor] = None,
        value: Optional[Tensor] = None,
        key_padding_mask: Optional[Tensor] = None,
        incremental_state: Optional[Dict[str, Dict[str, Optional[Tensor]]]] = None,
        need_weights: bool = True,
        static_kv: bool = False,
        attn_mask: Optional[Tensor] = None,
        before_softmax: bool = False,
        need_head_weights: bool = False,
    ):
        if need_head_weights:
            need_weights = True
        tgt_len, bsz, embed_dim = query.size()
        heads, head_dim = self.num_heads, self.head_dim

        def split_heads(x):  # (T, B, E) -> (B·H, T, d)
            return x.contiguous().view(-1, bsz * heads, head_dim).transpose(0, 1)

        q = split_heads(self.q_proj(query) * self.scaling)
        k = split_heads(self.k_proj(query))
        v = split_heads(self.v_proj(query))

        saved = self._get_input_buffer(incremental_state) if incremental_state is not None else None
        query_offset = 0
        if saved is not None and "prev_key" in saved:
            query_offset = saved["prev_key"].size(2)
        q, k = self.relative.rotate(q, k, query_offset, self.block)

        if incremental_state is not None:
            if query_offset > 0:
                k = torch.cat([saved["prev_key"].view(bsz * heads, -1, head_dim), k], dim=1)
                v = torch.cat([saved["prev_value"].view(bsz * heads, -1, head_dim), v], dim=1)
            key_padding_mask = MultiheadAttention._append_prev_key_padding_mask(
                key_padding_mask=key_padding_mask,
                prev_key_padding_mask=saved.get("prev_key_padding_mask") if saved else None,
                batch_size=bsz, src_len=k.size(1), static_kv=False,
            )
            saved = saved if saved is not None else {}
            saved["prev_key"] = k.view(bsz, heads, -1, head_dim)
            saved["prev_value"] = v.view(bsz, heads, -1, head_dim)
            saved["prev_key_padding_mask"] = key_padding_mask
            self._set_input_buffer(incremental_state, saved)
        src_len = k.size(1)

        # in-place from here on: no (B, H, T, S) copies (bmm's backward needs q and k, not its output)
        logits = torch.bmm(q, k.transpose(1, 2)).view(bsz, heads, tgt_len, src_len)
        rel = self.relative.logit_terms(q, tgt_len, src_len, query_offset, self.block)
        if rel is not None:
            logits.add_(rel.to(logits.dtype))
            del rel
        if attn_mask is not None:
            logits.add_(attn_mask)
        if key_padding_mask is not None:
            logits.masked_fill_(key_padding_mask.view(bsz, 1, 1, src_len).to(torch.bool), float("-inf"))
        logits = logits.view(bsz * heads, tgt_len, src_len)
        if before_softmax:
            return logits, v

        probs_float = utils.softmax(logits, dim=-1, onnx_trace=self.onnx_trace)
        probs = self.dropout_module(probs_float.type_as(logits))
        out = torch.bmm(probs, v)
        rel_values = self.relative.value_terms(probs, tgt_len, src_len, query_offset, self.block)
        if rel_values is not None:
            out = out + rel_values.to(out.dtype)
        out = self.out_proj(out.transpose(0, 1).contiguous().view(tgt_len, bsz, embed_dim))

        weights = None
        if need_weights:
            weights = probs_float.view(bsz, heads, tgt_len, src_len).transpose(1, 0)
            if not need_head_weights:
                weights = weights.mean(dim=0)
        return out, weights
