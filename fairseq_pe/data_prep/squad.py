"""``fairseq-pe-prepare-squad``: SQuAD v1.1 / v2.0 JSON -> binarised span-prediction features.

Usage::

    fairseq-pe-prepare-squad --train train-v1.1.json --valid dev-v1.1.json [--test FILE] \\
        --spm-model DIR/spm.model --dict DIR/dict.txt --destdir squad-bin \\
        [--max-length 512] [--doc-stride 128] [--max-query-length 64] [--version auto|1.1|2.0] \\
        [--workers N]

``--spm-model`` and ``--dict`` are those of the pretrained model (``fairseq-pe-prepare-mono`` writes
``DIR/spm.model`` and ``DIR/dict.txt``): the dictionary is used as it is (fairseq's ``srcdict``),
never rebuilt, and copied to ``DEST/input0/dict.txt``.

**Features** follow RoBERTa's sentence-pair layout (fairseq's convention, as in its SQuAD and GLUE
fine-tuning)::

    <s> question </s> </s> context-window </s>

The specials are written into the binarised data: index 0 of every feature is ``<s>``
(``Dictionary.bos()``), the token the ``masked_lm`` task prepends in pretraining, so the
``span_prediction`` task adds nothing and its labels index the stored sequence directly.  A
feature has at most ``--max-length`` tokens, specials included.

**Windows** (BERT's ``run_squad.py``): a context longer than the room left by its question
(``--max-length`` - question pieces - 4) is cut into windows of at most that many pieces, the window
starts ``--doc-stride`` pieces apart (consecutive windows overlap by room - stride pieces), the
last one ending at the end of the context.  Each question yields one feature per window.  For every
context piece the window where it has the most context on both sides (BERT's "max context":
min(left, right) + 0.01 * window length) is recorded; predictions only start at such pieces.

**Labels** (``DEST/SPLIT.spans``, ``start end`` per feature, positions in the feature): the pieces
covering the first gold answer when it lies wholly inside the window, else ``0 0`` (the ``<s>``
position), as BERT does; an answer cut by a window boundary is ``0 0`` in that window.  Impossible
questions (v2.0 ``is_impossible``) are ``0 0`` in every window.  A gold answer whose characters do
not start or end at a piece boundary (``1990s`` inside the piece ``▁1990s,``, say) is labelled with
the covering pieces and counted.  A gold answer whose ``answer_start`` does not point at its text
is an error naming the file and the question.

**Character offsets** come from sentencepiece itself (``encode(..., out_type="offset_mapping")``,
or ``immutable_proto`` on versions without it): each piece's span in the original context, with
the whitespace a ``▁`` piece absorbs trimmed off.  ``DEST/SPLIT.features.jsonl`` holds, per
feature (line i = feature i of the binarised split): the question id, the feature's index among its
question's windows, the position of its first context piece (``context_start``), the window's
first piece in the whole context (``doc_start``), the trimmed character span of every context piece
in the window (``offsets``), the max-context flags, and the context's length and SHA-1 prefix so
that ``fairseq-pe-squad-predict`` can check it maps into the same context.

**Questions** longer than ``--max-query-length`` pieces are an error that lists them: nothing is
truncated.  The question is not shortened by the windows either: its room is subtracted from the
context's.

Outputs: ``DEST/input0/{SPLIT}.{bin,idx}`` (fairseq ``mmap`` indexed dataset, as
``fairseq-preprocess`` writes), ``DEST/input0/dict.txt``, ``DEST/SPLIT.spans``,
``DEST/SPLIT.features.jsonl`` and ``DEST/prepare.json`` (options and counts).  Every split's counts
are printed: questions, impossible ones, features, windows per question, answers not wholly inside
any window, answers not on piece boundaries, pieces that the dictionary maps to ``<unk>``.  Every
file is written atomically, ``prepare.json`` last (it says the run is complete); the files of an
earlier run are replaced only with ``--force``, and never an input.
"""

import argparse
import hashlib
import json
import multiprocessing
import os
import shutil
import sys
from collections import Counter
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import atomic_path, check_new_files, same_file, write_json

SPLITS = ("train", "valid", "test")
N_SPECIAL = 4  # <s> q </s> </s> c </s>
UNK_FRACTION_LIMIT = 0.10
STAT_KEYS = ("questions", "impossible questions", "features", "features labelled (0, 0)", "gold answers",
             "gold answers not on piece boundaries (covering pieces used)",
             "labelled answers not on piece boundaries (covering pieces used)",
             "answerable questions whose answer is inside no window", "context pieces", "context pieces -> <unk>",
             "question pieces", "question pieces -> <unk>", "longest question (pieces)")


