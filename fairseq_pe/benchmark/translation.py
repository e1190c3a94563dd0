"""The translation models, the default measurements: per system, the training time and peak memory, the generation
time (:mod:`~fairseq_pe.benchmark.train_generate`) and the encoder forward's memory at each of ``--lengths``
(:mod:`~fairseq_pe.benchmark.encoder_memory`), as ratios to stock of the same run.

The data: random sentences over a shared ``--vocab``-word vocabulary (``fairseq-preprocess --joined-dictionary``,
``--share-all-embeddings``), made under ``OUT/work`` and reused while their options stay the same.  Every system is
trained with the same options: ``--dropout 0 --attention-dropout 0 --activation-dropout 0``,
``--required-batch-size-multiple 1`` (stock fairseq drops a last batch that is not a multiple of 8, the plugin keeps
it: both then see the same batches), ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (stock ``fairseq-generate`` cannot load
its checkpoints on torch >= 2.6 without it; the plugin does the same internally).  A time is the fastest of
``--repeats`` rounds (each round runs every system, stock first, alternating, which discounts slowdowns of a shared
machine); the training peak memory the smallest of the rounds; the encoder memory is measured in round 1.
``--encoder-only`` measures the encoder memory alone.  Results: ``OUT/benchmark.md`` (the table, stock's absolute
figures, the targets), ``OUT/benchmark.json`` (settings, every system's flags and command lines, every round, ratios,
targets and pass/fail) and ``OUT/benchmark.png`` (the ratios per system, one panel per metric, targets marked).
"""

import json
import os
import random
import shutil
import sys

from fairseq_pe.benchmark.encoder_memory import encoder_memory
from fairseq_pe.benchmark.models import MODEL_FLAGS, STOCK, SYSTEMS, model_dtype, precision_label
from fairseq_pe.benchmark.runner import PLUGIN, REPO, Progress, log, machine_load, run, write_results
from fairseq_pe.benchmark.targets import (TARGET_LENGTH, TARGET_METRICS, TARGETS, cell, ratio_of, summary,
                                          target_group)
from fairseq_pe.benchmark.train_generate import train_and_generate
from fairseq_pe.errors import UserError
from fairseq_pe.outputs import savefig, write_json


def system_flags(args, name):
    """A plugin system's flags; randomised positions draw from [0, L) with L past the longest sentence
    measured (``max(--lengths)`` + 8, as ``--max-source-positions``), since a sequence has at most L tokens."""
    flags = list(SYSTEMS[name])
    if "--pe-random-positions" in flags:
        flags[flags.index("--pe-random-positions") + 1] = str(max(args.lengths) + 8)
    return flags


#: the metrics: key -> label (the encoder memory has one column per length: "encoder_T")
METRICS = {"train_s": "train time", "train_peak_kb": "train peak mem", "generate_s": "generation time"}


def make_data(work, sentences, test_sentences, vocab, seed=1):
    """Random sentences over ``vocab`` words, binarised with a joined dictionary (reused while the
    options are the same)."""
    raw, bin_dir, marker = os.path.join(work, "raw"), os.path.join(work, "bin"), os.path.join(work, "data.json")
    options = {"sentences": sentences, "test_sentences": test_sentences, "vocab": vocab, "seed": seed}
    if os.path.exists(marker):
        with open(marker) as f:
            if json.load(f) == options and os.path.exists(os.path.join(bin_dir, "dict.src.txt")):
                log(f"data: reusing {bin_dir}")
                return bin_dir
        os.remove(marker)
        for folder in (raw, bin_dir):  # the data of other options
            shutil.rmtree(folder, ignore_errors=True)
    for folder in (raw, bin_dir):
        if os.path.exists(folder) and os.listdir(folder):
            raise UserError(f"--out {os.path.dirname(work)}: {folder} holds files fairseq-pe-benchmark did not write; "
                            "choose another --out")
    os.makedirs(raw)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    for split, n in (("train", sentences), ("valid", 50), ("test", test_sentences)):
        with open(f"{raw}/{split}.src", "w") as s, open(f"{raw}/{split}.tgt", "w") as t:
            for _ in range(n):
                length = rng.randint(10, 60)
                s.write(" ".join(rng.choice(words) for _ in range(length)) + "\n")
                t.write(" ".join(rng.choice(words) for _ in range(length)) + "\n")
    log(f"data: {sentences} training sentences over {vocab} words -> {bin_dir}")
    exe = os.path.join(os.path.dirname(sys.executable), "fairseq-preprocess")
    run([exe if os.path.exists(exe) else "fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt",
         "--trainpref", f"{raw}/train", "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test",
         "--destdir", bin_dir, "--joined-dictionary", "--workers", "1"], os.environ, "fairseq-preprocess")
    write_json(marker, options)
    return bin_dir


