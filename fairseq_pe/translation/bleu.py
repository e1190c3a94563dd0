"""Strict reading of ``fairseq-generate`` output and sacreBLEU per source-length bucket.

Nothing is dropped silently: every source sentence must have exactly one hypothesis,
otherwise :class:`GenerateOutputError` says which sentence ids are missing or repeated.  A
sentence known not to be translated (its source longer than the model's positions) is named as
such, and the scores that would need it are marked unavailable, never computed on the rest.
"""

import argparse
import math
import re
from dataclasses import dataclass
from typing import Collection, Dict, List, Optional, Sequence, Tuple

import sacrebleu

Bucket = Tuple[int, Optional[int]]  # [lo, hi) with hi=None meaning no upper bound


class GenerateOutputError(ValueError):
    pass


@dataclass
class GeneratedSentence:
    source: Optional[str]  # None for a sentence that was not translated
    reference: Optional[str]
    hypothesis: Optional[str]  # None: not translated (``not_translated`` of read_generate_output)
    score: Optional[float]


_LINE = re.compile(r"^([STHD])-(\d+)\t(.*)$")


def read_generate_output(path: str, expected: Optional[int] = None, detokenized: bool = True,
                         not_translated: Collection[int] = ()) -> List[GeneratedSentence]:
    """Parse ``fairseq-generate`` output into a list ordered by sentence id.

    Uses the ``D-`` (detokenized) hypothesis lines when ``detokenized`` else ``H-``.
    ``expected`` is the number of sentences in the test set; ids 0..expected-1 must each
    appear exactly once, except the ids of ``not_translated`` (sentences fairseq-generate was
    told to skip), which must not appear: their entries have ``hypothesis`` None.
    """
    sources: Dict[int, str] = {}
    refs: Dict[int, str] = {}
    hyps: Dict[int, List[Tuple[float, str]]] = {}
    hyp_tag = "D" if detokenized else "H"
    with open(path, encoding="utf-8") as f:
        for line in f:
            m = _LINE.match(line.rstrip("\n"))
            if not m:
                continue
            tag, idx, rest = m.group(1), int(m.group(2)), m.group(3)
            if tag == "S":
                if idx in sources:
                    raise GenerateOutputError(f"{path}: source sentence {idx} appears twice")
                sources[idx] = rest
            elif tag == "T":
                refs[idx] = rest
            elif tag == hyp_tag:
                score, _, text = rest.partition("\t")
                hyps.setdefault(idx, []).append((float(score), text))
    if expected is None:
        expected = max(sources) + 1 if sources else 0
    skipped = set(not_translated)
    want = set(range(expected)) - skipped
    problems = []
    translated_anyway = sorted(skipped & (set(sources) | set(hyps)))
    if translated_anyway:
        problems.append(f"sentence(s) {translated_anyway[:10]} were expected to be skipped but were translated")
    missing_src = sorted(want - set(sources))
    if missing_src:
        problems.append(f"no S- line for {len(missing_src)} sentence(s), e.g. ids {missing_src[:10]}")
    extra = sorted(set(sources) - want - skipped)
    if extra:
        problems.append(f"unexpected sentence ids {extra[:10]} (expected 0..{expected - 1})")
    missing_hyp = sorted(want - set(hyps))
    if missing_hyp:
        problems.append(f"no {hyp_tag}- hypothesis for {len(missing_hyp)} sentence(s), e.g. ids {missing_hyp[:10]}")
    multi = sorted(i for i, h in hyps.items() if len(h) > 1)
    if multi:
        problems.append(
            f"more than one {hyp_tag}- hypothesis for {len(multi)} sentence(s), e.g. ids {multi[:10]} "
            "(was fairseq-generate run with --nbest > 1?)"
        )
    if problems:
        raise GenerateOutputError(f"{path}: " + "; ".join(problems))
    return [
        GeneratedSentence(None, None, None, None) if i in skipped
        else GeneratedSentence(sources[i], refs.get(i), hyps[i][0][1], hyps[i][0][0]) for i in range(expected)
    ]


def bucket_label(bucket: Bucket) -> str:
    lo, hi = bucket
    return f"[{lo},{hi})" if hi is not None else f"[{lo},inf)"


