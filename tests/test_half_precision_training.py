"""Half precision against float32 where positions matter, for every encoding (issue 39, 2; issue 30, 4).

A comparison of training losses cannot see a wrong position: removing ALiBi entirely moves the tiny model's loss by
0.08 %, within what fp16 and bf16 move it.  The checks here compare what positions change
(:mod:`fairseq_pe.diagnostics.precision`):

* ``test_half_precision_sees_positions``: on a padded batch (source padded left, target right, as fairseq batches
  them) the per-token log-probabilities of the fp16 and bf16 model against the same weights in float32, and the
  gradients of every position parameter (found from the registry: learned tables, learnable frequencies, T5, KERPLE,
  FIRE, relative vectors, FLOATER's initial values and dynamics ...); then, through fairseq's own trainer and
  optimizers (``FP16Optimizer`` for ``--fp16``, its bf16 form, ``MemoryEfficientFP16Optimizer``), one update in each
  precision from the same weights, seed and batch, and the gradient each optimizer applied to each position
  parameter against float32's.  The tolerances (:data:`~fairseq_pe.diagnostics.precision.DEFAULT_TOLERANCES`,
  :data:`TRAINER_TOLERANCE`) are set from the measured noise with margin, and the batch is one where the encoding
  matters: removing it moves the log-probs by ``margin`` (1.5) tolerances or more, or it has parameters (removing it
  takes their whole gradient).  Measured on this model and batch, CPU (Δlp: max |Δ log p| against the same weights
  in float32; Δg: the worst ‖Δg‖ / ‖g of the encoding‖; "removed": the float32 model without its positions; the
  trainer's Δg against float32's update; tolerances 0.02 / 0.08 (Δlp) and 0.1 / 0.35 (Δg) for fp16 / bf16, 0.1 / 0.4
  through the trainer)::

      encoding                  fp16 Δlp  bf16 Δlp  Δlp removed  fp16 Δg  bf16 Δg  trainer Δg fp16/bf16/mem-eff
      none                      0.0023    0.020     0            -        -        -
      ape-learned               0.0027    0.022     1.2          0.0011   0.024    0.0015 / 0.029 / 0.0016
      ape-sinusoidal            0.0026    0.030     3.3          -        -        -
      ape-learnable-sinusoidal  0.0029    0.022     4.5          0.00097  0.012    0.012 / 0.014 / 0.012
      rpe-learned               0.0026    0.022     1.5          0.0014   0.0092   0.0015 / 0.027 / 0.0017
      rpe-sinusoidal            0.0023    0.018     1.7          -        -        -
      rpe-learnable-sinusoidal  0.0024    0.017     1.4          0.0037   0.030    0.003 / 0.033 / 0.003
      rope                      0.0029    0.018     0.55         -        -        -
      xpos                      0.0024    0.020     0.55         -        -        -
      alibi                     0.0025    0.019     0.28         -        -        -
      t5                        0.0026    0.023     0.28         0.0019   0.022    0.0011 / 0.023 / 0.0011
      kerple-log                0.0020    0.023     0.51         0.0038   0.014    0.0024 / 0.0065 / 0.0024
      kerple-power              0.0022    0.021     1.1          0.00098  0.034    0.003 / 0.03 / 0.003
      sandwich (dim: model)     0.0019    0.019     0.21         -        -        -
      fire                      0.0022    0.033     0.022        0.008    0.039    0.0046 / 0.06 / 0.0046
      floater                   0.0025    0.017     2.0          0.00055  0.0047   0.00072 / 0.014 / 0.00072
      floater-all-blocks        0.0025    0.017     2.0          0.00055  0.0047   0.00072 / 0.014 / 0.00072
      floater-bias              0.0026    0.021     3.0          0.00081  0.016    0.0011 / 0.02 / 0.0011
      ape-sinusoidal-random     0.0028    0.022     2.6          -        -        -
      rpe-learned-random        0.0032    0.018     1.6          0.0016   0.0088   0.0013 / 0.022 / 0.0014
      rope-random               0.0024    0.019     0.58         -        -        -
      xpos-random               0.0025    0.018     0.58         -        -        -
      alibi-random              0.0024    0.017     0.42         -        -        -
      t5-random                 0.0033    0.019     0.29         0.0071   0.0091   0.0061 / 0.017 / 0.0061
      kerple-power-random       0.0028    0.024     1.2          0.00032  0.004    0.00082 / 0.0052 / 0.00082
      sandwich-random           0.0027    0.016     0.22         -        -        -
      fire-random               0.0025    0.024     0.058        0.031    0.066    0.0097 / 0.021 / 0.0097

  ``python tests/test_half_precision_training.py [NAME ...]`` prints this table (with the effects of permuting the
  source).  With every encoding removed from the half-precision model only, the check fails for each of them (the
  log-probs in fp16 and bf16; FIRE's in bf16 by its parameters' gradients), and passes for ``none``.
* ``test_a_wrong_position_fails``: the same check with a fault in the half-precision model only (ALiBi's or T5's
  bias zero, the learned APE read one position off, every encoding removed) fails, naming the encoding and what
  deviates.  The checks above pass for the code as it is, and fail for a missing or wrong bias.
* ``test_half_precision_trains_long_sentences``: only a NaN and skipped-step check: each precision trains 3 updates
  on batches up to 1,100 tokens (a learned table holds 1,024 positions; FLOATER's bounded positions up to 300, its
  ODE solve costs time with every position) and, for the encodings that take positions, positions up to 8,191
  through ``--pe-random-positions 8192``; every update must happen (no step skipped for an overflow, the loss scale
  never lowered), every loss and parameter be finite.  Its losses are not compared with float32's: at the noise of
  half precision such a comparison cannot tell a missing encoding from a present one.

The CPU stands in for the GPU (``fairseq-pe-gpu-check`` runs the same probe on CUDA): torch's CPU fp16 and bf16
matrix products accumulate in float32, so the noise there is that of the stored values.
"""

