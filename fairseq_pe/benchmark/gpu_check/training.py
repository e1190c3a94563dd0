"""The ``training`` check: ``fairseq-train`` (fairseq's ``call_main`` in this process, ``--distributed-world-size 1``
whatever the number of GPUs) for ``--updates`` updates in each precision of :data:`TRAINING_PRECISIONS`: every update
done (or skipped by the loss scaler), every loss finite, no more skipped updates than stock fairseq's ``transformer``
of the same size plus 2.  (Whether half precision keeps what positions do is the job of the ``positions`` check, not
of losses that a missing bias moves by 0.1%.)"""

import contextlib
import io
import json
import logging
import math
import os

from fairseq_pe.benchmark.gpu_check.context import STOCK, SYSTEM_ORDER, model_flags
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed

PRECISIONS = {
    "float32": [],
    "fp16": ["--fp16"],
    "bf16": ["--bf16"],
    "memory-efficient-fp16": ["--fp16", "--memory-efficient-fp16"],
}

#: the precisions the training check runs, per device
TRAINING_PRECISIONS = {"cuda": ["fp16", "bf16", "memory-efficient-fp16"], "cpu": ["bf16"]}

#: how many systems the training and ddp checks take, per device (the first of the run's systems in order)
TRAINING_SYSTEMS = {"cuda": 8, "cpu": 1}  # (the budget may stop it earlier)


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
