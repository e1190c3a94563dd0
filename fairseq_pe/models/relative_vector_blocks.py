"""The Shaw family's attention in evaluation, over blocks of query rows, on SDPA: its clipped distances make every
key outside a band of the block's rows a key of one distance for all of them.

Shaw et al. (2018), Eq. 3-4, with r = clip(j − i, −K, K) (:mod:`fairseq_pe.positional.relative_vectors`):
logits e_ij = q_i·k_j + q_i·a^K_r and output z_i = Σ_j α_ij (v_j + a^V_r).  For the rows i0 .. i1 of a block, the keys
j ≤ i0 − K have r = −K for every row (the left region L), the keys j ≥ i1 + K have r = K (the right region R), and
only the band between them, of at most i1 − i0 + 2K keys, has distances of their own.  On L the key term is one
number per row, c_i = q_i·a^K_{−K}, which changes the softmax's normaliser and not its distribution; its value term is
a^V_{−K} times L's share of the probability.  So each region is a softmax of its own:

* L and R: SDPA over those keys as they are (slices of the keys and values, no mask but the padding), which returns
  the output ō_X and the log-sum-exp ℓ_X of the plain logits (torch's CPU kernel: ``_scaled_dot_product_flash_attention
  _for_cpu``); the region's log-sum-exp is ℓ_X + c_i;
* the band: written out (logits with their key terms and masks, its log-sum-exp, its probabilities, output and value
  terms), as the explicit path computes every key;

and the three are merged by their shares, w_X = exp(ℓ'_X − ℓ), ℓ = log Σ_X exp ℓ'_X, the merge of FlashAttention's
blocks (Dao et al. 2022, Alg. 1): z_i = w_L (ō_L + a^V_{−K}) + w_B (ō_B + value terms of the band) + w_R (ō_R + a^V_K).
The same sums as the explicit path, to rounding: every logit keeps its key term, and a row whose every key is masked
gets 0 (as :func:`~fairseq_pe.models.attention.safe_softmax`).  Nothing of size T × S is built: per block the band's
B × H × rows × (rows + 2K) logits, and SDPA's tiles.  In a decoder (causal) no key lies right of the band.
"""

import math

import torch
from torch import Tensor

def block_rows(bsz: int, heads: int, max_distance: int, elements: int, min_rows: int) -> int:
    """Rows per block such that the band's logits, B·H·n·(n + 2K), stay within ``elements`` (at least ``min_rows``)."""
    per_head = elements / max(1, bsz * heads)
    return max(min_rows, int(math.sqrt(max_distance ** 2 + per_head) - max_distance))


def sdpa_with_logsumexp(q: Tensor, k: Tensor, v: Tensor, padding: Tensor):
    """SDPA of the scaled ``q`` over ``k``, ``v`` with the additive ``padding`` (B, 1, 1, S) or None: the output
    (B, H, T, d) and the log-sum-exp of the logits (B, H, T), from torch's CPU kernel, which returns both."""
    return torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, attn_mask=padding, scale=1.0)


