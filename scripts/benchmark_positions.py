#!/usr/bin/env python3
"""Speed and memory of every position encoding, as ratios to stock fairseq (CPU, or a CUDA GPU).

The baseline, ``stock``, is fairseq's own Transformer without the plugin (no ``--user-dir``):
``transformer_wmt_en_de`` (base: 6+6 layers, 512 dims, 8 heads, FFN 2048, fairseq's sinusoidal
positions) by default, or ``transformer_iwslt_de_en`` with ``--size iwslt``.  Every other system
is the plugin's model of the same size (``transformer_pe_wmt_en_de`` / ``transformer_pe_iwslt_de_en``,
``fairseq-train --user-dir fairseq_pe``) with one position encoding:

* the encodings of the quickstart (``python -m fairseq_pe.systems names benchmark`` lists them all): ``none``, the APEs (``ape-learned``,
  ``ape-sinusoidal``, ``ape-learnable-sin``), the RPEs (``rpe-learned`` = Shaw et al.,
  ``rpe-sinusoidal`` = NEZHA, ``rpe-learnable-sin``), ``rope``, ``alibi``, ``t5``, ``floater``
  (FLOATER at every block's input) and ``floater-bias`` (FLOATER Q/K/V biases);
* ``ape-sinusoidal-fairseq`` (``--pe-absolute sinusoidal-fairseq``: fairseq's own sinusoids, the
  plugin's cost over stock with the same positions) and ``floater-input`` (``--pe-absolute
  floater`` at the embedding layer only);
* the extrapolation encodings since 2021, the quickstart's other named systems: ``kerple-log``,
  ``kerple-power``, ``xpos``, ``sandwich``, ``fire``, and randomised positions with the sinusoidal
  APE and with RoPE (``ape-sinusoidal-random``, ``rope-random``; L = ``max(--lengths)`` + 8 here), and with
  Sandwich and FIRE (``sandwich-random``, ``fire-random``: their bias per row).

``--systems`` picks a subset; ``stock`` is always measured, first in every round, and every ratio
is to the ``stock`` figure of the same run.

Settings (the defaults; every system gets the same): ``--threads 2`` CPU threads
(``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, and ``torch.set_num_threads`` in the encoder
measurement), random sentences over a shared ``--vocab 8000``-word vocabulary
(``fairseq-preprocess --joined-dictionary``, ``--share-all-embeddings``), ``--dropout 0
--attention-dropout 0 --activation-dropout 0``, ``--required-batch-size-multiple 1`` (so that
stock fairseq, which drops a last batch that is not a multiple of 8, and the plugin, which keeps
it, see the same batches), ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1`` (stock ``fairseq-generate``
cannot load its checkpoints on torch >= 2.6 without it; the plugin does the same internally), and
``torch.fx.experimental.symbolic_shapes`` imported before fairseq starts (torch's fused attention,
which stock fairseq uses, imports it, with sympy, on its first call with a padding mask: ~0.4 s that
would land in stock's timed training and generation only).  Each measurement runs in a fresh
process, one at a time.  Run it on an otherwise idle machine with at least ``--threads`` free cores:
with more busy threads than cores every torch operation waits for a descheduled thread and the times
mean nothing (the script warns when the load average says so; the JSON records it).

``--device cuda`` measures the same on the first CUDA GPU (no ``--cpu``; with ``--fp16`` or ``--bf16``, fairseq's
options of that name for training and generation, and the encoder forward in that dtype): times as on the CPU;
the training peak memory and the encoder forward memory are then the GPU's peak allocated memory
(``torch.cuda.max_memory_allocated``), of the training process and of one encoder forward beyond what the model
and its input hold.  ``--bf16`` also works on the CPU; ``--fp16`` needs CUDA.

Metrics, per system:

* training time: ``fairseq-train`` for ``--updates`` updates of ``--max-tokens`` tokens, the time of
  the training loop that fairseq reports ("done training in"; it includes writing the final
  checkpoint, saved without optimizer state, whose time the JSON records); the fastest of
  ``--repeats`` rounds (each round runs every system, alternating, which discounts slowdowns of a
  shared machine);
* training peak memory: the peak resident memory (ru_maxrss) of the ``fairseq-train`` process,
  the smallest of the rounds;
* generation time: ``fairseq-generate`` with beam 4 of ``--gen-sentences`` test sentences, every
  hypothesis forced to exactly ``--gen-len`` tokens (``--min-len`` = ``--max-len-b``) so all systems
  do the same work; the time fairseq reports for translating them (its token count over its
  tokens/s, which has more digits than its seconds), fastest of the rounds;
* encoder forward memory: the peak extra resident memory of one encoder forward of one sentence
  of T tokens (``--lengths``, default 256 1024 2048 4096) in train mode with autograd on (as in
  training), after a warm-up forward, with ``MALLOC_MMAP_THRESHOLD_=65536`` (large tensors are
  mapped and unmapped, so the resident size follows the live tensors); measured in round 1.
  For ``stock`` this builds fairseq's ``fairseq.models.transformer.TransformerModel`` from the stock
  architecture and flags, without importing ``fairseq_pe``; the plugin systems build
  ``TransformerPEModel``; both with ``--max-source-positions T+8``.  ``--encoder-batch left-padded`` measures
  a batch of that sentence and one of T/2 tokens padded on the left, as fairseq batches a source (FIRE's
  normaliser then takes its per-row path); ``--encoder-only`` measures nothing else.

Targets (``TARGETS`` below: the issue's table, ratios to stock on CPU) are checked for the
training time, the generation time and the encoder memory at T = 2048, each judged on the ratio
rounded to two decimals as printed.  The table shows e.g. ``1.04× ✓`` or ``1.31× ✗ (≤1.20)``; a
summary line tells how many targets were missed.  The script measures, it does not judge: its exit
status is 0 whether targets are met or not; 2 for a usage error (one line naming the option); 1 when
a training or a generation fails (with its output's tail).  An encoder forward that fails (a long
sentence that does not fit in memory) is marked ``failed`` in the table and the run goes on.

Long context (issue 41), in place of the measurements above: ``--long`` runs one encoder forward of one
sentence in evaluation (``model.eval()`` under ``torch.no_grad()``, as ``fairseq-generate``, validation and
``fairseq-eval-lm`` run it) at ``--long-lengths`` (default 4096 8192 16384 32768), per length stock first, each in
a fresh process: a first call (its time reported alone: a compile shows there), then ``--repeats`` calls, whose
peak extra memory (as above) and fastest time count; ratios to stock at the same T, and the memory per token at
the longest T against the shortest.  ``--long-train`` (for ``--device cuda --fp16``) runs a training step of the
encoder (train mode, forward and backward of ``--train-batch`` sentences) at ``--train-lengths`` (4096 8192),
against stock and against the same system with ``--pe-attention-kernel sdpa`` (the path before issue 41).  The
plugin's kernel is ``--long-kernel`` (its ``--pe-attention-kernel``, default auto); ``--encoder-layers N`` gives
stock and plugin N encoder layers (stock's SDPA at T = 32768 takes minutes per layer on a CPU); ``--memory-limit
GIB`` bounds each CPU measurement's address space, so that a length that does not fit fails alone.  Targets:
``LONG_TARGETS``; results in ``OUT/benchmark-long.{md,json,png}``::

    python scripts/benchmark_positions.py --out bench-long --long --encoder-layers 1 --repeats 1 --memory-limit 16
    python scripts/benchmark_positions.py --out bench-long-gpu --device cuda --fp16 --long-train --systems alibi t5

Language models (issue 42), in place of the measurements above: ``--lm`` measures stock fairseq's ``transformer_lm``
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
``--repeats`` calls after a first call; memory: the peak extra memory of a call (as ``--long``); a measurement that
runs out of memory is "failed" and the others go on.  Targets (``LM_TARGETS``): the training step as the translation
training time's targets, the evaluation at 16L as the long-context ones.  Results in
``OUT/benchmark-lm.{md,json,png}``::

    python scripts/benchmark_positions.py --out bench-lm --lm --systems alibi rope t5 ape-sinusoidal --repeats 2
    python scripts/benchmark_positions.py --out bench-lm-gpu --lm --device cuda --fp16 --lm-length 1024

Results: the table on stdout and, each written atomically, ``OUT/benchmark.md`` (the table, stock's
absolute figures, the targets), ``OUT/benchmark.json`` (settings, every system's flags and
command lines, every round, ratios, targets and pass/fail) and ``OUT/benchmark.png`` (the ratios per
system, one panel per metric, targets marked).  Existing results are only replaced with ``--force``.
Work files (data, checkpoints) go under ``OUT/work``; the data are reused while their options
stay the same.  Progress (one line per measurement with round, count and an estimate of the time
left) goes to stderr.

    # the full benchmark (base size, every system, 3 rounds; an hour or more: the progress lines tell)
    python scripts/benchmark_positions.py --out bench
    # a quick base-size look at a few systems
    python scripts/benchmark_positions.py --out bench-quick --systems rope rpe-learned floater \\
        --updates 3 --repeats 1 --lengths 256 2048
    # IWSLT size
    python scripts/benchmark_positions.py --out bench-iwslt --size iwslt
    # smoke test: transformer_pe_tiny vs stock `transformer` with the same sizes (2+2 layers, 64 dims,
    # 4 heads, FFN 256)
    python scripts/benchmark_positions.py --out bench-tiny --size tiny --systems rpe-learned \\
        --updates 2 --sentences 60 --gen-sentences 5 --gen-len 6 --lengths 64 --vocab 100 --repeats 2

``--arch`` (plugin) and ``--stock-arch``/``--stock-flags`` (stock) override the ``--size`` preset;
the two models must come out with the same sizes (layers, dimensions, heads), which is checked
before anything runs.
"""

