"""The table of scripts/recipes/bert-cpu.sh: masked-LM validation loss, SST-2 dev accuracy, SQuAD v1.1
dev EM/F1, and SQuAD F1 by where the gold answer starts in the model's input (positions < 128 were
seen in pretraining at 128 tokens, the others were not: Wang et al. §4.2, Fig. 1).

Each score is the mean ± standard deviation over the recipe's seeds (``--seeds``; files ``NAME-sSEED``); a score
that only some seeds have (FINETUNE=sst2 in the others) says which.
Writes OUT/results.md, OUT/results.json (with each system's resolved ``--pe-*`` options, read from its checkpoints)
and OUT/results.png.  Seeds of a system pretrained under different resolved options (a run left over from other
defaults) are refused, never combined.
"""

import argparse
import json
import os
import re
from collections import defaultdict

from fairseq_pe.seeds import mean_sd
from fairseq_pe.bert.squad import evaluate_v1, f1_v1, iter_questions

BUCKETS = [(0, 128, "< 128"), (128, 256, "128-255"), (256, 1 << 30, ">= 256")]


def mlm_valid_loss(log_path):
    """The last validation loss (base 2) of a fairseq-train log."""
    loss = None
    with open(log_path, errors="replace") as f:
        for line in f:
            if "| valid |" in line or "| valid on" in line:
                m = re.search(r"\| loss ([0-9.]+)", line)
                if m:
                    loss = float(m.group(1))
    return loss


def answer_positions(squad_dir):
    """Question id -> start position (in the model's input) of its labelled gold answer."""
    positions = {}
    with open(os.path.join(squad_dir, "valid.features.jsonl")) as fm, open(os.path.join(squad_dir, "valid.spans")) as fs:
        for meta_line, span_line in zip(fm, fs):
            meta = json.loads(meta_line)
            start = int(span_line.split()[0])
            if start > 0 and meta["qid"] not in positions:
                positions[meta["qid"]] = start
    return positions


def f1_by_bucket(dataset, predictions, positions):
    sums, counts = defaultdict(float), defaultdict(int)
    for _, qa in iter_questions(dataset):
        pos = positions.get(qa["id"])
        if pos is None:
            continue
        label = next(name for lo, hi, name in BUCKETS if lo <= pos < hi)
        golds = [a["text"] for a in qa["answers"]]
        sums[label] += max(f1_v1(predictions.get(qa["id"], ""), g) for g in golds)
        counts[label] += 1
    return {name: (100.0 * sums[name] / counts[name] if counts[name] else None, counts[name]) for _, _, name in BUCKETS}


def fmt(v, digits=1, sd=None, seeds=None):
    """``v ± sd``; ``seeds``: the seeds behind it when they are not all of the table's (e.g. ``(seed 1)``)."""
    if v is None:
        return "-"
    text = f"{v:.{digits}f}" + (f" ± {sd:.{digits}f}" if sd is not None else "")
    if seeds:
        text += f" (seed{'s' if len(seeds) > 1 else ''} {', '.join(map(str, seeds))})"
    return text


def seed_row(out, dataset, positions, tag):
    """The scores of one run (``NAME-sSEED``): each present once its step has finished."""
    row = {}
    log = os.path.join(out, f"pt-{tag}.log")
    row["mlm_valid_loss"] = mlm_valid_loss(log) if os.path.exists(log) else None
    sst2 = os.path.join(out, f"sst2-{tag}.json")
    if os.path.exists(sst2):
        with open(sst2) as f:
            row["sst2_accuracy"] = 100.0 * json.load(f)["metrics"]["accuracy"]
    pred_path = os.path.join(out, f"squad-{tag}.predictions.json")
    if os.path.exists(pred_path):
        with open(pred_path) as f:
            predictions = json.load(f)
        row.update({f"squad_{k}": v for k, v in evaluate_v1(dataset, predictions).items() if k in ("exact_match", "f1")})
        buckets = f1_by_bucket(dataset, predictions, positions)
        row.update({f"squad_f1_at_{k}": v[0] for k, v in buckets.items()})
        row["squad_questions_by_answer_start"] = {k: v[1] for k, v in buckets.items()}
    return row


#: the table's scores: (key, column, decimals)
COLUMNS = ([("mlm_valid_loss", "MLM valid loss (bits)", 3), ("sst2_accuracy", "SST-2 acc", 1),
            ("squad_exact_match", "SQuAD EM", 1), ("squad_f1", "SQuAD F1", 1)]
           + [(f"squad_f1_at_{name}", f"F1, answer at {name}", 1) for _, _, name in BUCKETS])


def encoding_config(out, tag):
    """The resolved ``--pe-*`` options (defaults included) a pretraining run was made with, from its checkpoint;
    None before the run exists."""
    path = os.path.join(out, f"pt-{tag}", "checkpoint_last.pt")
    if not os.path.exists(path):
        return None
    import torch

    state = torch.load(path, map_location="cpu", weights_only=False)  # the recipe's own checkpoints
    cfg = state.get("cfg")
    model = cfg["model"] if cfg is not None else state["args"]
    return {k: v for k, v in sorted(vars(model).items()) if k.startswith("pe_") or k == "arch"}


