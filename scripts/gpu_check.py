#!/usr/bin/env python3
"""What the CPU test-suite cannot check: every encoding on a CUDA GPU, in float32, fp16 and bf16.

    python scripts/gpu_check.py                          # on the first CUDA device (about 15 minutes on one GPU)
    python scripts/gpu_check.py --systems rope t5 --out gpu-check-rope-t5
    python scripts/gpu_check.py --device cpu             # the same checks on the CPU, float32 and bf16 (minutes)

Without a CUDA device (and without ``--device cpu``) it says so in one line and exits 0.  For every system (the
quickstart's named encodings, FLOATER in its three forms, stock fairseq's ``transformer`` as the reference where a
check has one) it runs:

* **training**: ``fairseq-train`` (fairseq's own training entry point, in this process, one run after another)
  for ``--updates`` updates of ``--arch`` (``transformer_pe_iwslt_de_en`` on CUDA, ``transformer_pe_tiny`` on the
  CPU) on a synthetic translation task, in float32 and with ``--fp16``, ``--bf16`` and ``--memory-efficient-fp16``
  (CPU: float32 and ``--bf16``).  Passes when every update happens and every loss is finite, fp16's loss scale
  did not collapse (no more skipped updates than stock fairseq's ``transformer`` of the same size in the same
  run, plus 2), and the losses stay within :data:`TRAINING_TOLERANCE` of the float32 run's (relative, the
  largest over the updates);
* **forward**: the model's log-probabilities on a padded batch (source padded on the left, target on the right)
  on the device in each dtype against the same weights in float32 on the CPU (largest absolute difference over
  the real target tokens, :data:`FORWARD_TOLERANCE`);
* **incremental**: step-by-step decoding (fairseq's incremental state) against one full decoder pass, on the
  device, in each dtype (:data:`INCREMENTAL_TOLERANCE`);
* **kernels**: what each attention (encoder self-attention, decoder self-attention, cross-attention) hands to
  ``torch.nn.functional.scaled_dot_product_attention`` and which kernel torch picks for it (flash,
  memory-efficient, cuDNN, math), or that it computes the attention itself (the blockwise or explicit path of
  :mod:`fairseq_pe.models.attention`, or fairseq's own), padded and unpadded, in training and evaluation, in the
  training dtype (fp16 on CUDA, float32 on the CPU); on CUDA the attention kernels the profiler saw in one
  training step are listed in the JSON;
* **all −inf rows**: what each of torch's attention kernels returns for a query whose every key is masked (0,
  NaN, or no such kernel for a mask), per dtype;
* **ddp** (two or more GPUs): ``torchrun --nproc_per_node 2 fairseq-train --fp16`` with ``--ddp-backend c10d`` and
  ``legacy_ddp`` for a few systems: finite, and the two backends' losses within the fp16 tolerance.  (On the CPU
  the test-suite runs the gloo equivalents: ``tests/test_ddp_half_precision.py``.)

It prints one table (a row per system, a column per check: ``ok`` or the failing measure) with the kernel
choices, then what the all −inf rows gave, and writes everything to ``OUT/gpu_check.json`` (atomically; an
existing one is replaced only with ``--force``).  Progress lines go to stderr.  Exit status: 0 when every check
passed (or no CUDA device was visible), 1 when one failed, 2 for a usage error.
"""

import argparse
import contextlib
import io
import json
import logging
import math
import os
import shutil
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PLUGIN = os.path.join(REPO, "fairseq_pe")
sys.path.insert(0, REPO)

from fairseq_pe.errors import cli  # noqa: E402
from fairseq_pe.outputs import check_new_files, write_json  # noqa: E402
from fairseq_pe.translation.quickstart import NAMED_SYSTEMS  # noqa: E402

#: every encoding (the quickstart's names), FLOATER in its three forms
SYSTEMS = {name: flags for name, flags in NAMED_SYSTEMS.items() if name not in ("floater-warm", "ape-sin+rpe-learned")}
SYSTEMS["floater-input"] = ["--pe-absolute", "floater"]  # FLOATER at the embedding layer only (floater: every block)
STOCK = "stock"
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
#: the largest relative difference of a training's losses from the float32 run's (bf16 keeps 8 bits of mantissa)
TRAINING_TOLERANCE = {"fp16": 0.03, "memory-efficient-fp16": 0.03, "bf16": 0.08}
#: the largest absolute difference of log-probabilities from the CPU's float32 forward
FORWARD_TOLERANCE = {"float32": 2e-4, "float16": 5e-2, "bfloat16": 2.5e-1}
#: the largest absolute difference of log-probabilities between step-by-step decoding and the full pass
INCREMENTAL_TOLERANCE = {"float32": 1e-4, "float16": 5e-2, "bfloat16": 2.5e-1}
#: the systems the ddp check trains (two processes, c10d and legacy_ddp)
DDP_SYSTEMS = ["ape-sinusoidal", "rope", "kerple-power", "floater-bias"]
CHECKS = ("training", "forward", "incremental", "kernels", "infrows", "ddp")


