"""The catalogue of named systems (fairseq_pe/systems.py) is the only list of them.

What fails :func:`test_no_list_of_systems_outside_the_catalogue`, anywhere in the repository's Python, shell and
Markdown outside the catalogue:

* a table of systems written out: four or more catalogue names paired with literal ``--pe-*`` flags in one literal
  (a dict, a ``declare -A`` array), or four or more literal flag lists of catalogue systems in one list;
* a name that means other flags: one catalogue name paired with flags whose defining options (``--pe-absolute``,
  ``--pe-relative``, ``--pe-floater-bias``, ``--pe-all-blocks``, ``--pe-random-positions``) differ from the
  catalogue's (added sizes such as ``--pe-relative-max-distance`` are fine);
* a selection of names that re-writes a group: a literal list of names holding a whole group of the catalogue
  of four or more, or ten names or more.

Shorter selections of names (a test's subset, a command's ``SYSTEMS=...``) are read against the catalogue and stay.
The scanner is shown to find each form in the lists the catalogue replaced (:data:`WRITTEN_OUT`, and
:func:`test_the_lists_before_the_catalogue_fail`, which scans the files of the commit before it).  The catalogue's
static capabilities are checked against the registry and the options, and its command line against its groups.
"""

import ast
import os
import re
import shlex
import subprocess
import sys

import pytest

from fairseq_pe import systems as catalogue

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = set(catalogue.SYSTEMS) | set(catalogue.ALIASES)
FLAG_LISTS = [s.flags for s in catalogue.SYSTEMS.values() if "--pe-absolute" in s.flags]
#: where the catalogue and this test's examples live
OWN = {"fairseq_pe/systems.py", "tests/test_systems.py"}
#: files whose selections of names are records, kept as they were run (their name -> flags pairings are checked)
RECORDS = {"docs/results.md": "the commands of its measured runs, with the systems in the order they were run"}
TABLE, WHOLE = 4, 10
DEFINING = ("--pe-absolute", "--pe-relative", "--pe-floater-bias", "--pe-all-blocks", "--pe-random-positions")
GROUPS = [set(members) for members in catalogue.GROUPS.values() if len(members) >= TABLE]


def defining(flags):
    """What ``flags`` say about which system it is: {option: value} of the defining options.  Flags with
    ``--pe-absolute`` say it all (an option they omit has its default); flags without it only what they hold."""
    out, i = {}, 0
    while i < len(flags):
        if flags[i] in DEFINING:
            takes_value = flags[i] in ("--pe-absolute", "--pe-relative", "--pe-random-positions")
            out[flags[i]] = flags[i + 1] if takes_value and i + 1 < len(flags) else True
            i += takes_value
        i += 1
    if "--pe-absolute" in out:
        out = {"--pe-relative": "none", "--pe-floater-bias": False, "--pe-all-blocks": False,
               "--pe-random-positions": None, **out}
    return out


def _conflicts(flags, name):
    mine, theirs = defining(flags), defining(list(catalogue.flags(name)))
    return any(theirs.get(option, False if value is True else None) != value for option, value in mine.items())


def _pairings(pairs):
    """(name, flags) pairs found in one literal -> the problems they make."""
    pairs = [(catalogue.canonical(name), flags) for name, flags in pairs if name in NAMES and defining(flags)]
    found = [f"{name} paired with {' '.join(flags)}, but the catalogue's {name} is "
             f"{' '.join(catalogue.flags(name))}" for name, flags in pairs if _conflicts(flags, name)]
    if len(pairs) >= TABLE:
        found.append(f"a name -> flags table {[name for name, _ in pairs]}")
    return found


def _selection(names):
    named = list(dict.fromkeys(n for n in names if n in NAMES))
    if len(named) >= WHOLE or any(group <= {catalogue.canonical(n) for n in named} for group in GROUPS):
        return [f"a list of system names {named}"]
    return []


def _strings(node):
    if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
        return [e.value for e in node.elts if isinstance(e, ast.Constant) and isinstance(e.value, str)]
    return None


