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
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from typing import Dict, List, Optional, Sequence

from fairseq_pe.bleu import bucket_label, bucketed_bleu, parse_buckets, read_generate_output
from fairseq_pe.bucket_bleu import format_table, write_outputs

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

#: more systems known by name (not run by default)
NAMED_SYSTEMS = {
    **DEFAULT_SYSTEMS,
    "ape-sin+rpe-learned": ["--pe-absolute", "sinusoidal", "--pe-relative", "learned"],  # Shaw et al. 2018
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
    if spec not in NAMED_SYSTEMS:
        raise SystemExit(
            f"--systems: unknown system {spec!r}; use one of {sorted(NAMED_SYSTEMS)} or NAME=FLAGS"
        )
    return spec, NAMED_SYSTEMS[spec]


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
            logf.flush()
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


def parse_extra_test(spec: str) -> (str, str, str):
    """``NAME=SRC,REF``: an additional test corpus (raw text, line-aligned)."""
    name, sep, files = spec.partition("=")
    paths = files.split(",")
    if not sep or not name or len(paths) != 2 or not all(paths):
        raise argparse.ArgumentTypeError(f"--extra-test {spec!r}: use NAME=SOURCE_FILE,REFERENCE_FILE")
    return name, paths[0], paths[1]


def prepare_extra_tests(args) -> List[str]:
    """Copy each ``--extra-test`` into ``WORK/extra/NAME.{SRC,TGT}``; returns the prefixes."""
    prefixes = []
    for name, src, ref in args.extra_test:
        for path in (src, ref):
            if not os.path.isfile(path):
                raise SystemExit(f"--extra-test {name}: no such file {path}")
        a, b = count_lines(src), count_lines(ref)
        if a != b:
            raise SystemExit(f"--extra-test {name}: {src} has {a} lines but {ref} has {b}")
        if a == 0:
            raise SystemExit(f"--extra-test {name}: {src} is empty")
        os.makedirs(os.path.join(args.workdir, "extra"), exist_ok=True)
        prefix = os.path.join(args.workdir, "extra", name)
        shutil.copy(src, f"{prefix}.{args.source_lang}")
        shutil.copy(ref, f"{prefix}.{args.target_lang}")
        prefixes.append(prefix)
    return prefixes


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


def segment(args, raw: str, extra: Sequence[str]) -> (str, List[str]):
    """sentencepiece for real corpora (``--spm-model`` or a joint model trained on the training split);
    identity for synthetic data.  Returns the text directory and the extra test prefixes in it."""
    if not args.data:
        return raw, list(extra)
    import sentencepiece as spm

    out = os.path.join(args.workdir, "spm")
    os.makedirs(out, exist_ok=True)
    model = os.path.join(out, "spm.model")
    if args.spm_model:
        if not os.path.isfile(args.spm_model):
            raise SystemExit(f"--spm-model {args.spm_model}: no such file")
        shutil.copy(args.spm_model, model)
    elif not os.path.exists(model):
        log(f"training a joint sentencepiece model ({args.spm_vocab_size} pieces)")
        spm.SentencePieceTrainer.train(
            input=[os.path.join(raw, f"train.{lang}") for lang in (args.source_lang, args.target_lang)],
            model_prefix=os.path.join(out, "spm"), vocab_size=args.spm_vocab_size,
            character_coverage=1.0, model_type="unigram", input_sentence_size=2_000_000,
            shuffle_input_sentence=True, minloglevel=2,
        )
    sp = spm.SentencePieceProcessor(model_file=model)
    prefixes = [os.path.join(raw, split) for split in ("train", "valid", "test")] + list(extra)
    for prefix in prefixes:
        for lang in (args.source_lang, args.target_lang):
            lines = read_lines(f"{prefix}.{lang}")
            with open(os.path.join(out, f"{os.path.basename(prefix)}.{lang}"), "w", encoding="utf-8") as g:
                for pieces in sp.encode(lines, out_type=str):
                    g.write(" ".join(pieces) + "\n")
    return out, [os.path.join(out, os.path.basename(p)) for p in extra]


def binarize(args, text_dir: str, extra: Sequence[str]) -> str:
    """``fairseq-preprocess``: subsets train, valid, test and test1, test2, ... for ``--extra-test``."""
    dest = os.path.join(args.workdir, "data-bin")
    marker = os.path.join(dest, "preprocess.done")
    tests = [os.path.join(text_dir, "test")] + list(extra)
    if os.path.exists(marker) and read_lines(marker) == tests:
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    log("fairseq-preprocess")
    run(["fairseq-preprocess", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--trainpref", os.path.join(text_dir, "train"), "--validpref", os.path.join(text_dir, "valid"),
         "--testpref", ",".join(tests), "--destdir", dest, "--joined-dictionary",
         "--workers", "1"], os.path.join(args.workdir, "preprocess.log"))
    with open(marker, "w") as f:
        f.write("\n".join(tests) + "\n")
    return dest


def train_and_decode(args, data_bin: str, name: str, flags: List[str], tests: Dict[str, int]) -> Dict[str, str]:
    """fairseq-train then fairseq-generate on every test subset for one system; returns subset -> output path."""
    out = os.path.join(args.workdir, "systems", name)
    os.makedirs(out, exist_ok=True)
    # unbuffered: fairseq logs to stdout, which a pipe would otherwise hold back until the end
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads),
               PYTHONUNBUFFERED="1")
    ckpt = os.path.join(out, "checkpoint_last.pt")
    gen_outs = {subset: os.path.join(out, f"generate-{subset}.txt") for subset in tests}
    if all(os.path.exists(p) for p in gen_outs.values()) and not args.force:
        log(f"{name}: reusing {', '.join(gen_outs.values())}")
        return gen_outs
    if not (os.path.exists(ckpt) and os.path.exists(os.path.join(out, "train.done")) and not args.force):
        # start from scratch: fairseq-train would otherwise resume from a stale checkpoint_last.pt
        shutil.rmtree(out)
        os.makedirs(out)
        last_report = [0.0]

        def progress(line):
            # "num_updates=50, loss=..." mid-epoch (simple format), "| num_updates 688 | loss ..." at epoch ends
            m = re.search(r"num_updates[= ](\d+)", line)
            loss = re.search(r"\bloss[= ]([\d.]+)", line)
            if m and time.time() - last_report[0] > args.progress_seconds:
                last_report[0] = time.time()
                log(f"{name}: update {m.group(1)}/{args.max_update}" + (f", loss {loss.group(1)}" if loss else ""))

        log(f"{name}: training ({' '.join(flags)})")
        t0 = time.time()
        run(["fairseq-train", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
             "--source-lang", args.source_lang, "--target-lang", args.target_lang,
             "--arch", args.arch, *flags, *args.train_flags.split(),
             "--share-all-embeddings", "--dropout", "0.1",
             "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--clip-norm", "1.0",
             "--lr", str(args.lr), "--lr-scheduler", "inverse_sqrt", "--warmup-updates", str(args.warmup),
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", str(args.max_tokens), "--max-update", str(args.max_update),
             "--save-dir", out, "--no-epoch-checkpoints", "--save-interval-updates", "0",
             "--log-format", "simple", "--log-interval", str(min(50, max(1, args.max_update // 10))), "--seed", str(args.seed), "--cpu",
             "--num-workers", "0"],
            os.path.join(out, "train.log"), env=env, on_line=progress)
        with open(os.path.join(out, "train.done"), "w") as f:
            f.write(f"{time.time() - t0:.1f}\n")
        log(f"{name}: trained in {time.time() - t0:.0f}s")
    for subset, n in tests.items():
        if os.path.exists(gen_outs[subset]) and not args.force:
            continue
        log(f"{name}: decoding {n} sentences of subset {subset}")
        t0 = time.time()
        gen_cmd = ["fairseq-generate", data_bin, "--user-dir", PLUGIN_DIR, "--task", "translation",
                   "--source-lang", args.source_lang, "--target-lang", args.target_lang,
                   "--path", ckpt, "--gen-subset", subset, "--beam", str(args.beam), "--lenpen", str(args.lenpen),
                   "--batch-size", str(args.gen_batch_size), "--required-batch-size-multiple", "1",
                   "--max-len-a", "1.5", "--max-len-b", "10", "--cpu", "--num-workers", "0"]
        if args.data:
            gen_cmd += ["--post-process", "sentencepiece"]
        run(gen_cmd, gen_outs[subset] + ".log", env=env)
        shutil.move(gen_outs[subset] + ".log", gen_outs[subset])
        log(f"{name}: decoded {subset} in {time.time() - t0:.0f}s")
    return gen_outs


def test_lengths(args, sources: Sequence[str]) -> List[int]:
    """Source length of each test line in ``--length-unit``."""
    from fairseq_pe.s2l import source_lengths

    if args.length_unit == "word":
        return source_lengths(sources, "word")
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=os.path.join(args.workdir, "spm", "spm.model"))
    return source_lengths(sources, "subword", sp)


def score(args, raw: str, gen_outs: Dict[str, str]) -> Dict[str, dict]:
    """Bucketed sacreBLEU on the main test set plus one overall score per ``--extra-test``."""
    sources = read_lines(os.path.join(raw, f"test.{args.source_lang}"))
    refs = read_lines(os.path.join(raw, f"test.{args.target_lang}"))
    sentences = read_generate_output(gen_outs["test"], expected=len(sources))
    result = bucketed_bleu([s.hypothesis for s in sentences], refs, test_lengths(args, sources), args.buckets)
    for i, (name, _, ref) in enumerate(args.extra_test, start=1):
        refs = read_lines(ref)
        sentences = read_generate_output(gen_outs[f"test{i}"], expected=len(refs))
        extra = bucketed_bleu([s.hypothesis for s in sentences], refs, [0] * len(refs), [(0, None)])
        result[name] = extra["all"]
    return result


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
    if args.length_unit == "subword" and not args.data:
        raise SystemExit("--length-unit subword needs --data (the synthetic task has no sentencepiece model)")
    if args.spm_model and not args.data:
        raise SystemExit("--spm-model needs --data (the synthetic task is not segmented)")
    extra_names = [name for name, _, _ in args.extra_test]
    bucket_names = {bucket_label(b) for b in args.buckets} | {"all", "signature"}
    if len(set(extra_names)) != len(extra_names) or bucket_names & set(extra_names):
        raise SystemExit(f"--extra-test: names must be unique and differ from {sorted(bucket_names)}")
    os.makedirs(args.workdir, exist_ok=True)
    t0 = time.time()
    raw = prepare_corpus(args)
    extra = prepare_extra_tests(args)
    text_dir, extra_text = segment(args, raw, extra)
    data_bin = binarize(args, text_dir, extra_text)
    tests = {"test": count_lines(os.path.join(raw, f"test.{args.source_lang}"))}
    tests.update({f"test{i}": count_lines(f"{p}.{args.source_lang}") for i, p in enumerate(extra, start=1)})
    log(f"{len(systems)} systems, {args.jobs} at a time, {args.max_update} updates each")
    outputs, failures = {}, {}
    with ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = {pool.submit(train_and_decode, args, data_bin, name, flags, tests): name
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
    table = format_table(results, args.buckets, title, extras=extra_names)
    unit = "words" if args.length_unit == "word" else "sentencepiece tokens"
    payload = {"buckets": [bucket_label(b) for b in args.buckets], "length_unit": unit,
               "extra_tests": {name: {"source": s, "reference": r} for name, s, r in args.extra_test},
               "systems": results, "flags": {n: fl for n, fl in systems},
               "train_flags": args.train_flags, "arch": args.arch, "max_update": args.max_update}
    ratios = format_table(results, args.buckets, "length ratio", extras=extra_names, key="ratio")
    write_outputs(os.path.join(args.workdir, "results"), [table, ratios], payload, results, args.buckets,
                  "BLEU by source length", extras=extra_names, xlabel=f"source length ({unit})")
    print("\n" + table + "\n\n" + ratios)
    log(f"done in {time.time() - t0:.0f}s; results.txt, results.json and results.png in {args.workdir}")
    if failures:
        raise SystemExit(f"{len(failures)} system(s) failed and are missing from the table: "
                         f"{', '.join(failures)} (logs in {os.path.join(args.workdir, 'systems')})")
    return results


if __name__ == "__main__":
    main()