def progress(msg: str):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (the first CUDA device; default) or cpu (float32 and bf16 only)")
    parser.add_argument("--out", default="gpu-check", help="folder of gpu_check.json and the work files")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT/gpu_check.json")
    parser.add_argument("--systems", nargs="+", metavar="NAME",
                        help=f"systems to check (default: all): {', '.join(SYSTEMS)}")
    parser.add_argument("--checks", nargs="+", choices=CHECKS, default=list(CHECKS), help="checks to run (default: all)")
    parser.add_argument("--arch", help="plugin architecture (default: transformer_pe_iwslt_de_en on CUDA, "
                                       "transformer_pe_tiny on the CPU)")
    parser.add_argument("--updates", type=int, help="updates per training (default: 30 on CUDA, 4 on the CPU)")
    parser.add_argument("--max-tokens", type=int, help="tokens per batch (default: 4096 on CUDA, 600 on the CPU)")
    args = parser.parse_args(argv)
    cpu = args.device == "cpu"
    args.arch = args.arch or ("transformer_pe_tiny" if cpu else "transformer_pe_iwslt_de_en")
    args.updates = 4 if args.updates is None and cpu else (30 if args.updates is None else args.updates)
    args.max_tokens = args.max_tokens or (600 if cpu else 4096)
    if args.arch not in STOCK_ARCH:
        parser.error(f"--arch: one of {', '.join(STOCK_ARCH)} (stock fairseq's architecture of the same size is "
                     "the reference)")
    if args.updates < 1 or args.max_tokens < 64:
        parser.error("--updates must be at least 1 and --max-tokens at least 64")
    unknown = [s for s in args.systems or [] if s not in SYSTEMS]
    if unknown:
        parser.error(f"--systems: unknown {', '.join(unknown)}; choose from {', '.join(SYSTEMS)}")
    args.systems = args.systems or list(SYSTEMS)
    args.precisions = ["float32", "bf16"] if cpu else list(PRECISIONS)
    args.dtypes = ["float32", "bfloat16"] if cpu else ["float32", "float16", "bfloat16"]
    return args


# ---- data and models --------------------------------------------------------------------------------------------


def prepare_data(work: str) -> str:
    """A synthetic translation task (sentences of 1 to 64 tokens), binarised with fairseq-preprocess; reused."""
    from fairseq_pe.translation.synthetic import write_corpus

    dest = os.path.join(work, "data-bin")
    if os.path.exists(os.path.join(dest, "train.src-tgt.src.idx")):
        return dest
    raw = write_corpus(os.path.join(work, "raw"), train_size=4000, valid_size=50, train_lengths=(1, 64),
                       test_buckets=[(1, 8)], test_per_bucket=2, seed=1)
    subprocess.run([shutil.which("fairseq-preprocess") or os.path.join(os.path.dirname(sys.executable),
                                                                       "fairseq-preprocess"),
                    "--source-lang", "src", "--target-lang", "tgt", "--trainpref", f"{raw}/train", "--validpref",
                    f"{raw}/valid", "--destdir", dest, "--joined-dictionary", "--workers", "1"],
                   check=True, capture_output=True)
    return dest


def model_flags(args, system):
    """The architecture flags of ``system`` (stock: fairseq's transformer of the same size, without the plugin)."""
    if system == STOCK:
        arch, extra = STOCK_ARCH[args.arch]
        return ["--arch", arch, *extra]
    return ["--user-dir", PLUGIN, "--arch", args.arch, *SYSTEMS[system]]


def build(args, data, system, extra=()):
    """(task, model, cfg) built by fairseq from the command line of ``fairseq-train DATA ...``, float32 on the CPU,
    initialised from seed 1."""
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    argv = [data, "--task", "translation", "-s", "src", "-t", "tgt", "--share-all-embeddings", "--dropout", "0",
            "--optimizer", "adam", "--lr", "0.0005", "--cpu", *model_flags(args, system), *extra]
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, argv))
    task = tasks.setup_task(cfg.task)
    torch.manual_seed(1)
    return task, task.build_model(cfg.model), cfg


