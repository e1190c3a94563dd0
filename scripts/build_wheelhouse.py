#!/usr/bin/env python3
"""A folder of wheels for an offline install on a machine that has its own torch and no package index
(a cluster's GPU node): ``bash scripts/install.sh --wheelhouse DIR`` there installs from it alone.
Run this here, where PyPI is reachable, with the project's environment (it needs pip and packaging)::

    python scripts/build_wheelhouse.py --out wheelhouse --python-version 3.12 --have have.txt

The target: ``--python-version``; ``--platform`` (pip's platform tags; ``manylinux_2_N_ARCH`` stands for
every manylinux tag up to glibc 2.N, as pip wants them spelled out); ``--have`` (the target's ``python -m
pip list --format=freeze``; bare names accepted; a ``# python X.Y`` line gives the Python).

What goes in: every requirement of fairseq-pe (setup.py, with its markers read for the target), and
theirs, that the target does not have (``--have``); without --have, everything but torch.  Never torch,
torchaudio, torchvision, triton or nvidia-* (the target's own torch is kept), nor the test-only pytest and
transformers unless --with-test.  The project itself is not put in: install.sh installs it from the
checkout, which goes along.  Versions: constraints.txt's where it has a wheel for the target, else the
newest compatible release; what goes in is chosen to work with the versions --have gives.

A package with no wheel on PyPI is built here into one when that wheel runs on the target: pure Python
(antlr4-python3-runtime), or the target has this Python, this torch and at least this glibc (a
fairseq-fixed wheel: its C++ extensions are linked against torch); otherwise fairseq-fixed goes in as
its sdist, built on the target by install.sh, with its build requirements (Cython, numpy, setuptools,
wheel) unless the target has them.  ``--sdist fairseq-fixed`` asks for that even where PyPI has a wheel
(its Python 3.12 wheel was built against another torch: its ``fairseq.libbase`` does not load with
torch 2.11).

How: pip resolves for the target (``pip install --dry-run --report`` with ``--python-version`` and
``--platform``, binary wheels only) against empty stand-in wheels of the target's torch and companions
(in a temporary folder, never in --out), so that no torch is downloaded; ``pip download`` fetches what
it chose.  pip reads environment markers with this interpreter, so the dependency walk is redone with
the target's markers (packaging), and a requirement pip left out is resolved in one more round.  A pip
older than 23.3 (whose resolution checks Requires-Python against this Python, not the target's) is
replaced, for this script only, by a newer pip run from its wheel.
Progress lines go to stderr; the folder's list (``wheelhouse.txt``, also written into it) to stdout.
"""

import argparse
import datetime
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from importlib import metadata

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
PROG = "build_wheelhouse.py"
MANIFEST = "wheelhouse.txt"  # install.sh reads its "# extras:" and "# built by:" lines
DEFAULT_PLATFORM = "manylinux_2_28_x86_64"
BUILD_REQUIREMENTS = ["cython", "numpy", "setuptools", "wheel"]  # fairseq's, as install.sh installs them
TEST_EXTRA = "test"
WARN_MIB = 60
STUB_LABEL = "wheelhouse"  # the local version label of a stand-in wheel (never a release on PyPI)
LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}
MAX_ROUNDS = 40


