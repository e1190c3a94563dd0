"""``fairseq-pe-counting``: CoPE's counting task (Golovneva et al. 2024, "Contextual Position Encoding: Learning to
Count What's Important", §5.2), as a language model's question-answer lines, and the answer accuracy of checkpoints
on it, in the training lengths and past them.

A sample is a program of ``steps`` statements on ``--nvars`` variables and a question:

    a = 0 ; pass; pass; a ++; pass; b = 0 ; pass; a ++; pass; ... print a 2

``a = 0 ;`` sets a variable to 0, ``a ++;`` adds one to a variable already set (never past 10), ``pass;`` does
nothing; the question ``print a`` asks the value of a variable that is set, and its answer (the last token) is the
number of ``a ++;`` since the last ``a = 0 ;``: a count of the statements that matter among many that do not, what
CoPE's gates can learn to count and a position that counts tokens cannot.  Statements are drawn with the weights of
the reference's generator (``facebookresearch/RAM``, ``projects/cope/scripts/count_data_gen.py``: set 1, pass 50,
increment 7, values at most 10, a draw that cannot apply drawn again, ``steps`` uniform in [3, max]), read and
written here, not copied; its text is the reference's, one token per space-separated word.

The reference trains on programs of up to 512 statements and tests on the same lengths.  Here, at CPU scale,
``--max-steps S`` (default 64) trains and ``test-1x`` tests in the same range [3, S], and the tests ``test-Kx`` of
``--length-factors`` (default 1 2 4) hold programs of (S·K/2, S·K] statements: longer than any training program, the
extrapolation question of this project.  A longer program also has larger answers (more increments): 89% of the
training answers are at most 4, and test-4x's commonest answer is 10.  So each test-Kx has a twin, test-Kx-small, of
the same lengths and answers of at most ``--small-answers`` (default 4), drawn until the answer is that small: a
model that counts fails on neither, one that only learned the training's answers fails on test-Kx alone.  Every split
is drawn from its own seed (``--seed`` + a split's index: the splits before the -small ones are the same without
them).

``fairseq-pe-counting data --out DIR``: ``DIR/{train,valid,test-1x,test-2x,test-4x}.txt``, the
``test-{1,2,4}x-small.txt`` and ``stats.json``
(samples, statements and tokens per split).  Binarise with ``fairseq-preprocess --only-source``, train with
``--task language_modeling --sample-break-mode eos --criterion answer_cross_entropy`` (the loss on the answer
only, the reference's ``--train-on answer``: :mod:`fairseq_pe.criterions.answer_cross_entropy`).

``fairseq-pe-counting score --data BIN --checkpoint NAME=PATH ... --subsets LABEL=SUBSET ... --out DIR``: each
checkpoint through ``fairseq-validate`` on every subset (its saved criterion: the answer's accuracy, greedy
decoding's exact match), every answer of the subset checked scored; several checkpoints of a NAME are seeds (mean ±
sample sd, every seed's value).  ``DIR/counting.{md,json,png}``, ``DIR/logs/``; never over an earlier result without
``--force``.  ``scripts/recipes/lm-cpu-counting.sh`` runs it all.
"""

import argparse
import os
import random
import re
import shlex
import time
from typing import Dict, List, Optional, Sequence, Tuple

from fairseq_pe.errors import UserError, cli

VARIABLES = "abcdefghijklmnopqrstuvwxyz"
MAX_VALUE = 10
#: the reference generator's draw weights
WEIGHTS = {"set": 1, "pass": 50, "increment": 7}
MIN_STEPS = 3
PLUGIN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def log(msg: str) -> None:
    print(f"[counting {time.strftime('%H:%M:%S')}] {msg}", flush=True)


class _Redraw(Exception):
    """A statement (or a question) that cannot apply to the variables as they are: drawn again."""


