"""``fairseq-pe-bucket-bleu``: sacreBLEU per source-length bucket for one or more systems.

Each ``--system NAME=PATH`` is a ``fairseq-generate`` output (its ``D-`` lines, or ``H-`` with
``--hyp-tag H``) or, with ``--plain``, a hypothesis file with one line per source line.  Scores
are computed against the raw ``--reference`` file (not fairseq's ``T-`` lines, whose unknown
characters are ``<unk>``), after undoing the subword segmentation that is still in the
hypotheses (``--segmentation``: fairseq's own ``post_process`` with ``sentencepiece`` or
``subword_nmt``; ``auto`` detects ``▁``/``@@``).

Source length per line comes from ``--lengths FILE`` (one integer per line, as
``fairseq-pe-s2l-split`` writes ``test.lengths``) or is computed from ``--source``: whitespace
words (``--unit word``) or sentencepiece tokens (``--unit subword --spm-model M``).

Output: one table (stdout and ``--out PREFIX.txt``), ``PREFIX.json`` and ``PREFIX.png`` (BLEU
against length bucket, one line per system).  ``--tokenized-bleu`` adds the paper-comparable
score: Moses tokenisation (sacremoses) of hypothesis and reference, compound splitting
(``a-b`` → ``a ##AT##-##AT## b``, as fairseq's ``scripts/compound_split_bleu.sh``), then BLEU on
those tokens (sacreBLEU with ``tokenize='none'``, i.e. ``multi-bleu.perl``).

Nothing is dropped: a generate output with a missing or repeated hypothesis, a file whose line
count differs from the source/reference, or a length outside every bucket is an error.

``--out PREFIX`` never writes over an input file, and replaces the files of an earlier run only with
``--force``; each file is written atomically (complete, or not at all).
"""

import argparse
import math
import os
import re
import sys
from typing import Dict, List, Optional, Sequence

from fairseq_pe.translation.bleu import (
    Bucket,
    GenerateOutputError,
    bucket_label,
    bucketed_bleu,
    parse_buckets,
    read_generate_output,
)
from fairseq_pe.errors import UserError, cli
from fairseq_pe.outputs import atomic_path, check_new_files, describe, write_json, write_text
from fairseq_pe.plotting import pyplot, system_styles

#: the files of ``--out PREFIX``
OUT_SUFFIXES = (".txt", ".json", ".png")


def read_lines(path: str, flag: Optional[str] = None) -> List[str]:
    """The lines of a UTF-8 text file; with ``flag``, a missing or unreadable file is a
    :class:`~fairseq_pe.errors.UserError` naming the option."""
    try:
        with open(path, encoding="utf-8") as f:
            return [line.rstrip("\n") for line in f]
    except (OSError, UnicodeDecodeError) as e:
        if flag is None:
            raise
        reason = "no such file" if isinstance(e, FileNotFoundError) else f"cannot be read as UTF-8 text ({e})"
        raise UserError(f"{describe(flag, path)}: {reason}") from None


def load_spm(path: str, flag: str = "--spm-model"):
    import sentencepiece as spm

    if not os.path.isfile(path):
        raise UserError(f"{flag} {path}: no such file")
    try:
        return spm.SentencePieceProcessor(model_file=path)
    except (OSError, RuntimeError) as e:
        raise UserError(f"{flag} {path}: not a sentencepiece model ({e})") from None


def undo_segmentation(lines: Sequence[str], mode: str) -> List[str]:
    """Undo ``sentencepiece`` / ``subword_nmt`` segmentation with fairseq's ``post_process``."""
    from fairseq.data.data_utils import post_process

    if mode == "auto":
        if any("\u2581" in s for s in lines):
            mode = "sentencepiece"
        elif any("@@ " in s or s.endswith("@@") for s in lines):
            mode = "subword_nmt"
        else:
            return list(lines)
    if mode == "none":
        return list(lines)
    return [post_process(s, mode) for s in lines]


def compound_split_tokens(lines: Sequence[str], lang: str) -> List[str]:
    """Moses tokenisation then fairseq's compound splitting (``scripts/compound_split_bleu.sh``)."""
    from sacremoses import MosesTokenizer

    tok = MosesTokenizer(lang=lang)
    out = []
    for s in lines:
        t = tok.tokenize(s, return_str=True, escape=False)
        out.append(re.sub(r"(\S)-(\S)", r"\1 ##AT##-##AT## \2", t))
    return out


