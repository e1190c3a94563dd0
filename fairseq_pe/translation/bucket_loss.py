"""``fairseq-pe-bucket-loss``: teacher-forced loss of the references per source-length bucket and per
target position, for one or more checkpoints of any fairseq translation model.

This is the measure of the length-extrapolation literature (ALiBi, xPos, KERPLE: perplexity against
length).  It stays informative where BLEU is near 0.  Every reference is scored by fairseq's own
:class:`fairseq.sequence_scorer.SequenceScorer`, the scorer of ``fairseq-generate --score-reference``:
the per-token negative log-likelihood, in bits as fairseq reports losses (``perplexity = 2 ** NLL``).
A bucket's NLL is its tokens' mean (its summed NLL over its target tokens, ``</s>`` included), so
that over all sentences it is ``fairseq-validate --criterion cross_entropy``'s loss.

The test set is ``DATA``'s ``--gen-subset`` in fairseq's binary format, or raw text (``--source``
and ``--reference`` with ``--spm-model``, mapped by ``DATA``'s dictionaries).  Each
``--system NAME=CHECKPOINT`` is scored on it; stock ``transformer`` checkpoints too.

Buckets are those of ``fairseq-pe-bucket-bleu`` (``--buckets``): the source length from ``--lengths``
(one integer per line), from the raw ``--source`` (``--unit word`` or ``subword``), or the number
of source tokens the model reads (``--unit token``, ``</s>`` not counted).  The per-position curve
counts target positions from 1 (the first target token; ``</s>`` is the last position); the
training length is marked on it: ``--train-length``, or by default the longest target of ``DATA``'s
train subset when it is there.

Nothing is dropped.  A sentence longer than a model's positions (a learned table: its
``--max-source-positions`` / ``--max-target-positions`` at training) is an error that names it,
unless ``--beyond-table report``: then such sentences are counted in a column of their own,
``beyond the table``, and every bucket that lost some says how many of its sentences it scored.

Output: the tables (stdout and ``--out PREFIX.txt``), ``PREFIX.json`` (per bucket, per position)
and ``PREFIX.png`` (loss against source length and against target position).
"""

import argparse
import logging
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.translation.bleu import Bucket, assign_bucket, bucket_label, parse_buckets
from fairseq_pe.translation.bucket_bleu import load_spm, markdown_table, parse_lengths, parse_systems, read_lines
from fairseq_pe.plotting import pyplot, system_styles
from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import check_new_files, savefig, write_json, write_text

#: the files of ``--out PREFIX``
OUT_SUFFIXES = (".txt", ".json", ".png")
BEYOND = "beyond the table"
LN2 = math.log(2)
#: the plotted curve shows the positions that at least this many references reach (the JSON has all)
CURVE_MIN_SENTENCES = 10


@dataclass
class SentenceLoss:
    """The teacher-forced NLL (bits) of each target token of one reference, ``</s>`` last;
    None for a sentence beyond the model's positions (``--beyond-table report``)."""

    nll: Optional[List[float]]
    why: str = ""


@dataclass
class Aggregate:
    """Summed NLL and token count of a group of sentences."""

    nll: float = 0.0
    tokens: int = 0
    sentences: int = 0
    beyond: int = 0
    members: int = 0

    def add(self, loss: SentenceLoss):
        self.members += 1
        if loss.nll is None:
            self.beyond += 1
            return
        self.sentences += 1
        self.tokens += len(loss.nll)
        self.nll += sum(loss.nll)

    def entry(self) -> dict:
        mean = self.nll / self.tokens if self.tokens else None
        out = {"nll": mean, "ppl": 2 ** mean if mean is not None else None, "tokens": self.tokens,
               "n": self.members, "scored": self.sentences}
        if self.beyond:
            out["beyond"] = self.beyond
        return out