def _statement(rng: random.Random, names: str, values: Dict[str, int]) -> str:
    kind = rng.choices(list(WEIGHTS), weights=list(WEIGHTS.values()))[0]
    if kind == "set":
        name = rng.choice(names)
        values[name] = 0
        return f"{name} = 0 ;"
    if kind == "pass":
        return "pass;"
    if not values:
        raise _Redraw
    name = rng.choice(list(values))
    if values[name] + 1 > MAX_VALUE:
        raise _Redraw
    values[name] += 1
    return f"{name} ++;"


def program(rng: random.Random, nvars: int, steps: int) -> Tuple[str, str, int]:
    """One sample of ``steps`` statements: ``(context and question, answer, the answer's value)``."""
    names = VARIABLES[:nvars]
    for _ in range(1000):
        values: Dict[str, int] = {}
        statements = []
        for _ in range(steps):
            for _ in range(100):
                try:
                    statements.append(_statement(rng, names, values))
                    break
                except _Redraw:
                    continue
            else:
                raise RuntimeError("counting: no statement applies after 100 draws")
        if values:
            name = rng.choice(list(values))
            return " ".join(statements) + f" print {name}", str(values[name]), values[name]
    raise RuntimeError(f"counting: no variable was set in 1000 programs of {steps} statements")


def evaluate(line: str) -> int:
    """The answer of a sample's text by running its program (the tests' independent check of :func:`program`)."""
    words = line.split()
    values: Dict[str, int] = {}
    i = 0
    while words[i] != "print":
        if words[i] == "pass;":
            i += 1
        elif words[i + 1] == "++;":
            values[words[i]] += 1
            i += 2
        else:
            assert words[i + 1: i + 4] == ["=", "0", ";"], words[i: i + 4]
            values[words[i]] = 0
            i += 4
    return values[words[i + 1]]


