#!/usr/bin/env python3
"""Speed and memory of each position encoding, as ratios to ``--pe-absolute sinusoidal``.

Everything is measured in the same run, on the same machine, with the same data:

* training: ``fairseq-train`` of ``transformer_pe_wmt_en_de`` (base: 6+6 layers, 512 dims,
  8 heads) for ``--updates`` updates; wall time of the training loop ("done training in")
  and the peak resident memory of the process;
* generation: ``fairseq-generate`` with beam 4 of ``--gen-sentences`` sentences, every
  hypothesis forced to exactly ``--gen-len`` tokens (``--min-len`` = ``--max-len-b``) so all
  encodings do the same work; the time fairseq reports for translating them;
* times are the fastest of ``--repeats`` rounds (each round runs every system), which
  discounts slowdowns of a shared machine;
* encoder memory: the peak extra resident memory of one encoder forward (with autograd,
  as in training) of one sentence of T = 256, 1024, 2048 tokens.

The data are random sentences over a 32k-word vocabulary (content does not matter for
speed; the vocabulary size does, through the output layer).  Each measurement runs in a
fresh process.  Results: a Markdown table on stdout and ``OUT/benchmark.{md,json}``.

    python scripts/benchmark_positions.py --out bench            # all encodings
    python scripts/benchmark_positions.py --systems rope alibi --updates 5
"""

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
PLUGIN = os.path.join(os.path.dirname(HERE), "fairseq_pe")

sys.path.insert(0, os.path.dirname(HERE))
from fairseq_pe.quickstart import DEFAULT_SYSTEMS  # noqa: E402  (the encodings and their flags)

BASELINE = "ape-sinusoidal"
SYSTEMS = {name: flags for name, flags in DEFAULT_SYSTEMS.items()
           if "--pe-relative" in flags or name == BASELINE or name.startswith("floater")}

# runs a fairseq CLI in this process and reports the process's peak resident memory (KiB)
CLI_CHILD = r"""
import resource, runpy, sys
name = sys.argv[1]
sys.argv = [name] + sys.argv[2:]
try:
    runpy.run_module({"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate"}[name],
                     run_name="__main__")
finally:
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
"""

# one encoder forward of one T-token sentence; prints the peak extra resident memory (KiB)
ENCODER_CHILD = r"""
import argparse, sys, torch
from types import SimpleNamespace
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
sys.path.insert(0, sys.argv[1])
import fairseq_pe
from fairseq_pe.models.transformer_pe import TransformerPEModel
arch, length, flags = sys.argv[2], int(sys.argv[3]), sys.argv[4:]
torch.set_num_threads(1)
parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
TransformerPEModel.add_args(parser)
args = parser.parse_args(flags + ["--max-source-positions", str(length + 8), "--max-target-positions", str(length + 8)])
ARCH_CONFIG_REGISTRY[arch](args)
d = Dictionary()
for i in range(1000):
    d.add_symbol(str(i))
torch.manual_seed(0)
model = TransformerPEModel.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d)).train()
tokens = torch.randint(d.nspecial, len(d), (1, length))
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
model.encoder(tokens, torch.tensor([length]))  # warm-up (lazy caches)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current resident size
base = rss_kb("VmRSS:")
out = model.encoder(tokens, torch.tensor([length]))["encoder_out"][0]
print("PEAK_EXTRA_KB", rss_kb("VmHWM:") - base, flush=True)
"""


def log(msg):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise SystemExit(f"failed: {' '.join(cmd[:3])} ...\n{out[-4000:]}")
    return out


def make_data(out, sentences, test_sentences, seed=1, vocab=32000):
    raw = os.path.join(out, "raw")
    bin_dir = os.path.join(out, "bin")
    if os.path.exists(os.path.join(bin_dir, "done")):
        return bin_dir
    os.makedirs(raw, exist_ok=True)
    rng = random.Random(seed)
    words = [f"w{i}" for i in range(vocab)]
    for split, n in (("train", sentences), ("valid", 50), ("test", test_sentences)):
        with open(f"{raw}/{split}.src", "w") as s, open(f"{raw}/{split}.tgt", "w") as t:
            for _ in range(n):
                length = rng.randint(10, 60)
                s.write(" ".join(rng.choice(words) for _ in range(length)) + "\n")
                t.write(" ".join(rng.choice(words) for _ in range(length)) + "\n")
    run(["fairseq-preprocess", "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train",
         "--validpref", f"{raw}/valid", "--testpref", f"{raw}/test", "--destdir", bin_dir, "--joined-dictionary",
         "--workers", "2"], os.environ)
    open(os.path.join(bin_dir, "done"), "w").close()
    return bin_dir


