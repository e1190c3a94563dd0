"""``fairseq-pe-s2l-split``: the short-to-long (S2L) split of FLOATER (Liu et al. 2020, §4.3).

"This dataset takes all the short sentences (< 80 tokens) as the training split and all the
long sentences (≥ 80 tokens) as the testing split", the test split divided into bins of the
source length [80,100), [100,120), [120,140), [140,∞).  The paper notes that 98.6% of WMT14
En-De training pairs are shorter than 80 tokens.

Input: parallel corpora, one or more ``--corpus PREFIX`` (files ``PREFIX.SRC`` and ``PREFIX.TGT``)
and/or ``--corpus-dir DIR`` (every line-aligned ``*.SRC``/``*.TGT`` pair under DIR).  Output in
``--out DIR``: raw text ``train``, ``valid`` (held back from the short pairs), ``test`` (every
long pair, none dropped, in input order), optionally ``test-short`` (also held back, for an
in-distribution score), each as ``.SRC``/``.TGT``; ``test.lengths`` (the source length of each
test line); ``stats.json``; ``spm.model``; with ``--binarize`` also the sentencepiece-encoded
text in ``spm/`` and ``fairseq-preprocess --joined-dictionary`` output in ``data-bin/`` (subsets
``train``, ``valid``, ``test`` and, with ``--short-test-size``, ``test1`` = ``test-short``).

The length unit (``--unit``) is by default the number of sentencepiece tokens of the source as
the model sees them (EOS not counted), with ``--spm-model`` or a joint model trained here on all
input text (``--spm-vocab-size``; segmentation only, no labels: long test sentences are part of
its input as the paper's WMT14 BPE was learned on the whole training set).  ``--unit word``
counts whitespace-separated words instead.

A split that leaves a test bin empty is refused (``--allow-empty-bins`` to accept it).  Pairs
held back for valid/test-short are removed from training together with every other training
pair that has the same source sentence, and the count is printed.

The files of an earlier split in ``--out`` are replaced only with ``--force``; ``--out`` can never
be or hold an input (a ``--corpus`` file, a ``--corpus-dir``).  Every file is written atomically
and ``stats.json`` last: it says the split is complete.
"""

import argparse
import glob
import os
import random
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

from fairseq_pe.translation.bleu import Bucket, assign_bucket, bucket_label, parse_buckets
from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import (atomic_open, atomic_path, check_new_files, check_not_inputs, same_file,
                                train_sentencepiece, write_json)


