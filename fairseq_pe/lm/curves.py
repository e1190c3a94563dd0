"""``fairseq-pe-lm-curves``: a language model's validation loss against the tokens it has seen, read from
fairseq-train's logs, for the pilot that chooses a model's size (issue 58: "loss at 1×L against tokens seen for two
or three sizes").

    fairseq-pe-lm-curves --run tiny/none=pilot/tiny-none/train.log tiny/alibi=pilot/tiny-alibi/train.log \\
                               small/none=pilot/small-none/train.log ... --reference none --out pilot/curves

Each ``--run NAME=LOG`` is one fairseq-train log (``--log-format simple``, validated every few updates with
``--validate-interval-updates``).  Its points are fairseq's own ``valid on 'SUBSET' subset | loss X | ...
| num_updates N`` lines (the loss in base 2, as fairseq prints it; the split's windows are ``--tokens-per-sample``
long, so this is the loss at 1×L), one per update count (a validation that fairseq repeats at the same update, as
it does when a save and the interval coincide, counts once), and the tokens seen at N updates are the sum of the
``train_inner`` lines' ``wpb`` × the updates each covers.  A NAME of the form SIZE/SYSTEM groups the runs: the
table gives each run's loss at each point, and, with ``--reference SYSTEM``, each system's difference from the
reference of the same size at the same update.  The training's time is fairseq's ``done training in S seconds``.

``--out DIR`` gets ``curves.md``, ``curves.json`` and ``curves.png`` (loss against tokens seen, a colour per system
and a line style per size), written atomically, never over an earlier result without ``--force``.
"""

import argparse
import os
import re
import sys
from typing import Dict, List, Optional

from fairseq_pe.errors import UserError, cli

OUTPUTS = ("curves.md", "curves.json", "curves.png")
_VALID = re.compile(r"\| valid on '(?P<subset>[^']+)' subset \| (?P<fields>.*)$")
_INNER = re.compile(r"\| train_inner \| .*\bwpb=(?P<wpb>[\d.]+),.*\bnum_updates=(?P<updates>\d+)")
_DONE = re.compile(r"done training in (?P<seconds>[\d.]+) seconds")
_FIELD = re.compile(r"(\w+) ([-\w.]+)")


def parse_log(text: str, where: str) -> dict:
    """A fairseq-train log -> ``{"points": [{"updates", "tokens", "loss"}], "subset", "seconds"}``."""
    inner = [(int(m["updates"]), float(m["wpb"])) for m in map(_INNER.search, text.splitlines()) if m]
    points: Dict[int, float] = {}
    subset = None
    for line in text.splitlines():
        m = _VALID.search(line)
        if not m:
            continue
        fields = dict(_FIELD.findall(m["fields"].replace(" | ", "  ")))
        if "loss" not in fields or "num_updates" not in fields:
            raise UserError(f"{where}: a validation line without its loss or num_updates: {line.strip()}")
        subset = m["subset"]
        points[int(fields["num_updates"])] = float(fields["loss"])
    if not points:
        raise UserError(f"{where}: no validation line ('valid on ... subset | loss ...'); train with "
                        "--validate-interval-updates N and --log-format simple")
    if not inner:
        raise UserError(f"{where}: no train_inner line with wpb=... and num_updates=...; train with --log-format "
                        "simple and a --log-interval")
    out = []
    for updates in sorted(points):
        out.append({"updates": updates, "tokens": tokens_seen(inner, updates), "loss": points[updates]})
    done = _DONE.search(text)
    return {"points": out, "subset": subset, "seconds": float(done["seconds"]) if done else None}


def tokens_seen(inner, updates: int) -> int:
    """The tokens of the first ``updates`` updates: each ``train_inner`` line's mean words per batch times the
    updates since the line before it (the last line's rate past it)."""
    total, last, rate = 0.0, 0, None
    for n, wpb in inner:
        if last >= updates:
            break
        total += wpb * (min(n, updates) - last)
        last, rate = min(n, updates), wpb
    return int(round(total + (rate or 0.0) * (updates - last)))


def parse_runs(specs: List[str]) -> Dict[str, str]:
    runs: Dict[str, str] = {}
    for spec in specs:
        name, sep, path = spec.partition("=")
        if not sep or not name or not path:
            raise UserError(f"--run {spec}: expected NAME=LOG (NAME: SIZE/SYSTEM, e.g. small/alibi=runs/train.log)")
        if name in runs:
            raise UserError(f"--run {spec}: the name {name} is given twice")
        if not os.path.isfile(path):
            raise UserError(f"--run {spec}: no such file {path}")
        runs[name] = path
    return runs