class SquadPrepError(UserError):
    """Bad input: the message names the flag or the file."""


def log(msg: str):
    print(f"[prepare-squad] {msg}", flush=True)


# ---------------------------------------------------------------------------------------------
# reading SQuAD files


def load_squad(path: str) -> dict:
    """The parsed JSON of a SQuAD file (``{"version": ..., "data": [articles]}``)."""
    if not os.path.isfile(path):
        raise SquadPrepError(f"SQuAD file not found: {path}")
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise SquadPrepError(f"{path} is not valid JSON: {e}") from e
    if not isinstance(data, dict) or not isinstance(data.get("data"), list):
        raise SquadPrepError(f"{path} is not a SQuAD file: no top-level \"data\" list of articles")
    return data


def detect_version(data: dict) -> str:
    """``"2.0"`` if any question has ``is_impossible`` or the file says ``v2.0``, else ``"1.1"``."""
    for article in data["data"]:
        for p in article.get("paragraphs", ()):
            for qa in p.get("qas", ()):
                if "is_impossible" in qa:
                    return "2.0"
    return "2.0" if str(data.get("version", "")).lstrip("v").startswith("2") else "1.1"


def iter_paragraphs(data: dict, path: str) -> Iterator[dict]:
    for a, article in enumerate(data["data"]):
        paragraphs = article.get("paragraphs")
        if not isinstance(paragraphs, list):
            raise SquadPrepError(f"{path}: article {a} has no \"paragraphs\" list")
        for p in paragraphs:
            if not isinstance(p.get("context"), str) or not isinstance(p.get("qas"), list):
                raise SquadPrepError(f"{path}: a paragraph of article {a} lacks \"context\" or \"qas\"")
            yield p


def context_fingerprint(context: str) -> str:
    return hashlib.sha1(context.encode("utf-8")).hexdigest()[:12]


# ---------------------------------------------------------------------------------------------
# sentencepiece with character offsets


def encode_with_offsets(sp, text: str) -> Tuple[List[str], List[Tuple[int, int]]]:
    """Pieces of ``text`` and each piece's character span ``[begin, end)`` in ``text``.

    The spans are sentencepiece's own (``out_type="offset_mapping"``; ``immutable_proto`` on older
    versions), so they survive its normalisation (NFKC, whitespace folding); a ``▁`` piece's span
    includes the whitespace it stands for.
    """
    try:
        res = sp.encode(text, out_type="offset_mapping")
        pieces, spans = list(res["pieces"]), [tuple(o) for o in res["offsets"]]
    except (ValueError, TypeError, KeyError):
        proto = sp.encode(text, out_type="immutable_proto")
        pieces = [p.piece for p in proto.pieces]
        spans = [(p.begin, p.end) for p in proto.pieces]
    last = 0
    for piece, (b, e) in zip(pieces, spans):
        if not (0 <= b <= e <= len(text)) or b < last:
            raise RuntimeError(f"sentencepiece gave the piece {piece!r} the span ({b}, {e}) in a text of "
                               f"{len(text)} characters, out of order: character offsets unusable")
        last = b
    return pieces, spans


def trim_spans(text: str, spans: Sequence[Tuple[int, int]]) -> List[Tuple[int, int]]:
    """Each span without leading/trailing whitespace; a whitespace-only span becomes ``(end, end)``."""
    out = []
    for b, e in spans:
        while b < e and text[b].isspace():
            b += 1
        while e > b and text[e - 1].isspace():
            e -= 1
        out.append((b, e))
    return out


def char_span_to_pieces(spans: Sequence[Tuple[int, int]], start: int, end: int) -> Optional[Tuple[int, int, bool]]:
    """The first and last piece overlapping characters ``[start, end)``, and whether they align.

    ``spans`` are trimmed piece spans; empty (whitespace) pieces are never chosen.  ``aligned`` is
    True when the first piece begins at ``start`` and the last one ends at ``end``.  None if no
    piece overlaps.
    """
    first = last = None
    for i, (b, e) in enumerate(spans):
        if b == e:
            continue
        if e > start and b < end:
            if first is None:
                first = i
            last = i
    if first is None:
        return None
    return first, last, spans[first][0] == start and spans[last][1] == end


# ---------------------------------------------------------------------------------------------
# windows


