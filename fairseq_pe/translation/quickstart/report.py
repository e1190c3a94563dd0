"""The quickstart's report: the seeds combined, the tables printed and ``results.{txt,json,png}`` and
``results-loss.png`` written."""

import os
import time
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.seeds import combine
from fairseq_pe.seeds import describe as describe_seeds
from fairseq_pe.translation.bleu import bucket_label
from fairseq_pe.translation.bucket_bleu import format_table, write_outputs
from fairseq_pe.translation.quickstart.common import log, read_lines
from fairseq_pe.translation.quickstart.prepare import source_sizes
from fairseq_pe.translation.quickstart.score import losses_of, score, test_lengths
from fairseq_pe.translation.quickstart.train import SystemRun


def report(args, raw: str, data_bin: str, systems, outputs: Dict[Tuple[str, int], SystemRun],
           complete: Sequence[str], seconds: Optional[dict] = None) -> Tuple[Dict[str, Dict[str, dict]], List[str]]:
    """Score every run of the ``complete`` systems (BLEU with its bootstrap interval, length ratio, the
    references' loss), combine the seeds, print the tables and write ``results.{txt,json,png}`` and
    ``results-loss.png``, with ``seconds`` (the stages' times: this one's added as ``score_and_report``).
    Returns the combined BLEU results and the columns that could not be computed."""
    from fairseq_pe.translation import bucket_loss

    started = time.time()

    seeds = args.seeds
    extra_names = [name for name, _, _ in args.extra_test]
    column_failures: List[str] = []
    bleu_per_seed, loss_per_seed, sentence_losses = {}, {}, {}
    lengths = test_lengths(args, read_lines(os.path.join(raw, f"test.{args.source_lang}")))  # once for all runs
    log("scoring: sacreBLEU per bucket (with its bootstrap interval) and the references' loss per bucket")
    for seed in seeds:
        bleu_per_seed[seed], loss_per_seed[seed] = {}, {}
        for name in complete:
            run = outputs[name, seed]
            label = name if len(seeds) == 1 else f"{name} (seed {seed})"
            bleu_per_seed[seed][name] = score(args, raw, run, lengths, label, column_failures)
            loss_per_seed[seed][name], losses = losses_of(args, data_bin, run, lengths, label)
            sentence_losses.setdefault(name, []).extend(losses)
    results, loss_results = combine(bleu_per_seed), combine(loss_per_seed)
    spread = describe_seeds(seeds, args.bootstrap)
    where = "synthetic task, trained on 1-16 words" if not args.data else args.data
    title = f"sacreBLEU per source-length bucket ({where}; {args.arch}, {args.max_update} updates)\n{spread}"
    table = format_table(results, args.buckets, title, extras=extra_names)
    ratios = format_table(results, args.buckets, "length ratio" + ("" if len(seeds) == 1 else f" ({spread})"),
                          extras=extra_names, key="ratio")
    loss_spread = "one seed" if len(seeds) == 1 else spread
    loss_table = format_table(loss_results, args.buckets, f"loss of the references, NLL in bits per token ({loss_spread})",
                              extras=extra_names, key="nll")
    unit = "words" if args.length_unit == "word" else "sentencepiece tokens"
    curves = {name: bucket_loss.per_position(sentence_losses[name]) for name in complete}
    train_length = max(source_sizes(args, data_bin, ["train"], lang=args.target_lang)["train"])
    bucket_loss.plot({name: {"buckets": loss_results[name], "positions": curves[name], "train_length": train_length}
                      for name in complete}, args.buckets, os.path.join(args.workdir, "results-loss.png"),
                     "teacher-forced loss" + (f" (mean of {len(seeds)} seeds)" if len(seeds) > 1 else " (one seed)"),
                     f"source length ({unit})")
    payload = {"buckets": [bucket_label(b) for b in args.buckets], "length_unit": unit, "seeds": seeds,
               "longest_training_target": train_length,
               "extra_tests": {name: {"source": s, "reference": r} for name, s, r in args.extra_test},
               "systems": results, "loss": loss_results, "loss_per_target_position": curves,
               "per_seed": {str(seed): {"bleu": bleu_per_seed[seed], "loss": loss_per_seed[seed]} for seed in seeds},
               "flags": {n: fl for n, fl in systems if n in complete},
               "train_flags": args.train_flags, "arch": args.arch, "max_update": args.max_update}
    if seconds is not None:
        seconds["score_and_report"] = round(time.time() - started, 1)
        payload["seconds"] = seconds
    write_outputs(os.path.join(args.workdir, "results"), [table, ratios, loss_table], payload, results, args.buckets,
                  "BLEU by source length", extras=extra_names, xlabel=f"source length ({unit})", loss=loss_results)
    print("\n" + table + "\n\n" + ratios + "\n\n" + loss_table)
    return results, column_failures

