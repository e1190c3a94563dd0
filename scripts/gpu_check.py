#!/usr/bin/env python3
"""What the CPU test-suite cannot check, on a CUDA GPU, within a time budget: which kernel every attention reaches,
what the kernels give for a row whose every key is masked, fp16/bf16 forwards, trainings, DDP, step-by-step decoding.

    python scripts/gpu_check.py --out gpu-check                 # on the first CUDA device, within --budget 420 s
    python scripts/gpu_check.py --out gpu-check --systems rope t5 --checks kernels forward
    python scripts/gpu_check.py --out rehearsal --device cpu    # the CPU rehearsal (CI: tests/test_gpu_check.py)

``bash scripts/gpu_session.sh OUT`` is the GPU machine's one command: it installs offline when needed, runs this,
then the benchmark if time is left (docs/install.md, "A GPU acceptance check").  Without a CUDA device (and
without ``--device cpu``) this script says so in one line and exits 0.

The checks (:data:`CHECKS`, a registry: one :class:`Check` per entry, run in this order, the order of their value
on a GPU; each runs per system, the systems in :data:`SYSTEM_ORDER`, the order of their value):

* **kernels**: every attention (encoder self-attention, decoder self-attention, cross-attention), padded and
  unpadded, in training and evaluation, hands torch's ``scaled_dot_product_attention`` the arguments of the table
  of docs/speed.md ("Which kernel each attention reaches": the CUDA table on CUDA, the CPU table on the CPU), and
  the kernel torch picks for them is the one :func:`allowed_backends` states.  On CUDA (compute capability 8.0 or
  newer, fp16 and bf16): no mask (unpadded self-attention without a bias, the unpadded cross-attention) and the
  causal decoder (``is_causal``): FlashAttention or cuDNN; a float mask (padding, a fixed bias): memory-efficient or
  cuDNN; a mask with a gradient (a learned bias in training): memory-efficient.  Never the math kernel.  On the
  CPU (float32): torch's fused CPU kernel (``FLASH_ATTENTION``) for every call on the fused path, and the
  blockwise and explicit paths where the CPU table says so.
* **masked-rows**: a query whose every key is masked (one sentence of the batch all padding: source, target, and
  the first step of step-by-step decoding) gives 0 (the attention's output is ``out_proj``'s bias alone), not NaN,
  and finite gradients, through :class:`fairseq_pe.models.attention.PositionAttention`, in every kernel and path
  it reaches (torch's choice, and on CUDA each of memory-efficient and cuDNN forced), per dtype.  fairseq's own
  path (stock's code, the cross-attention whose weights the decoder returns) is not the plugin's and is left out.
* **forward**: the model's log-probabilities on a padded batch on the device in each dtype against the same weights
  in float32 on the CPU (largest absolute difference over the real target tokens, :data:`FORWARD_TOLERANCE`).
* **incremental**: step-by-step decoding (fairseq's incremental state) against one full decoder pass, on the
  device, in each dtype, on a padded batch and an unpadded one (whose full pass takes ``is_causal``)
  (:data:`INCREMENTAL_TOLERANCE`).
* **positions**: what half precision changes in what positions change (:mod:`fairseq_pe.diagnostics.precision`):
  on a padded batch, the per-token log-probabilities and the position parameters' gradients in fp16 and bf16
  against the same weights in float32, within tolerances at which a missing or wrong bias fails.
* **ddp**: two processes (``torch.distributed.run``) with ``--ddp-backend c10d`` and ``legacy_ddp``: with two
  GPUs or more over NCCL, one per GPU; with one GPU both on it over gloo (NCCL refuses two ranks on one GPU); on
  the CPU over gloo.  Both ranks start, every update is done, the losses are finite and the two backends' agree
  (:data:`DDP_TOLERANCE`).
* **training**: ``fairseq-train`` (fairseq's ``call_main`` in this process, ``--distributed-world-size 1``
  whatever the number of GPUs) for ``--updates`` updates in each precision of :data:`TRAINING_PRECISIONS`: every update
  done (or skipped by the loss scaler), every loss finite, no more skipped updates than stock fairseq's
  ``transformer`` of the same size plus 2.  (Whether half precision keeps what positions do is the job of a
  **positions** check, not of losses that a missing bias moves by 0.1%.)
* **flex**: :func:`fairseq_pe.models.flex.flex_attention_forward` (the encoding's bias computed in FlexAttention's
  kernel, padding and causality as a block mask) against the dense path (the bias merged into SDPA's float mask) for
  ALiBi, T5, KERPLE-log and FIRE: outputs, the gradients of q, k, v and of the encoding's parameters
  (:data:`FLEX_TOLERANCE`), and the peak memory and time of both at T = 4096 in fp16, FlexAttention's first call
  (its compilation) apart.  Last, with the time the others leave.  On the CPU: the eager forward of the first of
  them on a small shape (the CPU has no FlexAttention backward).

Budget (``--budget``, seconds from the process's start, imports included; default 420 on CUDA, 150 on the CPU): a
check is not started for a system when less time is left than its estimate, and one still running at the end is
stopped (an alarm; a subprocess's whole group is killed); both are reported as not run, never as passed.  A check that raises is that check's failure; the others go on.  After every
check ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (a row per system, a column per check; then every failure
with its measures) are rewritten, atomically: a run killed at any point leaves what it had done.  Progress lines go
to stderr, the table to stdout at the end.  Exit status: 1 when a check failed, 0 otherwise (also when checks were
not run for lack of time: the table says which), 2 for a usage error.
"""

