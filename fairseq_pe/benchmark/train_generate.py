"""A translation model's training and generation, each in a fresh process (``fairseq-train``, then
``fairseq-generate`` on its last checkpoint):

* training time: ``fairseq-train`` for ``--updates`` updates of ``--max-tokens`` tokens, the time of the training loop
  that fairseq reports ("done training in"; it includes writing the final checkpoint, saved without optimizer state,
  whose time the JSON records);
* training peak memory: the peak resident memory (ru_maxrss) of the ``fairseq-train`` process; on CUDA the GPU's peak
  allocated memory (``torch.cuda.max_memory_allocated``);
* generation time: ``fairseq-generate`` with beam 4 of ``--gen-sentences`` test sentences, every hypothesis forced to
  exactly ``--gen-len`` tokens (``--min-len`` = ``--max-len-b``) so that all systems do the same work; the time
  fairseq reports for translating them (its token count over its tokens/s, which has more digits than its seconds).

``torch.fx.experimental.symbolic_shapes`` is imported before fairseq starts: torch's fused attention, which stock
fairseq uses, imports it (with sympy) on its first call with a padding mask, ~0.4 s that would land in stock's timed
training and generation only.
"""

import os
import re
import shutil
import sys
import time

from fairseq_pe.benchmark.runner import check_plugin, found, log, run

# runs a fairseq CLI in this process; reports the process's peak resident memory (KiB) and
# whether the plugin was imported
CLI_CHILD = r"""
import resource, runpy, sys
# torch's fused attention (stock fairseq's path) checks a key padding mask through torch._check_with,
# which imports torch.fx.experimental.symbolic_shapes (and sympy) on its first call: ~0.4 s inside the
# timed training and generation of stock only.  Imported here, before the clock, for every system.
import torch.fx.experimental.symbolic_shapes
name = sys.argv[1]
sys.argv = [name] + sys.argv[2:]
try:
    runpy.run_module({"fairseq-train": "fairseq_cli.train", "fairseq-generate": "fairseq_cli.generate"}[name],
                     run_name="__main__")
finally:
    print("PLUGIN_LOADED", int("fairseq_pe" in sys.modules), flush=True)
    print("PEAK_RSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, flush=True)
    import torch
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        print("CUDA_PEAK_KB", torch.cuda.max_memory_allocated() // 1024, flush=True)
"""


def train_and_generate(args, name, cmds, env, progress, round_):
    save = cmds["train"][cmds["train"].index("--save-dir") + 1]
    shutil.rmtree(save, ignore_errors=True)  # fairseq-train would resume from an earlier round's checkpoint
    os.makedirs(save)
    what = f"{name}: fairseq-train"
    start = time.time()
    out = run([sys.executable, "-c", CLI_CHILD, *cmds["train"]], env, what)
    wall = time.time() - start
    if "No existing checkpoint found" not in out:
        raise SystemExit(f"fairseq-pe-benchmark: {name}: fairseq-train resumed from a checkpoint in {save}; "
                         "the timing would be wrong")
    check_plugin(name, out, what)
    r = {"train_s": found(r"done training in ([\d.]+) seconds", out, what),
         "train_peak_kb": found(r"CUDA_PEAK_KB (\d+)" if args.device == "cuda" else r"PEAK_RSS_KB (\d+)", out, what,
                                int),
         # the final checkpoint is written inside fairseq's timed loop: kept small (no optimizer state)
         # and its time recorded, to judge the disk's share
         "checkpoint_write_s": found(r"writing took ([\d.]+) seconds", out, what),
         "train_wall_s": round(wall, 2)}
    log(f"round {round_}, {name}: train {r['train_s']:.1f} s, peak {r['train_peak_kb'] / 1024:.0f} MiB "
        f"({progress.record(name, 'train', wall)})")
    what = f"{name}: fairseq-generate"
    start = time.time()
    out = run([sys.executable, "-c", CLI_CHILD, *cmds["generate"]], env, what)
    wall = time.time() - start
    check_plugin(name, out, what)
    m = re.search(r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s \(([\d.]+) sentences/s, "
                  r"([\d.]+) tokens/s", out)
    if m is None or int(m.group(1).replace(",", "")) != args.gen_sentences:
        raise SystemExit(f"fairseq-pe-benchmark: {what} did not translate {args.gen_sentences} sentences:\n"
                         f"{out[-3000:]}")
    if int(m.group(2).replace(",", "")) != args.gen_sentences * (args.gen_len + 1):  # + </s>
        raise SystemExit(f"fairseq-pe-benchmark: {what}: the hypotheses are not {args.gen_len} tokens long:\n"
                         f"{out[-3000:]}")
    # tokens / (tokens/s): more digits than the rounded seconds
    r["generate_s"] = int(m.group(2).replace(",", "")) / float(m.group(5))
    r["generate_peak_kb"] = found(r"PEAK_RSS_KB (\d+)", out, what, int)
    r["generate_wall_s"] = round(wall, 2)
    log(f"round {round_}, {name}: generate {r['generate_s']:.2f} s ({progress.record(name, 'generate', wall)})")
    return r