def doc_windows(n_tokens: int, room: int, stride: int) -> List[Tuple[int, int]]:
    """BERT's doc spans ``(start, length)``: windows of at most ``room`` pieces, starts ``stride`` apart."""
    windows, start = [], 0
    while True:
        length = min(n_tokens - start, room)
        windows.append((start, length))
        if start + length >= n_tokens:
            return windows
        start += min(length, stride)


def max_context_flags(windows: Sequence[Tuple[int, int]]) -> List[List[bool]]:
    """For each window and piece in it: is this the window where the piece has the most context?

    BERT's ``_check_is_max_context``: score = min(left context, right context) + 0.01 * length; the
    first window with the highest score wins.
    """
    best: Dict[int, Tuple[float, int]] = {}
    for w, (start, length) in enumerate(windows):
        for pos in range(start, start + length):
            score = min(pos - start, start + length - 1 - pos) + 0.01 * length
            if pos not in best or score > best[pos][0]:
                best[pos] = (score, w)
    return [[best[pos][1] == w for pos in range(start, start + length)] for w, (start, length) in enumerate(windows)]


# ---------------------------------------------------------------------------------------------
# one paragraph -> features (runs in the workers)

_SP = None
_DICT = None
_OPTS = None


def _init_worker(spm_model: str, dict_path: str, opts: dict):
    global _SP, _DICT, _OPTS
    import sentencepiece as spm
    from fairseq.data import Dictionary

    _SP = spm.SentencePieceProcessor(model_file=spm_model)
    _DICT = Dictionary.load(dict_path)
    _OPTS = opts


def _ids(pieces: Sequence[str]) -> Tuple[List[int], int]:
    unk = _DICT.unk()
    ids = [_DICT.index(p) for p in pieces]
    return ids, sum(1 for i in ids if i == unk)


def process_paragraph(item: Tuple[int, dict]) -> Tuple[list, Counter, List[Tuple[str, int]]]:
    """Features of every question of one paragraph, with counts and the too-long questions.

    A feature is ``(tokens, (start, end), qid, window, n_windows, metadata JSON line)``.
    """
    p_index, paragraph = item
    path, version = _OPTS["path"], _OPTS["version"]
    max_length, stride, max_q = _OPTS["max_length"], _OPTS["doc_stride"], _OPTS["max_query_length"]
    stats: Counter = Counter()
    too_long: List[Tuple[str, int]] = []
    context = paragraph["context"]
    pieces, raw_spans = encode_with_offsets(_SP, context)
    if not pieces:
        raise SquadPrepError(f"{path}: paragraph {p_index} has an empty context")
    spans = trim_spans(context, raw_spans)
    ctx_ids, ctx_unk = _ids(pieces)
    stats["context pieces"] += len(ctx_ids)
    stats["context pieces -> <unk>"] += ctx_unk
    fingerprint = context_fingerprint(context)
    bos, eos = _DICT.bos(), _DICT.eos()
    features = []
    by_room: Dict[int, list] = {}
    for qa in paragraph["qas"]:
        qid = qa.get("id")
        if not isinstance(qid, str) or not isinstance(qa.get("question"), str):
            raise SquadPrepError(f"{path}: a question of paragraph {p_index} lacks \"id\" or \"question\"")
        impossible = bool(qa.get("is_impossible", False))
        if impossible and version == "1.1":
            raise SquadPrepError(f"{path}: question {qid} is marked is_impossible but --version is 1.1")
        q_pieces, _ = encode_with_offsets(_SP, qa["question"])
        q_ids, q_unk = _ids(q_pieces)
        stats["questions"] += 1
        stats["question pieces"] += len(q_ids)
        stats["question pieces -> <unk>"] += q_unk
        stats["longest question (pieces)"] = max(stats["longest question (pieces)"], len(q_ids))
        if not q_ids:
            raise SquadPrepError(f"{path}: question {qid} is empty")
        if len(q_ids) > max_q:
            too_long.append((qid, len(q_ids)))
            continue
        answers = qa.get("answers") or []
        gold = None  # (first piece, last piece) of the labelled answer in the whole context
        if impossible:
            stats["impossible questions"] += 1
        else:
            if not answers:
                raise SquadPrepError(f"{path}: question {qid} has no answers and is not is_impossible")
            for k, ans in enumerate(answers):
                text, a0 = ans.get("text"), ans.get("answer_start")
                if not isinstance(text, str) or not isinstance(a0, int):
                    raise SquadPrepError(f"{path}: answer {k} of question {qid} lacks \"text\" or \"answer_start\"")
                if context[a0:a0 + len(text)] != text:
                    raise SquadPrepError(f"{path}: answer {k} of question {qid}: answer_start {a0} does not point at "
                                         f"its text {text!r} (the context has {context[a0:a0 + len(text)]!r} there)")
                # the answer's own whitespace is not part of the span
                lead = len(text) - len(text.lstrip())
                a1 = a0 + len(text.rstrip())
                a0 += lead
                mapped = char_span_to_pieces(spans, a0, a1) if a1 > a0 else None
                if mapped is None:
                    raise SquadPrepError(f"{path}: answer {k} of question {qid} ({text!r}) covers no piece of the "
                                         f"context")
                stats["gold answers"] += 1
                if not mapped[2]:
                    stats["gold answers not on piece boundaries (covering pieces used)"] += 1
                if k == 0:
                    gold = mapped[:2]
                    if not mapped[2]:
                        stats["labelled answers not on piece boundaries (covering pieces used)"] += 1
        room = max_length - len(q_ids) - N_SPECIAL
        if room not in by_room:  # the windows depend on the question only through its length
            windows = doc_windows(len(ctx_ids), room, stride)
            flags = max_context_flags(windows)
            by_room[room] = [(start, length, json.dumps(spans[start:start + length], separators=(",", ":")),
                              json.dumps([int(f) for f in mc], separators=(",", ":")))
                             for (start, length), mc in zip(windows, flags)]
        windows = by_room[room]
        context_start = len(q_ids) + 3
        inside_any = False
        for w, (start, length, offsets_json, flags_json) in enumerate(windows):
            tokens = [bos] + q_ids + [eos, eos] + ctx_ids[start:start + length] + [eos]
            assert len(tokens) <= max_length
            label = (0, 0)
            if gold is not None and start <= gold[0] and gold[1] < start + length:
                label = (gold[0] - start + context_start, gold[1] - start + context_start)
                inside_any = True
            stats["features"] += 1
            stats["features labelled (0, 0)"] += label == (0, 0)
            meta = (f'{{"qid":{json.dumps(qid)},"feature":{w},"n_features":{len(windows)},'
                    f'"context_start":{context_start},"doc_start":{start},"offsets":{offsets_json},'
                    f'"max_context":{flags_json},"context_chars":{len(context)},"context_sha1":"{fingerprint}"}}')
            features.append((tokens, label, qid, w, len(windows), meta))
        if gold is not None and not inside_any:
            stats["answerable questions whose answer is inside no window"] += 1
    return features, stats, too_long