def commands(args, name, data, save):
    """The fairseq command lines (argv, without the interpreter) of one system."""
    if name == STOCK:
        model = ["--arch", args.stock_arch, *args.stock_flags_list]
    else:
        model = ["--user-dir", PLUGIN, "--arch", args.arch, *system_flags(args, name)]
    model += MODEL_FLAGS
    train = ["fairseq-train", data, *model,
             "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
             "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
             "--max-tokens", str(args.max_tokens), "--required-batch-size-multiple", "1",
             "--max-update", str(args.updates), "--disable-validation",
             "--save-dir", save, "--no-epoch-checkpoints", "--save-interval-updates", "0",
             "--no-save-optimizer-state",
             "--seed", "1", *device_flags(args), "--num-workers", "0", "--log-format", "simple"]
    generate = ["fairseq-generate", data, *([] if name == STOCK else ["--user-dir", PLUGIN]),
                "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4",
                "--batch-size", "16", "--required-batch-size-multiple", "1", "--min-len", str(args.gen_len),
                "--max-len-a", "0", "--max-len-b", str(args.gen_len), *device_flags(args), "--num-workers", "0"]
    # the encoder child: (stock|plugin) ARCH T THREADS VOCAB FLAGS
    encoder_model = [*(args.stock_flags_list if name == STOCK else system_flags(args, name)), *MODEL_FLAGS]
    encoder = ["stock" if name == STOCK else "plugin", REPO, args.stock_arch if name == STOCK else args.arch,
               "T", str(args.threads), str(args.vocab), args.encoder_batch, args.device, model_dtype(args),
               *encoder_model]
    return {"train": train, "generate": generate, "encoder": encoder}


def device_flags(args):
    """fairseq's options for the device and precision of the run."""
    return (["--cpu"] if args.device == "cpu" else []) + (["--fp16"] if args.fp16 else []) \
        + (["--bf16"] if args.bf16 else [])


def compute_ratios(results, lengths):
    base = results[STOCK]
    for name, r in results.items():
        r["ratios"] = {key: ratio_of(r[key], base[key]) for key in METRICS}
        for t in lengths:
            r["ratios"][f"encoder_{t}"] = ratio_of(r["encoder_forward_extra_kb"].get(str(t)),
                                                   base["encoder_forward_extra_kb"].get(str(t)))
        group = None if name == STOCK else target_group(name)
        r["target_group"] = group["group"] if group else None
        r["targets"] = {}
        for key in (TARGET_METRICS if group else {}):
            value = r["ratios"].get(key)
            # judged on the ratio as printed (two decimals), so that the table never contradicts itself
            r["targets"][key] = {"target": group[key], "ratio": value,
                                 "met": None if value is None else round(value, 2) <= group[key]}


def report(args, results):
    head = ["system"] + list(METRICS.values()) + [f"enc. mem T={t}" for t in args.lengths] + ["targets met"]
    rows = []
    for name, r in results.items():
        checked = [t for t in r["targets"].values() if t["met"] is not None]
        met = f"{sum(t['met'] for t in checked)}/{len(checked)}" if checked else ""
        rows.append([name] + [cell(r, key) for key in METRICS] + [cell(r, f"encoder_{t}") for t in args.lengths]
                    + [met])
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                      + ["| " + " | ".join(row) + " |" for row in rows])
    base = results[STOCK]
    trained = "" if base["train_s"] is None else (
        f"train {base['train_s']:.1f} s, peak {base['train_peak_kb'] / 1024:.0f} MiB; "
        f"generation {base['generate_s']:.2f} s; ")
    absolute = (f"{STOCK} ({args.stock_arch}{' ' + ' '.join(args.stock_flags_list) if args.stock_flags_list else ''}): "
                f"{trained}encoder forward extra memory "
                + ", ".join(f"T={t}: " + ("failed" if base["encoder_forward_extra_kb"][str(t)] is None else
                                          f"{base['encoder_forward_extra_kb'][str(t)] / 1024:.1f} MiB")
                            for t in args.lengths))
    targets = ["| group | systems | " + " | ".join(TARGET_METRICS.values()) + " |", "|---|---|---|---|---|"]
    for g in TARGETS:
        targets.append(f"| {g['group']} | {', '.join(g['systems'])} | "
                       + " | ".join(f"≤{g[key]:.2f}" for key in TARGET_METRICS) + " |")
    return table, absolute, "\n".join(targets)


