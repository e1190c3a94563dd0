"""Language models, in place of the translation measurements: ``--lm`` measures stock fairseq's ``transformer_lm``
against the plugin's ``transformer_lm_pe`` of the same size (``--size base``, the default with ``--lm``: 6 layers, 512
dims, 8 heads, FFN 2048, pre-norm as fairseq's ``base_lm_architecture``; ``gpt2-small``; ``tiny``: 2 layers, 64
dims), tied input and output embeddings, dropout 0, each system in a fresh process (stock without importing the
plugin): a training step at L = ``--lm-length`` (default 512: ``--lm-batch`` sequences of L tokens, train mode,
forward and backward of fairseq's ``cross_entropy`` loss, the gradients dropped after it as fairseq's ``zero_grad``
does), then what ``fairseq-eval-lm`` does per sample at ``--lm-multiples`` of L (default 4 and 16): one sequence in
eval mode under ``torch.no_grad()``, the decoder's log-probabilities over the vocabulary and the targets' picked out
(its ``SequenceScorer``).  Both models are built with ``--max-target-positions`` 16L + 8 (stock's sinusoidal table,
and a learned table, cover 16L; a trained ``ape-learned`` checkpoint refuses a longer ``--tokens-per-sample`` by
name, the cost measured here is the table's); randomised positions draw from [0, 16L + 8).  Time: the fastest of
``--repeats`` calls after a first call; memory: the peak extra memory of a call; a measurement that runs out of
memory is "failed" and the others go on.  Targets: ``LM_TARGETS`` (:mod:`~fairseq_pe.benchmark.targets`).  Results
in ``OUT/benchmark-lm.{md,json,png}``::

    fairseq-pe-benchmark --out bench-lm --lm --systems alibi rope t5 ape-sinusoidal --repeats 2
    fairseq-pe-benchmark --out bench-lm-gpu --lm --device cuda --fp16 --lm-length 1024
"""

import os
import re
import subprocess
import sys
import time

from fairseq_pe.benchmark.long_context import long_plot, run_key
from fairseq_pe.benchmark.models import (BUILD_MODEL, LM_MODEL_FLAGS, LM_SIZE_KEYS, STOCK, SYSTEMS, check_same_size,
                                         model_dtype, precision_label)
from fairseq_pe.benchmark.runner import (MEASURE, REPO, MeasurementFailed, Progress, check_plugin, found, log,
                                         machine_load, write_results)
from fairseq_pe.benchmark.targets import (LM_TARGET_LABELS, LM_TARGET_MULTIPLE, LM_TARGETS, cell, lm_target_group,
                                          ratio_of, summary)
from fairseq_pe.errors import UserError
from fairseq_pe.outputs import check_new_files

LM_LENGTH = 512
LM_MULTIPLES = [4, 16]

# one process per system: the language model (stock-lm or plugin-lm) built for the longest evaluation, then each
# measurement of PLAN ("train:512,eval:2048,eval:8192"), each by MEASURE: "train", a training step of BATCH sequences
# of T tokens (train mode; fairseq's cross_entropy criterion's loss: the summed NLL of the log-probabilities; forward
# and backward; the gradients dropped after it, as fairseq's zero_grad does); "eval", what fairseq-eval-lm does per
# sample (its SequenceScorer): one sequence of T tokens in eval mode under no_grad, the decoder's log-probabilities
# over the vocabulary and the targets' picked out.  A measurement that fails (out of memory) prints FAILED and the
# others go on.
LM_CHILD = r"""
import argparse, gc, sys, time
kind, repo, arch, length, threads, vocab, device, dtype, repeats, batch, plan = sys.argv[1:12]
length, threads, vocab, repeats, batch = map(int, (length, threads, vocab, repeats, batch))
flags = sys.argv[12:]
trim_heap = True  # several measurements in this process: what one freed is handed back before the next
""" + BUILD_MODEL + MEASURE + r"""
import torch.nn.functional as F
def measurement(mode, t):
    rows = batch if mode == "train" else 1
    tokens = torch.randint(d.nspecial, len(d), (rows, t), device=device)
    target = tokens.roll(-1, dims=1)
    model.train(mode == "train")
    def call():
        if mode == "train":
            lprobs = model.get_normalized_probs(model(tokens), log_probs=True)
            loss = F.nll_loss(lprobs.view(-1, lprobs.size(-1)), target.view(-1), reduction="sum")
            loss.backward()
            model.zero_grad(set_to_none=True)
        else:
            with torch.no_grad():
                out = model.get_normalized_probs(model(tokens), log_probs=True).gather(-1, target.unsqueeze(-1))
            assert not out.requires_grad and out.shape == (rows, t, 1)
    return call
for item in plan.split(","):
    mode, t = item.split(":")
    try:
        first, times, peak = measure(measurement(mode, int(t)), repeats)
    except (RuntimeError, MemoryError) as e:
        print("FAILED", item, (str(e).strip().splitlines() or [type(e).__name__])[0], flush=True)
        continue
    finally:
        gc.collect()
    print("RESULT", item, repr(first), peak, " ".join(repr(x) for x in times), flush=True)
print("THREADS", torch.get_num_threads(), flush=True)
print("PLUGIN_LOADED", int("fairseq_pe" in sys.modules), flush=True)
"""