def parse_lengths(path: str) -> List[int]:
    """The integers of a ``--lengths`` file (one per line, blank lines ignored)."""
    lengths = []
    for i, x in enumerate(read_lines(path, "--lengths"), 1):
        if x.strip() == "":
            continue
        try:
            lengths.append(int(x))
        except ValueError:
            raise UserError(f"--lengths {path}: line {i} is {x!r}, not a whole number") from None
    return lengths


def source_lengths(args, n_expected: int) -> List[int]:
    if args.lengths:
        lengths = parse_lengths(args.lengths)
        origin = f"--lengths {args.lengths}"
    elif args.source:
        sources = read_lines(args.source, "--source")
        origin = f"--source {args.source}"
        from fairseq_pe.translation.s2l import source_lengths as measure

        sp = None
        if args.unit == "subword":
            if not args.spm_model:
                raise UserError("--unit subword needs --spm-model (or give --lengths, or --unit word)")
            sp = load_spm(args.spm_model)
        lengths = measure(sources, args.unit, sp)
    else:
        raise UserError("give --source (lengths computed from it) or --lengths FILE")
    if len(lengths) != n_expected:
        raise UserError(f"{origin} has {len(lengths)} lines but --reference {args.reference} has {n_expected}")
    return lengths


def system_hypotheses(name: str, path: str, args, n_expected: int) -> List[str]:
    if not os.path.isfile(path):
        raise UserError(f"--system {name}={path}: no such file")
    if args.plain:
        hyps = read_lines(path, f"--system {name}=")
        if len(hyps) != n_expected:
            raise UserError(f"--system {name}={path} has {len(hyps)} lines but --reference {args.reference} "
                            f"has {n_expected}: the files must be line-aligned")
    else:
        try:
            hyps = [s.hypothesis for s in read_generate_output(path, expected=n_expected,
                                                               detokenized=args.hyp_tag == "D")]
        except GenerateOutputError as e:
            raise UserError(f"--system {name}: {e}") from None
        except UnicodeDecodeError as e:
            raise UserError(f"--system {name}={path}: cannot be read as UTF-8 text ({e})") from None
    return undo_segmentation(hyps, args.segmentation)


def score_systems(systems: Dict[str, List[str]], refs: Sequence[str], lengths: Sequence[int],
                  buckets: Sequence[Bucket], tokenized_lang: Optional[str] = None,
                  n_bootstrap: int = 0) -> Dict[str, Dict[str, dict]]:
    """``{system: {bucket: {"bleu", "n"[, "tok_bleu"][, "bleu_ci"]}, "all": ..., "signature": ...}}``."""
    results = {}
    tok_refs = compound_split_tokens(refs, tokenized_lang) if tokenized_lang else None
    for name, hyps in systems.items():
        res = bucketed_bleu(hyps, refs, lengths, buckets, n_bootstrap=n_bootstrap)
        if tokenized_lang:
            tok = bucketed_bleu(compound_split_tokens(hyps, tokenized_lang), tok_refs, lengths, buckets,
                                tokenize="none")
            for key, val in tok.items():
                if key != "signature":
                    res[key]["tok_bleu"] = val["bleu"]
            res["tok_signature"] = tok["signature"] + " (Moses-tokenised, compound-split)"
        results[name] = res
    return results


#: decimals of each score in the tables
PRECISION = {"bleu": 1, "tok_bleu": 1, "ratio": 2, "nll": 2}


def markdown_table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """A Markdown table with padded columns."""
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    line = lambda r: "| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |"  # noqa: E731
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(head), sep] + [line(r) for r in rows])


