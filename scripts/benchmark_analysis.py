#!/usr/bin/env python3
"""Time of ``fairseq-pe-analyze`` on base-size checkpoints, as ratios to ``--pe-absolute sinusoidal``.

Each system is a randomly initialised ``roberta_pe_base`` (12 layers, 768 dims, 12 heads, 512
positions; ``--arch`` changes it), saved as a fairseq checkpoint; the command then runs on it in
a fresh process with its default options (128-position matrices, a 512-position probe, 100
words).  The time is the wall time of the whole command (Python start, imports, loading, every
picture and file), the fastest of ``--repeats`` rounds; everything is measured in the same run.

    python scripts/benchmark_analysis.py --out bench-analysis
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
from fairseq_pe import systems as catalogue  # noqa: E402
from fairseq_pe.analysis.checkpoint import save_untrained_checkpoint  # noqa: E402

BASELINE = "ape-sinusoidal"
SYSTEMS = catalogue.group("analysis-benchmark")  # the catalogue's names and flags


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True)
    p.add_argument("--arch", default="roberta_pe_base")
    p.add_argument("--systems", nargs="+", default=list(SYSTEMS), choices=list(SYSTEMS),
                   help=f"encodings to time ({BASELINE} always runs, as the baseline)")
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--threads", type=int, default=None, help="OMP_NUM_THREADS of the timed command")
    p.add_argument("--analyze-args", nargs=argparse.REMAINDER, default=[],
                   help="options passed on to fairseq-pe-analyze (last)")
    args = p.parse_args(argv)
    systems = [BASELINE] + [s for s in args.systems if s != BASELINE]
    os.makedirs(args.out, exist_ok=True)
    # the child imports this checkout's fairseq_pe, whatever is installed
    env = dict(os.environ, PYTHONWARNINGS="ignore",
               PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(HERE), os.environ.get("PYTHONPATH")])))
    if args.threads:
        env["OMP_NUM_THREADS"] = str(args.threads)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name in systems:
            ckpt = os.path.join(tmp, name, "checkpoint.pt")
            os.makedirs(os.path.dirname(ckpt))
            save_untrained_checkpoint(ckpt, args.arch, SYSTEMS[name], args.vocab)
            results[name] = {"flags": " ".join(SYSTEMS[name]), "size_mb": round(os.path.getsize(ckpt) / 2 ** 20, 1),
                             "seconds_rounds": []}
        for r in range(args.repeats):
            for name in systems:
                ckpt = os.path.join(tmp, name, "checkpoint.pt")
                cmd = [sys.executable, "-m", "fairseq_pe.analysis.cli", ckpt, "--out", os.path.join(args.out, "analysis"),
                       "--quiet", "--force", *args.analyze_args]
                start = time.perf_counter()
                proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
                seconds = time.perf_counter() - start
                if proc.returncode != 0:
                    sys.exit(f"{' '.join(cmd)} failed:\n{proc.stderr[-3000:]}")
                results[name]["seconds_rounds"].append(round(seconds, 2))
                print(f"round {r + 1}/{args.repeats} {name}: {seconds:.1f} s", flush=True)
    base = min(results[BASELINE]["seconds_rounds"])
    lines = [f"fairseq-pe-analyze on a randomly initialised {args.arch} checkpoint (vocabulary {args.vocab}), "
             f"fastest of {args.repeats} rounds", "", "| system | seconds | ratio to ape-sinusoidal |", "|---|---|---|"]
    for name, r in results.items():
        r["seconds"] = min(r["seconds_rounds"])
        r["ratio"] = round(r["seconds"] / base, 3)
        lines.append(f"| {name} | {r['seconds']:.1f} | {r['ratio']:.2f}× |")
    table = "\n".join(lines) + "\n"
    print(table)
    with open(os.path.join(args.out, "benchmark.md"), "w") as f:
        f.write(table)
    with open(os.path.join(args.out, "benchmark.json"), "w") as f:
        json.dump({"arch": args.arch, "vocab": args.vocab, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