def _flags_in(node):
    """The strings of a dict value, in order, when it holds --pe-* options (else none)."""
    strings = [n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)]
    return strings if any(s.startswith("--pe-") for s in strings) else []


def python_lists(text):
    """Each literal of ``text`` that writes out systems: (line, what)."""
    found = []
    for node in ast.walk(ast.parse(text)):
        strings = _strings(node)
        if strings is not None:
            flag_lists = [e for e in node.elts if _strings(e) and any(tuple(_strings(e)[:len(f)]) == f
                                                                      for f in FLAG_LISTS)]
            problems = _selection(strings)
            if len(flag_lists) >= TABLE:
                problems.append(f"{len(flag_lists)} flag lists of catalogue systems")
        elif isinstance(node, ast.Dict):
            problems = _pairings([(k.value, _flags_in(v)) for k, v in zip(node.keys, node.values)
                                  if isinstance(k, ast.Constant) and isinstance(k.value, str)])
        else:
            continue
        found += [(node.lineno, what) for what in problems]
    return found


def _words(chunk):
    return [w for w in re.split(r"[\s,=\"'`()\[\];]+", chunk) if w]


def shell_lists(text):
    """Arrays (``X=(...)``, ``declare -A X=([NAME]="FLAGS" ...)``) and quoted strings of ``text`` that write out
    systems."""
    code = "\n".join("" if line.lstrip().startswith("#") else line.split(" # ")[0] for line in text.splitlines())
    found = []
    for m in re.finditer(r"\w+=\((.*?)\)\s*$|\"([^\"\n]*)\"|'([^'\n]*)'", code, re.S | re.M):
        chunk = next(g for g in m.groups() if g is not None)
        pairs = [(name, shlex.split(flags)) for name, flags in re.findall(r"\[([\w+.-]+)\]=\"([^\"]*)\"", chunk)]
        line = code.count("\n", 0, m.start()) + 1
        problems = _pairings(pairs) if pairs else _selection(_words(chunk))
        found += [(line, what) for what in problems]
    for m in re.finditer(r"\w+\[([\w+.-]+)\]=\"([^\"]*)\"", code):  # one entry set: ARRAY[NAME]="FLAGS"
        found += [(code.count("\n", 0, m.start()) + 1, what) for what in _pairings([(m[1], shlex.split(m[2]))])]
    return found


def markdown_lists(text):
    """Code blocks' lines and inline code spans of ``text``: selections of names, and NAME=FLAGS pairings."""
    found, fenced = [], False
    for number, line in enumerate(text.splitlines(), start=1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        for chunk in [line] if fenced else re.findall(r"`([^`]+)`", line):
            pairs = [(name, shlex.split(flags)) for name, flags in
                     re.findall(r"(?<![\w-])([\w+.-]+)=[\"']?(--pe-[^\"'`]*)", chunk)]
            found += [(number, what) for what in _pairings(pairs) + _selection(_words(chunk))]
    return found


SCANNERS = {".py": python_lists, ".sh": shell_lists, ".md": markdown_lists}


def repository_files():
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                         capture_output=True, text=True, check=True).stdout.split("\n")
    return sorted(f for f in set(out) if os.path.splitext(f)[1] in SCANNERS and f not in OWN
                  and os.path.isfile(os.path.join(REPO, f)))


def test_no_list_of_systems_outside_the_catalogue():
    problems = []
    for path in repository_files():
        with open(os.path.join(REPO, path), encoding="utf-8") as f:
            text = f.read()
        problems += [f"{path}:{line}: {what}" for line, what in SCANNERS[os.path.splitext(path)[1]](text)
                     if not (path in RECORDS and what.startswith("a list of system names"))]
    assert not problems, ("systems written out outside fairseq_pe/systems.py (read them from it: "
                          "catalogue.group(...), python -m fairseq_pe.systems ...):\n" + "\n".join(problems))


