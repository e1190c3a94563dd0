"""``fairseq-pe-quickstart``: train one tiny model per position encoding, BLEU per length bucket.

On a machine with no data and no network it builds the synthetic short-to-long task of
:mod:`fairseq_pe.synthetic` (training sentences of at most 16 words, test sentences up to
48), binarises it with ``fairseq-preprocess``, trains ``transformer_pe_tiny`` once per
encoding with ``fairseq-train --user-dir fairseq_pe``, decodes the test set with
``fairseq-generate`` and prints one table of sacreBLEU per source-length bucket (also
written as JSON and as a PNG plot).  ``--data DIR`` uses a real corpus instead
(``DIR/{train,valid,test}.{SRC,TGT}``, raw text, one sentence per line), segmented with a
sentencepiece model trained on its training split.
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence

from fairseq_pe.bleu import Bucket, bucket_label, bucketed_bleu, read_generate_output

PLUGIN_DIR = os.path.dirname(os.path.abspath(__file__))

#: the encodings the quickstart compares by default: name -> extra fairseq-train flags
DEFAULT_SYSTEMS = {
    "none": ["--pe-absolute", "none"],
    "ape-learned": ["--pe-absolute", "learned"],
    "ape-sinusoidal": ["--pe-absolute", "sinusoidal"],
    "ape-learnable-sin": ["--pe-absolute", "learnable-sinusoidal"],
    "rpe-learned": ["--pe-absolute", "none", "--pe-relative", "learned"],
    "rpe-sinusoidal": ["--pe-absolute", "none", "--pe-relative", "sinusoidal"],
    "rpe-learnable-sin": ["--pe-absolute", "none", "--pe-relative", "learnable-sinusoidal"],
    "rope": ["--pe-absolute", "none", "--pe-relative", "rope"],
    "alibi": ["--pe-absolute", "none", "--pe-relative", "alibi"],
    "t5": ["--pe-absolute", "none", "--pe-relative", "t5"],
    "floater": ["--pe-absolute", "floater", "--pe-all-blocks"],
    "floater-bias": ["--pe-absolute", "sinusoidal", "--pe-floater-bias"],
}

_print_lock = threading.Lock()


def log(msg: str):
    with _print_lock:
        print(f"[quickstart {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_system(spec: str) -> (str, List[str]):
    """``NAME`` (a default system) or ``NAME=FLAGS`` (e.g. ``learned-all=--pe-absolute learned --pe-all-blocks``)."""
    if "=" in spec:
        name, flags = spec.split("=", 1)
        return name.strip(), flags.split()
    if spec not in DEFAULT_SYSTEMS:
        raise SystemExit(
            f"--systems: unknown system {spec!r}; use one of {sorted(DEFAULT_SYSTEMS)} or NAME=FLAGS"
        )
    return spec, DEFAULT_SYSTEMS[spec]


def executable(name: str) -> str:
    """A console script of this Python's environment (found even when it is not on PATH)."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else name


def run(cmd: Sequence[str], log_path: str, env=None, on_line=None):
    """Run a CLI, keep its full output in ``log_path``; raise with the log's tail on failure."""
    cmd = [executable(cmd[0])] + list(cmd[1:])
    with open(log_path, "w", encoding="utf-8") as logf:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, env=env, bufsize=1)
        for line in proc.stdout:
            logf.write(line)
            if on_line is not None:
                on_line(line)
        code = proc.wait()
    if code != 0:
        with open(log_path, encoding="utf-8") as f:
            tail = "".join(f.readlines()[-25:])
        raise RuntimeError(f"command failed ({code}): {' '.join(cmd)}\n--- last lines of {log_path} ---\n{tail}")