def log(msg: str):
    print(f"[s2l {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def read_lines(path: str) -> List[str]:
    with open(path, encoding="utf-8") as f:
        return [line.rstrip("\n") for line in f]


def read_input(path: str, flag: str) -> List[str]:
    """``read_lines`` of a user's file: a non-UTF-8 file is a :class:`UserError` naming the option."""
    try:
        return read_lines(path)
    except UnicodeDecodeError as e:
        raise UserError(f"{flag}: {path} is not UTF-8 text ({e})") from None


@dataclass
class Corpus:
    name: str
    src: List[str]
    tgt: List[str]


def corpus_prefixes(prefixes: Sequence[str], dirs: Sequence[str], src: str, tgt: str) -> List[str]:
    """The prefix of every corpus named by ``--corpus`` or found under ``--corpus-dir`` (both files there)."""
    found = list(prefixes)
    for d in dirs:
        if not os.path.isdir(d):
            raise UserError(f"--corpus-dir {d}: not a directory")
        hits = sorted(p[: -len(src) - 1] for p in glob.glob(os.path.join(d, "**", f"*.{src}"), recursive=True))
        hits = [p for p in hits if os.path.isfile(f"{p}.{tgt}")]
        if not hits:
            raise UserError(f"--corpus-dir {d}: no *.{src} file with a matching *.{tgt} file under it")
        found += hits
    if not found:
        raise UserError("give at least one --corpus PREFIX or --corpus-dir DIR")
    for prefix in found:
        for p in (f"{prefix}.{src}", f"{prefix}.{tgt}"):
            if not os.path.isfile(p):
                raise UserError(f"--corpus {prefix}: missing {p}")
    return found


def load_corpora(prefixes: Sequence[str], dirs: Sequence[str], src: str, tgt: str) -> List[Corpus]:
    """Every parallel corpus named by ``--corpus`` or found under ``--corpus-dir``; refuses misaligned files."""
    found = corpus_prefixes(prefixes, dirs, src, tgt)
    corpora = []
    for prefix in found:
        paths = [f"{prefix}.{src}", f"{prefix}.{tgt}"]
        s, t = read_input(paths[0], "--corpus"), read_input(paths[1], "--corpus")
        if len(s) != len(t):
            raise UserError(f"--corpus {prefix}: {paths[0]} has {len(s)} lines but {paths[1]} has {len(t)}")
        corpora.append(Corpus(os.path.relpath(prefix, dirs[0]) if dirs and prefix.startswith(dirs[0]) else prefix, s, t))
    return corpora


def source_lengths(sources: Sequence[str], unit: str, sp=None) -> List[int]:
    """Source length per line: sentencepiece tokens (``unit='subword'``) or whitespace words."""
    if unit == "word":
        return [len(s.split()) for s in sources]
    if sp is None:
        raise ValueError("unit 'subword' needs a sentencepiece model")
    lengths: List[int] = []
    for start in range(0, len(sources), 100_000):  # chunks: WMT14 has millions of lines
        lengths += [len(p) for p in sp.encode(list(sources[start:start + 100_000]), out_type=str)]
        if len(sources) > 100_000:
            log(f"measured {len(lengths)}/{len(sources)} sources")
    return lengths


@dataclass
class Split:
    train: List[int]
    valid: List[int]
    test: List[int]
    test_short: List[int]
    test_bins: List[int]  # bin index of each test pair
    stats: Dict = field(default_factory=dict)


def s2l_split(
    sources: Sequence[str],
    lengths: Sequence[int],
    threshold: int,
    bins: Sequence[Bucket],
    valid_size: int,
    short_test_size: int = 0,
    seed: int = 1,
    allow_empty_bins: bool = False,
    skip_empty: bool = True,
) -> Split:
    """Indices of each part of the split.

    Short pairs (length < ``threshold``) train, except ``valid_size`` + ``short_test_size`` of them
    drawn at random (``seed``); long pairs (length ≥ ``threshold``) all go to the test set, in input
    order, each in its bin.  Empty sources (length 0) are left out of every part when ``skip_empty``
    and counted in the statistics.
    """
    if bins[0][0] != threshold:
        raise ValueError(f"--bins must start at --threshold {threshold} (got {bucket_label(bins[0])} first)")
    if bins[-1][1] is not None:
        raise ValueError("--bins must end open (e.g. 80,100,120,140+): every long pair needs a bin")
    empty = [i for i, n in enumerate(lengths) if n == 0] if skip_empty else []
    empty_set = set(empty)
    short = [i for i, n in enumerate(lengths) if n < threshold and i not in empty_set]
    long = [i for i, n in enumerate(lengths) if n >= threshold]
    if valid_size + short_test_size >= len(short):
        raise ValueError(f"--valid-size {valid_size} + --short-test-size {short_test_size} leave no short pair "
                         f"to train on ({len(short)} short pairs)")
    held = random.Random(seed).sample(short, valid_size + short_test_size)
    valid, test_short = sorted(held[:valid_size]), sorted(held[valid_size:])
    held_sources = {sources[i] for i in held}
    held_set = set(held)
    train = [i for i in short if i not in held_set and sources[i] not in held_sources]
    dup_removed = len(short) - len(held) - len(train)
    test_bins = [assign_bucket(lengths[i], bins) for i in long]
    per_bin = {bucket_label(b): 0 for b in bins}
    for b in test_bins:
        per_bin[bucket_label(bins[b])] += 1
    empty_bins = [lab for lab, n in per_bin.items() if n == 0]
    if empty_bins and not allow_empty_bins:
        raise ValueError(f"the split leaves test bin(s) {', '.join(empty_bins)} empty ({len(long)} pairs ≥ "
                         f"{threshold}); give other --bins, more data, or --allow-empty-bins")
    n_nonempty = len(lengths) - len(empty)
    stats = {
        "pairs": len(lengths),
        "empty_source_pairs_left_out": len(empty),
        "short_pairs": len(short),
        "long_pairs": len(long),
        "share_short_percent": round(100.0 * len(short) / max(1, n_nonempty), 2),
        "threshold": threshold,
        "train": len(train),
        "valid": len(valid),
        "test_short": len(test_short),
        "train_pairs_removed_as_duplicates_of_held_back_sources": dup_removed,
        "test": len(long),
        "test_bins": per_bin,
    }
    return Split(train, valid, long, test_short, test_bins, stats)


def write_part(out: str, name: str, idx: Sequence[int], src: Sequence[str], tgt: Sequence[str], sl: str, tl: str):
    for lang, lines in ((sl, src), (tl, tgt)):
        with atomic_open(os.path.join(out, f"{name}.{lang}"), newline="\n") as f:
            for i in idx:
                f.write(lines[i] + "\n")


def train_spm(texts_paths: Sequence[str], prefix: str, vocab_size: int):
    """``PREFIX.model`` and ``PREFIX.vocab``, trained under a temporary prefix and renamed when complete."""
    try:
        train_sentencepiece(
            prefix, input=list(texts_paths), vocab_size=vocab_size, character_coverage=1.0,
            model_type="unigram", input_sentence_size=10_000_000, shuffle_input_sentence=True, minloglevel=2,
        )
    except RuntimeError as e:
        raise UserError(f"--spm-vocab-size {vocab_size}: sentencepiece failed ({e}); try a smaller size") from None


def binarize(out: str, parts: Sequence[str], sl: str, tl: str, sp, workers: int):
    """Encode every part with sentencepiece, then ``fairseq-preprocess --joined-dictionary`` into ``out/data-bin``."""
    enc = os.path.join(out, "spm")
    os.makedirs(enc, exist_ok=True)
    for part in parts:
        for lang in (sl, tl):
            lines = read_lines(os.path.join(out, f"{part}.{lang}"))
            with atomic_open(os.path.join(enc, f"{part}.{lang}"), newline="\n") as f:
                for pieces in sp.encode(lines, out_type=str):
                    f.write(" ".join(pieces) + "\n")
    final = os.path.join(out, "data-bin")
    dest = os.path.join(out, ".data-bin.part")  # renamed to data-bin when fairseq-preprocess is done
    shutil.rmtree(dest, ignore_errors=True)
    tests = [p for p in parts if p.startswith("test")]
    cmd = [os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess"), "--source-lang", sl,
           "--target-lang", tl, "--joined-dictionary", "--trainpref", os.path.join(enc, "train"),
           "--validpref", os.path.join(enc, "valid"),
           "--testpref", ",".join(os.path.join(enc, p) for p in tests), "--destdir", dest,
           "--workers", str(workers)]
    if not os.path.exists(cmd[0]):
        cmd[0] = "fairseq-preprocess"
    log_path = os.path.join(out, "preprocess.log")
    with open(log_path, "w") as logf:
        code = subprocess.call(cmd, stdout=logf, stderr=subprocess.STDOUT)
    if code != 0:
        tail = "".join(open(log_path).readlines()[-20:])
        shutil.rmtree(dest, ignore_errors=True)
        raise SystemExit(f"fairseq-preprocess failed ({code}); {log_path}:\n{tail}")
    shutil.rmtree(final, ignore_errors=True)
    os.rename(dest, final)
    return final, {p: ("test" if i == 0 else f"test{i}") for i, p in enumerate(tests)}


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-s2l-split", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", nargs="+", default=[], metavar="PREFIX", help="PREFIX.SRC and PREFIX.TGT, line-aligned")
    p.add_argument("--corpus-dir", nargs="+", default=[], metavar="DIR",
                   help="use every *.SRC/*.TGT pair found under DIR (recursively)")
    p.add_argument("--source-lang", "-s", required=True)
    p.add_argument("--target-lang", "-t", required=True)
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--unit", choices=["subword", "word"], default="subword",
                   help="length unit: sentencepiece tokens of the source (default) or whitespace words")
    p.add_argument("--spm-model", help="sentencepiece model that defines subword length (and --binarize)")
    p.add_argument("--spm-vocab-size", type=int, default=8000,
                   help="without --spm-model: train a joint model of this size on all input text")
    p.add_argument("--threshold", type=int, default=80, help="train on sources shorter than this (paper: 80)")
    p.add_argument("--bins", type=parse_buckets, default=parse_buckets("80,100,120,140+"),
                   help="test bins, starting at --threshold and ending open (default 80,100,120,140+)")
    p.add_argument("--valid-size", type=int, default=1000, help="short pairs held back as the valid set")
    p.add_argument("--short-test-size", type=int, default=0,
                   help="short pairs held back as test-short (an in-distribution test set)")
    p.add_argument("--allow-empty-bins", action="store_true", help="accept a split that leaves a test bin empty")
    p.add_argument("--keep-empty-sources", action="store_true",
                   help="keep pairs with an empty source in training (default: left out, counted)")
    p.add_argument("--binarize", action="store_true", help="also sentencepiece-encode and run fairseq-preprocess")
    p.add_argument("--workers", type=int, default=1, help="fairseq-preprocess workers")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--force", action="store_true", help="replace the files of an earlier split in --out")
    return p


