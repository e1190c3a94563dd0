"""What the CPU test-suite cannot check, on a CUDA GPU, within a time budget: which kernel every attention reaches,
what the kernels give for a row whose every key is masked, fp16/bf16 forwards, trainings, DDP, step-by-step decoding.

    fairseq-pe-gpu-check --out gpu-check                 # on the first CUDA device, within --budget 420 s
    fairseq-pe-gpu-check --out gpu-check --systems rope t5 --checks kernels forward
    fairseq-pe-gpu-check --out rehearsal --device cpu    # the CPU rehearsal (CI: tests/test_gpu_check.py)

``bash scripts/gpu_session.sh OUT`` is the GPU machine's one command: it installs offline when needed, runs this,
then the benchmark if time is left (docs/install.md, "A GPU acceptance check").  Without a CUDA device (and
without ``--device cpu``) it says so in one line and exits 0.

The checks (``CHECKS`` of :mod:`fairseq_pe.benchmark.gpu_check.registry`, in this order; each per system), one
module each of :mod:`fairseq_pe.benchmark.gpu_check`: ``kernels``, ``masked-rows`` (``masked_rows``), ``forward``,
``incremental`` and ``positions`` (``numerics``), ``ddp``, ``training`` and ``flex``.

Budget (``--budget``, seconds from the process's start, imports included; default 420 on CUDA, 150 on the CPU): a
check is not started for a system when less time is left than its estimate, and one still running at the end is
stopped (an alarm; a subprocess's whole group is killed); both are reported as not run, never as passed.  A check that
raises is that check's failure; the others go on.  After every check ``OUT/gpu_check.json`` and ``OUT/gpu_check.md``
(a row per system, a column per check; then every failure with its measures) are rewritten, atomically: a run killed
at any point leaves what it had done.  Progress lines go to stderr, the table to stdout at the end.  Exit status: 1
when a check failed, 0 otherwise (also when checks were not run for lack of time: the table says which), 2 for a
usage error.
"""

import argparse
import contextlib
import logging
import os
import sys
import warnings

from fairseq_pe.benchmark.gpu_check import registry
from fairseq_pe.benchmark.gpu_check.context import REHEARSAL_SYSTEMS, STOCK_ARCH, SYSTEM_ORDER, SYSTEMS
from fairseq_pe.benchmark.gpu_check.runner import markdown, progress, run_checks
from fairseq_pe.errors import cli
from fairseq_pe.outputs import check_new_files


def parse_args(argv):
    parser = argparse.ArgumentParser(prog="fairseq-pe-gpu-check", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda",
                        help="cuda (the first CUDA device; default) or cpu (the rehearsal: float32 and bf16)")
    parser.add_argument("--out", default="gpu-check", help="folder of gpu_check.json, gpu_check.md and work files")
    parser.add_argument("--force", action="store_true", help="replace an existing OUT/gpu_check.json")
    parser.add_argument("--budget", type=float, help="seconds for all checks (default: 420 on CUDA, 150 on the CPU)")
    parser.add_argument("--systems", nargs="+", metavar="NAME",
                        help=f"systems to check (default: all on CUDA, {' '.join(REHEARSAL_SYSTEMS)} on the CPU): "
                             f"{', '.join(SYSTEMS)}")
    names = [c.name for c in registry.CHECKS]
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
        print("fairseq-pe-gpu-check: no CUDA device is visible (torch.cuda.is_available() is False); nothing checked "
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