import argparse
import fnmatch
import json
import os
import random
import re
import shlex
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PLUGIN = os.path.join(REPO, "fairseq_pe")

sys.path.insert(0, REPO)
from fairseq_pe.errors import UserError, cli  # noqa: E402
from fairseq_pe.outputs import check_new_files, savefig, write_json, write_text  # noqa: E402
from fairseq_pe import systems as catalogue  # noqa: E402  (the encodings and their flags)

STOCK = "stock"


def system_flags(args, name):
    """A plugin system's flags; randomised positions draw from [0, L) with L past the longest sentence
    measured (``max(--lengths)`` + 8, as ``--max-source-positions``), since a sequence has at most L tokens."""
    flags = list(SYSTEMS[name])
    if "--pe-random-positions" in flags:
        flags[flags.index("--pe-random-positions") + 1] = str(max(args.lengths) + 8)
    return flags


#: plugin systems: name -> fairseq-train flags (on top of --arch), the catalogue's benchmark group
SYSTEMS = catalogue.group("benchmark")

#: the same size of model, stock and plugin: --size -> (stock arch, stock flags, plugin arch)
TINY_FLAGS = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "64",
              "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256", "--decoder-ffn-embed-dim", "256",
              "--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
SIZES = {
    "wmt": ("transformer_wmt_en_de", [], "transformer_pe_wmt_en_de"),
    "iwslt": ("transformer_iwslt_de_en", [], "transformer_pe_iwslt_de_en"),
    "tiny": ("transformer", TINY_FLAGS, "transformer_pe_tiny"),  # tests and smoke runs
}
#: what must be equal for stock and plugin (after the architecture functions)
SIZE_KEYS = ["encoder_layers", "decoder_layers", "encoder_embed_dim", "decoder_embed_dim", "encoder_ffn_embed_dim",
             "decoder_ffn_embed_dim", "encoder_attention_heads", "decoder_attention_heads", "encoder_normalize_before",
             "decoder_normalize_before", "activation_fn", "share_all_embeddings", "dropout", "attention_dropout",
             "activation_dropout"]

