"""Raw English text -> sentencepiece -> ``fairseq-preprocess --only-source``: data for masked-LM
pretraining (``fairseq-train --task masked_lm --arch roberta_pe_*``) and for language models
(``--task language_modeling --arch transformer_lm_pe_*``, with ``--split documents``).

    fairseq-pe-prepare-mono --input ../shared/data/mono/en --destdir data-bin/mono_en --vocab-size 8000
    fairseq-pe-prepare-mono --input ../shared/data/mono/en --destdir data-bin/lm_en --vocab-size 8000 \
        --split documents --valid-percent 2 --test-percent 2

Inputs are text files (UTF-8, one segment or paragraph per line) or directories, searched
recursively for ``*.txt`` and ``*.raw`` files.  Each file is one document: the output keeps an
empty line between documents (what ``--sample-break-mode complete_doc`` splits on) and
between paragraphs that were separated by empty lines.

1. **split** (``--split paragraphs``, the default): each paragraph (a run of non-empty lines) goes
   to valid when the md5 of its text falls in the first ``--valid-percent`` percent, so duplicates
   land on the same side and the split does not depend on file order;
   (``--split documents``): WHOLE documents are held out, as the language-model benchmarks do
   (WikiText's valid and test sets are whole articles: Merity et al. 2016, "Pointer Sentinel Mixture
   Models"): a document is a file, except in a WikiText file (one whose first non-empty line is a top-level heading
   `` = Title = ``), where each top-level heading starts an article.  The documents, ordered by the
   md5 of their text (independent of file order; duplicates side by side), go to valid until it
   holds ``--valid-percent`` percent of the characters, then to test until it holds
   ``--test-percent`` percent, the rest to train: each held-out split gets at least one whole
   document.  ``DEST/{train,valid,test}.{bin,idx}``;
2. **sentencepiece**: a unigram model learned on the train split (``DEST/spm.model``), which
   GLUE and SQuAD preparation reuse (``--spm-model``);
3. **dictionary**: ``DEST/dict.txt`` lists *every* piece of the model, so text segmented
   later by the same model never maps to ``<unk>``;
4. **binarise**: ``fairseq-preprocess --only-source --srcdict DEST/dict.txt`` writes
   ``DEST/{train,valid}.{bin,idx}`` (and ``test`` with ``--split documents``).

No line is dropped or cut: every non-empty input line is in train, valid or test (counts printed).

Every file is written atomically, the binarised ``train.{bin,idx}`` last.  The files of an earlier
run in ``--destdir`` are replaced only with ``--force``; ``--destdir`` can never be inside an
``--input`` folder (its text files would be read as input by the next run), nor be an input.
"""

import argparse
import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from typing import Dict, Iterator, List, Optional

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import atomic_open, atomic_path, check_new_files, check_not_inputs, same_file
from fairseq_pe.outputs import train_sentencepiece as train_sentencepiece_atomically

TEXT_SUFFIXES = (".txt", ".raw")
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: the files and folders written into --destdir
OUTPUTS = ("raw", "spm", "spm.model", "spm.vocab", "dict.txt", "train.bin", "train.idx", "valid.bin", "valid.idx",
           "test.bin", "test.idx", "preprocess.stdout", "preprocess.log")
#: a WikiText top-level heading (`` = Title = ``, stripped); `` = = Section = = `` is none
WIKITEXT_ARTICLE = re.compile(r"^= [^=](?:.*[^=])? =$")


class PrepError(UserError):
    """A mistake in the inputs or options; the message names it."""