def relative_vector_blocks(relative, block: int, q: Tensor, k: Tensor, v: Tensor, query_offset: int, causal: bool,
                           key_padding_mask, out: Tensor, elements: int, min_rows: int):
    """The attention of the Shaw family's ``relative`` (layer ``block``) for the scaled queries ``q`` (B, H, T, d) and
    every key ``k``, ``v`` (B, H, S, d), written into ``out`` (T, B, H, d) (module docstring).  ``causal``: key j is
    visible to query i iff j ≤ i (the queries at indices ``query_offset`` ..); ``key_padding_mask`` (B, S), True at
    padding, or None; blocks of at least ``min_rows`` rows, whose bands hold about ``elements`` logits."""
    bsz, heads, tgt_len, head_dim = q.shape
    src_len = k.size(2)
    most = relative.max_distance
    a_key, a_value = relative.vectors(block)  # (2K + 1, d) or (H, 2K + 1, d)
    a_key, a_value = a_key.to(q.dtype), a_value.to(q.dtype)
    tied = a_key.dim() == 2
    # a^V of the clipped ends, broadcast to (B, H, rows, d)
    value_left = (a_value[0] if tied else a_value[:, 0].unsqueeze(1)).to(q.dtype)
    value_right = (a_value[-1] if tied else a_value[:, -1].unsqueeze(1)).to(q.dtype)
    padding = None
    if key_padding_mask is not None:
        padded = key_padding_mask.to(torch.bool)
        padding = torch.zeros(bsz, 1, 1, src_len, device=q.device, dtype=q.dtype).masked_fill_(
            padded.view(bsz, 1, 1, src_len), float("-inf"))
    none = torch.full((), float("-inf"), device=q.device, dtype=q.dtype)
    per_block = block_rows(bsz, heads, most, elements, min_rows)
    for start in range(0, tgt_len, per_block):
        end = min(tgt_len, start + per_block)
        first, last = query_offset + start, query_offset + end - 1  # the block's query indices
        low = min(src_len, max(0, first - most + 1))  # keys 0 .. low − 1: distance −K for every row
        high = min(src_len, last + 1) if causal else min(src_len, max(low, last + most))  # keys high ..: +K
        rows = q[:, :, start:end]
        per_distance = torch.matmul(rows, a_key.transpose(-1, -2))  # (B, H, n, 2K + 1): q·a^K of every distance
        shares, outputs = [], []
        right = slice(src_len, src_len) if causal else slice(high, src_len)  # causal: no visible key past the band
        for keys, distance, value in ((slice(0, low), 0, value_left), (right, 2 * most, value_right)):
            if keys.start >= keys.stop:
                continue
            mask = None if padding is None else padding[..., keys]
            region, lse = sdpa_with_logsumexp(rows, k[:, :, keys], v[:, :, keys], mask)
            lse = lse + per_distance[..., distance]
            if padding is not None:  # a row whose keys here are all padding: none of its probability (SDPA says 0)
                lse = torch.where(padded[:, keys].all(-1).view(bsz, 1, 1), none, lse)
            shares.append(lse)
            outputs.append(region + value)
        if high > low:  # the band: each key its own distance, written out
            band = torch.arange(low, high, device=q.device)
            distances = band - torch.arange(first, last + 1, device=q.device).unsqueeze(1)  # (n, m): j − i
            index = distances.clamp(-most, most).add_(most).expand(bsz, heads, -1, -1)
            masks = per_distance.gather(-1, index)  # the key terms, then the masks: the logits less q·k
            if causal:
                masks.masked_fill_(distances > 0, float("-inf"))
            if padding is not None:
                masks.add_(padding[..., low:high])
            logits = torch.matmul(rows, k[:, :, low:high].transpose(-1, -2)).add_(masks)
            del masks
            # unnormalised: exp(logits − max), its sum s and its products; the merge divides by s (lse = max + log s)
            peak = logits.amax(dim=-1)
            peak = torch.where(peak.isneginf(), 0, peak)  # a row of no visible key: probabilities 0, share none
            probs = logits.sub_(peak.unsqueeze(-1)).exp_()
            total = probs.sum(dim=-1)
            per_value = probs.new_zeros(bsz, heads, end - start, 2 * most + 1).scatter_add_(-1, index, probs)
            region = torch.matmul(probs, v[:, :, low:high]).add_(torch.matmul(per_value, a_value))
            del probs
            outputs.append(region.div_(torch.where(total > 0, total, 1).unsqueeze(-1)))
            shares.append(peak + total.log())
        shares = torch.stack(shares)  # (regions, B, H, n)
        total = torch.logsumexp(shares, dim=0)
        weights = (shares - torch.where(total.isneginf(), 0, total)).exp_().unsqueeze(-1)
        result = sum(w * o for w, o in zip(weights.unbind(0), outputs))
        out[start:end] = result.permute(2, 0, 1, 3)
    return out