#: lists the catalogue replaced, as they were written (one of each form); the scanner must find each
WRITTEN_OUT = {
    ".py": [  # tests/helpers.py's table (its floater: the catalogue's floater-input), tests/test_roberta_pe.py's list,
              # and tests/helpers.py's RANDOMISABLE (the catalogue's group "randomised")
        'NONE = ["--pe-absolute", "none"]\nALL_ENCODINGS = {\n    "none": NONE,\n'
        '    "ape-learned": ["--pe-absolute", "learned"],\n    "ape-sinusoidal": ["--pe-absolute", "sinusoidal"],\n'
        '    "rope": NONE + ["--pe-relative", "rope"],\n    "t5": NONE + ["--pe-relative", "t5"],\n}\n',
        'ENCODINGS = {"floater": ["--pe-absolute", "floater"], "t5": ["--pe-absolute", "none", "--pe-relative", "t5"]}\n',
        'ENCODINGS = [\n    [],\n    ["--pe-absolute", "sinusoidal"],\n    ["--pe-absolute", "learnable-sinusoidal"],\n'
        '    ["--pe-absolute", "none", "--pe-relative", "learned"],\n'
        '    ["--pe-absolute", "none", "--pe-relative", "fire", "--pe-fire-threshold", "4"],\n]\n',
        'RANDOMISABLE = ["ape-sinusoidal", "rope", "xpos", "alibi", "t5", "kerple-power", "sandwich", "fire", '
        '"rpe-learned"]\n'],
    ".sh": [  # scripts/recipes/bert-cpu.sh's table, s2l-cpu-en-de.sh's and s2l-cpu-captions.sh's defaults
        'declare -A FLAGS=(\n  [ape-learned]="--pe-absolute learned"\n  [ape-sin]="--pe-absolute sinusoidal"\n'
        '  [ape-lsin]="--pe-absolute learnable-sinusoidal"\n  [rpe-learned]="--pe-absolute none --pe-relative learned"\n'
        '  [floater]="--pe-absolute floater --pe-all-blocks"\n)\n',
        '[[ $MODE == base ]] && FLAGS[floater]="--pe-absolute learned --pe-floater-bias"\n',  # bert-pretrain.sh's
        'DEFAULT_SYSTEMS=(\n    "floater"                      # FLOATER at every block\n'
        '    "rpe-learned" "rpe-sinusoidal" "rpe-learnable-sin"\n    "ape-sin+rpe-learned"          # Shaw\n'
        '    "rope" "alibi"\n    "none" "ape-learned" "ape-sinusoidal" "ape-learnable-sin"\n)\n',
        'export SYSTEMS=${SYSTEMS:-"none ape-learned ape-sinusoidal ape-learnable-sin rpe-learned rpe-sinusoidal '
        'rpe-learnable-sin rope alibi t5 floater floater-bias floater-warm kerple-log"}\n'],
    ".md": ["Run:\n\n```\nSYSTEMS=\"ape-learned ape-sinusoidal ape-learnable-sin rpe-learned floater\" bash x.sh\n```\n",
            "Run `fairseq-pe-quickstart --systems rope=--pe-absolute sinusoidal --pe-relative rope`.\n"],
}


@pytest.mark.parametrize("ext,text", [(ext, t) for ext, texts in WRITTEN_OUT.items() for t in texts])
def test_the_scanner_finds_a_list_written_out(ext, text):
    assert SCANNERS[ext](text), text


#: the commit before the catalogue, and the files that wrote the systems out there
BEFORE = "44dbca4"
BEFORE_FILES = ["fairseq_pe/translation/quickstart.py", "scripts/benchmark_analysis.py", "tests/helpers.py",
                "tests/test_attention_paths.py", "tests/test_roberta_pe.py", "scripts/recipes/s2l-all-encodings.sh",
                "scripts/recipes/bert-cpu.sh", "scripts/recipes/bert-pretrain.sh", "scripts/recipes/floater-table2.sh",
                "scripts/recipes/s2l-cpu-en-de.sh", "scripts/recipes/s2l-cpu-captions.sh", "tests/test_plotting.py",
                "scripts/gpu_check.py", "tests/test_kernel_choices.py", "tests/test_fairseq_features.py"]