def format_table(results: Dict[str, Dict[str, dict]], buckets: Sequence[Bucket], title: str,
                 extras: Sequence[str] = (), key: str = "bleu") -> str:
    """One row per system: the buckets, ``all``, then one column per extra test set (its overall score).

    A score that could not be computed (an entry with ``"na"``: its reason) shows ``n/a [k]``, and
    note ``[k]`` under the table gives the reason.  A score over several seeds (``KEY_sd``,
    :mod:`fairseq_pe.seeds`) shows ``mean ± sd``; one with a bootstrap interval (``KEY_ci``) ``score ±ci``.
    ``key``: ``bleu``, ``tok_bleu``, ``ratio`` or ``nll`` (the teacher-forced loss of the references)."""
    labels = [bucket_label(b) for b in buckets] + ["all"] + list(extras)
    first = next(iter(results.values()))
    head = ["encoding"] + [f"{lab} (n={first[lab]['n']})" for lab in labels]
    notes: List[str] = []

    def cell(name, res, lab):
        if res[lab].get("na"):
            note = f"{name}: {res[lab]['na']}"
            if note not in notes:
                notes.append(note)
            return f"n/a [{notes.index(note) + 1}]"
        v = res[lab].get(key, math.nan)
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return "-"
        digits = PRECISION.get(key, 1)
        text = f"{v:.{digits}f}"
        if res[lab].get(key + "_sd") is not None:
            text += f" ± {res[lab][key + '_sd']:.{digits}f}"
        elif res[lab].get(key + "_ci") is not None:
            text += f" ±{res[lab][key + '_ci']:.{digits}f}"
        return text

    rows = [[name] + [cell(name, res, lab) for lab in labels] for name, res in results.items()]
    sig = {"bleu": first.get("signature", ""), "tok_bleu": first.get("tok_signature", ""),
           "ratio": "hypothesis length / reference length (sacreBLEU tokens); < 1 stops early, > 1 runs on",
           "nll": "teacher-forced NLL of the references, bits per target token (fairseq-pe-bucket-loss; "
                  "perplexity = 2^NLL)"}[key]
    notes = [f"[{k}] {note}" for k, note in enumerate(notes, 1)]
    return "\n".join([title, markdown_table(head, rows)] + ([""] + notes if notes else []) + ["", sig])


def plot(results: Dict[str, Dict[str, dict]], buckets: Sequence[Bucket], path: str, title: str,
         extras: Sequence[str] = (), xlabel: str = "source length", loss: Optional[Dict[str, Dict[str, dict]]] = None):
    """Panels against length bucket, one line per system: sacreBLEU, the length ratio (hypothesis /
    reference) and, with ``loss`` (the same form, key ``nll``), the teacher-forced loss of the references.
    Extra test sets are separate points on the right of each panel.  Error bars: the standard
    deviation over seeds (``KEY_sd``), or the bootstrap interval of a single seed (``KEY_ci``)."""
    plt = pyplot()
    styles = system_styles(results)
    labels = [bucket_label(b) for b in buckets]
    xs_extra = [len(labels) + 0.5 + i for i in range(len(extras))]

    def value(entry, key):  # an unavailable score (None) is a gap
        v = entry.get(key)
        return math.nan if v is None else v

    def spread(entry, key):
        v = entry.get(key + "_sd", entry.get(key + "_ci"))
        return 0.0 if v is None or entry.get(key) is None else v

    panels = [(results, "bleu", "sacreBLEU", title),
              (results, "ratio", "length ratio (hyp / ref)", "< 1: stops early, > 1: runs on")]
    if loss:
        panels.append((loss, "nll", "NLL of the references (bits / token)", "teacher-forced loss (lower is better)"))
    fig, axes = plt.subplots(1, len(panels), figsize=((6.5 + 0.4 * len(extras)) * len(panels), 4.8), squeeze=False)
    for ax, (source, key, ylabel, subtitle) in zip(axes[0], panels):
        for name, res in source.items():
            style = styles[name]
            ax.errorbar(range(len(labels)), [value(res[lab], key) for lab in labels],
                        yerr=[spread(res[lab], key) for lab in labels], capsize=3, label=name, **style)
            if extras:
                ax.errorbar(xs_extra, [value(res[e], key) for e in extras], yerr=[spread(res[e], key) for e in extras],
                            capsize=3, **{**style, "linestyle": "none"})
        ax.set_xticks(list(range(len(labels))) + xs_extra)
        ax.set_xticklabels(labels + list(extras))
        if extras:
            ax.axvline(len(labels) - 0.25, color="grey", linewidth=0.8)
        if key == "ratio":
            ax.axhline(1.0, color="black", linewidth=0.8, linestyle="--")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(subtitle)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8, ncol=2)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110)
    plt.close(fig)


def write_outputs(prefix: str, tables: Sequence[str], payload: dict, results, buckets, title: str, extras=(),
                  xlabel: str = "source length", loss=None):
    """``PREFIX.txt``, ``PREFIX.json`` and ``PREFIX.png``, each written atomically."""
    write_text(prefix + ".txt", "\n\n".join(tables) + "\n")
    write_json(prefix + ".json", payload, indent=2)
    plot(results, buckets, prefix + ".png", title, extras, xlabel, loss)