# ---------------------------------------------------------------------------------------------
# a split


def prepare_split(name: str, path: str, args: argparse.Namespace, version: str, dictionary) -> Counter:
    from fairseq.data import indexed_dataset
    import torch

    data = load_squad(path)
    file_version = detect_version(data)
    if version == "1.1" and file_version == "2.0":
        raise SquadPrepError(f"{path} holds SQuAD 2.0 (is_impossible questions) but --version is 1.1")
    paragraphs = list(enumerate(iter_paragraphs(data, path)))
    opts = dict(path=path, version=version, max_length=args.max_length, doc_stride=args.doc_stride,
                max_query_length=args.max_query_length)
    input0 = os.path.join(args.destdir, "input0")
    bin_path, idx_path = os.path.join(input0, f"{name}.bin"), os.path.join(input0, f"{name}.idx")
    spans_path = os.path.join(args.destdir, f"{name}.spans")
    meta_path = os.path.join(args.destdir, f"{name}.features.jsonl")
    stats: Counter = Counter()
    too_long: List[Tuple[str, int]] = []
    windows_per_q: Counter = Counter()
    seen_ids = set()

    if args.workers > 1:
        pool = multiprocessing.get_context("fork" if hasattr(os, "fork") else "spawn").Pool(
            args.workers, initializer=_init_worker, initargs=(args.spm_model, args.dict, opts))
        results = pool.imap(process_paragraph, paragraphs, chunksize=8)
    else:
        pool = None
        _init_worker(args.spm_model, args.dict, opts)
        results = map(process_paragraph, paragraphs)

    builder = indexed_dataset.make_builder(bin_path + ".tmp", impl="mmap", vocab_size=len(dictionary))
    done = False
    try:
        with open(spans_path + ".tmp", "w", encoding="utf-8") as spans_f, \
                open(meta_path + ".tmp", "w", encoding="utf-8") as meta_f:
            for features, s, long_q in results:
                stats.update({k: v for k, v in s.items() if k != "longest question (pieces)"})
                stats["longest question (pieces)"] = max(stats["longest question (pieces)"],
                                                         s["longest question (pieces)"])
                too_long.extend(long_q)
                for tokens, (start, end), qid, w, n_windows, meta in features:
                    if w == 0:
                        if qid in seen_ids:
                            raise SquadPrepError(f"{path}: question id {qid} occurs twice")
                        seen_ids.add(qid)
                        windows_per_q[n_windows] += 1
                    builder.add_item(torch.IntTensor(tokens))
                    spans_f.write(f"{start} {end}\n")
                    meta_f.write(meta + "\n")
        if too_long:
            too_long.sort(key=lambda x: -x[1])
            shown = ", ".join(f"{q} ({n})" for q, n in too_long[:10])
            raise SquadPrepError(
                f"{path}: {len(too_long)} question(s) have more than --max-query-length {args.max_query_length} "
                f"pieces (longest {too_long[0][1]}): {shown}{' ...' if len(too_long) > 10 else ''}. Questions are "
                f"never truncated: raise --max-query-length to at least {too_long[0][1]} (at most --max-length - "
                f"{N_SPECIAL + 1} = {args.max_length - N_SPECIAL - 1})")
        builder.finalize(idx_path + ".tmp")
        # the split's four files replace an earlier run's together, at the end
        for p in (bin_path, idx_path, spans_path, meta_path):
            os.replace(p + ".tmp", p)
        done = True
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        if not done:  # an error or an interruption: no half split is left behind
            for p in (bin_path, idx_path, spans_path, meta_path):
                if os.path.exists(p + ".tmp"):
                    os.remove(p + ".tmp")

    n_unk = stats["context pieces -> <unk>"] + stats["question pieces -> <unk>"]
    n_pieces = stats["context pieces"] + stats["question pieces"]
    if n_pieces and n_unk / n_pieces > UNK_FRACTION_LIMIT:
        raise SquadPrepError(f"{100 * n_unk / n_pieces:.1f}% of the pieces of {path} are not in --dict {args.dict}: "
                             f"is it the dictionary of --spm-model {args.spm_model}?")
    for key in STAT_KEYS:
        stats[key] += 0  # present in prepare.json even when 0
    stats["windows per question"] = dict(sorted(windows_per_q.items()))
    return stats


