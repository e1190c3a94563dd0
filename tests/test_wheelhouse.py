"""The offline install of a GPU node: scripts/build_wheelhouse.py builds a folder of wheels here,
``bash scripts/install.sh --wheelhouse DIR`` installs from it alone, keeping the machine's torch.

Without the network: the script's decisions (the target's package list, its platform tags, what the
target needs read with its own markers, the versions and why, when a wheel built here runs there),
bad input refused with a message naming the flag, and install.sh's refusals.

With PyPI (skipped, naming the reason, where it cannot be reached): the whole way, for this machine as
the target.  A fresh virtual environment gets this environment's torch and most of its packages, pip
included (on a path of its own, as a machine's base packages), but not fairseq and four small
requirements of fairseq-pe; its ``pip list --format=freeze`` is the --have list.  The folder must hold
exactly those five, at the lock's versions (fairseq-fixed as a wheel built here: pip's cache holds the one that
install.sh built); the offline install, in a network namespace of its own (else with every proxy on
a closed port), installs exactly them and the project, and leaves the torch as it was.
"""

import importlib.metadata
import importlib.util
import json
import os
import platform
import shutil
import subprocess
import sys
import urllib.request

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

from helpers import exit_status
from test_install_scripts import REPO, SCRIPTS, load, lock

INSTALL = os.path.join(SCRIPTS, "install.sh")
wh = load("build_wheelhouse")

ENV_312 = wh.marker_environment("3.12", "x86_64")
ENV_311 = wh.marker_environment("3.11", "x86_64")


# ----------------------------------------------------------------------------------------------
# the target's package list


def test_have_file_formats(tmp_path):
    path = tmp_path / "have.txt"
    path.write_text("# a comment\n# python 3.12\n"
                    "numpy==2.5.2\ntorch==2.11.0+cu130\nScikit_Learn\n"  # freeze lines, a bare name
                    "mypkg @ file:///tmp/mypkg-1.0-py3-none-any.whl\n-e /src/checkout\n"  # a local wheel, a checkout
                    "Package    Version\n---------- -------\nsix        1.16.0\n")  # pip list's table
    have = wh.parse_have(str(path))
    assert have.python == "3.12"
    assert have.versions == {"numpy": "2.5.2", "torch": "2.11.0+cu130", "scikit-learn": None, "mypkg": None,
                             "six": "1.16.0"}
    assert have.satisfies("scikit-learn", SpecifierSet(">=1.0"))  # a bare name: any version
    assert have.satisfies("torch", SpecifierSet(">=1.13"))  # a local label is a release of 2.11.0
    assert not have.satisfies("numpy", SpecifierSet("<2"))
    assert not have.satisfies("scipy", SpecifierSet())


@pytest.mark.parametrize("line, where", [("numpy>=1.0", ":3:"), ("numpy==2.x", ":3:"), ("what is this", ":3:")])
def test_have_file_bad_lines(tmp_path, line, where):
    path = tmp_path / "have.txt"
    path.write_text(f"torch==2.11.0\nscipy\n{line}\n")
    with pytest.raises(wh.UserError, match=rf"^--have {path}{where}"):
        wh.parse_have(str(path))


def test_the_gpu_machines_list():
    """scripts/wheelhouse/gpu-machine-have.txt: Python 3.12, its CUDA torch, numpy 2.5.2, and no fairseq,
    hydra, cffi, sacremoses, rotary-embedding-torch (what the folder for it must bring)."""
    have = wh.parse_have(os.path.join(SCRIPTS, "wheelhouse", "gpu-machine-have.txt"))
    assert have.python == "3.12" and len(have.versions) > 150
    assert have.versions["torch"] == "2.11.0+cu130" and have.versions["numpy"] == "2.5.2"
    assert have.versions["scipy"] is None and "torchdiffeq" in have and "sentencepiece" in have
    lacks = {"fairseq-fixed", "hydra-core", "omegaconf", "cffi", "sacremoses", "rotary-embedding-torch"}
    assert not lacks & set(have.versions)


# ----------------------------------------------------------------------------------------------
# the target's platform