import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

PROCESS_START = time.monotonic()  # the budget counts from here: the imports of torch and fairseq are in it
HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PLUGIN = os.path.join(REPO, "fairseq_pe")
sys.path.insert(0, REPO)

from fairseq_pe.errors import cli  # noqa: E402
from fairseq_pe.outputs import check_new_files, write_json, write_text  # noqa: E402
from fairseq_pe import systems as catalogue  # noqa: E402

sys.path.insert(0, HERE)
#: every encoding (the quickstart's names), FLOATER in its three forms, issue 43's (those of 2024-2025, ReRoPE with
#: a window of 3): count_ops.py's systems, whose SDPA arguments docs/speed.md's tables give (sdpa_arguments.py)
from count_ops import OWN_LOGITS, SYSTEMS  # noqa: E402
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
PRECISIONS = {
    "float32": [],
    "fp16": ["--fp16"],
    "bf16": ["--bf16"],
    "memory-efficient-fp16": ["--fp16", "--memory-efficient-fp16"],
}
#: the precisions the training check runs, per device
TRAINING_PRECISIONS = {"cuda": ["fp16", "bf16", "memory-efficient-fp16"], "cpu": ["bf16"]}
#: the largest absolute difference of log-probabilities from the CPU's float32 forward
FORWARD_TOLERANCE = {"float32": 2e-4, "float16": 5e-2, "bfloat16": 2.5e-1}
#: the largest absolute difference of log-probabilities between step-by-step decoding and the full pass
INCREMENTAL_TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 2.5e-1}
#: the largest relative difference between the losses of c10d and legacy_ddp (the same data, seeds and updates)
DDP_TOLERANCE = {"float32": 1e-3, "fp16": 3e-2}
#: the largest |output − out_proj.bias| of a query whose every key is masked (its attention is 0)
MASKED_ROW_TOLERANCE = 1e-6
#: how many systems the training and ddp checks take, per device (the first of the run's systems in order)
TRAINING_SYSTEMS = {"cuda": 8, "cpu": 1}  # (the budget may stop it earlier)
DDP_SYSTEMS = {"cuda": 1, "cpu": 1}
DDP_ORDER = ["t5", "floater-bias", "rope", "kerple-power", "ape-sinusoidal", "alibi"]
#: the systems of the masked-rows check: one per path (no bias, a fixed bias, a learned bias, Shaw's blockwise
#: path), KERPLE-power, whose bias passes fp16's range, and the logits hook's (issue 43: FoX's gates, CoPE's counts,
#: DAPE's network over the logits)
MASKED_SYSTEMS = ["ape-sinusoidal", "alibi", "t5", "rpe-learned", "kerple-power", "fox", "cope", "kerple-log-dape"]