def format_stats(name: str, path: str, stats: Counter) -> str:
    wpq = stats.get("windows per question", {})
    nq = sum(wpq.values())
    mean = sum(k * v for k, v in wpq.items()) / nq if nq else 0.0
    lines = [f"{name}: {path}",
             f"  questions: {stats['questions']} (impossible: {stats['impossible questions']})",
             f"  features: {stats['features']} ({stats['features labelled (0, 0)']} labelled (0, 0))",
             f"  windows per question: mean {mean:.2f}, max {max(wpq) if wpq else 0}; "
             + ", ".join(f"{k}: {v}" for k, v in wpq.items()),
             f"  gold answers: {stats['gold answers']}; not on piece boundaries (covering pieces used): "
             f"{stats['gold answers not on piece boundaries (covering pieces used)']} "
             f"(labelled answers: {stats['labelled answers not on piece boundaries (covering pieces used)']})",
             f"  answerable questions whose answer is inside no window (all features (0, 0)): "
             f"{stats['answerable questions whose answer is inside no window']}",
             f"  pieces -> <unk>: context {stats['context pieces -> <unk>']} of {stats['context pieces']}, "
             f"questions {stats['question pieces -> <unk>']} of {stats['question pieces']}",
             f"  longest question: {stats['longest question (pieces)']} pieces"]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# command line


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-prepare-squad", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    for split in SPLITS:
        p.add_argument(f"--{split}", metavar="JSON", default=None, help=f"SQuAD file of the {split} split")
    p.add_argument("--spm-model", required=True, help="sentencepiece model of the pretrained model")
    p.add_argument("--dict", required=True, help="fairseq dict.txt of the pretrained model (used as it is)")
    p.add_argument("--destdir", required=True, help="output directory")
    p.add_argument("--max-length", type=int, default=512, help="tokens per feature, specials included")
    p.add_argument("--doc-stride", type=int, default=128, help="pieces between the starts of consecutive windows")
    p.add_argument("--max-query-length", type=int, default=64,
                   help="longest question in pieces; a longer one is an error (never truncated)")
    p.add_argument("--version", choices=("auto", "1.1", "2.0"), default="auto",
                   help="SQuAD version; auto: 2.0 if a file has is_impossible questions")
    p.add_argument("--workers", type=int, default=1, help="processes for tokenisation")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --destdir")
    args = p.parse_args(argv)
    if not any(getattr(args, s) for s in SPLITS):
        p.error("give at least one of --train, --valid, --test")
    for flag in ("max_length", "doc_stride", "max_query_length", "workers"):
        if getattr(args, flag) < 1:
            p.error(f"--{flag.replace('_', '-')} must be positive")
    if args.max_query_length > args.max_length - N_SPECIAL - 1:
        p.error(f"--max-query-length {args.max_query_length} leaves no room for the context in --max-length "
                f"{args.max_length} ({N_SPECIAL} specials): it must be at most {args.max_length - N_SPECIAL - 1}")
    for flag in ("spm_model", "dict"):
        if not os.path.isfile(getattr(args, flag)):
            p.error(f"--{flag.replace('_', '-')}: file not found: {getattr(args, flag)}")
    return args