def count_lines(path: str) -> int:
    with open(path, encoding="utf-8") as f:
        return sum(1 for _ in f)


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def prepare_corpus(args) -> str:
    """Raw text of train/valid/test in ``WORK/raw``; returns that directory."""
    raw = os.path.join(args.workdir, "raw")
    if args.data:
        for split in ("train", "valid", "test"):
            for lang in (args.source_lang, args.target_lang):
                path = os.path.join(args.data, f"{split}.{lang}")
                if not os.path.isfile(path):
                    raise SystemExit(f"--data {args.data}: missing {path} (expected {{train,valid,test}}.{{SRC,TGT}})")
            a = count_lines(os.path.join(args.data, f"{split}.{args.source_lang}"))
            b = count_lines(os.path.join(args.data, f"{split}.{args.target_lang}"))
            if a != b:
                raise SystemExit(f"--data {args.data}: {split}.{args.source_lang} has {a} lines but "
                                 f"{split}.{args.target_lang} has {b}")
        return args.data
    from fairseq_pe.synthetic import write_corpus

    write_corpus(raw, train_size=args.train_size, test_per_bucket=args.test_per_bucket, seed=args.seed, src=args.source_lang, tgt=args.target_lang,
                 test_buckets=[(lo, (hi or lo + 16) - 1) for lo, hi in args.buckets])
    log(f"synthetic corpus: {args.train_size} training pairs of 1-16 words, test buckets "
        f"{[bucket_label(b) for b in args.buckets]} in {raw}")
    return raw


def segment(args, raw: str) -> str:
    """sentencepiece for real corpora (joint model on the training split); identity for synthetic data."""
    if not args.data:
        return raw
    import sentencepiece as spm

    out = os.path.join(args.workdir, "spm")
    os.makedirs(out, exist_ok=True)
    model = os.path.join(out, "spm.model")
    if not os.path.exists(model):
        log(f"training a joint sentencepiece model ({args.spm_vocab_size} pieces)")
        spm.SentencePieceTrainer.train(
            input=[os.path.join(raw, f"train.{lang}") for lang in (args.source_lang, args.target_lang)],
            model_prefix=os.path.join(out, "spm"), vocab_size=args.spm_vocab_size,
            character_coverage=1.0, model_type="unigram", input_sentence_size=2_000_000,
            shuffle_input_sentence=True, minloglevel=2,
        )
    sp = spm.SentencePieceProcessor(model_file=model)
    for split in ("train", "valid", "test"):
        for lang in (args.source_lang, args.target_lang):
            with open(os.path.join(raw, f"{split}.{lang}"), encoding="utf-8") as f, \
                    open(os.path.join(out, f"{split}.{lang}"), "w", encoding="utf-8") as g:
                for line in f:
                    g.write(" ".join(sp.encode(line.rstrip("\n"), out_type=str)) + "\n")
    return out


def binarize(args, text_dir: str) -> str:
    dest = os.path.join(args.workdir, "data-bin")
    if os.path.exists(os.path.join(dest, "preprocess.done")):
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    log("fairseq-preprocess")
    run(["fairseq-preprocess", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--trainpref", os.path.join(text_dir, "train"), "--validpref", os.path.join(text_dir, "valid"),
         "--testpref", os.path.join(text_dir, "test"), "--destdir", dest, "--joined-dictionary",
         "--workers", "1"], os.path.join(args.workdir, "preprocess.log"))
    open(os.path.join(dest, "preprocess.done"), "w").close()
    return dest