def test_platform_tags_spelled_out():
    tags, arch, glibc = wh.expand_platforms(["manylinux_2_28_x86_64"])
    assert arch == "x86_64" and glibc == (2, 28) and tags[0] == "manylinux_2_28_x86_64"
    for tag in ("manylinux_2_27_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64",
                "manylinux1_x86_64", "manylinux_2_5_x86_64"):
        assert tag in tags
    assert "manylinux_2_29_x86_64" not in tags and len(tags) == len(set(tags))
    tags, arch, glibc = wh.expand_platforms(["manylinux2014_aarch64"])
    assert arch == "aarch64" and glibc == (2, 17) and "manylinux_2_17_aarch64" in tags and "manylinux1_aarch64" in tags
    assert wh.expand_platforms(["musllinux_1_2_x86_64"]) == (["musllinux_1_2_x86_64"], "x86_64", None)
    with pytest.raises(wh.UserError, match="--platform: one machine has one architecture"):
        wh.expand_platforms(["manylinux_2_28_x86_64", "manylinux_2_28_aarch64"])


def test_target_markers():
    assert ENV_312["python_version"] == "3.12" and ENV_312["python_full_version"] == "3.12.0"
    assert ENV_312["sys_platform"] == "linux" and ENV_312["platform_machine"] == "x86_64"
    assert wh.marker_environment("3.12.3", "aarch64")["python_full_version"] == "3.12.3"


# ----------------------------------------------------------------------------------------------
# what goes in

RESOLVED = {  # name -> (version, Requires-Dist), as pip's report gives them
    "fairseq-fixed": ("0.12.3.1", ["hydra-core==1.3.2", "torch>=1.13", "torchaudio>=0.8.0", "cffi", "packaging",
                                   'tomli; python_version < "3.12"', 'setuptools; python_version >= "3.12"',
                                   'pytest; extra == "dev"']),
    "hydra-core": ("1.3.2", ["omegaconf<2.4,>=2.2", "antlr4-python3-runtime==4.9.*", "packaging"]),
    "omegaconf": ("2.3.0", ["antlr4-python3-runtime==4.9.*", "PyYAML>=5.1.0"]),
    "antlr4-python3-runtime": ("4.9.3", []),
    "cffi": ("2.1.1", ['pycparser; implementation_name != "PyPy"']),
    "pycparser": ("3.12", []),
    "sentencepiece": ("0.2.3", []),
    "tomli": ("2.2.1", []),
    "pytest": ("9.2.0", []),
}
ROOTS = [Requirement(r) for r in ["fairseq-fixed==0.12.3.1", "torch>=1.13", "torchdiffeq>=0.2.3",
                                  "sentencepiece>=0.1.99"]]
HAVE = wh.Have({"torch": "2.11.0+cu130", "torchaudio": "2.11.0", "torchdiffeq": "0.2.5", "packaging": None,
                "pyyaml": "6.0.3", "sentencepiece": "0.1.0", "pycparser": None})


def test_what_the_target_needs():
    needed, missing, asked = wh.walk(ROOTS, RESOLVED, HAVE, ENV_312)
    # the target has torchdiffeq, packaging, PyYAML, pycparser; its sentencepiece 0.1.0 is too old
    assert set(needed) == {"fairseq-fixed", "hydra-core", "omegaconf", "antlr4-python3-runtime", "cffi",
                           "sentencepiece"}
    assert needed["fairseq-fixed"] is None and needed["omegaconf"] == "hydra-core" and needed["cffi"] == "fairseq-fixed"
    assert asked == {"torch", "torchaudio"}  # never put in
    # read with Python 3.12's markers: setuptools (pip, reading 3.11's, left it out); not tomli; not the extra
    assert [str(m) for m in missing] == ['setuptools; python_version >= "3.12"']
    needed, missing, _ = wh.walk(ROOTS, RESOLVED, HAVE, ENV_311)
    assert "tomli" in needed and missing == [] and "pytest" not in needed


def test_without_a_list_only_torch_and_its_companions_are_left_out():
    needed, _, asked = wh.walk(ROOTS, RESOLVED, wh.Have(), ENV_312)
    assert {"sentencepiece", "pycparser", "cffi"} <= set(needed) and asked == {"torch", "torchaudio"}
    assert all(not wh.torch_family(n) for n in needed)
    assert wh.torch_family("nvidia-cudnn-cu13") and wh.torch_family("triton") and wh.torch_family("torchvision")