def size_and_system(name: str):
    size, sep, system = name.rpartition("/")
    return (size, system) if sep else ("", name)


def differences(curves: Dict[str, dict], reference: str) -> Dict[str, Dict[str, float]]:
    """``{run: {updates: loss − the reference's loss at the same size and update}}`` for every run of a size that
    has the reference system."""
    out: Dict[str, Dict[str, float]] = {}
    for name, curve in curves.items():
        size, system = size_and_system(name)
        ref = curves.get(f"{size}/{reference}" if size else reference)
        if ref is None or system == reference:
            continue
        theirs = {p["updates"]: p["loss"] for p in ref["points"]}
        out[name] = {str(p["updates"]): round(p["loss"] - theirs[p["updates"]], 4) for p in curve["points"]
                     if p["updates"] in theirs}
    return out


def markdown(report: dict) -> str:
    curves = report["curves"]
    updates = sorted({p["updates"] for c in curves.values() for p in c["points"]})
    lines = ["# Validation loss against tokens seen", "",
             "fairseq's validation loss (base 2) at 1×L, per run; tokens seen in millions under each update count.",
             "", "| run | " + " | ".join(str(u) for u in updates) + " | training time |",
             "|---|" + "---:|" * (len(updates) + 1)]
    for name, curve in curves.items():
        at = {p["updates"]: p for p in curve["points"]}
        cells = [f"{at[u]['loss']:.3f} ({at[u]['tokens'] / 1e6:.2f}M)" if u in at else "" for u in updates]
        seconds = curve["seconds"]
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {'' if seconds is None else f'{seconds:.0f} s'} |")
    if report.get("differences"):
        lines += ["", f"Loss minus `{report['reference']}`'s of the same size at the same update (negative: below "
                  "it):", "", "| run | " + " | ".join(str(u) for u in updates) + " |", "|---|" + "---:|" * len(updates)]
        for name, diff in report["differences"].items():
            lines.append(f"| {name} | " + " | ".join(f"{diff[str(u)]:+.3f}" if str(u) in diff else "" for u in updates)
                         + " |")
    return "\n".join(lines) + "\n"


def plot(report: dict, path: str) -> None:
    import logging

    from fairseq_pe.outputs import savefig
    from fairseq_pe.plotting import pyplot, system_styles

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    plt = pyplot()
    curves = report["curves"]
    systems = list(dict.fromkeys(size_and_system(n)[1] for n in curves))
    sizes = list(dict.fromkeys(size_and_system(n)[0] for n in curves))
    styles = system_styles(systems)
    dashes = ["-", "--", ":", "-."]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, curve in curves.items():
        size, system = size_and_system(name)
        style = dict(styles[system], linestyle=dashes[sizes.index(size) % len(dashes)])
        ax.plot([p["tokens"] / 1e6 for p in curve["points"]], [p["loss"] for p in curve["points"]],
                label=name, **style)
    ax.set_xlabel("tokens seen (millions)")
    ax.set_ylabel("validation loss at 1×L (bits per token)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    savefig(fig, path, dpi=120)
    plt.close(fig)


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fairseq-pe-lm-curves", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run", nargs="+", action="extend", required=True, metavar="NAME=LOG",
                   help="a fairseq-train log by name (SIZE/SYSTEM groups runs by size)")
    p.add_argument("--reference", help="the system each other system of the same size is compared with (e.g. none)")
    p.add_argument("--out", required=True, help="output folder: curves.{md,json,png}")
    p.add_argument("--force", action="store_true", help="replace the files of an earlier run in --out")
    return p.parse_args(argv)


@cli
def main(argv: Optional[List[str]] = None) -> int:
    from fairseq_pe.outputs import check_new_files, write_json, write_text

    args = parse_args(argv)
    runs = parse_runs(args.run)
    out = os.path.abspath(args.out)
    check_new_files([os.path.join(out, name) for name in OUTPUTS], args.force, flag="--out", where=args.out)
    curves = {}
    for name, path in runs.items():
        with open(path, encoding="utf-8", errors="replace") as f:
            curves[name] = parse_log(f.read(), f"--run {name}={path}")
    report = {"runs": runs, "curves": curves, "reference": args.reference}
    if args.reference:
        if not any(size_and_system(n)[1] == args.reference for n in curves):
            raise UserError(f"--reference {args.reference}: no run of that system (names: {', '.join(curves)})")
        report["differences"] = differences(curves, args.reference)
    os.makedirs(out, exist_ok=True)
    write_json(os.path.join(out, "curves.json"), report)
    table = markdown(report)
    write_text(os.path.join(out, "curves.md"), table)
    plot(report, os.path.join(out, "curves.png"))
    print(table, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
