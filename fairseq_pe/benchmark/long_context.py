"""Long context, in place of the translation measurements: ``--long`` runs one encoder forward of one sentence in
evaluation (``model.eval()`` under ``torch.no_grad()``, as ``fairseq-generate``, validation and ``fairseq-eval-lm`` run
it) at ``--long-lengths`` (default 4096 8192 16384 32768), per length stock first, each in a fresh process: a first
call (its time reported alone: a compilation shows there), then ``--repeats`` calls, whose peak extra memory and
fastest time count; ratios to stock at the same T, and the memory per token at the longest T against the shortest.
``--long-train`` (for ``--device cuda --fp16``) runs a training step of the encoder (train mode, forward and backward
of ``--train-batch`` sentences) at ``--train-lengths`` (4096 8192), against stock and against the same system with
``--pe-attention-kernel sdpa``.  The plugin's kernel is ``--long-kernel`` (its ``--pe-attention-kernel``, default
auto); ``--encoder-layers N`` gives stock and plugin N encoder layers (stock's SDPA at T = 32768 takes minutes per
layer on a CPU); ``--memory-limit GIB`` bounds each CPU measurement's address space, so that a length that does not
fit fails alone.  Targets: ``LONG_TARGETS`` (:mod:`~fairseq_pe.benchmark.targets`); results in
``OUT/benchmark-long.{md,json,png}``::

    fairseq-pe-benchmark --out bench-long --long --encoder-layers 1 --repeats 1 --memory-limit 16
    fairseq-pe-benchmark --out bench-long-gpu --device cuda --fp16 --long-train --systems alibi t5
"""

import argparse
import os
import sys
import time

from fairseq_pe.benchmark.models import BUILD_MODEL, MODEL_FLAGS, STOCK, SYSTEMS, model_dtype, precision_label
from fairseq_pe.benchmark.runner import (MEASURE, REPO, MeasurementFailed, Progress, check_plugin, found, log,
                                         machine_load, run, write_results)
from fairseq_pe.benchmark.targets import (LONG_MEMORY_LENGTHS, LONG_TARGETS, LONG_TIME_LENGTH, PER_TOKEN_BASE,
                                          TRAIN_MEMORY_LENGTH, cell, long_target_group, ratio_of, summary)
from fairseq_pe.errors import UserError
from fairseq_pe.outputs import savefig

#: the lengths of --long (4096: the per-token base) and of --long-train
LONG_LENGTHS = [4096, 8192, 16384, 32768]
TRAIN_LENGTHS = [4096, 8192]

#: the kernels of --pe-attention-kernel (the plugin's option); "sdpa" is the path before issue 41
KERNELS = ["auto", "sdpa", "blockwise", "flex"]
BASELINE_KERNEL = "sdpa"

# one encoder pass of T-token sentences, stock fairseq or the plugin: MODE "eval" (model.eval(), torch.no_grad(),
# as fairseq-generate, validation and fairseq-eval-lm run it) or "train" (train mode, forward and backward);
# measured by MEASURE
LONG_CHILD = r"""
import argparse, gc, resource, sys, time
kind, repo, arch, length, threads, vocab, rows, device, dtype, mode, repeats, limit_kb = sys.argv[1:13]
length, threads, vocab, rows, repeats, limit_kb = map(int, (length, threads, vocab, rows, repeats, limit_kb))
flags = sys.argv[13:]
if limit_kb:  # the address space: an allocation past it fails here, not the kernel's OOM killer elsewhere
    resource.setrlimit(resource.RLIMIT_AS, (limit_kb * 1024, limit_kb * 1024))
trim_heap = False  # one measurement per process
""" + BUILD_MODEL + MEASURE + r"""
model.train(mode == "train")
tokens = torch.randint(d.nspecial, len(d), (rows, length), device=device)
lengths = torch.full((rows,), length, device=device)
def call():
    if mode == "eval":
        with torch.no_grad():
            out = model.encoder(tokens, lengths)["encoder_out"][0]
        assert not out.requires_grad
    else:
        out = model.encoder(tokens, lengths)["encoder_out"][0]
        out.float().square().mean().backward()
    assert out.shape[:2] == (length, rows)
    return out.shape
first, times, peak = measure(call, repeats)
print("FIRST_S", repr(first), flush=True)
print("TIMES_S", " ".join(repr(t) for t in times), flush=True)
print("PEAK_EXTRA_KB", peak, flush=True)
print("THREADS", torch.get_num_threads(), flush=True)
print("PLUGIN_LOADED", int("fairseq_pe" in sys.modules), flush=True)
"""


