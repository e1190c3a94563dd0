"""Host syncs per training step and operators per decoding step, for every encoding and stock fairseq.

    fairseq-pe-count-ops                       # every system, a 6+6-layer model, the table on stdout
    fairseq-pe-count-ops --systems rope t5 --json counts.json

On a GPU a training step is bound by kernel launches and host syncs, step-by-step decoding by launches; both are
counted here on the CPU, where the same operators run (:mod:`fairseq_pe.diagnostics.op_count`): every operator that
reaches torch's kernels, and the calls after which the host holds a tensor's value (``.item()``, ``bool()`` of a
tensor, data-dependent sizes: ``nonzero``, boolean indexing, ``masked_select``; copies to the host: ``.cpu()``,
``.tolist()``, ``.numpy()``), with the package's branches on the device type taken as on CUDA.

* **training step**: fairseq's own ``Trainer.train_step`` (forward, backward, gradient norm, Adam) on a padded batch
  of 4 sentences, the second step of a fresh trainer (the first builds the optimizer); stock fairseq's
  ``transformer_wmt_en_de`` of the same size is measured the same way: its own syncs are the reference;
* **encoder pass**: the encoder's forward in evaluation (``model.eval()``, no gradient) on the 8 rows, as generation
  starts (randomised positions draw each sentence's own positions there);
* **decoding step**: one step of incremental decoding of 8 rows (a beam of 8), the decoder with its cached state
  at the 6th target position, after the encoder has run.

Targets: syncs per training step, encoder pass and decoding step at most stock's; operators per decoding step at most
1.15× the sinusoidal APE's, 1.5× for the encodings that compute the logits themselves (``OWN_LOGITS``: FoX, CoPE,
DAPE, ReRoPE).  The table says ✓/✗ per target; the exit status is 0 whatever the counts (it measures,
``tests/test_host_syncs.py`` judges), 2 for a usage error.
"""

import argparse
import logging
import os
import sys
import tempfile
import warnings

from fairseq_pe import systems as catalogue
from fairseq_pe.benchmark.runner import PLUGIN
from fairseq_pe.errors import cli

STOCK = "stock"
SYSTEMS = {name: flags for name, flags in catalogue.group("translation").items()
           if name not in ("floater-warm", "ape-sin+rpe-learned")}
SYSTEMS["floater-input"] = catalogue.flags("floater-input")
SYSTEMS.update((name, catalogue.flags(name)) for name in catalogue.ROTARY_2024)  # issue 43's rotary encodings
#: the encodings that compute the attention's logits themselves (issue 43's logits hook: FoX, CoPE, DAPE v1 and v2,
#: ReRoPE, an inference option of RoPE counted with a window of 3): their attention runs explicitly, never in one
#: fused kernel, and their terms are functions of the layer's data (gates, counts, a network over the logits) or of
#: two products of every key (ReRoPE), which no per-step table can hold
OWN_LOGITS = {**{name: catalogue.flags(name) for name in catalogue.DATA_DEPENDENT_2024 + ("alibi-dape2",)},
              "rope-rerope": catalogue.flags("rope") + ["--pe-rerope-window", "3", "--pe-rerope-train-length", "4"]}
SYSTEMS.update(OWN_LOGITS)
#: a 6+6-layer model (operators do not depend on the widths; small widths keep the count fast)
SIZE = ["--encoder-layers", "6", "--decoder-layers", "6", "--encoder-embed-dim", "64", "--decoder-embed-dim", "64",
        "--encoder-ffn-embed-dim", "128", "--decoder-ffn-embed-dim", "128", "--encoder-attention-heads", "4",
        "--decoder-attention-heads", "4"]
#: the reference of the operator count per decoding step, and the largest ratio to it
REFERENCE, OPS_RATIO = "ape-sinusoidal", 1.15
#: the largest ratio of the OWN_LOGITS encodings (their syncs are held to stock's like every other's)
OWN_LOGITS_RATIO = 1.5


def ops_ratio(name):
    """The largest operators per decoding step of system ``name``, as a ratio to the REFERENCE's."""
    return OWN_LOGITS_RATIO if name in OWN_LOGITS else OPS_RATIO
BEAM_ROWS, DECODING_STEP = 8, 5


def trainer_for(data, system, seed=1):
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    model = ["--arch", "transformer_wmt_en_de"] if system == STOCK else \
        ["--user-dir", PLUGIN, "--arch", "transformer_pe_wmt_en_de", *SYSTEMS[system]]
    argv = [data, "--task", "translation", "-s", "src", "-t", "tgt", "--cpu", *model, *SIZE, "--share-all-embeddings",
            "--optimizer", "adam", "--lr", "0.0005", "--criterion", "label_smoothed_cross_entropy",
            "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens", "4096", "--seed", str(seed)]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(seed)
    model = task.build_model(cfg.model)
    return Trainer(cfg, task, model, task.build_criterion(cfg.criterion)), task