def parse_buckets(spec: str) -> List[Bucket]:
    """``"1,17,25,33,49"`` -> [1,17) [17,25) [25,33) [33,49); a trailing ``+`` makes the last open."""
    open_end = spec.endswith("+")
    edges = [int(x) for x in spec.rstrip("+").split(",")]
    if len(edges) < (1 if open_end else 2) or edges != sorted(set(edges)):
        raise argparse.ArgumentTypeError(f"--buckets {spec!r}: give increasing boundaries, e.g. 1,17,25,33,49")
    buckets: List[Bucket] = [(lo, hi) for lo, hi in zip(edges, edges[1:])]
    if open_end:
        buckets.append((edges[-1], None))
    return buckets


def assign_bucket(length: int, buckets: Sequence[Bucket]) -> Optional[int]:
    for b, (lo, hi) in enumerate(buckets):
        if length >= lo and (hi is None or length < hi):
            return b
    return None


def unavailable(n: int, reason: str) -> dict:
    """The entry of a score that cannot be computed (a sentence of it was not translated)."""
    return {"bleu": None, "n": n, "ratio": None, "na": reason}


def _score(metric, hyps: List[str], refs: List[str], n_bootstrap: int = 0) -> dict:
    """BLEU, sentence count and the length ratio (hypothesis / reference tokens, as sacreBLEU counts them).

    With ``n_bootstrap`` > 1 also sacreBLEU's own bootstrap estimate (``corpus_score(...,
    n_bootstrap=N)``, over resamples of the sentences): ``bleu_ci``, the half-width of its 95%
    confidence interval, and ``bleu_bs_mean``, the mean of the resampled scores."""
    if not hyps:
        return {"bleu": math.nan, "n": 0, "ratio": math.nan}
    s = metric.corpus_score(hyps, [refs], n_bootstrap=n_bootstrap if n_bootstrap > 1 else 1)
    out = {"bleu": s.score, "n": len(hyps), "ratio": s.sys_len / s.ref_len if s.ref_len else math.nan}
    if n_bootstrap > 1:
        out.update(bleu_ci=s._ci, bleu_bs_mean=s._mean)
    return out


def bucketed_bleu(
    hypotheses: Sequence[Optional[str]],
    references: Sequence[str],
    lengths: Sequence[int],
    buckets: Sequence[Bucket],
    missing_reason: Optional[str] = None,
    n_bootstrap: int = 0,
    **bleu_kwargs,
) -> Dict[str, dict]:
    """sacreBLEU of each bucket and of all sentences.

    Returns ``{label: {"bleu": float, "n": int, "ratio": float}}`` (``ratio``: hypothesis length over
    reference length, which shows a model stopping early or running on) plus an ``"all"`` entry and a
    ``"signature"`` string.  A sentence whose length falls in no bucket is an error.

    A hypothesis None is a sentence that was not translated, for ``missing_reason``: every score
    that would include it (its bucket, ``"all"``) is :func:`unavailable` with that reason, the
    others are computed as usual.  Without a reason, a None hypothesis is an error.

    ``n_bootstrap`` > 1 adds sacreBLEU's bootstrap confidence interval to every score (:func:`_score`).
    """
    if not (len(hypotheses) == len(references) == len(lengths)):
        raise GenerateOutputError(
            f"{len(hypotheses)} hypotheses, {len(references)} references and {len(lengths)} lengths: "
            "the inputs must be line-aligned"
        )
    missing = [i for i, h in enumerate(hypotheses) if h is None]
    if missing and missing_reason is None:
        raise GenerateOutputError(f"no hypothesis for {len(missing)} sentence(s), e.g. {missing[:10]}")
    missing = set(missing)
    members: List[List[int]] = [[] for _ in buckets]
    for i, n in enumerate(lengths):
        b = assign_bucket(n, buckets)
        if b is None:
            raise GenerateOutputError(
                f"sentence {i} has length {n}, which is in none of the buckets "
                f"{[bucket_label(b) for b in buckets]}"
            )
        members[b].append(i)
    result: Dict[str, dict] = {}
    metric = sacrebleu.metrics.BLEU(**bleu_kwargs)
    for bucket, idx in zip(buckets, members):
        if missing.intersection(idx):
            result[bucket_label(bucket)] = unavailable(len(idx), missing_reason)
        else:
            result[bucket_label(bucket)] = _score(metric, [hypotheses[i] for i in idx], [references[i] for i in idx],
                                                  n_bootstrap)
    if missing:
        result["all"] = unavailable(len(hypotheses), missing_reason)
    else:
        result["all"] = _score(metric, list(hypotheses), list(references), n_bootstrap)
    if all(r.get("bleu") is None for r in result.values()):
        metric.corpus_score([""], [[""]])  # nothing scored: the signature needs one call (it counts references)
    result["signature"] = str(metric.get_signature())
    return result
