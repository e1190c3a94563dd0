"""WikiText-103 for a language model, word-level, as fairseq's ``examples/language_model`` and ALiBi prepare it.

    fairseq-pe-prepare-wikitext --destdir data-bin/wikitext-103            # downloads the raw release
    fairseq-pe-prepare-wikitext --raw-dir DIR --destdir data-bin/wikitext-103

1. **the raw files**: ``--raw-dir`` holds ``wiki.{train,valid,test}.raw`` or the archive
   ``wikitext-103-raw-v1.zip``; without it the archive is downloaded from ``--url`` (Merity et al.'s
   release, :data:`URL`) into ``--download-dir`` (via ``.part``, renamed when complete; an archive already
   there is reused) and its three files extracted next to it;
2. **binarise**: ``fairseq-preprocess --only-source --trainpref wiki.train.raw --validpref wiki.valid.raw
   --testpref wiki.test.raw --thresholdsrc 3`` (fairseq's ``examples/language_model/README.md`` binarises
   the tokenised release the same way).  The raw release is the tokenised one before its words seen fewer
   than 3 times were replaced by ``<unk>`` (Merity et al. 2016, "Pointer Sentinel Mixture Models", which
   built WikiText): ``--threshold 3`` (the default) rebuilds that vocabulary from the train split (the
   release's: 267,735 words; not checked here, where WikiText-103 is absent); the share of each split
   replaced by ``<unk>`` is printed.

Every line of each file is one sample of the binarised split (an empty line: its end-of-sentence alone);
the sample counts are checked against the files' line counts.  ``DEST/{train,valid,test}.{bin,idx}``,
``DEST/dict.txt``; written into ``DEST/.bin.part`` and moved when complete, ``train.bin`` last.  The files
of an earlier run are replaced only with ``--force``.
"""

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import zipfile
from typing import Dict, List, Optional

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import atomic_open, check_new_files, check_not_inputs

URL = "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-raw-v1.zip"
SPLITS = ("train", "valid", "test")
RAW = {split: f"wiki.{split}.raw" for split in SPLITS}
OUTPUTS = ("dict.txt", "preprocess.log", "preprocess.stdout") + tuple(
    f"{split}.{ext}" for split in SPLITS for ext in ("bin", "idx"))
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


class PrepError(UserError):
    """A mistake in the inputs or options; the message names it."""


