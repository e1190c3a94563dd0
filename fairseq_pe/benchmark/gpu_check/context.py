"""What the checks share: the run's options, the device, the data (a synthetic translation task, made on first use)
and the models (each system's built once by fairseq from its command line; every check starts from a copy of the same
weights), the systems and their order, and random padded batches."""

import os
from typing import List, Optional

from fairseq_pe import systems as catalogue
#: every encoding (the quickstart's names), FLOATER in its three forms, issue 43's (those of 2024-2025, ReRoPE with
#: a window of 3): count_ops's systems, whose SDPA arguments docs/speed.md's tables give (sdpa_arguments)
from fairseq_pe.benchmark.count_ops import OWN_LOGITS, SYSTEMS
from fairseq_pe.benchmark.runner import PLUGIN

STOCK = "stock"

#: the systems in the order of their value on a GPU: the widely used encodings and those whose attention takes each
#: path first (APE, RoPE: no mask; ALiBi: a fixed bias; T5 and KERPLE: a learned bias, fused with its gradient on
#: CUDA; Shaw: blockwise), then the rest
SYSTEM_ORDER = list(catalogue.GROUPS["gpu-check"]) + [  # and count_ops.py's own (ReRoPE: RoPE's inference option)
    name for name in OWN_LOGITS if name not in catalogue.SYSTEMS]
assert sorted(SYSTEM_ORDER) == sorted(SYSTEMS)

#: the CPU rehearsal's systems (``--device cpu`` without ``--systems``): no mask, a fixed bias, a learned bias (the
#: blockwise path in training on the CPU)
REHEARSAL_SYSTEMS = ["ape-sinusoidal", "alibi", "t5"]

#: stock fairseq's architecture of the same size as each plugin architecture, with the flags that make it so
STOCK_ARCH = {
    "transformer_pe_iwslt_de_en": ("transformer_iwslt_de_en", []),
    "transformer_pe_wmt_en_de": ("transformer_wmt_en_de", []),
    "transformer_pe_tiny": ("transformer", ["--encoder-layers", "2", "--decoder-layers", "2", "--encoder-embed-dim",
                                            "64", "--decoder-embed-dim", "64", "--encoder-ffn-embed-dim", "256",
                                            "--decoder-ffn-embed-dim", "256", "--encoder-attention-heads", "4",
                                            "--decoder-attention-heads", "4"]),
}


class Context:
    """What the checks share: the options, the device, the data (made on first use), earlier checks' results."""

    def __init__(self, args, results):
        self.args = args
        self.device = "cuda:0" if args.device == "cuda" else "cpu"
        self.cuda = args.device == "cuda"
        self.results = results
        self.work = os.path.join(args.out, "work")
        self._data = None
        self._models = {}

    @property
    def data(self) -> str:
        if self._data is None:
            self._data = prepare_data(self.work, train_size=4000 if self.cuda else 400)
        return self._data

    @property
    def gpus(self) -> int:
        import torch

        return torch.cuda.device_count() if self.cuda else 0

    @property
    def dtypes(self) -> List[str]:
        """The dtypes of the forward and decoding checks."""
        return ["float32", "float16", "bfloat16"] if self.cuda else ["float32", "bfloat16"]

    @property
    def half_dtypes(self) -> List[str]:
        """The dtypes of the kernel and masked-rows checks: what trainings run in."""
        return ["float16", "bfloat16"] if self.cuda else ["float32"]

    def systems(self, order=None, first: Optional[int] = None) -> List[str]:
        """The run's systems in ``order`` (default: the run's), the first ``first`` of them."""
        chosen = [s for s in (order or self.args.systems) if s in self.args.systems]
        return chosen[:first] if first else chosen

    def build(self, system):
        """(task, a new copy of the system's model): every check starts from the same weights, built once."""
        import copy

        if system not in self._models:
            self._models[system] = build(self.args, self.data, system)
        task, model = self._models[system]
        return task, copy.deepcopy(model)


def prepare_data(work: str, train_size: int) -> str:
    """A synthetic translation task (sentences of 1 to 64 tokens), binarised by fairseq-preprocess; reused."""
    from fairseq_pe.translation.synthetic import write_corpus

    dest = os.path.join(work, "data-bin")
    if os.path.exists(os.path.join(dest, "train.src-tgt.src.idx")):
        return dest
    raw = write_corpus(os.path.join(work, "raw"), train_size=train_size, valid_size=50, train_lengths=(1, 64),
                       test_buckets=[(1, 8)], test_per_bucket=2, seed=1)
    from fairseq import options
    from fairseq_cli import preprocess

    handlers = list(preprocess.logger.handlers)
    try:
        preprocess.main(options.get_preprocessing_parser().parse_args([  # fairseq-preprocess, in this process
            "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train", "--validpref",
            f"{raw}/valid", "--destdir", dest, "--joined-dictionary", "--workers", "1"]))
    finally:
        for handler in preprocess.logger.handlers[len(handlers):]:  # its log file's
            preprocess.logger.removeHandler(handler)
            handler.close()
    return dest


def model_flags(args, system):
    """The architecture flags of ``system`` (stock: fairseq's transformer of the same size, without the plugin)."""
    if system == STOCK:
        arch, extra = STOCK_ARCH[args.arch]
        return ["--arch", arch, *extra]
    return ["--user-dir", PLUGIN, "--arch", args.arch, *SYSTEMS[system]]


def build(args, data, system, extra=()):
    """(task, model) built by fairseq from the command line of ``fairseq-train DATA ...`` (its parser and
    architecture; the task and model from the parsed namespace, as fairseq's legacy path does: hydra's
    composition of the whole configuration costs seconds per model), float32 on the CPU, initialised from seed 1,
    without dropout."""
    import torch
    from fairseq import options, tasks

    parser = options.get_training_parser()
    argv = [data, "--task", "translation", "-s", "src", "-t", "tgt", "--share-all-embeddings", "--dropout", "0",
            "--optimizer", "adam", "--lr", "0.0005", "--cpu", *model_flags(args, system), *extra]
    namespace = options.parse_args_and_arch(parser, argv)
    task = tasks.setup_task(namespace)
    torch.manual_seed(1)
    return task, task.build_model(namespace)


def padded_batch(dictionary, device, source_lengths, target_lengths):
    """A fairseq batch of random sentences: the source padded on the left, the target on the right."""
    from fairseq import utils

    from fairseq_pe.synthetic import random_batch

    sample = random_batch(dictionary, source_lengths, target_lengths)
    return utils.move_to_cuda(sample, device) if device.startswith("cuda") else sample


def lengths(ctx, incremental=False):
    if not ctx.cuda:  # the rehearsal: short, padded on both sides
        return ([12, 9, 5], [10, 8, 4]) if incremental else ([24, 15, 5], [20, 16, 4])
    return ([64, 40, 7], [40, 33, 5]) if incremental else ([192, 120, 7], [160, 140, 5])


def dtype_of(name):
    import torch

    return getattr(torch, name)
