"""The shell commands of README.md and docs/**/*.md, and their check against the real parsers (what
tests/test_doc_commands.py runs; its docstring says what is checked).

Reading: a fenced block marked ``bash``/``sh``/``shell``/``console`` (its ``$ `` lines), or bare (only
our programs: it may hold output), is shell.  ``\\`` continuations are joined and the standard
library's POSIX lexer (:mod:`shlex`) splits each line into words, operators and its comment.
``$(which PROG)`` becomes PROG, ``$(python -m fairseq_pe.systems names GROUP)`` the group's names,
``$(python -c '...TASK-bin/task.json...')`` the flags
fairseq-pe-prepare-glue writes there, any other ``$(...)`` is dropped (the command is then elided).
A comment ``LABEL: COMMAND`` counts when it runs a program of ours, as does a `code span` of the prose.
The doc notation: ``...`` (flags elided: nothing is required), ``[A]`` (kept), ``(A | B)`` and
``[A | B]`` (each alternative is read), upper-case placeholders (DIR, CHECKPOINT: kept as values).
"""

import argparse
import contextlib
import glob
import importlib
import importlib.metadata
import importlib.util
import io
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
import tempfile
import warnings
from dataclasses import dataclass, field
from dataclasses import fields as dataclasses_fields
from functools import lru_cache
from typing import Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "fairseq_pe")
SHELL_FENCES = {"bash", "sh", "shell", "console"}  # every command in them is checked or FOREIGN
#: programs of the docs that are not ours, not checked (with the first option that says what it is)
FOREIGN = {"pip": "installs packages", "python -m pip": "installs packages", "rsync": "copies files",
           "hf": "Hugging Face's download tool", "python -c": "inline Python", "git": "version control",
           "cd": "shell builtin"}
#: the parser factory in fairseq.options of each fairseq console script
FAIRSEQ_PARSERS = {"fairseq-train": "get_training_parser", "fairseq-generate": "get_generation_parser",
                   "fairseq-interactive": "get_generation_parser", "fairseq-validate": "get_validation_parser",
                   "fairseq-eval-lm": "get_eval_lm_parser", "fairseq-preprocess": "get_preprocessing_parser"}
LAUNCHERS = {"torchrun"}  # run a program given after their own options
#: environment variables that reach a tool as flags (scripts/recipes/s2l-cpu-*.sh: SYSTEMS, SEEDS)
ENV_AS_FLAGS = {"fairseq-pe-quickstart": {"SYSTEMS": "--systems", "SEEDS": "--seeds"}}
#: where a script passes its arguments (its ``"$@"``): script -> (the tool or script that gets them, whether
#: it reads positional words itself first: then the flags only are passed on).  A script not here must name
#: the flags the docs give it in its own text.  tests/test_doc_commands.py checks this against the scripts.
FORWARDS = {"scripts/quickstart.sh": ("fairseq-pe-quickstart", False),
            "scripts/recipes/s2l-cpu-en-de.sh": ("fairseq-pe-quickstart", True),
            "scripts/recipes/s2l-cpu-captions.sh": ("scripts/recipes/s2l-cpu-en-de.sh", True),
            **{f"data-prep/{name}.sh": (f"fairseq-pe-{name}", False)
               for name in ("prepare-glue", "prepare-mono", "prepare-squad", "prepare-wmt14", "s2l-split")}}
PUNCT = "();<>|&[]"  # shell operators, and the notation's groups
SEPARATORS, REDIRECTS, ELLIPSIS = {";", "&&", "||", "&", "|"}, {">", ">>", "<", ">&", "&>"}, {"...", "\u2026"}
FLAG, PLACEHOLDER = re.compile(r"--?[A-Za-z][\w-]*"), re.compile(r"[A-Z][A-Z0-9_-]*")
SCRIPT, OURS = re.compile(r"[\w./-]+\.(sh|py)"), re.compile(r"fairseq-[\w-]+")
FENCE = re.compile(r"^[ \t]*```[ \t]*(\w*)[^\n]*\n(.*?)^[ \t]*```[^\n]*$", re.M | re.S)
SUBSTITUTION = re.compile(r"""\$\((?:[^()'"]|'[^']*'|"[^"]*")*\)""")  # $(...), quoted parentheses inside
#: what is wrong with a `code span`'s command whatever words it elides
INLINE_PROBLEMS = re.compile(r": unknown flag |: no such |: unknown program|is not the plugin folder")


