"""``fairseq-pe-prepare-wmt14``: WMT14 English-German / English-French, from the archives to ``data-bin``.

Usage::

    fairseq-pe-prepare-wmt14 --pair en-de|en-fr --workdir DIR [--raw-dir DIR]
        [--spm-vocab-size 32000] [--spm-input-sentence-size 10000000] [--workers N]
        [--max-len 250] [--ratio 1.5]

``--pair en-de`` translates English into German (source ``en``, target ``de``); ``--pair en-fr``
English into French.  The steps, each run once: a marker ``WORKDIR/.done/STEP`` is written only
after the step succeeded, and a re-run prints ``skip: STEP (done)`` for it (a step whose options
changed, or whose outputs are gone, is redone, and so is every step after it):

1. **fetch** the corpora that fairseq's ``examples/translation/prepare-wmt14en2{de,fr}.sh`` fetch
   into ``WORKDIR/orig`` (one try per file, 30 s timeout; partial downloads go to ``NAME.part``) and
   extract the files needed from them.  Approximate archive sizes:

   ========================================  ======  =======================================
   archive                                   size    pairs (en-de / en-fr)
   ========================================  ======  =======================================
   training-parallel-europarl-v7.tgz         630 MB  1.92 M / 2.01 M
   training-parallel-commoncrawl.tgz         880 MB  2.40 M / 3.24 M
   training-parallel-nc-v9.tgz                75 MB  0.20 M / 0.18 M
   training-parallel-un.tgz (en-fr only)     2.3 GB  12.9 M
   training-giga-fren.tar (en-fr only)       2.6 GB  22.5 M
   dev.tgz (newstest2013, the valid set)      17 MB  3,000
   test-full.tgz (newstest2014, full)          3 MB  3,003 / 3,003
   ========================================  ======  =======================================

   In all about 4.5 M training pairs for en-de and 40.8 M for en-fr (expect ~15 GB of disk for en-fr
   extracted).  fairseq's en-de script fetches news-commentary v12 (WMT17) unless run with
   ``--icml17``; this is WMT14, so news-commentary is WMT14's v9, as in that ``--icml17`` mode and in
   fairseq's en-fr script.  The valid set is ``dev/newstest2013`` from WMT14's ``dev.tgz`` (fairseq's
   en-de script fetches WMT17's ``dev.tgz``, which holds the same file; its valid sets are split off
   the training data instead).

   **No network?**  ``--raw-dir DIR`` uses files already on disk instead: for every corpus either
   the archive (``DIR/training-parallel-europarl-v7.tgz``) or its extracted files at their paths
   inside the archive (``DIR/training/europarl-v7.de-en.en`` and ``.de``; a bare file name directly
   in ``DIR`` is accepted too).  Whatever is missing is listed, all of it, in one error.

2. **clean** the training corpora only, as Moses ``clean-corpus-n.perl -ratio 1.5 CORPUS en de OUT
   1 250`` does: whitespace is normalised, pairs with an empty side, more than ``--max-len`` words
   on a side, a word-count ratio above ``--ratio``, or a "word" of over 1000 characters are
   dropped; the counts per corpus and per reason are printed.  The valid and test sets are
   **never** filtered (only their whitespace is normalised): ``WORKDIR/raw/test.{SRC,TGT}`` hold
   every segment of the full newstest2014 ``.sgm`` files (XML entities unescaped: 3,003 lines), so BLEU
   is measured on the whole official test set.  Output: ``WORKDIR/raw/{train,valid,test}.{SRC,TGT}``
   (e.g. ``train.en``/``train.de``), plain text.  fairseq's scripts also run Moses punctuation
   normalisation and tokenisation, learn 40k BPE codes, take every 100th (1333th) training pair as
   valid set and clean after BPE; here sentencepiece works on raw text, so none of that is needed.

3. **spm**: a joint unigram sentencepiece model (``--spm-vocab-size`` 32000: 32k joint, as in
   common WMT14 setups; character coverage 1.0; ``--spm-input-sentence-size`` 10 M sentences
   sampled from train SRC+TGT with shuffling) ``WORKDIR/spm/spm.model``, and every split encoded
   as space-separated pieces into ``WORKDIR/spm/{train,valid,test}.{SRC,TGT}``.  On the full
   corpora training takes tens of minutes and several GB of memory.

4. **binarise** with ``fairseq-preprocess --joined-dictionary`` into ``WORKDIR/data-bin`` (log:
   ``WORKDIR/preprocess.log``).

The end prints a summary and the ``fairseq-train`` command to run next.

Redoing a done step because its options changed would replace its outputs and every later step's
(``data-bin`` and the sentencepiece model a trained model depends on): that needs ``--force``; the
options that changed are named.  A ``--workdir`` whose ``raw/``, ``spm/`` or ``data-bin/`` were not
written by this tool (no ``WORKDIR/.done``) is refused.  Every file is written atomically (a
``.part`` file or folder renamed when complete).
"""