def measure(args, name, flags, data, env, encoder_memory=True):
    save = os.path.join(args.out, "ckpt", name)
    shutil.rmtree(save, ignore_errors=True)  # fairseq-train would resume from an earlier round's checkpoint
    os.makedirs(save)
    log(f"{name}: training {args.updates} updates")
    out = run([sys.executable, "-c", CLI_CHILD, "fairseq-train", data, "--user-dir", PLUGIN,
               "--arch", args.arch, *flags, "--share-all-embeddings",
               "--optimizer", "adam", "--lr", "5e-4", "--lr-scheduler", "inverse_sqrt", "--warmup-updates", "100",
               "--criterion", "label_smoothed_cross_entropy", "--label-smoothing", "0.1",
               "--max-tokens", str(args.max_tokens), "--max-update", str(args.updates), "--disable-validation",
               "--save-dir", save, "--no-epoch-checkpoints", "--save-interval-updates", "0",
               "--seed", "1", "--cpu", "--num-workers", "0", "--log-format", "simple"], env)
    if "No existing checkpoint found" not in out:
        raise SystemExit(f"{name}: fairseq-train resumed from a checkpoint in {save}; the timing would be wrong")
    train_s = float(re.search(r"done training in ([\d.]+) seconds", out).group(1))
    train_kb = int(re.search(r"PEAK_RSS_KB (\d+)", out).group(1))
    log(f"{name}: generating {args.gen_sentences} sentences of {args.gen_len} tokens")
    out = run([sys.executable, "-c", CLI_CHILD, "fairseq-generate", data, "--user-dir", PLUGIN,
               "--path", os.path.join(save, "checkpoint_last.pt"), "--gen-subset", "test", "--beam", "4",
               "--batch-size", "16", "--min-len", str(args.gen_len), "--max-len-a", "0",
               "--max-len-b", str(args.gen_len), "--cpu", "--num-workers", "0"], env)
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s", out)
    assert int(m.group(1).replace(",", "")) == args.gen_sentences, out[-2000:]
    gen_s = args.gen_sentences / float(m.group(4))  # more digits than the rounded seconds
    gen_kb = int(re.search(r"PEAK_RSS_KB (\d+)", out).group(1))
    enc = {}
    for length in (args.lengths if encoder_memory else []):
        # a fixed mmap threshold: large tensors are always mapped and unmapped, so the resident
        # size follows the live tensors (glibc's adaptive threshold would recycle freed heap)
        child_env = dict(env, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
        out = run([sys.executable, "-c", ENCODER_CHILD, os.path.dirname(PLUGIN), args.arch, str(length), *flags],
                  child_env)
        enc[length] = int(re.search(r"PEAK_EXTRA_KB (-?\d+)", out).group(1))
    log(f"{name}: train {train_s:.1f}s, generate {gen_s:.1f}s" + (f", encoder memory {enc}" if enc else ""))
    return {"train_s": train_s, "train_peak_kb": train_kb, "generate_s": gen_s, "generate_peak_kb": gen_kb,
            "encoder_forward_extra_kb": enc}


def ratio(value, base):
    return f"{value / base:.2f}×" if base > 0 else "n/a"


def table(results, lengths):
    base = results[BASELINE]
    head = ["encoding", "train time", "train peak mem", "generate time"] + [f"enc. fwd mem T={t}" for t in lengths]
    rows = []
    for name, r in results.items():
        rows.append([name, ratio(r["train_s"], base["train_s"]), ratio(r["train_peak_kb"], base["train_peak_kb"]),
                     ratio(r["generate_s"], base["generate_s"])]
                    + [ratio(r["encoder_forward_extra_kb"][t], base["encoder_forward_extra_kb"][t]) for t in lengths])
    absolute = (f"baseline ({BASELINE}): train {base['train_s']:.1f}s, peak {base['train_peak_kb'] / 1024:.0f} MiB; "
                f"generate {base['generate_s']:.1f}s; encoder forward "
                + ", ".join(f"T={t}: {base['encoder_forward_extra_kb'][t] / 1024:.0f} MiB" for t in lengths))
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)] + ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n\n" + absolute


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmark-work")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS))
    p.add_argument("--arch", default="transformer_pe_wmt_en_de", help="(transformer_pe_tiny for a smoke test)")
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--sentences", type=int, default=3000, help="random training sentences")
    p.add_argument("--gen-sentences", type=int, default=32, help="test sentences to decode")
    p.add_argument("--gen-len", type=int, default=40)
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048])
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    p.add_argument("--repeats", type=int, default=2, help="timing rounds; the fastest counts")
    args = p.parse_args()
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads))
    data = make_data(args.out, args.sentences, args.gen_sentences)
    systems = [BASELINE] + [s for s in args.systems if s != BASELINE]
    results = {}
    for round_ in range(args.repeats):
        # every round measures all systems again; a system's time is its fastest round, which
        # discounts slowdowns from the machine (the first round also measures memory)
        log(f"round {round_ + 1}/{args.repeats}")
        for name in systems:
            r = measure(args, name, SYSTEMS[name], data, env, encoder_memory=round_ == 0)
            if name not in results:
                results[name] = dict(r, train_s_rounds=[], generate_s_rounds=[])
            results[name]["train_s_rounds"].append(r["train_s"])
            results[name]["generate_s_rounds"].append(r["generate_s"])
            results[name]["train_s"] = min(results[name]["train_s_rounds"])
            results[name]["generate_s"] = min(results[name]["generate_s_rounds"])
    text = table(results, args.lengths)
    settings = (f"{args.arch}, {args.updates} updates of --max-tokens {args.max_tokens}, "
                f"{args.threads} threads, fastest of {args.repeats} rounds; generation: beam 4, {args.gen_sentences} sentences × {args.gen_len} tokens")
    with open(os.path.join(args.out, "benchmark.md"), "w") as f:
        f.write(settings + "\n\n" + text + "\n")
    with open(os.path.join(args.out, "benchmark.json"), "w") as f:
        json.dump({"settings": vars(args), "results": results}, f, indent=2)
    print(settings + "\n\n" + text)


if __name__ == "__main__":
    main()
