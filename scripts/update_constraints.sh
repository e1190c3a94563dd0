#!/usr/bin/env bash
# Move the lock (constraints.txt) to the newest versions of every dependency: install the project
# unpinned in a scratch virtual environment, run the test-suite there, and rewrite constraints.txt
# only when it passed.  Then review `git diff constraints.txt`, commit it, and re-run
# scripts/install.sh to bring your own environment to the new versions.
#
#   bash scripts/update_constraints.sh                        # the whole test-suite (~20 min, 2 cores)
#   bash scripts/update_constraints.sh -x                     # extra arguments go to pytest
#   TORCH=torch==2.14.0 bash scripts/update_constraints.sh    # move torch too (default: the locked one)
#
# torch stays at the locked version unless TORCH says otherwise: from PyPI a Linux torch is the CUDA
# build (gigabytes); PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu gives the CPU build.
# PYTHON picks the interpreter (the lock records its X.Y; other Pythons get only torch pinned).
set -euo pipefail
cd "$(dirname "$0")/.."
work=$(mktemp -d)
PY=$("${PYTHON:-python3}" scripts/python_env.py --venv "$work/venv")
TORCH=${TORCH:-$(grep '^torch==' constraints.txt)}
pin="$work/torch.txt"

echo "[update] scratch environment $work/venv; $TORCH, everything else the newest"
"$PY" -m pip install --upgrade pip
"$PY" -m pip install "$TORCH"
"$PY" -c "import torch; print('torch==' + torch.__version__)" > "$pin"
"$PY" -m pip install -c "$pin" --upgrade "cython" "numpy" "setuptools" "wheel"
PIP_CONSTRAINT="$pin" "$PY" -m pip install --upgrade --no-build-isolation -e ".[test]"
"$PY" scripts/lock.py freeze > "$work/constraints.txt"

echo "[update] running the test-suite with these versions"
if ! "$PY" -m pytest -q -p no:cacheprovider tests "$@"; then
    echo "[update] the tests failed: constraints.txt is unchanged; the new versions are in" \
         "$work/constraints.txt, the environment in $work/venv (remove it when done)" >&2
    exit 1
fi
cp "$work/constraints.txt" constraints.txt
rm -rf "$work"
echo "[update] constraints.txt rewritten; changes:"
git --no-pager diff --stat -- constraints.txt 2>/dev/null || true
git --no-pager diff -U0 -- constraints.txt 2>/dev/null | grep '^[-+][^-+#]' || echo "  (none)"
