#!/usr/bin/env python3
"""Start-up time of the fairseq-pe-* tools: ``TOOL --help`` and ``TOOL --no-such-option`` (an argument
error), wall-clock median of --repeats runs each, beside ``sacrebleu --help`` measured in the same run.

    python scripts/benchmark_startup.py [--repeats 5]

Target: the tools that do not need fairseq (tests/test_cli_startup.py's LIGHT: they import neither fairseq
nor torch for this) answer in under 0.5 s; the others import fairseq (several seconds) and are listed for
comparison.  Exit status 1 when a target is missed."""

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests"))
from test_cli_startup import LIGHT  # noqa: E402

TARGET_S = 0.5
OTHERS = ["fairseq-pe-warm-start-floater", "fairseq-pe-warm-start-roberta", "fairseq-pe-analyze"]


def seconds(cmd, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=5, help="runs per command (the median is reported)")
    args = p.parse_args()
    missing = [t for t in LIGHT + OTHERS + ["sacrebleu"] if shutil.which(t) is None]
    if missing:
        sys.exit(f"benchmark_startup: not on PATH: {', '.join(missing)} (install the project: scripts/install.sh)")
    print(f"{'command':34s} {'--help':>8s} {'bad arg':>8s}  target")
    print(f"{'sacrebleu':34s} {seconds(['sacrebleu', '--help'], args.repeats):8.2f} {'':>8s}  (reference)")
    missed = []
    for tool in LIGHT + OTHERS:
        help_s = seconds([tool, "--help"], args.repeats)
        bad_s = seconds([tool, "--no-such-option"], args.repeats)
        light = tool in LIGHT
        ok = max(help_s, bad_s) < TARGET_S
        if light and not ok:
            missed.append(tool)
        verdict = (f"< {TARGET_S} s: " + ("ok" if ok else "MISSED")) if light else "(imports fairseq)"
        print(f"{tool:34s} {help_s:8.2f} {bad_s:8.2f}  {verdict}")
    if missed:
        print(f"missed the {TARGET_S} s target: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