def sample(dictionary, source_lengths, target_lengths):
    from fairseq_pe.synthetic import random_batch

    return random_batch(dictionary, source_lengths, target_lengths)


#: the counted passes, as the table names them
KINDS = {"train": "training step", "encode": "encoder pass (evaluation)", "decode": "decoding step"}


def count_system(data, system):
    """{"train": OpCount of a training step, "encode": of an encoder pass, "decode": of a decoding step}."""
    import torch

    from fairseq_pe.diagnostics.op_count import counting

    trainer, task = trainer_for(data, system)
    dictionary = task.source_dictionary
    batch = sample(dictionary, [14, 11, 9, 6], [12, 13, 7, 5])  # padded: source on the left, target on the right
    trainer.train_step([batch])
    with counting(trainer.model) as train:
        trainer.train_step([batch])
    model = trainer.model.eval()
    src = sample(dictionary, [12] * BEAM_ROWS, [3] * BEAM_ROWS)["net_input"]["src_tokens"]
    prev = torch.randint(dictionary.nspecial, len(dictionary), (BEAM_ROWS, DECODING_STEP + 1))
    prev[:, 0] = dictionary.eos()
    with torch.no_grad():
        with counting(model) as encode:
            encoder_out = model.encoder(src, src_lengths=torch.full((BEAM_ROWS,), 12))
        state = {}
        for t in range(DECODING_STEP):
            model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
        with counting(model) as decode:
            model.decoder(prev[:, :DECODING_STEP + 1], encoder_out=encoder_out, incremental_state=state)
    return {"train": train, "encode": encode, "decode": decode}


def dictionary_dir(root):
    from fairseq.data import Dictionary

    d = Dictionary()
    for i in range(50):
        d.add_symbol(f"w{i}")
    for lang in ("src", "tgt"):
        d.save(os.path.join(root, f"dict.{lang}.txt"))
    return root


def count(systems):
    """system -> {"train": OpCount, "decode": OpCount}, stock first."""
    import fairseq_pe  # noqa: F401  (the plugin and its fixes)

    logging.disable(logging.WARNING)
    warnings.filterwarnings("ignore")
    with tempfile.TemporaryDirectory() as root:
        data = dictionary_dir(root)
        return {name: count_system(data, name) for name in [STOCK] + [s for s in systems if s != STOCK]}


def table(counts):
    stock, reference = counts[STOCK], counts.get(REFERENCE)
    rows = ["| system | syncs / training step | syncs / encoder pass (evaluation) | syncs / decoding step | ops / "
            f"decoding step | ratio to {REFERENCE} | kernels (ops less views) / decoding step | ratio |",
            "|---|---|---|---|---|---|---|---|"]
    for name, c in counts.items():
        train, encode, decode = c["train"].syncs, c["encode"].syncs, c["decode"].syncs
        def ratio(kind):
            if reference is None:
                return "-"
            value = getattr(c["decode"], kind) / getattr(reference["decode"], kind)
            return f"{value:.2f}×" + ("" if name == STOCK else (" ✓" if value <= ops_ratio(name) else " ✗"))

        mark = (lambda n, s: "" if name == STOCK else (" ✓" if n <= s else " ✗"))
        rows.append(f"| {name} | {train}{mark(train, stock['train'].syncs)} | "
                    f"{encode}{mark(encode, stock['encode'].syncs)} | {decode}{mark(decode, stock['decode'].syncs)} | "
                    f"{c['decode'].total} | {ratio('total')} | {c['decode'].kernels} | {ratio('kernels')} |")
    return "\n".join(rows)


@cli
def main(argv=None):
    p = argparse.ArgumentParser(prog="fairseq-pe-count-ops", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS),
                   help="the encodings to count (default: all); stock is always counted")
    p.add_argument("--json", help="also write the counts (every operator) to this file")
    args = p.parse_args(argv)
    counts = count(args.systems)
    print(table(counts))
    if args.json:
        from fairseq_pe.outputs import write_json

        write_json(args.json, {name: {kind: {"syncs": c.syncs, "total": c.total, "kernels": c.kernels,
                                             "sync_ops": c.sync_ops(), "ops": dict(c.ops)} for kind, c in v.items()}
                               for name, v in counts.items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