import contextlib
import math

import pytest
import torch

from fairseq_pe.diagnostics.precision import (DEFAULT_TOLERANCES, compare_precisions, gradient_deviations,
                                               position_owners, position_parameters, positions_removed,
                                               positions_shifted)
from fairseq_pe import systems as catalogue
from helpers import ALL_ENCODINGS, PRECISION_FLAGS, RANDOMISABLE, optimizer_gradients
from training import TINY, batch, build_trainers, dictionary_dir

ENCODINGS = {**ALL_ENCODINGS, **{f"{name}-random": flags + ["--pe-random-positions", "8192"]
                                for name, flags in ALL_ENCODINGS.items() if name in RANDOMISABLE}}
HALF = ["fp16", "bf16", "memory-efficient-fp16"]
#: the starting loss scale of --fp16 (fairseq's default, 128, overflows on a batch of 1,100 tokens in the layer
#: norms' gradients whatever the encoding; the dynamic scaler would lower it, which here counts as a skipped step)
INIT_SCALE = "8"

#: the probe's model: TINY with 4 heads of 4 dimensions (ALiBi's slopes 2^-2 .. 2^-8: with 2 heads they are 2^-4 and
#: 2^-8, and removing ALiBi moves the log-probs by 0.17, too close to bf16's noise); Sandwich over the model's
#: 16 dimensions (over a head's 4 its two frequencies, 10^-2 and 10^-4, make no difference within 40 tokens)
PROBE = ["--encoder-attention-heads", "4", "--decoder-attention-heads", "4"]
PROBE_EXTRA = {"sandwich": ["--pe-sandwich-dim", "model"]}
#: the probe's batch: sources of 40, 25 and 9 tokens (left-padded), targets of 30, 18 and 6 (right-padded)
SOURCE_LENGTHS, TARGET_LENGTHS = [40, 25, 9], [30, 18, 6]
#: ‖Δg‖ / ‖g of the encoding‖ of the gradient fairseq's optimizer applies after one update, against float32 with the
#: unrounded weights (measured at most 1.2e-2 in fp16 and memory-efficient fp16, 6e-2 in bf16; a removed encoding
#: gives 1)
TRAINER_TOLERANCE = {"fp16": 0.1, "memory-efficient-fp16": 0.1, "bf16": 0.4}


