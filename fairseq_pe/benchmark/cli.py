"""``fairseq-pe-benchmark``: speed and memory of every position encoding, as ratios to stock fairseq (CPU, or a CUDA
GPU).

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
(``OMP_NUM_THREADS``/``MKL_NUM_THREADS``, and ``torch.set_num_threads`` in the children), dropout 0.  Each measurement
runs in a fresh process, one at a time.  Run it on an otherwise idle machine with at least ``--threads`` free cores:
with more busy threads than cores every torch operation waits for a descheduled thread and the times
mean nothing (the benchmark warns when the load average says so; the JSON records it).

``--device cuda`` measures the same on the first CUDA GPU (no ``--cpu``; with ``--fp16`` or ``--bf16``, fairseq's
options of that name for training and generation, and the encoder forward in that dtype): times as on the CPU;
the peak memory is then the GPU's peak allocated memory (``torch.cuda.max_memory_allocated``).  ``--bf16`` also works
on the CPU; ``--fp16`` needs CUDA.

What it measures: the translation models by default (:mod:`~fairseq_pe.benchmark.translation`), long context with
``--long``/``--long-train`` (:mod:`~fairseq_pe.benchmark.long_context`), language models with ``--lm``
(:mod:`~fairseq_pe.benchmark.language_model`); each against its targets (:mod:`~fairseq_pe.benchmark.targets`).  Exit
status: 0 whether targets are met or not; 2 for a usage error (one line naming the option); 1 when a training or a
generation fails (with its output's tail).

Results: the table on stdout and, each written atomically, ``OUT/benchmark.md``, ``.json`` and ``.png`` (``-long``,
``-lm`` for the other modes).  Existing results are only replaced with ``--force``.  Work files (data, checkpoints) go
under ``OUT/work``.  Progress (one line per measurement with round, count and an estimate of the time left) goes to
stderr.

    # the full benchmark (base size, every system, 3 rounds; an hour or more: the progress lines tell)
    fairseq-pe-benchmark --out bench
    # a quick base-size look at a few systems
    fairseq-pe-benchmark --out bench-quick --systems rope rpe-learned floater \\
        --updates 3 --repeats 1 --lengths 256 2048
    # IWSLT size
    fairseq-pe-benchmark --out bench-iwslt --size iwslt
    # smoke test: transformer_pe_tiny vs stock `transformer` with the same sizes (2+2 layers, 64 dims,
    # 4 heads, FFN 256)
    fairseq-pe-benchmark --out bench-tiny --size tiny --systems rpe-learned \\
        --updates 2 --sentences 60 --gen-sentences 5 --gen-len 6 --lengths 64 --vocab 100 --repeats 2

``--arch`` (plugin) and ``--stock-arch``/``--stock-flags`` (stock) override the ``--size`` preset;
the two models must come out with the same sizes (layers, dimensions, heads), which is checked
before anything runs.
"""

import argparse
import os

from fairseq_pe.benchmark import (encoder_memory, language_model, long_context, options, targets, train_generate,
                                  translation)
from fairseq_pe.benchmark.language_model import lm_benchmark
from fairseq_pe.benchmark.long_context import long_benchmark
from fairseq_pe.benchmark.models import MODEL_FLAGS, SIZE_KEYS, STOCK, check_same_size
from fairseq_pe.benchmark.runner import MeasurementFailed
from fairseq_pe.benchmark.translation import translation_benchmark
from fairseq_pe.errors import cli
from fairseq_pe.outputs import check_new_files

#: the modules whose docstrings --help shows after this one's: what each measurement does
DESCRIBED = (translation, train_generate, encoder_memory, targets, long_context, language_model)


def parse_args(argv):
    """The command line: the options every measurement takes, then each measurement's group, each checked."""
    p = argparse.ArgumentParser(prog="fairseq-pe-benchmark",
                                description="\n\n".join([__doc__.strip()] + [m.__doc__.strip() for m in DESCRIBED]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    options.add_options(p)
    translation.add_options(p)
    long_context.add_options(p)
    language_model.add_options(p)
    args = p.parse_args(argv)
    defaults = {a.dest: a.default for a in p._actions}
    language_model.check_options(args, defaults)
    long_context.check_options(args)
    options.check_options(args)
    return args


@cli
def main(argv=None):
    try:
        return benchmark(argv)
    except MeasurementFailed as e:
        raise SystemExit(f"fairseq-pe-benchmark: {e}") from None


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
    return translation_benchmark(args, systems, outputs, stock_sizes, plugin_sizes)