def long_command(args, name, mode, kernel=None):
    """The argv (after the interpreter and ``-c LONG_CHILD``) of one long measurement, with ``T`` for the length:
    the system's model flags, ``--encoder-layers`` when overridden, and the plugin's ``--pe-attention-kernel``."""
    model = [*(args.stock_flags_list if name == STOCK else long_system_flags(args, name)), *MODEL_FLAGS]
    if args.encoder_layers is not None:
        model += ["--encoder-layers", str(args.encoder_layers)]
    if name != STOCK:
        model += ["--pe-attention-kernel", kernel]
    rows = 1 if mode == "eval" else args.train_batch
    limit_kb = 0 if args.memory_limit is None else int(args.memory_limit * 1024 * 1024)
    return ["stock" if name == STOCK else "plugin", REPO, args.stock_arch if name == STOCK else args.arch, "T",
            str(args.threads), str(args.vocab), str(rows), args.device, model_dtype(args), mode, str(args.repeats),
            str(limit_kb), *model]


def long_system_flags(args, name):
    """A plugin system's flags for the long measurements: randomised positions draw from [0, L) with L past the
    longest sentence measured (as :func:`system_flags` for ``--lengths``)."""
    flags = list(SYSTEMS[name])
    if "--pe-random-positions" in flags:
        flags[flags.index("--pe-random-positions") + 1] = str(max(long_lengths_of(args)) + 8)
    return flags


def long_lengths_of(args):
    return (args.long_lengths if args.long else []) + (args.train_lengths if args.long_train else [])


def long_runs(args, systems):
    """The measurements, in order: per length (shortest first), stock, then every system with ``--long-kernel``
    (and, in training, with ``sdpa`` too: the whole-mask path). Items: (mode, T, system, kernel)."""
    plan = []
    for mode, lengths in (("eval", args.long_lengths if args.long else []),
                          ("train", args.train_lengths if args.long_train else [])):
        kernels = [args.long_kernel] + ([BASELINE_KERNEL] if mode == "train" and args.long_kernel != BASELINE_KERNEL
                                        else [])
        for t in lengths:
            for name in systems:
                for kernel in ([None] if name == STOCK else kernels):
                    plan.append((mode, t, name, kernel))
    return plan


def run_key(mode, t, kernel):
    """The key of one measurement in a system's results: ``eval T=8192``, ``train T=4096 sdpa``."""
    return f"{mode} T={t}" + ("" if kernel is None else f" {kernel}")


def long_measure(args, name, mode, t, kernel, env, progress):
    """One long measurement in a fresh process: {"mem_kb", "first_s", "best_s", "times_s"}, or an error (a length
    that does not fit in memory, or fails otherwise: the run goes on, the table says "failed")."""
    cmd = long_command(args, name, mode, kernel)
    cmd[3] = str(t)
    key = run_key(mode, t, kernel)
    what = f"{name}: {'evaluation' if mode == 'eval' else 'training'} encoder T={t}" + (f", {kernel}" if kernel else "")
    child_env = dict(env, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))  # the resident size follows the live tensors
    start = time.time()
    try:
        out = run([sys.executable, "-c", LONG_CHILD, *cmd], child_env, what)
    except MeasurementFailed as e:
        log(f"{what} FAILED ({str(e).splitlines()[0]}; {progress.record(name, key, time.time() - start)})")
        return None, str(e).splitlines()[0] + "\n..." + str(e)[-2000:]
    check_plugin(name, out, what)
    if found(r"THREADS (\d+)", out, what, int) != args.threads:
        raise SystemExit(f"fairseq-pe-benchmark: {what}: torch did not use {args.threads} threads")
    times = [float(x) for x in found(r"TIMES_S ([^\n]+)", out, what, str).split()]
    r = {"mem_kb": found(r"PEAK_EXTRA_KB (-?\d+)", out, what, int), "first_s": found(r"FIRST_S ([\d.e+-]+)", out, what),
         "best_s": min(times), "times_s": times, "command": cmd}
    log(f"{what}: {r['mem_kb'] / 1024:.1f} MiB, best {r['best_s']:.2f} s, first call {r['first_s']:.2f} s "
        f"({progress.record(name, key, time.time() - start)})")
    return r, None