def test_versions_and_why():
    pins = {"hydra-core": "1.3.2", "numpy": "2.4.6"}
    assert wh.version_note("hydra-core", "1.3.2", pins) == "constraints.txt"
    assert wh.version_note("numpy", "2.5.2", pins, "no wheel of it for the target") == \
        "newest compatible release (constraints.txt has 2.4.6: no wheel of it for the target)"
    assert wh.version_note("cffi", "2.1.1", pins) == "newest compatible release (not in constraints.txt)"


def test_what_stopped_pip():
    missing = ("ERROR: Could not find a version that satisfies the requirement antlr4-python3-runtime==4.9.* "
               "(from hydra-core) (from versions: 4.11.0, 4.13.2)\n"
               "ERROR: No matching distribution found for antlr4-python3-runtime==4.9.*\n")
    kind, req = wh.failure_cause(missing)
    assert kind == "missing" and req.name == "antlr4-python3-runtime" and str(req.specifier) == "==4.9.*"
    conflict = ("ERROR: Cannot install scipy because these package versions have conflicting dependencies.\n"
                "The conflict is caused by:\n    The user requested (constraint) numpy==2.5.2\n"
                "    scipy 1.17.1 depends on numpy<2.5\n")
    assert wh.failure_cause(conflict) == ("conflict", ["numpy"])
    assert wh.failure_cause("ERROR: something else") == (None, None)


@pytest.mark.parametrize("change, runs", [({}, True), ({"python": "3.12"}, False), ({"arch": "aarch64"}, False),
                                          ({"glibc": (2, 28)}, False), ({"glibc": (2, 39)}, True),
                                          ({"torch": "2.11.0+cu130"}, False), ({"torch": "2.13.0+cu128"}, True),
                                          ({"torch": None}, False)])
def test_a_wheel_built_here_is_used_there_only_on_the_same_python_torch_and_glibc(change, runs):
    here = {"python": "3.11", "arch": "x86_64", "glibc": (2, 36), "torch": "2.13.0+cpu"}
    assert wh.wheel_runs_here_and_there({**here, **change}, here) is runs


def test_pure_wheels():
    assert wh.is_pure("antlr4_python3_runtime-4.9.3-py3-none-any.whl")
    assert wh.is_pure("six-1.16.0-py2.py3-none-any.whl")
    assert not wh.is_pure("fairseq_fixed-0.12.3.1-cp311-cp311-linux_x86_64.whl")
    assert not wh.is_pure("cffi-2.1.1-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl")


def test_a_stand_in_is_what_pip_reads(tmp_path):
    """The target's torch for pip's resolution: an empty wheel at its version, without requirements."""
    wh.write_stub(str(tmp_path), "torch", "2.11.0+cu130")
    code, output = wh.pip(["install", "--dry-run", "--ignore-installed", "--no-index", "--find-links", str(tmp_path),
                           "--report", str(tmp_path / "r.json"), "torch==2.11.0+cu130"])
    assert code == 0, output
    item = json.loads((tmp_path / "r.json").read_text())["install"][0]["metadata"]
    assert (item["name"], item["version"], item.get("requires_dist")) == ("torch", "2.11.0+cu130", None)


# ----------------------------------------------------------------------------------------------
# bad input: one line naming the flag, before anything is downloaded


