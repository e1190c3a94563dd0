"""The quickstart's first stage: the corpus (synthetic, or ``--data``) and its ``--extra-test`` sets as raw text,
segmented (sentencepiece for real corpora) and binarised by ``fairseq-preprocess``."""

import logging
import os
import shutil
from typing import Dict, List, NamedTuple, Optional, Sequence

from fairseq_pe.errors import UserError
from fairseq_pe.outputs import atomic_path, train_sentencepiece, write_text
from fairseq_pe.translation.bleu import bucket_label
from fairseq_pe.translation.quickstart.common import copy_input, count_lines, log, read_lines, run


class Prepared(NamedTuple):
    """What the stages after preparation read: the raw text folder, the binarised data, per test subset
    (``test``, ``test1``, ...) its sentence count, its name in the tables and its source sizes."""

    raw: str
    data_bin: str
    tests: Dict[str, int]
    what: Dict[str, str]
    sizes: Dict[str, List[int]]


def prepare(args) -> Prepared:
    """Raw text, segmentation and binarisation of the corpus and the ``--extra-test`` sets (reused when done)."""
    raw = prepare_corpus(args)
    extra = prepare_extra_tests(args)
    text_dir, extra_text = segment(args, raw, extra)
    data_bin = binarize(args, text_dir, extra_text)
    tests = {"test": count_lines(os.path.join(raw, f"test.{args.source_lang}"))}
    tests.update({f"test{i}": count_lines(f"{p}.{args.source_lang}") for i, p in enumerate(extra, start=1)})
    extra_names = [name for name, _, _ in args.extra_test]
    what = {"test": "test", **{f"test{i}": name for i, name in enumerate(extra_names, start=1)}}
    return Prepared(raw, data_bin, tests, what, source_sizes(args, data_bin, list(tests)))


def prepare_extra_tests(args) -> List[str]:
    """Copy each ``--extra-test`` into ``WORK/extra/NAME.{SRC,TGT}``; returns the prefixes."""
    prefixes = []
    for name, src, ref in args.extra_test:
        prefix = os.path.join(args.workdir, "extra", name)
        copy_input(src, f"{prefix}.{args.source_lang}")
        copy_input(ref, f"{prefix}.{args.target_lang}")
        prefixes.append(prefix)
    return prefixes



def check_extra_tests(args):
    """Every ``--extra-test`` is there, readable and line-aligned (before anything is written)."""
    for name, src, ref in args.extra_test:
        for path in (src, ref):
            if not os.path.isfile(path):
                raise UserError(f"--extra-test {name}: no such file {path}")
        try:
            a, b = count_lines(src), count_lines(ref)
        except UnicodeDecodeError as e:
            raise UserError(f"--extra-test {name}: {src} or {ref} is not UTF-8 text ({e})") from None
        if a != b:
            raise UserError(f"--extra-test {name}: {src} has {a} lines but {ref} has {b}")
        if a == 0:
            raise UserError(f"--extra-test {name}: {src} is empty")



def prepare_corpus(args) -> str:
    """Raw text of train/valid/test in ``WORK/raw``; returns that directory."""
    raw = os.path.join(args.workdir, "raw")
    if args.data:
        return args.data
    from fairseq_pe.translation.synthetic import write_corpus

    write_corpus(raw, train_size=args.train_size, test_per_bucket=args.test_per_bucket, seed=args.data_seed,
                 src=args.source_lang, tgt=args.target_lang,
                 test_buckets=[(lo, (hi or lo + 16) - 1) for lo, hi in args.buckets])
    log(f"synthetic corpus: {args.train_size} training pairs of 1-16 words, test buckets "
        f"{[bucket_label(b) for b in args.buckets]} in {raw}")
    return raw



