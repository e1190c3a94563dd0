"""``fairseq-pe-lm-lengths``: a language model's perplexity at its training length L and past it, the
length-extrapolation benchmark of ALiBi (Press et al., ICLR 2022, Figure 1 and Tables 1-2) and KERPLE
(Chi et al., NeurIPS 2022, Table 3), for one or more checkpoints.

    fairseq-pe-lm-lengths --data data-bin/lm_en --train-length 64 \\
        --checkpoint alibi=ckpt/alibi-1/checkpoint_best.pt alibi=ckpt/alibi-2/checkpoint_best.pt \\
                     rope=ckpt/rope-1/checkpoint_best.pt --out results/lengths

Each point is one ``fairseq-eval-lm DATA --path CKPT --user-dir fairseq_pe --gen-subset SUBSET
--sample-break-mode none --tokens-per-sample T --context-window C --max-tokens M`` (a subprocess), at
every evaluation length N = L x ``--multipliers`` (default 1 2 4 8 16) and in every ``--modes``:

* ``nonoverlapping``: the split cut into blocks of N tokens, each scored whole (the first token of a block
  sees no context): ``T = N, C = 0`` (ALiBi's "nonoverlapping" evaluation);
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

Several checkpoints of one NAME are seeds: each cell is their mean ± sample standard deviation
(:mod:`fairseq_pe.seeds`), every seed's value in the JSON.  ``--out DIR`` gets ``lengths.md`` (a table per
mode: rows systems, columns lengths), ``lengths.json``, ``lengths.png`` (perplexity against evaluation length,
log2 x axis, one line per system in the colours of :mod:`fairseq_pe.plotting`, a panel per mode) and
``logs/`` (each fairseq-eval-lm run's output, rewritten by the next run), written atomically, the results
never over an earlier result without ``--force``.  ``--jobs J`` evaluates J checkpoints at a time (each one's
windows in order, shorter first; the report is the same as one at a time).  ``--max-tokens M``: batches of
max(1, M // N) windows of N tokens, context included (fairseq's own ``--max-tokens`` counts a sliding window's
new tokens only).
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
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli

MODES = ("nonoverlapping", "sliding")
MULTIPLIERS = (1, 2, 4, 8, 16)
OUTPUTS = ("lengths.md", "lengths.json", "lengths.png")  # logs/ (each run's output) is rewritten
#: options every run sets itself: refused in --eval-lm-args
OWN_OPTIONS = ("--path", "--user-dir", "--gen-subset", "--tokens-per-sample", "--context-window", "--max-tokens",
               "--sample-break-mode")
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_EVALUATED = re.compile(r"Evaluated ([\d,]+) tokens in")
_LOSS = re.compile(r"Loss \(base 2\): ([-\d.naninf]+), Perplexity: ([-\d.naninf]+)")
_INF_SKIPPED = "skipping tokens with inf scores"
_ERROR_LINE = re.compile(r"^\S+: error: (.+)$", re.MULTILINE)


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
    """The reason of a refusal by name of a window longer than the training length: a user error (exit status 2,
    ``fairseq-eval-lm: error: ...``, no usage line of a bad option) at N > L, or one naming
    ``--tokens-per-sample`` (a learned table's: the size filter names it, the table itself names
    ``--max-target-positions``); else None (an error of the whole run)."""
    errors = _ERROR_LINE.findall(output)
    if returncode != 2 or not errors or re.search(r"^usage: ", output, re.MULTILINE):
        return None
    reason = errors[-1].strip()
    return reason if past_training_length or "--tokens-per-sample" in reason else None


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
            *shlex.split(args.eval_lm_args)]


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


def run_logged(cmd: List[str], log_path: str) -> Tuple[subprocess.CompletedProcess, float]:
    """A fairseq tool as a subprocess, its output (stdout and stderr in one stream) written to ``log_path`` after the
    command: (the process, its seconds)."""
    from fairseq_pe.outputs import write_text

    start = time.time()
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    write_text(log_path, f"$ {shlex.join(cmd)}\n{proc.stdout}")
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
    """One fairseq-eval-lm run: ``{"perplexity", "loss_base2", "tokens", "seconds"}`` or ``{"refused": reason}``."""
    proc, seconds = run_logged(eval_lm_command(args, checkpoint, tokens_per_sample, context), log_path)
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
    return {"perplexity": parsed["perplexity"], "loss_base2": parsed["loss_base2"], "tokens": parsed["tokens"],
            "seconds": round(seconds, 1)}


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


def format_cell(cell: dict) -> str:
    if "refused" in cell:
        return "refused"
    sd = cell.get("perplexity_sd")
    return f"{cell['perplexity']:.2f}" + ("" if sd is None else f" ± {sd:.2f}")


MODE_TITLES = {"nonoverlapping": "Non-overlapping windows", "sliding": "Sliding windows"}


def markdown(report: dict) -> str:
    """The tables of ``lengths.md``: one per mode, rows systems, columns evaluation lengths."""
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
    if refusals:
        out += ["", "Refused:", ""] + refusals
    return "\n".join(out) + "\n"


def plot(report: dict, path: str) -> None:
    """Perplexity against evaluation length (log2 x, log y), one line per system, one panel per mode."""
    from fairseq_pe.outputs import savefig
    from fairseq_pe.plotting import pyplot, system_styles

    plt = pyplot()
    from matplotlib.ticker import NullFormatter, ScalarFormatter
    import logging

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's logging setup lets its DEBUG lines out
    modes, lengths = report["modes"], report["lengths"]
    styles = system_styles(list(report["results"]))
    beside = len(report["results"]) > 12  # the legend beside the panels, in columns, not over the curves
    columns = 1 + len(report["results"]) // 14
    width = 5.5 * len(modes) + (2.2 * columns if beside else 0)
    fig, axes = plt.subplots(1, len(modes), figsize=(width, 4.2), squeeze=False, sharey=True)
    for ax, mode in zip(axes[0], modes):
        for system, cells in report["results"].items():
            xs = [n for n in lengths if "refused" not in cells[mode][str(n)]]
            ys = [cells[mode][str(n)]["perplexity"] for n in xs]
            sds = [cells[mode][str(n)]["perplexity_sd"] or 0.0 for n in xs]
            refused = [n for n in lengths if "refused" in cells[mode][str(n)]]
            label = system + (f" (refused from N = {refused[0]})" if refused else "")
            if xs:
                ax.errorbar(xs, ys, yerr=sds if any(sds) else None, label=label, capsize=2, markersize=5,
                            **styles[system])
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.yaxis.set_major_formatter(ScalarFormatter())
        low, high = ax.get_ylim()  # minor ticks labelled within a decade only (they crowd a wider range)
        ax.yaxis.set_minor_formatter(ScalarFormatter() if high < 10 * low else NullFormatter())
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.axvline(report["train_length"], color="0.6", linewidth=0.8, linestyle=":")
        ax.set_xlabel("evaluation length N (tokens)")
        ax.set_title(MODE_TITLES[mode] + ("" if mode == "nonoverlapping" else f" (stride {report['stride']})"))
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel(f"perplexity ({report['gen_subset']})")
    axes[0][-1].legend(fontsize=7, **(dict(loc="upper left", bbox_to_anchor=(1.02, 1.0), ncol=columns) if beside
                                      else dict(loc="best")))
    fig.tight_layout()
    savefig(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


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
    p.add_argument("--out", required=True, help="output folder: lengths.{md,json,png}, logs/")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --out")
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
    return args


def evaluate(args: argparse.Namespace) -> dict:
    from fairseq_pe.outputs import check_new_files, write_json, write_text

    checkpoints = parse_checkpoints(args.checkpoint)
    lengths = [args.train_length * m for m in args.multipliers]
    windows = {(mode, n): window(n, mode, args.stride) for mode in args.modes for n in lengths}
    if not os.path.isdir(args.data):
        raise UserError(f"--data {args.data}: no such directory")
    out = os.path.abspath(args.out)
    check_new_files([os.path.join(out, name) for name in OUTPUTS], args.force, flag="--out", where=args.out)
    expected = split_tokens(args.data, args.gen_subset)
    os.makedirs(os.path.join(out, "logs"), exist_ok=True)
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
        for T, C in points[path]:
            if stop.is_set():
                break
            where = f"--checkpoint {name}={path} at --tokens-per-sample {T} --context-window {C}"
            log_path = os.path.join(out, "logs", re.sub(r"[^\w.+-]", "_", name) + f"-{seed + 1}-T{T}-C{C}.log")
            if refused_at is not None and T >= refused_at[0]:
                run = {"refused": f"not run: refused at N = {refused_at[0]} already ({refused_at[1]})",
                       "seconds": 0.0}
            else:
                run = run_point(args, path, T, C, expected, log_path, where)
                if "refused" in run:
                    refused_at = (T, run["refused"])
            mine[(path, T, C)] = run
            result = (f"refused: {run['refused']}" if "refused" in run else
                      f"perplexity {run['perplexity']:.2f} over {run['tokens']:,} tokens")
            with lock:
                log(f"[{next(done)}/{len(todo)}] {name} (checkpoint {seed + 1} of {len(checkpoints[name])}) N = {T}, "
                    f"context {C}: {result} ({run['seconds']:.1f} s)")
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
    results = {name: {mode: {str(n): dict(combine([runs[(path, *windows[(mode, n)])] for path in paths]),
                                          tokens_per_sample=windows[(mode, n)][0],
                                          context_window=windows[(mode, n)][1])
                             for n in lengths} for mode in args.modes}
               for name, paths in checkpoints.items()}
    report = {"data": args.data, "gen_subset": args.gen_subset, "split_tokens": expected,
              "train_length": args.train_length, "multipliers": args.multipliers, "lengths": lengths,
              "modes": args.modes, "stride": args.stride, "eval_lm_args": args.eval_lm_args,
              "checkpoints": checkpoints, "results": results,
              "runs": {f"{path} T={T} C={C}": run for (path, T, C), run in runs.items()}}
    write_json(os.path.join(out, "lengths.json"), report)
    table = markdown(report)
    write_text(os.path.join(out, "lengths.md"), table)
    plot(report, os.path.join(out, "lengths.png"))
    print(table, flush=True)
    log(f"wrote {out}/lengths.md, lengths.json, lengths.png")
    return report


@cli
def main(argv: Optional[List[str]] = None) -> int:
    """A :class:`UserError` ends as ``fairseq-pe-lm-lengths: error: ...``, status 2."""
    evaluate(parse_args(argv))
    return 0


if __name__ == "__main__":
    sys.exit(main())
