"""SQuAD v1.1 / v2.0: official scoring, span decoding, and ``fairseq-pe-squad-predict``.

**Scoring** reproduces the official scripts (``evaluate-v1.1.py`` and ``evaluate-v2.0.py`` of
https://rajpurkar.github.io/SQuAD-explorer/, Rajpurkar et al. 2016, 2018):

* normalisation ``normalize_answer``: lower-case, drop the characters of ``string.punctuation``,
  replace the articles ``\\b(a|an|the)\\b`` by a space, collapse whitespace (in that order);
* exact match: normalised strings equal; F1: harmonic mean of precision and recall over the bag of
  normalised whitespace tokens (multiset intersection);
* each score is the maximum over the gold answers of the question, averaged over questions, x100;
* v1.1 (:func:`evaluate_v1`): a question without a prediction scores 0;
* v2.0 (:func:`evaluate_v2`): gold answers that normalise to "" are dropped; a question without
  gold answers (``is_impossible``) has the single gold answer "", and then EM = F1 = 1 exactly when
  the prediction is "" (F1 is ``int(gold_tokens == pred_tokens)`` when either side is empty); the
  ``HasAns_*`` / ``NoAns_*`` breakdown over answerable / impossible questions is added.  As the
  official script, v2.0 averages over the questions that have a prediction.

**Decoding** (:func:`predict_answers`), BERT's ``run_squad.py`` (Devlin et al. 2019, §4.2-4.3) on
the features of ``fairseq-pe-prepare-squad``: a span (i, j) of one feature scores
start_logit[i] + end_logit[j]; it is valid when both ends lie in the feature's context, j >= i,
j - i + 1 <= ``max_answer_length`` pieces, i is a piece whose window is its "max context" window,
and neither end is a whitespace-only piece.  The best valid span over all the question's windows is
found exactly (not only among the top-n starts and ends as in ``run_squad.py``) and mapped to the
context's characters with sentencepiece's offsets.  For v2.0, s_null = min over windows of
start_logit[0] + end_logit[0]; the answer is "" when s_null - best_span_score >
``null_score_diff_threshold``, as ``run_squad.py``'s ``--null_score_diff_threshold`` (BERT §4.3
predicts a non-null answer when ŝ_ij > s_null + τ: τ is minus this threshold, up to the tie).

``fairseq-pe-squad-predict DATA --path CKPT --split valid --json DEV.json --out PREFIX`` runs a
fine-tuned checkpoint on every feature of the split and writes ``PREFIX.predictions.json`` (question
id -> answer, the official scripts' prediction format), ``PREFIX.nbest.json``,
``PREFIX.null_odds.json`` (v2.0: s_null - best span score, the official v2.0 script's
``--na-prob-file``) and ``PREFIX.scores.json`` (last: it says the run is complete), each written
atomically, and prints EM / F1.  The files of an earlier run are replaced only with ``--force``,
and never an input.
"""

import argparse
import json
import math
import os
import re
import string
import sys
import time
from collections import Counter, OrderedDict, defaultdict
from typing import Dict, Iterable, List, Optional, Sequence, Tuple

import numpy as np

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import check_new_files, write_json
from fairseq_pe.safe_load import CheckpointRefused

#: the files of ``--out PREFIX`` (null_odds for SQuAD 2.0 only), in the order they are written
OUTPUT_NAMES = ("predictions", "nbest", "null_odds", "scores")

# ---------------------------------------------------------------------------------------------
# official scoring

