"""The ``kernels`` check: every attention (encoder self-attention, decoder self-attention, cross-attention), padded
and unpadded, in training and evaluation, hands torch's ``scaled_dot_product_attention`` the arguments of the table of
docs/speed.md ("Which kernel each attention reaches": the CUDA table on CUDA, the CPU table on the CPU), and the kernel
torch picks for them is the one :func:`allowed_backends` states.  On CUDA (compute capability 8.0 or newer, fp16 and
bf16): no mask (unpadded self-attention without a bias, the unpadded cross-attention) and the causal decoder
(``is_causal``): FlashAttention or cuDNN; a float mask (padding, a fixed bias): memory-efficient or cuDNN; a mask with
a gradient (a learned bias in training): memory-efficient.  Never the math kernel.  On the CPU (float32): torch's
fused CPU kernel (``FLASH_ATTENTION``) for every call on the fused path, and the blockwise and explicit paths where
the CPU table says so."""

import os

from fairseq_pe.benchmark import sdpa_arguments
from fairseq_pe.benchmark.gpu_check.context import dtype_of, lengths, padded_batch
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed, dedupe
from fairseq_pe.benchmark.runner import REPO


def allowed_backends(code: str, cuda: bool):
    """The SDPA kernels a call with these arguments (an ``attention_calls.argument_code``) must reach: on CUDA
    (compute capability 8.0 or newer, fp16/bf16) FlashAttention or cuDNN without a mask (``none``, ``causal``),
    memory-efficient or cuDNN with a float mask, memory-efficient with a mask that carries a gradient (the kernel
    that returns it); on the CPU torch's fused CPU kernel (named FLASH_ATTENTION) for every call.

    These follow torch's selection (``sdp_utils.cpp``, ``select_sdp_backend``: FlashAttention, Dao et al. 2022,
    takes no ``attn_mask``; the memory-efficient kernel, Rabe & Staats 2021 as in xFormers, takes a float mask and
    returns its gradient; cuDNN's takes either where torch prefers it; math is the fallback that materialises the
    probabilities, which the plugin's fused path exists to avoid)."""
    if not cuda:
        return {"FLASH_ATTENTION"}
    if code in ("none", "causal"):
        return {"FLASH_ATTENTION", "CUDNN_ATTENTION"}
    if code.endswith("∇"):
        return {"EFFICIENT_ATTENTION"}
    return {"EFFICIENT_ATTENTION", "CUDNN_ATTENTION"}


def expected_arguments(cuda: bool) -> dict:
    """system -> the cells of docs/speed.md's table (CUDA's or the CPU's), one per setting of
    ``sdpa_arguments.SETTINGS``."""
    with open(os.path.join(REPO, "docs", "speed.md"), encoding="utf-8") as f:
        return sdpa_arguments.parse_table(f.read(), cuda)


def check_kernels(ctx, system):
    """Per dtype, batch (padded, unpadded) and mode (train, eval): each role's arguments against docs/speed.md's
    table and each fused call's kernel against :func:`allowed_backends`; on CUDA, the attention kernels the profiler
    saw in one training step (recorded, for the report)."""
    import torch

    from fairseq_pe.diagnostics.attention_calls import argument_code, argument_summary, recording

    expected = expected_arguments(ctx.cuda).get(system)
    problems, out = [], {}
    if expected is None:
        problems.append(f"docs/speed.md's {'CUDA' if ctx.cuda else 'CPU'} kernel table has no row for {system}")
    if ctx.cuda:
        major, minor = torch.cuda.get_device_capability(0)
        out["capability"] = f"{major}.{minor}"
        if major < 8:
            out["note"] = f"compute capability {major}.{minor}: the kernels are recorded, not asserted (sm_80+)"
    asserted = not ctx.cuda or out.get("note") is None
    task, reference = ctx.build(system)
    dictionary = task.target_dictionary
    batches = {"padded": padded_batch(dictionary, ctx.device, *lengths(ctx)),
               "unpadded": padded_batch(dictionary, ctx.device, [24, 24, 24], [20, 20, 20])}
    for dtype in ctx.half_dtypes:
        model = reference.to(device=ctx.device, dtype=dtype_of(dtype))
        for i, (batch, mode) in enumerate(sdpa_arguments.SETTINGS):
            model.train(mode == "train")
            with recording(model) as calls, torch.set_grad_enabled(mode == "train"):
                logits, _ = model(**batches[batch]["net_input"])
                if mode == "train":
                    logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
            setting = f"{batch}-{mode}"
            got = sdpa_arguments.cell(argument_summary(calls))
            kernels = sorted({f"{argument_code(c)}: {c.backend}" for c in calls if c.path == "fused"})
            out[f"{dtype}/{setting}"] = {"arguments": got, "kernels": kernels}
            if expected is not None and got != expected[i]:
                problems.append(f"{setting}: the attentions hand SDPA '{got}', docs/speed.md's table says "
                                f"'{expected[i]}'")
            for call in calls:
                if call.path != "fused" or not asserted:
                    continue
                code = argument_code(call)
                allowed = allowed_backends(code, ctx.cuda)
                if call.backend not in allowed:
                    problems.append(f"{dtype} {setting} {call.role}: '{code}' reached {call.backend}, expected "
                                    f"{' or '.join(sorted(allowed))}")
    if ctx.cuda:  # what ran, for the report (not asserted: kernel names differ between builds)
        from torch.profiler import ProfilerActivity, profile

        model = reference.to(device=ctx.device, dtype=torch.float16).train()
        try:
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                logits, _ = model(**batches["unpadded"]["net_input"])
                logits.float().sum().backward()
                torch.cuda.synchronize()
            out["profiler_attention_kernels"] = sorted(
                {e.name for e in prof.events() if any(k in e.name.lower() for k in ("flash", "fmha", "attention",
                                                                                      "cudnn", "efficient"))})
        except Exception as e:  # noqa: BLE001  (no profiler on this machine: the assertions above stand)
            out["profiler_attention_kernels"] = f"not recorded: {type(e).__name__}: {e}"[:300]
    if problems:
        raise CheckFailed(dedupe(problems), out)
    return out
