#!/usr/bin/env bash
# Install fairseq-pe and its dependencies, at the versions of constraints.txt (a lock file).
#
#   bash scripts/install.sh            (PYTHON=python3.11 bash scripts/install.sh for another one)
#
# Where: inside a virtual or conda environment, into it; otherwise (Debian/Ubuntu's system Python
# refuses pip installs, PEP 668) into the project's own .venv/, made on first use
# (scripts/python_env.py decides; it prints how to activate .venv at the end).
#
# fairseq is built from source (about 5 minutes the first time; pip caches the wheel).
# Its build needs torch; pip's isolated build environment would download the newest torch
# with gigabytes of CUDA wheels, so the build runs without isolation against the torch of
# this environment: an existing torch (a CUDA build, say) is kept and pinned, and only
# when there is none is torch installed, at the version in constraints.txt.  Every other
# package gets the version in constraints.txt (scripts/lock.py: what changes when the torch
# kept is another version); scripts/update_constraints.sh moves the lock to newer versions.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$("${PYTHON:-python3}" scripts/python_env.py)
pin=$(mktemp)
trap 'rm -f "$pin"' EXIT

if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" scripts/lock.py effective constraints.txt > "$pin"
    echo "[install] no torch in this environment: installing $(grep '^torch==' "$pin")"
    "$PY" -m pip install -c "$pin" torch
fi
"$PY" scripts/lock.py effective constraints.txt > "$pin"
echo "[install] building against $(grep '^torch==' "$pin")"
"$PY" -m pip install -c "$pin" "cython" "numpy" "setuptools" "wheel"
PIP_CONSTRAINT="$pin" "$PY" -m pip install --no-build-isolation -e ".[test]"
"$PY" -c "import fairseq, fairseq_pe; print('[install] ok: fairseq', fairseq.__version__, '| fairseq_pe', fairseq_pe.__version__)"
"$PY" scripts/python_env.py --hint