_PUNCT = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
    """Lower text and remove punctuation, articles and extra whitespace (official SQuAD)."""
    s = s.lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def _f1_tokens(pred_tokens: List[str], gold_tokens: List[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match_v1(prediction: str, ground_truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(ground_truth))


def f1_v1(prediction: str, ground_truth: str) -> float:
    """``evaluate-v1.1.py``'s ``f1_score`` (0 when the normalised prediction shares no token)."""
    return _f1_tokens(normalize_answer(prediction).split(), normalize_answer(ground_truth).split())


def _tokens_v2(s: str) -> List[str]:
    return normalize_answer(s).split() if s else []


def exact_match_v2(a_gold: str, a_pred: str) -> float:
    return float(normalize_answer(a_gold) == normalize_answer(a_pred))


def f1_v2(a_gold: str, a_pred: str) -> float:
    """``evaluate-v2.0.py``'s ``compute_f1``: with an empty side, 1 if both are empty else 0."""
    gold, pred = _tokens_v2(a_gold), _tokens_v2(a_pred)
    if not gold or not pred:
        return float(gold == pred)
    return _f1_tokens(pred, gold)


def iter_questions(dataset: Iterable[dict]) -> Iterable[Tuple[dict, dict]]:
    """``(paragraph, qa)`` for every question of the articles ``dataset`` (a SQuAD file's ``data``)."""
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                yield paragraph, qa


def evaluate_v1(dataset: Iterable[dict], predictions: Dict[str, str]) -> Dict[str, float]:
    """``evaluate-v1.1.py``: ``{"exact_match", "f1", "total", "missing"}`` in percent."""
    em = f1 = 0.0
    total = missing = 0
    for _, qa in iter_questions(dataset):
        total += 1
        if qa["id"] not in predictions:
            missing += 1
            continue
        golds = [a["text"] for a in qa["answers"]]
        pred = predictions[qa["id"]]
        em += max(exact_match_v1(pred, g) for g in golds)
        f1 += max(f1_v1(pred, g) for g in golds)
    return {"exact_match": 100.0 * em / total if total else 0.0, "f1": 100.0 * f1 / total if total else 0.0,
            "total": total, "missing": missing}


def evaluate_v2(dataset: Iterable[dict], predictions: Dict[str, str]) -> Dict[str, float]:
    """``evaluate-v2.0.py`` without a no-answer probability file: exact, f1, total, HasAns_*, NoAns_*."""
    exact, f1, has_ans = {}, {}, {}
    missing = 0
    for _, qa in iter_questions(dataset):
        qid = qa["id"]
        has_ans[qid] = bool(qa["answers"])
        golds = [a["text"] for a in qa["answers"] if normalize_answer(a["text"])] or [""]
        if qid not in predictions:
            missing += 1
            continue
        pred = predictions[qid]
        exact[qid] = max(exact_match_v2(g, pred) for g in golds)
        f1[qid] = max(f1_v2(g, pred) for g in golds)

    def block(qids):
        n = len(qids)
        return (100.0 * sum(exact[q] for q in qids) / n if n else 0.0,
                100.0 * sum(f1[q] for q in qids) / n if n else 0.0, n)

    out = OrderedDict()
    out["exact"], out["f1"], out["total"] = block(list(exact))
    for name, want in (("HasAns", True), ("NoAns", False)):
        qids = [q for q in exact if has_ans[q] == want]
        if qids:
            out[f"{name}_exact"], out[f"{name}_f1"], out[f"{name}_total"] = block(qids)
    out["missing"] = missing
    return out


def evaluate(dataset: Iterable[dict], predictions: Dict[str, str], version: str) -> Dict[str, float]:
    """The official scores of ``version`` ("1.1" or "2.0"), with ``exact_match``/``f1`` in both."""
    if version == "1.1":
        return evaluate_v1(dataset, predictions)
    if version == "2.0":
        out = evaluate_v2(dataset, predictions)
        out["exact_match"] = out["exact"]
        return out
    raise ValueError(f"unknown SQuAD version {version!r}: 1.1 or 2.0")


# ---------------------------------------------------------------------------------------------
# decoding spans


def read_features(path: str) -> List[dict]:
    """The metadata lines of ``SPLIT.features.jsonl`` (feature i = line i)."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"feature metadata not found: {path} (written by fairseq-pe-prepare-squad)")
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def feature_candidates(start_logits: np.ndarray, end_logits: np.ndarray, meta: dict, max_answer_length: int,
                       n_best: int) -> List[Tuple[float, int, int]]:
    """The ``n_best`` best valid spans ``(score, i, j)`` of one feature (i, j: context piece indices).

    Valid: i <= j <= i + max_answer_length - 1 inside the feature's context, i a max-context piece,
    neither end a whitespace-only piece (an empty character span).
    """
    cs = meta["context_start"]
    offsets = meta["offsets"]
    n = len(offsets)
    if len(start_logits) < cs + n or len(end_logits) < cs + n:
        raise ValueError(f"feature {meta.get('qid')}#{meta.get('feature')}: {len(start_logits)} logits for "
                         f"{cs + n} positions (the metadata does not belong to these features)")
    S = np.asarray(start_logits[cs:cs + n], dtype=np.float64)
    E = np.asarray(end_logits[cs:cs + n], dtype=np.float64)
    nonempty = np.array([b < e for b, e in offsets], dtype=bool)
    ok_start = nonempty & np.asarray(meta["max_context"], dtype=bool)
    width = min(max_answer_length, n)
    scores = np.full((n, width), -np.inf)
    for w in range(width):
        valid = ok_start[:n - w] & nonempty[w:]
        scores[:n - w, w] = np.where(valid, S[:n - w] + E[w:], -np.inf)
    flat = scores.ravel()
    k = min(n_best, int(np.isfinite(flat).sum()))
    if k == 0:
        return []
    top = np.argpartition(-flat, k - 1)[:k]
    top = top[np.argsort(-flat[top], kind="stable")]
    return [(float(flat[t]), int(t // width), int(t // width + t % width)) for t in top]


def predict_answers(features: Sequence[dict], logits: Sequence[Tuple[np.ndarray, np.ndarray]],
                    contexts: Dict[str, str], version: str = "1.1", max_answer_length: int = 30,
                    n_best: int = 20, null_score_diff_threshold: float = 0.0):
    """Answers from per-feature logits.

    ``features``: metadata of ``SPLIT.features.jsonl``; ``logits[i]``: (start, end) logits of feature
    i over its positions; ``contexts``: question id -> its context.  Returns ``(predictions,
    nbest, null_odds, counts)``: question id -> answer text; -> list of the best candidates
    ``{"text", "start", "end" (characters), "score"}``; -> s_null - best span score (v2.0 only);
    and counts (questions without any valid span get "").
    """
    if len(features) != len(logits):
        raise ValueError(f"{len(features)} features but {len(logits)} logits")
    by_q: Dict[str, List[int]] = defaultdict(list)
    for i, meta in enumerate(features):
        by_q[meta["qid"]].append(i)
    predictions, nbest, null_odds = OrderedDict(), OrderedDict(), OrderedDict()
    counts = Counter()
    for qid, idx in by_q.items():
        context = contexts[qid]
        cands = []
        score_null = math.inf
        for i in idx:
            start, end = logits[i]
            meta = features[i]
            score_null = min(score_null, float(start[0]) + float(end[0]))
            for score, a, b in feature_candidates(start, end, meta, max_answer_length, n_best):
                c0, c1 = meta["offsets"][a][0], meta["offsets"][b][1]
                cands.append((score, c0, c1))
        cands.sort(key=lambda c: -c[0])
        seen, best = set(), []
        for score, c0, c1 in cands:
            if (c0, c1) in seen:
                continue
            seen.add((c0, c1))
            best.append({"text": context[c0:c1], "start": c0, "end": c1, "score": score})
            if len(best) >= n_best:
                break
        if not best:
            counts["questions without a valid span"] += 1
        if version == "2.0":
            diff = score_null - best[0]["score"] if best else math.inf
            null_odds[qid] = diff
            predictions[qid] = "" if diff > null_score_diff_threshold else best[0]["text"]
            counts["predicted no answer"] += predictions[qid] == ""
            best.append({"text": "", "start": -1, "end": -1, "score": score_null})
            best.sort(key=lambda c: -c["score"])
        else:
            predictions[qid] = best[0]["text"] if best else ""
        nbest[qid] = best
    counts["questions"] = len(predictions)
    return predictions, nbest, null_odds, counts


def squad_contexts(data: dict) -> Dict[str, str]:
    """Question id -> context of a parsed SQuAD file."""
    return {qa["id"]: p["context"] for p, qa in iter_questions(data["data"])}


def check_features_match(features: Sequence[dict], contexts: Dict[str, str], json_path: str, meta_path: str):
    """Every feature's question is in the JSON with the very context that was prepared, and back."""
    from fairseq_pe.data_prep.squad import context_fingerprint

    checked = {}
    for meta in features:
        qid = meta["qid"]
        if qid in checked:
            continue
        if qid not in contexts:
            raise ValueError(f"question {qid} of {meta_path} is not in --json {json_path}: prepared from another file?")
        c = contexts[qid]
        if len(c) != meta["context_chars"] or context_fingerprint(c) != meta["context_sha1"]:
            raise ValueError(f"question {qid}: its context in --json {json_path} differs from the one prepared in "
                             f"{meta_path}")
        checked[qid] = True
    missing = [q for q in contexts if q not in checked]
    if missing:
        raise ValueError(f"{len(missing)} question(s) of --json {json_path} have no feature in {meta_path} "
                         f"(e.g. {missing[:3]}): prepared from another file?")


# ---------------------------------------------------------------------------------------------
# fairseq-pe-squad-predict


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-squad-predict", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", help="output directory of fairseq-pe-prepare-squad")
    p.add_argument("--path", required=True, help="fine-tuned checkpoint (fairseq-train --task span_prediction)")
    p.add_argument("--user-dir", default=None, help="fairseq plugin directory (fairseq_pe is imported anyway)")
    p.add_argument("--split", default="valid", help="split of DATA to predict")
    p.add_argument("--json", required=True, help="the SQuAD file the split was prepared from (gold answers)")
    p.add_argument("--out", required=True, help="output prefix: PREFIX.predictions.json, PREFIX.scores.json, ...")
    p.add_argument("--max-answer-length", type=int, default=30, help="longest answer in pieces")
    p.add_argument("--n-best", type=int, default=20, help="candidates kept per question in PREFIX.nbest.json")
    p.add_argument("--null-score-diff-threshold", type=float, default=None,
                   help="v2.0 only: answer '' when s_null - best span score exceeds this (default 0)")
    p.add_argument("--batch-size", type=int, default=32, help="features per batch")
    p.add_argument("--cpu", action="store_true", help="run on the CPU even with a GPU")
    p.add_argument("--fp16", action="store_true", help="half precision on the GPU")
    p.add_argument("--force", action="store_true", help="replace the --out files of an earlier run")
    args = p.parse_args(argv)
    for flag in ("max_answer_length", "n_best", "batch_size"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be positive")
    for flag, path in (("DATA", args.data), ("--path", args.path), ("--json", args.json)):
        if not os.path.exists(path):
            p.error(f"{flag}: not found: {path}")
    return args


def log(msg: str):
    print(f"[squad-predict] {msg}", file=sys.stderr, flush=True)


def run_model(model, task, split: str, batch_size: int, use_cuda: bool) -> List[Tuple[np.ndarray, np.ndarray]]:
    """Start/end logits of every feature of ``split``, in feature order; none is skipped."""
    import torch
    from fairseq import utils as fairseq_utils

    from fairseq_pe.criterions.span_prediction import span_logits

    dataset = task.dataset(split)
    itr = task.get_batch_iterator(dataset=dataset, max_sentences=batch_size, max_positions=task.max_positions(),
                                  ignore_invalid_inputs=False, required_batch_size_multiple=1, num_workers=0,
                                  disable_iterator_cache=True).next_epoch_itr(shuffle=False)
    out: List[Optional[Tuple[np.ndarray, np.ndarray]]] = [None] * len(dataset)
    head, pad = task.cfg.span_head_name, task.source_dictionary.pad()
    done, t0, last = 0, time.time(), 0.0
    with torch.inference_mode():
        for sample in itr:
            if use_cuda:
                sample = fairseq_utils.move_to_cuda(sample)
            start, end = span_logits(model, sample["net_input"], head, pad)
            start, end = start.cpu().numpy(), end.cpu().numpy()
            lengths = sample["net_input"]["src_lengths"].tolist()
            for row, i in enumerate(sample["id"].tolist()):
                out[i] = (start[row, :lengths[row]].copy(), end[row, :lengths[row]].copy())
            done += len(lengths)
            now = time.time()
            if now - last > 10 or done == len(dataset):
                last = now
                log(f"{done}/{len(dataset)} features ({done / max(now - t0, 1e-9):.1f}/s)")
    missing = [i for i, o in enumerate(out) if o is None]
    if missing:
        raise RuntimeError(f"{len(missing)} feature(s) of {split} got no prediction (e.g. {missing[:5]})")
    return out


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """Errors in what was given end as ``fairseq-pe-squad-predict: error: ...``, status 2."""
    args = parse_args(argv)
    import torch
    from fairseq import checkpoint_utils, utils as fairseq_utils

    from fairseq_pe.data_prep.squad import detect_version, load_squad
    from fairseq_pe.tasks.span_prediction import SpanPredictionTask

    inputs = [("--path", args.path), ("--json", args.json)]
    if os.path.isdir(args.data):
        inputs += [("DATA", os.path.join(root, name)) for root, _, names in os.walk(args.data) for name in names]
    check_new_files([f"{args.out}.{name}.json" for name in OUTPUT_NAMES], args.force, flag="--out", inputs=inputs,
                    where=args.out)
    if args.user_dir:
        if not os.path.isdir(args.user_dir):
            raise UserError(f"--user-dir {args.user_dir}: no such folder")
        fairseq_utils.import_user_module(argparse.Namespace(user_dir=args.user_dir))
    data = load_squad(args.json)  # SquadPrepError is a UserError naming the file
    version = detect_version(data)
    prep_path = os.path.join(args.data, "prepare.json")
    if os.path.isfile(prep_path):
        with open(prep_path, encoding="utf-8") as f:
            version = json.load(f).get("version", version)
    meta_path = os.path.join(args.data, f"{args.split}.features.jsonl")
    try:
        features = read_features(meta_path)
        contexts = squad_contexts(data)
        check_features_match(features, contexts, args.json, meta_path)
    except (ValueError, FileNotFoundError) as e:
        raise UserError(f"--split {args.split}: {e}" if isinstance(e, FileNotFoundError) else str(e)) from None

    if version != "2.0" and args.null_score_diff_threshold is not None:
        raise UserError(f"--null-score-diff-threshold applies to SQuAD 2.0 only; {args.data} is SQuAD {version}")
    threshold = 0.0 if args.null_score_diff_threshold is None else args.null_score_diff_threshold
    use_cuda = torch.cuda.is_available() and not args.cpu
    if args.fp16 and not use_cuda:
        raise UserError("--fp16 needs a GPU (and no --cpu)")
    log(f"loading {args.path}")
    try:
        state = checkpoint_utils.load_checkpoint_to_cpu(args.path, {"data": args.data})
    except CheckpointRefused:  # it would run code as it loads: its message names what, and how to trust it
        raise
    except Exception as e:  # noqa: BLE001  (a truncated file, not a torch pickle, ...)
        raise UserError(f"--path {args.path}: cannot be read as a fairseq checkpoint "
                        f"({type(e).__name__}: {str(e)[:300]})") from None
    models, _cfg, task = checkpoint_utils.load_model_ensemble_and_task([args.path], arg_overrides={"data": args.data},
                                                                       state=state)
    if not isinstance(task, SpanPredictionTask):
        raise UserError(f"--path {args.path} was not trained with --task span_prediction")
    model = models[0].eval()
    if use_cuda:
        model = model.cuda()
        if args.fp16:
            model = model.half()
    task.load_dataset(args.split)
    if len(task.dataset(args.split)) != len(features):
        raise UserError(f"{meta_path} has {len(features)} lines but the split has {len(task.dataset(args.split))} "
                        "features: prepare DATA again")
    t0 = time.time()
    logits = run_model(model, task, args.split, args.batch_size, use_cuda)
    predictions, nbest, null_odds, counts = predict_answers(
        features, logits, contexts, version=version, max_answer_length=args.max_answer_length, n_best=args.n_best,
        null_score_diff_threshold=threshold)
    scores = evaluate(data["data"], predictions, version)
    report = OrderedDict(scores)
    report.update(version=version, checkpoint=os.path.abspath(args.path), split=args.split,
                  json=os.path.abspath(args.json), features=len(features), questions=counts["questions"],
                  questions_without_valid_span=counts["questions without a valid span"],
                  max_answer_length=args.max_answer_length, n_best=args.n_best, seconds=round(time.time() - t0, 1))
    if version == "2.0":
        report.update(null_score_diff_threshold=threshold,
                      predicted_no_answer=counts["predicted no answer"])
    outputs = {"predictions": predictions, "nbest": nbest, "null_odds": null_odds, "scores": report}
    if version != "2.0":
        del outputs["null_odds"]
        if os.path.isfile(f"{args.out}.null_odds.json"):  # an earlier run's (2.0 data), replaced with --force
            os.remove(f"{args.out}.null_odds.json")
    for name, obj in outputs.items():  # scores last: its presence says the run is complete
        write_json(f"{args.out}.{name}.json", obj, ensure_ascii=False)
    line = f"SQuAD v{version} {args.split}: EM {scores['exact_match']:.2f} F1 {scores['f1']:.2f} " \
           f"({counts['questions']} questions, {len(features)} features)"
    if version == "2.0":
        for k in ("HasAns", "NoAns"):
            if f"{k}_total" in scores:
                line += f" | {k} EM {scores[f'{k}_exact']:.2f} F1 {scores[f'{k}_f1']:.2f} (n={scores[f'{k}_total']})"
    print(line, flush=True)
    log(f"wrote {', '.join(f'{args.out}.{n}.json' for n in outputs)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
