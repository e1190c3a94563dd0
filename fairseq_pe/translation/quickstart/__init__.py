"""``fairseq-pe-quickstart``: train one tiny model per position encoding, BLEU per length bucket.

On a machine with no data and no network it builds the synthetic short-to-long task of
:mod:`fairseq_pe.translation.synthetic` (training sentences of at most 16 words, test sentences up to
48), binarises it with ``fairseq-preprocess``, trains ``transformer_pe_tiny`` once per
encoding with ``fairseq-train --user-dir fairseq_pe``, decodes the test set with
``fairseq-generate`` and prints tables of sacreBLEU, length ratio and the references'
teacher-forced loss (``fairseq-pe-bucket-loss``'s scoring) per source-length bucket, also written
as JSON and as PNG plots (``results.png``, and ``results-loss.png`` with the loss against target
position).  ``--data DIR`` uses a real corpus instead (``DIR/{train,valid,test}.{SRC,TGT}``, raw
text, one sentence per line), segmented with a sentencepiece model trained on its training split.

``--seeds 1 2 3`` trains every system once per seed (``WORK/systems/NAME/seed-S``) on the same data
and test sets, and the tables give mean ± standard deviation over the seeds; with one seed (the
default) they say so, and every BLEU has the 95% confidence interval of sacreBLEU's bootstrap
resampling (``--bootstrap``), which measures the test set's sampling, not the training run's.

Test sets are translated from their sources alone: a reference only serves scoring, so a
reference longer than a learned position table never stops a system.  Only a *source* longer
than the model's source positions cannot be translated; the scores that would need it (its
bucket and ``all``, or an ``--extra-test`` column) are then marked ``n/a`` with the reason, and
every other score of that system is kept.  A decoding that fails marks its column the same way.

The work dir is resumed: trained systems and their translations are reused.  It is recorded in
``WORK/quickstart.json`` with the options its data were built with (each system's options in
``WORK/systems/NAME/system.json``); a re-run with other options stops and names them, since
reusing would mix results of different settings: ``--force`` rebuilds and retrains, or choose
another ``--workdir``.  A folder that holds other files and was not made by the quickstart is never
used.
"""

import argparse
import logging
import os
import time
from typing import Dict, List, Optional

from fairseq_pe.errors import cli
from fairseq_pe.outputs import write_json
from fairseq_pe.translation.bleu import parse_buckets
from fairseq_pe.translation.quickstart.common import (  # noqa: F401  (the quickstart's names, for its users)
    DEFAULT_SYSTEMS, NAMED_SYSTEMS, PLUGIN_DIR, WARM_STARTED, WORK_ENTRIES, WORK_MARKER, log)
from fairseq_pe.translation.quickstart.options import (  # noqa: F401
    check_options, parse_decode_variant, parse_extra_test, parse_system)
from fairseq_pe.translation.quickstart.prepare import prepare
from fairseq_pe.translation.quickstart.report import report
from fairseq_pe.translation.quickstart.score import score, subset_scores  # noqa: F401
from fairseq_pe.translation.quickstart.train import SystemRun, train_all, train_and_decode  # noqa: F401
from fairseq_pe.translation.quickstart.workdir import check_workdir, system_config, system_dir  # noqa: F401

