"""``fairseq-pe-lm-lengths``: a language model's perplexity at its training length L and past it, the
length-extrapolation benchmark of ALiBi (Press et al., ICLR 2022, Figure 1 and Tables 1-2) and KERPLE
(Chi et al., NeurIPS 2022, Table 3), for one or more checkpoints.

    fairseq-pe-lm-lengths --data data-bin/lm_en --train-length 64 \\
        --checkpoint alibi=ckpt/alibi-1/checkpoint_best.pt alibi=ckpt/alibi-2/checkpoint_best.pt \\
                     rope=ckpt/rope-1/checkpoint_best.pt --out results/lengths

Each point is one ``fairseq-eval-lm DATA --path CKPT --user-dir fairseq_pe --gen-subset SUBSET
--sample-break-mode none --tokens-per-sample T --context-window C --max-tokens M --output-word-probs`` (a
subprocess), at every evaluation length N = L x ``--multipliers`` (default 1 2 4 8 16) and in every ``--modes``:

* ``nonoverlapping``: the split cut into blocks of N tokens, each scored whole: ``T = N, C = 0`` (ALiBi's
  "nonoverlapping" evaluation).  fairseq's input is the targets shifted right by one, so the token at position p
  of a window is predicted from the p tokens before it: a block's first token from the last token of the block
  before (the split's first token from the end-of-sentence symbol);
* ``sliding``: windows of N tokens, each scoring its last S = ``--stride`` tokens (default L) with the N - S
  tokens before them as context: ``T = N, C = N - S``.  fairseq's ``eval_lm`` subtracts the context window
  from ``--tokens-per-sample`` (``cfg.task.tokens_per_sample -= context_window``) and
  ``LMContextWindowDataset`` puts the C tokens before each block of T - C = S new tokens in front of it, so
  every window is N = T tokens long, as in ALiBi's repository (its ``--context-window``).  At N = S it is
  the non-overlapping evaluation (C = 0), run once for both modes.

Every point is checked: the tokens fairseq says it evaluated ("Evaluated n tokens") must be the split's
tokens (the sizes of ``DATA/SUBSET.idx``; stock fairseq skips the samples longer than a model's limit and
prints a perplexity over what is left, over 0 tokens even), and no token may be left out for an infinite
score; otherwise the run stops with an error naming the point.  A refusal by name of the longer length (a
learned table: its error names ``--tokens-per-sample``) is recorded as "refused", with its reason, and the
table goes on.

The loss by token position (:mod:`fairseq_pe.lm.positions`), where extrapolation breaks: fairseq's own score of
every token (``--output-word-probs``, a natural-log probability, 6 decimals), as a base-2 loss, at its position
1..N in its window: block b's k-th new token (k from 0) at ``min(C, b * S) + k`` (0-based; S = T - C new tokens
per block; the first blocks of a sliding evaluation have less context, the last block may be shorter).  Every
point's positions must count every token of the split once and, weighted by their counts, give fairseq's
printed loss, else an error naming the point.  Options of ``--eval-lm-args`` that would move or merge the scores
(``--post-process``, ``--add-bos-token``, ``--num-workers`` above 1 with sliding windows) are refused.

Several checkpoints of one NAME are seeds: each cell is their mean ± sample standard deviation
(:mod:`fairseq_pe.seeds`), every seed's value in the JSON.  ``--out DIR`` gets, written atomically, never over an
earlier result without ``--force``:

* ``lengths.md``: per mode, the perplexity (rows systems, columns lengths; every seed's), the perplexity relative
  to the same checkpoint's at the shortest length (1 x L by default), the mean loss by position bucket (L's
  quarters, then L+1..2L, 2L+1..4L, ... to N; the joined curve of non-overlapping windows) and the seconds of
  the mode's fairseq-eval-lm runs;
* ``lengths.json``: the same, per cell ``perplexity``, ``relative`` (with ``_sd`` and ``_seeds``) and
  ``position_buckets``; ``seconds`` per mode (``total``, ``runs``, ``by_length``), each run's in ``runs``;
  ``diverging`` (the systems of the relative plot's own panel);
* ``positions.json``: per system, mode and length the loss at each position 1..N (``loss_base2``, ``_sd``,
  ``_seeds``; None where no token sits) and its token ``count``; ``stitched``: per system the non-overlapping
  curves joined, positions N_{k-1}+1..N_k from the evaluation at N_k (:func:`fairseq_pe.lm.positions.stitch`: the
  same computation for a causal model, read where a position holds the most tokens), which positions.png and the
  table of lengths.md show for non-overlapping windows (``stitched`` in lengths.json: its buckets);
* ``lengths.png`` (:mod:`fairseq_pe.lm.lengths_plot`): per mode, the perplexity against evaluation length (log2
  x) and the relative perplexity (linear y; a system past 1.5x at some length in a panel of its own, so that it
  does not flatten the others), one line per system in the colours of :mod:`fairseq_pe.plotting`;
* ``positions.png``: per mode, the loss against the position in the window, in geometric bins, the seeds' spread as
  a band, L marked: non-overlapping windows the joined curve; sliding ones each length's scored positions,
  N - S + 1..N (:func:`fairseq_pe.lm.lengths_plot.scored_segments`);
* ``logs/``: each fairseq-eval-lm run's output, rewritten by the next run (without its word-probability lines
  when the split has more than 50,000 tokens);
* ``runs/``: each run's result as it finishes (its perplexity, seconds and loss by position, or its refusal), with
  what it was computed from: the fairseq-eval-lm options and the checkpoint's SHA-256.  ``--resume`` continues an
  interrupted evaluation in the same ``--out``: a run whose record matches is read back instead of run again (its
  seconds are the ones measured then), every other one runs.  Without ``--resume`` every run runs, and its record
  is rewritten.

``--jobs J`` evaluates J checkpoints at a time (each one's windows in order, shorter first; the report is the same
as one at a time).  ``--max-tokens M``: batches of max(1, M // N) windows of N tokens, context included (fairseq's
own ``--max-tokens`` counts a sliding window's new tokens only).
"""