def progress(msg: str):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# ---- the registry -----------------------------------------------------------------------------------------------


class CheckFailed(Exception):
    """Raised by a check with the problems it found (each names what failed and the measure)."""

    def __init__(self, problems: List[str], details: Optional[dict] = None):
        super().__init__("; ".join(problems))
        self.problems = problems
        self.details = details or {}


class OutOfTime(BaseException):
    """The alarm at the end of the budget (a BaseException: fairseq's and the checks' ``except Exception`` let it
    through)."""


@dataclass
class Check:
    """One named check: ``run(ctx, system)`` returns its measures (a dict, JSON-ready) and raises
    :class:`CheckFailed` with its problems (any other exception is a failure too).  ``systems(ctx)`` lists the
    systems it runs for, in order (a subset of the run's).  ``estimate`` is its time per system in seconds (cuda,
    cpu), below which it is not started."""
    name: str
    what: str
    run: Callable
    systems: Callable
    estimate: Dict[str, float] = field(default_factory=lambda: {"cuda": 10.0, "cpu": 5.0})


#: the checks, in the order they run; :func:`register` adds one (e.g. a position-sensitive precision comparison)
CHECKS: List[Check] = []


def register(check: Check, before: Optional[str] = None) -> Check:
    """Add ``check`` to :data:`CHECKS` (before the check named ``before``, else last)."""
    names = [c.name for c in CHECKS]
    CHECKS.insert(names.index(before) if before in names else len(CHECKS), check)
    return check


# ---- the run's context ------------------------------------------------------------------------------------------


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


# ---- data and models --------------------------------------------------------------------------------------------


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


def console_script(name: str) -> str:
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else (shutil.which(name) or name)


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


# ---- kernels ----------------------------------------------------------------------------------------------------


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
    script = load_sdpa_arguments()
    with open(os.path.join(REPO, "docs", "speed.md"), encoding="utf-8") as f:
        return script.parse_table(f.read(), cuda)


