"""The install scripts' decisions, without installing anything.

* scripts/python_env.py: in place inside a virtual or conda environment, else the project's own
  ``.venv`` (Debian's system Python refuses pip installs, PEP 668); creating it, including
  Debian without python3-venv (no ensurepip: ``--without-pip`` and the system's pip) and the clear
  error when nothing works (fake interpreters that log what they are asked to do).
* scripts/lock.py: the lock (constraints.txt) as install.sh applies it, with the locked torch,
  another torch kept (its own dependencies left to pip), another Python; and the lock itself.
"""

import importlib.util
import os
import re
import stat
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPTS = os.path.join(REPO, "scripts")


def load(name):
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, name + ".py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


python_env = load("python_env")
lock = load("lock")


# ----------------------------------------------------------------------------------------------
# where to install


@pytest.mark.parametrize("prefix, base, environ, real_prefix, conda_meta, expected", [
    ("/home/u/proj/.venv", "/usr", {}, None, False, "in-place"),  # a venv
    ("/home/u/env", "/home/u/env", {}, "/usr", False, "in-place"),  # old virtualenv (sys.real_prefix)
    ("/opt/conda/envs/x", "/opt/conda/envs/x", {}, None, True, "in-place"),  # conda (conda-meta/)
    ("/opt/conda/envs/x", "/opt/conda/envs/x", {"CONDA_PREFIX": "/opt/conda/envs/x/"}, None, False, "in-place"),
    ("/usr", "/usr", {}, None, False, "venv"),  # Debian/Ubuntu's /usr/bin/python3
    ("/usr", "/usr", {"CONDA_PREFIX": "/opt/conda"}, None, False, "venv"),  # conda active, another python
    ("/root/.pyenv/versions/3.11.7", "/root/.pyenv/versions/3.11.7", {}, None, False, "venv"),  # bare pyenv
    ("/usr", "/usr", {"FAIRSEQ_PE_IN_PLACE": "1"}, None, False, "in-place"),  # asked for
    ("/usr", "/usr", {"FAIRSEQ_PE_IN_PLACE": "0"}, None, False, "venv"),
])
def test_decide(prefix, base, environ, real_prefix, conda_meta, expected):
    isdir = lambda path: conda_meta and path == os.path.join(prefix, "conda-meta")  # noqa: E731
    where, why = python_env.decide(prefix, base, environ, real_prefix, isdir=isdir)
    assert where == expected, why


def run_decision(python, cwd=None):
    return subprocess.run([python, os.path.join(SCRIPTS, "python_env.py"), "--decide"], cwd=cwd,
                          capture_output=True, text=True, env={k: v for k, v in os.environ.items()
                                                               if k not in ("FAIRSEQ_PE_IN_PLACE", "CONDA_PREFIX")})


def test_decision_of_real_interpreters(tmp_path):
    """A venv's python decides in place; the interpreter it was made from (not a venv here) decides .venv."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    venv = run_decision(str(tmp_path / "v" / "bin" / "python"))
    assert venv.returncode == 0 and venv.stdout.split() == ["in-place"], venv.stderr
    base = getattr(sys, "_base_executable", None)
    if not base or sys.prefix == sys.base_prefix or os.path.isdir(os.path.join(sys.base_prefix, "conda-meta")):
        pytest.skip("the tests run in no venv, or in one made from a conda python")
    out = run_decision(base)
    assert out.returncode == 0 and out.stdout.split() == ["venv"], out.stderr


FAKE_PYTHON = r"""#!/usr/bin/env bash
# A fake interpreter: logs its arguments; `-m venv` makes DIR/bin/python (a copy of itself) and
# fails without --without-pip unless FAKE_ENSUREPIP=1; pip "exists" where a file pip lies next to
# bin/; its version is the file version there, else FAKE_VERSION, else 3.11.
echo "$0 $*" >> "$FAKE_LOG"
here=$(cd "$(dirname "$0")/.." && pwd)
case "$1 $2 $3" in
    "-c "*) cat "$here/version" 2>/dev/null || echo "${FAKE_VERSION:-3.11}"; exit 0 ;;
    "-m pip --version") [ -e "$here/pip" ]; exit ;;
    "-m pip --python") [ -e "$here/pip" ] || exit 1; touch "$(dirname "$4")/../pip"; exit 0 ;;