import argparse
import concurrent.futures
import itertools
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli
from fairseq_pe.lm import lengths_plot

MODES = ("nonoverlapping", "sliding")
MULTIPLIERS = (1, 2, 4, 8, 16)
OUTPUTS = ("lengths.md", "lengths.json", "lengths.png", "positions.json", "positions.png")  # logs/ is rewritten
#: options every run sets itself: refused in --eval-lm-args
OWN_OPTIONS = ("--path", "--user-dir", "--gen-subset", "--tokens-per-sample", "--context-window", "--max-tokens",
               "--sample-break-mode", "--output-word-probs")
#: options that would break the loss by position (one score per token, at its place in the window): refused too
BREAKING_OPTIONS = {"--post-process": "merges sub-words into words", "--remove-bpe": "merges sub-words into words",
                    "--add-bos-token": "puts a beginning-of-sentence symbol before every window"}
#: a run (checkpoint, --tokens-per-sample, --context-window); the window of each (mode, N)
Run = Tuple[str, int, int]
Windows = Dict[Tuple[str, int], Tuple[int, int]]
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in")
_LOSS = re.compile(r"Loss \(base 2\): ([-\d.naninf]+), Perplexity: ([-\d.naninf]+)")
_INF_SKIPPED = "skipping tokens with inf scores"
_ERROR_LINE = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)
#: a model's refusal of a length: transformer_lm_pe's limit (fairseq_pe/models/transformer_lm_pe.py), a learned
#: table's missing row (fairseq_pe/positional)
_LIMIT_REFUSAL = re.compile(r"evaluate with a --tokens-per-sample (?:\(plus --context-window\) )?of at most \d+")
_TABLE_REFUSAL = re.compile(r"needs position \d+")


def log(msg: str) -> None:
    print(f"[lm-lengths {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def parse_checkpoints(specs: Sequence[str]) -> Dict[str, List[str]]:
    """``NAME=PATH`` ... -> ``{NAME: [PATH, ...]}`` in the order given (several paths of a name: its seeds)."""
    out: Dict[str, List[str]] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--checkpoint {spec}: expected NAME=PATH (NAME: the system, e.g. alibi=ckpt/alibi.pt)")
        if not os.path.isfile(path):
            raise UserError(f"--checkpoint {spec}: no such file {path}")
        if path in out.get(name, []):
            raise UserError(f"--checkpoint {spec}: given twice (a seed counted twice would shrink its spread)")
        out.setdefault(name, []).append(path)
    return out


def window(length: int, mode: str, stride: int) -> Tuple[int, int]:
    """fairseq-eval-lm's ``(--tokens-per-sample, --context-window)`` for windows of ``length`` tokens."""
    if mode == "nonoverlapping":
        return length, 0
    if mode == "sliding":
        if stride > length:
            raise UserError(f"--stride {stride} is longer than the evaluation length {length}: a sliding window "
                            "scores at most its own tokens; give a --stride of at most L x the smallest --multipliers")
        return length, length - stride
    raise ValueError(mode)


def parse_eval_lm(output: str) -> dict:
    """fairseq-eval-lm's log -> ``{"tokens", "loss_base2", "perplexity"}``; a ValueError says what is missing."""
    evaluated = _EVALUATED.findall(output)
    losses = _LOSS.findall(output)
    if len(evaluated) != 1 or len(losses) != 1:
        raise ValueError(f"expected one 'Evaluated N tokens' and one 'Loss (base 2): X, Perplexity: Y' line, found "
                         f"{len(evaluated)} and {len(losses)}")
    loss, ppl = losses[0]
    return {"tokens": int(evaluated[0].replace(",", "")), "loss_base2": float(loss), "perplexity": float(ppl),
            "inf_skipped": _INF_SKIPPED in output}


def refusal(returncode: int, output: str, past_training_length: bool) -> Optional[str]:
    """The reason of a model's refusal by name of a window longer than it takes: a user error (exit status 2,
    ``fairseq-eval-lm: error: ...``, no usage line of a bad option) that says so (:data:`_LIMIT_REFUSAL`: the
    limit of ``transformer_lm_pe``, which names ``--tokens-per-sample``, at any N; :data:`_TABLE_REFUSAL`: a
    learned table's row, past L);
    else None: any other error, past L too (a batch too small, a missing file), stops the run instead of standing
    in the table as the encoding's."""
    errors = _ERROR_LINE.findall(output)
    if returncode != 2 or not errors or re.search(r"^usage: ", output, re.MULTILINE):
        return None
    reason = errors[-1].strip()
    if _LIMIT_REFUSAL.search(reason) or (past_training_length and _TABLE_REFUSAL.search(reason)):
        return reason
    return None


def split_tokens(data: str, subset: str) -> int:
    """The tokens of ``DATA/SUBSET`` (its ``.idx`` sizes, end-of-sentence symbols included): what a full
    evaluation scores."""
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data, subset), None)
    if dataset is None:
        raise UserError(f"--data {data} --gen-subset {subset}: no {subset}.bin/{subset}.idx there")
    return int(dataset.sizes.sum())


