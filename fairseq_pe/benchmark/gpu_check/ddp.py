"""The ``ddp`` check: two processes (``torch.distributed.run``) with ``--ddp-backend c10d`` and ``legacy_ddp``: with
two GPUs or more over NCCL, one per GPU; with one GPU both on it over gloo (NCCL refuses two ranks on one GPU); on the
CPU over gloo.  Both ranks start, every update is done, the losses are finite and the two backends' agree
(:data:`DDP_TOLERANCE`)."""

import contextlib
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys

from fairseq_pe.benchmark.gpu_check.budget import remaining_seconds
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed
from fairseq_pe.benchmark.gpu_check.training import training_argv

#: the largest relative difference between the losses of c10d and legacy_ddp (the same data, seeds and updates)
DDP_TOLERANCE = {"float32": 1e-3, "fp16": 3e-2}

DDP_SYSTEMS = {"cuda": 1, "cpu": 1}
DDP_ORDER = ["t5", "floater-bias", "rope", "kerple-power", "ape-sinusoidal", "alibi"]


def console_script(name: str) -> str:
    local = os.path.join(os.path.dirname(sys.executable), name)
    return local if os.path.exists(local) else (shutil.which(name) or name)


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