def aggregate(losses: Sequence[SentenceLoss], lengths: Sequence[int], buckets: Sequence[Bucket]) -> Dict[str, dict]:
    """``{bucket label: entry, "all": entry, BEYOND: {"n": ...}}``; each entry as :meth:`Aggregate.entry`.
    A length in no bucket is an error (nothing is left out)."""
    if len(losses) != len(lengths):
        raise UserError(f"{len(losses)} sentences but {len(lengths)} lengths: they must be line-aligned")
    groups = [Aggregate() for _ in buckets]
    total = Aggregate()
    for i, (loss, n) in enumerate(zip(losses, lengths)):
        b = assign_bucket(n, buckets)
        if b is None:
            raise UserError(f"sentence {i} has source length {n}, in none of the --buckets "
                            f"{[bucket_label(x) for x in buckets]}")
        groups[b].add(loss)
        total.add(loss)
    out = {bucket_label(b): g.entry() for b, g in zip(buckets, groups)}
    out["all"] = total.entry()
    out[BEYOND] = {"n": total.beyond}
    return out


def per_position(losses: Sequence[SentenceLoss]) -> List[dict]:
    """Mean NLL at each target position (1 = first token), over the sentences that reach it."""
    sums: List[float] = []
    counts: List[int] = []
    for loss in losses:
        if loss.nll is None:
            continue
        for p, v in enumerate(loss.nll):
            if p == len(sums):
                sums.append(0.0)
                counts.append(0)
            sums[p] += v
            counts[p] += 1
    return [{"position": p + 1, "nll": s / c, "n": c} for p, (s, c) in enumerate(zip(sums, counts))]


def position_ranges(curve: Sequence[dict], edges: Sequence[Bucket]) -> Dict[str, dict]:
    """The per-position curve summed into ranges of positions (token-weighted mean NLL)."""
    out = {}
    for lo, hi in edges:
        pts = [c for c in curve if c["position"] >= lo and (hi is None or c["position"] < hi)]
        tokens = sum(c["n"] for c in pts)
        mean = sum(c["nll"] * c["n"] for c in pts) / tokens if tokens else None
        out[bucket_label((lo, hi))] = {"nll": mean, "ppl": 2 ** mean if mean is not None else None, "tokens": tokens}
    return out


def default_position_edges(train_length: Optional[int]) -> List[Bucket]:
    """Target positions seen in training, then up to 2x, 3x and beyond (16 when it is unknown)."""
    L = train_length or 16
    return [(1, L + 1), (L + 1, 2 * L + 1), (2 * L + 1, 3 * L + 1), (3 * L + 1, None)]


# ---------------------------------------------------------------------------------------------
# scoring with fairseq


def load_system(name: str, path: str, data: str, overrides: dict, cpu: bool):
    """The model and task of a checkpoint, as ``fairseq-generate`` builds them (``--path``)."""
    from fairseq import checkpoint_utils  # the package's import registered the plugin's models

    if not os.path.isfile(path):
        raise UserError(f"--system {name}={path}: no such file")
    try:
        models, _, task = checkpoint_utils.load_model_ensemble_and_task(
            [path], arg_overrides={"data": data, **overrides})
    except UserError:
        raise
    except (RuntimeError, KeyError, AttributeError, FileNotFoundError) as e:
        raise UserError(f"--system {name}={path}: cannot be loaded on DATA {data} ({type(e).__name__}: "
                        f"{str(e).splitlines()[0][:300]})") from None
    if not hasattr(task.cfg, "source_lang") or not hasattr(task, "target_dictionary"):
        raise UserError(f"--system {name}={path}: not a translation model (task {getattr(task.cfg, '_name', '?')})")
    model = models[0]
    model.eval()
    if not cpu:
        import torch

        if torch.cuda.is_available():
            model.cuda()
    return model, task


def model_limits(model) -> Tuple[Optional[int], Optional[int]]:
    """(source, target) positions of the model; None: no limit of its own."""
    limits = model.max_positions()
    if not isinstance(limits, (tuple, list)):
        limits = (limits, limits)
    return tuple(None if x is None or x >= 1_000_000 else int(x) for x in limits[:2])


