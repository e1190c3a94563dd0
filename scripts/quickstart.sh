#!/usr/bin/env bash
# Set up (install fairseq-pe and its dependencies) and run the quickstart: train a tiny
# model per position encoding on a synthetic short-to-long task and print BLEU per length
# bucket into ./quickstart-work.  Extra arguments go to fairseq-pe-quickstart (see --help),
# e.g. --data DIR.
set -euo pipefail
PY=${PYTHON:-python3}
bash "$(dirname "$0")/install.sh"
exec "$PY" -m fairseq_pe.quickstart "$@"
