"""The lock file ``constraints.txt``: every package version the test-suite was last run with.

    python scripts/lock.py effective constraints.txt > PIN   # what install.sh passes to pip (-c PIN)
    python scripts/lock.py freeze > constraints.txt          # write the lock from this environment

``effective`` (run with the interpreter being installed into) prints the lock as it applies there:

* the torch line is the torch already installed (a CUDA build, say, is kept and pinned; with no
  torch yet, the lock's own version);
* when that torch is not the locked version, torch's own dependencies (sympy, networkx, ...:
  read from the installed torch's metadata), its CUDA wheels (``nvidia-*``, ``triton``) and its
  companions (torchaudio, torchvision) are left to pip, which keeps what that torch came with;
* when this Python is not the one the lock was made with (its ``# python X.Y`` line), only torch is
  pinned and pip chooses the rest (a warning says so): the locked versions may not exist there.

``freeze`` prints ``pip freeze --all`` of this environment without pip, the project itself and
torch's CUDA wheels, with torch's local version label dropped (``2.13.0+cpu`` -> ``2.13.0``, which
pip matches with any build of 2.13.0).  ``scripts/update_constraints.sh`` uses it.  Standard
library only.
"""

import datetime
import re
import subprocess
import sys

from importlib import metadata

PROJECT = "fairseq-pe"
# torch's builds and companions: never forced on an existing torch, never locked (nvidia-*, triton)
CUDA_WHEELS = re.compile(r"^(nvidia-.*|triton|pytorch-triton.*)$")
COMPANIONS = {"torchaudio", "torchvision", "torchtext"}


def canonical(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def parse(path):
    """(python "X.Y" or None, [(canonical name, line)]) of a constraints file."""
    python, pins = None, []
    with open(path, encoding="utf-8") as f:
        for raw in f:
            line = raw.strip()
            m = re.match(r"#\s*python\s+(\d+\.\d+)\s*$", line)
            if m:
                python = m.group(1)
            if not line or line.startswith("#"):
                continue
            name = re.split(r"[\s<>=!~;\[@]", line, 1)[0]
            pins.append((canonical(name), line))
    return python, pins


def installed_version(name):
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def public(version):
    return version.split("+", 1)[0]


def requirement_names(dist_name):
    names = set()
    try:
        requires = metadata.requires(dist_name) or []
    except metadata.PackageNotFoundError:
        return names
    for req in requires:
        if ";" in req and "extra" in req.split(";", 1)[1]:
            continue  # an optional extra of torch's
        names.add(canonical(re.split(r"[\s<>=!~;\[(@]", req.strip(), 1)[0]))
    return names


def dependency_closure(root):
    """Canonical names of everything ``root`` needs (transitively), as installed here."""
    seen, todo = set(), [root]
    while todo:
        for name in requirement_names(todo.pop()):
            if name not in seen:
                seen.add(name)
                todo.append(name)
    return seen


def effective(lock_path, python=None, torch_version=None, torch_deps=None, log=None):
    """The lines install.sh gives pip as constraints (see the module's docstring)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    python = python or "%d.%d" % sys.version_info[:2]
    lock_python, pins = parse(lock_path)
    locked_torch = next((line for name, line in pins if name == "torch"), None)
    if torch_version is None:
        torch_version = installed_version("torch")
    torch_line = f"torch=={torch_version}" if torch_version else locked_torch
    if lock_python and lock_python != python:
        log(f"[install] WARNING: {lock_path} was made with Python {lock_python}, this is Python {python}: "
            f"only torch is pinned, pip chooses the other versions (tested with Python {lock_python})")
        return [torch_line] if torch_line else []
    out = []
    foreign_torch = bool(torch_version and locked_torch
                         and f"torch=={public(torch_version)}" != locked_torch.replace(" ", ""))
    if foreign_torch:
        if torch_deps is None:
            torch_deps = dependency_closure("torch")
        left = sorted(name for name, _ in pins
                      if name in torch_deps or name in COMPANIONS or CUDA_WHEELS.match(name))
        log(f"[install] keeping torch {torch_version} (the lock has {locked_torch}); "
            f"left to pip: {', '.join(left) or 'nothing'}")
    for name, line in pins:
        if name == "torch":
            continue
        if foreign_torch and (name in torch_deps or name in COMPANIONS or CUDA_WHEELS.match(name)):
            continue
        out.append(line)
    return ([torch_line] if torch_line else []) + out


def freeze(python=None):
    python = python or sys.executable
    frozen = subprocess.run([python, "-m", "pip", "freeze", "--all", "--exclude-editable"],
                            stdout=subprocess.PIPE, check=True, universal_newlines=True).stdout
    lines = []
    for line in frozen.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or line.startswith("-e"):
            continue
        name = canonical(re.split(r"[\s<>=!~;\[@]", line, 1)[0])
        if name in ("pip", PROJECT) or CUDA_WHEELS.match(name):
            continue
        if " @ " in line:  # a local wheel or a VCS checkout: pin its version instead
            version = installed_version(name)
            line = f"{name}=={version}"
        if name == "torch":
            line = "torch==" + public(line.split("==", 1)[1])
        lines.append(line)
    return sorted(lines, key=lambda l: canonical(l.split("==")[0]))


HEADER = """\
# The versions the test-suite was last run with (a lock file): scripts/install.sh installs exactly
# these (see scripts/lock.py for what changes when a torch is already installed, or on another
# Python).  Rewritten by scripts/update_constraints.sh, after the test-suite passed with them;
# do not edit by hand.
"""


def main(argv):
    if len(argv) == 3 and argv[1] == "effective":
        print("\n".join(effective(argv[2])))
        return 0
    if len(argv) == 2 and argv[1] == "freeze":
        print(HEADER + f"# python {sys.version_info[0]}.{sys.version_info[1]}\n"
              f"# updated {datetime.date.today().isoformat()}\n" + "\n".join(freeze()))
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