def format_stats(stats: Dict, corpora_stats: List[Dict], unit: str) -> str:
    lines = [f"{stats['pairs']} pairs; {stats['short_pairs']} shorter than {stats['threshold']} {unit} tokens "
             f"({stats['share_short_percent']}%; the paper quotes 98.6% for WMT14 En-De), {stats['long_pairs']} long",
             f"train {stats['train']} | valid {stats['valid']} | test-short {stats['test_short']} | test {stats['test']}"
             f" | removed from train as duplicates of held-back sources: "
             f"{stats['train_pairs_removed_as_duplicates_of_held_back_sources']}"
             f" | empty sources left out: {stats['empty_source_pairs_left_out']}",
             "test pairs per bin: " + ", ".join(f"{k} {v}" for k, v in stats["test_bins"].items())]
    lines += [f"  {c['corpus']}: {c['pairs']} pairs, {c['long']} long" for c in corpora_stats]
    return "\n".join(lines)


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_outputs(args):
    """Before anything is read or written: ``--out`` holds no input and is not inside a
    ``--corpus-dir`` (a later run would read the split as a corpus), and its files of an earlier
    split are replaced only with ``--force``."""
    sl, tl = args.source_lang, args.target_lang
    for d in args.corpus_dir:
        if _inside(args.out, d):
            raise UserError(f"--out {args.out} is inside --corpus-dir {d}: the split would be read as a corpus by "
                            "the next run; choose another --out")
    prefixes = corpus_prefixes(args.corpus, args.corpus_dir, sl, tl)
    inputs = [("--corpus", f"{p}.{lang}") for p in prefixes for lang in (sl, tl)]
    parts = ["train", "valid", "test"] + (["test-short"] if args.short_test_size else [])
    outputs = [os.path.join(args.out, f"{part}.{lang}") for part in parts for lang in (sl, tl)]
    outputs += [os.path.join(args.out, name) for name in ("test.lengths", "stats.json")]
    spm_out = os.path.join(args.out, "spm.model")
    if args.unit == "subword" or args.binarize:
        if not (args.spm_model and os.path.exists(spm_out) and same_file(args.spm_model, spm_out)):
            outputs += [spm_out, os.path.join(args.out, "spm.vocab")]
        if args.spm_model:
            inputs.append(("--spm-model", args.spm_model))
    if args.binarize:
        outputs += [os.path.join(args.out, "data-bin")]
    check_not_inputs(outputs, inputs, flag="--out")
    for label, path in inputs:
        for folder in ("spm", "data-bin"):
            if args.binarize and _inside(path, os.path.join(args.out, folder)):
                raise UserError(f"--out {args.out}: {args.out}/{folder} would be rewritten, and it holds the input "
                                f"{label} {path}; choose another --out")
    check_new_files(outputs, args.force, flag="--out", where=args.out)