@dataclass
class Command:
    doc: str  # the documentation file, relative to the repository
    line: int  # where the command starts in it
    program: str  # fairseq-train, fairseq-pe-analyze, scripts/quickstart.sh, python -c, ...
    kind: str  # fairseq | tool | module | script | python | foreign | unreadable
    args: List[str]  # the words after the program, with the notation's ( | ) [ ] marks
    env: Dict[str, str] = field(default_factory=dict)  # NAME=VALUE words before the program
    comment_env: List[str] = field(default_factory=list)  # NAME= words in the line's comment (scripts)
    launcher: List[str] = field(default_factory=list)  # torchrun's own options
    elided: bool = False  # has ``...`` or an unknown ``$(...)``: nothing is required
    direct: bool = False  # a script run as ``scripts/x.sh``, not ``bash scripts/x.sh``
    inline: bool = False  # from a `code span`: often a fragment, so only names and flags are checked

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def name(self) -> str:
        if self.kind == "unreadable":
            return self.kind
        return os.path.basename(self.program) if self.kind in ("script", "python") else self.program


# ---------------------------------------------------------------------------------- reading the docs


def doc_files() -> List[str]:
    return [os.path.join(REPO, "README.md")] + sorted(glob.glob(os.path.join(REPO, "docs", "**", "*.md"),
                                                                recursive=True))