def train_and_decode(args, data_bin: str, name: str, flags: List[str], n_test: int) -> str:
    """fairseq-train then fairseq-generate for one system; returns the generate output path."""
    out = os.path.join(args.workdir, "systems", name)
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    ckpt = os.path.join(out, "checkpoint_last.pt")
    gen_out = os.path.join(out, "generate-test.txt")
    if os.path.exists(gen_out) and not args.force:
        log(f"{name}: reusing {gen_out}")
        return gen_out
    # start from scratch: fairseq-train would otherwise resume from a stale checkpoint_last.pt
    shutil.rmtree(out)
    os.makedirs(out)
    last_report = [0.0]

    def progress(line):
        m = re.search(r"num_updates (\d+)", line)
        loss = re.search(r"\| loss ([\d.]+)", line)
        if m and time.time() - last_report[0] > args.progress_seconds:
            last_report[0] = time.time()
            log(f"{name}: update {m.group(1)}/{args.max_update}" + (f", loss {loss.group(1)}" if loss else ""))

    log(f"{name}: training ({' '.join(flags)})")
    t0 = time.time()
    run(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
         "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--arch", args.arch, *flags,
         "--share-all-embeddings", "--dropout", "0.1",
         "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
         "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup),
         "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
         "--max-tokens", str(args.max_tokens), "--max-update", str(args.max_update),
         "--save-dir", out, "--no-epoch-checkpoints", "--save-interval-updates", "0",
         "--log-format", "simple", "--log-interval", "50", "--seed", str(args.seed), "--cpu",
         "--num-workers", "0"],
        os.path.join(out, "train.log"), env=env, on_line=progress)
    log(f"{name}: trained in {time.time() - t0:.0f}s; decoding {n_test} test sentences")
    gen_cmd = ["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
               "--source-lang", args.source_lang, "--target-lang", args.target_lang,
               "--path", ckpt, "--gen-subset", "test", "--beam", str(args.beam),
               "--batch-size", "64", "--required-batch-size-multiple", "1",
               "--max-len-a", "1.5", "--max-len-b", "10", "--cpu", "--num-workers", "0"]
    if args.data:
        gen_cmd += ["--post-process", "sentencepiece"]
    run(gen_cmd, gen_out + ".log", env=env)
    shutil.copy(gen_out + ".log", gen_out)
    return gen_out


def score(args, raw: str, gen_out: str) -> Dict[str, dict]:
    sources = read_lines(os.path.join(raw, f"test.{args.source_lang}"))
    refs = read_lines(os.path.join(raw, f"test.{args.target_lang}"))
    sentences = read_generate_output(gen_out, expected=len(sources))
    lengths = [len(s.split()) for s in sources]
    return bucketed_bleu([s.hypothesis for s in sentences], refs, lengths, args.buckets)


def format_table(results: Dict[str, Dict[str, dict]], buckets: Sequence[Bucket], title: str) -> str:
    labels = [bucket_label(b) for b in buckets] + ["all"]
    first = next(iter(results.values()))
    head = ["encoding"] + [f"{lab} (n={first[lab]['n']})" for lab in labels]
    rows = [[name] + [f"{res[lab]['bleu']:.1f}" for lab in labels] for name, res in results.items()]
    widths = [max(len(r[i]) for r in [head] + rows) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([title, line(head), sep] + [line(r) for r in rows] + ["", first["signature"]])


def plot(results: Dict[str, Dict[str, dict]], buckets: Sequence[Bucket], path: str, title: str):
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import turns on DEBUG logging
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [bucket_label(b) for b in buckets]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, res in results.items():
        ax.plot(range(len(labels)), [res[lab]["bleu"] for lab in labels], marker="o", label=name)
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    ax.set_xlabel("source length (words)")
    ax.set_ylabel("sacreBLEU")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def parse_buckets(spec: str) -> List[Bucket]:
    """``"1,17,25,33,49"`` -> [1,17) [17,25) [25,33) [33,49); a trailing ``+`` makes the last open."""
    open_end = spec.endswith("+")
    edges = [int(x) for x in spec.rstrip("+").split(",")]
    if len(edges) < 2 or edges != sorted(set(edges)):
        raise argparse.ArgumentTypeError(f"--buckets {spec!r}: give increasing boundaries, e.g. 1,17,25,33,49")
    buckets: List[Bucket] = [(lo, hi) for lo, hi in zip(edges, edges[1:])]
    if open_end:
        buckets.append((edges[-1], None))
    return buckets


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-quickstart", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--workdir", default="quickstart-work", help="where data, checkpoints and results go")
    p.add_argument("--data", help="a real corpus directory with {train,valid,test}.{SRC,TGT} raw text "
                                  "(default: build the synthetic task)")
    p.add_argument("--source-lang", default="src")
    p.add_argument("--target-lang", default="tgt")
    p.add_argument("--spm-vocab-size", type=int, default=8000, help="sentencepiece size for --data")
    p.add_argument("--buckets", type=parse_buckets, default=None,
                   help="source-length bucket boundaries in words (default 1,17,25,33,49 synthetic; "
                        "1,20,40,60,80+ with --data)")
    p.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS),
                   help="encodings to compare: names of defaults or NAME=FLAGS")
    p.add_argument("--arch", default="transformer_pe_tiny")
    p.add_argument("--train-size", type=int, default=20000, help="synthetic training pairs")
    p.add_argument("--test-per-bucket", type=int, default=150, help="synthetic test sentences per bucket")
    p.add_argument("--max-update", type=int, default=800)
    p.add_argument("--max-tokens", type=int, default=2048)
    p.add_argument("--lr", type=float, default=5e-3)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--beam", type=int, default=4)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--jobs", type=int, default=max(1, min(2, os.cpu_count() or 1)),
                   help="systems trained at the same time")
    p.add_argument("--threads", type=int, default=1, help="torch threads per job")
    p.add_argument("--force", action="store_true", help="retrain systems that have results already")
    p.add_argument("--progress-seconds", type=float, default=20.0)
    return p