import argparse
import gzip
import html
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tarfile
import time
import urllib.error
import urllib.request
from collections import Counter
from dataclasses import dataclass
from itertools import zip_longest
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import train_sentencepiece

PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAIRS = ("en-de", "en-fr")
STEPS = ("fetch", "clean", "spm", "binarise")
DOWNLOAD_TIMEOUT = 30  # seconds, one try per file
MAX_WORD_CHARS = 1000  # clean-corpus-n.perl's -max-word-length default


class PrepError(UserError):
    """A failure the user can act on: ``fairseq-pe-prepare-wmt14: error: ...``, exit status 2."""


def log(msg: str):
    print(f"[wmt14 {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------------------------
# the corpora


@dataclass(frozen=True)
class Corpus:
    """One parallel corpus: an archive (from ``url``) holding a source and a target file.

    ``src``/``tgt`` are the accepted paths inside the archive, the usual one first.
    """

    name: str
    split: str  # train, valid or test
    archive: str
    url: str
    src: Tuple[str, ...]
    tgt: Tuple[str, ...]
    sgm: bool = False

    @property
    def members(self) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
        return self.src, self.tgt


def corpora(pair: str) -> List[Corpus]:
    """The corpora of ``pair`` (``en-de`` or ``en-fr``): the files fairseq's WMT14 scripts use."""
    if pair not in PAIRS:
        raise PrepError(f"--pair must be one of {', '.join(PAIRS)}, not {pair!r}")
    src, tgt = pair.split("-")
    xx = f"{tgt}-en"  # the archives name the pair with English second
    tt = f"{tgt}en"

    def train(name, archive, url, stem, exts=("",)):
        return Corpus(name, "train", archive, url, tuple(f"{stem}.{src}{e}" for e in exts),
                      tuple(f"{stem}.{tgt}{e}" for e in exts))

    out = [
        train("europarl-v7", "training-parallel-europarl-v7.tgz",
              "http://statmt.org/wmt13/training-parallel-europarl-v7.tgz", f"training/europarl-v7.{xx}"),
        train("commoncrawl", "training-parallel-commoncrawl.tgz",
              "http://statmt.org/wmt13/training-parallel-commoncrawl.tgz", f"commoncrawl.{xx}"),
    ]
    if pair == "en-fr":
        out.append(train("un", "training-parallel-un.tgz", "http://statmt.org/wmt13/training-parallel-un.tgz",
                         f"un/undoc.2000.{xx}"))
    # fairseq's prepare-wmt14en2de.sh fetches news-commentary v12 (WMT17) unless run with --icml17;
    # WMT14 (and that script's --icml17 mode, and its en-fr script) use v9.
    out.append(train("news-commentary-v9", "training-parallel-nc-v9.tgz",
                     "http://statmt.org/wmt14/training-parallel-nc-v9.tgz", f"training/news-commentary-v9.{xx}"))
    if pair == "en-fr":
        # the tar holds gzipped files; already gunzipped ones (as fairseq's script leaves them) do too
        out.append(train("giga-fren", "training-giga-fren.tar", "http://statmt.org/wmt10/training-giga-fren.tar",
                         "giga-fren.release2.fixed", exts=(".gz", "")))
    out.append(Corpus("newstest2013", "valid", "dev.tgz", "http://statmt.org/wmt14/dev.tgz",
                      (f"dev/newstest2013.{src}",), (f"dev/newstest2013.{tgt}",)))
    out.append(Corpus("newstest2014", "test", "test-full.tgz", "http://statmt.org/wmt14/test-full.tgz",
                      (f"test-full/newstest2014-{tt}-src.{src}.sgm",),
                      (f"test-full/newstest2014-{tt}-ref.{tgt}.sgm",), sgm=True))
    return out


# --------------------------------------------------------------------------------------------
# step 1: locate, download, extract


def find_member(dirs: Sequence[str], accepted: Sequence[str]) -> Optional[str]:
    """The first of ``DIR/PATH`` or ``DIR/basename(PATH)`` that is a file, over dirs and accepted paths."""
    for d in dirs:
        for rel in accepted:
            for cand in (rel, os.path.basename(rel)):
                path = os.path.join(d, cand)
                if os.path.isfile(path):
                    return path
    return None


def locate_inputs(corps: Sequence[Corpus], dirs: Sequence[str]):
    """Where each corpus is on disk: ``(extracted, archives, missing)``.

    ``extracted``: name -> (src path, tgt path) of corpora whose files are there;
    ``archives``: name -> archive path of the others whose archive is there;
    ``missing``: the corpora found in neither form.
    """
    extracted: Dict[str, Tuple[str, str]] = {}
    archives: Dict[str, str] = {}
    missing: List[Corpus] = []
    for c in corps:
        s, t = find_member(dirs, c.src), find_member(dirs, c.tgt)
        if s and t:
            extracted[c.name] = (s, t)
            continue
        archive = find_member(dirs, [c.archive])
        if archive:
            archives[c.name] = archive
        else:
            missing.append(c)
    return extracted, archives, missing


def describe(c: Corpus) -> str:
    return f"{c.archive} or its extracted files {' + '.join(m[0] for m in c.members)}"


def missing_message(missing: Sequence[Corpus], raw_dir: str, dirs: Sequence[str] = ()) -> str:
    lines = [f"--raw-dir {raw_dir} lacks {len(missing)} of the corpora needed; give each either as its "
             f"archive or as its extracted files (at their paths inside the archive):"]
    not_found = []
    for c in missing:
        half = [m[0] for m in c.members if find_member(dirs, m)]
        note = f"; found only {half[0]}" if half else ""
        lines.append(f"  {c.name}: {describe(c)}   (from {c.url}{note})")
        not_found += [c.archive] + [m[0] for m in c.members if m[0] not in half]
    lines.append("not found: " + ", ".join(not_found))
    return "\n".join(lines)


def download(url: str, dest: str, members: Sequence[str] = (), timeout: float = DOWNLOAD_TIMEOUT) -> str:
    """Fetch ``url`` to ``dest`` (via ``dest.part``, renamed when complete), one try.

    Raises :class:`PrepError` naming the URL, the file expected and how to provide it by hand.
    """
    name = os.path.basename(dest)
    part = dest + ".part"
    os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
    log(f"downloading {url} -> {dest}")
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp, open(part, "wb") as out:
            total = int(resp.headers.get("Content-Length") or 0)
            done, next_report, start = 0, 0, time.time()
            while True:
                block = resp.read(1 << 20)
                if not block:
                    break
                out.write(block)
                done += len(block)
                if done >= next_report:
                    pct = f" of {total / 1e6:,.0f} MB ({100 * done / total:.0f}%)" if total else ""
                    log(f"  {name}: {done / 1e6:,.0f} MB{pct}, {done / 1e6 / max(time.time() - start, 1e-3):.1f} MB/s")
                    next_report = done + (100 << 20)
            if total and done != total:
                raise OSError(f"got {done} of {total} bytes")
    except (urllib.error.URLError, OSError, ValueError) as e:
        if os.path.exists(part):
            os.remove(part)
        extracted = f" or its extracted files {', '.join(members)}" if members else ""
        raise PrepError(
            f"could not download {url} ({getattr(e, 'reason', e)}).\n"
            f"Expected file: {name} (to be saved as {dest}).\n"
            f"This machine may have no network access: download it yourself and pass --raw-dir DIR "
            f"containing either the archive {name}{extracted}.") from None
    os.replace(part, dest)
    log(f"  {name}: done, {os.path.getsize(dest) / 1e6:,.1f} MB")
    return dest


def _member_name(name: str) -> str:
    while name.startswith("./"):
        name = name[2:]
    return name.lstrip("/")


def extract_members(archive: str, wanted: Sequence[Sequence[str]], dest: str) -> List[str]:
    """Extract, for each entry of ``wanted`` (accepted paths), the first member found into ``dest``.

    Members are streamed to ``PATH.part`` and renamed when complete; others are not extracted.
    Returns the extracted paths in the order of ``wanted``.
    """
    by_name = {}
    for i, accepted in enumerate(wanted):
        for rank, rel in enumerate(accepted):
            by_name.setdefault(rel, (i, rank))
            by_name.setdefault(os.path.basename(rel), (i, len(accepted) + rank))  # a flat archive
    found: Dict[int, Tuple[int, str]] = {}
    log(f"extracting {', '.join(a[0] for a in wanted)} from {archive}")
    try:
        with tarfile.open(archive, "r:*") as tar:
            for m in tar:
                name = _member_name(m.name)
                if not m.isfile() or name not in by_name:
                    continue
                i, rank = by_name[name]
                if i in found and found[i][0] <= rank:
                    continue
                rel = wanted[i][rank] if rank < len(wanted[i]) else wanted[i][rank - len(wanted[i])]
                path = os.path.join(dest, rel)
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with tar.extractfile(m) as fin, open(path + ".part", "wb") as fout:
                    shutil.copyfileobj(fin, fout, 1 << 20)
                os.replace(path + ".part", path)
                log(f"  {rel}: {os.path.getsize(path) / 1e6:,.1f} MB")
                found[i] = (rank, path)
                if len(found) == len(wanted) and all(r == 0 for r, _ in found.values()):
                    break
    except (tarfile.TarError, OSError, EOFError) as e:
        raise PrepError(f"cannot read the archive {archive}: {e} (a truncated download? delete it and "
                        f"run again)") from None
    lacking = [a[0] for i, a in enumerate(wanted) if i not in found]
    if lacking:
        raise PrepError(f"the archive {archive} does not contain {', '.join(lacking)}")
    return [found[i][1] for i in range(len(wanted))]


def fetch(pair: str, workdir: str, raw_dir: Optional[str]) -> Dict[str, Tuple[str, str]]:
    """Step 1: corpus name -> (src file, tgt file), downloading/extracting into ``WORKDIR/orig``."""
    orig = os.path.join(workdir, "orig")
    corps = corpora(pair)
    if raw_dir is not None and not os.path.isdir(raw_dir):
        raise PrepError(f"--raw-dir {raw_dir} is not a directory")
    dirs = ([os.path.abspath(raw_dir)] if raw_dir else []) + [orig]
    extracted, archives, missing = locate_inputs(corps, dirs)
    if missing and raw_dir:
        raise PrepError(missing_message(missing, raw_dir, dirs))
    if missing:  # no --raw-dir: download what is not in WORKDIR/orig yet
        log(f"to download into {orig}: {', '.join(c.archive for c in missing)}")
    for i, c in enumerate(missing):
        try:
            archives[c.name] = download(c.url, os.path.join(orig, c.archive), [m[0] for m in c.members])
        except PrepError as e:
            rest = "".join(f"\n  {d.url}  ({describe(d)})" for d in missing[i:])
            raise PrepError(f"{e}\nStill needed, each as an archive or as its extracted files:{rest}\n"
                            f"(with --raw-dir every corpus must be there, or already in {orig})") from None
    for c in corps:
        if c.name in extracted:
            log(f"{c.name}: using {extracted[c.name][0]} and {extracted[c.name][1]}")
        else:
            extracted[c.name] = tuple(extract_members(archives[c.name], c.members, orig))
    return {c.name: extracted[c.name] for c in corps}


# --------------------------------------------------------------------------------------------
# step 2: read and clean


def open_text(path: str):
    """A text file (gunzipped if ``.gz``), split on ``\\n`` only (not on U+2028, ``\\r``, ...)."""
    if path.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace", newline="\n")
    return open(path, encoding="utf-8", errors="replace", newline="\n")


def normalise(line: str) -> str:
    """Whitespace runs (any Unicode whitespace, line separators included) become one space; stripped."""
    return " ".join(line.split())


_SEG = re.compile(r"<seg\b[^>]*>(.*?)</seg\s*>", re.S | re.I)
_SEG_OPEN = re.compile(r"<seg\b", re.I)


def read_sgm(path: str) -> List[str]:
    """Every ``<seg id="...">text</seg>`` of an sgm file, XML entities unescaped, whitespace normalised."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    segs = [normalise(html.unescape(m.group(1))) for m in _SEG.finditer(text)]
    opened = len(_SEG_OPEN.findall(text))
    if opened != len(segs):
        raise PrepError(f"{path}: {opened} <seg> tags but {len(segs)} well-formed <seg>...</seg> segments")
    return segs


def read_parallel(src_path: str, tgt_path: str) -> Iterator[Tuple[str, str]]:
    """Line pairs of two aligned files; raises :class:`PrepError` when their line counts differ."""
    n = 0
    with open_text(src_path) as fs, open_text(tgt_path) as ft:
        for s, t in zip_longest(fs, ft):
            if s is None or t is None:
                rest_s = sum(1 for _ in fs) + (s is not None)
                rest_t = sum(1 for _ in ft) + (t is not None)
                raise PrepError(f"{src_path} has {n + rest_s} lines but {tgt_path} has {n + rest_t}: "
                                f"they must be line-aligned")
            n += 1
            yield s, t


def read_eval_pairs(c: Corpus, src_path: str, tgt_path: str) -> List[Tuple[str, str]]:
    """All segments of a valid/test set (never filtered); the two sides must have the same count."""
    if c.sgm:
        src, tgt = read_sgm(src_path), read_sgm(tgt_path)
        if len(src) != len(tgt):
            raise PrepError(f"{src_path} has {len(src)} segments but {tgt_path} has {len(tgt)}")
        return list(zip(src, tgt))
    return [(normalise(s), normalise(t)) for s, t in read_parallel(src_path, tgt_path)]


def progress(items: Iterable, name: str, every: int = 1_000_000) -> Iterator:
    """``items`` unchanged, logging a count every ``every`` items."""
    n = 0
    for n, item in enumerate(items, 1):
        if n % every == 0:
            log(f"  {name}: {n:,} pairs read")
        yield item


DROP_REASONS = ("empty", "too long", "ratio", "long word")


def clean_pair(src: str, tgt: str, max_len: int = 250, ratio: float = 1.5) -> Tuple[str, str, Optional[str]]:
    """``(src, tgt, reason)``: the normalised pair and why it is dropped (``None``: kept).

    The rules of Moses ``clean-corpus-n.perl -ratio RATIO ... 1 MAX_LEN``: at least 1 and at most
    ``max_len`` words on each side, word-count ratio at most ``ratio`` both ways, no word of more
    than 1000 characters.
    """
    src, tgt = normalise(src), normalise(tgt)
    ns, nt = len(src.split()), len(tgt.split())
    if ns == 0 or nt == 0:
        return src, tgt, "empty"
    if ns > max_len or nt > max_len:
        return src, tgt, "too long"
    if ns / nt > ratio or nt / ns > ratio:
        return src, tgt, "ratio"
    if max(map(len, src.split())) > MAX_WORD_CHARS or max(map(len, tgt.split())) > MAX_WORD_CHARS:
        return src, tgt, "long word"
    return src, tgt, None


def clean_pairs(pairs: Iterable[Tuple[str, str]], stats: Counter, max_len: int = 250,
                ratio: float = 1.5) -> Iterator[Tuple[str, str]]:
    """The kept pairs of ``pairs``; ``stats`` counts ``pairs``, ``kept`` and each drop reason."""
    for s, t in pairs:
        stats["pairs"] += 1
        s, t, reason = clean_pair(s, t, max_len, ratio)
        if reason is None:
            stats["kept"] += 1
            yield s, t
        else:
            stats[reason] += 1


def format_stats(name: str, stats: Counter) -> str:
    dropped = ", ".join(f"{r} {stats[r]:,}" for r in DROP_REASONS)
    return f"{name}: {stats['pairs']:,} pairs, kept {stats['kept']:,} (dropped: {dropped})"


class PairWriter:
    """Writes ``PREFIX.SRC``/``PREFIX.TGT`` via ``.part`` files, renamed on :meth:`commit`."""

    def __init__(self, prefix: str, src: str, tgt: str):
        self.paths = [f"{prefix}.{src}", f"{prefix}.{tgt}"]
        self.files = [open(p + ".part", "w", encoding="utf-8", newline="\n") for p in self.paths]
        self.n = 0

    def write(self, s: str, t: str):
        self.files[0].write(s + "\n")
        self.files[1].write(t + "\n")
        self.n += 1

    def commit(self):
        for f, p in zip(self.files, self.paths):
            f.close()
            os.replace(p + ".part", p)


def clean(pair: str, workdir: str, inputs: Dict[str, Tuple[str, str]], max_len: int, ratio: float) -> Dict[str, int]:
    """Step 2: ``WORKDIR/raw/{train,valid,test}.{SRC,TGT}``; returns the pairs per split."""
    src, tgt = pair.split("-")
    raw = os.path.join(workdir, "raw")
    os.makedirs(raw, exist_ok=True)
    counts = {}
    writer = PairWriter(os.path.join(raw, "train"), src, tgt)
    total = Counter()
    for c in corpora(pair):
        if c.split != "train":
            continue
        stats = Counter()
        log(f"cleaning {c.name} ({inputs[c.name][0]}, {inputs[c.name][1]})")
        for s, t in clean_pairs(progress(read_parallel(*inputs[c.name]), c.name), stats, max_len, ratio):
            writer.write(s, t)
        log("  " + format_stats(c.name, stats))
        total.update(stats)
    writer.commit()
    log(format_stats("train (all corpora)", total))
    if total["kept"] == 0:
        raise PrepError("no training pair is left after cleaning")
    counts["train"] = total["kept"]
    for c in corpora(pair):
        if c.split == "train":
            continue
        pairs = read_eval_pairs(c, *inputs[c.name])
        writer = PairWriter(os.path.join(raw, c.split), src, tgt)
        for s, t in pairs:
            writer.write(s, t)
        writer.commit()
        counts[c.split] = len(pairs)
        log(f"{c.split} = {c.name}: {len(pairs):,} pairs, all kept (valid and test sets are never filtered)")
    return counts


# --------------------------------------------------------------------------------------------
# step 3: sentencepiece


def train_spm(inputs: Sequence[str], prefix: str, vocab_size: int, input_sentence_size: int, threads: int) -> str:
    """A joint unigram sentencepiece model ``PREFIX.model`` learnt on the ``inputs`` files."""
    os.makedirs(os.path.dirname(prefix), exist_ok=True)
    log(f"training a {vocab_size:,}-piece unigram sentencepiece model on {' + '.join(inputs)} "
        f"(sampling at most {input_sentence_size:,} sentences; tens of minutes on the full corpus)")
    try:
        return train_sentencepiece(
            prefix, input=",".join(inputs), vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, input_sentence_size=input_sentence_size, shuffle_input_sentence=True,
            num_threads=max(1, threads), minloglevel=1)
    except RuntimeError as e:
        if "vocab" in str(e).lower():
            raise PrepError(f"sentencepiece cannot learn {vocab_size} pieces from this training corpus ({e}); "
                            f"pass a smaller --spm-vocab-size") from None
        raise PrepError(f"sentencepiece training failed: {e}") from None


def encode_file(sp, src_path: str, dst_path: str, threads: int, chunk: int = 100_000) -> int:
    """Encode a text file line by line into space-separated pieces (via ``.part``); returns the line count."""
    n = 0
    with open_text(src_path) as fin, open(dst_path + ".part", "w", encoding="utf-8", newline="\n") as fout:
        while True:
            lines = [line.rstrip("\n") for _, line in zip(range(chunk), fin)]
            if not lines:
                break
            for pieces in sp.encode(lines, out_type=str, num_threads=max(1, threads)):
                fout.write(" ".join(pieces) + "\n")
            n += len(lines)
            if n % 1_000_000 == 0:
                log(f"  {os.path.basename(src_path)}: {n:,} lines encoded")
    os.replace(dst_path + ".part", dst_path)
    return n


def sentencepiece_step(pair: str, workdir: str, vocab_size: int, input_sentence_size: int, workers: int) -> int:
    """Step 3: ``WORKDIR/spm/spm.model`` and ``WORKDIR/spm/{train,valid,test}.{SRC,TGT}``; returns the size."""
    import sentencepiece as spm

    src, tgt = pair.split("-")
    raw, out = os.path.join(workdir, "raw"), os.path.join(workdir, "spm")
    model = train_spm([os.path.join(raw, f"train.{src}"), os.path.join(raw, f"train.{tgt}")],
                      os.path.join(out, "spm"), vocab_size, input_sentence_size, workers)
    sp = spm.SentencePieceProcessor(model_file=model)
    log(f"sentencepiece model {model}: {sp.get_piece_size():,} pieces")
    for split in ("train", "valid", "test"):
        for lang in (src, tgt):
            n = encode_file(sp, os.path.join(raw, f"{split}.{lang}"), os.path.join(out, f"{split}.{lang}"), workers)
            log(f"  encoded {split}.{lang}: {n:,} lines")
    return sp.get_piece_size()


# --------------------------------------------------------------------------------------------
# step 4: fairseq-preprocess


def preprocess_command(pair: str, workdir: str, workers: int, destdir: Optional[str] = None) -> List[str]:
    src, tgt = pair.split("-")
    spm_dir = os.path.join(workdir, "spm")
    exe = shutil.which("fairseq-preprocess")
    cmd = [exe] if exe else [sys.executable, "-m", "fairseq_cli.preprocess"]
    return cmd + ["--source-lang", src, "--target-lang", tgt, "--joined-dictionary",
                  "--trainpref", os.path.join(spm_dir, "train"), "--validpref", os.path.join(spm_dir, "valid"),
                  "--testpref", os.path.join(spm_dir, "test"),
                  "--destdir", destdir or os.path.join(workdir, "data-bin"), "--workers", str(workers)]


def binarise(pair: str, workdir: str, workers: int) -> str:
    """Step 4: ``fairseq-preprocess`` into ``WORKDIR/data-bin`` (built as ``WORKDIR/.data-bin.part``,
    renamed when complete), logged to ``WORKDIR/preprocess.log``."""
    dest = os.path.join(workdir, "data-bin")
    part = os.path.join(workdir, ".data-bin.part")
    shutil.rmtree(part, ignore_errors=True)  # fairseq-preprocess refuses to overwrite a dictionary
    cmd = preprocess_command(pair, workdir, workers, destdir=part)
    log_path = os.path.join(workdir, "preprocess.log")
    log(f"running {shlex.join(cmd)} (log: {log_path})")
    with open(log_path, "w") as f:
        rc = subprocess.call(cmd, stdout=f, stderr=subprocess.STDOUT)
    if rc != 0:
        shutil.rmtree(part, ignore_errors=True)
        with open(log_path, errors="replace") as f:
            tail = "".join(f.readlines()[-30:])
        raise PrepError(f"fairseq-preprocess failed (exit {rc}); the end of {log_path}:\n{tail}")
    if os.path.isdir(dest):
        shutil.rmtree(dest)  # this step's own earlier output (redone: see check_workdir)
    os.rename(part, dest)
    return dest


# --------------------------------------------------------------------------------------------
# steps, markers, CLI


class Steps:
    """Runs each step unless its marker says it is done with the same options and its outputs exist."""

    def __init__(self, workdir: str):
        self.dir = os.path.join(workdir, ".done")
        os.makedirs(self.dir, exist_ok=True)
        self.dirty = False  # a step ran in this invocation: every later step runs too

    def run(self, name: str, config: dict, fn, outputs=lambda result: ()):
        marker = os.path.join(self.dir, name)
        if not self.dirty and os.path.exists(marker):
            with open(marker) as f:
                saved = json.load(f)
            if saved.get("config") == config and all(os.path.exists(p) for p in outputs(saved["result"])):
                log(f"skip: {name} (done)")
                return saved["result"]
            log(f"redo: {name} (options changed or outputs missing)")
        elif self.dirty and os.path.exists(marker):
            log(f"redo: {name} (an earlier step was redone)")
        if os.path.exists(marker):
            os.remove(marker)
        self.dirty = True
        start = time.time()
        log(f"step {name} ...")
        result = fn()
        with open(marker + ".part", "w") as f:
            json.dump({"config": config, "result": result}, f, indent=1)
        os.replace(marker + ".part", marker)
        log(f"step {name} done in {time.time() - start:,.0f} s")
        return result


def count_lines(path: str) -> int:
    with open(path, "rb") as f:
        return sum(1 for _ in f)


def default_workers() -> int:
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:
        n = os.cpu_count() or 1
    return max(1, min(n, 16))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-prepare-wmt14", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--pair", required=True, choices=PAIRS, help="en-de: English->German; en-fr: English->French")
    p.add_argument("--workdir", required=True, help="where orig/, raw/, spm/, data-bin/ are written")
    p.add_argument("--raw-dir", default=None,
                   help="use the archives or extracted files in this directory instead of downloading")
    p.add_argument("--spm-vocab-size", type=int, default=32000,
                   help="joint sentencepiece vocabulary (default 32000: 32k joint, as in common WMT14 setups)")
    p.add_argument("--spm-input-sentence-size", type=int, default=10_000_000,
                   help="sentences sampled (shuffled) from train src+tgt to learn sentencepiece (default 10M)")
    p.add_argument("--workers", type=int, default=default_workers(),
                   help="threads/processes for sentencepiece and fairseq-preprocess (default: CPUs, at most 16)")
    p.add_argument("--max-len", type=int, default=250, help="drop training pairs with more words on a side")
    p.add_argument("--ratio", type=float, default=1.5, help="drop training pairs with a larger word-count ratio")
    p.add_argument("--force", action="store_true",
                   help="redo the steps whose options changed (replacing their outputs and every later step's)")
    args = p.parse_args(argv)
    if args.spm_vocab_size < 10:
        p.error("--spm-vocab-size must be at least 10")
    if args.max_len < 1 or args.ratio < 1 or args.workers < 1:
        p.error("--max-len and --workers must be >= 1, --ratio >= 1")
    return args


def step_configs(args: argparse.Namespace, raw_dir: Optional[str]) -> Dict[str, dict]:
    """The options each step depends on (a step whose options changed is redone)."""
    return {"fetch": {"pair": args.pair, "raw_dir": raw_dir},
            "clean": {"pair": args.pair, "max_len": args.max_len, "ratio": args.ratio},
            "spm": {"pair": args.pair, "vocab_size": args.spm_vocab_size,
                    "input_sentence_size": args.spm_input_sentence_size},
            "binarise": {"pair": args.pair}}


def check_workdir(workdir: str, configs: Dict[str, dict], force: bool):
    """Before any step: the work dir's outputs are this tool's, and done steps whose options changed
    are redone (their outputs and every later step's replaced) only with ``force``."""
    done_dir = os.path.join(workdir, ".done")
    if not os.path.isdir(done_dir):
        foreign = [d for d in ("raw", "spm", "data-bin") if os.path.exists(os.path.join(workdir, d))]
        if foreign:
            raise PrepError(f"--workdir {workdir}: {', '.join(foreign)} exist but were not written by "
                            f"fairseq-pe-prepare-wmt14 (no {done_dir}); choose another --workdir")
        return
    changed = []
    for name in STEPS:
        marker = os.path.join(done_dir, name)
        if not os.path.exists(marker):
            continue
        try:
            with open(marker) as f:
                saved = json.load(f).get("config")
        except (OSError, ValueError, AttributeError):
            continue  # unreadable: that step is redone anyway
        if saved != configs[name]:
            changed += [f"{name}: {key} {saved.get(key)!r} there, {configs[name].get(key)!r} now"
                        for key in sorted(set(saved or {}) | set(configs[name]))
                        if (saved or {}).get(key) != configs[name].get(key)]
    if changed and not force:
        raise PrepError(f"--workdir {workdir} was prepared with other options ({'; '.join(changed)}): redoing "
                        "those steps replaces raw/, spm/ and data-bin/ (which trained models depend on); pass "
                        "--force to redo them, or choose another --workdir")


def prepare(args: argparse.Namespace) -> None:
    workdir = os.path.abspath(args.workdir)
    src, tgt = args.pair.split("-")
    raw_dir = os.path.abspath(args.raw_dir) if args.raw_dir else None
    configs = step_configs(args, raw_dir)
    check_workdir(workdir, configs, getattr(args, "force", False))
    os.makedirs(workdir, exist_ok=True)
    log(f"WMT14 {args.pair} ({src} -> {tgt}) in {workdir}" + (f", inputs from {raw_dir}" if raw_dir else ""))
    steps = Steps(workdir)

    def split_files(d, splits=("train", "valid", "test")):
        return [os.path.join(workdir, d, f"{s}.{lang}") for s in splits for lang in (src, tgt)]

    inputs = steps.run("fetch", configs["fetch"],
                       lambda: fetch(args.pair, workdir, raw_dir),
                       outputs=lambda r: [p for paths in r.values() for p in paths])
    counts = steps.run("clean", configs["clean"],
                       lambda: clean(args.pair, workdir, inputs, args.max_len, args.ratio),
                       outputs=lambda r: split_files("raw"))
    size = steps.run("spm", configs["spm"],
                     lambda: sentencepiece_step(args.pair, workdir, args.spm_vocab_size,
                                                args.spm_input_sentence_size, args.workers),
                     outputs=lambda r: split_files("spm") + [os.path.join(workdir, "spm", "spm.model")])
    dest = steps.run("binarise", configs["binarise"], lambda: binarise(args.pair, workdir, args.workers),
                     outputs=lambda r: [os.path.join(r, f"dict.{src}.txt")] + [
                         os.path.join(r, f"{s}.{src}-{tgt}.{lang}.{ext}") for s in ("train", "valid", "test")
                         for lang in (src, tgt) for ext in ("bin", "idx")])

    dict_size = count_lines(os.path.join(dest, f"dict.{src}.txt"))
    log("summary:")
    for split in ("train", "valid", "test"):
        log(f"  {split:5s}: {counts[split]:,} pairs  ({os.path.join(workdir, 'raw', split)}.{{{src},{tgt}}})")
    log(f"  sentencepiece: {size:,} pieces ({os.path.join(workdir, 'spm', 'spm.model')}); "
        f"fairseq joined dictionary: {dict_size:,} entries + 4 specials")
    log(f"  data-bin: {dest}")
    log("next:")
    print(f"fairseq-train {shlex.quote(dest)} --user-dir {shlex.quote(PLUGIN_DIR)} --arch transformer_pe_wmt_en_de "
          f"--share-all-embeddings --optimizer adam --adam-betas '(0.9, 0.98)' --clip-norm 0.0 --lr 7e-4 "
          f"--lr-scheduler inverse_sqrt --warmup-updates 4000 --dropout 0.1 --criterion label_smoothed_cross_entropy "
          f"--label-smoothing 0.1 --max-tokens 4096 --save-dir checkpoints/wmt14_{src}_{tgt}", flush=True)


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`PrepError` ends as ``fairseq-pe-prepare-wmt14: error: ...``, status 2."""
    args = parse_args(argv)
    try:
        prepare(args)
    except KeyboardInterrupt:
        print("fairseq-pe-prepare-wmt14: interrupted; run the same command again to resume", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
