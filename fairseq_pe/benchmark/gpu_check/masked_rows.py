"""The ``masked-rows`` check: a query whose every key is masked (one sentence of the batch all padding: source,
target, and the first step of step-by-step decoding) gives 0 (the attention's output is ``out_proj``'s bias alone),
not NaN, and finite gradients, through :class:`fairseq_pe.models.attention.PositionAttention`, in every kernel and
path it reaches (torch's choice, and on CUDA each of memory-efficient and cuDNN forced), per dtype.  fairseq's own
path (stock's code, the cross-attention whose weights the decoder returns) is not the plugin's and is left out."""

import contextlib

from fairseq_pe.benchmark.gpu_check.context import dtype_of, padded_batch
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed, dedupe

#: the largest |output − out_proj.bias| of a query whose every key is masked (its attention is 0)
MASKED_ROW_TOLERANCE = 1e-6

#: the systems of the masked-rows check: one per path (no bias, a fixed bias, a learned bias, Shaw's blockwise
#: path), KERPLE-power, whose bias passes fp16's range, and the logits hook's (issue 43: FoX's gates, CoPE's counts,
#: DAPE's network over the logits)
MASKED_SYSTEMS = ["ape-sinusoidal", "alibi", "t5", "rpe-learned", "kerple-power", "fox", "cope", "kerple-log-dape"]


def backend_choices(ctx):
    """(name, the sdpa_kernel backends or None for torch's own choice): torch's choice, and on CUDA each kernel
    that takes a mask, forced."""
    from torch.nn.attention import SDPBackend

    choices = [("torch's choice", None)]
    if ctx.cuda:
        choices += [("memory-efficient forced", [SDPBackend.EFFICIENT_ATTENTION]),
                    ("cuDNN forced", [SDPBackend.CUDNN_ATTENTION])]
    return choices


@contextlib.contextmanager
def watching(model):
    """Records (role, path, kernel, module, output) of every PositionAttention call of ``model``."""
    from fairseq_pe.models.attention import PositionAttention
    from fairseq_pe.diagnostics.attention_calls import recording

    seen, hooks = [], []
    modules = [m for m in model.modules() if isinstance(m, PositionAttention)]
    with recording(model) as calls:
        for m in modules:
            hooks.append(m.register_forward_hook(lambda mod, inputs, output: seen.append((mod, output[0]))))
        try:
            yield calls, seen
        finally:
            for h in hooks:
                h.remove()


def masked_row_problems(calls, seen, row, label):
    """Problems of the calls' outputs at batch row ``row`` (every key masked for its self-attention) and at the
    others (finite), and the kernels it went through."""
    problems, kernels = [], set()
    if len(calls) != len(seen):
        return [f"{label}: {len(calls)} attention calls recorded, {len(seen)} outputs"], kernels
    for call, (module, output) in zip(calls, seen):
        if call.path == "fairseq":
            continue  # fairseq's own code (stock's), not the plugin's
        kernel = call.path if call.path != "fused" else f"fused:{call.backend}"
        if not bool(output.isfinite().all()):
            problems.append(f"{label} {call.role} ({kernel}): non-finite output")
            continue
        if call.role == "cross":
            continue
        kernels.add(kernel)
        got = output[:, row].float()
        bias = module.out_proj.bias.float() if module.out_proj.bias is not None else torch_zeros_like(got)
        diff = float((got - bias).abs().max())
        if diff > MASKED_ROW_TOLERANCE:
            problems.append(f"{label} {call.role} ({kernel}): a query whose every key is masked gives attention "
                            f"{diff:.3g} from 0")
    return problems, kernels


def torch_zeros_like(x):
    import torch

    return torch.zeros_like(x)


def check_masked_rows(ctx, system):
    """One sentence of a padded batch all padding (its source for the encoder, its target for the decoder, its
    first decoding step): its self-attention queries see no key.  In training (with backward: the gradients stay
    finite) and evaluation, per dtype and kernel choice."""
    import torch
    from torch.nn.attention import sdpa_kernel

    task, reference = ctx.build(system)
    d = task.target_dictionary
    sample = padded_batch(d, ctx.device, [9, 7, 5], [8, 6, 4])
    net = sample["net_input"]
    empty_src = net["src_tokens"].clone()
    empty_src[-1] = d.pad()  # the shortest source, all padding
    src_lengths = net["src_lengths"].clone()
    src_lengths[-1] = 0
    empty_tgt = net["prev_output_tokens"].clone()
    empty_tgt[-1] = d.pad()  # the shortest target, all padding
    row = empty_src.size(0) - 1
    problems, out = [], {}
    relative = getattr(reference.decoder.layers[0].self_attn, "uses_relative", False)
    for dtype in ctx.half_dtypes:
        model = reference.to(device=ctx.device, dtype=dtype_of(dtype))
        for choice, backends in backend_choices(ctx):
            label = f"{dtype}, {choice}"
            kernels = set()
            try:
                with sdpa_kernel(backends) if backends else contextlib.nullcontext():
                    for mode in ("train", "eval"):
                        model.train(mode == "train")
                        with torch.set_grad_enabled(mode == "train"):
                            with watching(model) as (calls, seen):
                                empty = model.encoder(empty_src, src_lengths=src_lengths)["encoder_out"][0]
                            found, k = masked_row_problems(calls, seen, row, f"{label}, {mode}, empty source")
                            problems += found
                            kernels |= k
                            enc = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
                            with watching(model) as (calls, seen):
                                x, _ = model.decoder(empty_tgt, encoder_out=enc)
                            found, k = masked_row_problems(calls, seen, row, f"{label}, {mode}, empty target")
                            problems += found
                            kernels |= k
                            if mode == "train":  # both passes' rows, the masked ones included
                                (x.float().sum() + empty.float().sum()).backward()
                                bad = [n for n, p in model.named_parameters()
                                       if p.grad is not None and not bool(p.grad.isfinite().all())]
                                if bad:
                                    problems.append(f"{label}: non-finite gradients ({', '.join(bad[:3])})")
                                model.zero_grad(set_to_none=True)
                    if relative:  # the first decoding step (the explicit path; APEs take fairseq's own there)
                        model.eval()
                        with torch.no_grad(), watching(model) as (calls, seen):
                            model.decoder(empty_tgt[:, :1], encoder_out=enc, incremental_state={})
                        found, k = masked_row_problems(calls, seen, row, f"{label}, decoding step")
                        problems += found
                        kernels |= k
            except RuntimeError as e:
                if backends:  # a kernel forced that torch would not choose for some call: recorded, not a failure
                    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
                    out[label] = ("no such kernel for these arguments" if "No available kernel" in first
                                  or "No viable backend" in first else f"not run: {first[:200]}")
                    continue
                raise
            out[label] = sorted(kernels)
    if problems:
        raise CheckFailed(dedupe(problems), out)
    return out
