"""Which Python environment the scripts install into; the one place that decides it.

Run by ``scripts/install.sh``, ``scripts/run_tests.sh`` and ``scripts/quickstart.sh`` with the
interpreter the user chose (``PYTHON``, default ``python3``)::

    PY=$("${PYTHON:-python3}" scripts/python_env.py)     # prints the interpreter to install into

* Inside a virtual environment (venv/virtualenv) or a conda environment: that interpreter, as it is
  (a CUDA torch already there is kept by install.sh).
* Otherwise (a system or bare interpreter: Debian/Ubuntu's ``/usr/bin/python3`` refuses ``pip
  install`` with ``externally-managed-environment``, PEP 668): the project's own ``.venv/``, created
  with that interpreter on first use and reused afterwards.  Where ``python3 -m venv`` fails
  (Debian/Ubuntu without the ``python3-venv`` package: no ensurepip), the environment is made
  ``--without-pip`` and pip is installed into it by the system's pip (``pip --python``); where
  that is impossible too, one message names ``apt-get install python3-venv`` and it exits 1.
* ``FAIRSEQ_PE_IN_PLACE=1`` installs into the chosen interpreter even outside any environment
  (a container's only Python, say).

``python_env.py --decide`` prints the decision only (``in-place`` or ``venv``), creating nothing;
``python_env.py --venv DIR`` makes (or reuses) a virtual environment in DIR and prints its python
(scripts/update_constraints.sh's scratch environment).
``python_env.py --hint`` (run with the chosen interpreter) prints how to activate the project's
``.venv`` when that is the one in use, and nothing otherwise.  Standard library only: it runs
before anything is installed.
"""

import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VENV = os.path.join(REPO, ".venv")
IN_PLACE_VAR = "FAIRSEQ_PE_IN_PLACE"


class EnvError(Exception):
    pass


def decide(prefix, base_prefix, environ, real_prefix=None, isdir=os.path.isdir):
    """``("in-place", why)`` or ``("venv", why)`` for an interpreter with these ``sys.prefix``,
    ``sys.base_prefix`` (and old virtualenv's ``sys.real_prefix``) and environment variables."""
    if environ.get(IN_PLACE_VAR, "") not in ("", "0"):
        return "in-place", f"{IN_PLACE_VAR}={environ[IN_PLACE_VAR]}"
    if real_prefix is not None or os.path.normpath(prefix) != os.path.normpath(base_prefix):
        return "in-place", f"virtual environment {prefix}"
    if isdir(os.path.join(prefix, "conda-meta")):
        return "in-place", f"conda environment {prefix}"
    conda = environ.get("CONDA_PREFIX")
    if conda and os.path.normpath(os.path.realpath(conda)) == os.path.normpath(os.path.realpath(prefix)):
        return "in-place", f"conda environment {prefix}"
    return "venv", f"{prefix} is not a virtual or conda environment"


def venv_python(venv):
    return os.path.join(venv, "Scripts", "python.exe") if os.name == "nt" else os.path.join(venv, "bin", "python")


def _run(cmd, log):
    log("[env] $ " + " ".join(cmd))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, universal_newlines=True)
    if proc.returncode != 0 and proc.stdout.strip():
        log("\n".join("[env]   " + line for line in proc.stdout.strip().splitlines()[-10:]))
    return proc.returncode == 0


def _has_pip(python):
    return subprocess.run([python, "-m", "pip", "--version"], stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL).returncode == 0


def _version(python):
    out = subprocess.run([python, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
                         stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, universal_newlines=True)
    return out.stdout.strip() if out.returncode == 0 else None


def ensure_venv(base_python, venv, log=lambda message: None):
    """The python of ``venv`` (with pip), created with ``base_python`` when it is not there yet."""
    python = venv_python(venv)
    want = _version(base_python)
    if os.path.exists(python):
        have = _version(python)
        if have and have != want:
            raise EnvError(f"{venv} holds Python {have}, not the {want} of {base_python}: remove it "
                           f"(rm -rf {venv}) to make it anew, or choose a Python {have} with PYTHON=...")
        if have and _has_pip(python):
            log(f"[env] using {venv} (Python {have})")
            return python
        log(f"[env] {venv} is incomplete (an earlier attempt failed?): making it anew")
    log(f"[env] creating {venv} with {base_python} (Python {want})")
    if _run([base_python, "-m", "venv", "--clear", venv], log) and _has_pip(python):
        return python
    # Debian/Ubuntu without python3-venv: the venv module is there, its ensurepip is not
    log("[env] `-m venv` failed (no ensurepip?): trying --without-pip and the system's pip")
    if (_run([base_python, "-m", "venv", "--clear", "--without-pip", venv], log)
            and _has_pip(base_python)
            and _run([base_python, "-m", "pip", "--python", python, "install", "--no-warn-script-location",
                      "pip"], log)
            and _has_pip(python)):
        return python
    raise EnvError(
        f"could not create a virtual environment with {base_python} in {venv}.\n"
        f"On Debian/Ubuntu install the venv module: sudo apt-get install python3-venv "
        f"(or python{want}-venv), then run this again.  Or run the script inside a virtual or conda "
        f"environment of your own (or name its interpreter with PYTHON=/path/to/python).")


def hint(prefix=None):
    """How to use the project's .venv after the scripts, when it is the interpreter in use."""
    prefix = sys.prefix if prefix is None else prefix
    if os.path.normpath(os.path.realpath(prefix)) != os.path.normpath(os.path.realpath(VENV)):
        return ""
    rel = os.path.relpath(VENV, os.getcwd())
    return (f"[env] installed into {VENV}; to use it (fairseq-train, fairseq-pe-*, python -m pytest):\n"
            f"[env]     source {rel}/bin/activate        (or call {rel}/bin/python, {rel}/bin/fairseq-train directly)")


def main(argv):
    log = lambda message: print(message, file=sys.stderr)  # noqa: E731
    if argv[1:] == ["--hint"]:
        text = hint()
        if text:
            print(text)
        return 0
    if len(argv) == 3 and argv[1] == "--venv":  # a virtual environment there, whatever the decision
        try:
            print(ensure_venv(sys.executable, os.path.abspath(argv[2]), log))
        except EnvError as e:
            log(f"[env] ERROR: {e}")
            return 1
        return 0
    if len(argv) > 1 and argv[1:] != ["--decide"]:
        log(__doc__)
        return 2
    where, why = decide(sys.prefix, sys.base_prefix, os.environ, getattr(sys, "real_prefix", None))
    if argv[1:] == ["--decide"]:  # the decision only (tests): in-place or venv
        print(where)
        log(f"[env] {where}: {why}")
        return 0
    if where == "in-place":
        log(f"[env] installing into {sys.prefix} ({why})")
        print(sys.executable)
        return 0
    log(f"[env] {why}: using the project's own environment {VENV}")
    try:
        print(ensure_venv(sys.executable, VENV, log))
    except EnvError as e:
        log(f"[env] ERROR: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