def log(msg: str) -> None:
    print(f"[prepare-wikitext {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def download(url: str, dest: str) -> str:
    """``url`` -> ``dest`` through ``dest.part``, renamed when complete (the WMT14 preparation's download, with its
    progress); an error names ``--url`` and how to provide the archive by hand."""
    from fairseq_pe.data_prep import wmt14

    try:
        return wmt14.download(url, dest, members=list(RAW.values()))
    except wmt14.PrepError as e:
        raise PrepError(f"--url {url}: {e}") from None


def extract(archive: str, folder: str) -> Dict[str, str]:
    """The three raw files of the archive (any folder inside it), extracted into ``folder``."""
    os.makedirs(folder, exist_ok=True)
    try:
        with zipfile.ZipFile(archive) as z:
            members = {os.path.basename(m): m for m in z.namelist() if os.path.basename(m) in RAW.values()}
            missing = [name for name in RAW.values() if name not in members]
            if missing:
                raise PrepError(f"{archive}: no {', '.join(missing)} in this archive (is it wikitext-103-raw-v1.zip?)")
            out = {}
            for split, name in RAW.items():
                path = os.path.join(folder, name)
                if not (os.path.exists(path) and os.path.getsize(path) == z.getinfo(members[name]).file_size):
                    log(f"extracting {members[name]} -> {path}")
                    with z.open(members[name]) as src, atomic_open(path, "wb") as dst:
                        shutil.copyfileobj(src, dst, 1 << 20)
                out[split] = path
            return out
    except zipfile.BadZipFile as e:
        raise PrepError(f"{archive}: not a zip archive ({e}); remove it and run again to download it anew") from None


def raw_files(args: argparse.Namespace) -> Dict[str, str]:
    """``{split: path}`` of the three raw files: in ``--raw-dir`` (extracted, or its archive), or downloaded."""
    if args.raw_dir:
        if not os.path.isdir(args.raw_dir):
            raise PrepError(f"--raw-dir {args.raw_dir}: no such directory")
        files = {split: os.path.join(args.raw_dir, name) for split, name in RAW.items()}
        if all(os.path.isfile(path) for path in files.values()):
            return files
        archive = os.path.join(args.raw_dir, os.path.basename(args.url))
        if os.path.isfile(archive):
            return extract(archive, args.download_dir or os.path.join(args.destdir, "download"))
        missing = [name for name, path in zip(RAW.values(), files.values()) if not os.path.isfile(path)]
        raise PrepError(f"--raw-dir {args.raw_dir}: no {', '.join(missing)} (nor the archive "
                        f"{os.path.basename(args.url)})")
    folder = args.download_dir or os.path.join(args.destdir, "download")
    archive = os.path.join(folder, os.path.basename(args.url) or "wikitext.zip")
    if not os.path.isfile(archive):
        download(args.url, archive)
    else:
        log(f"reusing {archive}")
    return extract(archive, folder)


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def binarise(files: Dict[str, str], dest: str, threshold: int, workers: int) -> Dict[str, dict]:
    """``fairseq-preprocess --only-source`` into ``DEST/.bin.part``, checked and moved into ``DEST``."""
    exe = shutil.which("fairseq-preprocess")
    if exe is None:
        raise PrepError("fairseq-preprocess not found on PATH: install fairseq (scripts/install.sh)")
    part = os.path.join(dest, ".bin.part")
    shutil.rmtree(part, ignore_errors=True)
    cmd = [exe, "--only-source", "--trainpref", files["train"], "--validpref", files["valid"],
           "--testpref", files["test"], "--destdir", part, "--workers", str(workers),
           "--thresholdsrc", str(threshold)]
    log(f"running {shlex.join(cmd)}")
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    with atomic_open(os.path.join(dest, "preprocess.stdout")) as f:
        f.write(proc.stdout)
    if proc.returncode != 0:
        shutil.rmtree(part, ignore_errors=True)
        raise PrepError(f"fairseq-preprocess failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
    from fairseq.data import data_utils

    stats = {}
    for split, path in files.items():
        dataset = data_utils.load_indexed_dataset(os.path.join(part, split), None)
        lines = count_lines(path)
        if dataset is None or len(dataset) != lines:
            shutil.rmtree(part, ignore_errors=True)
            raise PrepError(f"{path}: {lines:,} lines but {0 if dataset is None else len(dataset):,} binarised samples")
        unk = re.search(re.escape(path) + r": [^\n]*?([\d.e+-]+)% replaced", proc.stdout)
        stats[split] = {"lines": lines, "tokens": int(dataset.sizes.sum()),
                        "unk_percent": float(unk.group(1)) if unk else None}
    if os.path.exists(os.path.join(part, "preprocess.log")):
        os.replace(os.path.join(part, "preprocess.log"), os.path.join(dest, "preprocess.log"))
    for name in ("dict.txt", "test.idx", "test.bin", "valid.idx", "valid.bin", "train.idx", "train.bin"):
        os.replace(os.path.join(part, name), os.path.join(dest, name))  # train.bin last: what a recipe checks
    shutil.rmtree(part, ignore_errors=True)
    return stats


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-prepare-wikitext", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--destdir", required=True, help="output: dict.txt, {train,valid,test}.{bin,idx}")
    p.add_argument("--raw-dir", default=None,
                   help="a folder with wiki.{train,valid,test}.raw or the archive (else it is downloaded)")
    p.add_argument("--url", default=URL, help=f"the archive to download without --raw-dir (default {URL})")
    p.add_argument("--download-dir", default=None,
                   help="where the archive is downloaded (without --raw-dir) and extracted (default DESTDIR/download)")
    p.add_argument("--threshold", type=int, default=3,
                   help="words seen fewer times in train become <unk> (fairseq-preprocess --thresholdsrc; "
                        "default 3, WikiText's own vocabulary)")
    p.add_argument("--workers", type=int, default=max(1, min(os.cpu_count() or 1, 16)))
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --destdir")
    args = p.parse_args(argv)
    if args.threshold < 0:
        p.error("--threshold must be 0 or more")
    return args


def prepare(args: argparse.Namespace) -> Dict[str, dict]:
    dest = os.path.abspath(args.destdir)
    outputs = [os.path.join(dest, name) for name in OUTPUTS]
    if args.raw_dir:
        check_not_inputs(outputs, [("--raw-dir", os.path.join(args.raw_dir, name)) for name in RAW.values()],
                         flag="--destdir")
    check_new_files(outputs, args.force, flag="--destdir", where=args.destdir)
    os.makedirs(dest, exist_ok=True)
    files = raw_files(args)
    for split, path in files.items():
        log(f"  {split}: {path}")
    stats = binarise(files, dest, args.threshold, args.workers)
    for split, s in stats.items():
        unk = "" if s["unk_percent"] is None else f", {s['unk_percent']}% replaced by <unk>"
        log(f"  {split}: {s['lines']:,} lines, {s['tokens']:,} tokens (with one </s> a line){unk}")
    log(f"done: {dest}; next, the GPU recipe: scripts/recipes/lm-wiki103.sh (docs/lm.md)")
    return stats


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`PrepError` ends as ``fairseq-pe-prepare-wikitext: error: ...``, status 2."""
    prepare(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
