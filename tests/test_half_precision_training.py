"""Half-precision training of every encoding through fairseq's own trainer and optimizers (issue 30, 4).

Each encoding trains 3 updates with ``--fp16`` (fairseq's FP16Optimizer: fp16 weights, a flat float32 master copy,
dynamic loss scaling), ``--bf16`` (its bf16 form: per-parameter masters, no loss scaling) and
``--memory-efficient-fp16`` (MemoryEfficientFP16Optimizer: no master copy), on batches of mixed lengths with the
source padded on the left and the target on the right, as fairseq batches them.  Every update must happen (no step
skipped for an overflow, the loss scale never lowered), every loss be finite and within a stated tolerance of the
same training in float32 (the same initial weights, batches and seeds).

Lengths: real sentences up to 1,100 tokens where the encoding allows them (a learned table holds 1,024 positions;
FLOATER's bounded positions are checked up to 300, its ODE solve costs time with every position), and, for the encodings that take positions, positions up to 8,191 through ``--pe-random-positions 8192`` (shorter
sentences whose positions are drawn from [0, 8192): every distance, angle, scale and bias of an 8,192-token sentence
can occur).  A literal 8,192-token batch costs about 20 s per update and precision on this CPU (measured: ALiBi,
1+1 layers, 16 dimensions, fp16), which the suite cannot afford for every encoding; what depends on the length is
the positions, which the random draws reach.  The CPU stands in for the GPU: ``scripts/gpu_check.py`` runs the same
precisions through ``fairseq-train`` on CUDA.
"""

import math

import pytest
import torch

from helpers import ALL_ENCODINGS, PRECISION_FLAGS, RANDOMISABLE
from training import TINY, batch, build_trainer, dictionary_dir

ENCODINGS = {**ALL_ENCODINGS, **{f"{name}-random": flags + ["--pe-random-positions", "8192"]
                                for name, flags in ALL_ENCODINGS.items() if name in RANDOMISABLE}}
HALF = ["fp16", "bf16", "memory-efficient-fp16"]
#: |loss − float32's loss| / float32's loss, per update (bf16 keeps 8 bits of mantissa, fp16 11)
TOLERANCE = {"fp16": 0.01, "memory-efficient-fp16": 0.01, "bf16": 0.03}
#: the starting loss scale of --fp16 (fairseq's default, 128, overflows on a batch of 1,100 tokens in the layer
#: norms' gradients whatever the encoding; the dynamic scaler would lower it, which here counts as a skipped step)
INIT_SCALE = "8"
UPDATES = 3


def lengths(name, limit):
    """Source and target lengths of the 3 batches: one long sentence (1,100 tokens, or what the model allows),
    padded partners, and a batch of short ones."""
    if name.endswith("-random"):
        long_source, long_target = 300, 200  # positions up to 8,191 all the same
    elif name.startswith("floater"):
        long_source, long_target = 300, 200  # bounded positions (h = B·tanh(h̃/B)); its solve grows with the length
    else:
        long_source, long_target = min(1100, limit), min(400, limit)
    return [([long_source, 41, 6], [long_target, 23, 5]), ([57, 12], [49, 30]), ([9, 3, 5, 8], [7, 11, 2, 6])]


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_half_precision_trains_as_float32(name, tmp_path, cpu_fp16_optimizer):
    data = dictionary_dir(tmp_path)
    losses = {}
    for precision in ["fp32"] + HALF:
        trainer = build_trainer(data, *TINY, *ENCODINGS[name], *PRECISION_FLAGS[precision],
                                "--fp16-init-scale", INIT_SCALE)
        model = trainer.model
        limit = min(model.max_positions())
        dictionary = trainer.task.source_dictionary
        batches = [batch(dictionary, s, t, seed=i) for i, (s, t) in enumerate(lengths(name, limit))]
        run = []
        for b in batches:
            log = trainer.train_step([b])
            assert log is not None, (name, precision)
            run.append(log["loss"])
        assert trainer.get_num_updates() == len(batches), (name, precision, "a step was skipped")
        scaler = getattr(trainer.optimizer, "scaler", None)
        if precision in ("fp16", "memory-efficient-fp16"):
            assert scaler.loss_scale >= float(INIT_SCALE), (name, precision, "the loss scale was lowered")
        assert all(math.isfinite(x) for x in run), (name, precision, run)
        assert all(torch.isfinite(p).all() for p in model.parameters()), (name, precision)
        losses[precision] = run
    for precision in HALF:
        for step, (got, expected) in enumerate(zip(losses[precision], losses["fp32"])):
            assert abs(got - expected) <= TOLERANCE[precision] * expected, (name, precision, step, losses)