def beyond_reason(src_len: int, tgt_len: int, limits) -> str:
    src_max, tgt_max = limits
    if src_max is not None and src_len > src_max:
        return (f"source of {src_len} tokens with </s>, the model takes {src_max} "
                "(its --max-source-positions)")
    if tgt_max is not None and tgt_len > tgt_max:
        return (f"reference of {tgt_len} tokens with </s>, the model takes {tgt_max} "
                "(its --max-target-positions)")
    return ""


def score_references(model, task, dataset, max_tokens: int, beyond: str, name: str,
                     progress=None) -> List[SentenceLoss]:
    """Every reference of ``dataset`` scored by fairseq's ``SequenceScorer`` (teacher forcing)."""
    import torch
    from fairseq import utils
    from fairseq.data import data_utils
    from fairseq.sequence_scorer import SequenceScorer

    limits = model_limits(model)
    n = len(dataset)
    losses: List[Optional[SentenceLoss]] = [None] * n
    fits = []
    for i in range(n):
        why = beyond_reason(int(dataset.src_sizes[i]), int(dataset.tgt_sizes[i]), limits)
        if why:
            losses[i] = SentenceLoss(None, why)
        else:
            fits.append(i)
    skipped = [i for i in range(n) if losses[i] is not None]
    if skipped and beyond == "error":
        raise UserError(f"--system {name}: {len(skipped)} of {n} sentences need more positions than the model has "
                        f"(sentence {skipped[0]}: {losses[skipped[0]].why}); retrain with a larger table, or pass "
                        f"--beyond-table report to count them in a column '{BEYOND}'")
    fits.sort(key=lambda i: (int(dataset.src_sizes[i]), int(dataset.tgt_sizes[i])))
    batches = data_utils.batch_by_size(fits, dataset.num_tokens, max_tokens=max_tokens,
                                       required_batch_size_multiple=1)
    scorer = SequenceScorer(task.target_dictionary)
    cuda = next(model.parameters()).is_cuda
    done = 0
    with torch.no_grad():
        for batch in batches:
            sample = dataset.collater([dataset[int(i)] for i in batch])
            if cuda:
                sample = utils.move_to_cuda(sample)
            hypos = scorer.generate([model], sample)
            for j, sid in enumerate(sample["id"].tolist()):
                tgt_len = int(sample["target"][j].ne(task.target_dictionary.pad()).sum())
                scores = hypos[j][0]["positional_scores"][:tgt_len]
                losses[sid] = SentenceLoss([-float(s) / LN2 for s in scores])
            done += len(batch)
            if progress:
                progress(done, len(fits))
    missing = [i for i, x in enumerate(losses) if x is None]
    assert not missing, f"sentences {missing[:10]} were not scored"
    return losses


def binary_test_set(task, subset: str, data: str, train: bool = True) -> Tuple[object, Optional[int]]:
    """``DATA``'s ``subset`` as the task loads it (no truncation), and (``train``) the longest target of
    its train subset when that is there."""
    quiet = logging.getLogger("fairseq.data.data_utils")
    try:
        task.load_dataset(subset)
    except FileNotFoundError as e:
        raise UserError(f"--gen-subset {subset}: not in DATA {data} ({e})") from None
    dataset = task.dataset(subset)
    if dataset.tgt is None:
        raise UserError(f"--gen-subset {subset} in {data} has no target side: the references are needed")
    train_length = None
    if not train:
        return dataset, None
    level = quiet.level
    quiet.setLevel(logging.WARNING)
    try:
        task.load_dataset("train")
        train_length = int(task.dataset("train").tgt_sizes.max())
    except (FileNotFoundError, ValueError):
        pass
    finally:
        quiet.setLevel(level)
    return dataset, train_length