def lm_lengths(args):
    """The measurements of --lm: [(mode, T)], the training step at L then the evaluations at each multiple."""
    return [("train", args.lm_length)] + [("eval", m * args.lm_length) for m in args.lm_multiples]


def lm_system_flags(args, name):
    """A plugin system's flags for --lm: randomised positions draw from [0, L') with L' past the longest evaluation
    (16L + 8, as the child's --max-target-positions), since a sequence then has at most 16L tokens."""
    flags = list(SYSTEMS[name])
    if "--pe-random-positions" in flags:
        flags[flags.index("--pe-random-positions") + 1] = str(max(t for _, t in lm_lengths(args)) + 8)
    return flags


def lm_command(args, name):
    """The argv (after the interpreter and ``-c LM_CHILD``) of one system's measurements."""
    stock = name == STOCK
    plan = ",".join(f"{mode}:{t}" for mode, t in lm_lengths(args))
    return ["stock-lm" if stock else "plugin-lm", REPO, args.stock_arch if stock else args.arch,
            str(max(t for _, t in lm_lengths(args))), str(args.threads), str(args.vocab), args.device,
            model_dtype(args), str(args.repeats), str(args.lm_batch), plan,
            *(args.stock_flags_list if stock else lm_system_flags(args, name)), *LM_MODEL_FLAGS]


def lm_measure(args, name, env, progress):
    """One system's measurements in a fresh process: {"train T=512": {"mem_kb", "first_s", "best_s", "times_s"},
    "eval T=2048": ...} and the errors of those that failed (the process's own failure fails those not reported)."""
    cmd = lm_command(args, name)
    what = f"{name}: language model"
    start = time.time()
    child_env = dict(env, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))  # the resident size follows the live tensors
    proc = subprocess.run([sys.executable, "-c", LM_CHILD, *cmd], capture_output=True, text=True, env=child_env)
    out = proc.stdout + proc.stderr
    if proc.returncode not in (0, -9):  # not a measurement out of memory (those print FAILED, or the kernel kills)
        raise MeasurementFailed(f"{what} failed (exit status {proc.returncode}):\n{out[-4000:]}")
    runs, errors = {}, {}
    for mode, t in lm_lengths(args):
        key = run_key(mode, t, None)
        m = re.search(rf"^RESULT {mode}:{t} (\S+) (-?\d+) ([^\n]+)$", proc.stdout, re.M)
        failed = re.search(rf"^FAILED {mode}:{t} ([^\n]*)$", proc.stdout, re.M)
        if m:
            times = [float(x) for x in m.group(3).split()]
            runs[key] = {"mem_kb": int(m.group(2)), "first_s": float(m.group(1)), "best_s": min(times),
                         "times_s": times}
        else:
            runs[key] = None
            errors[key] = (failed.group(1) if failed else
                           f"{what} failed (exit status {proc.returncode}"
                           f"{', killed: out of memory?' if proc.returncode == -9 else ''}):\n...{out[-2000:]}")
    if proc.returncode == 0:
        check_plugin(name, out, what)
        if found(r"THREADS (\d+)", out, what, int) != args.threads:
            raise SystemExit(f"fairseq-pe-benchmark: {what}: torch did not use {args.threads} threads")
    summary_ = "; ".join(f"{key}: " + ("FAILED" if r is None else f"{r['mem_kb'] / 1024:.1f} MiB, best "
                                       f"{r['best_s']:.3f} s") for key, r in runs.items())
    log(f"{name}: {summary_} ({progress.record(name, 'lm', time.time() - start)})")
    return runs, errors, cmd


def lm_ratio_keys(args):
    """[(ratio key, run key, field)] of the table: the training step's time and memory, then each evaluation's."""
    keys = [("train_s", run_key("train", args.lm_length, None), "best_s"),
            ("train_mem", run_key("train", args.lm_length, None), "mem_kb")]
    for m in args.lm_multiples:
        keys += [(f"eval_s_{m}L", run_key("eval", m * args.lm_length, None), "best_s"),
                 (f"eval_mem_{m}L", run_key("eval", m * args.lm_length, None), "mem_kb")]
    return keys