def padded_batch(dictionary, device, source_lengths, target_lengths):
    """A fairseq batch of random sentences: the source padded on the left, the target on the right."""
    from fairseq import utils

    from fairseq_pe.synthetic import random_batch

    sample = random_batch(dictionary, source_lengths, target_lengths)
    return utils.move_to_cuda(sample, device) if device.startswith("cuda") else sample


def lengths(args):
    return ([48, 30, 5], [40, 33, 4]) if args.device == "cpu" else ([192, 120, 7], [160, 140, 5])


# ---- checks ----------------------------------------------------------------------------------------------------


def log_probs(model, sample):
    import torch

    with torch.no_grad():
        out = model(**sample["net_input"])
        return model.get_normalized_probs(out, log_probs=True).float()


def check_forward(args, data, system, device):
    """Largest |log p_device,dtype − log p_cpu,float32| over the real target tokens, per dtype."""
    import copy

    import torch

    task, reference, _ = build(args, data, system)
    reference.eval()
    sample = padded_batch(task.target_dictionary, "cpu", *lengths(args))
    expected = log_probs(reference, sample)
    real = sample["target"].ne(task.target_dictionary.pad())
    out = {}
    for dtype in args.dtypes:
        model = copy.deepcopy(reference).to(device=device, dtype=getattr(torch, dtype))
        got = log_probs(model, padded_batch(task.target_dictionary, device, *lengths(args))).cpu()
        finite = bool(torch.isfinite(got[real]).all())
        diff = float((got - expected).abs()[real].max()) if finite else math.inf
        out[dtype] = {"max_abs_diff": diff, "tolerance": FORWARD_TOLERANCE[dtype],
                      "ok": finite and diff <= FORWARD_TOLERANCE[dtype]}
    return out


def check_incremental(args, data, system, device):
    """Largest |log p_step − log p_full| of step-by-step decoding against one decoder pass, per dtype."""
    import torch

    task, model, _ = build(args, data, system)
    model.eval()
    sample = padded_batch(task.target_dictionary, device, *lengths(args))
    net = sample["net_input"]
    out = {}
    for dtype in args.dtypes:
        model = model.to(device=device, dtype=getattr(torch, dtype))
        with torch.no_grad():
            encoder_out = model.encoder(net["src_tokens"], src_lengths=net["src_lengths"])
            prev = net["prev_output_tokens"]
            full = model.get_normalized_probs(model.decoder(prev, encoder_out=encoder_out), log_probs=True).float()
            state, diff = {}, 0.0
            for t in range(prev.size(1)):
                step = model.decoder(prev[:, :t + 1], encoder_out=encoder_out, incremental_state=state)
                step = model.get_normalized_probs(step, log_probs=True).float()[:, -1]
                real = prev[:, t].ne(task.target_dictionary.pad())
                diff = max(diff, float((step - full[:, t]).abs()[real].max()))
        ok = math.isfinite(diff) and diff <= INCREMENTAL_TOLERANCE[dtype]
        out[dtype] = {"max_abs_diff": diff, "tolerance": INCREMENTAL_TOLERANCE[dtype], "ok": ok}
    return out


def kernel_summary(calls):
    """role -> sorted distinct 'path[:kernel]' of the calls (e.g. fused:FLASH_ATTENTION, blockwise)."""
    seen = {}
    for call in calls:
        label = call.path if call.path != "fused" else f"fused:{call.backend}"
        seen.setdefault(call.role, set()).add(label)
    return {role: sorted(labels) for role, labels in seen.items()}


