"""The loss of a language model by token position in its evaluation window, from fairseq-eval-lm's own per-token
scores (``--output-word-probs``), for ``fairseq-pe-lm-lengths`` (:mod:`fairseq_pe.lm.extrapolation`).

What fairseq prints.  ``fairseq_cli/eval_lm.py`` logs one line per sample, ``ID WORD [SCORE]\\tWORD [SCORE]...``,
where without ``--post-process`` every token is its own word and SCORE its natural-log probability (``{:2f}``: 6
decimals).  A line is read by the trailing `` [NUMBER]`` of each tab-separated item, so a token holding spaces or
brackets is read whole; the scores are turned into base-2 losses as fairseq turns their sum (``-score / ln 2``).

Where each scored token sits.  With ``--sample-break-mode none`` fairseq's ``TokenBlockDataset`` cuts the split
(one stream, end-of-sentence symbols included) into blocks of S = T - C new tokens (T: ``--tokens-per-sample``,
C: ``--context-window``, which eval_lm subtracts from T), the last block shorter; the sample id is the block's
index.  ``LMContextWindowDataset`` (C > 0) puts the up to C tokens before a block in front of it, in the order of
the blocks (its ``ordered_indices`` is the identity, and the context is carried from one sample to the next), so
block b's k-th new token (k from 0) sits at position ``min(C, b * S) + k`` (0-based) of a window of at most T
tokens; C = 0 (non-overlapping) gives position k.  The first blocks of a sliding evaluation have less context
than C; the last, shorter block has all of it.  The outputs count positions from 1.

The input convention (fairseq's ``TokenBlockDataset`` with ``include_targets``): a window's input is its targets
shifted right by one, so the token at position p (from 1) is predicted from the p tokens before it; the first
token of a block is predicted from the token before the block (a non-overlapping window's first token sees one
token), and the split's first token from the end-of-sentence symbol.

Every point is checked: the positions' token counts must sum to the split's tokens, and their losses, weighted by
the counts, must give fairseq's printed "Loss (base 2)" (to its 4 decimals, or 1e-4 relative).

The non-overlapping curves of one checkpoint are also joined into one (:func:`stitch`): positions N_{k-1}+1..N_k
from the evaluation at N_k.  At N = 16 L a position holds split/N tokens (49 of a 50,263-token split at N = 1,024),
and the tokens at one position differ from those at the next, so a single evaluation's curve is mostly the text's
noise; the joined curve reads each position where it holds the most tokens.
"""

import math
import re
from typing import Dict, List, Optional, Sequence, Tuple

import numpy as np

LN2 = math.log(2)
#: a --output-word-probs line: the logger's name (its ``| NAME | `` or ``NAME:`` format), the sample id, its items
_LINE = re.compile(r"fairseq_cli\.eval_lm(?: \| |:)(\d+) (.* \[[^\]\s]*\])\s*$")
#: one item: the word (anything, shortest first) and its score in brackets, then a tab or the end of the line
_ITEM = re.compile(r"(.*?) \[([-+]?(?:\d+(?:\.\d*)?(?:[eE][-+]?\d+)?|inf|nan))\](?:\t|$)", re.DOTALL)
#: above this many tokens in the split, the word-probability lines are left out of the logs (one line per sample,
#: about 15 bytes per token): the curve is in positions.json
LOG_WORD_PROBS_UP_TO = 50_000
#: the bins of positions.png: this many per octave of positions (every position its own bin up to 16)
BINS_PER_OCTAVE = 8
#: the relative tolerance of the curve's mean loss against fairseq's printed one (besides its rounding, 5e-5)
LOSS_TOLERANCE = 1e-4


def parse_items(text: str) -> List[float]:
    """``WORD [SCORE]\\tWORD [SCORE]...`` -> the scores (natural-log probabilities), in order; a ValueError where
    an item does not end in `` [NUMBER]``."""
    scores, pos = [], 0
    while pos < len(text):
        m = _ITEM.match(text, pos)
        if m is None:
            raise ValueError(f"unreadable word probabilities from character {pos}: {text[pos:pos + 80]!r}")
        scores.append(float(m.group(2)))
        pos = m.end()
    return scores