def long_ratios(args, results):
    """Ratios to stock at the same T (and, in training, to the plugin's ``sdpa`` path), per-token memory, targets."""
    base = results[STOCK]["long"]
    for name, r in results.items():
        m, ratios = r["long"], {}
        for mode, lengths in (("eval", args.long_lengths if args.long else []),
                              ("train", args.train_lengths if args.long_train else [])):
            kernel = None if name == STOCK else args.long_kernel
            for t in lengths:
                mine, theirs = m.get(run_key(mode, t, kernel)), base.get(run_key(mode, t, None))
                for metric, field in (("mem", "mem_kb"), ("s", "best_s"), ("first", "first_s")):
                    ratios[f"{mode}_{metric}_{t}"] = ratio_of(mine and mine[field], theirs and theirs[field])
                if mode == "train" and name != STOCK and kernel != BASELINE_KERNEL:
                    old = m.get(run_key(mode, t, BASELINE_KERNEL))
                    for metric, field in (("mem", "mem_kb"), ("s", "best_s")):
                        ratios[f"train_{metric}_{t}_vs_sdpa"] = ratio_of(mine and mine[field], old and old[field])
            if mode == "eval" and len(lengths) > 1:
                short, long_ = min(lengths), max(lengths)
                a, b = m.get(run_key(mode, short, kernel)), m.get(run_key(mode, long_, kernel))
                ratios["per_token"] = ratio_of(b and b["mem_kb"] / long_, a and a["mem_kb"] / short)
        r["ratios"] = ratios
        group = None if name == STOCK else long_target_group(name)
        r["target_group"] = group["group"] if group else None
        r["targets"] = {}
        if group is None:
            continue
        keys = []
        if args.long:
            keys += [(f"eval_mem_{t}", "eval_mem") for t in LONG_MEMORY_LENGTHS if t in args.long_lengths]
            keys += [(f"eval_s_{LONG_TIME_LENGTH}", "eval_s")] if LONG_TIME_LENGTH in args.long_lengths else []
            if min(args.long_lengths) == PER_TOKEN_BASE and max(args.long_lengths) > PER_TOKEN_BASE:
                keys.append(("per_token", "per_token"))
        if args.long_train and args.device == "cuda" and TRAIN_MEMORY_LENGTH in args.train_lengths:
            keys.append((f"train_mem_{TRAIN_MEMORY_LENGTH}", "train_mem"))  # the target is CUDA's
        for key, target_key in keys:
            if target_key not in group:
                continue
            value, target = ratios.get(key), group[target_key]
            if value is None:
                met = None
            elif target_key == "per_token":  # judged on the ratio as printed (two decimals)
                met = 1 - target <= round(value, 2) <= 1 + target
            else:
                met = round(value, 2) <= target
            r["targets"][key] = {"target": target, "ratio": value, "met": met}


def long_cell(r, key, failed):
    return cell(r, key, failed)


def long_columns(args):
    """The long tables: [(title, [(header, ratio key, the runs whose failure fails the cell)])]."""
    tables = []
    if args.long:
        k = args.long_kernel
        mem = [(f"eval mem T={t}", f"eval_mem_{t}", [("eval", t)]) for t in args.long_lengths]
        if len(args.long_lengths) > 1:
            short, long_ = min(args.long_lengths), max(args.long_lengths)
            mem.append((f"mem/token T={long_} vs {short}", "per_token", [("eval", short), ("eval", long_)]))
        tables.append((f"Evaluation memory (--pe-attention-kernel {k}), ratio to stock at the same T", mem))
        tables.append((f"Evaluation time (--pe-attention-kernel {k}): best of {args.repeats} "
                       f"call{'s' if args.repeats > 1 else ''} after the first, and the first call alone, ratios to "
                       "stock at the same T",
                       [c for t in args.long_lengths for c in
                        ((f"eval time T={t}", f"eval_s_{t}", [("eval", t)]),
                         (f"first call T={t}", f"eval_first_{t}", [("eval", t)]))]))
    if args.long_train:
        k = args.long_kernel
        cols = []
        for t in args.train_lengths:
            cols += [(f"train mem T={t}", f"train_mem_{t}", [("train", t)]),
                     (f"train time T={t}", f"train_s_{t}", [("train", t)])]
            if k != BASELINE_KERNEL:
                cols += [(f"mem vs sdpa T={t}", f"train_mem_{t}_vs_sdpa", [("train", t)]),
                         (f"time vs sdpa T={t}", f"train_s_{t}_vs_sdpa", [("train", t)])]
        tables.append((f"Training step of the encoder (forward and backward, {args.train_batch} sentences of T "
                       f"tokens, --pe-attention-kernel {k}): ratios to stock"
                       + ("" if k == BASELINE_KERNEL else " and to the same system with --pe-attention-kernel sdpa"),
                       cols))
    return tables