def plot(args, results, path):
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # fairseq's import set the root logger to DEBUG

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    names = [n for n in results if n != STOCK]
    groups = [g["group"] for g in TARGETS] + ["(no target)"]
    tab10 = plt.get_cmap("tab10")
    group_colour = dict(zip(groups, [tab10(i) for i in (0, 1, 6, 2, 4, 5, 7)]))
    set2 = plt.get_cmap("Set2")
    length_colour = {t: set2(i % 8) for i, t in enumerate(args.lengths)}
    target_line = Line2D([], [], color="black", linewidth=2.5, label="target")
    stock_line = Line2D([], [], color="grey", linestyle="--", linewidth=1, label="stock = 1")
    panels = list(METRICS.items()) + [("encoder", "encoder forward memory")]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 0.7 * len(names) + 3) + 3, 3.4 * len(panels)),
                             squeeze=False)
    x = list(range(len(names)))
    for ax, (key, label) in zip(axes[:, 0], panels):
        if key == "encoder":
            columns = [(f"encoder_{t}", length_colour[t], f"T={t}") for t in args.lengths]
        else:
            columns = [(key, None, None)]
        width = 0.8 / len(columns)
        for j, (ratio_key, colour, _) in enumerate(columns):
            xs = [i - 0.4 + width * (j + 0.5) for i in x]
            values = [results[n]["ratios"].get(ratio_key) for n in names]
            colours = [colour or group_colour[results[n]["target_group"] or "(no target)"] for n in names]
            ax.bar(xs, [v or 0 for v in values], width * 0.92, color=colours)
            for xi, n, v in zip(xs, names, values):
                target = results[n]["targets"].get(ratio_key)
                if target:
                    ax.hlines(target["target"], xi - width / 2, xi + width / 2, colors="black", linewidth=2.5)
                if len(columns) == 1:  # the value, above the bar and its target
                    top = max(v or 0, target["target"] if target else 0)
                    ax.annotate("n/a" if v is None else f"{v:.2f}", (xi, top), ha="center", va="bottom",
                                fontsize=7, xytext=(0, 3), textcoords="offset points")
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        if key == "encoder":
            handles = [Patch(color=c, label=text) for _, c, text in columns]
            if TARGET_LENGTH in args.lengths:
                handles.append(Line2D([], [], color="black", linewidth=2.5, label=f"target (T={TARGET_LENGTH})"))
        else:
            used = [g for g in groups if any((results[n]["target_group"] or "(no target)") == g for n in names)]
            handles = [Patch(color=group_colour[g], label=g) for g in used]
            if key in TARGET_METRICS:
                handles.append(target_line)
        ax.legend(handles=handles + [stock_line], fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title(f"{label}, ratio to stock")
        ax.set_ylabel("× stock")
        ax.set_ylim(0, max([1.0] + [b.get_height() for b in ax.patches]
                           + [t["target"] for n in names for t in results[n]["targets"].values()]) * 1.3)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right")
    fig.suptitle(f"{args.arch} vs stock {args.stock_arch} ({precision_label(args)}, {args.threads} CPU threads)")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    savefig(fig, path, dpi=100)
    plt.close(fig)


def add_options(p):
    """The options of the translation measurements."""
    group = p.add_argument_group("translation models, the default measurements (OUT/benchmark.{md,json,png})")
    group.add_argument("--updates", type=int, default=10)
    group.add_argument("--max-tokens", type=int, default=4096)
    group.add_argument("--sentences", type=int, default=3000, help="random training sentences")
    group.add_argument("--gen-sentences", type=int, default=32, help="test sentences to decode")
    group.add_argument("--gen-len", type=int, default=40, help="tokens of every hypothesis")
    group.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096],
                       help="sentence lengths of the encoder memory measurement")
    group.add_argument("--encoder-batch", choices=["one", "left-padded"], default="one",
                       help="the encoder memory's batch: one sentence of T tokens (default), or it and one of T/2 "
                            "tokens padded on the left, as fairseq batches a source (the per-row path of FIRE's "
                            "normaliser)")
    group.add_argument("--encoder-only", action="store_true",
                       help="measure the encoder forward memory only (no training, no generation)")