@pytest.mark.parametrize("path", BEFORE_FILES)
def test_the_lists_before_the_catalogue_fail(path):
    """Each file that wrote systems out before the catalogue is found by the scanner, as it was then."""
    old = subprocess.run(["git", "show", f"{BEFORE}:{path}"], cwd=REPO, capture_output=True, text=True)
    if old.returncode != 0:
        pytest.skip(f"commit {BEFORE} is not in this clone")
    assert SCANNERS[os.path.splitext(path)[1]](old.stdout)


@pytest.mark.parametrize("ext,text", [
    (".py", 'SYSTEMS = catalogue.group("benchmark")\nPAIR = ["ape-sinusoidal", "alibi", "t5"]\n'),
    (".py", 'RELATIVE = ["learned", "sinusoidal", "rope", "alibi", "t5", "kerple-log"]  # --pe-relative\n'),
    (".sh", 'SYSTEMS=${SYSTEMS:-$(python -m fairseq_pe.systems names s2l-cpu-captions)}  # rope alibi t5 fire\n'),
    (".md", "The rows `rope`, `alibi`, `t5` and `fire` are ...\n"),
])
def test_the_scanner_lets_the_catalogue_be_read(ext, text):
    assert SCANNERS[ext](text) == []


def test_every_group_and_alias_names_catalogue_systems():
    for name, members in catalogue.GROUPS.items():
        assert members and len(set(members)) == len(members), name
        assert set(members) <= set(catalogue.SYSTEMS), (name, set(members) - set(catalogue.SYSTEMS))
    for alias, name in catalogue.ALIASES.items():
        assert alias not in catalogue.SYSTEMS and name in catalogue.SYSTEMS
    flags = [s.flags for s in catalogue.SYSTEMS.values() if s.warm_start is None]
    assert len(set(flags)) == len(flags), "two names for the same flags: make one an alias"


def test_capabilities_follow_the_registry_and_the_options():
    """has_length_limit and query_terms are the registered classes'; randomisable is what the options accept."""
    from fairseq_pe.errors import UserError
    from fairseq_pe.models.options import validate_position_args

    for s in catalogue.SYSTEMS.values():
        assert s.has_length_limit == (s.absolute == "learned"), s.name
        assert s.query_terms == (s.relative in ("learned", "sinusoidal", "learnable-sinusoidal")), s.name
        assert s.encoder_capable and not s.causal_only
        if "--pe-random-positions" in s.flags:
            continue
        try:
            validate_position_args(_options(s.flags + ("--pe-random-positions", "64")))
            accepted = True
        except UserError:
            accepted = False
        assert accepted == s.randomisable, s.name


def _options(flags):
    """``transformer_pe_tiny``'s options with ``flags``, parsed as fairseq parses them."""
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    from fairseq_pe.models.transformer_pe import TransformerPEModel

    parser = argparse.ArgumentParser(argument_default=argparse.SUPPRESS)
    TransformerPEModel.add_args(parser)
    args = parser.parse_args(list(flags))
    ARCH_CONFIG_REGISTRY["transformer_pe_tiny"](args)
    return args


def test_the_command_line_reads_the_catalogue():
    def run(*argv):
        return subprocess.run([sys.executable, "-m", "fairseq_pe.systems", *argv], cwd=REPO, capture_output=True,
                              text=True, timeout=60)

    assert run("flags", "ape-learnable-sin").stdout.split() == ["--pe-absolute", "learnable-sinusoidal"]
    assert run("canonical", "ape-lsin", "rope").stdout.split() == ["ape-learnable-sin", "rope"]
    assert run("names", "quickstart").stdout.split() == list(catalogue.GROUPS["quickstart"])
    lines = run("group", "s2l-all-encodings").stdout.splitlines()
    assert {line.split()[0]: line.split()[1:] for line in lines} == catalogue.group("s2l-all-encodings")
    bad = run("flags", "ape-learnable")
    assert bad.returncode == 2 and "unknown system 'ape-learnable'" in bad.stderr
    light = run("table")
    assert light.returncode == 0
    probe = subprocess.run([sys.executable, "-c", "import sys, fairseq_pe.systems as s; s.group('benchmark'); "
                            "print('torch' in sys.modules, 'fairseq' in sys.modules)"], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    assert probe.stdout.split() == ["False", "False"]