#: model flags of every system, stock and plugin (the shared vocabulary, no dropout)
MODEL_FLAGS = ["--share-all-embeddings", "--dropout", "0", "--attention-dropout", "0", "--activation-dropout", "0"]

#: the metrics: key -> label (the encoder memory has one column per length: "encoder_T")
METRICS = {"train_s": "train time", "train_peak_kb": "train peak mem", "generate_s": "generation time"}
#: the length of the encoder-memory target
TARGET_LENGTH = 2048
TARGET_METRICS = {"train_s": "train time", f"encoder_{TARGET_LENGTH}": f"encoder mem at T={TARGET_LENGTH}",
                  "generate_s": "generation"}

#: the issue's targets: ratios to stock on CPU, at most (systems matched by name patterns)
TARGETS = [
    {"group": "none + every APE", "systems": ["none", "ape-*"],
     "train_s": 1.02, f"encoder_{TARGET_LENGTH}": 1.10, "generate_s": 1.02},
    {"group": "FLOATER input and all blocks", "systems": ["floater", "floater-input"],
     "train_s": 1.08, f"encoder_{TARGET_LENGTH}": 1.20, "generate_s": 1.02},
    # the encodings that compute the logits themselves (issue 43), before the biases that DAPE modifies: their
    # attention runs explicitly in blocks of rows, as the Shaw family's, hence that family's targets
    {"group": "FoX, CoPE, DAPE (v1, v2)", "systems": ["fox", "cope", "*-dape", "*-dape2"],
     "train_s": 1.20, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.10},
    {"group": "RoPE, ALiBi, T5, KERPLE, Sandwich, FIRE, xPos, p-RoPE, Resonance RoPE, FoPE",
     "systems": ["rope", "rope-random", "alibi", "t5", "kerple-*", "sandwich", "fire", "xpos",
                 *catalogue.ROTARY_2024],
     "train_s": 1.08, f"encoder_{TARGET_LENGTH}": 1.5, "generate_s": 1.05},
    {"group": "Shaw, NEZHA, learnable-sin RPE", "systems": ["rpe-*"],
     "train_s": 1.20, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.10},
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias"],
     "train_s": 1.15, f"encoder_{TARGET_LENGTH}": 2.0, "generate_s": 1.02},
]


def target_group(name, groups=None):
    """The first group of ``groups`` (default :data:`TARGETS`) whose patterns match system ``name``, or None."""
    for group in TARGETS if groups is None else groups:
        if any(fnmatch.fnmatchcase(name, pattern) for pattern in group["systems"]):
            return group
    return None


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

# stock fairseq's language model is registered with a dataclass, and its own architecture "transformer_lm" sets
# nothing: fairseq's CLI fills what an architecture leaves from the dataclass's defaults (an "${model.KEY}" default is
# KEY's value; another group's, None).  The same here, for a model built from an argparse namespace (in the
# children, and model_sizes)
STOCK_LM_DEFAULTS = r"""
def stock_lm_defaults(args):
    import dataclasses
    from fairseq.models.transformer_lm import TransformerLanguageModelConfig
    fields = dataclasses.fields(TransformerLanguageModelConfig)
    for f in fields:  # the declared default ("${model.KEY}" as written, not resolved against the dataclass)
        if getattr(args, f.name, None) is None:
            setattr(args, f.name, f.default if f.default is not dataclasses.MISSING else f.default_factory())
    for key in (f.name for f in fields):
        value = getattr(args, key)
        if isinstance(value, str) and value.startswith("${model.") and value.endswith("}"):
            setattr(args, key, getattr(args, value[len("${model."):-1]))
        elif isinstance(value, str) and value.startswith("${"):  # another group's: common.tpu (False), the task's
            setattr(args, key, None)  # max_target_positions (given)
"""

# the child scripts' model: stock fairseq or the plugin (kind: "stock", "plugin"; the language models: "stock-lm",
# "plugin-lm"), arch, the flags, T + 8 positions, a dictionary of vocab words, in device and dtype (the variables the
# child has parsed from its arguments)
BUILD_MODEL = r"""
import torch
from types import SimpleNamespace
from fairseq.data import Dictionary
from fairseq.models import ARCH_CONFIG_REGISTRY
if kind == "plugin":
    sys.path.insert(0, repo)
    import fairseq_pe
    from fairseq_pe.models.transformer_pe import TransformerPEModel as Model
elif kind == "plugin-lm":
    sys.path.insert(0, repo)
    import fairseq_pe
    from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel as Model
elif kind == "stock-lm":  # stock fairseq: the plugin is never imported
    from fairseq.models.transformer_lm import TransformerLanguageModel as Model
else:
    from fairseq.models.transformer import TransformerModel as Model
torch.set_num_threads(threads)
parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
Model.add_args(parser)
if kind.endswith("-lm"):  # a language model's positions are the task's option (--tokens-per-sample)
    args = parser.parse_args(flags)
    args.max_target_positions = length + 8
else:
    args = parser.parse_args(flags + ["--max-source-positions", str(length + 8), "--max-target-positions",
                                      str(length + 8)])
ARCH_CONFIG_REGISTRY[arch](args)
if kind == "stock-lm":
""" + "\n".join("    " + line for line in STOCK_LM_DEFAULTS.strip().splitlines()) + r"""
    stock_lm_defaults(args)
d = Dictionary()
for i in range(vocab):
    d.add_symbol("w%d" % i)
d.pad_to_multiple_(8)
torch.manual_seed(0)
model = Model.build_model(args, SimpleNamespace(source_dictionary=d, target_dictionary=d))
model = model.to(device=device, dtype=getattr(torch, dtype))
"""