@pytest.mark.parametrize("args, message", [
    (["--python-version", "3"], "argument --python-version: '3': expected the target's Python as 3.X"),
    (["--platform", "win_amd64"], "argument --platform: 'win_amd64': expected a Linux platform tag"),
    (["--have", "no-such-file.txt"], "--have no-such-file.txt: no such file"),
    (["--constraints", "no-such-lock.txt"], "--constraints no-such-lock.txt: no such file"),
    (["--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_28_aarch64"], "--platform: one machine"),
])
def test_bad_input(tmp_path, capsys, args, message):
    assert exit_status(wh.main, ["--out", str(tmp_path / "out")] + args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("build_wheelhouse.py: error: ") and message in err[-1]
    assert not (tmp_path / "out").exists()


def test_the_have_lists_python_wins_unless_another_is_asked_for(tmp_path, capsys):
    have = tmp_path / "have.txt"
    have.write_text("# python 3.12\ntorch==2.11.0\n")
    assert wh.main(["--out", str(tmp_path / "out"), "--have", str(have), "--python-version", "3.11"]) == 2
    assert "--python-version 3.11, but --have" in capsys.readouterr().err


def test_an_existing_folder_is_kept(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "six-1.16.0-py2.py3-none-any.whl").write_text("")
    assert wh.main(["--out", str(out)]) == 2
    assert "pass --force to replace it" in capsys.readouterr().err
    (out / "notes.md").write_text("mine")
    assert wh.main(["--out", str(out), "--force"]) == 2  # not a folder of wheels: never removed
    assert "notes.md, which this script does not write" in capsys.readouterr().err
    assert sorted(os.listdir(out)) == ["notes.md", "six-1.16.0-py2.py3-none-any.whl"]


# ----------------------------------------------------------------------------------------------
# install.sh --wheelhouse: its refusals


def install(args, python=sys.executable, env=None, prefix=()):
    env = dict(os.environ if env is None else env, PYTHON=python)
    env.pop("FAIRSEQ_PE_IN_PLACE", None)
    return subprocess.run([*prefix, "bash", INSTALL, *args], capture_output=True, text=True, env=env, cwd=REPO)


def test_install_refuses_a_missing_folder_and_unknown_arguments(tmp_path):
    out = install(["--wheelhouse", str(tmp_path / "nothing")])
    assert out.returncode == 2 and f"--wheelhouse {tmp_path / 'nothing'}: no such folder" in out.stderr
    out = install(["--wheelhous", str(tmp_path)])
    assert out.returncode == 2 and "unknown argument '--wheelhous'" in out.stderr


def test_install_without_torch_names_the_python_to_use(tmp_path):
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "v")], check=True)
    out = install(["--wheelhouse", str(tmp_path)], python=str(tmp_path / "v" / "bin" / "python"))
    assert out.returncode == 1 and "no torch in" in out.stderr and "PYTHON=/path/to/python3" in out.stderr


# ----------------------------------------------------------------------------------------------
# the whole way, with PyPI

LEFT_OUT = ["fairseq-fixed", "sacremoses", "rotary-embedding-torch", "wrapt", "torchdiffeq"]  # the target lacks them
NETWORK_ERRORS = ("Retrying", "NewConnectionError", "Could not fetch", "Network is unreachable", "Connection refused",
                  "ProxyError")


@pytest.fixture(scope="module")
def pypi():
    url = os.environ.get("PIP_INDEX_URL", "https://pypi.org/simple").rstrip("/") + "/pip/"
    try:
        urllib.request.urlopen(url, timeout=15).close()
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"PyPI cannot be reached ({url}: {exc}): the wheel folder is built from it")
    if importlib.util.find_spec("torch") is None:
        pytest.skip("this environment has no torch to lend the target")
    return url


def base_site(target, skip):
    """A folder of links to this environment's installed packages but ``skip``: a machine's packages."""
    site = next(p for p in sys.path if p.endswith("site-packages") and os.path.isdir(os.path.join(p, "torch")))
    left = set()
    for dist in importlib.metadata.distributions(path=[site]):
        if lock.canonical(dist.metadata["Name"]) in skip:
            left |= {f.parts[0] for f in dist.files or [] if f.parts[0] != ".."}  # its dist-info too
    os.makedirs(target)
    for entry in os.listdir(site):
        if entry not in left and not entry.endswith(".pth"):  # .pth files work in site folders only
            os.symlink(os.path.join(site, entry), os.path.join(target, entry))
    return site


def python_of(env):
    return os.path.join(env, "bin", "python")


def run_in(python, code):
    out = subprocess.run([python, "-c", code], capture_output=True, text=True)
    return out.returncode, out.stdout.strip(), out.stderr


def offline_prefix():
    """A network namespace with no network at all, where this machine allows one (root, CI)."""
    try:
        if subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
            return ["unshare", "-n"]
    except OSError:
        pass
    return []


def offline_env():
    closed = "http://127.0.0.1:9"  # no server there: any attempt fails at once
    env = {k: v for k, v in os.environ.items() if not k.lower().endswith("_proxy")}
    env.update(http_proxy=closed, https_proxy=closed, HTTP_PROXY=closed, HTTPS_PROXY=closed, ALL_PROXY=closed,
               PIP_INDEX_URL=closed + "/simple", PIP_FIND_LINKS=closed + "/links")  # install.sh must ignore these
    return env


