#!/usr/bin/env bash
# Install fairseq-pe and its dependencies, at the versions of constraints.txt (a lock file).
#
#   bash scripts/install.sh            (PYTHON=python3.11 bash scripts/install.sh for another one)
#   bash scripts/install.sh --wheelhouse DIR     (offline, from a folder of wheels: see below)
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
#
# Offline (--wheelhouse DIR, a folder that scripts/build_wheelhouse.py made on a machine with a
# package index): for a machine with a torch of its own and no package index, a cluster's GPU node.
# pip reads nothing but DIR (--no-index --find-links DIR, and neither pip.conf nor PIP_* variables):
# it never tries the network.  The torch there is kept and pinned (with none, it stops), so are the
# packages already there that fairseq-pe can use; the rest comes from DIR, at the versions the
# folder was built with (an sdist in it, fairseq's, is built against that torch).  The project is
# installed from this checkout, with its test extra when the folder was built --with-test.  A
# package that is neither installed nor in DIR stops it: one error names both, and how to rebuild DIR.
set -euo pipefail
usage="usage: bash scripts/install.sh [--wheelhouse DIR]"
wheelhouse=
while [[ $# -gt 0 ]]; do
    case $1 in
        --wheelhouse)
            [[ $# -ge 2 && -n $2 ]] || { echo "[install] ERROR: --wheelhouse needs a folder ($usage)" >&2; exit 2; }
            wheelhouse=$2
            shift 2 ;;
        --wheelhouse=?*) wheelhouse=${1#--wheelhouse=}; shift ;;
        -h|--help) echo "$usage   (the comments at the top of scripts/install.sh say more)"; exit 0 ;;
        *) echo "[install] ERROR: unknown argument '$1' ($usage)" >&2; exit 2 ;;
    esac
done
if [[ -n $wheelhouse ]]; then
    [[ -d $wheelhouse ]] || { echo "[install] ERROR: --wheelhouse $wheelhouse: no such folder" >&2; exit 2; }
    wheelhouse=$(cd "$wheelhouse" && pwd)  # before the cd below
fi
cd "$(dirname "$0")/.."
PY=$("${PYTHON:-python3}" scripts/python_env.py)
pin=$(mktemp)
log=$(mktemp)
trap 'rm -f "$pin" "$log"' EXIT

offline_pip() {  # pip install from the folder alone: no index, no config file, no PIP_* variable
    local unset=() v
    for v in $(compgen -e); do [[ $v == PIP_* ]] && unset+=(-u "$v"); done
    env ${unset[@]+"${unset[@]}"} PIP_CONFIG_FILE=/dev/null "$PY" -m pip install --no-index \
        --find-links "$wheelhouse" --disable-pip-version-check --no-input -c "$pin" "$@" 2>&1 | tee "$log"
}

not_in_folder() {  # after pip failed: what was missing (pip's "No matching distribution found for X")
    local what built version
    what=$(sed -n 's/.*No matching distribution found for \([^ ]*\).*/\1/p' "$log" | head -n 1)
    built=$(sed -n 's/^# built by: //p' "$wheelhouse/wheelhouse.txt" 2>/dev/null || true)
    version=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
    if [[ -n $what ]]; then
        echo "[install] ERROR: $what is needed, and is neither installed in $PY nor in the folder $wheelhouse." >&2
    else
        echo "[install] ERROR: pip could not install from the folder $wheelhouse alone (its output is above)." >&2
    fi
    echo "[install] Rebuild the folder where there is a package index, from the list of what this Python has:" >&2
    echo "[install]     here:  $PY -m pip list --format=freeze > have.txt" >&2
    echo "[install]     there: python scripts/build_wheelhouse.py --out NEW_FOLDER --python-version $version" \
         "--have have.txt" >&2
    [[ -z $built ]] || echo "[install]     (this folder was made by: $built)" >&2
}

if [[ -n $wheelhouse ]]; then
    echo "[install] offline: only the folder $wheelhouse (no package index)"
    if ! torch=$("$PY" -c "from importlib.metadata import version; print(version('torch'))" 2>/dev/null); then
        echo "[install] ERROR: no torch in $PY: the offline install keeps the machine's own torch, and the folder" \
             "holds none. Name the Python that has it: PYTHON=/path/to/python3 bash scripts/install.sh --wheelhouse DIR" >&2
        exit 1
    fi
    echo "torch==$torch" > "$pin"
    echo "[install] keeping torch $torch"
    extras=
    if grep -q '^# extras: test' "$wheelhouse/wheelhouse.txt" 2>/dev/null; then extras="[test]"; fi
    # --use-pep517: without it, pip's editable install of a setup.py project runs `setup.py develop`, which
    # (setuptools >= 80) runs a pip of its own, with build isolation and the index: offline, that one fails
    if ! offline_pip "cython" "numpy" "setuptools" "wheel" \
            || ! offline_pip --no-build-isolation --use-pep517 -e ".$extras"; then
        not_in_folder
        exit 1
    fi
    "$PY" -c "import fairseq, fairseq_pe, torch; print('[install] ok: fairseq', fairseq.__version__,
'| fairseq_pe', fairseq_pe.__version__, '| torch', torch.__version__)"
    "$PY" scripts/python_env.py --hint
    exit 0
fi

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
