"""ReRoPE and Leaky ReRoPE (Su 2023, "Rectified Rotary Position Embeddings", kexue.fm/archives/9708): RoPE whose
relative position i − j is capped at a window w at inference, so that a model never sees a distance it was not
trained on,

    ReRoPE:        r(i, j) = i − j                 if i − j < w,   w otherwise
    Leaky ReRoPE:  r(i, j) = i − j                 if i − j < w,   w + (i − j − w)/k otherwise   (k > 1)

with the logits q_i·R(r(i, j))·k_j, and every query first scaled by max(1, log(i + 1)/log L), L the training length.
An inference-time option of a RoPE model (``--pe-rerope-window W``, ``--pe-rerope-train-length L``,
``--pe-rerope-leaky-factor K``; at generation time through ``--model-overrides``).

It follows the author's code (github.com/bojone/rerope @ acfe788, ``rerope_patch.py`` and ``leaky_rerope_patch.py``,
patches of Hugging Face's ``LlamaAttention.forward``): the log scaling of the queries, by their absolute position
(``position_ids``), before the rotation (and before the cache); the logits of a full pass from two products,

    A1 = (R_i q_i)·(R_j k_j)                    (RoPE: relative position i − j)
    A2 = (R_w q_i)·k_j                          (relative position w; Leaky: (R_{(i + w(k−1))/k} q_i)·(R_{j/k} k_j))
    A  = A1 where |i − j| < w, A2 elsewhere     (strict <; at i − j = w both are the relative position w),

and keys cached unrotated, each decoding step's logits from every cached key re-rotated (the reference rotates the
keys by −r(i, j) and leaves the query unrotated: the same products).  Here both products are computed at every step
too (:func:`rerope_logits`), so step-by-step decoding equals the full pass.  The reference's constants, w = 512, L =
4096 (its README's results use w = 1024) and k = 16, are the model's: W and L have no default here; the leaky
variant is chosen by giving K.

The attention computes its logits through the encoding (the logits hook, ``own_logits``: explicitly, in blocks of
query rows, never in a fused kernel), from the queries times 1/√d and the keys as ``rotate`` returns them: unrotated.
The rotations are the RoPE encoding's own (any ``--pe-rope-scaling``, Resonance RoPE's rounding, p-RoPE's unrotated
pairs apply to them).  The reference is causal (a decoder); in the encoder (bidirectional) the cap applies to both
directions, r(i, j) = −r(j, i) (a third product, (R_{−w} q_i)·k_j, Leaky: (R_{(i − w(k−1))/k} q_i)·(R_{j/k} k_j)),
our extension of the same rule.  Positions, not indices, under left padding (the log scaling reads the absolute
position).
"""

import math
from typing import NamedTuple

import torch

from .base import compute_dtype, query_key_products
from .pass_state import RelativeRows, as_rows


def query_log_scale(positions: torch.Tensor, train_length: int) -> torch.Tensor:
    """max(1, log(m + 1)/log L) of the queries' positions m (padding's −1 gives 1)."""
    return (torch.log(positions + 1) / math.log(train_length)).clamp(min=1.0)


class ReRoPEKey(NamedTuple):
    """ReRoPE's rotations, query scales and window masks of one block of query rows against S keys."""
    length: int
    keys: int
    query_offset: int
    own_positions: bool


def rerope_logits(rope, q, k, query_offset: int, rows: RelativeRows = None):
    """(B, H, T, S) logits of ReRoPE (module docstring) for the unrotated queries q (B, H, T, d), times 1/√d, of
    query indices ``query_offset`` .. + T − 1 and the unrotated keys k (B, H, S, d) of indices 0 .. S − 1 (the rows'
    own positions where ``rows.positions`` is given).  ``rope``: the RoPE encoding (its rotations, its window, its
    training length, its leaky factor, whether it is causal).  What depends on the positions alone (the rotations,
    the queries' log scales, the window masks) is computed once per pass (or decoding step) for the side's layers."""
    rows = as_rows(rows)
    length, keys = q.size(-2), k.size(-2)
    own = rows.positions is not None
    scale, near, fars = rows.shared(ReRoPEKey(length, keys, query_offset, own),
                                    lambda: rerope_rotations(rope, length, keys, query_offset, q.device, rows))
    q = q * scale.to(q.dtype)

    def product(rotations):
        """(R_a q)·(R_b k) for the rotations (R_a, R_b) (R_b None: the keys unrotated)."""
        query_rotation, key_rotation = rotations
        key = k if key_rotation is None else rope.rotated_by(k, key_rotation)
        return query_key_products(rope.rotated_by(q, query_rotation), key)

    logits = product(near)
    for rotations, beyond in fars:
        logits = torch.where(beyond, product(rotations), logits)
    return logits


def rerope_rotations(rope, length: int, keys: int, query_offset: int, device, rows: RelativeRows):
    """The queries' log scales (..., T, 1), the rotations of the product within the window (R_i, R_j), and for each
    direction past it ((R_a, R_b or None), its mask (..., T, S)): what :func:`rerope_logits` needs of the positions."""
    dtype = compute_dtype(rope.rotary.freqs.dtype)  # float32, float64 in a float64 model
    if rows.positions is None:
        query_positions = torch.arange(length, device=device, dtype=dtype) + query_offset  # (T,)
        key_positions = torch.arange(keys, device=device, dtype=dtype)  # (S,)
    else:
        query_positions = rows.positions[:, query_offset:query_offset + length].to(device, dtype).unsqueeze(1)
        key_positions = rows.positions[:, :keys].to(device, dtype).unsqueeze(1)  # (B, 1, S)
    scale = query_log_scale(query_positions, rope.rerope_train_length).unsqueeze(-1)
    window, factor = rope.rerope_window, rope.rerope_leaky_factor
    near = rope.rotation_at(query_positions), rope.rotation_at(key_positions)
    distance = query_positions.unsqueeze(-1) - key_positions.unsqueeze(-2)  # (T, S) or (B, 1, T, S)
    fars = []
    for sign in ((1,) if rope.causal else (1, -1)):
        if factor is None:  # R_{±w} q against the unrotated keys
            rotations = rope.rotation_at(torch.full_like(query_positions, sign * float(window))), None
        else:  # relative position ±w + (i − j ∓ w)/k
            rotations = (rope.rotation_at((query_positions + sign * window * (factor - 1)) / factor),
                         rope.rotation_at(key_positions / factor))
        fars.append((rotations, sign * distance >= window))
    return scale, near, tuple(fars)