def load_sdpa_arguments():
    import importlib.util

    spec = importlib.util.spec_from_file_location("sdpa_arguments", os.path.join(HERE, "sdpa_arguments.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_kernels(ctx, system):
    """Per dtype, batch (padded, unpadded) and mode (train, eval): each role's arguments against docs/speed.md's
    table and each fused call's kernel against :func:`allowed_backends`; on CUDA, the attention kernels the profiler
    saw in one training step (recorded, for the report)."""
    import torch

    from fairseq_pe.diagnostics.attention_calls import argument_code, argument_summary, recording

    script = load_sdpa_arguments()
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
        for i, (batch, mode) in enumerate(script.SETTINGS):
            model.train(mode == "train")
            with recording(model) as calls, torch.set_grad_enabled(mode == "train"):
                logits, _ = model(**batches[batch]["net_input"])
                if mode == "train":
                    logits.float().sum().backward()
            model.zero_grad(set_to_none=True)
            setting = f"{batch}-{mode}"
            got = script.cell(argument_summary(calls))
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


def dedupe(problems):
    seen = []
    for p in problems:
        if p not in seen:
            seen.append(p)
    return seen


# ---- rows whose every key is masked -----------------------------------------------------------------------------


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


# ---- forward, incremental ---------------------------------------------------------------------------------------


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


# ---- FlexAttention ----------------------------------------------------------------------------------------------

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


# ---- trainings --------------------------------------------------------------------------------------------------


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append((record.name, record.getMessage()))


def training_config(argv):
    """fairseq's configuration of ``fairseq-train ARGV`` (as ``fairseq_cli.train.cli_main`` builds it)."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


def fairseq_train(argv):
    """``fairseq-train ARGV`` in this process through fairseq's ``call_main``: (its per-update stats, the number of
    skipped (overflow) updates, an error or None)."""
    from fairseq.distributed import utils as distributed_utils
    from fairseq.logging import metrics
    from fairseq_cli import train

    capture = _Capture()
    root = logging.getLogger()
    root.addHandler(capture)
    error = None
    try:
        cfg = training_config(argv)
        metrics.reset()
        with contextlib.redirect_stdout(io.StringIO()):
            distributed_utils.call_main(cfg, train.main)
    except (Exception, SystemExit) as e:  # noqa: BLE001  (a failed training is a result here)
        error = f"{type(e).__name__}: {e}"
    finally:
        root.removeHandler(capture)
    stats = []
    for name, message in capture.messages:
        if name == "train_inner":
            try:
                stats.append(json.loads(message))
            except ValueError:
                pass
    skipped = sum("gradient overflow detected" in m for _, m in capture.messages)
    return stats, skipped, error


def training_argv(args, data, system, precision, save):
    """``fairseq-train`` arguments of one training: one process (``--distributed-world-size 1``: fairseq's default
    is the number of GPUs, and it would spawn a worker per GPU whose log never reaches this process)."""
    return [data, "--task", "translation", "-s", "src", "-t", "tgt", "--share-all-embeddings",
            *model_flags(args, system), *PRECISIONS[precision], *(["--cpu"] if args.device == "cpu" else []),
            "--distributed-world-size", "1",
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.0005", "--lr-scheduler",
            "inverse_sqrt", "--warmup-updates", str(max(1, args.updates // 3)), "--criterion",
            "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens",
            str(args.max_tokens), "--max-update", str(args.updates), "--seed", "1", "--log-format", "json",
            "--log-interval", "1", "--disable-validation", "--no-save", "--num-workers", "0", "--save-dir", save]


def check_training(ctx, system):
    args = ctx.args
    stock = ctx.results["checks"].get("training", {}).get("systems", {}).get(STOCK, {}).get("details", {})
    out, problems = {}, []
    for precision in TRAINING_PRECISIONS[args.device]:
        stats, skipped, error = fairseq_train(training_argv(args, ctx.data, system, precision,
                                                            os.path.join(ctx.work, "ckpt", system, precision)))
        losses = [float(s["loss"]) for s in stats]
        out[precision] = {"losses": losses, "skipped_updates": skipped, "error": error,
                          "loss_scale": [float(s["loss_scale"]) for s in stats if "loss_scale" in s]}
        if error:
            problems.append(f"{precision}: {error.splitlines()[0][:200]}")
            continue
        done = len(losses) + skipped
        if done < args.updates:
            problems.append(f"{precision}: {done} of {args.updates} updates")
        if not all(math.isfinite(x) for x in losses):
            problems.append(f"{precision}: non-finite loss")
        allowed = (stock.get(precision) or {}).get("skipped_updates", 0) + 2
        if system != STOCK and skipped > allowed:
            problems.append(f"{precision}: {skipped} updates skipped (stock's plus 2: {allowed})")
    if problems:
        raise CheckFailed(problems, out)
    return out


def training_systems(ctx):
    return [STOCK] + ctx.systems(SYSTEM_ORDER, TRAINING_SYSTEMS[ctx.args.device])


# ---- ddp --------------------------------------------------------------------------------------------------------


def ddp_setting(ctx):
    """(precision, flags, what): two processes over NCCL with two GPUs or more, over gloo on one GPU or the CPU."""
    if not ctx.cuda:
        return "float32", ["--distributed-backend", "gloo"], "2 processes on the CPU over gloo"
    if ctx.gpus >= 2:
        return "fp16", ["--distributed-backend", "nccl"], "2 processes on 2 GPUs over NCCL"
    # fairseq gives rank r the device r % (number of GPUs): both ranks on GPU 0; NCCL refuses two ranks on one GPU
    return "fp16", ["--distributed-backend", "gloo"], "2 processes on 1 GPU over gloo (NCCL takes one rank per GPU)"


def check_ddp(ctx, system):
    """c10d and legacy_ddp, two processes each (``ddp_setting``): their losses."""
    args = ctx.args
    precision, flags, what = ddp_setting(ctx)
    out, problems = {"setting": what}, []
    for backend in ("c10d", "legacy_ddp"):
        # --standalone: torchrun's store binds a free port itself (a port picked here and bound later can be taken
        # in between by another run's connections)
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
               console_script("fairseq-train"),
               *training_argv(args, ctx.data, system, precision, os.path.join(ctx.work, "ddp", system, backend)),
               "--distributed-world-size", "2", *flags, "--ddp-backend", backend]
        returncode, text = run_group(cmd, dict(os.environ, OMP_NUM_THREADS="1"))
        losses = []
        for line in text.splitlines():
            if "| train_inner |" in line:
                try:
                    losses.append(float(json.loads(line.split("| train_inner | ", 1)[1])["loss"]))
                except (ValueError, KeyError, IndexError):
                    pass
        ranks = sum("distributed init (rank" in line for line in text.splitlines())
        out[backend] = {"returncode": returncode, "losses": losses, "ranks_started": ranks,
                        "tail": text[-1500:] if returncode else ""}
        if returncode:
            problems.append(f"{backend}: exit status {returncode}: {last_error_line(text)}")
            continue
        if ranks != 2:
            problems.append(f"{backend}: {ranks} ranks started, not 2")
        if len(losses) != args.updates or not all(math.isfinite(x) for x in losses):
            problems.append(f"{backend}: {len(losses)} finite losses of {args.updates} updates")
    a, b = out.get("c10d", {}).get("losses", []), out.get("legacy_ddp", {}).get("losses", [])
    if not problems and a and b:
        deviation = max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b))
        out["max_relative_deviation"] = deviation
        if deviation > DDP_TOLERANCE[precision]:
            problems.append(f"c10d's losses {deviation:.3g} from legacy_ddp's (tolerance {DDP_TOLERANCE[precision]})")
    if problems:
        raise CheckFailed(problems, out)
    return out


def run_group(cmd, env):
    """(exit status, output) of ``cmd`` in a process group of its own, which is killed whole (torchrun and its
    ranks) when the budget ends or anything else interrupts the wait."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)
    try:
        text, _ = proc.communicate(timeout=remaining_seconds())
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        raise
    return proc.returncode, text


#: a raised exception's last line in a traceback (``ValueError: ...``, ``torch.distributed.DistNetworkError: ...``)
EXCEPTION_LINE = re.compile(r"^\s*(?:\[rank\d+\]:\s*)?[A-Za-z_][\w.]*(?:Error|Exception|Interrupt)\b:")


def last_error_line(text):
    """The line that says why a run failed: the first exception a rank raised (torchrun prints its own summary,
    ``ChildFailedError`` and ``error_file: <N/A>``, after the ranks' tracebacks), else the last line naming an
    error, else the last line."""
    lines = text.splitlines()
    raised = [line.strip() for line in lines if EXCEPTION_LINE.match(line) and "ChildFailedError" not in line]
    if raised:
        return raised[0][:300]
    named = [line for line in lines if ("Error" in line or "error" in line) and "error_file" not in line]
    return (named[-1] if named else text.strip().splitlines()[-1] if text.strip() else "")[:300]


def ddp_systems(ctx):
    chosen = ctx.systems(DDP_ORDER, DDP_SYSTEMS[ctx.args.device])
    return chosen or ctx.systems(None, DDP_SYSTEMS[ctx.args.device])


# ---- the checks, in order ---------------------------------------------------------------------------------------

register(Check("kernels", "each attention's SDPA arguments are docs/speed.md's and reach the kernel stated "
               "(CUDA sm_80+: flash/cuDNN without a mask or with is_causal, memory-efficient/cuDNN with a mask, "
               "memory-efficient with a mask's gradient; CPU: the fused CPU kernel, blockwise/explicit as the table)",
               check_kernels, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 4.0, "cpu": 2.0}))