def probe_flags(name):
    base = name[:-len("-random")] if name.endswith("-random") else name
    return [*TINY, *PROBE, *ENCODINGS[name], *PROBE_EXTRA.get(base, [])]


def trainer_gradients(trainer, sample, names, fault=None):
    """One update of ``trainer`` on ``sample``: the gradient its optimizer applied to each named position parameter;
    asserts the update happened and left everything finite (``fault``: a context around the update)."""
    with (fault(trainer.model) if fault is not None else contextlib.nullcontext()):
        log = trainer.train_step([sample])
    assert log is not None and trainer.get_num_updates() == 1, "the update was skipped"
    assert math.isfinite(log["loss"]), log
    named = dict(trainer.model.named_parameters())
    grads = optimizer_gradients(trainer.optimizer, [named[n] for n in names])
    return {n: (torch.zeros_like(named[n], dtype=torch.float32) if g is None else g) for n, g in zip(names, grads)}


def precision_problems(name, data, fault=None, trainer_fault=None):
    """Everything that deviates for encoding ``name``: the probe's failures (fp16, bf16; ``fault`` in the half model
    only) and the trainer's gradients beyond :data:`TRAINER_TOLERANCE` (``trainer_fault`` in the half trainers only);
    also the probe's reports and the trainer's worst gradient deviation in each precision."""
    trainers = build_trainers(data, {precision: [*PRECISION_FLAGS[precision], "--fp16-init-scale", INIT_SCALE]
                                     for precision in ["fp32"] + HALF}, *probe_flags(name))
    reference = trainers["fp32"]
    model = reference.model
    sample = batch(reference.task.source_dictionary, SOURCE_LENGTHS, TARGET_LENGTHS, seed=3)
    reports = compare_precisions(model, sample, ["fp16", "bf16"], fault=fault)
    problems = [p for report in reports.values() for p in report.failures(DEFAULT_TOLERANCES[report.precision])]
    owners = position_owners(model)
    names = list(position_parameters(model))
    expected = trainer_gradients(reference, sample, names)
    worst = {}
    for precision in HALF:
        deviations = gradient_deviations(trainer_gradients(trainers[precision], sample, names, trainer_fault),
                                         expected, owners)
        worst[precision] = max(deviations.values(), default=None)
        for parameter, deviation in deviations.items():
            if not deviation <= TRAINER_TOLERANCE[precision]:
                problems.append(f"{precision} {reports['fp16'].encoding} through fairseq's optimizer: the gradient of "
                                f"{parameter} deviates from float32's by {deviation:.3g} > "
                                f"{TRAINER_TOLERANCE[precision]}")
    return problems, reports, worst


#: the encodings with trainable position parameters: the catalogue's System.trainable (the registry must find each;
#: the others have none)
PARAMETERISED = {name for name in ALL_ENCODINGS if catalogue.get(name).trainable}


@pytest.mark.parametrize("name", list(ENCODINGS))
def test_half_precision_sees_positions(name, tmp_path, cpu_fp16_optimizer):
    problems, reports, _ = precision_problems(name, dictionary_dir(tmp_path))
    assert problems == [], "\n".join(problems)
    has_parameters = any(report.gradient_deviations for report in reports.values())
    assert has_parameters == (name.split("-random")[0] in PARAMETERISED), name  # the registry finds them all


@contextlib.contextmanager
def zero_bias(model):
    """A fault: the relative encoding's bias of ``model``'s encoder and decoder is zero (this instance only; times 0,
    so that a learned bias keeps its graph and gets a zero gradient, as the layers' recomputation expects)."""
    patched = []
    for side in (model.encoder, model.decoder):
        relative = side.embed_positions.relative
        original = relative.position_bias
        relative.position_bias = (lambda *a, _f=original, **k: _f(*a, **k) * 0.0)
        patched.append(relative)
    try:
        yield
    finally:
        for relative in patched:
            del relative.position_bias


