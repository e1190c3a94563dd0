#!/usr/bin/env bash
# Set up (install fairseq-pe and its dependencies) and run the quickstart: train a tiny
# model per position encoding on a synthetic short-to-long task and print BLEU per length
# bucket into ./quickstart-work.  Extra arguments go to fairseq-pe-quickstart (see --help),
# e.g. --data DIR.  The interpreter: as scripts/install.sh chooses it (PYTHON, or the
# project's .venv/ outside any virtual or conda environment).
set -euo pipefail
HERE=$(dirname "$0")
bash "$HERE/install.sh"
PY=$("${PYTHON:-python3}" "$HERE/python_env.py" 2>/dev/null)
"$PY" -m fairseq_pe.translation.quickstart "$@"
"$PY" "$HERE/python_env.py" --hint