register(Check("masked-rows", "a query whose every key is masked gives 0 (not NaN) and finite gradients in every "
               "kernel and path of the plugin's attention", check_masked_rows,
               lambda ctx: ctx.systems(MASKED_SYSTEMS), {"cuda": 4.0, "cpu": 2.0}))
register(Check("forward", "log-probabilities in each dtype on the device within FORWARD_TOLERANCE of the CPU's "
               "float32", check_forward, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 3.0, "cpu": 2.0}))
register(Check("incremental", "step-by-step decoding within INCREMENTAL_TOLERANCE of the full pass, per dtype",
               check_incremental, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 6.0, "cpu": 2.0}))
register(Check("positions", "what positions change survives half precision: per-token log-probabilities and the "
               "position parameters' gradients in fp16 and bf16 against float32 within the precision diagnostics' tolerances",
               check_positions, lambda ctx: ctx.systems(SYSTEM_ORDER), {"cuda": 4.0, "cpu": 3.0}))
register(Check("ddp", "2 processes, c10d and legacy_ddp (NCCL with 2+ GPUs; gloo on 1 GPU or the CPU): both ranks, "
               "every update, finite and agreeing losses", check_ddp, ddp_systems, {"cuda": 40.0, "cpu": 25.0}))
register(Check("training", "fairseq-train with --distributed-world-size 1 in each precision: every update, finite "
               "losses, skipped updates at most stock's + 2", check_training, training_systems,
               {"cuda": 25.0, "cpu": 5.0}))