def fairseq_executable(name: str) -> str:
    """A fairseq console script (``fairseq-eval-lm``, ``fairseq-validate``): the one beside this interpreter, else
    the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), name)
    exe = beside if os.path.isfile(beside) else shutil.which(name)
    if exe is None:
        raise UserError(f"{name} not found on PATH: install fairseq (scripts/install.sh)")
    return exe


def batch_max_tokens(max_tokens: int, tokens_per_sample: int, context: int) -> int:
    """fairseq-eval-lm's ``--max-tokens`` for batches of about ``max_tokens`` tokens, context included: fairseq
    counts a sliding window's new tokens only (T - C of its T), so it gets the new tokens of max_tokens // T
    windows (one window at least)."""
    return max(1, max_tokens // tokens_per_sample) * (tokens_per_sample - context)


def eval_lm_command(args: argparse.Namespace, checkpoint: str, tokens_per_sample: int, context: int) -> List[str]:
    return [fairseq_executable("fairseq-eval-lm"), args.data, "--path", checkpoint, "--user-dir", PLUGIN_DIR,
            "--gen-subset", args.gen_subset, "--sample-break-mode", "none",
            "--tokens-per-sample", str(tokens_per_sample), "--context-window", str(context),
            "--max-tokens", str(batch_max_tokens(args.max_tokens, tokens_per_sample, context)),
            "--output-word-probs", *shlex.split(args.eval_lm_args)]


def check_point(parsed: dict, expected: int, where: str) -> None:
    """A perplexity over fewer tokens than the split holds is an error naming the point."""
    if parsed["tokens"] != expected:
        raise UserError(f"{where}: fairseq-eval-lm evaluated {parsed['tokens']:,} of the split's {expected:,} tokens "
                        "(it skips the samples longer than the model's max positions): evaluate this checkpoint at "
                        "lengths it takes (--multipliers), or raise its limit (--eval-lm-args \"--model-overrides "
                        "...\")")
    if parsed["inf_skipped"]:
        raise UserError(f"{where}: fairseq-eval-lm left out tokens with an infinite score, its perplexity covers "
                        "fewer tokens than the split (see the log)")


def run_logged(cmd: List[str], log_path: str,
               shorten: Optional[Callable[[str], str]] = None) -> Tuple[subprocess.CompletedProcess, float]:
    """A fairseq tool as a subprocess, its output (stdout and stderr in one stream; through ``shorten`` if given)
    written to ``log_path`` after the command: (the process, its seconds)."""
    from fairseq_pe.outputs import write_text

    start = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    write_text(log_path, f"$ {shlex.join(cmd)}\n{proc.stdout if shorten is None else shorten(proc.stdout)}")
    return proc, time.time() - start


def failed(where: str, tool: str, proc: subprocess.CompletedProcess, log_path: str) -> UserError:
    """The error of a tool that exited non-zero: its own one-line user error (exit status 2), or its status, its
    log and the end of its output."""
    errors = _ERROR_LINE.findall(proc.stdout)
    if proc.returncode == 2 and errors:
        return UserError(f"{where}: {tool}: {errors[-1].strip()} (its output in {log_path})")
    return UserError(f"{where}: {tool} failed (exit {proc.returncode}), its output in {log_path}:\n"
                     f"{proc.stdout[-2000:]}")


def run_point(args, checkpoint: str, tokens_per_sample: int, context: int, expected: int, log_path: str,
              where: str) -> dict:
    """One fairseq-eval-lm run: ``{"perplexity", "loss_base2", "tokens", "seconds", "curve"}`` (the curve: the loss
    sums and token counts by window position, :func:`fairseq_pe.lm.positions.position_curve`) or
    ``{"refused": reason}``."""
    from fairseq_pe.lm import positions

    shorten = positions.strip_word_probs if expected > positions.LOG_WORD_PROBS_UP_TO else None
    proc, seconds = run_logged(eval_lm_command(args, checkpoint, tokens_per_sample, context), log_path, shorten)
    reason = refusal(proc.returncode, proc.stdout, past_training_length=tokens_per_sample > args.train_length)
    if reason is not None:
        return {"refused": reason, "seconds": round(seconds, 1)}
    if proc.returncode != 0:
        raise failed(where, "fairseq-eval-lm", proc, log_path)
    try:
        parsed = parse_eval_lm(proc.stdout)
    except ValueError as e:
        raise UserError(f"{where}: fairseq-eval-lm's output could not be read ({e}); see {log_path}") from None
    check_point(parsed, expected, where)
    try:
        curve = positions.position_curve(proc.stdout, expected, tokens_per_sample, context)
        positions.check_curve(*curve, expected, parsed["loss_base2"])
    except ValueError as e:
        raise UserError(f"{where}: the loss by position: {e} (see {log_path})") from None
    return {"perplexity": parsed["perplexity"], "loss_base2": parsed["loss_base2"], "tokens": parsed["tokens"],
            "seconds": round(seconds, 1), "curve": curve}


RECORD_FORMAT = 1  # a run record's layout (runs/*.json): a record of another format is not reused


def record_key(args: argparse.Namespace, checkpoint: str, checkpoint_sha256: str, tokens_per_sample: int,
               context: int, expected: int) -> dict:
    """What a run's result depends on: fairseq-eval-lm's arguments (the executable left out: another
    environment's is the same tool), the checkpoint's contents and the split's size."""
    return {"format": RECORD_FORMAT, "eval_lm": eval_lm_command(args, checkpoint, tokens_per_sample, context)[1:],
            "checkpoint_sha256": checkpoint_sha256, "split_tokens": expected}


def write_record(path: str, key: dict, run: dict) -> None:
    """A finished run's record (atomically): ``{"key", "run"}``, its curve as lists."""
    from fairseq_pe.outputs import write_json

    saved = dict(run)
    if "curve" in saved:
        sums, counts = saved["curve"]
        saved["curve"] = {"sums": sums.tolist(), "counts": counts.tolist()}
    write_json(path, {"key": key, "run": saved}, indent=None)


def read_record(path: str, key: dict) -> Optional[dict]:
    """The run recorded at ``path`` when its key is ``key`` (its curve as arrays again, the same floats), else None:
    no record, an unreadable one (a run interrupted while writing is never one: records are written atomically),
    or one of another checkpoint or other options."""
    import json

    import numpy as np

    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("key") != key or not isinstance(record.get("run"), dict):
        return None
    run = record["run"]
    if "curve" in run:
        run["curve"] = (np.asarray(run["curve"]["sums"], dtype=np.float64),
                        np.asarray(run["curve"]["counts"], dtype=np.int64))
    return run


def combine(runs: Sequence[dict]) -> dict:
    """The seeds of one system at one point -> one cell: mean ± sample sd and every seed's values; refused
    when any seed was refused (the first reason)."""
    from fairseq_pe.seeds import mean_sd

    refused = [r["refused"] for r in runs if "refused" in r]
    if refused:
        return {"refused": refused[0], "seeds": len(runs)}
    ppl = [r["perplexity"] for r in runs]
    mean, sd = mean_sd(ppl)
    return {"perplexity": mean, "perplexity_sd": sd, "perplexity_seeds": ppl,
            "loss_base2_seeds": [r["loss_base2"] for r in runs], "tokens": runs[0]["tokens"], "seeds": len(runs)}


def add_relative(results: dict, lengths: Sequence[int]) -> None:
    """Each cell's perplexity relative to the same seed's at the shortest length (1 x L by default):
    ``relative`` (mean over seeds of the seeds' ratios), ``relative_sd``, ``relative_seeds``; none where either
    length was refused."""
    from fairseq_pe.seeds import mean_sd

    for modes in results.values():
        for cells in modes.values():
            reference = cells[str(lengths[0])]
            for n in lengths:
                cell = cells[str(n)]
                if "refused" in cell or "refused" in reference:
                    continue
                ratios = [p / r for p, r in zip(cell["perplexity_seeds"], reference["perplexity_seeds"])]
                cell["relative"], cell["relative_sd"] = mean_sd(ratios)
                cell["relative_seeds"] = ratios


def seconds_per_mode(runs: Dict[Run, dict], checkpoints: Dict[str, List[str]], lengths: List[int], windows: Windows,
                     modes: Sequence[str]) -> dict:
    """Per mode: the seconds of its fairseq-eval-lm runs, in all (``total``, over ``runs`` runs) and per length
    (``by_length``: the checkpoints' runs at N, summed); the run at N = S serves both modes and counts in each."""
    out = {}
    for mode in modes:
        by_length = {str(n): round(sum(runs[(path, *windows[(mode, n)])]["seconds"] for paths in checkpoints.values()
                                       for path in paths), 1) for n in lengths}
        out[mode] = {"total": round(sum(by_length.values()), 1),
                     "runs": len(lengths) * sum(map(len, checkpoints.values())), "by_length": by_length}
    return out


def format_cell(cell: dict) -> str:
    if "refused" in cell:
        return "refused"
    sd = cell.get("perplexity_sd")
    return f"{cell['perplexity']:.2f}" + ("" if sd is None else f" ± {sd:.2f}")


def format_value(mean: Optional[float], sd: Optional[float], digits: int = 3) -> str:
    if mean is None:
        return "–"
    return f"{mean:.{digits}f}" + ("" if sd is None else f" ± {sd:.{digits}f}")


def relative_table(report: dict, mode: str) -> List[str]:
    """Rows systems, columns lengths: the perplexity over the same seed's at the shortest length (nothing for one
    length)."""
    lengths = report["lengths"]
    if len(lengths) == 1:
        return []
    out = ["", f"Perplexity relative to the same checkpoint's at N = {lengths[0]} (mean ± sd over seeds of the "
           f"ratios; a system past {report['diverging']['ratio']}× is drawn in its own panel of lengths.png"
           + (f": {', '.join(report['diverging']['systems'][mode])}" if report["diverging"]["systems"][mode] else "")
           + "):", "", "| system | " + " | ".join(str(n) for n in lengths) + " |", "|---|" + "---:|" * len(lengths)]
    for system, cells in report["results"].items():
        row = ["refused" if "refused" in cells[mode][str(n)] else
               format_value(cells[mode][str(n)].get("relative"), cells[mode][str(n)].get("relative_sd"))
               for n in lengths]
        out.append(f"| {system} | " + " | ".join(row) + " |")
    return out


def positions_table(report: dict, mode: str) -> List[str]:
    """Non-overlapping windows: rows systems (each at its longest evaluated length), columns position buckets, the
    mean loss (base 2) of the tokens at those positions of the window.  Sliding windows: a note instead (their
    buckets before N - S + 1 would hold the split's first windows alone)."""
    from fairseq_pe.lm.positions import buckets

    if mode == "sliding":  # a window's positions 1..N - S hold the split's first windows alone, one token each
        return ["", f"Sliding windows score positions N − {report['stride'] - 1}..N of each window, with N − "
                f"{report['stride']} tokens of context or more: their mean loss is log2 of the perplexity above; "
                "the loss at each position is in positions.json, each N's scored positions in positions.png."]
    joined = mode == "nonoverlapping" and report.get("stitched") is not None
    longest = {s: max((n for n in report["lengths"] if "refused" not in cells[mode][str(n)]), default=0)
               for s, cells in report["results"].items()}
    top = max(longest.values(), default=0)
    if not top or (not joined and any("position_buckets" not in report["results"][s][mode][str(n)]
                                      for s, n in longest.items() if n)):
        return []
    ranges = buckets(report["train_length"], top)
    how = ("positions N_{k-1}+1..N_k read from the evaluation at N_k, each where it holds the most tokens" if joined
           else "each system at its longest evaluated N")
    out = ["", f"Loss (bits per token) by position in the window ({how}; mean ± sd over seeds; the loss curve by "
           "position in positions.json and positions.png):", "",
           "| system | N | " + " | ".join(f"{a}–{b}" for a, b in ranges) + " |", "|---|---:|" + "---:|" * len(ranges)]
    tokens = None
    for system, cells in report["results"].items():
        if not longest[system]:
            out.append(f"| {system} | refused | " + " | ".join("–" for _ in ranges) + " |")
            continue
        source = report["stitched"][system] if joined else cells[mode][str(longest[system])]
        own = {(b["first"], b["last"]): b for b in source["position_buckets"]}
        row = [format_value(own[r]["loss_base2"], own[r]["loss_base2_sd"]) if r in own else "–" for r in ranges]
        out.append(f"| {system} | {longest[system]} | " + " | ".join(row) + " |")
        if longest[system] == top:
            tokens = [own[r]["tokens"] for r in ranges]
    return out + ([f"| tokens | {top} | " + " | ".join(f"{t:,}" for t in tokens) + " |"] if tokens else [])


def time_line(report: dict, mode: str) -> str:
    seconds = report["seconds"][mode]
    shared = mode == "sliding" and str(report["stride"]) in seconds["by_length"] and "nonoverlapping" in report["modes"]
    return (f"Time: {seconds['total']:.1f} s in {seconds['runs']} fairseq-eval-lm runs "
            f"({seconds['total'] / max(1, seconds['runs']):.1f} s per run); by length, all checkpoints: "
            + ", ".join(f"N = {n}: {t:.1f} s" for n, t in seconds["by_length"].items())
            + (f" (the run at N = {report['stride']} is the non-overlapping one, counted in both modes)." if shared
               else "."))


MODE_TITLES = lengths_plot.MODE_TITLES


def markdown(report: dict) -> str:
    """``lengths.md``: per mode, the perplexity table (rows systems, columns evaluation lengths), every seed's,
    the relative perplexity, the loss by position bucket and the time."""
    L, lengths = report["train_length"], report["lengths"]
    seeds = sorted({len(c) for c in report["checkpoints"].values()})
    out = [f"# Perplexity past the training length (L = {L})", "",
           f"`{report['data']}`, split `{report['gen_subset']}` ({report['split_tokens']:,} tokens, every one scored "
           "at every point). Each cell: the perplexity of fairseq-eval-lm "
           + ("(one checkpoint per system)." if seeds == [1] else
              "as mean ± sample standard deviation over the checkpoints (seeds) of the system; every seed's value in "
              "lengths.json.")]
    refusals = []
    for mode in report["modes"]:
        how = ("blocks of N tokens, each scored whole: `--tokens-per-sample N`" if mode == "nonoverlapping" else
               f"windows of N tokens, each scoring its last {report['stride']}: `--tokens-per-sample N "
               f"--context-window N-{report['stride']}`")
        out += ["", f"## {MODE_TITLES[mode]}", "", f"fairseq-eval-lm on {how}.", "",
                "| system | " + " | ".join(f"{n} ({n // L}×)" if n % L == 0 else str(n) for n in lengths) + " |",
                "|---|" + "---:|" * len(lengths)]
        for system, cells in report["results"].items():
            row = [format_cell(cells[mode][str(n)]) for n in lengths]
            out.append(f"| {system} | " + " | ".join(row) + " |")
            refusals += [f"- {system}, {mode}, N = {n}: {cells[mode][str(n)]['refused']}" for n in lengths
                         if "refused" in cells[mode][str(n)]]
        if seeds != [1]:  # every seed's reading, in the order of its --checkpoint
            out += ["", "Every seed (checkpoint k of the system, in the order given):", "",
                    "| system | checkpoint | " + " | ".join(str(n) for n in lengths) + " |",
                    "|---|---:|" + "---:|" * len(lengths)]
            for system, cells in report["results"].items():
                for k in range(len(report["checkpoints"][system])):
                    row = ["refused" if "refused" in cells[mode][str(n)] else
                           f"{cells[mode][str(n)]['perplexity_seeds'][k]:.2f}" for n in lengths]
                    out.append(f"| {system} | {k + 1} | " + " | ".join(row) + " |")
        if "diverging" in report:
            out += relative_table(report, mode)
        out += positions_table(report, mode)
        if "seconds" in report:
            out += ["", time_line(report, mode)]
    if refusals:
        out += ["", "Refused:", ""] + refusals
    return "\n".join(out) + "\n"


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-lm-lengths", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--checkpoint", nargs="+", action="extend", required=True, metavar="NAME=PATH",
                   help="checkpoints by system name (its colour in the plot); a name given several times: its seeds")
    p.add_argument("--data", required=True, help="the binarised data folder (dict.txt, SUBSET.{bin,idx})")
    p.add_argument("--gen-subset", default="test", help="the split evaluated (default test)")
    p.add_argument("--train-length", type=int, required=True, metavar="L",
                   help="the --tokens-per-sample the checkpoints were trained with")
    p.add_argument("--multipliers", type=int, nargs="+", default=list(MULTIPLIERS),
                   help="evaluation lengths, as multiples of L (default 1 2 4 8 16)")
    p.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES), help="default: both")
    p.add_argument("--stride", type=int, default=None,
                   help="sliding windows: tokens scored per window (default L)")
    p.add_argument("--max-tokens", type=int, default=8192,
                   help="tokens of a batch, the windows' context included: max(1, M // N) windows of N tokens "
                        "(default 8192)")
    p.add_argument("--eval-lm-args", default="",
                   help="more options for every fairseq-eval-lm run, one string (e.g. \"--fp16\" or \"--cpu\")")
    p.add_argument("--jobs", type=int, default=1,
                   help="checkpoints evaluated at a time, one fairseq-eval-lm each (default 1; give each run's threads "
                        "with OMP_NUM_THREADS)")
    p.add_argument("--out", required=True, help="output folder: lengths.{md,json,png}, positions.{json,png}, logs/")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --out")
    p.add_argument("--resume", action="store_true",
                   help="continue an interrupted evaluation in --out: reuse the runs recorded in --out/runs whose "
                        "checkpoint (its SHA-256) and options are the same; run the rest")
    args = p.parse_args(argv)
    if args.train_length < 1:
        p.error("--train-length must be positive")
    if args.jobs < 1:
        p.error("--jobs must be positive")
    if any(m < 1 for m in args.multipliers):
        p.error("--multipliers must be positive integers")
    args.multipliers = sorted(set(args.multipliers))
    args.modes = list(dict.fromkeys(args.modes))
    args.stride = args.train_length if args.stride is None else args.stride
    if args.stride < 1:
        p.error("--stride must be positive")
    given = [o for o in shlex.split(args.eval_lm_args) for own in OWN_OPTIONS if o == own or o.startswith(own + "=")]
    if given:
        p.error(f"--eval-lm-args: {', '.join(given)} is set by this tool per point; use its own options "
                "(--train-length, --multipliers, --stride, --max-tokens, --gen-subset)")
    breaking = breaking_option(shlex.split(args.eval_lm_args), "sliding" in args.modes)
    if breaking:
        p.error(f"--eval-lm-args: {breaking}")
    return args