def output_files(args: argparse.Namespace, splits: Sequence[str]) -> List[str]:
    """Every file this run writes into ``--destdir``."""
    d = args.destdir
    out = [os.path.join(d, "input0", "dict.txt"), os.path.join(d, "prepare.json")]
    for name in splits:
        out += [os.path.join(d, "input0", f"{name}.bin"), os.path.join(d, "input0", f"{name}.idx"),
                os.path.join(d, f"{name}.spans"), os.path.join(d, f"{name}.features.jsonl")]
    return out


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`SquadPrepError` ends as ``fairseq-pe-prepare-squad: error: ...``, status 2."""
    args = parse_args(argv)
    from fairseq.data import Dictionary

    try:
        dictionary = Dictionary.load(args.dict)
    except Exception as e:  # noqa: BLE001
        raise SquadPrepError(f"--dict {args.dict} is not a fairseq dictionary: {e}") from None
    splits = [(s, getattr(args, s)) for s in SPLITS if getattr(args, s)]
    dict_out = os.path.join(args.destdir, "input0", "dict.txt")
    reused_dict = os.path.exists(dict_out) and same_file(args.dict, dict_out)  # --dict is DEST's own: kept as is
    outputs = [p for p in output_files(args, [n for n, _ in splits]) if not (reused_dict and p == dict_out)]
    check_new_files(outputs, args.force, flag="--destdir", where=args.destdir,
                    inputs=[(f"--{n}", p) for n, p in splits] + [("--spm-model", args.spm_model),
                                                                 ("--dict", args.dict)])
    created = [p for p in outputs if not os.path.exists(p)]
    try:
        _prepare(args, splits, dictionary, dict_out, reused_dict)
    except BaseException:  # a failed or interrupted run leaves none of the files it created
        for p in created:
            if os.path.isfile(p):
                os.remove(p)
        raise
    return 0


def _prepare(args: argparse.Namespace, splits, dictionary, dict_out: str, reused_dict: bool):
    versions = {}
    for name, path in splits:
        versions[name] = detect_version(load_squad(path))
    version = args.version
    if version == "auto":
        version = "2.0" if "2.0" in versions.values() else "1.1"
    log(f"SQuAD version {version} ({'given' if args.version != 'auto' else 'detected'}); dictionary "
        f"{args.dict}: {len(dictionary)} types; max length {args.max_length}, doc stride {args.doc_stride}, "
        f"max query length {args.max_query_length}")
    os.makedirs(os.path.join(args.destdir, "input0"), exist_ok=True)
    report_path = os.path.join(args.destdir, "prepare.json")
    if os.path.exists(report_path):  # --force: until this run is complete, DEST is not a finished one
        os.remove(report_path)
    if not reused_dict:
        with atomic_path(dict_out) as tmp:
            shutil.copyfile(args.dict, tmp)
    report = {"version": version, "max_length": args.max_length, "doc_stride": args.doc_stride,
              "max_query_length": args.max_query_length, "spm_model": os.path.abspath(args.spm_model),
              "dict": os.path.abspath(args.dict), "layout": "<s> question </s> </s> context </s>",
              "splits": {}}
    for name, path in splits:
        stats = prepare_split(name, path, args, version, dictionary)
        log(format_stats(name, path, stats))
        report["splits"][name] = {"json": os.path.abspath(path), **{k: v for k, v in stats.items()}}
    write_json(report_path, report)
    log(f"done: {args.destdir} (input0/SPLIT.{{bin,idx}}, SPLIT.spans, SPLIT.features.jsonl, prepare.json)")


if __name__ == "__main__":
    sys.exit(main())