def lm_ratios(args, results):
    """Ratios to stock (the same measurement), and the targets of each system's group (judged as printed)."""
    base = results[STOCK]["runs"]
    for name, r in results.items():
        r["ratios"] = {key: ratio_of(r["runs"][run] and r["runs"][run][field], base[run] and base[run][field])
                       for key, run, field in lm_ratio_keys(args)}
        group = None if name == STOCK else lm_target_group(name)
        r["target_group"] = group["group"] if group else None
        r["targets"] = {}
        for target_key, key in (("train_s", "train_s"), ("eval_mem", f"eval_mem_{LM_TARGET_MULTIPLE}L"),
                                ("eval_s", f"eval_s_{LM_TARGET_MULTIPLE}L")):
            if group is None or target_key not in group or key not in r["ratios"]:
                continue
            value = r["ratios"][key]
            r["targets"][key] = {"target": group[target_key], "ratio": value,
                                 "met": None if value is None else round(value, 2) <= group[target_key]}


def lm_columns(args):
    """The tables of --lm: [(title, [(header, ratio key, the runs whose failure fails the cell)])]."""
    length = args.lm_length
    train = [(f"train step time L={length}", "train_s", [run_key("train", length, None)]),
             (f"train step mem L={length}", "train_mem", [run_key("train", length, None)])]
    evals = []
    for m in args.lm_multiples:
        run = [run_key("eval", m * length, None)]
        evals += [(f"eval time {m}L={m * length}", f"eval_s_{m}L", run), (f"eval mem {m}L={m * length}",
                                                                            f"eval_mem_{m}L", run)]
    return [(f"Training step ({args.lm_batch} sequences of L={length} tokens, forward and backward), ratios to stock",
             train),
            ("fairseq-eval-lm's work per sample (one sequence, eval, no_grad, log-probabilities), ratios to stock",
             evals)]


def lm_report(args, results):
    columns = [c for _, cols in lm_columns(args) for c in cols]
    head = ["system"] + [c[0] for c in columns] + ["targets met"]
    rows = []
    for name, r in results.items():
        checked = [t for t in r["targets"].values() if t["met"] is not None]
        met = f"{sum(t['met'] for t in checked)}/{len(checked)}" if checked else ""
        rows.append([name] + [cell(r, key, any(run in r["errors"] for run in runs)) for _, key, runs in columns]
                    + [met])
    table = "\n".join(["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                      + ["| " + " | ".join(row) + " |" for row in rows])
    absolute = f"{STOCK} ({args.stock_arch}{' ' + args.stock_flags if args.stock_flags else ''}): " + "; ".join(
        f"{key}: " + ("failed" if m is None else f"{m['mem_kb'] / 1024:.1f} MiB, {m['best_s']:.3f} s (first call "
                                                 f"{m['first_s']:.3f} s)")
        for key, m in results[STOCK]["runs"].items())
    targets = ["| group | systems | " + " | ".join(LM_TARGET_LABELS.values()) + " |", "|---|---|---|---|---|"]
    for g in LM_TARGETS:
        targets.append(f"| {g['group']} | {', '.join(g['systems'])} | "
                       + " | ".join(f"≤{g[k]:.2f}" if k in g else "" for k in LM_TARGET_LABELS) + " |")
    return table, absolute, "\n".join(targets)


def lm_benchmark(args):
    outputs = [os.path.join(args.out, f"benchmark-lm.{ext}") for ext in ("md", "json", "png")]
    check_new_files(outputs, args.force, flag="--out", where=args.out)
    stock_sizes, plugin_sizes = check_same_size(args, LM_MODEL_FLAGS, LM_SIZE_KEYS, lm=True)
    systems = [STOCK] + [s for s in dict.fromkeys(args.systems) if s != STOCK]
    os.makedirs(args.out, exist_ok=True)
    threads = str(args.threads)
    env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONWARNINGS="ignore")
    progress = Progress([(name, "lm") for name in systems])
    log(f"language models: {len(systems)} systems ({', '.join(systems)}), one process each; stock {args.stock_arch} "
        f"vs {args.arch}, L={args.lm_length}, evaluation at {', '.join(f'{m}L' for m in args.lm_multiples)}, "
        f"{args.threads} threads, {args.repeats} timed calls after the first")
    machine = {"cpus": os.cpu_count(), "load_before": machine_load()}
    results = {}
    for name in systems:
        runs, errors, cmd = lm_measure(args, name, env, progress)
        results[name] = {"flags": " ".join(args.stock_flags_list if name == STOCK else lm_system_flags(args, name)),
                         "command": cmd, "sizes": stock_sizes if name == STOCK else plugin_sizes, "runs": runs,
                         "errors": errors}
    machine["load_after"] = machine_load()
    lm_ratios(args, results)
    table, absolute, targets = lm_report(args, results)
    line, totals = summary(results, lambda name, key, r: f"{name} {key}" + (" (failed)" if r["errors"] else ""),
                           lambda name, key, t: f"{name} {key} {t['ratio']:.2f}× (≤{t['target']:.2f})")
    stock = f"`{args.stock_arch}`{' ' + args.stock_flags if args.stock_flags else ''}"
    settings = (f"Language models: stock fairseq {stock}"
                f" vs the plugin's `{args.arch}`, {args.vocab}-word vocabulary, tied input and output embeddings, "
                f"dropout 0; {precision_label(args)}, {args.threads} CPU threads; training step: {args.lm_batch} "
                f"sequences of L={args.lm_length} tokens, train mode, forward and backward of the summed NLL; "
                f"evaluation: what fairseq-eval-lm does per sample, one sequence of "
                f"{', '.join(f'{m}L={m * args.lm_length}' for m in args.lm_multiples)} tokens in eval mode under "
                f"no_grad, the decoder's log-probabilities (both models built with --max-target-positions "
                f"{max(t for _, t in lm_lengths(args)) + 8}); time: the fastest of {args.repeats} "
                f"call{'s' if args.repeats > 1 else ''} after a first call; memory: the peak extra "
                f"{'GPU memory allocated' if args.device == 'cuda' else 'resident memory'} of a call. Ratios to "
                f"stock (✓/✗: the target of the system's group, below).")
    text = (f"# Language models: position encodings vs stock fairseq\n\n{settings}\n\n{table}\n\n{absolute}\n\n"
            f"{line}\n\nTargets (ratios to stock, at most):\n\n{targets}\n")
    payload = {"settings": {**{k: v for k, v in vars(args).items() if k != "stock_flags_list"},
                            "model_flags": LM_MODEL_FLAGS, "target_multiple": LM_TARGET_MULTIPLE,
                            "env": {k: env[k] for k in ("OMP_NUM_THREADS", "MKL_NUM_THREADS")},
                            "child_env": {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)},
                            "python": sys.version.split()[0], "machine": machine},
               "baseline": STOCK, "systems": {name: results[name]["flags"] for name in systems},
               "targets": LM_TARGETS, "results": results, "summary": {"line": line, **totals}}
    return write_results(outputs, text, payload,
                         lambda path: long_plot(args, results, path, lm_columns(args), "language models"),
                         f"{settings}\n\n{table}\n\n{absolute}\n\n{line}", progress)


