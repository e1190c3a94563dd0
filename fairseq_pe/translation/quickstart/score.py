"""The quickstart's scoring stage: sacreBLEU per source-length bucket (with its bootstrap interval) and the
references' teacher-forced loss (``fairseq-pe-bucket-loss``'s scoring) of each system's run."""

import os
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.outputs import write_json
from fairseq_pe.translation.bleu import GenerateOutputError, bucketed_bleu, read_generate_output
from fairseq_pe.translation.quickstart.common import read_json, read_lines
from fairseq_pe.translation.quickstart.train import SystemRun


def test_lengths(args, sources: Sequence[str]) -> List[int]:
    """Source length of each test line in ``--length-unit``."""
    from fairseq_pe.translation.s2l import source_lengths

    if args.length_unit == "word":
        return source_lengths(sources, "word")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.workdir, "spm", "spm.model"))
    return source_lengths(sources, "subword", sp)



def subset_scores(run: SystemRun, subset: str, refs: Sequence[str], lengths: Sequence[int], buckets,
                  failures: List[str], name: str, column: str, bootstrap: int = 0) -> Dict[str, dict]:
    """The scores of one test subset; those that need a sentence that was not translated, or all of
    them when the decoding failed, are :func:`~fairseq_pe.translation.bleu.unavailable` with the reason."""
    n = len(refs)
    reason = run.errors.get(subset) or run.reasons.get(subset)
    hyps: List[Optional[str]] = [None] * n
    if subset in run.errors:
        failures.append(f"{name}/{column}: {run.errors[subset]}")
    elif run.outputs.get(subset):
        try:
            hyps = [s.hypothesis for s in read_generate_output(run.outputs[subset], expected=n,
                                                               not_translated=run.skipped.get(subset, ()))]
        except (GenerateOutputError, OSError) as e:
            reason = f"the translations cannot be read: {e}"
            failures.append(f"{name}/{column}: {reason}")
    return bucketed_bleu(hyps, refs, lengths, buckets, missing_reason=reason, n_bootstrap=bootstrap)



def score(args, raw: str, run: SystemRun, lengths: Sequence[int], name: str = "",
          failures: Optional[List[str]] = None) -> Dict[str, dict]:
    """Bucketed sacreBLEU on the main test set (its source ``lengths``: :func:`test_lengths`) plus one
    overall score per ``--extra-test``, each with sacreBLEU's bootstrap interval (``--bootstrap``)."""
    failures = [] if failures is None else failures
    refs = read_lines(os.path.join(raw, f"test.{args.target_lang}"))
    result = subset_scores(run, "test", refs, lengths, args.buckets, failures, name, "test", args.bootstrap)
    for i, (extra, _, ref) in enumerate(args.extra_test, start=1):
        refs = read_lines(ref)
        result[extra] = subset_scores(run, f"test{i}", refs, [0] * len(refs), [(0, None)], failures, name,
                                      extra, args.bootstrap)["all"]
    return result



def reference_losses(args, data_bin: str, run: SystemRun, subset: str, name: str):
    """The teacher-forced NLL of every reference of a test subset, as ``fairseq-pe-bucket-loss``
    scores it (sentences beyond the model's positions: ``nll`` None and the reason); cached in the
    system's folder as ``losses-SUBSET.json``."""
    from fairseq_pe.translation import bucket_loss

    cache = os.path.join(run.folder, f"losses-{subset}.json")
    stored = read_json(cache)
    if stored is None:
        model, task = bucket_loss.load_system(name, run.checkpoint, data_bin, run.overrides, cpu=True)
        dataset, _ = bucket_loss.binary_test_set(task, subset, data_bin, train=False)
        losses = bucket_loss.score_references(model, task, dataset, args.max_tokens, "report", name)
        stored = [{"nll": None if x.nll is None else [round(v, 5) for v in x.nll], "why": x.why} for x in losses]
        write_json(cache, stored, indent=None)
    return [bucket_loss.SentenceLoss(x["nll"], x["why"]) for x in stored]



def loss_scores(losses, lengths: Sequence[int], buckets) -> Dict[str, dict]:
    """NLL per bucket and overall (:func:`fairseq_pe.translation.bucket_loss.aggregate`); a score that would need a
    sentence beyond the model's positions is unavailable (``"na"``: why), never computed on the rest."""
    from fairseq_pe.translation.bucket_loss import BEYOND, aggregate

    example = next((x.why for x in losses if x.nll is None), "")
    out = {}
    for label, entry in aggregate(losses, lengths, buckets).items():
        if label == BEYOND:
            continue
        if entry.get("beyond"):
            entry = {"nll": None, "n": entry["n"],
                     "na": f"{entry['beyond']} of {entry['n']} sentences need more positions than the model has "
                           f"(e.g. {example}): loss not computed"}
        out[label] = entry
    return out



def losses_of(args, data_bin: str, run: SystemRun, lengths: Sequence[int], name: str) -> Tuple[Dict[str, dict], list]:
    """Loss per bucket of the main test set and overall per ``--extra-test`` (as :func:`score`), and the
    sentence losses of the main test set (for the curve against target position)."""
    losses = reference_losses(args, data_bin, run, "test", name)
    result = loss_scores(losses, lengths, args.buckets)
    for i, (extra, _, _) in enumerate(args.extra_test, start=1):
        extra_losses = reference_losses(args, data_bin, run, f"test{i}", name)
        result[extra] = loss_scores(extra_losses, [0] * len(extra_losses), [(0, None)])["all"]
    return result, losses