def log(msg: str) -> None:
    print(f"[prepare-mono {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def input_files(inputs: List[str]) -> List[str]:
    """The files named or found (sorted) under the directories named; an error for a missing path."""
    files = []
    for path in inputs:
        if os.path.isfile(path):
            files.append(path)
        elif os.path.isdir(path):
            found = sorted(os.path.join(root, name) for root, _, names in os.walk(path)
                           for name in names if name.endswith(TEXT_SUFFIXES))
            if not found:
                raise PrepError(f"--input {path}: no {'/'.join(TEXT_SUFFIXES)} files in this directory")
            files.extend(found)
        else:
            raise PrepError(f"--input {path}: no such file or directory")
    return files


def paragraphs(path: str) -> Iterator[List[str]]:
    """Runs of non-empty lines of a file (stripped)."""
    block = []
    with open(path, encoding="utf-8", errors="strict") as f:
        try:
            for line in f:
                line = line.strip()
                if line:
                    block.append(line)
                elif block:
                    yield block
                    block = []
        except UnicodeDecodeError as e:
            raise PrepError(f"{path}: not UTF-8 ({e})") from None
    if block:
        yield block


def in_valid(block: List[str], percent: float) -> bool:
    digest = hashlib.md5("\n".join(block).encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2 ** 64 * 100 < percent


def documents(path: str) -> Iterator[List[List[str]]]:
    """The documents of a file, each a list of paragraphs: the whole file, or, in a WikiText file (its
    first paragraph opens with a top-level heading), one per top-level heading."""
    doc: List[List[str]] = []
    wikitext = None
    for block in paragraphs(path):
        if wikitext is None:
            wikitext = bool(WIKITEXT_ARTICLE.match(block[0]))
        if wikitext and WIKITEXT_ARTICLE.match(block[0]) and doc:
            yield doc
            doc = []
        doc.append(block)
    if doc:
        yield doc


def document_digest(doc: List[List[str]]) -> bytes:
    return hashlib.md5("\n\n".join("\n".join(block) for block in doc).encode("utf-8")).digest()


def assign_documents(files: List[str], valid_percent: float, test_percent: float) -> Dict[tuple, str]:
    """``{(file index, document index): split}``: the documents in the order of their md5 fill valid up to
    ``valid_percent`` percent of the characters, then test up to ``test_percent``, the rest is train."""
    docs = []  # (digest, characters, key)
    for i, path in enumerate(files):
        for j, doc in enumerate(documents(path)):
            docs.append((document_digest(doc), sum(len(line) for block in doc for line in block), (i, j)))
    if len(docs) < 3:
        raise PrepError(f"--split documents: the --input holds {len(docs)} document(s); train, valid and test need "
                        "one whole document each at least (a document is a file, or a WikiText article)")
    total = sum(chars for _, chars, _ in docs)
    targets = [("valid", valid_percent / 100 * total), ("test", test_percent / 100 * total)]
    out, held = {}, {"valid": 0, "test": 0}
    for digest, chars, key in sorted(docs):
        name = next((n for n, target in targets if held[n] < target), "train")
        if name != "train":
            held[name] += chars
        out[key] = name
    return out


def split_documents(files: List[str], destdir: str, valid_percent: float, test_percent: float) -> dict:
    """Step 1 with ``--split documents``: ``DEST/raw/{train,valid,test}.txt``, whole documents each."""
    where = assign_documents(files, valid_percent, test_percent)
    raw = os.path.join(destdir, "raw")
    os.makedirs(raw, exist_ok=True)
    counts = {name: {"documents": 0, "paragraphs": 0, "lines": 0} for name in ("train", "valid", "test")}
    with atomic_open(os.path.join(raw, "train.txt"), newline="\n") as train, \
            atomic_open(os.path.join(raw, "valid.txt"), newline="\n") as valid, \
            atomic_open(os.path.join(raw, "test.txt"), newline="\n") as test:
        outs = {"train": train, "valid": valid, "test": test}
        for i, path in enumerate(files):
            for j, doc in enumerate(documents(path)):
                name = where[(i, j)]
                for block in doc:
                    if counts[name]["paragraphs"]:
                        outs[name].write("\n")  # paragraph / document boundary
                    outs[name].write("\n".join(block) + "\n")
                    counts[name]["paragraphs"] += 1
                    counts[name]["lines"] += len(block)
                counts[name]["documents"] += 1
    for name, count in counts.items():
        if count["documents"] == 0:
            flag = "--valid-percent" if name == "valid" else "--test-percent" if name == "test" else "the percents"
            raise PrepError(f"the {name} split is empty: give more documents or change {flag}")
    return counts


def split(files: List[str], destdir: str, valid_percent: float) -> dict:
    """Step 1: ``DEST/raw/{train,valid}.txt``; an empty line between paragraphs and documents."""
    raw = os.path.join(destdir, "raw")
    os.makedirs(raw, exist_ok=True)
    counts = {"train": [0, 0], "valid": [0, 0]}  # paragraphs, lines
    with atomic_open(os.path.join(raw, "train.txt"), newline="\n") as train, \
            atomic_open(os.path.join(raw, "valid.txt"), newline="\n") as valid:
        outs = {"train": train, "valid": valid}
        for path in files:
            for block in paragraphs(path):
                name = "valid" if in_valid(block, valid_percent) else "train"
                out = outs[name]
                if counts[name][0]:
                    out.write("\n")  # paragraph / document boundary
                out.write("\n".join(block) + "\n")
                counts[name][0] += 1
                counts[name][1] += len(block)
    for name, (n_par, n_lines) in counts.items():
        if n_lines == 0:
            raise PrepError(f"the {name} split is empty: give more text or change --valid-percent")
    return {name: {"paragraphs": n_par, "lines": n_lines} for name, (n_par, n_lines) in counts.items()}


def train_sentencepiece(destdir: str, vocab_size: int, input_sentence_size: int, workers: int) -> str:
    """Step 2: a unigram model on the train split."""
    try:
        return train_sentencepiece_atomically(
            os.path.join(destdir, "spm"),
            input=os.path.join(destdir, "raw", "train.txt"), vocab_size=vocab_size,
            model_type="unigram", character_coverage=1.0, input_sentence_size=input_sentence_size,
            shuffle_input_sentence=True, num_threads=workers, bos_id=-1, eos_id=-1, unk_id=0, pad_id=-1,
            max_sentence_length=1 << 20, minloglevel=1,
        )
    except RuntimeError as e:
        raise PrepError(f"sentencepiece failed ({e}); try a smaller --vocab-size") from None


def load_spm(model_path: str):
    import sentencepiece as spm

    try:
        return spm.SentencePieceProcessor(model_file=model_path)
    except (OSError, RuntimeError) as e:
        raise PrepError(f"--spm-model {model_path}: not a sentencepiece model ({e})") from None


def write_dictionary(model_path: str, dict_path: str) -> int:
    """Step 3: every piece of the model except its specials, in fairseq's ``dict.txt`` format."""
    sp = load_spm(model_path)
    pieces = [sp.id_to_piece(i) for i in range(sp.get_piece_size())
              if not (sp.is_unknown(i) or sp.is_control(i))]
    with atomic_open(dict_path, newline="\n") as f:
        for piece in pieces:
            f.write(f"{piece} 1\n")
    return len(pieces)


def encode(model_path: str, src: str, dst: str) -> int:
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=model_path)
    n = 0
    with open(src, encoding="utf-8") as fin, atomic_open(dst, newline="\n") as fout:
        for line in fin:
            line = line.rstrip("\n")
            fout.write((" ".join(sp.encode(line, out_type=str)) if line else "") + "\n")
            n += len(line) > 0
    return n


def binarise(destdir: str, workers: int, splits=("train", "valid")) -> None:
    exe = shutil.which("fairseq-preprocess")
    if exe is None:
        raise PrepError("fairseq-preprocess not found on PATH: install fairseq (scripts/install.sh)")
    spm_dir = os.path.join(destdir, "spm")
    part = os.path.join(destdir, ".bin.part")  # fairseq-preprocess writes here; moved into DEST when done
    shutil.rmtree(part, ignore_errors=True)
    cmd = [exe, "--only-source", "--srcdict", os.path.join(destdir, "dict.txt"),
           "--trainpref", os.path.join(spm_dir, "train"), "--validpref", os.path.join(spm_dir, "valid"),
           "--destdir", part, "--workers", str(workers)]
    if "test" in splits:
        cmd[-4:-4] = ["--testpref", os.path.join(spm_dir, "test")]
    log(f"running {shlex.join(cmd)}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with atomic_open(os.path.join(destdir, "preprocess.stdout")) as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        shutil.rmtree(part, ignore_errors=True)
        raise PrepError(f"fairseq-preprocess failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    if os.path.exists(os.path.join(part, "preprocess.log")):
        os.replace(os.path.join(part, "preprocess.log"), os.path.join(destdir, "preprocess.log"))
    held_out = [name for name in ("valid", "test") if name in splits]
    for name in [f"{s}.{ext}" for s in held_out for ext in ("idx", "bin")] + ["train.idx", "train.bin"]:
        # train.bin last: what a recipe checks
        os.replace(os.path.join(part, name), os.path.join(destdir, name))
    shutil.rmtree(part, ignore_errors=True)
    for line in proc.stdout.splitlines():
        if "replaced (by <unk>)" in line or "replaced by <unk>" in line:  # fairseq 0.12 writes the first
            log(f"  {line.split('|')[-1].strip()}")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-prepare-mono", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", nargs="+", required=True, metavar="PATH",
                   help="text files, or directories searched for *.txt / *.raw files")
    p.add_argument("--destdir", required=True, help="output: spm.model, dict.txt, {train,valid}.{bin,idx}")
    p.add_argument("--vocab-size", type=int, default=32000, help="sentencepiece pieces (default 32000)")
    p.add_argument("--valid-percent", type=float, default=1.0,
                   help="share of paragraphs (of the characters, in whole documents, with --split documents) held "
                        "out for validation, by hash (default 1)")
    p.add_argument("--split", choices=("paragraphs", "documents"), default="paragraphs",
                   help="what is held out: paragraphs (masked-LM pretraining, the default) or whole documents, "
                        "for valid and test (language models: a file, or a WikiText article)")
    p.add_argument("--test-percent", type=float, default=None,
                   help="with --split documents: share of the characters held out for test, in whole documents "
                        "(default 1)")
    p.add_argument("--spm-input-sentence-size", type=int, default=10_000_000,
                   help="lines sampled to learn sentencepiece (default 10M)")
    p.add_argument("--spm-model", default=None,
                   help="use this sentencepiece model instead of learning one (it is copied to DEST/spm.model)")
    p.add_argument("--workers", type=int, default=max(1, min(os.cpu_count() or 1, 16)))
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --destdir")
    args = p.parse_args(argv)
    if not 0 < args.valid_percent < 100:
        p.error("--valid-percent must be in (0, 100)")
    if args.test_percent is not None and args.split != "documents":
        p.error("--test-percent needs --split documents (paragraph splits have no test set)")
    if args.split == "documents":
        args.test_percent = 1.0 if args.test_percent is None else args.test_percent
        if not 0 < args.test_percent < 100 or args.valid_percent + args.test_percent >= 100:
            p.error("--test-percent must be in (0, 100) and leave some text for train with --valid-percent")
    if args.vocab_size < 10:
        p.error("--vocab-size must be at least 10")
    return args


def _inside(path: str, folder: str) -> bool:
    path, folder = os.path.realpath(path), os.path.realpath(folder)
    return path == folder or path.startswith(folder.rstrip(os.sep) + os.sep)


def check_outputs(args: argparse.Namespace, files: List[str]):
    """``--destdir`` is no input, lies in no ``--input`` folder, and its files of an earlier run
    are replaced only with ``--force``."""
    dest = os.path.abspath(args.destdir)
    for path in args.input:
        if os.path.isdir(path) and _inside(dest, path):
            raise PrepError(f"--destdir {args.destdir} is inside --input {path}: its text files would be read as "
                            "input by the next run; choose another --destdir")
    inputs = [("--input", f) for f in files] + ([("--spm-model", args.spm_model)] if args.spm_model else [])
    outputs = [os.path.join(dest, name) for name in OUTPUTS]
    model = os.path.join(dest, "spm.model")
    if args.spm_model and os.path.exists(model) and same_file(args.spm_model, model):
        outputs = [p for p in outputs if os.path.basename(p) not in ("spm.model", "spm.vocab")]  # used as it is
    for label, path in inputs:
        for folder in ("raw", "spm"):
            if _inside(path, os.path.join(dest, folder)):
                raise PrepError(f"--destdir {args.destdir}: {folder}/ would be rewritten, and it holds the input "
                                f"{label} {path}; choose another --destdir")
    check_not_inputs(outputs, inputs, flag="--destdir")
    check_new_files(outputs, args.force, flag="--destdir", where=args.destdir)


def prepare(args: argparse.Namespace) -> None:
    dest = os.path.abspath(args.destdir)
    files = input_files(args.input)
    check_outputs(args, files)
    created = [os.path.join(dest, name) for name in OUTPUTS if not os.path.exists(os.path.join(dest, name))]
    try:
        _prepare(args, dest, files)
    except BaseException:  # a failed or interrupted run leaves none of the files and folders it created
        for path in created:
            if os.path.isdir(path):
                shutil.rmtree(path, ignore_errors=True)
            elif os.path.exists(path):
                os.remove(path)
        shutil.rmtree(os.path.join(dest, ".bin.part"), ignore_errors=True)
        raise


def _prepare(args: argparse.Namespace, dest: str, files: List[str]) -> None:
    os.makedirs(dest, exist_ok=True)
    log(f"{len(files)} input files -> {dest}")
    if args.split == "documents":
        counts = split_documents(files, dest, args.valid_percent, args.test_percent)
    else:
        counts = split(files, dest, args.valid_percent)
    for name, count in counts.items():
        log(f"  {name}: " + ", ".join(f"{n:,} {what}" for what, n in count.items()))
    model = os.path.join(dest, "spm.model")
    if args.spm_model:
        if not os.path.isfile(args.spm_model):
            raise PrepError(f"--spm-model {args.spm_model}: no such file")
        load_spm(args.spm_model)  # a file that is no sentencepiece model: named as given, before any copy
        if not (os.path.exists(model) and same_file(args.spm_model, model)):
            with atomic_path(model) as tmp:
                shutil.copyfile(args.spm_model, tmp)
    else:
        log(f"learning sentencepiece ({args.vocab_size} pieces) on the train split")
        train_sentencepiece(dest, args.vocab_size, args.spm_input_sentence_size, args.workers)
    n_pieces = write_dictionary(model, os.path.join(dest, "dict.txt"))
    os.makedirs(os.path.join(dest, "spm"), exist_ok=True)
    for name in counts:
        n = encode(model, os.path.join(dest, "raw", f"{name}.txt"), os.path.join(dest, "spm", name))
        log(f"  encoded {name}: {n:,} lines")
    binarise(dest, args.workers, tuple(counts))
    log(f"done: {dest} (sentencepiece {model}, dictionary of {n_pieces:,} pieces + fairseq's 4 specials)")
    if args.split == "documents":
        log("next (a language model; docs/lm.md):")
        print(f"fairseq-train {shlex.quote(dest)} --user-dir {shlex.quote(PLUGIN_DIR)} --task language_modeling "
              "--arch transformer_lm_pe_tiny --tokens-per-sample 64 --sample-break-mode none "
              "$(python -m fairseq_pe.systems flags alibi) --optimizer adam --lr 1e-3 --max-tokens 2048 "
              "--max-update 2000 --save-dir checkpoints/lm-alibi", flush=True)
        return
    log("next (the BERT schedule: 128 tokens, then 512; see scripts/recipes/bert-pretrain.sh):")
    print(f"fairseq-train {shlex.quote(dest)} --user-dir {shlex.quote(PLUGIN_DIR)} --task masked_lm "
          "--criterion masked_lm --arch roberta_pe_base --pe-absolute learned "
          "--tokens-per-sample 128 --max-positions 512 --optimizer adam --adam-betas '(0.9, 0.98)' "
          "--lr 1e-4 --lr-scheduler polynomial_decay --warmup-updates 10000 --total-num-update 1000000 "
          "--max-update 1000000 --batch-size 256 --save-dir checkpoints/bert128", flush=True)


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`PrepError` ends as ``fairseq-pe-prepare-mono: error: ...``, status 2."""
    prepare(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