def raw_test_set(task, sources: Sequence[str], references: Sequence[str], spm_path: str):
    """Raw text segmented by ``--spm-model`` and mapped by the task's dictionaries."""
    from fairseq.data import LanguagePairDataset

    sp = load_spm(spm_path)

    def encode(lines, d):
        return [d.encode_line(" ".join(p), add_if_not_exist=False, append_eos=True).long()
                for p in sp.encode(list(lines), out_type=str)]

    src = encode(sources, task.source_dictionary)
    tgt = encode(references, task.target_dictionary)
    return LanguagePairDataset(src, [len(t) for t in src], task.source_dictionary, tgt, [len(t) for t in tgt],
                               task.target_dictionary, left_pad_source=task.cfg.left_pad_source,
                               left_pad_target=task.cfg.left_pad_target)


# ---------------------------------------------------------------------------------------------
# output


def _cell(entry: dict) -> str:
    if entry.get("nll") is None:
        return "-"
    text = f"{entry['nll']:.3f} ({entry['ppl']:.1f})"
    if entry.get("beyond"):
        text += f" [{entry['scored']}/{entry['n']}]"
    return text


def format_tables(results: Dict[str, dict], buckets: Sequence[Bucket], title: str) -> str:
    """Per-bucket NLL (perplexity) of every system, and NLL per range of target positions."""
    labels = [bucket_label(b) for b in buckets] + ["all"]
    first = next(iter(results.values()))
    show_beyond = any(r["buckets"][BEYOND]["n"] for r in results.values())
    head = ["system"] + [f"{lab} (n={first['buckets'][lab]['n']})" for lab in labels] + ([BEYOND] if show_beyond else [])
    rows = [[name] + [_cell(r["buckets"][lab]) for lab in labels]
            + ([str(r["buckets"][BEYOND]["n"])] if show_beyond else []) for name, r in results.items()]
    parts = [title + ": NLL in bits per target token (perplexity)", markdown_table(head, rows)]
    if show_beyond:
        parts.append(f"[k/n]: k of the bucket's n sentences scored, the others are counted in '{BEYOND}' "
                     "(longer than the model's positions)")
    ranges = list(first["position_ranges"])
    head = ["system"] + [f"positions {lab}" for lab in ranges]
    rows = [[name] + [_cell(r["position_ranges"][lab]) for lab in ranges] for name, r in results.items()]
    train = first.get("train_length")
    parts += ["", "NLL by target position (1 = first token)"
              + (f"; training targets had at most {train} tokens" if train else ""), markdown_table(head, rows)]
    return "\n".join(parts)


def plot(results: Dict[str, dict], buckets: Sequence[Bucket], path: str, title: str, xlabel: str):
    """Two panels: NLL per source-length bucket, and NLL against target position (training length marked)."""
    plt = pyplot()
    labels = [bucket_label(b) for b in buckets]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.8))
    styles = system_styles(results)
    for name, r in results.items():
        ys = [r["buckets"][lab]["nll"] for lab in labels]
        axes[0].plot(range(len(labels)), [math.nan if y is None else y for y in ys], label=name, **styles[name])
        curve = [c for c in r["positions"] if c["n"] >= CURVE_MIN_SENTENCES]
        axes[1].plot([c["position"] for c in curve], [c["nll"] for c in curve], linewidth=1, label=name,
                     color=styles[name]["color"], linestyle=styles[name]["linestyle"])
    axes[0].set_xticks(range(len(labels)))
    axes[0].set_xticklabels(labels)
    axes[0].set_xlabel(xlabel)
    axes[0].set_ylabel("NLL (bits per target token)")
    axes[0].set_title(title)
    train = next(iter(results.values())).get("train_length")
    if train:
        axes[1].axvline(train + 0.5, color="black", linestyle="--", linewidth=0.8,
                        label=f"longest training target ({train})")
    axes[1].set_xlabel("target position")
    axes[1].set_ylabel("NLL (bits)")
    axes[1].set_title(f"against target position (reached by ≥ {CURVE_MIN_SENTENCES} references)")
    for ax in axes:
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    savefig(fig, path, dpi=110)
    plt.close(fig)


