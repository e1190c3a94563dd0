"""The ``flex`` check: :func:`fairseq_pe.models.flex.flex_attention_forward` (the encoding's bias computed in
FlexAttention's kernel, padding and causality as a block mask) against the dense path (the bias merged into SDPA's
float mask) for ALiBi, T5, KERPLE-log and FIRE: outputs, the gradients of q, k, v and of the encoding's parameters
(:data:`FLEX_TOLERANCE`), and the peak memory and time of both at T = 4096 in fp16, FlexAttention's first call (its
compilation) apart.  Last, with the time the others leave.  On the CPU: the eager forward of the first of them on a
small shape (the CPU has no FlexAttention backward)."""

import time

from fairseq_pe import systems as catalogue
from fairseq_pe.benchmark.gpu_check.context import dtype_of
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed

#: the systems of the flex check, in order (their bias in FlexAttention's kernel: fixed, a learned table, learned
#: kernel parameters, an MLP), then the rest of the biased encodings
FLEX_SYSTEMS = ["alibi", "t5", "kerple-log", "fire", "kerple-power", "sandwich"]

#: the flex check's shape per device: batch, heads, length, head dimension, dtype; the CPU runs the forward only
#: (FlexAttention has no CPU backward), eager, where CI's rehearsal can afford it
FLEX_SHAPE = {"cuda": (2, 8, 4096, 64, "float16"), "cpu": (2, 4, 200, 32, "float32")}

#: the largest |flex − dense SDPA| of the outputs (real rows), and of a gradient relative to the dense one's largest
FLEX_TOLERANCE = {"float16": {"output": 1e-2, "gradient": 5e-2}, "float32": {"output": 1e-4, "gradient": 1e-3}}

#: how many systems the flex check takes, per device (each compiles its own kernels on CUDA: last in the run, so
#: that it takes only the time the other checks leave)
FLEX_SYSTEM_COUNT = {"cuda": 4, "cpu": 1}


def flex_systems(ctx):
    return ctx.systems(FLEX_SYSTEMS, FLEX_SYSTEM_COUNT[ctx.args.device])


def relative_of(system) -> str:
    flags = catalogue.flags(system)
    return flags[flags.index("--pe-relative") + 1]


def check_flex(ctx, system):
    """:func:`fairseq_pe.models.flex.flex_attention_forward` (the bias in FlexAttention's kernel, the masks as a
    block mask) against the dense path (the (B, H, T, S) bias merged into SDPA's float mask, as the fused path
    builds it): a causal attention with a right-padded row, the outputs of the real rows and, on CUDA, the
    gradients of q, k, v and of the encoding's parameters, and each path's peak memory and time (FlexAttention's
    first call, its compilation, apart).  On the CPU: the eager forward on a small shape (no backward there)."""
    import torch
    import torch.nn.functional as F
    from types import SimpleNamespace

    from fairseq_pe.models.attention import merged_mask
    from fairseq_pe.models.flex import flex_attention_forward, flex_supported
    from fairseq_pe.positional import build_position_encoding

    device = torch.device(ctx.device)
    batch, heads, length, dim, dtype_name = FLEX_SHAPE["cuda" if ctx.cuda else "cpu"]
    dtype, tolerance = dtype_of(dtype_name), FLEX_TOLERANCE[dtype_name]
    torch.manual_seed(0)
    enc = build_position_encoding("relative", relative_of(system), embed_dim=heads * dim, num_heads=heads,
                                  num_blocks=1, causal=True, args=SimpleNamespace()).to(device)
    with torch.no_grad():  # trained-looking parameters
        for p in enc.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    reason = flex_supported(enc, device.type)
    if ctx.cuda and reason is not None:
        raise CheckFailed([f"flex_supported: {reason}"])
    q, k, v = (torch.randn(batch, heads, length, dim, device=device, dtype=dtype) for _ in range(3))
    padding = torch.arange(length, device=device).view(1, -1) >= torch.tensor([[length], [length - 300]],
                                                                               device=device)
    real = ~padding.view(batch, 1, length, 1)
    future = torch.full((length, length), float("-inf"), device=device).triu(1)
    weights = torch.randn(batch, heads, length, dim, device=device, dtype=dtype) * real
    scale = dim ** -0.5
    params = [p for p in enc.parameters() if p.requires_grad]

    def dense():
        bias = enc.position_bias(length, length, 0, 1)
        mask = merged_mask(future, padding, bias, batch, length, length, dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)

    def flex(compiled):
        return flex_attention_forward(enc, None, 1, q, k, v, scale=scale, query_offset=0, causal=True,
                                      key_padding_mask=padding, dropout_p=0.0, compiled=compiled)

    def run(attention, backward):
        for t in [q, k, v] + params:
            t.grad = None
        if ctx.cuda:
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            before = torch.cuda.memory_allocated()
        started = time.monotonic()
        with torch.set_grad_enabled(backward):
            out = attention()
            if backward:
                (out.float() * weights).sum().backward()
        if ctx.cuda:
            torch.cuda.synchronize()
        seconds = time.monotonic() - started
        peak = (torch.cuda.max_memory_allocated() - before) / 2 ** 20 if ctx.cuda else None
        grads = [t.grad.float().clone() for t in [q, k, v] + params] if backward else []
        return out.detach().float(), grads, seconds, peak

    backward = ctx.cuda
    for t in (q, k, v):
        t.requires_grad_(backward)
    first = run(lambda: flex(ctx.cuda), backward)  # compiles (CUDA; on the CPU, dynamo traces the eager call once)
    got = run(lambda: flex(ctx.cuda), backward) if ctx.cuda else first
    want = run(dense, backward)
    out = {"shape": {"batch": batch, "heads": heads, "length": length, "head_dim": dim, "dtype": dtype_name},
           "backward": backward, "flex_first_call_s": round(first[2], 2), "flex_s": round(got[2], 3),
           "dense_s": round(want[2], 3), "flex_peak_mib": got[3], "dense_peak_mib": want[3],
           "tolerance": tolerance}
    problems = []
    error = (got[0] - want[0]).abs().masked_fill(~real, 0).max().item()
    out["output_error"] = error
    if not error <= tolerance["output"]:
        problems.append(f"{system}: |flex − dense| of the outputs {error:.3g} > {tolerance['output']}")
    names = ["q", "k", "v"] + [n for n, p in enc.named_parameters() if p.requires_grad]
    out["gradient_error"] = {}
    for name, g, w in zip(names, got[1], want[1]):
        relative = ((g - w).abs().max() / w.abs().max().clamp(min=1e-12)).item()
        out["gradient_error"][name] = relative
        if not relative <= tolerance["gradient"]:
            problems.append(f"{system}: gradient of {name} off by {relative:.3g} of its largest "
                            f"(> {tolerance['gradient']})")
    if problems:
        raise CheckFailed(problems, out)
    return out