def check_kernels(args, data, system, device):
    """For padded/unpadded batches in training and evaluation: per attention role, the path and kernel; on CUDA,
    the attention kernels of one training step as the profiler saw them."""
    import torch

    from fairseq_pe.models.attention_probe import recording

    task, model, _ = build(args, data, system)
    dtype = torch.float16 if device.startswith("cuda") else torch.float32
    model = model.to(device=device, dtype=dtype)
    dictionary = task.target_dictionary
    batches = {"padded": padded_batch(dictionary, device, *lengths(args)),
               "unpadded": padded_batch(dictionary, device, [24, 24, 24], [20, 20, 20])}
    out = {"dtype": str(dtype).replace("torch.", "")}
    for name, sample in batches.items():
        for mode in ("train", "eval"):
            model.train(mode == "train")
            with recording(model) as calls, torch.set_grad_enabled(mode == "train"):
                logits, _ = model(**sample["net_input"])
                if mode == "train":
                    logits.float().sum().backward()
            out[f"{name}-{mode}"] = kernel_summary(calls)
    model.zero_grad(set_to_none=True)
    if device.startswith("cuda"):
        from torch.profiler import ProfilerActivity, profile

        model.train()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            logits, _ = model(**batches["padded"]["net_input"])
            logits.float().sum().backward()
            torch.cuda.synchronize()
        names = {e.name for e in prof.events() if any(k in e.name.lower() for k in
                                                     ("flash", "fmha", "attention", "cudnn", "efficient"))}
        out["cuda_attention_kernels"] = sorted(names)
    return out