def evaluate(systems: Dict[str, str], data: str, *, subset: str = "test", source: Optional[str] = None,
             reference: Optional[str] = None, spm_model: Optional[str] = None, lengths=None, unit: str = "token",
             buckets: Sequence[Bucket], beyond: str = "error", max_tokens: int = 4096,
             train_length: Optional[int] = None, position_edges=None, overrides: Optional[dict] = None,
             cpu: bool = True, progress=None) -> Dict[str, dict]:
    """Score every system; ``{name: {"buckets", "positions", "position_ranges", "train_length", "limits"}}``."""
    results = {}
    if source is not None:
        src_lines = read_lines(source, "--source")
        ref_lines = read_lines(reference, "--reference")
        if len(src_lines) != len(ref_lines):
            raise UserError(f"--source {source} has {len(src_lines)} lines but --reference {reference} has "
                            f"{len(ref_lines)}: the files must be line-aligned")
    dataset = trained = None  # DATA's test set and dictionaries serve every system: built once
    for name, path in systems.items():
        model, task = load_system(name, path, data, overrides or {}, cpu)
        if dataset is None:
            if source is not None:
                dataset = raw_test_set(task, src_lines, ref_lines, spm_model)
            else:
                dataset, trained = binary_test_set(task, subset, data)
            if lengths is None:
                lengths = [int(n) - 1 for n in dataset.src_sizes] if unit == "token" else None
            if len(lengths) != len(dataset):
                raise UserError(f"{len(lengths)} source lengths but the test set has {len(dataset)} sentences")
        losses = score_references(model, task, dataset, max_tokens, beyond, name,
                                  progress=(lambda d, t, name=name: progress(name, d, t)) if progress else None)
        L = train_length or trained
        curve = per_position(losses)
        results[name] = {"buckets": aggregate(losses, lengths, buckets), "positions": curve,
                         "position_ranges": position_ranges(curve, position_edges or default_position_edges(L)),
                         "train_length": L, "limits": list(model_limits(model)), "checkpoint": path}
        del model
    return results


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-bucket-loss", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("data", metavar="DATA", help="fairseq data folder: the dictionaries, and the binary test set")
    p.add_argument("--system", action="append", required=True, metavar="NAME=CHECKPOINT",
                   help="a checkpoint to score; repeat for several")
    p.add_argument("--gen-subset", default="test", help="the binary subset of DATA to score (default test)")
    p.add_argument("--source", help="raw source text (instead of the binary subset; needs --reference, "
                                    "--spm-model); also gives the lengths of --unit word/subword")
    p.add_argument("--reference", help="raw reference text, line-aligned with --source")
    p.add_argument("--spm-model", help="sentencepiece model of the raw text (and of --unit subword)")
    p.add_argument("--lengths", help="source length of each test line (e.g. test.lengths of fairseq-pe-s2l-split)")
    p.add_argument("--unit", choices=["word", "subword", "token"], default=None,
                   help="bucket length unit: words or sentencepiece tokens of --source, or the source tokens "
                        "the model reads without </s> (default: word with --source, else token)")
    p.add_argument("--buckets", type=parse_buckets, default=parse_buckets("80,100,120,140+"),
                   help="source-length bucket boundaries as fairseq-pe-bucket-bleu's (default 80,100,120,140+)")
    p.add_argument("--train-length", type=int,
                   help="longest training target in tokens with </s>, marked on the curve (default: from DATA's "
                        "train subset when it is there)")
    p.add_argument("--position-bins", type=parse_buckets,
                   help="ranges of target positions of the second table (default: 1..L, then up to 2L, 3L, beyond)")
    p.add_argument("--beyond-table", choices=["error", "report"], default="error",
                   help="a sentence longer than a model's positions: an error (default), or counted in a "
                        f"column '{BEYOND}'")
    p.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch")
    p.add_argument("--model-overrides", default="{}", help="as fairseq-generate's, a Python dict literal")
    p.add_argument("--cpu", action="store_true", help="score on the CPU even when a GPU is there")
    p.add_argument("--title", default="teacher-forced loss per source-length bucket")
    p.add_argument("--out", help="write PREFIX.txt, PREFIX.json and PREFIX.png")
    p.add_argument("--force", action="store_true", help="replace the --out files of an earlier run")
    p.add_argument("--quiet", action="store_true", help="no progress on stderr")
    return p