def add_options(p):
    """The options of the language-model measurements."""
    lm = p.add_argument_group("language models; --lm replaces the translation measurements and writes "
                              "OUT/benchmark-lm.{md,json,png}")
    lm.add_argument("--lm", action="store_true",
                    help="stock fairseq's transformer_lm vs the plugin's transformer_lm_pe of the same --size: a "
                         "training step at L (--lm-length) and fairseq-eval-lm's work per sample at --lm-multiples "
                         "of L, time and memory as ratios to stock (each system in a fresh process)")
    lm.add_argument("--lm-length", type=int, default=LM_LENGTH, metavar="L",
                    help=f"the training length L (--tokens-per-sample; default {LM_LENGTH})")
    lm.add_argument("--lm-multiples", type=int, nargs="+", default=LM_MULTIPLES, metavar="K",
                    help="the evaluation lengths, as multiples of L (default "
                         f"{' '.join(map(str, LM_MULTIPLES))}; the targets judge {LM_TARGET_MULTIPLE}L)")
    lm.add_argument("--lm-batch", type=int, default=8, help="sequences of L tokens per training step (default 8)")


def check_options(args, defaults):
    """With --lm, its options checked and the other modes' refused; without, its options refused (naming them)."""
    lm_given = [f"--{k.replace('_', '-')}" for k in ("lm_length", "lm_multiples", "lm_batch")
                if getattr(args, k) != defaults[k]]
    if args.lm:
        # the options of the other modes measure nothing here: refused, not ignored
        other = [f"--{k.replace('_', '-')}" for k in ("updates", "max_tokens", "sentences", "gen_sentences", "gen_len",
                                                      "lengths", "encoder_batch", "encoder_only", "long", "long_train")
                 if getattr(args, k) != defaults[k]]
        if other:
            raise UserError(f"{', '.join(other)}: not an option of --lm (its options: --lm-length, --lm-multiples, "
                            "--lm-batch, --size, --systems, --repeats, --threads, --vocab, --device, --fp16/--bf16)")
        for flag in ("lm_length", "lm_batch"):
            if getattr(args, flag) < 1:
                raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
        if min(args.lm_multiples) < 1:
            raise UserError(f"--lm-multiples must be at least 1, got {min(args.lm_multiples)}")
        args.lm_multiples = sorted(set(args.lm_multiples))
    elif lm_given:
        raise UserError(f"{', '.join(lm_given)}: options of the language-model measurements; add --lm")