def breaking_option(options: List[str], sliding: bool) -> Optional[str]:
    """Why an option of --eval-lm-args would break the loss by position, or None: a merge of sub-words, a
    beginning-of-sentence symbol, or (sliding windows) several data-loading workers (each keeps its own context in
    fairseq's LMContextWindowDataset, so a window would get another's context)."""
    for i, option in enumerate(options):
        name, _, value = option.partition("=")
        if name in BREAKING_OPTIONS:
            return f"{name} {BREAKING_OPTIONS[name]}: the loss by position needs one score per token, in its place"
        if name == "--num-workers" and sliding:
            value = value or (options[i + 1] if i + 1 < len(options) else "")
            if not value.isdigit() or int(value) > 1:
                return (f"--num-workers {value}: sliding windows take their context from the block before, which "
                        "one data-loading worker alone keeps (give 0 or 1)")
    return None


def evaluate(args: argparse.Namespace) -> dict:
    from fairseq_pe.outputs import check_new_files, file_digest, write_json, write_text

    checkpoints = parse_checkpoints(args.checkpoint)
    lengths = [args.train_length * m for m in args.multipliers]
    windows = {(mode, n): window(n, mode, args.stride) for mode in args.modes for n in lengths}
    if not os.path.isdir(args.data):
        raise UserError(f"--data {args.data}: no such directory")
    out = os.path.abspath(args.out)
    check_new_files([os.path.join(out, name) for name in OUTPUTS], args.force, flag="--out", where=args.out)
    expected = split_tokens(args.data, args.gen_subset)
    for folder in ("logs", "runs"):
        os.makedirs(os.path.join(out, folder), exist_ok=True)
    runs: Dict[Tuple[str, int, int], dict] = {}  # (checkpoint, T, C) -> run: the same command runs once
    todo = sorted({(path, *windows[key]) for paths in checkpoints.values() for path in paths for key in windows},
                  key=lambda k: (k[0], k[1], k[2]))  # per checkpoint, shorter windows first
    log(f"{len(checkpoints)} systems, {sum(map(len, checkpoints.values()))} checkpoints, {len(todo)} fairseq-eval-lm "
        f"runs on {args.data} {args.gen_subset} ({expected:,} tokens)"
        + (f", {args.jobs} at a time" if args.jobs > 1 else ""))
    names = {path: (name, i) for name, paths in checkpoints.items() for i, path in enumerate(paths)}
    points: Dict[str, List[Tuple[int, int]]] = {}
    for path, T, C in todo:
        points.setdefault(path, []).append((T, C))
    done = itertools.count(1)
    lock = threading.Lock()
    stop = threading.Event()  # set by the first error: the other checkpoints stop at their next window

    def run_checkpoint(path: str) -> Dict[Tuple[str, int, int], dict]:
        """One checkpoint's windows, shorter first: a refused length refuses every longer window too."""
        name, seed = names[path]
        refused_at: Optional[Tuple[int, str]] = None  # the shortest window refused and why
        mine = {}
        sha256 = file_digest(path, "sha256")
        for T, C in points[path]:
            if stop.is_set():
                break
            where = f"--checkpoint {name}={path} at --tokens-per-sample {T} --context-window {C}"
            stem = re.sub(r"[^\w.+-]", "_", name) + f"-{seed + 1}-T{T}-C{C}"
            log_path = os.path.join(out, "logs", stem + ".log")
            record_path, key = os.path.join(out, "runs", stem + ".json"), record_key(args, path, sha256, T, C, expected)
            reused = False
            if refused_at is not None and T >= refused_at[0]:
                run = {"refused": f"not run: refused at N = {refused_at[0]} already ({refused_at[1]})",
                       "seconds": 0.0}
            else:
                run = read_record(record_path, key) if args.resume else None
                reused = run is not None
                if not reused:
                    run = run_point(args, path, T, C, expected, log_path, where)
                    write_record(record_path, key, run)
                if "refused" in run:
                    refused_at = (T, run["refused"])
            mine[(path, T, C)] = run
            result = (f"refused: {run['refused']}" if "refused" in run else
                      f"perplexity {run['perplexity']:.2f} over {run['tokens']:,} tokens")
            took = (f"{run['seconds']:.1f} s" if not reused else
                    f"recorded in {os.path.relpath(record_path, out)}, {run['seconds']:.1f} s then")
            with lock:
                log(f"[{next(done)}/{len(todo)}] {name} (checkpoint {seed + 1} of {len(checkpoints[name])}) N = {T}, "
                    f"context {C}: {result} ({took})")
        return mine

    # checkpoints in parallel (--jobs), each one's windows in order; the first error stops the others at their next
    # window; the report lists the runs in the order of --jobs 1
    collected: Dict[Tuple[str, int, int], dict] = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [pool.submit(run_checkpoint, path) for path in points]
        try:
            for future in concurrent.futures.as_completed(futures):
                collected.update(future.result())
        except BaseException:
            stop.set()
            for future in futures:
                future.cancel()
            raise
    runs.update((key, collected[key]) for key in todo)
    curves = {key: run.pop("curve") for key, run in runs.items() if "curve" in run}
    results = build_results(checkpoints, lengths, windows, runs, curves, args)
    report = {"data": args.data, "gen_subset": args.gen_subset, "split_tokens": expected,
              "train_length": args.train_length, "multipliers": args.multipliers, "lengths": lengths,
              "modes": args.modes, "stride": args.stride, "eval_lm_args": args.eval_lm_args,
              "checkpoints": checkpoints, "results": results, "relative_to": lengths[0],
              "seconds": seconds_per_mode(runs, checkpoints, lengths, windows, args.modes),
              "runs": {f"{path} T={T} C={C}": run for (path, T, C), run in runs.items()}}
    report["diverging"] = {"ratio": lengths_plot.DIVERGING_RATIO,
                           "systems": {mode: lengths_plot.diverging(report, mode) for mode in args.modes}}
    stitched = stitched_curves(report, windows, curves)
    add_stitched(report, stitched)
    write_json(os.path.join(out, "lengths.json"), report)
    positions = positions_report(report, windows, curves, stitched)
    write_json(os.path.join(out, "positions.json"), positions, indent=None)
    table = markdown(report)
    write_text(os.path.join(out, "lengths.md"), table)
    lengths_plot.plot_lengths(report, os.path.join(out, "lengths.png"))
    lengths_plot.plot_positions(positions, os.path.join(out, "positions.png"))
    print(table, flush=True)
    log(f"wrote {out}/{', '.join(OUTPUTS)}")
    return report