def check_data(args):
    """``--data`` holds line-aligned ``{train,valid,test}.{SRC,TGT}`` (before anything is written)."""
    if not os.path.isdir(args.data):
        raise UserError(f"--data {args.data}: no such folder")
    for split in ("train", "valid", "test"):
        for lang in (args.source_lang, args.target_lang):
            path = os.path.join(args.data, f"{split}.{lang}")
            if not os.path.isfile(path):
                raise UserError(f"--data {args.data}: missing {path} (expected {{train,valid,test}}.{{SRC,TGT}})")
        try:
            a = count_lines(os.path.join(args.data, f"{split}.{args.source_lang}"))
            b = count_lines(os.path.join(args.data, f"{split}.{args.target_lang}"))
        except UnicodeDecodeError as e:
            raise UserError(f"--data {args.data}: {split}.* is not UTF-8 text ({e})") from None
        if a != b:
            raise UserError(f"--data {args.data}: {split}.{args.source_lang} has {a} lines but "
                            f"{split}.{args.target_lang} has {b}")
    if args.spm_model and not os.path.isfile(args.spm_model):
        raise UserError(f"--spm-model {args.spm_model}: no such file")



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
        copy_input(args.spm_model, model)
    elif not os.path.exists(model):
        log(f"training a joint sentencepiece model ({args.spm_vocab_size} pieces)")
        try:  # written atomically: a half model is never reused
            train_sentencepiece(
                os.path.join(out, "spm"),
                input=[os.path.join(raw, f"train.{lang}") for lang in (args.source_lang, args.target_lang)],
                vocab_size=args.spm_vocab_size, character_coverage=1.0, model_type="unigram",
                input_sentence_size=2_000_000, shuffle_input_sentence=True, minloglevel=2,
            )
        except RuntimeError as e:
            raise UserError(f"--spm-vocab-size {args.spm_vocab_size}: sentencepiece failed ({e}); "
                            "try a smaller size") from None
    try:
        sp = spm.SentencePieceProcessor(model_file=model)
    except (OSError, RuntimeError) as e:
        raise UserError(f"--spm-model {args.spm_model or model}: not a sentencepiece model ({e})") from None
    prefixes = [os.path.join(raw, split) for split in ("train", "valid", "test")] + list(extra)
    for prefix in prefixes:
        for lang in (args.source_lang, args.target_lang):
            lines = read_lines(f"{prefix}.{lang}")
            with atomic_path(os.path.join(out, f"{os.path.basename(prefix)}.{lang}")) as tmp, \
                    open(tmp, "w", encoding="utf-8") as g:
                for pieces in sp.encode(lines, out_type=str):
                    g.write(" ".join(pieces) + "\n")
    return out, [os.path.join(out, os.path.basename(p)) for p in extra]



def source_only(args, data_bin: str, subsets: Sequence[str]) -> str:
    """``DATA_BIN/source-only``: the dictionaries and the source side of each test subset, what
    ``fairseq-generate`` translates.  Without the references' side, fairseq checks only the
    sources against the model's positions (a reference only serves scoring, on the raw text)."""
    dest = os.path.join(data_bin, "source-only")
    part = dest + ".part"
    shutil.rmtree(part, ignore_errors=True)
    os.makedirs(part)
    names = [f"dict.{lang}.txt" for lang in (args.source_lang, args.target_lang)]
    names += [f"{subset}.{args.source_lang}-{args.target_lang}.{args.source_lang}.{ext}" for subset in subsets
              for ext in ("bin", "idx")]
    for name in names:
        shutil.copyfile(os.path.join(data_bin, name), os.path.join(part, name))
    shutil.rmtree(dest, ignore_errors=True)
    os.rename(part, dest)
    return dest



def binarize(args, text_dir: str, extra: Sequence[str]) -> str:
    """``fairseq-preprocess``: subsets train, valid, test and test1, test2, ... for ``--extra-test``,
    and their sources alone in ``data-bin/source-only`` (:func:`source_only`)."""
    dest = os.path.join(args.workdir, "data-bin")
    marker = os.path.join(dest, "preprocess.done")
    tests = [os.path.join(text_dir, "test")] + list(extra)
    subsets = ["test"] + [f"test{i}" for i in range(1, len(extra) + 1)]
    if os.path.exists(marker) and read_lines(marker) == tests:
        if not os.path.isdir(os.path.join(dest, "source-only")):  # a work dir of an earlier version
            source_only(args, dest, subsets)
        return dest
    shutil.rmtree(dest, ignore_errors=True)
    log("fairseq-preprocess")
    run(["fairseq-preprocess", "--source-lang", args.source_lang, "--target-lang", args.target_lang,
         "--trainpref", os.path.join(text_dir, "train"), "--validpref", os.path.join(text_dir, "valid"),
         "--testpref", ",".join(tests), "--destdir", dest, "--joined-dictionary",
         "--workers", "1"], os.path.join(args.workdir, "preprocess.log"))
    source_only(args, dest, subsets)
    write_text(marker, "\n".join(tests) + "\n")
    return dest



def source_sizes(args, data_bin: str, subsets: Sequence[str], lang: Optional[str] = None) -> Dict[str, List[int]]:
    """Tokens of each test source as fairseq-generate sees them (``</s>`` included), per subset
    (of the ``lang`` side: the target's for the training length)."""
    from fairseq.data import Dictionary, data_utils

    quiet = logging.getLogger(data_utils.__name__)
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    lang = lang or args.source_lang
    try:
        d = Dictionary.load(os.path.join(data_bin, f"dict.{lang}.txt"))
        out = {}
        for subset in subsets:
            prefix = os.path.join(data_bin, f"{subset}.{args.source_lang}-{args.target_lang}.{lang}")
            dataset = data_utils.load_indexed_dataset(prefix, d)  # kept alive: .sizes lives in its mmap
            out[subset] = [int(n) for n in dataset.sizes]
            del dataset
    finally:
        quiet.setLevel(level)
    return out