def source_lengths(args) -> Optional[List[int]]:
    """Lengths from ``--lengths`` or the raw ``--source``; None: the model's source tokens."""
    from fairseq_pe.translation.s2l import source_lengths as measure

    if args.lengths:
        return parse_lengths(args.lengths)
    if args.unit == "token":
        return None
    if not args.source:
        raise UserError(f"--unit {args.unit} measures the raw --source: give --source (with --reference), "
                        "--lengths FILE, or --unit token")
    sp = None
    if args.unit == "subword":
        if not args.spm_model:
            raise UserError("--unit subword needs --spm-model")
        sp = load_spm(args.spm_model)
    return measure(read_lines(args.source, "--source"), args.unit, sp)


@cli
def main(argv: Optional[List[str]] = None):
    import ast

    args = get_parser().parse_args(argv)
    systems = parse_systems(args.system, "CHECKPOINT")
    if bool(args.source) != bool(args.reference):
        raise UserError("--source and --reference go together (raw text), or give neither (the binary --gen-subset)")
    if args.source and not args.spm_model:
        raise UserError("--source/--reference need --spm-model: the raw text is segmented as the models saw it")
    if args.unit is None:
        args.unit = "word" if args.source else "token"
    try:
        overrides = ast.literal_eval(args.model_overrides)
        assert isinstance(overrides, dict)
    except (ValueError, SyntaxError, AssertionError):
        raise UserError(f"--model-overrides {args.model_overrides!r}: give a Python dict, e.g. "
                        "\"{'max_source_positions': 4096}\"") from None
    if not os.path.isdir(args.data):
        raise UserError(f"DATA {args.data}: no such folder")
    if args.out:
        inputs = [(f"--system {n}=", p) for n, p in systems.items()] + [
            (flag, path) for flag, path in (("--source", args.source), ("--reference", args.reference),
                                            ("--lengths", args.lengths), ("--spm-model", args.spm_model)) if path]
        check_new_files([args.out + s for s in OUT_SUFFIXES], args.force, flag="--out", inputs=inputs, where=args.out)
    lengths = source_lengths(args)
    for quiet in ("fairseq", "matplotlib", "PIL"):
        logging.getLogger(quiet).setLevel(logging.WARNING)

    shown = {}

    def progress(name, done, total):  # a line every 10 s, and at the end
        if not args.quiet and (done == total or time.time() - shown.get(name, 0) > 10):
            shown[name] = time.time()
            print(f"[bucket-loss {time.strftime('%H:%M:%S')}] {name}: {done}/{total} sentences scored",
                  file=sys.stderr, flush=True)

    results = evaluate(systems, args.data, subset=args.gen_subset, source=args.source, reference=args.reference,
                       spm_model=args.spm_model, lengths=lengths, unit=args.unit, buckets=args.buckets,
                       beyond=args.beyond_table, max_tokens=args.max_tokens, train_length=args.train_length,
                       position_edges=args.position_bins, overrides=overrides, cpu=args.cpu, progress=progress)
    unit = {"word": "words", "subword": "sentencepiece tokens", "token": "source tokens"}[args.unit]
    if args.lengths:
        unit = "as in " + os.path.basename(args.lengths)
    text = format_tables(results, args.buckets, args.title)
    print(text)
    if args.out:
        payload = {"buckets": [bucket_label(b) for b in args.buckets], "length_unit": unit, "nll_unit": "bits",
                   "data": args.data, "subset": None if args.source else args.gen_subset,
                   "source": args.source, "reference": args.reference, "systems": results}
        write_text(args.out + ".txt", text + "\n")
        write_json(args.out + ".json", payload, indent=1)
        plot(results, args.buckets, args.out + ".png", args.title, f"source length ({unit})")
        print(f"wrote {args.out}.txt, {args.out}.json and {args.out}.png", file=sys.stderr)


if __name__ == "__main__":
    main()