def build_results(checkpoints: Dict[str, List[str]], lengths: List[int], windows: Windows, runs: Dict[Run, dict],
                  curves: Dict[Run, tuple], args: argparse.Namespace) -> dict:
    """``{system: {mode: {N: cell}}}``: the seeds' perplexity (:func:`combine`), the window's options, the loss by
    position bucket (``position_buckets``: :func:`fairseq_pe.lm.positions.bucket_values`) and the perplexity
    relative to the shortest length (:func:`add_relative`)."""
    from fairseq_pe.lm import positions

    results = {}
    for name, paths in checkpoints.items():
        results[name] = {}
        for mode in args.modes:
            results[name][mode] = {}
            for n in lengths:
                keys = [(path, *windows[(mode, n)]) for path in paths]
                cell = dict(combine([runs[k] for k in keys]), tokens_per_sample=windows[(mode, n)][0],
                            context_window=windows[(mode, n)][1])
                if "refused" not in cell:
                    cell["position_buckets"] = positions.bucket_values([curves[k] for k in keys],
                                                                       positions.buckets(args.train_length, n))
                results[name][mode][str(n)] = cell
    add_relative(results, lengths)
    return results


def stitched_curves(report: dict, windows: Windows, curves: Dict[Run, tuple]) -> Dict[str, dict]:
    """Per system, its non-overlapping curves joined (:func:`fairseq_pe.lm.positions.stitch`) over the lengths it
    was not refused: ``{"n"`` (the longest), ``"from_lengths"``, ``"seeds"`` (each checkpoint's (sums, counts))``}``;
    {} without the non-overlapping mode."""
    from fairseq_pe.lm import positions

    if "nonoverlapping" not in report["modes"]:
        return {}
    out = {}
    for name, cells in report["results"].items():
        lengths = [n for n in report["lengths"] if "refused" not in cells["nonoverlapping"][str(n)]]
        if lengths:
            seeds = [positions.stitch([(n, curves[(path, *windows[("nonoverlapping", n)])]) for n in lengths])
                     for path in report["checkpoints"][name]]
            out[name] = {"n": lengths[-1], "from_lengths": lengths, "seeds": seeds}
    return out


