"""The checks run under the budget: each check per system, isolated (an exception is that check's failure, the others
go on; one still running at the end of the budget is stopped by an alarm), not started when less time is left than
its estimate; ``OUT/gpu_check.json`` and ``OUT/gpu_check.md`` (a row per system, a column per check; then every
failure with its measures) rewritten after each, atomically."""

import os
import signal
import subprocess
import sys
import time

from fairseq_pe.benchmark.gpu_check import registry
from fairseq_pe.benchmark.gpu_check.budget import (PROCESS_START, OutOfTime, alarm, cpu_seconds, remaining_seconds,
                                                   set_deadline)
from fairseq_pe.benchmark.gpu_check.context import Context
from fairseq_pe.benchmark.gpu_check.ddp import DDP_TOLERANCE
from fairseq_pe.benchmark.gpu_check.masked_rows import MASKED_ROW_TOLERANCE
from fairseq_pe.benchmark.gpu_check.numerics import FORWARD_TOLERANCE, INCREMENTAL_TOLERANCE
from fairseq_pe.benchmark.gpu_check.problems import CheckFailed
from fairseq_pe.outputs import write_json, write_text


def progress(msg: str):
    print(f"[gpu-check {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def run_one(ctx, check, system):
    """One check for one system, isolated: its entry for the JSON."""
    started, cpu = time.monotonic(), cpu_seconds()
    entry = {"status": "ok", "problems": []}
    previous = signal.signal(signal.SIGALRM, alarm)
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
    import torch

    import fairseq_pe  # noqa: F401  (registers the plugin and its fixes with fairseq)

    started = PROCESS_START if args.budget_from_start else time.monotonic()
    set_deadline(started + args.budget)
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
    set_deadline(None)
    return results


def selected(args):
    return [c for c in registry.CHECKS if c.name in args.checks]


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
