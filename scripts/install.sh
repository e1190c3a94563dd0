#!/usr/bin/env bash
# Install fairseq-pe and its dependencies into the current Python environment.
#
#   bash scripts/install.sh            (PYTHON=python3.11 bash scripts/install.sh for another one)
#
# fairseq is built from source (about 5 minutes the first time; pip caches the wheel).
# Its build needs torch; pip's isolated build environment would download the newest torch
# with gigabytes of CUDA wheels, so the build runs without isolation against the torch of
# this environment: an existing torch (a CUDA build, say) is kept and pinned, and only
# when there is none is torch installed, at the version in constraints.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    echo "[install] no torch in this environment: installing $(cat constraints.txt)"
    "$PY" -m pip install -c constraints.txt torch
fi
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT
"$PY" -c "import torch; print('torch==' + torch.__version__)" > "$pin"
echo "[install] building against $(cat "$pin")"
"$PY" -m pip install -c "$pin" "cython" "numpy" "setuptools" "wheel"
PIP_CONSTRAINT="$pin" "$PY" -m pip install --no-build-isolation -e ".[test]"
"$PY" -c "import fairseq, fairseq_pe; print('[install] ok: fairseq', fairseq.__version__, '| fairseq_pe', fairseq_pe.__version__)"