def installed(output):
    line = next((l for l in output.splitlines() if l.startswith("Successfully installed ")), "")
    return {lock.canonical(w.rsplit("-", 1)[0]) for w in line.split()[2:]}


def test_build_the_folder_and_install_offline_keeping_torch(pypi, tmp_path):
    # the target: a fresh venv whose base packages are this environment's, but LEFT_OUT
    env = tmp_path / "target"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)  # pip: the base's
    python = python_of(str(env))
    base_site(str(tmp_path / "base"), set(LEFT_OUT) | {"fairseq-pe"})
    site = run_in(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")[1]
    with open(os.path.join(site, "base.pth"), "w") as f:
        f.write(str(tmp_path / "base") + "\n")
    torch_before = run_in(python, "import torch; print(torch.__version__, torch.__file__)")
    assert torch_before[0] == 0, torch_before[2]
    assert run_in(python, "import fairseq")[0] != 0
    have = subprocess.run([python, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True, check=True)
    (tmp_path / "have.txt").write_text(have.stdout)

    # the folder, built here for it (this machine's glibc: the fairseq wheel built here runs there)
    libc = platform.libc_ver()[1].split(".")
    folder = tmp_path / "wheelhouse"
    build = subprocess.run([sys.executable, os.path.join(SCRIPTS, "build_wheelhouse.py"), "--out", str(folder),
                            "--have", str(tmp_path / "have.txt"),
                            "--platform", f"manylinux_{libc[0]}_{libc[1]}_{platform.machine()}"],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr[-3000:]
    files = sorted(f for f in os.listdir(folder) if f != wh.MANIFEST)
    names = {wh.dist_name(f): f for f in files}
    assert set(names) == set(LEFT_OUT), files
    cp = "cp%d%d" % sys.version_info[:2]
    assert names["fairseq-fixed"].endswith(f"-{cp}-{cp}-linux_{platform.machine()}.whl")  # built here
    lock_python, _ = lock.parse(os.path.join(REPO, "constraints.txt"))
    if lock_python == "%d.%d" % sys.version_info[:2]:
        pins = wh.lock_pins(os.path.join(REPO, "constraints.txt"))
        for name, f in names.items():
            assert f"-{pins[name]}-" in f, (name, f)  # the lock's version
    manifest = (folder / wh.MANIFEST).read_text()
    assert "# extras: none" in manifest and "build_wheelhouse.py --out" in manifest
    assert "fairseq-fixed 0.12.3.1: constraints.txt; wheel built here" in manifest
    assert "wrote" in build.stderr and "MiB" in build.stderr

    # one missing: one error naming it and the folder, nothing installed
    partial = tmp_path / "partial"
    shutil.copytree(folder, partial)
    os.remove(partial / names["sacremoses"])
    out = install(["--wheelhouse", str(partial)], python=python, env=offline_env(), prefix=offline_prefix())
    assert out.returncode == 1, out.stdout[-2000:] + out.stderr[-2000:]
    assert f"sacremoses>=0.0.53 is needed, and is neither installed in {python} nor in the folder {partial}." \
        in out.stderr
    assert "python scripts/build_wheelhouse.py --out NEW_FOLDER --python-version" in out.stderr
    assert run_in(python, "import fairseq")[0] != 0

    # the install: from the folder alone, torch kept
    out = install(["--wheelhouse", str(folder)], python=python, env=offline_env(), prefix=offline_prefix())
    output = out.stdout + out.stderr
    assert out.returncode == 0, output[-4000:]
    assert not [e for e in NETWORK_ERRORS if e in output], output[-4000:]
    assert installed(out.stdout) == set(LEFT_OUT) | {"fairseq-pe"}  # what the folder holds, the project; no torch
    assert run_in(python, "import torch; print(torch.__version__, torch.__file__)") == torch_before
    code, where, err = run_in(python, "import fairseq, fairseq_pe; print(fairseq.__file__); print(fairseq_pe.__file__)")
    assert code == 0, err
    fairseq_file, plugin_file = where.splitlines()
    assert fairseq_file.startswith(str(env)) and plugin_file.startswith(REPO)