def long_report(args, results):
    parts = []
    for title, columns in long_columns(args):
        head = ["system"] + [c[0] for c in columns]
        rows = []
        for name, r in results.items():
            kernel = None if name == STOCK else args.long_kernel
            cells_ = []
            for _, key, runs in columns:
                if name == STOCK and key.endswith("_vs_sdpa"):
                    cells_.append("")
                    continue
                kernels = [kernel] + ([BASELINE_KERNEL] if key.endswith("_vs_sdpa") else [])
                failed = any(run_key(mode, t, k) in r["long_errors"] for mode, t in runs for k in kernels)
                cells_.append(long_cell(r, key, failed))
            rows.append([name] + cells_)
        parts.append(f"{title}:\n\n" + "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                                                  + ["| " + " | ".join(row) + " |" for row in rows]))
    base = results[STOCK]["long"]
    absolute = []
    for key, m in base.items():
        absolute.append(f"{key}: " + ("failed" if m is None else f"{m['mem_kb'] / 1024:.1f} MiB, "
                                      f"{m['best_s']:.2f} s (first call {m['first_s']:.2f} s)"))
    return "\n\n".join(parts), f"{STOCK} ({args.stock_arch}): " + "; ".join(absolute)


def long_summary(results):
    return summary(results, lambda name, key, r: f"{name} {key}",
                   lambda name, key, t: f"{name} {key} {t['ratio']:.2f}×", "targets: none apply to these lengths")


def long_plot(args, results, path, tables=None, title=None):
    """Bars of the ratios, one panel per table of ``tables`` (default :func:`long_columns`), targets marked."""
    import logging

    import matplotlib

    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    names = [n for n in results if n != STOCK]
    panels = [(head.split(":")[0].split(" (")[0], columns) for head, columns in (tables or long_columns(args))]
    fig, axes = plt.subplots(len(panels), 1, figsize=(max(8.0, 0.7 * len(names) + 3) + 3, 3.4 * len(panels)),
                             squeeze=False)
    set2 = plt.get_cmap("tab20")
    x = list(range(len(names)))
    for ax, (label, columns) in zip(axes[:, 0], panels):
        width = 0.8 / len(columns)
        for j, (header, key, _) in enumerate(columns):
            xs = [i - 0.4 + width * (j + 0.5) for i in x]
            values = [results[n]["ratios"].get(key) for n in names]
            ax.bar(xs, [v or 0 for v in values], width * 0.92, color=set2(j % 20))
            for xi, n in zip(xs, names):
                target = results[n]["targets"].get(key)
                if target:
                    for bound in ([1 - target["target"], 1 + target["target"]] if key == "per_token"
                                  else [target["target"]]):
                        ax.hlines(bound, xi - width / 2, xi + width / 2, colors="black", linewidth=2)
        ax.axhline(1.0, color="grey", linestyle="--", linewidth=1)
        ax.legend(handles=[Patch(color=set2(j % 20), label=c[0]) for j, c in enumerate(columns)], fontsize=7,
                  loc="upper left", bbox_to_anchor=(1.01, 1.0))
        ax.set_title(f"{label}: ratios (legend; black: target)")
        ax.set_ylabel("×")
        top = max([1.0] + [b.get_height() for b in ax.patches])
        ax.set_ylim(0, min(top, 50) * 1.3)
        ax.set_xticks(x)
        ax.set_xticklabels(names, rotation=30, ha="right")
    fig.suptitle(f"{args.arch} vs stock {args.stock_arch}, {title or 'long context'} ({precision_label(args)}, "
                 f"{args.threads} CPU threads)")
    fig.tight_layout(rect=(0, 0, 1, 0.98))
    savefig(fig, path, dpi=100)
    plt.close(fig)


def check_kernel_option(args):
    """The plugin's parser knows ``--pe-attention-kernel`` with the kernel asked for (else one clear message)."""
    from fairseq_pe.models.transformer_pe import TransformerPEModel

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    TransformerPEModel.add_args(parser)
    action = next((a for a in parser._actions if "--pe-attention-kernel" in a.option_strings), None)
    if action is None:
        raise UserError("--long-kernel: this fairseq_pe has no --pe-attention-kernel option")
    wanted = {args.long_kernel} | ({BASELINE_KERNEL} if args.long_train else set())
    if action.choices is not None and not wanted <= set(action.choices):
        raise UserError(f"--long-kernel {args.long_kernel}: --pe-attention-kernel takes {', '.join(action.choices)}")


def long_benchmark(args, systems, env, outputs):
    check_kernel_option(args)
    plan = long_runs(args, systems)
    progress = Progress([(name, run_key(mode, t, kernel)) for mode, t, name, kernel in plan])
    layers = "the architecture's" if args.encoder_layers is None else str(args.encoder_layers)
    layers += " encoder layer" if args.encoder_layers == 1 else " encoder layers"
    log(f"long context: {len(systems)} systems ({', '.join(systems)}), {len(plan)} measurements; stock "
        f"{args.stock_arch} vs {args.arch}, {layers}, --pe-attention-kernel {args.long_kernel}, "
        f"{args.threads} threads, {args.repeats} timed calls after the first")
    machine = {"cpus": os.cpu_count(), "load_before": machine_load()}
    results = {name: {"flags": " ".join(args.stock_flags_list if name == STOCK else long_system_flags(args, name)),
                      "long": {}, "long_errors": {}} for name in systems}
    for mode, t, name, kernel in plan:
        key = run_key(mode, t, kernel)
        results[name]["long"][key], error = long_measure(args, name, mode, t, kernel, env, progress)
        if error is not None:
            results[name]["long_errors"][key] = error
    machine["load_after"] = machine_load()
    long_ratios(args, results)
    tables, absolute = long_report(args, results)
    line, totals = long_summary(results)
    what = []
    if args.long:
        what.append(f"evaluation (model.eval(), torch.no_grad(), one sentence) at T = "
                    f"{', '.join(map(str, args.long_lengths))}")
    if args.long_train:
        what.append(f"a training step of the encoder (train mode, forward and backward of {args.train_batch} "
                    f"sentences) at T = {', '.join(map(str, args.train_lengths))}")
    settings = (f"Long context: stock fairseq `{args.stock_arch}`{' ' + args.stock_flags if args.stock_flags else ''} "
                f"vs the plugin's `{args.arch}` with `--pe-attention-kernel {args.long_kernel}`, {layers}; "
                f"one encoder pass, {' and '.join(what)}; {precision_label(args)}, {args.threads} CPU threads; "
                f"memory: the peak extra {'GPU memory allocated' if args.device == 'cuda' else 'resident memory'}; "
                f"time: the fastest of {args.repeats} call{'s' if args.repeats > 1 else ''} after a first call "
                "(reported alone). "
                "Ratios to stock at the same T (✓/✗: the targets below).")
    targets = ["| group | systems | eval mem at T=16384, 32768 | eval time at T=16384 | mem/token T=32768 vs 4096 "
               "| CUDA train mem at T=8192 |", "|---|---|---|---|---|---|"]
    for g in LONG_TARGETS:
        targets.append(f"| {g['group']} | {', '.join(g['systems'])} | ≤{g['eval_mem']:.2f} | "
                       + (f"≤{g['eval_s']:.2f}" if "eval_s" in g else "") + f" | ±{g['per_token']:.0%} | "
                       + (f"≤{g['train_mem']:.2f}" if "train_mem" in g else "") + " |")
    text = (f"# Position encodings vs stock fairseq: long context\n\n{settings}\n\n{tables}\n\n{absolute}\n\n"
            f"{line}\n\nTargets (ratios to stock at the same T):\n\n" + "\n".join(targets) + "\n")
    payload = {"settings": {**{k: v for k, v in vars(args).items() if k != "stock_flags_list"},
                            "model_flags": MODEL_FLAGS, "encoder_env": {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
                            "env": {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
                            "python": sys.version.split()[0], "machine": machine},
               "baseline": STOCK, "systems": {name: results[name]["flags"] for name in systems},
               "targets": LONG_TARGETS, "results": results, "summary": {"line": line, **totals}}
    return write_results(outputs, text, payload, lambda path: long_plot(args, results, path),
                         f"{settings}\n\n{tables}\n\n{absolute}\n\n{line}", progress)


def add_options(p):
    """The options of the long-context measurements."""
    long_ = p.add_argument_group("long context; either mode replaces the translation measurements and writes "
                                 "OUT/benchmark-long.{md,json,png}")
    long_.add_argument("--long", action="store_true",
                       help="one encoder forward of one sentence in evaluation (model.eval(), torch.no_grad()) at "
                            "--long-lengths: peak extra memory, time (fastest of --repeats calls after a first call, "
                            "which is reported alone), ratios to stock at the same T")
    long_.add_argument("--long-lengths", type=int, nargs="+", default=LONG_LENGTHS, metavar="T",
                       help="the lengths of --long (the shortest is the per-token memory's base; default "
                            f"{' '.join(map(str, LONG_LENGTHS))})")
    long_.add_argument("--long-train", action="store_true",
                       help="a training step of the encoder (train mode, forward and backward) of --train-batch "
                            "sentences of --train-lengths tokens, against stock and against the same system with "
                            "--pe-attention-kernel sdpa (meant for --device cuda --fp16)")
    long_.add_argument("--train-lengths", type=int, nargs="+", default=TRAIN_LENGTHS, metavar="T",
                       help=f"the lengths of --long-train (default {' '.join(map(str, TRAIN_LENGTHS))})")
    long_.add_argument("--train-batch", type=int, default=8, help="sentences per batch of --long-train")
    long_.add_argument("--long-kernel", choices=KERNELS, default="auto",
                       help="the plugin's --pe-attention-kernel in the long measurements (default auto; sdpa: the "
                            "path before issue 41)")
    long_.add_argument("--encoder-layers", type=int, metavar="N",
                       help="encoder layers of stock and plugin alike in the long measurements (default: the "
                            "architecture's; fewer keep T = 32768 feasible on a CPU, and the results say so)")
    long_.add_argument("--memory-limit", type=float, metavar="GIB",
                       help="the address space of each long measurement's process on the CPU (RLIMIT_AS): a "
                            "measurement that needs more fails alone ('failed') instead of waking the kernel's OOM "
                            "killer on a shared machine (default: none)")


def check_options(args):
    """The long-context options: valid with --long or --long-train, refused without (naming them)."""
    if args.long or args.long_train:
        if args.encoder_only:
            raise UserError("--encoder-only measures the training-mode encoder memory; --long/--long-train measure "
                            "their own: give one or the other")
        for flag in ("long_lengths", "train_lengths"):
            if min(getattr(args, flag)) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {min(getattr(args, flag))}")
            setattr(args, flag, sorted(set(getattr(args, flag))))
        for flag in ("train_batch", "encoder_layers"):
            if getattr(args, flag) is not None and getattr(args, flag) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
        if args.memory_limit is not None and (args.memory_limit <= 0 or args.device != "cpu"):
            raise UserError(f"--memory-limit {args.memory_limit}: a positive number of GiB, on the CPU only (a CUDA "
                            "process reserves more address space than it uses)")
    else:
        given = [flag for flag, value, default in (
            ("--long-lengths", args.long_lengths, LONG_LENGTHS), ("--train-lengths", args.train_lengths, TRAIN_LENGTHS),
            ("--train-batch", args.train_batch, 8), ("--long-kernel", args.long_kernel, "auto"),
            ("--encoder-layers", args.encoder_layers, None), ("--memory-limit", args.memory_limit, None))
            if value != default]
        if given:
            raise UserError(f"{', '.join(given)}: options of the long-context measurements; add --long or --long-train")
