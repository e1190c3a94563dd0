"""What every attention of every encoding hands to torch's ``scaled_dot_product_attention``: the table of
``docs/speed.md`` ("Which kernel each attention reaches"), which ``tests/test_kernel_choices.py`` checks against it.

    fairseq-pe-sdpa-arguments                  # every system: the markdown table on stdout
    fairseq-pe-sdpa-arguments --systems rope t5
    fairseq-pe-sdpa-arguments --cuda-choices   # the same with the choices the code makes on CUDA

For each system a 2+2-layer ``transformer_pe`` runs one forward pass on the CPU over a padded batch (sources of
different lengths, left-padded; targets right-padded) and an unpadded one, in training (autograd on, dropout on) and
in evaluation (``torch.no_grad``, as fairseq validates), and :mod:`fairseq_pe.diagnostics.attention_calls` records each
attention call.  The arguments, not the kernel, are recorded: they are the same on any device (the CUDA-only
choices of :mod:`fairseq_pe.models.attention` are named in the legend), and they decide the CUDA kernel:

* ``none`` and ``causal`` (``is_causal=True``): no mask, FlashAttention's arguments (fp16/bf16);
* ``mask DIMS``: a float mask (DIMS: which of batch, heads, queries, keys it has; 1 where it broadcasts): the
  memory-efficient kernel (or cuDNN's where torch prefers it), never FlashAttention;
* ``∇``: the mask carries a gradient (a learned bias in training); on CUDA the memory-efficient kernel returns it;
  on the CPU such an attention takes the blockwise path instead, which this table shows as ``blockwise``;
* ``blockwise``, ``explicit``, ``fairseq``: no SDPA kernel (matrix products; fairseq's own Python path for the
  cross-attention whose weights the decoder returns, as stock fairseq).

``--cuda-choices`` runs the same on the CPU with two of the attention's capabilities answering as on CUDA
(:mod:`fairseq_pe.models.capabilities`, injected by :func:`fairseq_pe.diagnostics.capabilities.as_on_cuda`:
``mask_gradient_fused``, a mask with a gradient goes to SDPA; ``aligned_rows``, masks with rows aligned for the
memory-efficient kernel).
"""

import argparse
import contextlib
import logging
import sys
import tempfile
import warnings

from fairseq_pe.benchmark.count_ops import SYSTEMS, dictionary_dir, sample
from fairseq_pe.benchmark.runner import PLUGIN
from fairseq_pe.errors import cli

ROLES = ("encoder-self", "decoder-self", "cross")
#: (batch, mode) columns of the table
SETTINGS = [("unpadded", "train"), ("unpadded", "eval"), ("padded", "train"), ("padded", "eval")]
SIZE = ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim", "32", "--decoder-embed-dim", "32",
        "--encoder-ffn-embed-dim", "64", "--decoder-ffn-embed-dim", "64", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4"]


def build_model(data, system):
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    argv = [data, "--task", "translation", "-s", "src", "-t", "tgt", "--cpu", "--user-dir", PLUGIN,
            "--arch", "transformer_pe", *SYSTEMS[system], *SIZE, "--share-all-embeddings", "--dropout", "0.1"]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(1)
    return task.build_model(cfg.model), task


def arguments(data, system, cuda=False):
    """(batch, mode) -> role -> the codes of :func:`~fairseq_pe.diagnostics.attention_calls.argument_summary`."""
    import torch

    from fairseq_pe.diagnostics.attention_calls import argument_summary, recording
    from fairseq_pe.diagnostics.capabilities import as_on_cuda

    model, task = build_model(data, system)
    dictionary = task.source_dictionary
    batches = {"padded": sample(dictionary, [14, 11, 9, 6], [12, 13, 7, 5]),
               "unpadded": sample(dictionary, [10] * 4, [8] * 4)}
    out = {}
    for batch, mode in SETTINGS:
        model.train(mode == "train")
        with recording(model) as calls, torch.set_grad_enabled(mode == "train"), \
                (as_on_cuda(model, only=CUDA_CHOICES) if cuda else contextlib.nullcontext()):
            model(**batches[batch]["net_input"])
        out[(batch, mode)] = argument_summary(calls)
    return out


#: the capabilities that ``--cuda-choices`` answers as on CUDA (FlexAttention's stay the CPU's: its forward only)
CUDA_CHOICES = ("mask_gradient_fused", "aligned_rows")


def measure(systems, cuda=False):
    """system -> (batch, mode) -> role -> codes; with ``cuda``, :data:`CUDA_CHOICES` answered as on CUDA."""
    import fairseq_pe  # noqa: F401  (the plugin and its fixes)

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as root:
        data = dictionary_dir(root)
        return {system: arguments(data, system, cuda) for system in systems}


def cell(summary) -> str:
    """'encoder self / decoder self / cross' codes of one setting."""
    return " / ".join(summary.get(role, "-") for role in ROLES)


def rows(results):
    """[(systems sharing a row, [cells per setting])], systems with the same cells on one row, in order."""
    grouped = {}
    for system, settings in results.items():
        cells = tuple(cell(settings[s]) for s in SETTINGS)
        grouped.setdefault(cells, []).append(system)
    return [(systems, list(cells)) for cells, systems in grouped.items()]


def header(cuda=False) -> str:
    return (f"| systems ({'CUDA' if cuda else 'CPU'}) | " + " | ".join(f"{batch}, {mode}" for batch, mode in SETTINGS)
            + " |")


def table(results, cuda=False) -> str:
    lines = [header(cuda), "|" + "---|" * (len(SETTINGS) + 1)]
    for systems, cells in rows(results):
        lines.append(f"| {', '.join(systems)} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def parse_table(text: str, cuda=False):
    """The table of :func:`table` in ``text`` (a page of markdown) read back: system -> [cells per setting]."""
    lines = text.splitlines()
    start = lines.index(header(cuda))
    out = {}
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        parts = [p.strip() for p in line.strip().strip("|").split("|")]
        for system in parts[0].split(","):
            out[system.strip()] = parts[1:]
    return out


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="fairseq-pe-sdpa-arguments", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS),
                   help="the encodings to probe (default: all)")
    p.add_argument("--cuda-choices", action="store_true",
                   help="the choices the attention makes on CUDA (its device tests answering as there)")
    args = p.parse_args(argv)
    print(table(measure(args.systems, args.cuda_choices), args.cuda_choices))
    return 0


if __name__ == "__main__":
    sys.exit(main())