def add_stitched(report: dict, stitched: Dict[str, dict]) -> None:
    """``report["stitched"]``: per system, the joined curve's position buckets (for lengths.md)."""
    from fairseq_pe.lm import positions

    report["stitched"] = {name: {"n": s["n"], "from_lengths": s["from_lengths"],
                                 "position_buckets": positions.bucket_values(
                                     s["seeds"], positions.buckets(report["train_length"], s["n"]))}
                          for name, s in stitched.items()}


def positions_report(report: dict, windows: Windows, curves: Dict[Run, tuple], stitched: Dict[str, dict]) -> dict:
    """``positions.json``: the loss by window position of every system, mode and length
    (:func:`fairseq_pe.lm.positions.combine_curves`: lists over positions 1..N), or the refusal; the joined
    non-overlapping curves (``stitched``, :func:`stitched_curves`)."""
    from fairseq_pe.lm import positions

    results = {name: {mode: {str(n): ({"refused": cells[mode][str(n)]["refused"]} if "refused" in cells[mode][str(n)]
                                      else positions.combine_curves([curves[(path, *windows[(mode, n)])]
                                                                     for path in report["checkpoints"][name]]))
                             for n in report["lengths"]} for mode in report["modes"]}
               for name, cells in report["results"].items()}
    keep = ("data", "gen_subset", "split_tokens", "train_length", "lengths", "modes", "stride", "checkpoints")
    stitched = {name: dict(positions.combine_curves(s["seeds"]), n=s["n"], from_lengths=s["from_lengths"])
                for name, s in stitched.items()}
    return dict({k: report[k] for k in keep}, results=results, stitched=stitched)


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`UserError` ends as ``fairseq-pe-lm-lengths: error: ...``, status 2."""
    evaluate(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