def word_prob_lines(output: str) -> List[Tuple[int, List[float]]]:
    """fairseq-eval-lm's log -> ``[(sample id, [score per token]), ...]`` in the order printed."""
    out = []
    for line in output.splitlines():
        m = _LINE.search(line)
        if m is not None:
            out.append((int(m.group(1)), parse_items(m.group(2))))
    return out


def strip_word_probs(output: str) -> str:
    """The log without its word-probability lines, one line saying how many were left out."""
    lines = output.splitlines()
    kept = [line for line in lines if _LINE.search(line) is None]
    left = len(lines) - len(kept)
    return "\n".join(kept + [f"[{left} --output-word-probs lines left out: the loss by position is in "
                             "positions.json]"]) + "\n"


def blocks(total: int, tokens_per_sample: int, context: int) -> List[Tuple[int, int]]:
    """fairseq's blocks of a split of ``total`` tokens at ``--tokens-per-sample T --context-window C``: per block
    (sample id), (the 0-based position of its first new token in its window, its number of new tokens)."""
    new = tokens_per_sample - context
    return [(min(context, b * new), min(new, total - b * new)) for b in range(-(-total // new))]


def position_curve(output: str, total: int, tokens_per_sample: int, context: int) -> Tuple[np.ndarray, np.ndarray]:
    """The loss sums (base 2) and token counts at each window position 0..T-1 of one fairseq-eval-lm run; a
    ValueError where its samples are not the split's blocks (missing, repeated, out of order in a sliding
    evaluation, or of another size)."""
    expected = blocks(total, tokens_per_sample, context)
    lines = word_prob_lines(output)
    ids = [i for i, _ in lines]
    if sorted(ids) != list(range(len(expected))):
        raise ValueError(f"expected the word probabilities of the split's {len(expected)} blocks (ids 0 to "
                         f"{len(expected) - 1}, each once), found {len(ids)} lines"
                         + ("" if len(set(ids)) == len(ids) else " with repeated ids"))
    if context > 0 and ids != sorted(ids):
        raise ValueError("the sliding windows were scored out of order: each window's context is the block before "
                         "it (LMContextWindowDataset; do not give --num-workers above 1)")
    sums, counts = np.zeros(tokens_per_sample), np.zeros(tokens_per_sample, dtype=np.int64)
    for i, scores in lines:
        start, size = expected[i]
        if len(scores) != size:
            raise ValueError(f"sample {i} has {len(scores)} scores, its block {size} tokens")
        sums[start:start + size] -= np.asarray(scores, dtype=np.float64) / LN2
        counts[start:start + size] += 1
    return sums, counts


def check_curve(sums: np.ndarray, counts: np.ndarray, total: int, loss_base2: float) -> None:
    """A ValueError unless every token of the split is counted once and the curve gives fairseq's loss."""
    if int(counts.sum()) != total:
        raise ValueError(f"the positions count {int(counts.sum()):,} tokens, the split {total:,}")
    mean = float(sums.sum()) / total
    if math.isnan(loss_base2) and math.isnan(mean):  # a model that gives NaN: its NaN perplexity is recorded
        return
    if not abs(mean - loss_base2) <= 5e-5 + LOSS_TOLERANCE * abs(loss_base2):
        raise ValueError(f"the per-token losses give {mean:.6f} bits per token, fairseq printed {loss_base2:.4f}")


def seed_means(curves: Sequence[Tuple[np.ndarray, np.ndarray]]) -> np.ndarray:
    """(seeds, T): each seed's mean loss at each position (NaN where no token sits)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.stack([s / np.where(c > 0, c, 0) for s, c in curves])


def _listed(values: np.ndarray, digits: int = 5) -> List[Optional[float]]:
    return [None if math.isnan(v) else round(float(v), digits) for v in values]


def combine_curves(curves: Sequence[Tuple[np.ndarray, np.ndarray]]) -> dict:
    """The seeds' curves at one point -> ``{"count", "loss_base2", "loss_base2_sd", "loss_base2_seeds"}``, lists
    over positions 1..T: the tokens at each position, the mean over seeds of each seed's mean loss there, the
    sample standard deviation over seeds (n - 1, as :func:`fairseq_pe.seeds.mean_sd`; None for one seed), each
    seed's; None where no token sits."""
    counts = curves[0][1]
    if any(not np.array_equal(c, counts) for _, c in curves):
        raise ValueError("the seeds' positions hold different token counts")
    means = seed_means(curves)
    sd = means.std(axis=0, ddof=1) if len(curves) > 1 else None
    return {"count": [int(c) for c in counts], "loss_base2": _listed(means.mean(axis=0)),
            "loss_base2_sd": None if sd is None else _listed(sd), "loss_base2_seeds": [_listed(m) for m in means]}


def stitch(by_length: Sequence[Tuple[int, Tuple[np.ndarray, np.ndarray]]]) -> Tuple[np.ndarray, np.ndarray]:
    """One checkpoint's non-overlapping curves ``[(N, (sums, counts)), ...]`` (N ascending) -> one curve over
    positions 1..N_max: positions N_{k-1}+1..N_k from the evaluation at N_k.  A causal model scores the token at
    position p of a window from the window's first p inputs alone, so its score there is the same computation in a
    window of any N ≥ p (for an encoding that does not depend on the window's length, as none of the catalogue's
    does); the evaluation at the shortest such N holds split/N tokens at p, the most of any."""
    sums, counts, last = [], [], 0
    for n, (s, c) in by_length:
        if n <= last:
            raise ValueError(f"lengths not ascending: {n} after {last}")
        sums.append(s[last:n])
        counts.append(c[last:n])
        last = n
    return np.concatenate(sums), np.concatenate(counts)


def buckets(train_length: int, length: int) -> List[Tuple[int, int]]:
    """The position buckets of the tables (1-based, inclusive): L's quarters, then L+1..2L, 2L+1..4L, ... to N."""
    edges = {train_length * k // 4 for k in range(1, 5)} | {length}
    edge = train_length
    while edge < length:
        edge *= 2
        edges.add(min(edge, length))
    edges = sorted(e for e in edges if 1 <= e <= length)
    return list(zip([1] + [e + 1 for e in edges[:-1]], edges))


def bucket_values(curves: Sequence[Tuple[np.ndarray, np.ndarray]], ranges: Sequence[Tuple[int, int]]) -> List[dict]:
    """Per bucket (first, last) of 1-based positions: its tokens and the mean loss of its tokens per seed, mean ±
    sample sd over seeds (``loss_base2`` None where no token sits)."""
    from fairseq_pe.seeds import mean_sd

    out = []
    for first, last in ranges:
        tokens = int(curves[0][1][first - 1:last].sum())
        entry = {"first": first, "last": last, "tokens": tokens}
        if tokens:
            per_seed = [float(s[first - 1:last].sum()) / tokens for s, _ in curves]
            mean, sd = mean_sd(per_seed)
            entry.update(loss_base2=mean, loss_base2_sd=sd, loss_base2_seeds=per_seed)
        else:
            entry.update(loss_base2=None, loss_base2_sd=None, loss_base2_seeds=None)
        out.append(entry)
    return out


def bin_edges(length: int, per_octave: int = BINS_PER_OCTAVE) -> List[int]:
    """The last position (1-based) of each geometric bin of positions 1..N: ceil(2^(k / per_octave)), distinct."""
    edges, k = [], 0
    while not edges or edges[-1] < length:
        edge = min(length, math.ceil(2 ** (k / per_octave) - 1e-9))
        if not edges or edge > edges[-1]:
            edges.append(edge)
        k += 1
    return edges


def binned(curve: dict, per_octave: int = BINS_PER_OCTAVE) -> Dict[str, list]:
    """A point's curve (:func:`combine_curves`) in geometric bins: ``{"x"`` (the bin's geometric centre),
    ``"mean"``, ``"sd"`` (over seeds of each seed's token-weighted bin mean; None for one seed)``}``, bins without
    tokens left out."""
    counts = np.asarray(curve["count"], dtype=np.float64)
    seeds = np.array([[math.nan if v is None else v for v in s] for s in curve["loss_base2_seeds"]])
    x, mean, sd = [], [], []
    first = 1
    for last in bin_edges(len(counts), per_octave):
        c = counts[first - 1:last]
        if c.sum() > 0:
            values = np.nansum(seeds[:, first - 1:last] * c, axis=1) / c.sum()
            x.append(math.sqrt(first * last))
            mean.append(float(values.mean()))
            sd.append(float(values.std(ddof=1)) if len(values) > 1 else None)
        first = last + 1
    return {"x": x, "mean": mean, "sd": sd}