def check_same_config(name, configs):
    """Refuse to combine the seeds of a system whose pretraining ran under different resolved options (e.g. a run
    left over from before a change of defaults): the message names the option and the run to remove."""
    known = {seed: c for seed, c in configs.items() if c is not None}
    if not known:
        return None
    first_seed, first = next(iter(known.items()))
    for seed, config in known.items():
        differing = sorted(k for k in set(first) | set(config) if first.get(k) != config.get(k))
        if differing:
            what = ", ".join(f"{k}: {first.get(k)!r} in seed {first_seed}, {config.get(k)!r} in seed {seed}"
                             for k in differing)
            raise SystemExit(f"bert_cpu_table.py: the runs of '{name}' were made with different options ({what}); "
                             f"a run is left from other defaults or code: remove the stale seed's files "
                             f"(pt-{name}-sSEED*, sst2-{name}-sSEED*, squad-{name}-sSEED*) and rerun the recipe")
    return first


def combine_seeds(name, flags, runs):
    """Mean and sample standard deviation over the seeds of every score.  A score that some seeds lack (e.g.
    SQuAD, fine-tuned with FINETUNE=sst2 in seeds 2 and 3) is combined over the seeds that have it, and
    ``KEY_seeds`` lists them (None when every seed has it); a score no seed has is None."""
    row = {"system": name, "flags": flags, "seeds": {str(seed): r for seed, r in runs.items()}}
    for key, _, _ in COLUMNS:
        present = [(seed, r[key]) for seed, r in runs.items() if r.get(key) is not None]
        if not present:
            row[key], row[key + "_sd"], row[key + "_seeds"] = None, None, None
            continue
        row[key], row[key + "_sd"] = mean_sd([v for _, v in present])
        row[key + "_seeds"] = [seed for seed, _ in present] if len(present) < len(runs) else None
    return row


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--out", required=True, help="the recipe's OUT directory")
    p.add_argument("--squad-json", required=True, help="dev-v1.1.json")
    p.add_argument("--systems", nargs="+", required=True, metavar="NAME=FLAGS",
                   help="the recipe's systems and their flags (files NAME-sSEED)")
    p.add_argument("--seeds", nargs="+", type=int, default=[1], help="the recipe's SEEDS")
    args = p.parse_args()
    with open(args.squad_json) as f:
        dataset = json.load(f)["data"]
    positions = answer_positions(os.path.join(args.out, "squad-bin"))
    systems = dict(s.partition("=")[::2] for s in args.systems)
    rows = []
    for name, flags in systems.items():
        row = combine_seeds(name, flags, {seed: seed_row(args.out, dataset, positions, f"{name}-s{seed}")
                                          for seed in args.seeds})
        row["config"] = check_same_config(name, {seed: encoding_config(args.out, f"{name}-s{seed}")
                                                 for seed in args.seeds})
        rows.append(row)
    if len(args.seeds) > 1:
        spread = f"mean ± standard deviation over {len(args.seeds)} seeds ({', '.join(map(str, args.seeds))})"
    else:
        spread = f"ONE seed ({args.seeds[0]}): no spread measured; SEEDS='1 2 3' gives mean ± standard deviation"
    header = "| encoding | flags | " + " | ".join(col for _, col, _ in COLUMNS) + " |"
    lines = [spread, "", header, "|" + "---|" * (2 + len(COLUMNS))]
    for r in rows:
        lines.append(f"| {r['system']} | `{r['flags']}` | "
                     + " | ".join(fmt(r[key], digits, r[key + "_sd"], r[key + "_seeds"]) for key, _, digits in COLUMNS) + " |")
    counts = next((run["squad_questions_by_answer_start"] for r in rows for run in r["seeds"].values()
                   if "squad_questions_by_answer_start" in run), None)
    if counts:
        lines.append("")
        total = sum(1 for _ in iter_questions(dataset))
        rest = total - sum(counts.values())
        lines.append("Dev questions per answer-start bucket: "
                     + ", ".join(f"{name}: {counts[name]:,}" for _, _, name in BUCKETS)
                     + f" (of {total:,}" + (f"; {rest:,} have no window holding their answer)" if rest else ")"))
    text = "\n".join(lines) + "\n"
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump({"seeds": args.seeds, "rows": rows}, f, indent=1)
    plot(rows, os.path.join(args.out, "results.png"))
    print(text, end="")


def plot(rows, path):
    """SST-2 accuracy and SQuAD F1 by answer position, bars with the standard deviation over seeds."""
    from fairseq_pe.plotting import pyplot, system_styles

    plt = pyplot()
    styles = system_styles([r["system"] for r in rows])
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    names = [r["system"] for r in rows]
    ax1.bar(names, [r.get("sst2_accuracy") or 0 for r in rows], yerr=[r.get("sst2_accuracy_sd") or 0 for r in rows],
            capsize=3, color="tab:blue")
    ax1.set_ylabel("SST-2 dev accuracy (%)")
    ax1.set_ylim(45, max([60] + [(r.get("sst2_accuracy") or 0) + 5 for r in rows]))
    ax1.set_title("SST-2")
    width = 0.8 / max(1, len(rows))
    for i, r in enumerate(rows):
        xs = [j + i * width for j in range(len(BUCKETS))]
        keys = [f"squad_f1_at_{name}" for _, _, name in BUCKETS]
        ax2.bar(xs, [r.get(k) or 0 for k in keys], yerr=[r.get(k + "_sd") or 0 for k in keys], capsize=2,
                width=width, label=r["system"], color=styles[r["system"]]["color"])
    ax2.set_xticks([j + width * (len(rows) - 1) / 2 for j in range(len(BUCKETS))])
    ax2.set_xticklabels([f"answer at {name}" for _, _, name in BUCKETS])
    ax2.set_ylabel("SQuAD v1.1 dev F1")
    ax2.set_title("SQuAD F1 by answer position (pretrained at 128)")
    ax2.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