# one encoder forward of one T-token sentence, stock fairseq or the plugin, with the same settings;
# prints the peak extra resident memory (KiB)
ENCODER_CHILD = r"""
import argparse, sys
kind, repo, arch, length, threads, vocab, batch, device, dtype = sys.argv[1:10]
length, threads, vocab, flags = int(length), int(threads), int(vocab), sys.argv[10:]
""" + BUILD_MODEL + r"""
model.train()
tokens = torch.randint(d.nspecial, len(d), (1 if batch == "one" else 2, length))
lengths = torch.tensor([length] * tokens.size(0))
if batch == "left-padded":  # a second sentence of half the length, padded on the left as fairseq batches a source
    tokens[1, :length - length // 2] = d.pad()
    lengths[1] = length // 2
tokens, lengths = tokens.to(device), lengths.to(device)
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
model.encoder(tokens, lengths)  # warm-up (lazy caches)
if device == "cuda":  # the GPU's peak allocated memory beyond what is allocated now (model, input)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = model.encoder(tokens, lengths)["encoder_out"][0]
    torch.cuda.synchronize()
    extra_kb = (torch.cuda.max_memory_allocated() - base) // 1024
else:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak (VmHWM) to the current resident size
    base = rss_kb("VmRSS:")
    out = model.encoder(tokens, lengths)["encoder_out"][0]
    extra_kb = rss_kb("VmHWM:") - base
assert out.requires_grad and out.shape[0] == length
print("PEAK_EXTRA_KB", extra_kb, flush=True)
print("PARAMS", sum(p.numel() for p in model.parameters()), flush=True)
print("THREADS", torch.get_num_threads(), flush=True)
print("PLUGIN_LOADED", int("fairseq_pe" in sys.modules), flush=True)
"""