#: the quickstart's stages, one module each: options (what the user gave, checked), workdir (what the work dir
#: was made with), prepare (data), train (training and decoding), score (BLEU and loss), report (tables, files)
__all__ = ["DEFAULT_SYSTEMS", "NAMED_SYSTEMS", "PLUGIN_DIR", "WARM_STARTED", "WORK_ENTRIES", "WORK_MARKER",
           "SystemRun", "get_parser", "main", "parse_buckets", "parse_decode_variant", "parse_extra_test",
           "parse_system", "run_quickstart", "score", "subset_scores", "system_config", "system_dir",
           "train_and_decode"]


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-quickstart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="quickstart-work", help="where data, checkpoints and results go")
    p.add_argument("--data", help="a real corpus directory with {train,valid,test}.{SRC,TGT} raw text "
                                  "(default: build the synthetic task)")
    p.add_argument("--source-lang", default="src")
    p.add_argument("--target-lang", default="tgt")
    p.add_argument("--spm-vocab-size", type=int, default=8000, help="sentencepiece size for --data")
    p.add_argument("--spm-model", help="with --data: use this sentencepiece model instead of training one")
    p.add_argument("--buckets", type=parse_buckets, default=None,
                   help="source-length bucket boundaries (default 1,17,25,33,49 synthetic; "
                        "1,20,40,60,80+ with --data); a trailing + makes the last bucket open")
    p.add_argument("--length-unit", choices=["word", "subword"], default="word",
                   help="unit of --buckets: source words, or sentencepiece tokens as the model sees them (--data)")
    p.add_argument("--extra-test", type=parse_extra_test, action="append", default=[], metavar="NAME=SRC,REF",
                   help="an additional test corpus (raw text), decoded by every system and reported as a "
                        "column NAME of the same table; repeat for several")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS),
                   help="encodings to compare: names of defaults or NAME=FLAGS")
    p.add_argument("--decode-variant", type=parse_decode_variant, action="append", default=[],
                   metavar="NAME=BASE:OVERRIDES",
                   help="one more row NAME: the checkpoints of system BASE (one of --systems) decoded and scored "
                        "with fairseq's --model-overrides OVERRIDES (a Python dict), without training, e.g. "
                        "\"rope-ntk=rope:{'pe_rope_scaling': 'ntk', 'pe_rope_scaling_factor': 4}\"; repeat for several")
    p.add_argument("--arch", default="transformer_pe_tiny")
    p.add_argument("--train-flags", default="", help="more fairseq-train flags for every system (one string)")
    p.add_argument("--train-size", type=int, default=20000, help="synthetic training pairs")
    p.add_argument("--test-per-bucket", type=int, default=150, help="synthetic test sentences per bucket")
    p.add_argument("--max-update", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--lenpen", type=float, default=1.0, help="fairseq-generate --lenpen")
    p.add_argument("--gen-batch-size", type=int, default=64, help="fairseq-generate --batch-size")
    p.add_argument("--seeds", type=int, nargs="+", default=[1], metavar="SEED",
                   help="training seeds: every system is trained once per seed and the tables show mean ± standard "
                        "deviation over them (default: one seed, 1, with sacreBLEU's bootstrap intervals)")
    p.add_argument("--data-seed", type=int, default=1, help="seed of the synthetic corpus (the same for every "
                                                            "training seed)")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="sacreBLEU bootstrap resamples for the 95%% confidence interval of a single seed's BLEU")
    p.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                   help="systems trained at the same time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job")
    p.add_argument("--force", action="store_true",
                   help="retrain and decode again every system that has results already (and rebuild the work "
                        "dir's data when its options changed)")
    p.add_argument("--progress-seconds", type=float, default=20.0)
    return p


@cli
def main(argv: Optional[List[str]] = None) -> None:
    run_quickstart(get_parser().parse_args(argv))


def run_quickstart(args) -> Dict[str, Dict[str, dict]]:
    """The whole quickstart (its options checked, the work dir recorded; then its stages: prepare, train and
    decode, score and report, each timed in the log and ``results.json``'s ``seconds``); returns
    ``{system: {bucket: {"bleu", "n"}}}``."""
    systems, variants = check_options(args)
    record = check_workdir(args, systems, variants)
    os.makedirs(args.workdir, exist_ok=True)
    write_json(os.path.join(args.workdir, WORK_MARKER), record)
    for quiet in ("fairseq", "matplotlib", "PIL"):  # importing fairseq (positions of the models) turns on DEBUG
        logging.getLogger(quiet).setLevel(logging.WARNING)
    t0 = time.time()
    data = prepare(args)
    seconds = {"prepare": round(time.time() - t0, 1)}
    t1 = time.time()
    outputs, failures = train_all(args, data, systems, variants)
    seconds["train_and_decode"] = round(time.time() - t1, 1)
    seconds["runs"] = {f"{name} (seed {seed})": run.seconds for (name, seed), run in sorted(outputs.items())}
    # a system is in the tables when every seed of it trained: a mean over fewer seeds would not compare
    complete = [name for name, _ in systems if all((name, seed) in outputs for seed in args.seeds)]
    if not complete:
        raise SystemExit(f"every system failed: {', '.join(failures)} (logs in {os.path.join(args.workdir, 'systems')})")
    results, column_failures = report(args, data.raw, data.data_bin, systems, outputs, complete, seconds)
    log(f"done in {time.time() - t0:.0f}s: {stage_summary(seconds)}; results.txt, results.json, results.png and "
        f"results-loss.png in {args.workdir}")
    fail_on_problems(args, failures, column_failures)
    return results


def stage_summary(seconds: dict) -> str:
    """The stages' times in one line: preparing, training and decoding (each run's training), scoring."""
    runs = ", ".join(f"{label} {run['train']:.0f}s" for label, run in seconds["runs"].items() if "train" in run)
    return (f"preparing {seconds['prepare']:.0f}s, training and decoding {seconds['train_and_decode']:.0f}s"
            + (f" (trainings: {runs})" if runs else "") + f", scoring and the report {seconds['score_and_report']:.0f}s")


def fail_on_problems(args, failures: Dict[str, str], column_failures: List[str]):
    """Exit non-zero, naming them, when a training failed or a column could not be computed."""
    problems = []
    if failures:
        problems.append(f"{len(failures)} training run(s) failed and their systems are missing from the table: "
                        f"{', '.join(failures)}")
    if column_failures:
        problems.append(f"{len(column_failures)} column(s) could not be computed and are marked n/a: "
                        + "; ".join(column_failures))
    if problems:
        raise SystemExit(" ".join(problems) + f" (logs in {os.path.join(args.workdir, 'systems')})")