@cli
def main(argv: Optional[List[str]] = None):
    args = get_parser().parse_args(argv)
    sl, tl = args.source_lang, args.target_lang
    check_outputs(args)
    corpora = load_corpora(args.corpus, args.corpus_dir, sl, tl)
    src = [s for c in corpora for s in c.src]
    tgt = [t for c in corpora for t in c.tgt]
    log(f"{len(corpora)} corpora, {len(src)} pairs")
    os.makedirs(args.out, exist_ok=True)
    stats_path = os.path.join(args.out, "stats.json")
    if os.path.exists(stats_path):  # --force: until this run is complete, --out is no finished split
        os.remove(stats_path)
    sp = None
    if args.unit == "subword" or args.binarize:
        import sentencepiece as spm

        model = os.path.join(args.out, "spm.model")
        if args.spm_model:
            if not os.path.isfile(args.spm_model):
                raise UserError(f"--spm-model {args.spm_model}: no such file")
            if not (os.path.exists(model) and same_file(args.spm_model, model)):
                for source, dest in ((args.spm_model, model),
                                     (args.spm_model[: -len(".model")] + ".vocab" if args.spm_model.endswith(".model")
                                      else None, os.path.join(args.out, "spm.vocab"))):
                    if source and os.path.isfile(source):
                        with atomic_path(dest) as tmp:
                            shutil.copyfile(source, tmp)
        else:
            text = os.path.join(args.out, "spm-input.txt")
            try:
                with open(text, "w", encoding="utf-8") as f:
                    for line in src + tgt:
                        f.write(line + "\n")
                log(f"training a joint sentencepiece model of {args.spm_vocab_size} pieces on all {2 * len(src)} lines")
                train_spm([text], os.path.join(args.out, "spm"), args.spm_vocab_size)
            finally:
                if os.path.exists(text):
                    os.remove(text)
        try:
            sp = spm.SentencePieceProcessor(model_file=model)
        except (OSError, RuntimeError) as e:
            raise UserError(f"--spm-model {args.spm_model or model}: not a sentencepiece model ({e})") from None
    lengths = source_lengths(src, args.unit, sp)
    try:
        split = s2l_split(src, lengths, args.threshold, args.bins, args.valid_size, args.short_test_size,
                          args.seed, args.allow_empty_bins, skip_empty=not args.keep_empty_sources)
    except ValueError as e:  # the options do not fit the data: the message names them
        raise UserError(str(e)) from None
    start, corpora_stats = 0, []
    for c in corpora:
        n = len(c.src)
        corpora_stats.append({"corpus": c.name, "pairs": n,
                              "long": sum(1 for x in lengths[start:start + n] if x >= args.threshold)})
        start += n
    parts = {"train": split.train, "valid": split.valid, "test": split.test}
    if args.short_test_size:
        parts["test-short"] = split.test_short
    for name, idx in parts.items():
        write_part(args.out, name, idx, src, tgt, sl, tl)
    with atomic_open(os.path.join(args.out, "test.lengths"), newline="\n") as f:
        for i in split.test:
            f.write(f"{lengths[i]}\n")
    stats = dict(split.stats, unit=args.unit, spm_model=os.path.join(args.out, "spm.model") if sp else None,
                 corpora=corpora_stats, seed=args.seed)
    if args.binarize:
        dest, subsets = binarize(args.out, list(parts), sl, tl, sp, args.workers)
        stats["data_bin"], stats["test_subsets"] = dest, subsets
        log(f"binarised into {dest} (fairseq subsets: {subsets})")
    write_json(stats_path, stats, indent=2)
    print(format_stats(split.stats, corpora_stats, args.unit))
    log(f"wrote {', '.join(parts)} (.{sl}/.{tl}), test.lengths and stats.json to {args.out}")


if __name__ == "__main__":
    main()