def split_ranges(max_steps: int, factors: Sequence[int], small_answers: Optional[int] = None
                 ) -> Dict[str, Tuple[int, int]]:
    """The statements' range of each split: train, valid and test-1x in [3, S]; test-Kx (K > 1) in (S·K/2, S·K];
    with ``small_answers``, test-Kx-small in the same ranges after them (their answers at most that value)."""
    ranges = {"train": (MIN_STEPS, max_steps), "valid": (MIN_STEPS, max_steps)}
    for k in factors:
        ranges[f"test-{k}x"] = (MIN_STEPS, max_steps) if k == 1 else (max_steps * k // 2 + 1, max_steps * k)
    if small_answers is not None:
        for k in factors:
            ranges[f"test-{k}x-small"] = ranges[f"test-{k}x"]
    return ranges


def write_data(args) -> dict:
    from fairseq_pe.outputs import atomic_open, check_new_files, write_json

    ranges = split_ranges(args.max_steps, args.length_factors, args.small_answers)
    sizes = {name: args.test for name in ranges}
    sizes.update(train=args.train, valid=args.valid)
    paths = [os.path.join(args.out, f"{name}.txt") for name in ranges] + [os.path.join(args.out, "stats.json")]
    check_new_files(paths, force=args.force)
    os.makedirs(args.out, exist_ok=True)
    stats = {"nvars": args.nvars, "max_steps": args.max_steps, "seed": args.seed, "max_value": MAX_VALUE,
             "weights": WEIGHTS, "splits": {}}
    for index, (name, (low, high)) in enumerate(ranges.items()):
        rng = random.Random(args.seed * 1000 + index)
        cap = args.small_answers if name.endswith("-small") else MAX_VALUE
        tokens, answers = [], []
        with atomic_open(os.path.join(args.out, f"{name}.txt")) as f:
            for _ in range(sizes[name]):
                value = cap + 1
                while value > cap:  # the -small tests: programs drawn until the answer is small enough
                    text, answer, value = program(rng, args.nvars, rng.randint(low, high))
                line = f"{text} {answer}"
                f.write(line + "\n")
                tokens.append(len(line.split()) + 1)  # </s>
                answers.append(value)
        stats["splits"][name] = {"samples": sizes[name], "statements": [low, high],
                                 "tokens_min": min(tokens), "tokens_max": max(tokens),
                                 "tokens_mean": round(sum(tokens) / len(tokens), 1),
                                 "answers": {str(v): answers.count(v) for v in range(MAX_VALUE + 1)}}
        log(f"{name}: {sizes[name]:,} programs of {low}-{high} statements, {min(tokens)}-{max(tokens)} tokens")
    write_json(os.path.join(args.out, "stats.json"), stats)
    return stats


# ----------------------------------------------------------------------------------------------------- scoring

_VALID = re.compile(r"valid on '([^']+)' subset \| (.*)$", re.MULTILINE)


def parse_validate(output: str) -> Dict[str, dict]:
    """fairseq-validate's lines ``valid on 'SUBSET' subset | loss L | ... | accuracy A | answers N ...`` ->
    ``{SUBSET: {"loss": L, "accuracy": A, "answers": N}}``."""
    out = {}
    for subset, fields in _VALID.findall(output):
        values = {}
        for item in fields.split(" | "):
            key, _, value = item.strip().partition(" ")
            try:
                values[key] = float(value)
            except ValueError:
                continue
        if "accuracy" not in values or "answers" not in values:
            raise ValueError(f"no accuracy/answers on the line of {subset!r} (was the checkpoint trained with "
                             f"--criterion answer_cross_entropy?)")
        out[subset] = {"loss": values.get("loss"), "accuracy": values["accuracy"], "answers": int(values["answers"])}
    return out


def subset_samples(data: str, subset: str) -> int:
    from fairseq.data import data_utils

    dataset = data_utils.load_indexed_dataset(os.path.join(data, subset), None)
    if dataset is None:
        raise UserError(f"--data {data} --subsets ...={subset}: no {subset}.bin/{subset}.idx there")
    return len(dataset)


def score_checkpoint(args, checkpoint: str, subsets: Dict[str, str], expected: Dict[str, int], log_path: str,
                     where: str) -> Dict[str, dict]:
    from fairseq_pe.lm.extrapolation import failed, fairseq_executable, run_logged

    cmd = [fairseq_executable("fairseq-validate"), args.data, "--path", checkpoint, "--user-dir", PLUGIN_DIR,
           "--task", "language_modeling", "--valid-subset", ",".join(subsets.values()),
           "--max-tokens", str(args.max_tokens), *shlex.split(args.validate_args)]
    proc, seconds = run_logged(cmd, log_path)
    if proc.returncode != 0:
        raise failed(where, "fairseq-validate", proc, log_path)
    try:
        parsed = parse_validate(proc.stdout)
    except ValueError as e:
        raise UserError(f"{where}: {e}; see {log_path}") from None
    out = {}
    for label, subset in subsets.items():
        if subset not in parsed:
            raise UserError(f"{where}: fairseq-validate printed no result for {subset}; see {log_path}")
        if parsed[subset]["answers"] != expected[subset]:
            raise UserError(f"{where}: fairseq-validate scored {parsed[subset]['answers']:,} of the "
                            f"{expected[subset]:,} answers of {subset} (it skips samples longer than the model's "
                            f"max positions): train with a larger --tokens-per-sample, or see {log_path}")
        out[label] = parsed[subset]
    log(f"{where}: " + ", ".join(f"{label} {r['accuracy']:.1f}%" for label, r in out.items())
        + f" ({seconds:.0f} s)")
    return out


def markdown(report: dict) -> str:
    labels = list(report["subsets"])
    seeds = sorted({len(v) for v in report["checkpoints"].values()})
    out = ["# CoPE's counting task: the answer's accuracy (%)", "",
           f"`{report['data']}`: each subset's every answer scored by fairseq-validate (greedy exact match). "
           + ("One checkpoint per system." if seeds == [1] else
              "Mean ± sample standard deviation over the checkpoints (seeds) of each system; every seed below."), "",
           "| system | " + " | ".join(f"{label} (`{report['subsets'][label]}`)" for label in labels) + " |",
           "|---|" + "---:|" * len(labels)]
    for system, cells in report["results"].items():
        row = []
        for label in labels:
            c = cells[label]
            row.append(f"{c['accuracy']:.1f}" + ("" if c["accuracy_sd"] is None else f" ± {c['accuracy_sd']:.1f}"))
        out.append(f"| {system} | " + " | ".join(row) + " |")
    if seeds != [1]:
        out += ["", "Every seed (checkpoint k of the system, in the order given):", "",
                "| system | checkpoint | " + " | ".join(labels) + " |", "|---|---:|" + "---:|" * len(labels)]
        for system, cells in report["results"].items():
            for k in range(len(report["checkpoints"][system])):
                out.append(f"| {system} | {k + 1} | "
                           + " | ".join(f"{cells[label]['accuracy_seeds'][k]:.1f}" for label in labels) + " |")
    return "\n".join(out) + "\n"


def plot_panels(labels: Sequence[str]) -> Dict[str, List[str]]:
    """The plot's panels: the labels grouped by what follows their first "-" (``2x-small``: panel "small", tick
    ``2x``), the labels without one in the first panel, "all answers"."""
    panels: Dict[str, List[str]] = {}
    for label in labels:
        _, _, group = label.partition("-")
        panels.setdefault(group or "all answers", []).append(label)
    return panels


def plot(report: dict, path: str) -> None:
    """Accuracy against the test programs' length, one line per system, a panel per group of subsets."""
    from fairseq_pe.outputs import savefig
    from fairseq_pe.plotting import pyplot, system_styles
    import logging

    plt = pyplot()
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    panels = plot_panels(list(report["subsets"]))
    styles = system_styles(list(report["results"]))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.5 * len(panels) + 1.6, 4.2), squeeze=False, sharey=True)
    for ax, (group, labels) in zip(axes[0], panels.items()):
        xs = list(range(len(labels)))
        for system, cells in report["results"].items():
            ys = [cells[label]["accuracy"] for label in labels]
            sds = [cells[label]["accuracy_sd"] or 0.0 for label in labels]
            ax.errorbar(xs, ys, yerr=sds if any(sds) else None, label=system, capsize=2, markersize=5,
                        **styles[system])
        ax.set_xticks(xs)
        ax.set_xticklabels([label.partition("-")[0] for label in labels])
        ax.set_xlabel("test programs")
        ax.set_title(group if group == "all answers" else f"answers: {group}")
        ax.set_ylim(0, 100)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("answer accuracy (%)")
    axes[0][-1].legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0))
    fig.suptitle("CoPE's counting task")
    fig.tight_layout()
    savefig(fig, path, dpi=120, bbox_inches="tight")
    plt.close(fig)