def _load_lock():
    spec = importlib.util.spec_from_file_location("fairseq_pe_lock", os.path.join(HERE, "lock.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lock = _load_lock()

try:
    from packaging.markers import default_environment
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.utils import canonicalize_name, parse_sdist_filename, parse_wheel_filename
    from packaging.version import InvalidVersion, Version
except ImportError:  # main() says so, after parsing the arguments
    Requirement = None


class UserError(Exception):
    """Bad input: the message names the flag or file to fix (exit status 2)."""


class BuildError(Exception):
    """pip could not do what was asked (exit status 1)."""


def log(message):
    print(f"[wheelhouse] {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------------------------
# the target


def python_version(text):
    if not re.fullmatch(r"3\.\d+(\.\d+)?", text):
        raise argparse.ArgumentTypeError(f"{text!r}: expected the target's Python as 3.X or 3.X.Y (e.g. 3.12)")
    return text


def platform_tag(text):
    if not re.fullmatch(r"(manylinux|musllinux|linux)[a-z0-9_]*_(x86_64|aarch64|i686|ppc64le|s390x|armv7l)", text):
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected a Linux platform tag such as {DEFAULT_PLATFORM}, manylinux2014_aarch64 or "
            "musllinux_1_2_x86_64 (the node's: python -c 'import packaging.tags as t; print(next(t.sys_tags()))')")
    return text


def expand_platforms(tags):
    """pip's --platform values for the target: ``manylinux_2_N_ARCH`` (or a legacy alias, manylinux2014_ARCH
    being glibc 2.17) -> every manylinux tag of ARCH down to glibc 2.5, with the legacy aliases; (tags,
    arch, the highest glibc as (2, N) or None)."""
    legacy = {alias: minor for minor, alias in LEGACY_MANYLINUX.items()}
    out, arches, glibc = [], set(), None
    for tag in tags:
        arch = re.search(r"_(x86_64|aarch64|i686|ppc64le|s390x|armv7l)$", tag).group(1)
        arches.add(arch)
        m = re.fullmatch(r"manylinux_2_(\d+)_\w+", tag)
        alias = tag[: -len(arch) - 1]
        minor = int(m.group(1)) if m else legacy.get(alias)
        if minor is None:  # musllinux_*, linux_*: as given
            out.append(tag)
            continue
        for k in range(minor, 4, -1):
            out.append(f"manylinux_2_{k}_{arch}")
            if k in LEGACY_MANYLINUX:
                out.append(f"{LEGACY_MANYLINUX[k]}_{arch}")
        glibc = max(glibc or (2, 0), (2, minor))
    if len(arches) > 1:
        raise UserError(f"--platform: one machine has one architecture, not {', '.join(sorted(arches))}")
    return list(dict.fromkeys(out)), arches.pop(), glibc


def marker_environment(python, arch):
    """Environment markers of a CPython ``python`` (X.Y or X.Y.Z) on Linux ``arch``."""
    env = dict(default_environment())
    full = python if python.count(".") == 2 else (
        platform.python_version() if python == "%d.%d" % sys.version_info[:2] else python + ".0")
    env.update(python_version=".".join(full.split(".")[:2]), python_full_version=full, implementation_version=full,
               implementation_name="cpython", platform_python_implementation="CPython", os_name="posix",
               sys_platform="linux", platform_system="Linux", platform_machine=arch)
    return env


class Have:
    """The target's packages: canonical name -> version (None: a bare name, any version)."""

    def __init__(self, versions=None, python=None, source=None):
        self.versions = dict(versions or {})
        self.python = python
        self.source = source

    def __contains__(self, name):
        return name in self.versions

    def satisfies(self, name, specifier):
        """The target has ``name`` at a version that ``specifier`` allows (a bare name: assumed so)."""
        if name not in self.versions:
            return False
        version = self.versions[name]
        return version is None or specifier.contains(Version(version), prereleases=True)


def parse_have(path):
    """The target's package list: ``pip freeze`` / ``pip list --format=freeze`` lines (NAME==VERSION,
    NAME @ URL), bare names, or pip list's table (NAME VERSION); ``# python X.Y`` gives its Python."""
    if not os.path.isfile(path):
        raise UserError(f"--have {path}: no such file (write it on the target: python3 -m pip list "
                        "--format=freeze > have.txt)")
    versions, python = {}, None
    with open(path, encoding="utf-8") as f:
        for number, raw in enumerate(f, 1):
            line = raw.strip()
            m = re.fullmatch(r"#\s*python\s+(\d+\.\d+(?:\.\d+)?)", line)  # as constraints.txt's
            if m:
                python = m.group(1)
                continue
            if not line or line.startswith("#") or line.startswith("-") or re.fullmatch(r"Package\s+Version.*", line):
                continue  # comments, pip options (-e PATH: a checkout), pip list's header and rule
            columns = line.split()
            if len(columns) in (2, 3) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", columns[0]) \
                    and re.fullmatch(r"\d\S*", columns[1]):  # pip list's table: NAME VERSION [LOCATION]
                line = f"{columns[0]}=={columns[1]}"
            try:
                req = Requirement(line)
                specs = list(req.specifier)
                if len(specs) > 1 or (specs and specs[0].operator not in ("==", "===")):
                    raise InvalidRequirement("a range")
                version = str(Version(specs[0].version)) if specs else None
            except (InvalidRequirement, InvalidVersion) as exc:
                raise UserError(f"--have {path}:{number}: cannot read {line!r} ({exc}): expected NAME==VERSION "
                                "or NAME, one a line (python3 -m pip list --format=freeze)") from None
            versions[canonicalize_name(req.name)] = version
    if not versions:
        raise UserError(f"--have {path}: lists no package (write it on the target: python3 -m pip list "
                        "--format=freeze > have.txt)")
    return Have(versions, python, path)


def torch_family(name):
    """torch and what comes with a torch build: never put in the folder (install.sh keeps the target's)."""
    return name == "torch" or name in lock.COMPANIONS or bool(lock.CUDA_WHEELS.match(name))


def lock_pins(path):
    """constraints.txt as {canonical name: version}."""
    pins = {}
    for name, line in lock.parse(path)[1]:
        if "==" in line:
            pins[name] = line.split("==", 1)[1].strip()
    return pins


def public(version):
    return str(Version(version).public)


def bare(req):
    """The requirement without its marker (read for the target already), as pip takes it."""
    extras = f"[{','.join(sorted(req.extras))}]" if req.extras else ""
    return f"{req.name}{extras}{req.specifier}"


def wanted(req, env, extras=("",)):
    return req.marker is None or any(req.marker.evaluate({**env, "extra": e}) for e in extras)


# ----------------------------------------------------------------------------------------------
# decisions (no pip)


def walk(roots, resolved, have, env, assumed=torch_family):
    """What the target needs from the folder: the requirements from ``roots`` on, with each package's own
    requirements read with the target's markers (``env``), not descending into what ``have`` has (at a
    version the requirement allows) or what ``assumed`` says is there (torch and its companions).

    ``resolved``: canonical name -> (version, [Requires-Dist lines]).  Returns (needed: name -> the
    package that first asked for it, or None for a root; missing: requirements with no entry in
    ``resolved``; assumed: names of ``assumed`` that were asked for)."""
    needed, extras_done, missing, asked = {}, {}, [], set()
    todo = [(req, None) for req in roots]
    while todo:
        req, parent = todo.pop(0)
        name = canonicalize_name(req.name)
        if assumed(name):
            asked.add(name)
            continue
        if have.satisfies(name, req.specifier):
            continue
        if name not in resolved:
            if all(canonicalize_name(m.name) != name for m in missing):
                missing.append(req)
            continue
        first = name not in needed
        new_extras = set(req.extras) - extras_done.get(name, set())
        if not first and not new_extras:
            continue
        if first:
            needed[name] = parent
        extras_done.setdefault(name, set()).update(req.extras)
        for line in resolved[name][1]:
            dep = Requirement(line)
            if wanted(dep, env, ([""] if first else []) + sorted(new_extras)):
                todo.append((dep, name))
    return needed, missing, asked


def failure_cause(output):
    """What stopped pip's resolution: ("missing", requirement) for 'No matching distribution found for
    REQ', ("conflict", [names of the constraints in the conflict]), or (None, None)."""
    m = re.search(r"No matching distribution found for (\S+)", output)
    if m:
        try:
            return "missing", Requirement(m.group(1))
        except InvalidRequirement:
            return None, None
    names = re.findall(r"The user requested \(constraint\) ([A-Za-z0-9][A-Za-z0-9._-]*)", output)
    if names:
        return "conflict", [canonicalize_name(n) for n in dict.fromkeys(names)]
    return None, None


def version_note(name, version, pins, why=None):
    """Why this version: the lock's, or the newest compatible release (and ``why`` not the lock's)."""
    if name not in pins:
        return "newest compatible release (not in constraints.txt)"
    if public(version) == public(pins[name]):
        return "constraints.txt"
    return f"newest compatible release (constraints.txt has {pins[name]}: {why or 'it does not fit the others'})"


def wheel_runs_here_and_there(target, here):
    """A wheel built here with C extensions (fairseq-fixed's, linked against torch) runs on the target:
    same Python X.Y, architecture and torch, and the target's glibc (its highest manylinux tag) at least
    this machine's.  ``target``/``here``: dicts with python, arch, glibc ((2, N) or None), torch."""
    return (target["python"].split(".")[:2] == here["python"].split(".")[:2] and target["arch"] == here["arch"]
            and None not in (target["glibc"], here["glibc"]) and target["glibc"] >= here["glibc"]
            and None not in (target["torch"], here["torch"]) and public(target["torch"]) == public(here["torch"]))


def is_pure(wheel_path):
    _, _, _, tags = parse_wheel_filename(os.path.basename(wheel_path))
    return all(t.abi == "none" and t.platform == "any" and t.interpreter.startswith("py") for t in tags)


def machine_here():
    libc, version = platform.libc_ver()
    glibc = tuple(int(x) for x in version.split(".")[:2]) if libc == "glibc" and version else None
    try:
        torch = metadata.version("torch")
    except metadata.PackageNotFoundError:
        torch = None
    return {"python": "%d.%d" % sys.version_info[:2], "arch": platform.machine(), "glibc": glibc, "torch": torch}


# ----------------------------------------------------------------------------------------------
# pip


PIP = [sys.executable, "-m", "pip"]  # choose_pip() may replace it
PIP_NEEDED = "23.3"  # the first pip whose resolution checks Requires-Python against --python-version


def pip(args):
    """Run pip with ARGS: (exit status, output)."""
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1", PIP_PROGRESS_BAR="off")
    proc = subprocess.run([*PIP, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          universal_newlines=True, env=env)
    return proc.returncode, proc.stdout


def choose_pip(work):
    """This environment's pip, or (older than 23.3, whose ``install --dry-run --python-version`` checks
    Requires-Python against this Python instead of the target's) a newer pip run from its wheel, as pip
    supports (``python pip-X-py3-none-any.whl/pip``); this environment is left as it is."""
    global PIP
    have = Version(metadata.version("pip"))
    if have >= Version(PIP_NEEDED):
        return str(have)
    folder = os.path.join(work, "pip")
    code, output = pip(["download", "--no-deps", "--only-binary=:all:", "-d", folder, f"pip>={PIP_NEEDED}"])
    if code != 0:
        raise BuildError(f"this environment's pip {have} is too old (it checks Requires-Python against this Python, "
                         f"not the target's) and a newer one could not be downloaded:\n{pip_tail(output)}\n"
                         f"Upgrade it: {sys.executable} -m pip install -U 'pip>={PIP_NEEDED}'")
    wheel = os.path.join(folder, os.listdir(folder)[0])
    PIP = [sys.executable, os.path.join(wheel, "pip")]
    version = parse_wheel_filename(os.path.basename(wheel))[1]
    log(f"this environment's pip {have} reads Requires-Python for this Python, not the target's (fixed in pip "
        f"{PIP_NEEDED}): running pip {version} from its wheel instead (this environment is left as it is)")
    return str(version)


def pip_tail(output, lines=15):
    noise = "is ignored: it is neither a file nor a directory"  # pip.conf's local indexes, per package
    kept = [line for line in output.strip().splitlines() if noise not in line]
    return "\n".join("    " + line for line in kept[-lines:])


def report_of(args, work):
    """``pip install --dry-run --report`` with ARGS: the report's install items."""
    path = os.path.join(work, "report.json")
    if os.path.exists(path):
        os.remove(path)
    code, output = pip(["install", "--dry-run", "--ignore-installed", "--report", path, *args])
    if code != 0:
        return None, output
    with open(path, encoding="utf-8") as f:
        return json.load(f)["install"], output


def metadata_of(path_or_dir, work):
    """(name, version, Requires-Dist lines) of a project folder, sdist or wheel, read by pip (an sdist's
    metadata is prepared with this environment's setuptools and torch: no build isolation)."""
    items, output = report_of(["--no-deps", "--no-index", "--no-build-isolation", path_or_dir], work)
    if items is None:
        raise BuildError(f"pip could not read the metadata of {path_or_dir}:\n{pip_tail(output)}")
    meta = items[0]["metadata"]
    return canonicalize_name(meta["name"]), meta["version"], meta.get("requires_dist") or []


def write_stub(folder, name, version):
    """An empty wheel NAME-VERSION-py3-none-any.whl with no requirements: the target's own torch (or a
    companion) for pip's resolution, so that none is downloaded."""
    dist = re.sub(r"[-_.]+", "_", name)
    info = f"{dist}-{version}.dist-info"
    path = os.path.join(folder, f"{dist}-{version}-py3-none-any.whl")
    files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
                                 "Summary: stand-in for the target's own package (build_wheelhouse.py)\n",
             f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: {PROG}\nRoot-Is-Purelib: true\nTag: py3-none-any\n"}
    files[f"{info}/RECORD"] = "".join(f"{n},,\n" for n in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for n, text in files.items():
            z.writestr(n, text)
    return path


# ----------------------------------------------------------------------------------------------
# the build


class Builder:
    def __init__(self, args, work):
        self.args, self.work = args, work
        self.links = os.path.join(work, "links")  # stand-ins and wheels built here: pip's --find-links
        self.sdists = os.path.join(work, "sdists")
        os.makedirs(self.links)
        os.makedirs(self.sdists)
        self.have = args.have_list
        self.tags, self.arch, self.glibc = expand_platforms(args.platform or [DEFAULT_PLATFORM])
        self.python = args.python_version
        self.env = marker_environment(self.python, self.arch)
        self.lock = lock_pins(args.constraints)
        self.pins = {}  # name -> (version, "lock" | "have" | "stand-in"): the resolution's constraints
        for name, version in self.lock.items():
            if not torch_family(name):
                self.pins[name] = (version, "lock")
        for name, version in self.have.versions.items():
            if version and not torch_family(name):
                self.pins[name] = (public(version), "have")
        self.have_dropped = set()  # the target's version of these does not fit: a release that does goes in
        self.why = {}  # name -> why not constraints.txt's version
        self.built = {}  # name -> wheel built here (in links)
        self.sdist = {}  # name -> sdist, built on the target
        self.replaced = {}  # name -> (version, Requires-Dist): roots that pip does not resolve (no wheel)
        self.here = machine_here()

    def target(self):
        torch = self.have.versions.get("torch")
        return {"python": self.python, "arch": self.arch, "glibc": self.glibc, "torch": torch}

    # the target's torch and companions: stand-ins
    def stand_ins(self):
        made = []
        for name in ["torch"] + sorted(lock.COMPANIONS) + sorted(n for n in self.have.versions if torch_family(n)):
            if name in dict(made):
                continue
            version = self.have.versions.get(name) or self.lock.get(name)
            if version is None:
                continue
            v = Version(version)
            stub_version = str(v) if v.local else f"{v}+{STUB_LABEL}"
            write_stub(self.links, name, stub_version)
            self.pins[name] = (stub_version, "stand-in")
            made.append((name, stub_version))
        return made

    def roots(self):
        name, version, requires = metadata_of(REPO, self.work)
        extras = [""] + ([TEST_EXTRA] if self.args.with_test else [])
        roots = [Requirement(line) for line in requires]
        roots = [r for r in roots if wanted(r, self.env, extras)]
        if self.args.with_test and not any(r.marker and "extra" in str(r.marker) for r in roots):
            raise BuildError(f"setup.py of {name} has no '{TEST_EXTRA}' extra (--with-test)")
        return roots

    def pip_target_args(self):
        args = ["--only-binary=:all:", "--python-version", self.python, "--implementation", "cp"]
        for tag in self.tags:
            args += ["--platform", tag]
        return args

    def resolve(self, requirements):
        constraints = os.path.join(self.work, "constraints.txt")
        with open(constraints, "w", encoding="utf-8") as f:
            f.write("".join(f"{n}=={v}\n" for n, (v, _) in sorted(self.pins.items())))
        target_dir = os.path.join(self.work, "target")
        args = ["--target", target_dir, *self.pip_target_args(), "--find-links", self.links, "-c", constraints,
                *requirements]
        return report_of(args, self.work)

    def has_wheel(self, spec):
        """Whether the index (or a wheel built here) has a wheel of SPEC for the target."""
        items, _ = report_of(["--no-deps", "--target", os.path.join(self.work, "target"), *self.pip_target_args(),
                              "--find-links", self.links, spec], self.work)
        return items is not None

    def on_failure(self, output, roots):
        """Change what made pip's resolution fail, or stop: a pin of constraints.txt that the target cannot
        have (dropped: the newest compatible release instead), a package with no wheel at all (built here,
        or its sdist), a version the target has that is not on the index or does not fit (dropped)."""
        kind, what = failure_cause(output)
        names = [canonicalize_name(what.name)] if kind == "missing" else what or []
        for name in names:
            pin = self.pins.get(name)
            if not pin or pin[1] != "lock":
                continue
            if self.has_wheel(f"{name}=={pin[0]}"):
                self.why[name] = "it does not fit the target's packages"
            elif self.has_wheel(name):
                self.why[name] = "no wheel of it for the target"
            else:  # no wheel at all: built here at the lock's version (the pin stays)
                return self.no_wheel(name, what if kind == "missing" else Requirement(f"{name}=={pin[0]}"), roots)
            log(f"{name}: constraints.txt's {pin[0]}: {self.why[name]}: the newest compatible release instead")
            del self.pins[name]
            return
        for name in names:
            pin = self.pins.get(name)
            if not pin or pin[1] != "have":
                continue
            if kind == "missing":
                log(f"{name}: no wheel of the target's {pin[0]} on the index: resolving against another release "
                    "(the target keeps its own)")
            else:
                log(f"{name}: the target's {pin[0]} does not fit what fairseq-pe needs: a release that fits goes in")
                self.have_dropped.add(name)  # the walk no longer counts it as there
                self.why[name] = f"the target's {pin[0]} does not fit the others"
            del self.pins[name]
            return
        if kind == "missing" and names[0] not in self.built and names[0] not in self.replaced:
            return self.no_wheel(names[0], what, roots)
        raise BuildError(f"pip could not resolve the requirements for Python {self.python} on {self.tags[0]}:\n"
                         f"{pip_tail(output)}")

    def spec(self, name, req):
        """What to fetch of a package: constraints.txt's version where the requirement allows it."""
        if name in self.lock and req.specifier.contains(self.lock[name], prereleases=True):
            return f"{name}=={self.lock[name]}"
        return bare(req)

    def take_sdist(self, name, req, why):
        """The package goes in as its sdist, built on the target (install.sh: no build isolation, against
        the target's torch), with the build requirements; pip's resolution takes its requirements instead."""
        spec = self.spec(name, req)
        log(f"{name}: {why}: its sdist goes in, built on the target by install.sh (a few minutes there)")
        code, output = pip(["download", "--no-deps", "--no-binary", ":all:", "--no-build-isolation", "-d",
                            self.sdists, spec])
        if code != 0:
            raise BuildError(f"pip could not download the sdist of {spec}:\n{pip_tail(output)}")
        path = next(os.path.join(self.sdists, f) for f in os.listdir(self.sdists) if dist_name(f) == name)
        _, version, requires = metadata_of(path, self.work)
        self.sdist[name] = path
        self.replaced[name] = (version, requires + BUILD_REQUIREMENTS)

    def no_wheel(self, name, req, roots):
        """A package with no wheel for the target on the index."""
        root = next((r for r in roots if canonicalize_name(r.name) == name), None)
        spec = self.spec(name, req)
        if root is not None and not wheel_runs_here_and_there(self.target(), self.here):
            glibc = self.here["glibc"] or ()
            return self.take_sdist(name, req, f"no wheel for the target on the index (a wheel built here needs "
                                   f"Python {self.here['python']}, torch {self.here['torch']} and glibc >= "
                                   f"{'.'.join(map(str, glibc))} there: --platform manylinux_"
                                   f"{'_'.join(map(str, glibc))}_{self.here['arch']})")
        log(f"{name}: no wheel for the target on the index: building {spec} here "
            "(pip's cache may hold it; fairseq-fixed takes about 5 minutes otherwise)")
        start = time.time()
        before = set(os.listdir(self.links))
        code, output = pip(["wheel", "--no-deps", "-w", self.links, spec] + (["--no-build-isolation"] if root else []))
        made = [os.path.join(self.links, f) for f in set(os.listdir(self.links)) - before]
        if code != 0 or len(made) != 1:
            raise BuildError(f"pip could not build a wheel of {spec}:\n{pip_tail(output)}")
        wheel = made[0]
        log(f"{name}: built {os.path.basename(wheel)} in {time.time() - start:.0f} s")
        self.built[name] = wheel
        if is_pure(wheel):
            return  # pip's resolution takes it from --find-links
        if root is None:
            raise BuildError(f"{name} (needed by another package) has no wheel for Python {self.python} on "
                             f"{self.tags[0]} and is not pure Python: try another --platform, or put it in --have "
                             "after installing it on the target")
        _, version, requires = metadata_of(wheel, self.work)
        self.replaced[name] = (version, requires)

    def run(self):
        made = self.stand_ins()
        log("the target's own (never put in; stand-ins for the resolution): "
            + ", ".join(f"{n} {v.replace('+' + STUB_LABEL, '')}" for n, v in made))
        roots = self.roots()
        log(f"fairseq-pe needs {len(roots)} packages on Python {self.python}"
            + (" (with its test extra)" if self.args.with_test else "") + ": "
            + ", ".join(canonicalize_name(r.name) for r in roots))
        for name in self.args.sdist or []:
            req = next((r for r in roots if canonicalize_name(r.name) == canonicalize_name(name)), None)
            if req is None:
                raise UserError(f"--sdist {name}: not one of fairseq-pe's requirements on Python {self.python} "
                                f"({', '.join(canonicalize_name(r.name) for r in roots)})")
            self.take_sdist(canonicalize_name(name), req, "asked for (--sdist)")
        extra = []  # requirements that the target's markers add and pip (reading this Python's) left out
        for round_ in range(1, MAX_ROUNDS + 1):
            wanted_roots = [r for r in roots + extra if canonicalize_name(r.name) not in self.replaced]
            for name, (_, requires) in self.replaced.items():
                wanted_roots += [Requirement(line) for line in requires if wanted(Requirement(line), self.env)]
            log(f"resolving for Python {self.python} on {self.tags[0]} (round {round_})")
            items, output = self.resolve([bare(r) for r in wanted_roots if not torch_family(canonicalize_name(r.name))])
            if items is None:
                self.on_failure(output, roots)
                continue
            resolved = {canonicalize_name(i["metadata"]["name"]): (i["metadata"]["version"],
                                                                   i["metadata"].get("requires_dist") or [])
                        for i in items}
            resolved.update(self.replaced)
            have = Have({n: v for n, v in self.have.versions.items() if n not in self.have_dropped})
            needed, missing, asked = walk(roots, resolved, have, self.env)
            if not missing:
                return needed, resolved, asked
            log("read for the target, these requirements were left out by pip: "
                + ", ".join(str(m) for m in missing) + ": one more round")
            extra += missing
        raise BuildError(f"no stable resolution after {MAX_ROUNDS} rounds")

    def fetch(self, needed, resolved, staging):
        downloads = [f"{n}=={resolved[n][0]}" for n in sorted(needed) if n not in self.built and n not in self.sdist]
        for name in sorted(needed):
            if name in self.built or name in self.sdist:
                shutil.copy2(self.built.get(name) or self.sdist[name], staging)
        if downloads:
            log(f"downloading {len(downloads)} wheels for the target: {' '.join(downloads)}")
            code, output = pip(["download", "--no-deps", *self.pip_target_args(), "-d", staging, *downloads])
            if code != 0:
                raise BuildError(f"pip could not download the wheels:\n{pip_tail(output)}")


def dist_name(filename):
    """The canonical project name of a wheel or sdist file name (packaging reads it)."""
    if filename.endswith(".whl"):
        return parse_wheel_filename(filename)[0]
    return parse_sdist_filename(filename)[0]


def manifest(args, builder, needed, resolved, folder, files, asked):
    size = sum(os.path.getsize(os.path.join(folder, f)) for f in files)
    by_name = {dist_name(f): f for f in files}
    lines = [
        "# A folder of wheels for an offline install: bash scripts/install.sh --wheelhouse DIR (pip reads only",
        "# this folder there, keeps the target's torch and the packages it has; see docs/install.md).",
        "# built by: " + " ".join(["python", "scripts/build_wheelhouse.py"] + [shlex.quote(a) for a in args.argv]),
        f"# built on: {datetime.date.today().isoformat()}, from the checkout at {git_commit() or 'an unknown commit'}",
        f"# target: Python {builder.python}, {builder.arch}, platform tags {', '.join(builder.tags)}",
        f"# have: {builder.have.source or 'none given: all but torch and its companions'}"
        + (f" ({len(builder.have.versions)} packages, not put in)" if builder.have.source else ""),
        "# never in it: torch, torchaudio, torchvision, triton, nvidia-* (the target's own torch is kept)"
        + (f"; of these, fairseq-pe's packages need: {', '.join(sorted(asked))}" if asked else ""),
        f"# extras: {TEST_EXTRA if args.with_test else 'none'}",
        f"# size: {size / 2 ** 20:.1f} MiB in {len(files)} files",
    ]
    for name in sorted(by_name):
        version = resolved[name][0] if name in resolved else "?"
        if name in builder.sdist:
            how = "sdist: built on the target by install.sh"
        elif name in builder.built:
            how = "wheel built here" + ("" if is_pure(builder.built[name]) else " (this Python, torch and glibc)")
        else:
            how = "wheel from the index"
        why = f"for {needed[name]}" if needed.get(name) else "fairseq-pe's"
        note = version_note(name, version, builder.lock, builder.why.get(name))
        lines.append(f"{by_name[name]}  # {name} {version}: {note}; {how}; {why}")
    return "\n".join(lines) + "\n", size


def git_commit():
    try:
        out = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], stdout=subprocess.PIPE,
                             stderr=subprocess.DEVNULL, universal_newlines=True)
    except OSError:
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def check_out(out, force):
    """--out must be new or empty; with --force, a folder of wheels (this script's) is replaced."""
    if not os.path.exists(out):
        return
    if not os.path.isdir(out):
        raise UserError(f"--out {out}: exists and is not a folder")
    entries = os.listdir(out)
    if not entries:
        return
    if not force:
        raise UserError(f"--out {out}: exists and is not empty; pass --force to replace it, or choose another --out")
    foreign = [e for e in entries if not (os.path.isfile(os.path.join(out, e))
                                          and (e == MANIFEST or re.search(r"\.(whl|tar\.gz|zip)$", e)))]
    if foreign:
        raise UserError(f"--out {out}: holds {', '.join(sorted(foreign)[:5])}, which this script does not write: "
                        "not replaced, even with --force; choose another --out")


def parse_args(argv):
    p = argparse.ArgumentParser(prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, metavar="DIR", help="the folder to write (new, or empty; --force replaces "
                   "one this script wrote)")
    p.add_argument("--python-version", type=python_version, metavar="X.Y",
                   help="the target's Python (default: the '# python X.Y' line of --have, else this Python, "
                        + "%d.%d)" % sys.version_info[:2])
    p.add_argument("--platform", type=platform_tag, action="append", metavar="TAG",
                   help=f"the target's platform tag, repeatable (default {DEFAULT_PLATFORM}: glibc 2.28 or newer, "
                        "x86_64); manylinux_2_N_ARCH stands for every manylinux tag up to glibc 2.N")
    p.add_argument("--have", metavar="FILE", help="the target's packages, not put in: its 'python3 -m pip list "
                   "--format=freeze' (NAME==VERSION or bare NAME lines; default: it has torch and nothing else)")
    p.add_argument("--with-test", action="store_true", help="also the test-suite's pytest and transformers "
                   "(fairseq-pe[test]), unless the target has them")
    p.add_argument("--sdist", action="append", metavar="NAME",
                   help="put this requirement of fairseq-pe in as its sdist, built on the target by install.sh, "
                        "even where a wheel exists (repeatable): e.g. fairseq-fixed, so that its C++ extensions "
                        "(NAT models, BASE layers) are built against the target's torch, not its wheel's")
    p.add_argument("--constraints", default=os.path.join(REPO, "constraints.txt"), metavar="FILE",
                   help="the lock whose versions are preferred (default: constraints.txt)")
    p.add_argument("--force", action="store_true", help="replace --out when it holds a folder of wheels")
    args = p.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)
    return args


def validate(args):
    if Requirement is None:
        raise UserError("the 'packaging' module is missing: run this with the project's environment "
                        "(.venv/bin/python, after bash scripts/install.sh)")
    if not os.path.isfile(args.constraints):
        raise UserError(f"--constraints {args.constraints}: no such file")
    args.have_list = parse_have(args.have) if args.have else Have()
    if args.have and "torch" not in args.have_list:
        log(f"WARNING: --have {args.have} lists no torch: the folder never holds one, and install.sh "
            "--wheelhouse needs the target's own")
    if args.have_list.python:
        if args.python_version and args.python_version.split(".")[:2] != args.have_list.python.split(".")[:2]:
            raise UserError(f"--python-version {args.python_version}, but --have {args.have} is of Python "
                            f"{args.have_list.python} ('# python' line): give one Python")
        args.python_version = args.python_version or args.have_list.python
    args.python_version = args.python_version or "%d.%d" % sys.version_info[:2]
    expand_platforms(args.platform or [DEFAULT_PLATFORM])  # one architecture
    check_out(args.out, args.force)


def build(args):
    start = time.time()
    validate(args)
    out = os.path.abspath(args.out)
    parent = os.path.dirname(out)
    os.makedirs(parent, exist_ok=True)
    work = tempfile.mkdtemp(prefix="wheelhouse-work-")
    staging = tempfile.mkdtemp(prefix=f".{os.path.basename(out)}.partial-", dir=parent)
    try:
        choose_pip(work)
        builder = Builder(args, work)
        log(f"target: Python {builder.python}, {builder.arch}, platform tags {builder.tags[0]} ... {builder.tags[-1]}"
            f"; have: {args.have or 'torch and its companions only'}")
        needed, resolved, asked = builder.run()
        missing_companions = sorted(n for n in asked if args.have and n not in builder.have)
        if missing_companions:
            log(f"WARNING: required but not in --have {args.have}, and never put in the folder: "
                f"{', '.join(missing_companions)} (install them on the target with its torch)")
        builder.fetch(needed, resolved, staging)
        files = sorted(os.listdir(staging))
        text, size = manifest(args, builder, needed, resolved, staging, files, asked)
        with open(os.path.join(staging, MANIFEST), "w", encoding="utf-8") as f:
            f.write(text)
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(staging, 0o777 & ~umask)  # mkdtemp's folder is the owner's only
        if os.path.exists(out):
            shutil.rmtree(out)
        os.rename(staging, out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(staging, ignore_errors=True)
    print(text, end="")
    log(f"wrote {args.out}: {len(files)} files, {size / 2 ** 20:.1f} MiB, in {time.time() - start:.0f} s")
    if size > WARN_MIB * 2 ** 20:
        log(f"WARNING: {size / 2 ** 20:.1f} MiB is more than {WARN_MIB} MiB: list what the target has with --have "
            "(its python3 -m pip list --format=freeze)")
    for name, sdist in builder.sdist.items():
        log(f"{name} goes in as its sdist: install.sh builds it on the target (about 5 minutes)")
    return 0


def main(argv=None):
    args = parse_args(argv)
    try:
        return build(args)
    except UserError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 2
    except BuildError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