def get_parser():
    p = argparse.ArgumentParser(prog="fairseq-pe-bucket-bleu", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--system", action="append", required=True, metavar="NAME=PATH",
                   help="a system's fairseq-generate output (or hypothesis file with --plain); repeat for several")
    p.add_argument("--reference", required=True, help="raw reference text, one line per test sentence")
    p.add_argument("--source", help="raw source text (lengths are computed from it unless --lengths)")
    p.add_argument("--lengths", help="source length of each test line (e.g. test.lengths of fairseq-pe-s2l-split)")
    p.add_argument("--unit", choices=["word", "subword"], default="word",
                   help="length unit when computed from --source (subword needs --spm-model)")
    p.add_argument("--spm-model", help="sentencepiece model for --unit subword")
    p.add_argument("--buckets", type=parse_buckets, default=parse_buckets("80,100,120,140+"),
                   help="bucket boundaries, a trailing + makes the last open (default 80,100,120,140+)")
    p.add_argument("--plain", action="store_true", help="--system files are plain hypothesis files")
    p.add_argument("--hyp-tag", choices=["D", "H"], default="D", help="which fairseq-generate lines to read")
    p.add_argument("--segmentation", choices=["auto", "sentencepiece", "subword_nmt", "none"], default="auto",
                   help="subword segmentation to undo in the hypotheses")
    p.add_argument("--tokenized-bleu", metavar="LANG",
                   help="also report Moses-tokenised, compound-split BLEU (paper-comparable) for target LANG")
    p.add_argument("--bootstrap", type=int, default=1000, metavar="N",
                   help="95%% confidence interval of every BLEU from sacreBLEU's bootstrap resampling with N "
                        "resamples (default 1000; 0: none)")
    p.add_argument("--title", default="sacreBLEU per source-length bucket")
    p.add_argument("--out", help="write PREFIX.txt, PREFIX.json and PREFIX.png")
    p.add_argument("--force", action="store_true", help="replace the --out files of an earlier run")
    return p


def parse_systems(specs: Sequence[str], what: str = "PATH") -> Dict[str, str]:
    """``--system NAME=PATH`` options -> ``{NAME: PATH}`` in order; a malformed or repeated name is an error."""
    systems: Dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--system {spec!r}: use NAME={what}")
        if name in systems:
            raise UserError(f"--system {name}: given twice")
        systems[name] = path
    return systems


@cli
def main(argv: Optional[List[str]] = None):
    args = get_parser().parse_args(argv)
    if args.bootstrap < 0:
        raise UserError(f"--bootstrap {args.bootstrap}: give a number of resamples (0 for none; 1000 is usual)")
    systems = parse_systems(args.system)
    if args.out:  # before any work: never over an input, never over results without --force
        inputs = [(f"--system {n}=", p) for n, p in systems.items()] + [
            (flag, path) for flag, path in (("--reference", args.reference), ("--source", args.source),
                                            ("--lengths", args.lengths), ("--spm-model", args.spm_model)) if path]
        check_new_files([args.out + suffix for suffix in OUT_SUFFIXES], args.force, flag="--out", inputs=inputs,
                        where=args.out)
    refs = read_lines(args.reference, "--reference")
    if args.source and len(read_lines(args.source, "--source")) != len(refs):
        raise UserError(f"--source {args.source} has {len(read_lines(args.source))} lines but --reference "
                        f"{args.reference} has {len(refs)}: the files must be line-aligned")
    lengths = source_lengths(args, len(refs))
    hyps = {name: system_hypotheses(name, path, args, len(refs)) for name, path in systems.items()}
    try:
        results = score_systems(hyps, refs, lengths, args.buckets, args.tokenized_bleu, args.bootstrap)
    except GenerateOutputError as e:
        raise UserError(str(e)) from None
    unit = args.unit if not args.lengths else "as in " + os.path.basename(args.lengths)
    title = args.title
    if args.bootstrap > 1:
        title += (f"; ±x: half-width of the 95% confidence interval of sacreBLEU's bootstrap resampling "
                  f"({args.bootstrap} resamples of the test sentences; one decoding, so not the variation "
                  "between training runs)")
    tables = [format_table(results, args.buckets, title)]
    if args.tokenized_bleu:
        tables.append(format_table(results, args.buckets, "tokenised, compound-split BLEU", key="tok_bleu"))
    tables.append(format_table(results, args.buckets, "length ratio", key="ratio"))
    print("\n\n".join(tables))
    if args.out:
        payload = {"buckets": [bucket_label(b) for b in args.buckets], "length_unit": unit,
                   "systems": results, "files": systems, "reference": args.reference}
        write_outputs(args.out, tables, payload, results, args.buckets, args.title, xlabel=f"source length ({unit})")
        print(f"wrote {args.out}.txt, {args.out}.json and {args.out}.png", file=sys.stderr)


if __name__ == "__main__":
    main()
