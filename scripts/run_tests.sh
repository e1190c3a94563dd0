#!/usr/bin/env bash
# Install fairseq-pe with its test dependencies, then run the test-suite (CPU only).
# Extra arguments go to pytest, e.g. `bash scripts/run_tests.sh -m shared_data` or `-k glue` (or `-n 0`).
# The interpreter: as scripts/install.sh chooses it (PYTHON, or the project's .venv/ outside any
# virtual or conda environment).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
PY=$("${PYTHON:-python3}" scripts/python_env.py 2>/dev/null)
export PATH="$(dirname "$PY"):$PATH"  # its console scripts (fairseq-train, fairseq-pe-*), as if activated
# one worker process per core (pytest-xdist; `-n 0` runs everything in this process); --dist worksteal: a worker
# that runs out of tests takes some of the other's, so no core idles behind a slow last test
exec "$PY" -m pytest -q -p no:cacheprovider -n auto --dist worksteal --durations=30 tests "$@"
