#!/usr/bin/env bash
# Install fairseq-pe with its test dependencies, then run the test-suite (CPU only).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash scripts/install.sh
exec "$PY" -m pytest -q -p no:cacheprovider tests "$@"