def log(msg):
    print(f"[benchmark {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def duration(seconds):
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min {seconds % 60:02d} s"
    return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"


class MeasurementFailed(Exception):
    pass


def run(cmd, env, what):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    out = proc.stdout + proc.stderr
    if proc.returncode != 0:
        raise MeasurementFailed(f"{what} failed (exit status {proc.returncode}"
                                f"{', killed: out of memory?' if proc.returncode == -9 else ''}):\n{out[-4000:]}")
    return out


def found(pattern, out, what, cast=float):
    m = re.search(pattern, out)
    if m is None:
        raise SystemExit(f"benchmark_positions.py: {what}: no {pattern!r} in its output:\n{out[-3000:]}")
    return cast(m.group(1))


def machine_load():
    """The 1-minute load average (None where the system does not tell)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


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
        for folder in (raw, bin_dir):  # this script's data of other options
            shutil.rmtree(folder, ignore_errors=True)
    for folder in (raw, bin_dir):
        if os.path.exists(folder) and os.listdir(folder):
            raise UserError(f"--out {os.path.dirname(work)}: {folder} holds files this script did not write; "
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


def model_sizes(plugin, arch, flags, lm=False):
    """The sizes the architecture function gives a model (stock or plugin; a language model with ``lm``), from its
    flags."""
    from fairseq.models import ARCH_CONFIG_REGISTRY, ARCH_MODEL_REGISTRY
    from fairseq.models.transformer import TransformerModel
    from fairseq.models.transformer_lm import TransformerLanguageModel

    from fairseq_pe.models.transformer_lm_pe import TransformerPELanguageModel
    from fairseq_pe.models.transformer_pe import TransformerPEModel

    if lm:
        want = TransformerPELanguageModel if plugin else TransformerLanguageModel
    else:
        want = TransformerPEModel if plugin else TransformerModel
    flag = "--arch" if plugin else "--stock-arch"
    if arch not in ARCH_MODEL_REGISTRY:
        raise UserError(f"{flag} {arch}: no such fairseq architecture")
    if ARCH_MODEL_REGISTRY[arch] is not want:
        raise UserError(f"{flag} {arch}: an architecture of {ARCH_MODEL_REGISTRY[arch].__name__}, not of "
                        f"{'the plugin' if plugin else 'stock fairseq'}'s {want.__name__}")
    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    want.add_args(parser)
    try:
        args, unknown = parser.parse_known_args(flags)
    except SystemExit:
        raise UserError(f"{'' if plugin else '--stock-flags: '}bad model flags {' '.join(flags)!r}") from None
    if unknown:
        raise UserError(f"{'--arch' if plugin else '--stock-flags'}: unknown model flags {unknown}")
    ARCH_CONFIG_REGISTRY[arch](args)
    if lm and not plugin:
        namespace = {}
        exec(STOCK_LM_DEFAULTS, namespace)
        namespace["stock_lm_defaults"](args)
    return {key: getattr(args, key, None) for key in (LM_SIZE_KEYS if lm else SIZE_KEYS)}


class Progress:
    """Counts the measurements and estimates the time left from the ones done."""

    def __init__(self, plan):
        self.plan = plan  # [(system, kind)], in order
        self.done = 0
        self.seconds = {}
        self.start = time.time()

    def estimate(self, name, kind):
        if (name, kind) in self.seconds:
            return self.seconds[(name, kind)]
        length = re.search(r"T=(\d+)", kind)
        if length and not any(k == kind for _, k in self.seconds):
            # not yet measured at this length: the longest measured of the same kind, scaled as attention's
            # time grows, with the square of T
            shape = re.sub(r"T=\d+", "T=", kind)
            done = [(int(re.search(r"T=(\d+)", k).group(1)), s) for (_, k), s in self.seconds.items()
                    if "T=" in k and re.sub(r"T=\d+", "T=", k) == shape]
            if done:
                longest = max(t for t, _ in done)
                values = [s for t, s in done if t == longest]
                return sum(values) / len(values) * (int(length.group(1)) / longest) ** 2
        for similar in (lambda k: k == kind, lambda k: k.split()[0] == kind.split()[0], lambda k: True):
            values = [s for (_, k), s in self.seconds.items() if similar(k)]
            if values:
                return sum(values) / len(values)
        return None

    def record(self, name, kind, seconds):
        self.seconds[(name, kind)] = seconds
        self.done += 1
        left = [self.estimate(n, k) for n, k in self.plan[self.done:]]
        known = sum(s for s in left if s is not None)
        return (f"{self.done}/{len(self.plan)} done in {duration(time.time() - self.start)}, "
                f"~{duration(known)} left" if left else f"{self.done}/{len(self.plan)} done in "
                f"{duration(time.time() - self.start)}")


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


def model_dtype(args) -> str:
    return "float16" if args.fp16 else "bfloat16" if args.bf16 else "float32"


def precision_label(args) -> str:
    device = "CPU" if args.device == "cpu" else f"CUDA ({args.gpu_name})"
    return f"{device}, {model_dtype(args)}"


def check_same_size(args, model_flags, keys, lm=False):
    """Stock (``--stock-arch``, ``--stock-flags``) and plugin (``--arch``) models have the same sizes, or a
    UserError names what differs: ``(stock sizes, plugin sizes)``."""
    stock_sizes = model_sizes(False, args.stock_arch, args.stock_flags_list + model_flags, lm=lm)
    plugin_sizes = model_sizes(True, args.arch, model_flags, lm=lm)
    differ = {k: (stock_sizes[k], plugin_sizes[k]) for k in keys if stock_sizes[k] != plugin_sizes[k]}
    if differ:
        raise UserError(f"--stock-arch {args.stock_arch} (--stock-flags {args.stock_flags!r}) and --arch {args.arch} "
                        f"differ: {', '.join(f'{k} {a} vs {b}' for k, (a, b) in differ.items())}; pick a --size, "
                        "or make --stock-arch/--stock-flags match --arch")
    return stock_sizes, plugin_sizes


def check_plugin(name, out, what):
    loaded = found(r"PLUGIN_LOADED (\d)", out, what, int)
    if loaded != (name != STOCK):
        raise SystemExit(f"benchmark_positions.py: {what}: fairseq_pe was {'' if loaded else 'not '}imported")


def train_and_generate(args, name, cmds, env, progress, round_):
    save = cmds["train"][cmds["train"].index("--save-dir") + 1]
    shutil.rmtree(save, ignore_errors=True)  # fairseq-train would resume from an earlier round's checkpoint
    os.makedirs(save)
    what = f"{name}: fairseq-train"
    start = time.time()
    out = run([sys.executable, "-c", CLI_CHILD, *cmds["train"]], env, what)
    wall = time.time() - start
    if "No existing checkpoint found" not in out:
        raise SystemExit(f"benchmark_positions.py: {name}: fairseq-train resumed from a checkpoint in {save}; "
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
        raise SystemExit(f"benchmark_positions.py: {what} did not translate {args.gen_sentences} sentences:\n"
                         f"{out[-3000:]}")
    if int(m.group(2).replace(",", "")) != args.gen_sentences * (args.gen_len + 1):  # + </s>
        raise SystemExit(f"benchmark_positions.py: {what}: the hypotheses are not {args.gen_len} tokens long:\n"
                         f"{out[-3000:]}")
    # tokens / (tokens/s): more digits than the rounded seconds
    r["generate_s"] = int(m.group(2).replace(",", "")) / float(m.group(5))
    r["generate_peak_kb"] = found(r"PEAK_RSS_KB (\d+)", out, what, int)
    r["generate_wall_s"] = round(wall, 2)
    log(f"round {round_}, {name}: generate {r['generate_s']:.2f} s ({progress.record(name, 'generate', wall)})")
    return r


def encoder_memory(args, name, cmds, env, progress, round_):
    # a fixed mmap threshold: large tensors are always mapped and unmapped, so the resident size
    # follows the live tensors (glibc's adaptive threshold would recycle freed heap)
    child_env = dict(env, MALLOC_MMAP_THRESHOLD_=str(64 * 1024))
    enc, errors, params = {}, {}, None
    for length in args.lengths:
        cmd = list(cmds["encoder"])
        cmd[3] = str(length)
        what = f"{name}: encoder forward T={length}"
        start = time.time()
        try:
            out = run([sys.executable, "-c", ENCODER_CHILD, *cmd], child_env, what)
        except MeasurementFailed as e:
            # a long sentence may not fit in memory: the other measurements go on, the table says "failed"
            enc[str(length)], errors[str(length)] = None, str(e).splitlines()[0] + "\n..." + str(e)[-2000:]
            log(f"round {round_}, {name}: encoder forward T={length} FAILED ({str(e).splitlines()[0]}; "
                f"{progress.record(name, f'encoder T={length}', time.time() - start)})")
            continue
        check_plugin(name, out, what)
        if found(r"THREADS (\d+)", out, what, int) != args.threads:
            raise SystemExit(f"benchmark_positions.py: {what}: torch did not use {args.threads} threads")
        enc[str(length)] = found(r"PEAK_EXTRA_KB (-?\d+)", out, what, int)
        params = found(r"PARAMS (\d+)", out, what, int)
        log(f"round {round_}, {name}: encoder forward T={length}: {enc[str(length)] / 1024:.1f} MiB "
            f"({progress.record(name, f'encoder T={length}', time.time() - start)})")
    return enc, errors, params


def ratio_of(value, base):
    return value / base if base and base > 0 and value is not None else None


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


def cell(r, key, failed=None):
    """A table cell: the ratio of ``key`` with ✓ or ✗ (its target) where it has one; "failed" where the measurement
    failed (``failed``; default: the encoder measurement of that length failed), "n/a" where nothing was measured.
    The ± band of "per_token" is shown as its range."""
    if failed is None:
        failed = key.startswith("encoder_") and key[len("encoder_"):] in r.get("encoder_errors", {})
    if failed:
        return "failed"
    value = r["ratios"].get(key)
    if value is None:
        return "n/a"
    text = f"{value:.2f}×"
    target = r["targets"].get(key)
    if target is None or target["met"] is None:
        return text
    if target["met"]:
        return f"{text} ✓"
    bound = target["target"]
    return f"{text} ✗ ({1 - bound:.2f}–{1 + bound:.2f})" if key == "per_token" else f"{text} ✗ (≤{bound:.2f})"


def write_results(outputs, text, payload, draw, printed, progress) -> int:
    """Write the Markdown ``text``, the JSON ``payload`` and the PNG (``draw(path)``) to ``outputs`` (.md, .json,
    .png), print the tables; 0."""
    write_json(outputs[1], payload, indent=2)
    draw(outputs[2])
    write_text(outputs[0], text)
    print(printed, flush=True)
    log(f"wrote {', '.join(outputs)} in {duration(time.time() - progress.start)}")
    return 0


def summary(results, unmeasured_label=None, missed_label=None, nothing="targets: none apply to these systems"):
    """The line that sums up the targets of ``results``, and its JSON: how many, met, missed (``missed_label(name,
    key, target)``), not measured (``unmeasured_label(name, key, result)``)."""
    unmeasured_label = unmeasured_label or (lambda name, key, r: f"{name} {TARGET_METRICS[key]}" + (
        " (failed)" if key.startswith("encoder_") and key[len("encoder_"):] in r.get("encoder_errors", {}) else ""))
    missed_label = missed_label or (
        lambda name, key, t: f"{name} {TARGET_METRICS[key]} {t['ratio']:.2f}× (≤{t['target']:.2f})")
    total, missed, unmeasured = 0, [], []
    for name, r in results.items():
        for key, t in r["targets"].items():
            total += 1
            if t["met"] is None:
                unmeasured.append(unmeasured_label(name, key, r))
            elif not t["met"]:
                missed.append(missed_label(name, key, t))
    line = (f"targets: {len(missed)} of {total} missed ({total - len(missed) - len(unmeasured)} met)"
            + (f": {'; '.join(missed)}" if missed else "") if total else nothing)
    if unmeasured:
        line += f" ({len(unmeasured)} not measured: {', '.join(unmeasured)})"
    return line, {"targets": total, "met": total - len(missed) - len(unmeasured), "missed": missed,
                  "not_measured": unmeasured}


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


# ---------------------------------------------------------------------------------------------------------------
# Long context (issue 41): the encoder at T = 4096 .. 32768 in evaluation (``--long``), and a training step of the
# encoder at T = 4096, 8192 (``--long-train``, for a GPU with --device cuda --fp16)

#: the lengths of --long (4096: the per-token base) and of --long-train
LONG_LENGTHS = [4096, 8192, 16384, 32768]
TRAIN_LENGTHS = [4096, 8192]
#: the per-token base of the flatness target, and the lengths the memory and time targets are set at
PER_TOKEN_BASE = 4096
LONG_MEMORY_LENGTHS = (16384, 32768)
LONG_TIME_LENGTH = 16384
TRAIN_MEMORY_LENGTH = 8192
#: the kernels of --pe-attention-kernel (the plugin's option); "sdpa" is the path before issue 41
KERNELS = ["auto", "sdpa", "blockwise", "flex"]
BASELINE_KERNEL = "sdpa"

#: the issue's long-context targets, ratios to stock at the same T, at most (systems matched in order: the first
#: group whose patterns match); "per_token": the memory per token at the longest T against T = 4096, within ±10%
LONG_TARGETS = [
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias"], "eval_mem": 2.5, "per_token": 0.10},
    {"group": "ALiBi, T5, KERPLE, Sandwich, FIRE", "systems": ["alibi", "t5", "kerple-*", "sandwich", "fire"],
     "eval_mem": 1.10, "eval_s": 1.3, "per_token": 0.10, "train_mem": 1.2},
    {"group": "every other encoding", "systems": ["*"], "eval_mem": 1.10, "per_token": 0.10},
]


def long_target_group(name):
    return target_group(name, LONG_TARGETS)


# the child scripts' measurement: sync(), and measure(call, repeats): a first call (timed alone: a compile shows
# there), then REPEATS timed calls, each with its peak extra memory (the GPU's allocated memory beyond what is
# allocated before the call, or the resident memory's peak beyond the resident size before it); (first, times, peak).
# A child that runs several measurements in one process sets trim_heap: glibc's free heap is handed back to the system
# (malloc_trim) before each call, or a call could reuse the resident pages that an earlier one freed and show no peak
MEASURE = r"""
import ctypes
def sync():
    if device == "cuda":
        torch.cuda.synchronize()
def rss_kb(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1])
def timed(call):
    sync()
    start = time.perf_counter()
    call()
    sync()
    return time.perf_counter() - start