@pytest.mark.parametrize("name, fault, trainer_fault, expected", [
    # ALiBi has no parameter: only the log-probs can show it (0.28 removed against a tolerance of 0.02 / 0.08)
    ("alibi", zero_bias, None, ["fp16 relative alibi: log-probs deviate", "bf16 relative alibi: log-probs deviate"]),
    # T5's bias zero: its table gets no gradient (deviation 1), in the probe and through fairseq's optimizers
    ("t5", zero_bias, zero_bias, ["bf16 relative t5: the gradient of encoder.embed_positions.relative.bias",
                                  "memory-efficient-fp16 relative t5 through fairseq's optimizer: the gradient of "
                                  "decoder.embed_positions.relative.bias"]),
    # a wrong position: every token reads the learned vector of the next position
    ("ape-learned", positions_shifted, positions_shifted, ["fp16 absolute learned: log-probs deviate",
                                                           "fp16 absolute learned: the gradient of encoder.embed_"
                                                           "positions.absolute.weight"]),
    # FIRE's bias moves the log-probs by 0.022 only (bf16's tolerance: 0.08): its parameters' gradients show it missing
    ("fire", positions_removed, None, ["bf16 relative fire: the gradient of decoder.embed_positions.relative.w2"]),
])
def test_a_wrong_position_fails(name, fault, trainer_fault, expected, tmp_path, cpu_fp16_optimizer):
    problems, _, _ = precision_problems(name, dictionary_dir(tmp_path), fault=fault, trainer_fault=trainer_fault)
    for fragment in expected:
        assert any(p.startswith(fragment) for p in problems), (fragment, problems)
    if trainer_fault is None:
        assert not any("through fairseq's optimizer" in p for p in problems), problems  # the fault is the probe's


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
def test_half_precision_trains_long_sentences(name, tmp_path, cpu_fp16_optimizer):
    trainers = build_trainers(dictionary_dir(tmp_path), {precision: PRECISION_FLAGS[precision] for precision in HALF},
                              *TINY, *ENCODINGS[name], "--fp16-init-scale", INIT_SCALE)
    for precision, trainer in trainers.items():
        model = trainer.model
        limit = min(model.max_positions())
        dictionary = trainer.task.source_dictionary
        batches = [batch(dictionary, s, t, seed=i) for i, (s, t) in enumerate(lengths(name, limit))]
        for b in batches:
            log = trainer.train_step([b])
            assert log is not None, (name, precision)
            assert math.isfinite(log["loss"]), (name, precision, log)
        assert trainer.get_num_updates() == len(batches), (name, precision, "a step was skipped")
        if precision in ("fp16", "memory-efficient-fp16"):
            assert trainer.optimizer.scaler.loss_scale >= float(INIT_SCALE), (name, precision,
                                                                              "the loss scale was lowered")
        assert all(torch.isfinite(p).all() for p in model.parameters()), (name, precision)


if __name__ == "__main__":  # the measured table: python tests/test_half_precision_training.py [NAME ...]
    import sys
    import tempfile
    from unittest import mock

    def number(value):
        return "-" if value is None else f"{value:.2g}"

    with tempfile.TemporaryDirectory() as tmp, mock.patch.object(torch.cuda, "current_device", lambda: None):
        print("| encoding | fp16 Δlp | bf16 Δlp | Δlp removed | Δlp source permuted | fp16 Δg | bf16 Δg | "
              "Δg source permuted | trainer Δg fp16 / bf16 / mem-eff fp16 | problems |")
        print("|---|---|---|---|---|---|---|---|---|---|")
        for name in sys.argv[1:] or ENCODINGS:
            problems, reports, trainer = precision_problems(name, dictionary_dir(tmp))
            f, b = reports["fp16"], reports["bf16"]
            print(f"| {name} | {number(f.logprob_deviation)} | {number(b.logprob_deviation)} | "
                  f"{number(f.logprob_effect_removed)} | {number(f.logprob_effect_permuted)} | "
                  f"{number(max(f.gradient_deviations.values(), default=None))} | "
                  f"{number(max(b.gradient_deviations.values(), default=None))} | "
                  f"{number(max(f.gradient_effects.values(), default=None))} | "
                  f"{' / '.join(number(trainer[p]) for p in HALF)} | {len(problems)} |", flush=True)