def score(args) -> dict:
    from fairseq_pe.lm.extrapolation import parse_checkpoints
    from fairseq_pe.outputs import check_new_files, write_json, write_text
    from fairseq_pe.seeds import mean_sd

    checkpoints = parse_checkpoints(args.checkpoint)
    subsets: Dict[str, str] = {}
    for spec in args.subsets:
        label, sep, subset = spec.partition("=")
        if not sep or not label or not subset:
            raise UserError(f"--subsets {spec}: expected LABEL=SUBSET (e.g. 2x=test1, the binarised split's name)")
        if label in subsets:
            raise UserError(f"--subsets: the label {label} is given twice")
        subsets[label] = subset
    expected = {subset: subset_samples(args.data, subset) for subset in subsets.values()}
    outputs = [os.path.join(args.out, f"counting.{ext}") for ext in ("md", "json", "png")]
    check_new_files(outputs, force=args.force)
    os.makedirs(os.path.join(args.out, "logs"), exist_ok=True)
    per_seed: Dict[str, List[Dict[str, dict]]] = {}
    for system, paths in checkpoints.items():
        per_seed[system] = [score_checkpoint(args, path, subsets, expected,
                                             os.path.join(args.out, "logs", f"{system}-{k + 1}.log"),
                                             f"{system} ({path})") for k, path in enumerate(paths)]
    results = {}
    for system, runs in per_seed.items():
        results[system] = {}
        for label in subsets:
            values = [run[label]["accuracy"] for run in runs]
            mean, sd = mean_sd(values)
            results[system][label] = {"accuracy": mean, "accuracy_sd": sd, "accuracy_seeds": values,
                                      "loss_base2_seeds": [run[label]["loss"] for run in runs],
                                      "answers": runs[0][label]["answers"]}
    report = {"data": args.data, "subsets": subsets, "checkpoints": checkpoints, "results": results}
    write_json(outputs[1], report)
    write_text(outputs[0], markdown(report))
    plot(report, outputs[2])
    log(f"wrote {', '.join(outputs)}")
    return report


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-counting", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    d = sub.add_parser("data", help="write the task's text splits")
    d.add_argument("--out", required=True, help="folder of {train,valid,test-Kx}.txt and stats.json")
    d.add_argument("--nvars", type=int, default=3, help="variables (1-26; the reference's default 3)")
    d.add_argument("--max-steps", type=int, default=64,
                   help="statements of the longest training program (default 64; the reference's 512)")
    d.add_argument("--length-factors", type=int, nargs="+", default=[1, 2, 4],
                   help="test-Kx per K: programs of (S·K/2, S·K] statements, test-1x [3, S] (default 1 2 4)")
    d.add_argument("--train", type=int, default=10000, help="training programs (the reference's 10000)")
    d.add_argument("--valid", type=int, default=1000, help="(the reference's 1000)")
    d.add_argument("--test", type=int, default=1000, help="programs of each test split (the reference's 1000)")
    d.add_argument("--small-answers", type=int, default=4, metavar="N",
                   help="also test-Kx-small per K: programs of the same lengths whose answer is at most N (default 4: "
                        "the values of 89%% of the training answers), so that a longer program does not also mean "
                        "larger counts than training taught; a negative N leaves them out")
    d.add_argument("--seed", type=int, default=1)
    d.add_argument("--force", action="store_true", help="replace the files of an earlier run in --out")
    s = sub.add_parser("score", help="the answer accuracy of checkpoints on binarised splits")
    s.add_argument("--data", required=True, help="the binarised folder (dict.txt, SUBSET.{bin,idx})")
    s.add_argument("--checkpoint", nargs="+", action="extend", required=True, metavar="NAME=PATH",
                   help="checkpoints by system name; a name given several times: its seeds")
    s.add_argument("--subsets", nargs="+", required=True, metavar="LABEL=SUBSET",
                   help="the splits scored and their labels, e.g. 1x=test 2x=test1 4x=test2")
    s.add_argument("--max-tokens", type=int, default=8192, help="fairseq-validate's --max-tokens (default 8192)")
    s.add_argument("--validate-args", default="", help="more options for fairseq-validate, one string (\"--cpu\")")
    s.add_argument("--out", required=True, help="output folder: counting.{md,json,png}, logs/")
    s.add_argument("--force", action="store_true", help="replace the files of an earlier run in --out")
    args = p.parse_args(argv)
    if args.command == "data":
        if not 1 <= args.nvars <= len(VARIABLES):
            p.error(f"--nvars must be in 1-{len(VARIABLES)}")
        if args.max_steps < MIN_STEPS:
            p.error(f"--max-steps must be at least {MIN_STEPS}")
        if any(k < 1 for k in args.length_factors) or len(set(args.length_factors)) != len(args.length_factors):
            p.error("--length-factors: distinct positive integers")
        if min(args.train, args.valid, args.test) < 1:
            p.error("--train, --valid and --test must be positive")
        if args.small_answers < 0:
            args.small_answers = None
        elif args.small_answers >= MAX_VALUE:
            p.error(f"--small-answers must be below {MAX_VALUE}, the largest value (or negative: no small tests)")
    return args


@cli
def main(argv: Optional[List[str]] = None) -> None:
    args = parse_args(argv)
    if args.command == "data":
        write_data(args)
    else:
        score(args)


if __name__ == "__main__":
    main()
