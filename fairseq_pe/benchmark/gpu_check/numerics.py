"""What the device computes, against a reference:

* ``forward``: the model's log-probabilities on a padded batch on the device in each dtype against the same weights in
  float32 on the CPU (largest absolute difference over the real target tokens, :data:`FORWARD_TOLERANCE`);
* ``incremental``: step-by-step decoding (fairseq's incremental state) against one full decoder pass, on the device,
  in each dtype, on a padded batch and an unpadded one (whose full pass takes ``is_causal``)
  (:data:`INCREMENTAL_TOLERANCE`);
* ``positions``: what half precision changes in what positions change (:mod:`fairseq_pe.diagnostics.precision`): on a
  padded batch, the per-token log-probabilities and the position parameters' gradients in fp16 and bf16 against the
  same weights in float32, within tolerances at which a missing or wrong bias fails.
"""

import math

from fairseq_pe.benchmark.gpu_check.context import dtype_of, lengths, padded_batch
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed

#: the largest absolute difference of log-probabilities from the CPU's float32 forward
FORWARD_TOLERANCE = {"float32": 2e-4, "float16": 5e-2, "bfloat16": 2.5e-1}

#: the largest absolute difference of log-probabilities between step-by-step decoding and the full pass
INCREMENTAL_TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 2.5e-1}


def log_probs(model, sample):
    import torch

    with torch.no_grad():
        out = model(**sample["net_input"])
        return model.get_normalized_probs(out, log_probs=True).float()


def check_forward(ctx, system):
    """Largest |log p_device,dtype − log p_cpu,float32| over the real target tokens, per dtype."""
    import copy

    import torch

    task, reference = ctx.build(system)
    reference.eval()
    sample = padded_batch(task.target_dictionary, "cpu", *lengths(ctx))
    expected = log_probs(reference, sample)
    real = sample["target"].ne(task.target_dictionary.pad())
    out, problems = {}, []
    for dtype in ctx.dtypes:
        model = copy.deepcopy(reference).to(device=ctx.device, dtype=dtype_of(dtype))
        got = log_probs(model, padded_batch(task.target_dictionary, ctx.device, *lengths(ctx))).cpu()
        finite = bool(torch.isfinite(got[real]).all())
        diff = float((got - expected).abs()[real].max()) if finite else math.inf
        out[dtype] = {"max_abs_diff": diff, "tolerance": FORWARD_TOLERANCE[dtype]}
        if not diff <= FORWARD_TOLERANCE[dtype]:
            problems.append(f"{dtype}: log-probabilities {diff:.3g} from the CPU's float32 (tolerance "
                            f"{FORWARD_TOLERANCE[dtype]})")
    if problems:
        raise CheckFailed(problems, out)
    return out


def check_incremental(ctx, system):
    """Largest |log p_step − log p_full| of step-by-step decoding against one decoder pass, per dtype, on a padded
    batch and an unpadded one (the decoder's full pass then takes ``is_causal``)."""
    import torch

    task, model = ctx.build(system)
    model.eval()
    d = task.target_dictionary
    source, target = lengths(ctx, incremental=True)
    batches = {"padded": padded_batch(d, ctx.device, source, target),
               "unpadded": padded_batch(d, ctx.device, [source[1]] * 3, [target[1]] * 3)}
    out, problems = {}, []
    for dtype in ctx.dtypes:
        model = model.to(device=ctx.device, dtype=dtype_of(dtype))
        for name, sample in batches.items():
            net = sample["net_input"]
            with torch.no_grad():
                encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
                prev = net["prev_output_tokens"]
                full = model.decoder(prev, encoder_out=encoder_out)
                full = model.get_normalized_probs(full, log_probs=True).float()
                state, diff = {}, 0.0
                for t in range(prev.size(1)):
                    step = model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
                    step = model.get_normalized_probs(step, log_probs=True).float()[:, -1]
                    real = prev[:, t].ne(d.pad())
                    diff = max(diff, float((step - full[:, t]).abs()[real].max()))
            out[f"{dtype}/{name}"] = {"max_abs_diff": diff, "tolerance": INCREMENTAL_TOLERANCE[dtype]}
            if not diff <= INCREMENTAL_TOLERANCE[dtype]:
                problems.append(f"{dtype} {name}: step-by-step decoding {diff:.3g} from the full pass (tolerance "
                                f"{INCREMENTAL_TOLERANCE[dtype]})")
    if problems:
        raise CheckFailed(problems, out)
    return out


def check_positions(ctx, system):
    """What half precision changes in what positions change (:mod:`fairseq_pe.diagnostics.precision`): on a padded
    batch, per-token log-probabilities and the gradients of the position parameters in fp16 and bf16 against the
    same weights in float32 on the device, within :data:`~fairseq_pe.diagnostics.precision.DEFAULT_TOLERANCES`,
    at which a missing or wrong bias fails (measured on the CPU: tests/test_half_precision_training.py).  A batch on
    which the probe cannot see the encoding missing (removing it moves the log-probs by less than the margin and it
    has no parameters: a weak bias at initialisation) is reported as ``insensitive`` in the details, not failed."""
    from fairseq_pe.diagnostics.precision import DEFAULT_TOLERANCES, compare_precisions

    task, model = ctx.build(system)
    sample = padded_batch(task.target_dictionary, "cpu", *lengths(ctx))
    precisions = ["fp16", "bf16"]
    reports = compare_precisions(model, sample, precisions, device=ctx.device)
    out, problems = {}, []
    for precision, report in reports.items():
        tolerance = DEFAULT_TOLERANCES[precision]
        row = report.row()
        row["tolerance"] = {"logprob": tolerance.logprob, "gradient": tolerance.gradient}
        found = report.failures(tolerance)
        row["insensitive"] = [p for p in found if "cannot show a missing encoding" in p]
        problems += [p for p in found if p not in row["insensitive"]]
        out[precision] = row
    if problems:
        raise CheckFailed(problems, out)
    return out