def translation_benchmark(args, systems, outputs, stock_sizes, plugin_sizes):
    """Every system's training, generation and encoder memory in rounds, the ratios to stock, the results files;
    0."""
    work = os.path.join(args.out, "work")
    os.makedirs(work, exist_ok=True)
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONWARNINGS="ignore",
               TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    data = make_data(work, args.sentences, args.gen_sentences, args.vocab)
    cmds = {name: commands(args, name, data, os.path.join(work, "ckpt", name)) for name in systems}
    plan = []
    rounds = 1 if args.encoder_only else args.repeats
    for round_ in range(rounds):
        for name in systems:
            if not args.encoder_only:
                plan += [(name, "train"), (name, "generate")]
            if round_ == 0:
                plan += [(name, f"encoder T={t}") for t in args.lengths]
    progress = Progress(plan)
    log(f"{len(systems)} systems ({', '.join(systems)}), {args.repeats} rounds, {len(plan)} measurements; "
        f"stock {args.stock_arch} vs {args.arch}, {args.threads} threads")
    machine = {"cpus": os.cpu_count(), "load_before": machine_load()}
    if machine["load_before"] is not None and machine["load_before"] + args.threads > (os.cpu_count() or 1) + 0.5:
        # with more busy threads than cores, every torch operation waits for a descheduled thread
        log(f"warning: load average {machine['load_before']:.1f} on {os.cpu_count()} CPUs: other processes are "
            f"running; {args.threads} thread{'s' if args.threads > 1 else ''} will not get cores of their own and "
            "the times will be unreliable")
    results = {name: {"flags": " ".join(args.stock_flags_list if name == STOCK else system_flags(args, name)), "commands": cmds[name],
                      "sizes": stock_sizes if name == STOCK else plugin_sizes, "rounds": []} for name in systems}
    for round_ in range(1, rounds + 1):
        # every round measures all systems again, stock first; a time is the fastest round, which
        # discounts slowdowns of the machine (the first round also measures the encoder memory)
        for name in systems:
            label = f"{round_}/{rounds}"
            log(f"round {label}, {name}: {results[name]['flags'] or args.stock_arch}")
            r = results[name]
            if not args.encoder_only:
                r["rounds"].append(train_and_generate(args, name, cmds[name], env, progress, label))
            if round_ == 1:
                r["encoder_forward_extra_kb"], r["encoder_errors"], r["params"] = encoder_memory(
                    args, name, cmds[name], env, progress, label)
            for key in ("train_s", "generate_s", "train_peak_kb", "generate_peak_kb"):
                r[key] = min(x[key] for x in r["rounds"]) if r["rounds"] else None
    machine["load_after"] = machine_load()
    compute_ratios(results, args.lengths)
    table, absolute, targets = report(args, results)
    line, totals = summary(results)
    timed = "" if args.encoder_only else (
        f"training: {args.updates} updates of --max-tokens {args.max_tokens}; generation: beam 4, "
        f"{args.gen_sentences} sentences × {args.gen_len} tokens; fastest of {args.repeats} rounds; ")
    settings = (f"Stock fairseq `{args.stock_arch}`{' ' + args.stock_flags if args.stock_flags else ''} vs the "
                f"plugin's `{args.arch}`: shared {args.vocab}-word vocabulary (--share-all-embeddings), dropout 0; "
                f"{precision_label(args)}, {args.threads} CPU threads; {timed}encoder forward: "
                f"{'one sentence' if args.encoder_batch == 'one' else 'T and T/2 tokens, padded on the left'}, "
                "train mode, autograd on. Ratios to stock "
                f"(✓/✗: the target of the system's group, below).")
    text = (f"# Position encodings vs stock fairseq\n\n{settings}\n\n{table}\n\n{absolute}\n\n{line}\n\n"
            f"Targets (ratios to stock, at most; set for the CPU, float32):\n\n{targets}\n")
    payload = {"settings": {**{k: v for k, v in vars(args).items() if k != "stock_flags_list"},
                            "model_flags": MODEL_FLAGS, "target_length": TARGET_LENGTH,
                            "env": {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS",
                                                        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")},
                            "encoder_env": {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
                            "python": sys.version.split()[0], "machine": machine},
               "baseline": STOCK, "systems": {name: results[name]["flags"] for name in systems},
               "targets": TARGETS, "results": results, "summary": {"line": line, **totals}}
    return write_results(outputs, text, payload, lambda path: plot(args, results, path),
                         f"{settings}\n\n{table}\n\n{absolute}\n\n{line}", progress)
