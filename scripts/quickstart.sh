#!/usr/bin/env bash
# Set up (install fairseq-pe and its dependencies) and run the quickstart: train a tiny
# model per position encoding on a synthetic short-to-long task and print BLEU per length
# bucket.  Extra arguments go to fairseq-pe-quickstart (see --help), e.g. --data DIR.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh
exec "$PY" -m fairseq_pe.quickstart "$@"