def main(argv: Optional[List[str]] = None) -> None:
    run_quickstart(get_parser().parse_args(argv))


def run_quickstart(args) -> Dict[str, Dict[str, dict]]:
    """The whole quickstart; returns ``{system: {bucket: {"bleu", "n"}}}``."""
    if args.buckets is None:
        args.buckets = parse_buckets("1,20,40,60,80+" if args.data else "1,17,25,33,49")
    systems = [parse_system(s) for s in args.systems]
    if len({n for n, _ in systems}) != len(systems):
        raise SystemExit("--systems: names must be unique")
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    raw = prepare_corpus(args)
    data_bin = binarize(args, segment(args, raw))
    n_test = count_lines(os.path.join(raw, f"test.{args.source_lang}"))
    log(f"{len(systems)} systems, {args.jobs} at a time, {args.max_update} updates each")
    outputs, failures = {}, {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(train_and_decode, args, data_bin, name, flags, n_test): name
                   for name, flags in systems}
        for future in as_completed(futures):
            name = futures[future]
            try:
                outputs[name] = future.result()
            except Exception as e:  # report at once, finish the others, fail at the end
                failures[name] = str(e)
                log(f"{name}: FAILED\n{e}")
    results = {name: score(args, raw, outputs[name]) for name, _ in systems if name in outputs}
    if not results:
        raise SystemExit(f"every system failed: {', '.join(failures)} (logs in {os.path.join(args.workdir, 'systems')})")
    title = (f"sacreBLEU per source-length bucket ({'synthetic task, trained on 1-16 words' if not args.data else args.data}; "
             f"{args.arch}, {args.max_update} updates)")
    table = format_table(results, args.buckets, title)
    with open(os.path.join(args.workdir, "results.txt"), "w", encoding="utf-8") as f:
        f.write(table + "\n")
    with open(os.path.join(args.workdir, "results.json"), "w", encoding="utf-8") as f:
        json.dump({"buckets": [bucket_label(b) for b in args.buckets], "systems": results,
                   "flags": {n: fl for n, fl in systems}}, f, indent=2)
    plot(results, args.buckets, os.path.join(args.workdir, "results.png"), title="BLEU by source length")
    print("\n" + table)
    log(f"done in {time.time() - t0:.0f}s; results.txt, results.json and results.png in {args.workdir}")
    if failures:
        raise SystemExit(f"{len(failures)} system(s) failed and are missing from the table: "
                         f"{', '.join(failures)} (logs in {os.path.join(args.workdir, 'systems')})")
    return results


if __name__ == "__main__":
    main()