def measure(call, repeats):
    first = timed(call)
    times, peaks = [], []
    for _ in range(repeats):
        gc.collect()
        if trim_heap:
            ctypes.CDLL("libc.so.6").malloc_trim(0)
        if device == "cuda":  # the GPU's peak allocated memory beyond what is allocated now (model, gradients, input)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            times.append(timed(call))
            peaks.append((torch.cuda.max_memory_allocated() - base) // 1024)
        else:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")  # reset the peak (VmHWM) to the current resident size
            base = rss_kb("VmRSS:")
            times.append(timed(call))
            peaks.append(rss_kb("VmHWM:") - base)
    return first, times, max(peaks)
"""

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
    (and, in training, with ``sdpa`` too, the path before issue 41). Items: (mode, T, system, kernel)."""
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
        raise SystemExit(f"benchmark_positions.py: {what}: torch did not use {args.threads} threads")
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
            keys.append((f"train_mem_{TRAIN_MEMORY_LENGTH}", "train_mem"))  # the issue's target is CUDA's
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


# ---------------------------------------------------------------------------------------------------------------
# Language models (issue 42, --lm): stock fairseq's transformer_lm against the plugin's transformer_lm_pe of the same
# size, a training step at L and fairseq-eval-lm's work per sample at 4L and 16L

#: the same size of language model, stock and plugin: --size -> (stock arch, stock flags, plugin arch)
#: (stock "transformer_lm" is post-norm, its dataclass's default; the plugin's "transformer_lm_pe" is fairseq's
#: base_lm_architecture, pre-norm, as fairseq's named LM architectures: stock gets --decoder-normalize-before; its
#: dataclass's --decoder-input-dim and --decoder-output-dim are 512 whatever the embedding dimension)
LM_TINY_FLAGS = ["--decoder-layers", "2", "--decoder-embed-dim", "64", "--decoder-ffn-embed-dim", "256",
                 "--decoder-attention-heads", "4", "--decoder-normalize-before", "--decoder-input-dim", "64",
                 "--decoder-output-dim", "64"]
LM_SIZES = {
    # 6 layers, 512 dims, 8 heads, FFN 2048
    "base": ("transformer_lm", ["--decoder-normalize-before"], "transformer_lm_pe"),
    "gpt2-small": ("transformer_lm_gpt2_small", [], "transformer_lm_pe_gpt2_small"),
    "tiny": ("transformer_lm", LM_TINY_FLAGS, "transformer_lm_pe_tiny"),  # tests and smoke runs
}
#: what must be equal for stock and plugin language models (after the architecture functions)
LM_SIZE_KEYS = ["decoder_layers", "decoder_embed_dim", "decoder_ffn_embed_dim", "decoder_attention_heads",
                "decoder_normalize_before", "decoder_input_dim", "decoder_output_dim", "activation_fn",
                "share_decoder_input_output_embed", "adaptive_input", "adaptive_softmax_cutoff", "dropout",
                "attention_dropout", "activation_dropout"]
#: model flags of every language model, stock and plugin (tied input and output embeddings, no dropout)
LM_MODEL_FLAGS = ["--share-decoder-input-output-embed", "--dropout", "0", "--attention-dropout", "0",
                  "--activation-dropout", "0"]
LM_LENGTH = 512
LM_MULTIPLES = [4, 16]
#: the multiple of L whose evaluation the targets judge
LM_TARGET_MULTIPLE = 16

#: the language model's targets, ratios to stock at most (systems matched in order, the first group that matches):
#: the training step as the translation benchmark's training time (TARGETS), the evaluation at 16L as the encoder's
#: long-context evaluation (LONG_TARGETS: memory <= 1.10x, FLOATER's biases 2.5x; time <= 1.3x for the biases read
#: in place)
LM_TARGETS = [
    {"group": "none + every APE", "systems": ["none", "ape-*"], "train_s": 1.02, "eval_mem": 1.10},
    {"group": "FLOATER input and all blocks", "systems": ["floater", "floater-input"], "train_s": 1.08,
     "eval_mem": 1.10},
    {"group": "ALiBi, T5, KERPLE, Sandwich, FIRE", "systems": ["alibi", "t5", "kerple-*", "sandwich*", "fire*"],
     "train_s": 1.08, "eval_mem": 1.10, "eval_s": 1.3},
    {"group": "RoPE, xPos, p-RoPE, Resonance RoPE", "systems": ["rope", "rope-random", "xpos", "p-rope",
                                                               "rope-resonance"], "train_s": 1.08, "eval_mem": 1.10},
    {"group": "Shaw, NEZHA, learnable-sin RPE", "systems": ["rpe-*"], "train_s": 1.20, "eval_mem": 1.10},
    {"group": "FLOATER Q/K/V biases", "systems": ["floater-bias", "floater-warm"], "train_s": 1.15,
     "eval_mem": 2.5},
]
LM_TARGET_LABELS = {"train_s": "train step", "eval_mem": f"eval mem at {LM_TARGET_MULTIPLE}L",
                    "eval_s": f"eval time at {LM_TARGET_MULTIPLE}L"}

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


def lm_target_group(name):
    return target_group(name, LM_TARGETS)


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
            raise SystemExit(f"benchmark_positions.py: {what}: torch did not use {args.threads} threads")
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


def parse_args(argv):
    p = argparse.ArgumentParser(prog="benchmark_positions.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="benchmark-work", help="results and work files")
    p.add_argument("--force", action="store_true", help="replace the results of an earlier run in --out")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=[STOCK] + list(SYSTEMS),
                   help="the plugin systems to measure (default: all); stock is always measured")
    p.add_argument("--size", choices=list(dict.fromkeys([*SIZES, *LM_SIZES])),
                   help="stock transformer_wmt_en_de vs transformer_pe_wmt_en_de (wmt, the default), "
                        "transformer_iwslt_de_en vs transformer_pe_iwslt_de_en (iwslt), or stock transformer with 2+2 "
                        "layers, 64 dims, 4 heads, FFN 256 vs transformer_pe_tiny (tiny, for smoke tests); with --lm: "
                        "stock transformer_lm vs transformer_lm_pe (base, the default: 6 layers, 512 dims), "
                        "transformer_lm_gpt2_small vs transformer_lm_pe_gpt2_small (gpt2-small), or stock "
                        "transformer_lm with 2 layers, 64 dims, 4 heads, FFN 256 vs transformer_lm_pe_tiny (tiny)")
    p.add_argument("--arch", help="the plugin's architecture (overrides --size)")
    p.add_argument("--stock-arch", help="stock fairseq's architecture (overrides --size)")
    p.add_argument("--stock-flags", metavar="'FLAGS'",
                   help="model flags of the stock architecture, one string (overrides --size's), given as "
                        "--stock-flags='--encoder-layers 2 ...'")
    p.add_argument("--updates", type=int, default=10)
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--vocab", type=int, default=8000, help="words of the shared vocabulary")
    p.add_argument("--sentences", type=int, default=3000, help="random training sentences")
    p.add_argument("--gen-sentences", type=int, default=32, help="test sentences to decode")
    p.add_argument("--gen-len", type=int, default=40, help="tokens of every hypothesis")
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024, 2048, 4096],
                   help="sentence lengths of the encoder memory measurement")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of every measurement")
    p.add_argument("--repeats", type=int, default=3, help="timing rounds; the fastest counts")
    p.add_argument("--encoder-batch", choices=["one", "left-padded"], default="one",
                   help="the encoder memory's batch: one sentence of T tokens (default), or it and one of T/2 tokens "
                        "padded on the left, as fairseq batches a source (the per-row path of FIRE's normaliser)")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                   help="where every system runs: the CPU (default) or the first CUDA GPU; memory is then the GPU's")
    precision = p.add_mutually_exclusive_group()
    precision.add_argument("--fp16", action="store_true", help="fairseq's --fp16 (needs --device cuda)")
    precision.add_argument("--bf16", action="store_true", help="fairseq's --bf16")
    p.add_argument("--encoder-only", action="store_true",
                   help="measure the encoder forward memory only (no training, no generation)")
    long_ = p.add_argument_group("long context (issue 41); either mode replaces the measurements above and writes "
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
    lm = p.add_argument_group("language models (issue 42); --lm replaces the measurements above and writes "
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
    args = p.parse_args(argv)
    defaults = {a.dest: a.default for a in p._actions}
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
    for flag in ("updates", "max_tokens", "vocab", "sentences", "gen_sentences", "gen_len", "threads", "repeats"):
        if getattr(args, flag) < 1:
            raise UserError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if min(args.lengths) < 1:
        raise UserError(f"--lengths must be at least 1, got {min(args.lengths)}")
    args.lengths = list(dict.fromkeys(args.lengths))
    args.gpu_name = None
    if args.fp16 and args.device != "cuda":
        raise UserError("--fp16 needs --device cuda (fairseq's fp16 training is for GPUs); on the CPU use --bf16")
    if args.device == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise UserError("--device cuda: this torch sees no CUDA GPU "
                            f"(torch {torch.__version__}, CUDA {torch.version.cuda}); leave --device out for the CPU")
        args.gpu_name = torch.cuda.get_device_name(0)
    sizes, args.size = (LM_SIZES, args.size or "base") if args.lm else (SIZES, args.size or "wmt")
    if args.size not in sizes:
        raise UserError(f"--size {args.size}: {'with' if args.lm else 'without'} --lm, --size takes "
                        f"{', '.join(sizes)}")
    stock_arch, stock_flags, arch = sizes[args.size]
    args.arch = args.arch or arch
    args.stock_arch = args.stock_arch or stock_arch
    args.stock_flags_list = shlex.split(args.stock_flags) if args.stock_flags is not None else list(stock_flags)
    args.stock_flags = " ".join(args.stock_flags_list)
    for flag in ("--user-dir", "--arch"):
        if flag in args.stock_flags_list:
            raise UserError(f"--stock-flags cannot hold {flag}")
    return args


@cli
def main(argv=None):
    try:
        return benchmark(argv)
    except MeasurementFailed as e:
        raise SystemExit(f"benchmark_positions.py: {e}") from None


def benchmark(argv):
    args = parse_args(argv)
    if args.lm:
        return lm_benchmark(args)
    long_mode = args.long or args.long_train
    outputs = [os.path.join(args.out, f"benchmark{'-long' if long_mode else ''}.{ext}")
               for ext in ("md", "json", "png")]
    check_new_files(outputs, args.force, flag="--out", where=args.out)
    stock_sizes, plugin_sizes = check_same_size(args, MODEL_FLAGS, SIZE_KEYS)
    systems = [STOCK] + [s for s in dict.fromkeys(args.systems) if s != STOCK]
    if long_mode:
        threads = str(args.threads)
        os.makedirs(args.out, exist_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads, PYTHONWARNINGS="ignore")
        return long_benchmark(args, systems, env, outputs)

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


if __name__ == "__main__":
    sys.exit(main())