register(Check("flex", "FlexAttention with the bias in its kernel and a block mask against the dense SDPA path: "
               "outputs, q/k/v and parameter gradients, peak memory and time (CUDA: T=4096, fp16); CPU: the eager "
               "forward", check_flex, flex_systems, {"cuda": 60.0, "cpu": 15.0}))


# ---- running under the budget -----------------------------------------------------------------------------------

_deadline = None


def remaining_seconds() -> float:
    return max(0.0, _deadline - time.monotonic()) if _deadline is not None else 1e9


def cpu_seconds() -> float:
    import resource

    return sum(resource.getrusage(who).ru_utime + resource.getrusage(who).ru_stime
               for who in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))


def _alarm(signum, frame):
    raise OutOfTime()


def run_one(ctx, check, system):
    """One check for one system, isolated: its entry for the JSON."""
    started, cpu = time.monotonic(), cpu_seconds()
    entry = {"status": "ok", "problems": []}
    previous = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, max(0.01, remaining_seconds()))
    try:
        entry["details"] = check.run(ctx, system)
    except CheckFailed as e:
        entry.update(status="failed", problems=e.problems, details=e.details)
    except OutOfTime:
        entry.update(status="not run", problems=["stopped at the end of the budget"])
    except subprocess.TimeoutExpired:
        entry.update(status="not run", problems=["stopped at the end of the budget"])
    except Exception as e:  # noqa: BLE001  (one check's exception is its failure; the others go on)
        import traceback

        entry.update(status="failed", problems=[f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"],
                     traceback=traceback.format_exc()[-3000:])
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    entry["seconds"] = round(time.monotonic() - started, 2)
    entry["cpu_seconds"] = round(cpu_seconds() - cpu, 2)  # this process's and its finished children's
    if ctx.cuda:
        import torch

        torch.cuda.empty_cache()
    return entry


def run_checks(args) -> dict:
    global _deadline
    import torch

    import fairseq_pe  # noqa: F401  (registers the plugin and its fixes with fairseq)

    started = PROCESS_START if args.budget_from_start else time.monotonic()
    _deadline = started + args.budget
    cuda = args.device == "cuda"
    results = {"device": torch.cuda.get_device_name(0) if cuda else "cpu",
               "capability": ".".join(map(str, torch.cuda.get_device_capability(0))) if cuda else None,
               "gpus": torch.cuda.device_count() if cuda else 0, "torch": torch.__version__, "arch": args.arch,
               "updates": args.updates, "max_tokens": args.max_tokens, "budget_s": args.budget,
               "systems": args.systems, "tolerances": {"forward": FORWARD_TOLERANCE,
                                                       "incremental": INCREMENTAL_TOLERANCE, "ddp": DDP_TOLERANCE,
                                                       "masked_rows": MASKED_ROW_TOLERANCE},
               "checks": {}}
    ctx = Context(args, results)
    os.makedirs(args.out, exist_ok=True)
    progress(f"{results['device']}, torch {torch.__version__}, {len(args.systems)} systems, checks: "
             f"{' '.join(c.name for c in selected(args))}, budget {args.budget:.0f} s")
    for check in selected(args):
        entry = results["checks"][check.name] = {"what": check.what, "systems": {}}
        for system in check.systems(ctx):
            left = remaining_seconds()
            if left < check.estimate[args.device]:
                entry["systems"][system] = {"status": "not run", "problems": [
                    f"budget: {left:.0f} s left, it needs about {check.estimate[args.device]:.0f} s"]}
            else:
                entry["systems"][system] = run_one(ctx, check, system)
            one = entry["systems"][system]
            progress(f"{check.name} {system}: {one['status']}"
                     + (f" ({'; '.join(one['problems'])[:300]})" if one["problems"] else "")
                     + f", {one.get('seconds', 0):.1f} s, {remaining_seconds():.0f} s left")
            results["elapsed_s"] = round(time.monotonic() - started, 1)
            write_results(args.out, results)
    _deadline = None
    return results


def selected(args):
    return [c for c in CHECKS if c.name in args.checks]


def outcome(results):
    """(failed, not run): 'check system' lists."""
    failed, not_run = [], []
    for name, entry in results["checks"].items():
        for system, one in entry["systems"].items():
            (failed if one["status"] == "failed" else not_run if one["status"] == "not run" else []).append(
                f"{name} {system}")
    return failed, not_run


def cell(one):
    if one is None:
        return "–"
    if one["status"] == "ok":
        return "ok"
    first = one["problems"][0] if one["problems"] else ""
    first = first.replace("|", "/")
    if one["status"] == "not run":
        return "not run"
    return "✗ " + (first[:60] + "…" if len(first) > 60 else first)


def markdown(results) -> str:
    names = list(results["checks"])
    systems = []
    for entry in results["checks"].values():
        systems += [s for s in entry["systems"] if s not in systems]
    lines = [f"GPU check: {results['device']}"
             + (f" (compute capability {results['capability']}, {results['gpus']} GPU(s))" if results["gpus"] else "")
             + f", torch {results['torch']}, {results['arch']}, {results.get('elapsed_s', 0):.0f} s of a "
               f"{results['budget_s']:.0f} s budget", "",
             "| system | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
    for system in systems:
        lines.append(f"| {system} | " + " | ".join(cell(results["checks"][n]["systems"].get(system)) for n in names)
                     + " |")
    failed, not_run = outcome(results)
    lines += ["", f"{len(failed)} failed, {len(not_run)} not run (budget), "
                  f"{sum(len(e['systems']) for e in results['checks'].values()) - len(failed) - len(not_run)} passed"]
    if failed:
        lines += ["", "Failures:"]
        for name, entry in results["checks"].items():
            for system, one in entry["systems"].items():
                if one["status"] == "failed":
                    lines.append(f"- {name} {system}: " + "; ".join(one["problems"]))
    if not_run:
        lines += ["", "Not run: " + ", ".join(not_run)]
    lines += ["", "What each check asserts:"] + [f"- {n}: {e['what']}" for n, e in results["checks"].items()]
    return "\n".join(lines) + "\n"


def write_results(out, results):
    failed, not_run = outcome(results)
    results["failed"], results["not_run"] = failed, not_run
    write_json(os.path.join(out, "gpu_check.json"), results)
    write_text(os.path.join(out, "gpu_check.md"), markdown(results))


# ---- command line -----------------------------------------------------------------------------------------------


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (the first CUDA device; default) or cpu (the rehearsal: float32 and bf16)")
    parser.add_argument("--out", default="gpu-check", help="folder of gpu_check.json, gpu_check.md and work files")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT/gpu_check.json")
    parser.add_argument("--budget", type=float, help="seconds for all checks (default: 420 on CUDA, 150 on the CPU)")
    parser.add_argument("--systems", nargs="+", metavar="NAME",
                        help=f"systems to check (default: all on CUDA, {' '.join(REHEARSAL_SYSTEMS)} on the CPU): "
                             f"{', '.join(SYSTEMS)}")
    names = [c.name for c in CHECKS]
    parser.add_argument("--checks", nargs="+", choices=names, default=names, help="checks to run (default: all)")
    parser.add_argument("--arch", help="plugin architecture (default: transformer_pe_iwslt_de_en on CUDA, "
                                       "transformer_pe_tiny on the CPU)")
    parser.add_argument("--updates", type=int, help="updates per training (default: 30 on CUDA, 4 on the CPU)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: 4096 on CUDA, 600 on the CPU)")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.arch = args.arch or ("transformer_pe_tiny" if cpu else "transformer_pe_iwslt_de_en")
    args.updates = 4 if args.updates is None and cpu else (30 if args.updates is None else args.updates)
    args.max_tokens = args.max_tokens or (600 if cpu else 4096)
    args.budget = args.budget if args.budget is not None else (150.0 if cpu else 420.0)
    if args.arch not in STOCK_ARCH:
        parser.error(f"--arch: one of {', '.join(STOCK_ARCH)} (stock fairseq's architecture of the same size is "
                     "the reference)")
    if args.updates < 1 or args.max_tokens < 64:
        parser.error("--updates must be at least 1 and --max-tokens at least 64")
    if args.budget <= 0:
        parser.error("--budget must be a positive number of seconds")
    unknown = [s for s in args.systems or [] if s not in SYSTEMS]
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    args.systems = args.systems or (list(REHEARSAL_SYSTEMS) if cpu else list(SYSTEM_ORDER))
    return args


@contextlib.contextmanager
def quiet_libraries():
    """fairseq's log lines (its configuration, its model, every update) reach the trainings' capture, not the
    terminal: the root logger takes INFO, its one handler prints warnings only; the libraries' deprecation notices
    neither.  Restored afterwards (the check also runs inside the test-suite's process)."""
    root = logging.getLogger()
    saved = root.level, list(root.handlers)
    handler = logging.StreamHandler(sys.stderr)
    handler.setLevel(logging.WARNING)
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", category=UserWarning)
            warnings.filterwarnings("ignore", category=FutureWarning)
            warnings.filterwarnings("ignore", category=DeprecationWarning)
            yield
    finally:
        root.setLevel(saved[0])
        root.handlers[:] = saved[1]


@cli
def main(argv=None):
    args = parse_args(argv)
    args.budget_from_start = argv is None  # as a command: from the process's start; called in-process: from here
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); nothing checked "
              "(--device cpu runs the checks on the CPU)")
        return 0
    check_new_files([os.path.join(args.out, "gpu_check.json"), os.path.join(args.out, "gpu_check.md")],
                    force=args.force, flag="--out")
    with quiet_libraries():
        results = run_checks(args)
    text = markdown(results)
    print(text, end="")
    progress(f"wrote {os.path.join(args.out, 'gpu_check.json')} and gpu_check.md")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