def check_infrows(device):
    """What each of torch's attention kernels returns for a query row whose every key is masked, per dtype."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    out = {}
    dtypes = ["float32", "bfloat16"] + (["float16"] if device.startswith("cuda") else [])
    for backend in (SDPBackend.MATH, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                    SDPBackend.CUDNN_ATTENTION):
        for dtype in dtypes:
            g = torch.Generator().manual_seed(0)
            q, k, v = (torch.randn(1, 2, 4, 64, generator=g).to(device=device, dtype=getattr(torch, dtype))
                       for _ in range(3))
            mask = torch.zeros(1, 1, 4, 4, device=device, dtype=q.dtype)
            mask[..., 1, :] = float("-inf")
            try:
                with sdpa_kernel(backend):
                    row = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)[0, :, 1].float()
                result = "nan" if torch.isnan(row).any() else ("0" if row.eq(0).all() else "other")
            except RuntimeError as e:  # this backend takes no such arguments (a mask, this dtype) on this device
                result = "no kernel" if "No viable backend" in str(e) or "No available kernel" in str(e) \
                    else f"error: {str(e).splitlines()[0]}"
            out[f"{backend.name}/{dtype}"] = result
    return out


class _Capture(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.messages = []

    def emit(self, record):
        self.messages.append((record.name, record.getMessage()))


def fairseq_train(argv):
    """``fairseq-train ARGV`` in this process: (its per-update stats, the number of skipped (overflow) updates,
    an error or None)."""
    from fairseq import options
    from fairseq.distributed import utils as distributed_utils
    from fairseq.logging import metrics
    from fairseq_cli import train

    capture = _Capture()
    root = logging.getLogger()
    root.addHandler(capture)
    error = None
    try:
        parser = options.get_training_parser()
        cfg_args = options.parse_args_and_arch(parser, argv)
        from fairseq.dataclass.utils import convert_namespace_to_omegaconf

        metrics.reset()
        with contextlib.redirect_stdout(io.StringIO()):
            distributed_utils.call_main(convert_namespace_to_omegaconf(cfg_args), train.main)
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
    return [data, "--task", "translation", "-s", "src", "-t", "tgt", "--share-all-embeddings",
            *model_flags(args, system), *PRECISIONS[precision], *(["--cpu"] if args.device == "cpu" else []),
            "--optimizer", "adam", "--adam-betas", "(0.9, 0.98)", "--lr", "0.0005", "--lr-scheduler",
            "inverse_sqrt", "--warmup-updates", str(max(1, args.updates // 3)), "--criterion",
            "label_smoothed_cross_entropy", "--label-smoothing", "0.1", "--dropout", "0.1", "--max-tokens",
            str(args.max_tokens), "--max-update", str(args.updates), "--seed", "1", "--log-format", "json",
            "--log-interval", "1", "--disable-validation", "--no-save", "--num-workers", "0", "--save-dir", save]


def check_training(args, data, system, work, stock_skipped):
    runs = {}
    for precision in args.precisions:
        stats, skipped, error = fairseq_train(training_argv(args, data, system, precision,
                                                            os.path.join(work, "ckpt", system, precision)))
        losses = [float(s["loss"]) for s in stats]
        runs[precision] = {"losses": losses, "skipped_updates": skipped, "error": error,
                           "loss_scale": [float(s["loss_scale"]) for s in stats if "loss_scale" in s]}
    reference = runs["float32"]["losses"]
    for precision, run in runs.items():
        problems = []
        if run["error"]:
            problems.append(run["error"].splitlines()[0][:120])
        done = len(run["losses"]) + run["skipped_updates"]
        if not run["error"] and done < args.updates:
            problems.append(f"{done} of {args.updates} updates")
        if not all(math.isfinite(x) for x in run["losses"]):
            problems.append("non-finite loss")
        if stock_skipped is not None and run["skipped_updates"] > stock_skipped.get(precision, 0) + 2:
            problems.append(f"{run['skipped_updates']} updates skipped (stock {stock_skipped.get(precision, 0)})")
        if precision != "float32" and run["losses"] and reference:
            n = min(len(run["losses"]), len(reference))
            deviation = max(abs(a - b) / max(abs(b), 1e-6) for a, b in zip(run["losses"][-n:], reference[-n:]))
            run["max_relative_deviation"] = deviation
            if deviation > TRAINING_TOLERANCE[precision]:
                problems.append(f"losses {deviation:.3f} from float32's (tolerance {TRAINING_TOLERANCE[precision]})")
        run["ok"] = not problems
        run["problems"] = problems
    return runs


def check_ddp(args, data, system, work):
    """Two processes on two GPUs, --fp16, c10d and legacy_ddp: their losses."""
    out = {}
    for backend in ("c10d", "legacy_ddp"):
        cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
               shutil.which("fairseq-train") or os.path.join(os.path.dirname(sys.executable), "fairseq-train"),
               *training_argv(args, data, system, "fp16", os.path.join(work, "ddp", system, backend)),
               "--ddp-backend", backend]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        losses = []
        for line in (proc.stdout + proc.stderr).splitlines():
            if "| train_inner |" in line:
                try:
                    losses.append(float(json.loads(line.split("| train_inner | ", 1)[1])["loss"]))
                except (ValueError, KeyError):
                    pass
        out[backend] = {"returncode": proc.returncode, "losses": losses,
                        "tail": (proc.stdout + proc.stderr)[-1500:] if proc.returncode else ""}
    a, b = out["c10d"]["losses"], out["legacy_ddp"]["losses"]
    ok = all(out[k]["returncode"] == 0 for k in out) and len(a) == len(b) == args.updates and \
        all(math.isfinite(x) for x in a + b) and \
        max(abs(x - y) / max(abs(y), 1e-6) for x, y in zip(a, b)) <= TRAINING_TOLERANCE["fp16"]
    out["ok"] = ok
    return out


# ---- report -----------------------------------------------------------------------------------------------------

KERNEL_CODES = {"fused:FLASH_ATTENTION": "F", "fused:EFFICIENT_ATTENTION": "E", "fused:CUDNN_ATTENTION": "C",
                "fused:MATH": "M", "blockwise": "B", "explicit": "X", "fairseq": "f"}


def kernel_codes(summary):
    """'encoder-self/decoder-self/cross' codes of one setting, e.g. F/E/E."""
    def code(role):
        labels = summary.get(role, [])
        return "+".join(KERNEL_CODES.get(label, "?") for label in labels) or "-"

    return "/".join(code(role) for role in ("encoder-self", "decoder-self", "cross"))


def cell(result, key=None):
    if result is None:
        return "-"
    if key is not None:
        result = result.get(key)
        if result is None:
            return "-"
    if result.get("ok"):
        return "ok"
    if "max_abs_diff" in result:
        return f"✗ {result['max_abs_diff']:.2g}"
    return "✗ " + "; ".join(result.get("problems", ["failed"]))


def table(args, results):
    precisions = [p for p in args.precisions if p != "float32"]
    header = ["system"] + [f"train {p}" for p in precisions] + [f"fwd {d}" for d in args.dtypes] + \
        [f"incr {d}" for d in args.dtypes] + ["kernels pad train", "pad eval", "unpad train", "unpad eval"]
    rows = [header, ["---"] * len(header)]
    for system in args.systems:
        r = results["systems"].get(system, {})
        training, kernels = r.get("training"), r.get("kernels")
        row = [system]
        row += [cell(training, p) for p in precisions]
        row += [cell(r.get("forward"), d) for d in args.dtypes]
        row += [cell(r.get("incremental"), d) for d in args.dtypes]
        for setting in ("padded-train", "padded-eval", "unpadded-train", "unpadded-eval"):
            row.append(kernel_codes(kernels[setting]) if kernels else "-")
        rows.append(row)
    lines = ["| " + " | ".join(row) + " |" for row in rows]
    lines.append("")
    lines.append("kernels: encoder self-attention / decoder self-attention / cross-attention; F flash, E memory-"
                 "efficient, C cuDNN, M math (torch's choice for the arguments), B blockwise, X explicit, f fairseq's "
                 f"own attention; in {results.get('kernel_dtype', '?')}")
    return "\n".join(lines)


@cli
def main(argv=None):
    args = parse_args(argv)
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device is visible (torch.cuda.is_available() is False); nothing checked "
              "(--device cpu runs the checks on the CPU)")
        return 0
    return run(args)


def run(args):
    # fairseq's log lines (its configuration, its model, every update) reach the trainings' capture, not the
    # terminal: the root logger takes INFO, its one handler (which later basicConfig calls keep) prints warnings only
    logging.basicConfig(level=logging.INFO, force=True, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger().handlers[0].setLevel(logging.WARNING)
    # and the libraries' deprecation notices (hydra's, torch's about fairseq's calls) neither
    warnings.filterwarnings("ignore", category=UserWarning)
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch

    import fairseq_pe  # noqa: F401  (registers the plugin and its fixes with fairseq)

    device = "cuda:0" if args.device == "cuda" else "cpu"
    os.makedirs(args.out, exist_ok=True)
    result_path = os.path.join(args.out, "gpu_check.json")
    check_new_files([result_path], force=args.force, flag="--out")
    work = os.path.join(args.out, "work")
    data = prepare_data(work)
    results = {"device": torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu",
               "torch": torch.__version__, "arch": args.arch, "updates": args.updates, "max_tokens": args.max_tokens,
               "precisions": args.precisions, "dtypes": args.dtypes, "tolerances": {
                   "training": TRAINING_TOLERANCE, "forward": FORWARD_TOLERANCE, "incremental": INCREMENTAL_TOLERANCE},
               "systems": {}}
    progress(f"{results['device']}, torch {torch.__version__}, {len(args.systems)} systems, checks: "
             f"{' '.join(args.checks)}")
    if "infrows" in args.checks:
        results["all_inf_rows"] = check_infrows(device)
    stock_skipped = None
    if "training" in args.checks:
        progress(f"training {STOCK} (the reference for skipped updates)")
        stock = check_training(args, data, STOCK, work, None)
        results["stock_training"] = stock
        stock_skipped = {p: run["skipped_updates"] for p, run in stock.items()}
    gpus = torch.cuda.device_count() if args.device == "cuda" else 0
    started = time.time()
    for i, system in enumerate(args.systems, 1):
        r = results["systems"][system] = {"flags": SYSTEMS[system]}
        for check in ("training", "forward", "incremental", "kernels", "ddp"):
            if check not in args.checks:
                continue
            if check == "ddp" and (gpus < 2 or system not in DDP_SYSTEMS):
                continue
            if check == "training":
                r[check] = check_training(args, data, system, work, stock_skipped)
            elif check == "forward":
                r[check] = check_forward(args, data, system, device)
            elif check == "incremental":
                r[check] = check_incremental(args, data, system, device)
            elif check == "kernels":
                r[check] = check_kernels(args, data, system, device)
                results["kernel_dtype"] = r[check]["dtype"]
            else:
                r[check] = check_ddp(args, data, system, work)
        left = (time.time() - started) / i * (len(args.systems) - i)
        progress(f"{i}/{len(args.systems)} {system} done (about {left / 60:.0f} min left)")
    if "ddp" in args.checks and gpus < 2:
        results["ddp"] = f"not run: {gpus} CUDA device(s); it needs 2 (the CPU test-suite runs the gloo equivalents)"
    failed = [s for s, r in results["systems"].items() for check, v in r.items() if isinstance(v, dict) and (
        (check == "training" and not all(run["ok"] for run in v.values())) or
        (check in ("forward", "incremental") and not all(x["ok"] for x in v.values())) or
        (check == "ddp" and not v["ok"]))]
    results["failed"] = sorted(set(failed))
    text = table(args, results)
    print(text)
    if "all_inf_rows" in results:
        print("\nall −inf rows (a query whose every key is masked):",
              ", ".join(f"{k} {v}" for k, v in results["all_inf_rows"].items()))
    if "ddp" in results:
        print(f"\nddp: {results['ddp']}")
    print(f"\n{len(results['failed'])} of {len(args.systems)} systems failed a check"
          + (f": {', '.join(results['failed'])}" if results["failed"] else ""))
    results["table"] = text
    write_json(result_path, results)
    progress(f"wrote {result_path}")
    return 1 if results["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