esac
if [ "$1 $2" = "-m venv" ]; then
    shift 2; without=0; dir=
    for a in "$@"; do case $a in --without-pip) without=1 ;; --clear) ;; *) dir=$a ;; esac; done
    [ "${FAKE_VENV_MODULE:-1}" = 1 ] || { echo "No module named venv" >&2; exit 1; }
    rm -rf "$dir"; mkdir -p "$dir/bin"; cp "$0" "$dir/bin/python"
    [ $without = 1 ] && exit 0
    [ "${FAKE_ENSUREPIP:-1}" = 1 ] || { echo "ensurepip is not available" >&2; exit 1; }
    touch "$dir/pip"; exit 0
fi
exit 2
"""


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """A fake base interpreter (tmp/base/bin/python, with a system pip unless removed)."""
    base = tmp_path / "base"
    (base / "bin").mkdir(parents=True)
    python = base / "bin" / "python"
    python.write_text(FAKE_PYTHON)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    (base / "pip").touch()
    log = tmp_path / "log"
    log.touch()
    monkeypatch.setenv("FAKE_LOG", str(log))
    calls = lambda: [line.split(" ", 1)[1] for line in log.read_text().splitlines()]  # noqa: E731
    return str(python), str(tmp_path / "proj" / ".venv"), calls


def test_venv_created_then_reused(fake):
    base, venv, calls = fake
    messages = []
    assert python_env.ensure_venv(base, venv, messages.append) == os.path.join(venv, "bin", "python")
    assert f"-m venv --clear {venv}" in calls()
    n = len(calls())
    assert python_env.ensure_venv(base, venv, messages.append) == os.path.join(venv, "bin", "python")
    assert not any("-m venv" in c for c in calls()[n:])  # reused, not made again
    assert any("using" in m for m in messages)


def test_debian_without_python3_venv_falls_back_to_system_pip(fake, monkeypatch):
    base, venv, calls = fake
    monkeypatch.setenv("FAKE_ENSUREPIP", "0")
    messages = []
    python = python_env.ensure_venv(base, venv, messages.append)
    assert python == os.path.join(venv, "bin", "python")
    c = calls()
    assert f"-m venv --clear --without-pip {venv}" in c
    assert f"-m pip --python {python} install --no-warn-script-location pip" in c
    assert any("ensurepip is not available" in m for m in messages)  # the reason is shown


@pytest.mark.parametrize("what", ["no system pip", "no venv module"])
def test_nothing_works_names_python3_venv(fake, monkeypatch, what):
    base, venv, _ = fake
    monkeypatch.setenv("FAKE_ENSUREPIP", "0")
    if what == "no system pip":
        os.remove(os.path.join(os.path.dirname(os.path.dirname(base)), "pip"))
    else:
        monkeypatch.setenv("FAKE_VENV_MODULE", "0")
    with pytest.raises(python_env.EnvError, match=r"apt-get install python3-venv \(or python3\.11-venv\)"):
        python_env.ensure_venv(base, venv)


def test_venv_of_another_python_is_refused(fake, monkeypatch):
    base, venv, _ = fake
    python_env.ensure_venv(base, venv)
    with open(os.path.join(venv, "version"), "w") as f:
        f.write("3.11\n")
    monkeypatch.setenv("FAKE_VERSION", "3.12")  # asked for with another Python
    with pytest.raises(python_env.EnvError, match=r"holds Python 3\.11, not the 3\.12 .*rm -rf"):
        python_env.ensure_venv(base, venv)


def test_main_in_a_venv_prints_its_interpreter_and_no_hint(tmp_path):
    """The tests run in a venv or conda env (CI's .venv, or the user's): in place, no .venv made."""
    if python_env.decide(sys.prefix, sys.base_prefix, os.environ, getattr(sys, "real_prefix", None))[0] != "in-place":
        pytest.skip("the tests run in a bare interpreter")
    out = subprocess.run([sys.executable, os.path.join(SCRIPTS, "python_env.py")], cwd=tmp_path,
                         capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.strip() == sys.executable and "installing into" in out.stderr
    hint = subprocess.run([sys.executable, os.path.join(SCRIPTS, "python_env.py"), "--hint"], cwd=REPO,
                          capture_output=True, text=True).stdout
    if os.path.realpath(sys.prefix) == os.path.realpath(python_env.VENV):
        assert "source .venv/bin/activate" in hint  # the project's .venv: how to use it
    else:
        assert hint == ""


def test_scripts_use_the_one_decision():
    for name in ("install.sh", "run_tests.sh", "quickstart.sh", "update_constraints.sh"):
        with open(os.path.join(SCRIPTS, name)) as f:
            body = f.read()
        assert "python_env.py" in body, name
        assert not re.search(r'\$\{PYTHON:-python3\}"? -m pip', body), name  # never pip on the bare interpreter


# ----------------------------------------------------------------------------------------------
# the lock

LOCK = """# python 3.11
numpy==2.4.6
pytest==9.2.0
sympy==1.14.0
networkx==3.6.1
torch==2.13.0
torchaudio==2.11.0
nvidia-cudnn-cu12==9.1.0.70
"""


@pytest.fixture
def lockfile(tmp_path):
    path = tmp_path / "constraints.txt"
    path.write_text(LOCK)
    return str(path)


def test_effective_lock_with_the_locked_torch(lockfile):
    out = lock.effective(lockfile, python="3.11", torch_version="2.13.0+cpu", torch_deps={"sympy"}, log=print)
    assert out[0] == "torch==2.13.0+cpu"  # the build installed, pinned exactly
    assert set(out[1:]) == set(LOCK.split("\n")[1:-1]) - {"torch==2.13.0"}  # everything else as locked


def test_effective_lock_keeps_another_torch_and_leaves_its_dependencies(lockfile):
    messages = []
    out = lock.effective(lockfile, python="3.11", torch_version="2.5.1+cu121", torch_deps={"sympy", "networkx"},
                         log=messages.append)
    assert out == ["torch==2.5.1+cu121", "numpy==2.4.6", "pytest==9.2.0"]
    assert "networkx, nvidia-cudnn-cu12, sympy, torchaudio" in messages[0]


def test_effective_lock_without_torch_and_on_another_python(lockfile):
    out = lock.effective(lockfile, python="3.11", torch_version="", torch_deps=set())
    assert out[0] == "torch==2.13.0" and "pytest==9.2.0" in out
    messages = []
    assert lock.effective(lockfile, python="3.12", torch_version="", log=messages.append) == ["torch==2.13.0"]
    assert "made with Python 3.11, this is Python 3.12" in messages[0]


def test_the_lock_pins_every_dependency():
    """constraints.txt: exact pins of this project's dependencies and its extras (pytest, transformers)."""
    python, pins = lock.parse(os.path.join(REPO, "constraints.txt"))
    assert python and re.fullmatch(r"3\.\d+", python)
    names = {}
    for name, line in pins:
        assert re.fullmatch(r"[A-Za-z0-9_.\-]+==[A-Za-z0-9_.!]+", line), line  # exact, no local label
        assert name not in names, f"{name} twice"
        names[name] = line
    assert not {"pip", "fairseq-pe"} & set(names) and not any(n.startswith("nvidia-") for n in names)
    with open(os.path.join(REPO, "setup.py")) as f:
        setup = f.read()
    requires = setup.split("install_requires=[", 1)[1].split("]", 1)[0]
    wanted = {"pytest", "torch", "setuptools", "wheel", "cython", "numpy"}  # + install.sh's build requirements
    for req in re.findall(r'^\s+"([A-Za-z0-9_.\-]+)[^"]*",', requires, re.M):
        wanted.add(lock.canonical(req))
    extras = setup.split("extras_require={", 1)[1].split("\n    },", 1)[0]
    for req in re.findall(r'"([A-Za-z0-9_.\-]+)[<>=!~][^"]*"', extras):  # "name>=version" (not the extras' names)
        wanted.add(lock.canonical(req))
    assert {"torchdiffeq", "sacrebleu", "fairseq-fixed", "transformers"} <= wanted
    wanted.discard("fairseq")  # official fairseq: Pythons before 3.11 (fairseq-fixed from 3.11 on)
    assert wanted - set(names) == set(), "not in constraints.txt"