def _read(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        return f.read()


def logical_lines(text: str, first: int = 1):
    """(line number, text) of each line of ``text``, ``\\`` continuations joined."""
    for piece in re.split(r"(?<!\\)\n", re.sub(r"\\[ \t]+\n", "\\\n", text)):
        yield first, " ".join(part.strip() for part in piece.split("\\\n"))
        first += piece.count("\n") + 1


class _Line(io.StringIO):
    """A line for shlex that keeps the comment shlex skips (it reads one with ``readline``)."""
    comment = ""

    def readline(self, *args):
        self.comment = super().readline(*args)
        return self.comment


def _substitute(m: re.Match, dropped: List[bool]) -> str:
    inner = m.group()[2:-1]
    group = re.fullmatch(r"\s*python -m fairseq_pe\.systems names ([\w-]+)\s*", inner)
    if group:  # the catalogue's names of a group, as the shell gets them
        from fairseq_pe import systems

        dropped.append(False)
        return " ".join(systems.GROUPS[group.group(1)])
    which, task = re.fullmatch(r"\s*which\s+(\S+)\s*", inner), re.search(r"([\w.-]+)-bin/task\.json", inner)
    dropped.append(not which and not (task and "fairseq_train_args" in inner))
    if which or dropped[-1]:
        return which.group(1) if which else ""
    from fairseq_pe.data_prep.glue import TASKS, recommended_args  # at its default --max-positions

    return " ".join(shlex.quote(a) for a in recommended_args(TASKS[task.group(1)], 512))


def read_line(text: str, doc: str, line: int, strict: bool) -> Tuple[List[Command], str]:
    """(the commands, the comment) of one logical line; ``strict``: from a shell fence, where a foreign
    program is kept (to be checked against FOREIGN), elsewhere only programs of ours."""
    dropped: List[bool] = []
    stream = _Line(SUBSTITUTION.sub(lambda m: _substitute(m, dropped), text))
    lexer = shlex.shlex(stream, posix=True, punctuation_chars=PUNCT)
    lexer.whitespace_split = True
    tokens = iter([part for t in lexer for part in (list(t) if t and set(t) <= set("()[]") else [t])])
    segments, depth = [[]], 0  # split at ; && || & and at a pipe outside the notation's groups
    for t in tokens:
        if t in REDIRECTS:  # dropped with its file (and the 2 of 2>)
            if segments[-1] and segments[-1][-1].isdigit():
                segments[-1].pop()
            next(tokens, None)
        elif t in SEPARATORS and not (t == "|" and depth):
            segments.append([])
        else:
            depth += (t in ("(", "[")) - (t in (")", "]"))
            segments[-1].append(t)
    found = []
    for words in segments:
        env = {}
        while words and re.match(r"[A-Za-z_]\w*=", words[0]):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        what = classify(words) if words and not set(words[0]) <= set(PUNCT) else None
        if what and (strict or what[0] != "foreign"):
            kind, program, args, launcher, direct = what
            found.append(Command(doc, line, program, kind, args, env, launcher=launcher, direct=direct,
                                 elided=any(dropped) or any(a in ELLIPSIS for a in args)))
    return found, stream.comment.strip()


def classify(words: List[str]):
    """(kind, program, args, launcher options, run directly) of a command's words; None: no command."""
    launcher = []
    if words[0] in LAUNCHERS:
        k = next((i for i, w in enumerate(words) if i and (OURS.fullmatch(w) or SCRIPT.fullmatch(w))), None)
        if k is None:
            return "foreign", words[0], words[1:], [], False
        launcher, words = words[1:k], words[k:]
    first, rest = words[0], words[1:]
    if first in ("bash", "sh") and rest:
        return "script", os.path.normpath(rest[0]), rest[1:], launcher, False
    if first in ("python", "python3") and rest[:1] == ["-m"] and len(rest) > 1:
        ours = rest[1].startswith("fairseq_pe")
        return ("module" if ours else "foreign"), ("" if ours else "python -m ") + rest[1], rest[2:], launcher, False
    if first in ("python", "python3") and rest:
        if rest[0].startswith("-"):
            return "foreign", f"python {rest[0]}", rest[1:], launcher, False
        return "python", os.path.normpath(rest[0]), rest[1:], launcher, False
    if OURS.fullmatch(first):
        return ("tool" if first.startswith("fairseq-pe-") else "fairseq"), first, rest, launcher, False
    if SCRIPT.fullmatch(first):
        return ("python" if first.endswith(".py") else "script"), os.path.normpath(first), rest, launcher, True
    return ("foreign", first, rest, launcher, False) if re.fullmatch(r"[\w.+-]+", first) else None


def extract(path: str, doc: Optional[str] = None) -> List[Command]:
    """Every command of the fenced blocks of one markdown file; ``doc``: its name in messages."""
    doc, text, found = doc or os.path.relpath(path, REPO), _read(path), []
    for block in FENCE.finditer(text):
        lang = block.group(1).lower()
        if lang and lang not in SHELL_FENCES:
            continue
        for line, code in logical_lines(block.group(2), text.count("\n", 0, block.start(2)) + 1):
            if lang == "console" and not code.startswith("$ "):  # its output
                continue
            try:
                commands, comment = read_line(code[2:] if lang == "console" else code, doc, line,
                                              strict=lang in SHELL_FENCES)
            except ValueError as exc:  # an unbalanced quote: check() reports it, in a bare block if ours
                if lang or (classify(code.split()) or ("foreign",))[0] != "foreign":
                    found.append(Command(doc, line, code, "unreadable", [str(exc)]))
                continue
            for cmd in commands:
                cmd.comment_env = re.findall(r"\b([A-Z][A-Z0-9_]*)=", comment) if cmd.kind == "script" else []
            found += commands
            with contextlib.suppress(ValueError):  # prose: an apostrophe
                found += read_line(re.sub(r"^[\w ,.-]+:\s+", "", comment), doc, line, strict=False)[0]
    return found


def inline_commands(path: str, doc: Optional[str] = None) -> List[Command]:
    """The commands of our programs in the prose's `code spans` (one may go on over the lines of its
    paragraph); a file named in the prose (`learned.py`, `floater-table2.sh [base]`) is no command,
    nor a package name (`fairseq-fixed`)."""
    doc, found = doc or os.path.relpath(path, REPO), []
    text = FENCE.sub(lambda m: "\n" * m.group().count("\n"), _read(path))  # line numbers kept
    for m in re.finditer(r"(`+)((?:(?!\n[ \t]*\n).)+?)\1", text, re.S):
        with contextlib.suppress(ValueError):  # not shell: prose in backticks
            for cmd in read_line(" ".join(m.group(2).split()), doc, text.count("\n", 0, m.start()) + 1, False)[0]:
                cmd.inline = cmd.elided = True
                named = cmd.kind in ("script", "python") and (cmd.direct and not (cmd.args or cmd.env)
                                                              or "/" not in cmd.program)
                found += [] if named or cmd.kind == "fairseq" and cmd.program not in FAIRSEQ_PARSERS else [cmd]
    return found


def extract_all() -> List[Command]:
    return [cmd for path in doc_files() for cmd in extract(path) + inline_commands(path)]


def command_ids(commands: List[Command]) -> List[str]:
    """``doc:line:program``, unique (``#2`` for a second command of the same program on a line)."""
    ids = [f"{cmd.where}:{cmd.name}" for cmd in commands]
    return [base if ids[:i].count(base) == 0 else f"{base}#{ids[:i].count(base) + 1}" for i, base in enumerate(ids)]


def variants(args: List[str]) -> List[List[str]]:
    """Every reading of the arguments: ``[A]`` kept, each alternative of ``(A | B)``/``[A | B]``, ``...`` left out."""
    tokens = iter(list(args) + [None])

    def sequence(stops) -> Tuple[List[List[str]], Optional[str]]:  # the readings up to a stop, the stop
        readings = [[]]
        for t in tokens:
            if t in stops:
                return readings, t
            if t in ("(", "["):
                closer, alternatives, stop = ")" if t == "(" else "]", [], "|"
                while stop == "|":
                    more, stop = sequence((closer, "|", None))
                    alternatives += more
                if stop is None:
                    raise ValueError(f"a group without its closing {closer!r}")
                readings = [r + a for r in readings for a in alternatives]
            elif t in (")", "]", "|"):
                raise ValueError(f"unexpected {t!r} in the arguments")
            elif t not in ELLIPSIS:
                readings = [r + [t] for r in readings]

    return sequence((None,))[0]


def unknown_pe_flags(path: str, doc: Optional[str] = None) -> List[str]:
    """Every ``--pe-*``/``--no-pe-*`` flag the file names, in code or prose, that fairseq-train with the
    plugin does not have (for transformer_pe and roberta_pe)."""
    doc = doc or os.path.relpath(path, REPO)
    return [f"{doc}:{number}: {flag}: no such option of fairseq-train --user-dir fairseq_pe"
            for number, text in enumerate(_read(path).split("\n"), 1)
            for flag in re.findall(r"(?<![\w-])--(?:no-)?pe-[a-z0-9-]*[a-z0-9](?![\w*-])", text)
            if flag not in pe_options()]


@lru_cache(maxsize=None)
def pe_options() -> frozenset:
    parsers = [parse_fairseq("fairseq-train", ["D", "--user-dir", PLUGIN, "--task", task, "--arch", arch], True)
               for arch, task in (("transformer_pe_tiny", "translation"), ("roberta_pe_tiny", "masked_lm"))]
    assert all(error is None for _, _, error in parsers), parsers
    return frozenset(n for p, _, _ in parsers for n in p._option_string_actions if n.startswith(("--pe-", "--no-pe-")))


# ---------------------------------------------------------------------------------- the real parsers


@lru_cache(maxsize=None)
def entry_points() -> Dict[str, Tuple[str, str]]:
    """The console scripts of the installed fairseq-pe (setup.py's): name -> (module, function)."""
    return {ep.name: (ep.module, ep.attr) for ep in importlib.metadata.distribution("fairseq-pe").entry_points
            if ep.group == "console_scripts"}


def tool_name(kind: str, program: str) -> str:
    return next((n for n, (m, _) in entry_points().items() if m == program), program) if kind == "module" else program


@contextlib.contextmanager
def _quiet(argv: Optional[List[str]] = None):
    """Output captured (the error text yielded), warnings ignored, ``sys.argv`` and ``sys.path`` restored."""
    saved, err = (sys.argv, list(sys.path)), io.StringIO()
    sys.argv = list(argv or sys.argv)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield err
    finally:
        sys.argv, sys.path[:] = saved


class _Captured(BaseException):  # carries a tool's parser out of its main (past any ``except Exception``)
    pass


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ImportError:  # its package is missing
        return False


def tool_parser(kind: str, program: str) -> Optional[argparse.ArgumentParser]:
    """The parser a fairseq-pe-* tool, ``python -m fairseq_pe...`` module or Python script builds: its
    main runs as far as its first ``parse_args`` (None: it ends without one)."""
    if tool_name(kind, program) in entry_points():
        module, func = entry_points()[tool_name(kind, program)]
        run = getattr(importlib.import_module(module), func)
    elif kind == "module":
        run = lambda: runpy.run_module(program, run_name="__main__", alter_sys=True)  # noqa: E731
    else:
        run = lambda: runpy.run_path(os.path.join(REPO, program), run_name="__main__")  # noqa: E731

    def capture(self, *args, **kwargs):
        raise _Captured(self)

    original, argparse.ArgumentParser.parse_known_args = argparse.ArgumentParser.parse_known_args, capture
    try:
        with _quiet([program]), contextlib.suppress(SystemExit):
            run()
    except _Captured as got:
        return got.args[0]
    finally:
        argparse.ArgumentParser.parse_known_args = original
    return None


def _relax(parser: argparse.ArgumentParser):
    """An elided command may leave out required arguments."""
    for action in parser._actions + parser._mutually_exclusive_groups:
        action.required = False


def _attempt(run) -> Tuple[object, Optional[str]]:
    """(what ``run()`` returns, None), or (None, the error it ends with: a parser's last line of output)."""
    try:
        with _quiet() as err:
            return run(), None
    except SystemExit as exc:  # 0: --help
        lines = [line for line in err.getvalue().splitlines() if line.strip()] or [f"exit status {exc.code}"]
        return None, None if exc.code in (0, None) else lines[-1]
    except Exception as exc:  # noqa: BLE001  (a type function's own error; fairseq's bare one: no --arch)
        bare = type(exc) is RuntimeError and not str(exc)
        return None, "no --arch given (fairseq-train needs one)" if bare else f"{type(exc).__name__}: {exc}"


def parse_fairseq(program: str, args: List[str], lenient: bool):
    """fairseq's own parser of ``program`` on ``args``, in-process, as its console script builds it
    (``--user-dir`` read from the command line first): (parser, namespace or None, error or None)."""
    with _quiet([program] + args):
        importlib.import_module("fairseq_pe")  # registered whatever ran before: see check_fairseq
        from fairseq import options

        factory = getattr(options, FAIRSEQ_PARSERS[program])
        parser = factory(interactive=True) if program == "fairseq-interactive" else factory()
    if lenient:
        _relax(parser)
    if program == "fairseq-preprocess":
        return (parser, None, _attempt(lambda: parser.parse_args(args))[1])
    return (parser, *_attempt(lambda: options.parse_args_and_arch(
        parser, input_args=args, modify_parser=_relax if lenient else None)))


# ---------------------------------------------------------------------------------- checks


def flags_of(args: List[str]) -> List[str]:
    """The option names among the words (``--name=value`` -> ``--name``; a word with spaces is a value)."""
    return [n for n in (a.split("=", 1)[0] for a in args if not any(c.isspace() for c in a)) if FLAG.fullmatch(n)]


def report(prefix: str, parser: argparse.ArgumentParser, args: List[str], error: Optional[str]) -> List[str]:
    """Each flag that is not exactly an option of the parser (argparse would take a prefix), then the
    parser's error (``PROG: error: `` cut) unless it only repeats them."""
    problems = [f"{prefix}: unknown flag {f}" for f in flags_of(args) if f not in parser._option_string_actions]
    if error and not (problems and "unrecognized arguments" in error):
        problems.append(f"{prefix}: {re.sub(r'^[^:]+: error: ', '', error)}")
    return problems


def _option(args: List[str], flag: str) -> Optional[Tuple[int, str]]:
    """(index, value) of ``flag VALUE`` or ``flag=VALUE`` in the words."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return i + 1, args[i + 1]
        if a.startswith(flag + "="):
            return i, a.split("=", 1)[1]
    return None


def check_user_dir(args: List[str], prefix: str) -> Tuple[List[str], List[str]]:
    """``--user-dir`` must name the plugin folder (from the repository root, where the docs' commands
    run): (the words with its absolute path, for fairseq to import; the problems)."""
    if _option(args, "--user-dir") is None:
        return args, []
    i, value = _option(args, "--user-dir")
    wrong = not PLACEHOLDER.fullmatch(value) and os.path.realpath(os.path.join(REPO, value)) != os.path.realpath(PLUGIN)
    return (args[:i] + [PLUGIN if args[i] == value else f"--user-dir={PLUGIN}"] + args[i + 1:],
            [f"{prefix}: --user-dir {value} is not the plugin folder fairseq_pe"] if wrong else [])


def check_fairseq(program: str, args: List[str], elided: bool, prefix: str) -> List[str]:
    """fairseq's parser; a command using an arch, task, criterion, ... of the plugin needs its --user-dir
    (in-process the plugin is registered already, also for a command without it)."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    if program == "fairseq-hydra-train":
        return check_hydra(args, elided, prefix)
    if program not in FAIRSEQ_PARSERS:
        return [f"{prefix}: no parser known for {program} (add it to FAIRSEQ_PARSERS of tests/doc_commands.py)"]
    with_user_dir = _option(args, "--user-dir") is not None
    args, problems = check_user_dir(args, prefix)
    if program == "fairseq-train" and elided and not (_option(args, "--arch") or _option(args, "-a")):
        args = args + ["--arch", "transformer_pe_tiny" if with_user_dir else "transformer"]  # elided
    parser, ns, error = parse_fairseq(program, args, elided)
    registries = {"arch": ARCH_MODEL_REGISTRY, "task": TASK_REGISTRY,
                  **{name: r["registry"] for name, r in REGISTRIES.items()}}
    chosen = {name: getattr(ns, name, None) for name in registries} if ns is not None and not with_user_dir else {}
    return problems + report(prefix, parser, args, error) + [
        f"{prefix}: --{name.replace('_', '-')} {choice} comes from fairseq_pe: the command needs --user-dir fairseq_pe"
        for name, choice in chosen.items() if isinstance(choice, str)
        and getattr(registries[name].get(choice), "__module__", "").split(".")[0] == "fairseq_pe"]


def check_hydra(args: List[str], elided: bool, prefix: str) -> List[str]:
    """``fairseq-hydra-train --config-dir DIR --config-name NAME [+]KEY=VALUE ...``: Hydra's two options (the
    name required), overrides of the form ``[+]section.key=value``, a ``model.pe_*`` key a field of the typed position
    options and its value one of the field's choices, ``common.user_dir`` the plugin folder."""
    from fairseq_pe.models.position_config import PositionEncodingConfig

    fields = {f.name: f for f in dataclasses_fields(PositionEncodingConfig)}
    problems, i, named = [], 0, False
    while i < len(args):
        word = args[i]
        if word in ("--config-dir", "--config-name", "-cd", "-cn"):
            named = named or word in ("--config-name", "-cn")
            i += 2
            continue
        if word.startswith("-"):
            problems.append(f"{prefix}: {word}: fairseq-hydra-train takes --config-dir, --config-name and overrides")
        elif PLACEHOLDER.fullmatch(word) or word in ELLIPSIS:
            pass
        elif not re.fullmatch(r"\+?[\w.]+=.*", word):
            problems.append(f"{prefix}: {word}: not a Hydra override ([+]section.key=value)")
        else:
            key, value = word.lstrip("+").split("=", 1)
            if key.startswith("model.pe_"):
                name = key[len("model."):]
                field = fields.get(name)
                if field is None:
                    problems.append(f"{prefix}: {key}: no such position option")
                else:
                    choices = getattr(_enum_of(field.type), "__members__", None)
                    if choices and value not in [m.value for m in _enum_of(field.type)]:
                        problems.append(f"{prefix}: {key}={value}: not one of its choices")
            if key == "common.user_dir" and not PLACEHOLDER.fullmatch(value) and \
                    os.path.realpath(os.path.join(REPO, value)) != os.path.realpath(PLUGIN):
                problems.append(f"{prefix}: common.user_dir={value} is not the plugin folder fairseq_pe")
        i += 1
    if not named and not elided:
        problems.append(f"{prefix}: fairseq-hydra-train needs --config-name")
    return problems


def _enum_of(annotation):
    """The ``ChoiceEnum`` of a field typed ``Optional[ChoiceEnum]``, else None."""
    import enum

    for candidate in (annotation, *getattr(annotation, "__args__", ())):
        if isinstance(candidate, type) and issubclass(candidate, enum.Enum):
            return candidate
    return None


def check_quickstart_systems(ns: argparse.Namespace, prefix: str) -> List[str]:
    """``--systems``: known names, or NAME=FLAGS whose FLAGS fairseq-train accepts for --arch."""
    from fairseq_pe.errors import UserError
    from fairseq_pe.translation.quickstart import parse_system

    problems = []
    for spec in ns.systems:
        try:
            name, flags = parse_system(spec)
        except UserError as exc:
            problems.append(f"{prefix}: {exc}")
            continue
        if "=" in spec:
            parser, _, error = parse_fairseq("fairseq-train", ["D", "--user-dir", PLUGIN, "--arch", ns.arch, *flags],
                                             lenient=False)
            problems += report(f"{prefix}: --systems {name}=... (fairseq-train)", parser, flags, error)
    return problems


VALUE_CHECKS = {"fairseq-pe-quickstart": check_quickstart_systems}  # tool -> f(namespace, prefix) -> problems


def check_parsed(kind: str, program: str, args: List[str], lenient: bool, prefix: str) -> List[str]:
    """One reading of a command against its tool's parser: the flags, a dry parse, VALUE_CHECKS."""
    parser, name = tool_parser(kind, program), tool_name(kind, program)
    if parser is None:
        return [f"{prefix}: reads its arguments without argparse, so this test cannot check them"]
    if lenient:
        _relax(parser)
    ns, error = _attempt(lambda: parser.parse_args(args))
    # a tool with subcommands (fairseq-pe-counting data|score): the flags are the subcommand's
    sub = next((a for a in parser._actions if isinstance(a, argparse._SubParsersAction)), None)
    problems = report(prefix, sub.choices[args[0]] if sub and args and args[0] in sub.choices else parser, args,
                      error)
    return problems + (VALUE_CHECKS[name](ns, prefix) if ns and not problems and name in VALUE_CHECKS else [])


# ---------------------------------------------------------------------------------- shell scripts


@lru_cache(maxsize=None)
def script_code(script: str) -> str:
    """A repository script with its comments removed and its ``\\`` continuations joined."""
    lines = logical_lines(_read(os.path.join(REPO, script)))
    return "\n".join(re.sub(r"(^|\s)#.*", "", text) for _, text in lines)


def reads_variable(script: str, name: str, seen=()) -> bool:
    """The script, or a repository script it names (runs or sources), reads ``$NAME``."""
    code = script_code(script)
    if re.search(r"\$\{?[!#]?" + re.escape(name) + r"(?!\w)", code):
        return True
    named = [os.path.relpath(path, REPO) for pattern in ("scripts/**/*.sh", "data-prep/*.sh")
             for path in glob.glob(os.path.join(REPO, pattern), recursive=True)
             if re.search(r"(?<![\w.-])" + re.escape(os.path.basename(path)) + r"\b", code)]
    return any(reads_variable(other, name, seen + (script,)) for other in named if other not in (script, *seen))


def dry_run(cmd: Command, args: List[str], where: str) -> List[str]:
    """A script that has DRY_RUN=1 (print the commands only) runs so, with the doc's environment, in an
    empty folder that must stay empty."""
    cwd = tempfile.mkdtemp(prefix="doc-dry-run-")
    try:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", cwd), **cmd.env, "DRY_RUN": "1"}
        proc = subprocess.run(["bash", os.path.join(REPO, cmd.program), *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        lines = [line for line in proc.stderr.splitlines() if line.strip()] or [f"exit status {proc.returncode}"]
        return ([f"{where}: DRY_RUN=1 fails (exit {proc.returncode}): {lines[-1]}"] if proc.returncode else []) + \
            ([f"{where}: DRY_RUN=1 wrote {sorted(os.listdir(cwd))}"] if os.listdir(cwd) else [])
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def check_script(cmd: Command, readings: List[List[str]], prefix: str) -> List[str]:
    """The file (executable when run directly), the environment variables given to it, its flags (in its
    own text, or accepted where its ``"$@"`` goes) and a DRY_RUN=1 run where it has one."""
    path = os.path.join(REPO, cmd.program)
    if not os.path.isfile(path):
        return [f"{prefix}: no such script"]
    text = _read(path)
    problems = [f"{prefix}: not executable, but the doc runs it directly (without bash)"] \
        if cmd.direct and not os.access(path, os.X_OK) else []
    problems += [f"{prefix}: environment variable {name} is not read by {cmd.program} (nor by the scripts it runs or "
                 "sources)" for name in dict.fromkeys([*cmd.env, *cmd.comment_env])
                 if not reads_variable(cmd.program, name)]
    tool, positional = FORWARDS.get(cmd.program, (None, False))
    while tool in FORWARDS:
        tool, positional = FORWARDS[tool][0], positional or FORWARDS[tool][1]
    for args in readings:
        where = prefix + (f" [reading: {' '.join(args)}]" if len(readings) > 1 else "")
        if tool is None:  # the script's own flags: named in its usage or handled in its code
            problems += [f"{where}: unknown flag {f} (not in the script, nor passed on by it: see FORWARDS of "
                         "tests/doc_commands.py)" for f in flags_of(args)
                         if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text)]
        else:
            passed = args[next((i for i, a in enumerate(args) if a.startswith("-")), len(args)) if positional else 0:]
            passed += [w for name, flag in ENV_AS_FLAGS.get(tool, {}).items() if name in cmd.env
                       for w in [flag, *cmd.env[name].split()]]
            problems += check_fairseq(tool, passed, True, f"{where} -> {tool}") if tool in FAIRSEQ_PARSERS else \
                check_parsed("tool", tool, passed, cmd.elided or positional, f"{where} -> {tool}")
        problems += dry_run(cmd, args, where) if "DRY_RUN" in text else []
    return problems


def check(cmd: Command) -> List[str]:
    """Everything wrong with one command of the docs, as ``doc:line: program: what`` lines; for a
    command of the prose (often a fragment: ``fairseq-generate --score-reference``) only what is wrong
    whatever the elided words: a program, script or flag that does not exist."""
    prefix = f"{cmd.where}: {cmd.program}"
    if cmd.kind == "unreadable":
        return [f"{cmd.where}: cannot read the command {cmd.program!r}: {cmd.args[0]}"]
    if cmd.kind == "foreign":
        return [] if cmd.program in FOREIGN else [f"{prefix}: unknown program (not a fairseq-pe tool, fairseq or a "
                                                  "repository script); if it is not ours, add it to FOREIGN in "
                                                  "tests/doc_commands.py"]
    try:
        readings = variants(cmd.args)
    except ValueError as exc:
        return [f"{prefix}: cannot read the arguments: {exc}"]
    problems = []
    if cmd.launcher:
        from torch.distributed.run import get_args_parser

        parser = get_args_parser()
        problems += report(f"{cmd.where}: torchrun", parser, cmd.launcher,
                           _attempt(lambda: parser.parse_args(cmd.launcher + [cmd.program]))[1])
    if cmd.kind == "script":
        problems += check_script(cmd, readings, prefix)
    elif cmd.kind == "tool" and cmd.program not in entry_points():
        problems += [f"{prefix}: no such console script in setup.py"]
    elif cmd.kind == "python" and not os.path.isfile(os.path.join(REPO, cmd.program)):
        problems += [f"{prefix}: no such script"]
    elif cmd.kind == "module" and not _importable(cmd.program):
        problems += [f"{prefix}: no such module"]
    else:
        for args in readings:
            where = prefix + (f" [reading: {' '.join(args)}]" if len(readings) > 1 else "")
            problems += check_fairseq(cmd.program, args, cmd.elided, where) if cmd.kind == "fairseq" else \
                check_user_dir(args, where)[1] + check_parsed(cmd.kind, cmd.program, args, cmd.elided, where)
    return [p for p in problems if INLINE_PROBLEMS.search(p)] if cmd.inline else problems
