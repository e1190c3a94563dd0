"""The shell commands of the documentation (README.md and docs/**/*.md), and their check against the
real parsers: what tests/test_doc_commands.py runs (see its docstring for what is checked).

Extraction: every fenced block marked ``bash``/``sh``/``shell``/``console`` or bare (no language) is read
as shell: ``\\`` continuations are joined, ``#`` comments split off, ``;``/``&&``/``||``/``|`` separate
commands, redirections (``> gen.txt``) are dropped and ``NAME=VALUE`` words before a program are its
environment.  ``$(which PROG)`` becomes PROG, ``$(python -c '...TASK-bin/task.json...')`` the flags
fairseq-pe-prepare-glue writes into that task.json, any other ``$(...)`` is dropped (the command is then
checked leniently, as one with ``...``).  In a comment, ``LABEL: COMMAND`` (or a bare ``COMMAND``) is a
command too when COMMAND runs a program of ours.  Bare blocks may hold output (``fairseq-train: error:
...``): only commands of ours are taken from them; in ``console`` blocks only the ``$ `` lines.

The doc notation in the arguments: ``...`` (more flags elided: the dry run then requires nothing),
``[...]`` (an optional group: kept), ``(A | B)`` and ``[A | B]`` (alternatives: each is tried),
upper-case placeholders such as DIR or CHECKPOINT (kept as values).

In the prose, a `code span` that runs a program of ours is a command too (:func:`inline_commands`),
and every ``--pe-*`` flag named anywhere is collected (:func:`pe_flags`).
"""

import argparse
import contextlib
import glob
import importlib
import io
import itertools
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
from functools import lru_cache
from typing import Callable, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PLUGIN = os.path.join(REPO, "fairseq_pe")

#: fence languages read as shell: every command in them must be checked here or be in FOREIGN
SHELL_FENCES = {"bash", "sh", "shell", "console"}
#: programs of the docs that are not this project's, and are not checked: name (with its first option
#: where that says what it is) -> why
FOREIGN = {
    "pip": "installs packages",
    "python -m pip": "installs packages",
    "rsync": "copies files",
    "hf": "Hugging Face's download tool",
    "python -c": "inline Python",
    "git": "version control",
    "cd": "shell builtin",
}
#: the parser factory of each fairseq console script in fairseq.options
FAIRSEQ_PARSERS = {
    "fairseq-train": "get_training_parser",
    "fairseq-generate": "get_generation_parser",
    "fairseq-interactive": "get_interactive_parser",
    "fairseq-validate": "get_validation_parser",
    "fairseq-eval-lm": "get_eval_lm_parser",
    "fairseq-preprocess": "get_preprocessing_parser",
}
#: launchers that run a program given after their own options
LAUNCHERS = {"torchrun"}
#: environment variables that scripts forwarding to a tool pass on to it as flags
#: (scripts/recipes/s2l-cpu-*.sh: SYSTEMS and SEEDS become fairseq-pe-quickstart's --systems and --seeds)
ENV_AS_FLAGS = {"fairseq-pe-quickstart": {"SYSTEMS": "--systems", "SEEDS": "--seeds"}}

PUNCT = ";&|<>()[]"
OPERATORS = ["&&", "||", ">>", ">&", "&>", ";", "|", "&", "<", ">", "(", ")", "[", "]"]
SEPARATORS = {";", "&&", "||", "&"}
REDIRECTS = {">", ">>", "<", ">&", "&>"}
ELLIPSIS = {"...", "\u2026"}
ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
FLAG = re.compile(r"--?[A-Za-z][\w-]*")
PLACEHOLDER = re.compile(r"[A-Z][A-Z0-9_-]*")


class Op(str):
    """An operator or group mark of a command line (``;``, ``|``, ``(``, ``]``, ``>``), not a word."""


@dataclass
class Command:
    doc: str  # the documentation file, relative to the repository
    line: int  # where the command starts in it
    program: str  # fairseq-train, fairseq-pe-analyze, scripts/quickstart.sh, python -c, ...
    kind: str  # fairseq | tool | module | script | python | foreign
    args: List[str]  # the words after the program, with Op group marks
    env: Dict[str, str] = field(default_factory=dict)  # NAME=VALUE words before the program
    comment_env: List[str] = field(default_factory=list)  # NAME= words in the line's comment (scripts)
    launcher: List[str] = field(default_factory=list)  # torchrun's own options
    elided: bool = False  # has ``...`` or an unknown ``$(...)``: the dry run requires nothing
    direct: bool = False  # a script run as ``scripts/x.sh``, not ``bash scripts/x.sh``
    inline: bool = False  # from a `code span` of the prose: often a fragment, so its flags only are checked

    @property
    def where(self) -> str:
        return f"{self.doc}:{self.line}"

    @property
    def name(self) -> str:
        if self.kind == "unreadable":
            return "unreadable"
        return os.path.basename(self.program) if self.kind in ("script", "python") else self.program


# ----------------------------------------------------------------------------------------------
# extraction


def doc_files() -> List[str]:
    docs = glob.glob(os.path.join(REPO, "docs", "**", "*.md"), recursive=True)
    return [os.path.join(REPO, "README.md")] + sorted(docs)


def split_comment(line: str) -> Tuple[str, str]:
    """``code # comment`` -> (code, comment); a ``#`` inside quotes or a word is no comment."""
    quote, i = None, 0
    while i < len(line):
        c = line[i]
        if quote:
            if c == quote:
                quote = None
            elif c == "\\" and quote == '"':
                i += 1
        elif c in "'\"":
            quote = c
        elif c == "\\":
            i += 1
        elif c == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i], line[i + 1:]
        i += 1
    return line, ""


def _closing_paren(text: str, start: int) -> int:
    """Index of the ``)`` closing the ``(`` at ``start``, quotes respected."""
    depth, quote = 0, None
    for i in range(start, len(text)):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return i
    raise ValueError(f"unbalanced $( in {text!r}")


def _task_json_flags(inner: str) -> Optional[str]:
    """The fairseq-train flags a ``python -c`` reads from ``TASK-bin/task.json``: those that
    fairseq-pe-prepare-glue writes there (at its default --max-positions, 512)."""
    m = re.search(r"([\w.-]+)-bin/task\.json", inner)
    if not m or "fairseq_train_args" not in inner:
        return None
    from fairseq_pe.data_prep.glue import TASKS, recommended_args

    return " ".join(shlex.quote(a) for a in recommended_args(TASKS[m.group(1)], 512))


def substitute(code: str) -> Tuple[str, bool]:
    """Command substitutions: ``$(which PROG)`` -> PROG, a task.json's flags -> those flags, any
    other ``$(...)`` dropped.  Returns the code and whether something unknown was dropped."""
    unknown = False
    while "$(" in code:
        start = code.index("$(")
        end = _closing_paren(code, start + 1)
        inner = code[start + 2:end]
        which = re.fullmatch(r"\s*which\s+(\S+)\s*", inner)
        if which:
            replacement = which.group(1)
        else:
            replacement = _task_json_flags(inner)
            if replacement is None:
                replacement, unknown = "", True
        code = code[:start] + replacement + code[end + 1:]
    return code, unknown


def tokenize(code: str) -> List[str]:
    """Shell words, with operators and group marks as :class:`Op`."""
    lexer = shlex.shlex(code, posix=True, punctuation_chars=PUNCT)
    lexer.whitespace_split = True
    lexer.commenters = ""
    tokens: List[str] = []
    for word in lexer:
        if word and all(c in PUNCT for c in word):  # shlex joins a run of punctuation, e.g. "])"
            while word:
                op = next(o for o in OPERATORS if word.startswith(o))
                tokens.append(Op(op))
                word = word[len(op):]
        else:
            tokens.append(word)
    return tokens


def segments(tokens: List[str]) -> List[List[str]]:
    """Split at ``;``, ``&&``, ``||``, ``&`` and at a pipe outside the doc's groups; redirections dropped."""
    out, current, depth, i = [], [], 0, 0
    while i < len(tokens):
        t = tokens[i]
        if isinstance(t, Op) and t in REDIRECTS:
            if current and current[-1].isdigit():  # 2> FILE
                current.pop()
            i += 2
            continue
        if isinstance(t, Op) and (t in SEPARATORS or (t == "|" and depth == 0)):
            out.append(current)
            current = []
        else:
            if isinstance(t, Op) and t in "([":
                depth += 1
            elif isinstance(t, Op) and t in ")]":
                depth -= 1
            current.append(t)
        i += 1
    out.append(current)
    return [s for s in out if s]


def _script_path(word: str) -> bool:
    return not isinstance(word, Op) and bool(re.fullmatch(r"[\w./-]+\.(sh|py)", word))


def classify(words: List[str]) -> Optional[Tuple[str, str, List[str], List[str], bool]]:
    """(kind, program, args, launcher options, run directly) of a command's words; None: no command
    (e.g. an output line ``fairseq-train: error: ...``)."""
    launcher = []
    if words[0] in LAUNCHERS:
        rest = words[1:]
        k = next((i for i, w in enumerate(rest) if re.fullmatch(r"fairseq-[\w-]+", w) or _script_path(w)), None)
        if k is None:
            return "foreign", words[0], words[1:], [], False
        launcher, words = rest[:k], rest[k:]
    first = words[0]
    if isinstance(first, Op):
        return None
    if first in ("bash", "sh") and len(words) > 1:
        return "script", os.path.normpath(words[1]), words[2:], launcher, False
    if first in ("python", "python3") and len(words) > 1:
        if words[1] == "-m" and len(words) > 2:
            if words[2].startswith("fairseq_pe"):
                return "module", words[2], words[3:], launcher, False
            return "foreign", f"python -m {words[2]}", words[3:], launcher, False
        if words[1].startswith("-"):
            return "foreign", f"python {words[1]}", words[2:], launcher, False
        return "python", os.path.normpath(words[1]), words[2:], launcher, False
    if re.fullmatch(r"fairseq-pe-[\w-]+", first):
        return "tool", first, words[1:], launcher, False
    if re.fullmatch(r"fairseq-[\w-]+", first):
        return "fairseq", first, words[1:], launcher, False
    if _script_path(first):
        kind = "python" if first.endswith(".py") else "script"
        return kind, os.path.normpath(first), words[1:], launcher, True
    if re.fullmatch(r"[\w.+-]+", first):
        return "foreign", first, words[1:], launcher, False
    return None


def commands_of(code: str, doc: str, line: int, strict: bool) -> List[Command]:
    """The commands of one logical line (its comment removed); ``strict``: from a shell fence, where a
    foreign program is kept (to be checked against FOREIGN); otherwise only programs of ours."""
    code, unknown = substitute(code)
    found = []
    for words in segments(tokenize(code)):
        env = {}
        while words and not isinstance(words[0], Op) and ASSIGNMENT.match(words[0]):
            name, value = words[0].split("=", 1)
            env[name] = value
            words = words[1:]
        if not words:
            continue
        what = classify(words)
        if what is None or (what[0] == "foreign" and not strict):
            continue
        kind, program, args, launcher, direct = what
        elided = unknown or any(w in ELLIPSIS for w in args if not isinstance(w, Op))
        found.append(Command(doc, line, program, kind, args, env, launcher=launcher, elided=elided, direct=direct))
    return found


def comment_commands(comment: str, doc: str, line: int) -> List[Command]:
    """A comment ``LABEL: COMMAND`` or ``COMMAND`` that runs a program of ours."""
    m = re.match(r"\s*(?:[\w ,.-]+:\s+)?(.*)", comment)
    try:
        return commands_of(m.group(1), doc, line, strict=False)
    except ValueError:  # prose: an unbalanced quote or parenthesis
        return []


def fenced_lines(path: str):
    """(fence language, [(line number, text)]) of every fenced block."""
    block, lang = None, None
    with open(path, encoding="utf-8") as f:
        for number, text in enumerate(f, 1):
            stripped = text.strip()
            if stripped.startswith("```"):
                if block is None:
                    block, lang = [], stripped[3:].strip().lower()
                else:
                    yield lang, block
                    block = None
            elif block is not None:
                block.append((number, text.rstrip("\n")))


def logical_lines(block):
    """Join ``\\`` continuations: (first line number, text)."""
    start, parts = None, []
    for number, text in block:
        if start is None:
            start = number
        if text.rstrip().endswith("\\"):
            parts.append(text.rstrip()[:-1])
            continue
        parts.append(text)
        yield start, " ".join(p.strip() for p in parts)
        start, parts = None, []
    if parts:
        yield start, " ".join(p.strip() for p in parts)


def extract(path: str, doc: Optional[str] = None) -> List[Command]:
    """Every command of one markdown file; ``doc``: its name in messages (default: relative path)."""
    doc = doc or os.path.relpath(path, REPO)
    found = []
    for lang, block in fenced_lines(path):
        if lang not in SHELL_FENCES and lang != "":
            continue
        for line, text in logical_lines(block):
            if lang == "console":  # "$ COMMAND"; other lines are its output
                if not text.startswith("$ "):
                    continue
                text = text[2:]
            code, comment = split_comment(text)
            try:
                ours = commands_of(code, doc, line, strict=lang in SHELL_FENCES) if code.strip() else []
            except ValueError as exc:  # an unbalanced quote or $(: check() reports it
                ours = [Command(doc, line, code.strip(), "unreadable", [str(exc)])]
            # NAME=VALUE in the comment of a script's command: an environment variable of that script
            for cmd in ours:
                if cmd.kind == "script":
                    cmd.comment_env = re.findall(r"\b([A-Z][A-Z0-9_]*)=", comment)
            found += ours + comment_commands(comment, doc, line)
    return found


def prose_spans(path: str):
    """(line number, text) of every inline code span outside fenced blocks; a span may go on over the
    lines of its paragraph (it is reported at the line where it starts)."""
    with open(path, encoding="utf-8") as f:
        lines = f.read().split("\n")
    fence, paragraph = False, []

    def spans():
        text = "\n".join(t for _, t in paragraph)
        starts = [n for n, t in paragraph for _ in range(len(t) + 1)]  # the line of every character
        for m in re.finditer(r"(`+)(.+?)\1", text, re.S):
            yield starts[m.start()], " ".join(m.group(2).split())

    for number, text in enumerate(lines, 1):
        if text.strip().startswith("```"):
            fence = not fence
            yield from spans()
            paragraph = []
        elif fence:
            continue
        elif text.strip():
            paragraph.append((number, text))
        else:
            yield from spans()
            paragraph = []
    yield from spans()


def inline_commands(path: str, doc: Optional[str] = None) -> List[Command]:
    """The commands of our programs written in the prose as `code spans` (``fairseq-pe-analyze ...
    --length 136``, ``python scripts/benchmark_positions.py --out bench``)."""
    doc = doc or os.path.relpath(path, REPO)
    found = []
    for line, span in prose_spans(path):
        try:
            commands = commands_of(span, doc, line, strict=False)
        except ValueError:  # not shell: prose in backticks
            continue
        for cmd in commands:
            cmd.inline, cmd.elided = True, True
        # not commands: a file named in the prose (`learned.py`, fairseq's `scripts/average_checkpoints.py`),
        # a recipe named in its folder's table, a package name (`fairseq-fixed`)
        found += [cmd for cmd in commands
                  if not (cmd.kind in ("script", "python") and (cmd.direct and not cmd.args and not cmd.env
                                                                 or "/" not in cmd.program))
                  and not (cmd.kind == "fairseq" and cmd.program not in FAIRSEQ_PARSERS)]
    return found


def pe_flags(path: str) -> List[Tuple[int, str]]:
    """(line, flag) of every ``--pe-*`` / ``--no-pe-*`` flag the file names, in code or in prose."""
    with open(path, encoding="utf-8") as f:
        return [(number, flag) for number, text in enumerate(f, 1)
                for flag in re.findall(r"(?<![\w-])--(?:no-)?pe-[a-z0-9-]*[a-z0-9](?![\w*-])", text)]


@lru_cache(maxsize=None)
def pe_options() -> frozenset:
    """Every ``--pe-*`` option of fairseq-train with the plugin, for transformer_pe and roberta_pe."""
    names = set()
    for arch, task in (("transformer_pe_tiny", "translation"), ("roberta_pe_tiny", "masked_lm")):
        parser, _, error = parse_fairseq("fairseq-train", ["DATA", "--user-dir", PLUGIN, "--task", task,
                                                           "--arch", arch], lenient=True)
        assert error is None, error
        names |= {n for n in parser._option_string_actions if n.startswith(("--pe-", "--no-pe-"))}
    return frozenset(names)


def unknown_pe_flags(path: str, doc: Optional[str] = None) -> List[str]:
    doc = doc or os.path.relpath(path, REPO)
    return [f"{doc}:{line}: {flag}: no such option of fairseq-train --user-dir fairseq_pe"
            for line, flag in pe_flags(path) if flag not in pe_options()]


def extract_all() -> List[Command]:
    return [cmd for path in doc_files() for cmd in extract(path) + inline_commands(path)]


def command_ids(commands: List[Command]) -> List[str]:
    """``doc:line:program``, unique (``#2`` for a second command of the same program on a line)."""
    ids, seen = [], {}
    for cmd in commands:
        base = f"{cmd.where}:{cmd.name}"
        seen[base] = seen.get(base, 0) + 1
        ids.append(base if seen[base] == 1 else f"{base}#{seen[base]}")
    return ids


# ----------------------------------------------------------------------------------------------
# the doc notation: alternatives, optional groups, elisions


def variants(args: List[str]) -> List[List[str]]:
    """Every reading of the arguments: ``[A]`` kept, each alternative of ``(A | B)`` / ``[A | B]``
    tried, ``...`` removed."""

    def sequence(i: int, closer: Optional[str]):
        items = []
        while i < len(args):
            t = args[i]
            if isinstance(t, Op) and (t == closer or t == "|"):
                break
            if isinstance(t, Op) and t in ("(", "["):
                alternatives, i = group(i + 1, ")" if t == "(" else "]")
                items.append(alternatives)
                continue
            if isinstance(t, Op):
                raise ValueError(f"unexpected {t!r} in the arguments")
            if t not in ELLIPSIS:
                items.append([[t]])
            i += 1
        return items, i

    def group(i: int, closer: str):
        alternatives = []
        while True:
            items, i = sequence(i, closer)
            alternatives += expand(items)
            if i >= len(args):
                raise ValueError(f"a group without its closing {closer!r}")
            if args[i] == closer:
                return alternatives, i + 1
            i += 1  # "|"

    def expand(items):
        return [[w for part in combo for w in part] for combo in itertools.product(*items)]

    items, i = sequence(0, None)
    if i < len(args):
        raise ValueError(f"unexpected {args[i]!r} in the arguments")
    return expand(items)


def flags_of(args: List[str]) -> List[str]:
    """The option names among the words (``--name=value`` -> ``--name``; negative numbers and
    quoted strings with spaces are values)."""
    names = [a.split("=", 1)[0] for a in args if not any(c.isspace() for c in a)]
    return [n for n in names if FLAG.fullmatch(n)]


def unknown_flags(parser: argparse.ArgumentParser, args: List[str]) -> List[str]:
    """Flags that are not exactly an option of the parser (argparse would accept a prefix)."""
    return [f for f in flags_of(args) if f not in parser._option_string_actions]


# ----------------------------------------------------------------------------------------------
# parsers


@lru_cache(maxsize=None)
def entry_points() -> Dict[str, Tuple[str, str]]:
    """setup.py's fairseq-pe-* console scripts: name -> (module, function)."""
    with open(os.path.join(REPO, "setup.py"), encoding="utf-8") as f:
        text = f.read()
    return {name: (module, func) for name, module, func in
            re.findall(r"\"(fairseq-pe-[\w-]+)\s*=\s*([\w.]+):(\w+)\"", text)}


class _Captured(BaseException):
    """Raised by the first ``parse_known_args`` of a tool: carries its parser (BaseException, so
    that no ``except Exception`` of the tool stops it)."""

    def __init__(self, parser):
        super().__init__()
        self.parser = parser


@contextlib.contextmanager
def _argv(argv: List[str]):
    saved_argv, saved_path = sys.argv, list(sys.path)
    sys.argv = list(argv)
    try:
        yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def capture_parser(run: Callable[[], object], prog: str) -> argparse.ArgumentParser:
    """The parser a program builds: ``run`` (its main) goes as far as its first ``parse_args``."""

    def capture(self, args=None, namespace=None):
        raise _Captured(self)

    original = argparse.ArgumentParser.parse_known_args
    argparse.ArgumentParser.parse_known_args = capture
    try:
        with _argv([prog]), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            run()
    except _Captured as got:
        return got.parser
    finally:
        argparse.ArgumentParser.parse_known_args = original
    raise AssertionError(f"{prog} returned without parsing its arguments")


def tool_parser(kind: str, program: str) -> argparse.ArgumentParser:
    """A fresh parser of a fairseq-pe-* tool, a ``python -m fairseq_pe...`` module or a Python script."""
    if kind == "tool":
        module, func = entry_points()[program]
        return capture_parser(getattr(importlib.import_module(module), func), program)
    if kind == "module":
        tool = next((name for name, (module, _) in entry_points().items() if module == program), None)
        if tool is not None:
            return tool_parser("tool", tool)
        return capture_parser(lambda: runpy.run_module(program, run_name="__main__", alter_sys=True), program)
    path = os.path.join(REPO, program)
    return capture_parser(lambda: runpy.run_path(path, run_name="__main__"), path)


def _last_line(text: str, code) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1] if lines else f"exit status {code}"


@contextlib.contextmanager
def _quiet():
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield err


def _relax(parser: argparse.ArgumentParser):
    """An elided command may leave out required arguments."""
    for action in parser._actions:
        action.required = False
    for group in parser._mutually_exclusive_groups:
        group.required = False


def dry_parse(parser: argparse.ArgumentParser, args: List[str], lenient: bool) -> Optional[str]:
    """The parser's error on ``args`` (its message), None when they parse (``--help`` included)."""
    if lenient:
        _relax(parser)
    try:
        with _quiet() as err:
            parser.parse_args(args)
    except SystemExit as exc:
        return None if exc.code in (0, None) else _last_line(err.getvalue(), exc.code)
    except Exception as exc:  # noqa: BLE001  (a type function's own error)
        return f"{type(exc).__name__}: {exc}"
    return None


def report(prefix: str, unknown: List[str], error: Optional[str]) -> List[str]:
    """Problem lines: each unknown flag, then the parser's error (``PROG: error: `` cut) unless it
    only repeats them."""
    problems = [f"{prefix}: unknown flag {f}" for f in unknown]
    if error and not (unknown and "unrecognized arguments" in error):
        problems.append(f"{prefix}: {re.sub(r'^[^:]+: error: ', '', error)}")
    return problems


def parse_fairseq(program: str, args: List[str], lenient: bool):
    """fairseq's own parser of ``program`` on ``args``, in-process, as its console script builds it
    (``--user-dir`` read from the command line first): (parser, namespace or None, error or None)."""
    with _quiet():
        importlib.import_module("fairseq_pe")  # registered whatever ran before: plugin_components() tells
        from fairseq import options

    with _argv([program] + args), _quiet():
        parser = getattr(options, FAIRSEQ_PARSERS[program])()
    if program == "fairseq-preprocess":
        return parser, None, dry_parse(parser, args, lenient)
    try:
        with _quiet() as err:
            ns = options.parse_args_and_arch(parser, input_args=args, modify_parser=_relax if lenient else None)
    except SystemExit as exc:
        return parser, None, _last_line(err.getvalue(), exc.code)
    except RuntimeError:  # fairseq's bare RuntimeError: no --arch
        return parser, None, "no --arch given (fairseq-train needs one)"
    except Exception as exc:  # noqa: BLE001
        return parser, None, f"{type(exc).__name__}: {exc}"
    return parser, ns, None


# ----------------------------------------------------------------------------------------------
# checks


def _option_value(args: List[str], flag: str) -> Optional[Tuple[int, str]]:
    """(index, value) of ``flag VALUE`` or ``flag=VALUE`` in the words."""
    for i, a in enumerate(args):
        if a == flag and i + 1 < len(args):
            return i + 1, args[i + 1]
        if a.startswith(flag + "="):
            return i, a.split("=", 1)[1]
    return None


def check_user_dir(args: List[str], problems: List[str], prefix: str) -> List[str]:
    """``--user-dir`` must name the plugin folder (relative to the repository root, where the docs'
    commands run); returns the words with its absolute path, for fairseq to import."""
    found = _option_value(args, "--user-dir")
    if found is None:
        return args
    i, value = found
    if not PLACEHOLDER.fullmatch(value) and os.path.realpath(os.path.join(REPO, value)) != os.path.realpath(PLUGIN):
        problems.append(f"{prefix}: --user-dir {value} is not the plugin folder fairseq_pe")
    args = list(args)
    args[i] = PLUGIN if args[i] == value else f"--user-dir={PLUGIN}"
    return args


def check_fairseq(cmd: Command, args: List[str], prefix: str) -> List[str]:
    problems: List[str] = []
    if cmd.program not in FAIRSEQ_PARSERS:
        return [f"{prefix}: no parser known for {cmd.program} (add it to FAIRSEQ_PARSERS of tests/doc_commands.py)"]
    with_user_dir = _option_value(args, "--user-dir") is not None
    args = check_user_dir(args, problems, prefix)
    if cmd.program == "fairseq-train" and cmd.elided and _option_value(args, "--arch") is None \
            and _option_value(args, "-a") is None:
        args = args + ["--arch", "transformer_pe_tiny" if with_user_dir else "transformer"]  # elided
    parser, ns, error = parse_fairseq(cmd.program, args, cmd.elided)
    problems += report(prefix, unknown_flags(parser, args), error)
    if ns is not None and not with_user_dir:
        problems += [f"{prefix}: {what} {name} comes from fairseq_pe: the command needs --user-dir fairseq_pe"
                     for what, name in plugin_components(ns)]
    return problems


def plugin_components(ns: argparse.Namespace) -> List[Tuple[str, str]]:
    """The --arch, --task and other registry choices of the namespace that the plugin registers
    (in-process they are registered already, also for a command without --user-dir)."""
    from fairseq.models import ARCH_MODEL_REGISTRY
    from fairseq.registry import REGISTRIES
    from fairseq.tasks import TASK_REGISTRY

    registries = {"--arch": ARCH_MODEL_REGISTRY, "--task": TASK_REGISTRY}
    registries.update({"--" + name.replace("_", "-"): r["registry"] for name, r in REGISTRIES.items()})
    found = []
    for flag, registry in registries.items():
        choice = getattr(ns, flag[2:].replace("-", "_"), None)
        if isinstance(choice, str) and choice in registry:
            if getattr(registry[choice], "__module__", "").split(".")[0] == "fairseq_pe":
                found.append((flag, choice))
    return found


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
            args = ["DATA", "--user-dir", PLUGIN, "--arch", ns.arch] + flags
            parser, _, error = parse_fairseq("fairseq-train", args, lenient=False)
            problems += report(f"{prefix}: --systems {name}=... (fairseq-train)", unknown_flags(parser, flags), error)
    return problems


#: further checks of a tool's parsed options: tool -> function(namespace, prefix) -> problems
VALUE_CHECKS = {"fairseq-pe-quickstart": check_quickstart_systems}


def check_parsed(kind: str, program: str, args: List[str], lenient: bool, prefix: str) -> List[str]:
    """The flags of one reading of a command against its tool's parser, and a dry parse."""
    parser = tool_parser(kind, program)
    problems = report(prefix, unknown_flags(parser, args), dry_parse(parser, args, lenient))
    name = tool_name(kind, program)
    if not problems and name in VALUE_CHECKS and "--help" not in args and "-h" not in args:
        with _quiet():
            ns = parser.parse_args(args)
        problems += VALUE_CHECKS[name](ns, prefix)
    return problems


def tool_name(kind: str, program: str) -> str:
    if kind == "module":
        return next((n for n, (m, _) in entry_points().items() if m == program), program)
    return program


# shell scripts


def _code_lines(path: str) -> List[Tuple[bool, str]]:
    """(top level, code) of every logical line of a shell script, comments removed; lines inside
    a function body are not top level (their ``$@`` is the function's)."""
    with open(path, encoding="utf-8") as f:
        block = list(enumerate(f.read().splitlines(), 1))
    lines, in_function = [], False
    for _, text in logical_lines(block):
        code = split_comment(text)[0]
        if re.match(r"\s*(function\s+)?[\w:-]+\s*\(\)", code):  # name() { ... (one line: name() { ...; })
            in_function = not code.rstrip().endswith("}")
            lines.append((False, code))
            continue
        if in_function and re.match(r"\}\s*$", code):
            in_function = False
            continue
        lines.append((not in_function, code))
    return lines


def resolve_script(word: str, script: Optional[str] = None) -> Optional[str]:
    """A repository file named by a word of a script (``"$REPO/scripts/x.sh"``, ``"$HERE/install.sh"``),
    relative to the repository root or to the script's folder; relative to the repository."""
    parts = word.split("/")
    plain = [i for i, part in enumerate(parts) if not re.fullmatch(r"[\w.-]+", part)]
    tail = "/".join(parts[plain[-1] + 1 if plain else 0:])
    if not re.fullmatch(r"[\w./-]+\.(sh|py)", tail):
        return None
    for base in [REPO] + ([os.path.dirname(os.path.join(REPO, script))] if script else []):
        path = os.path.normpath(os.path.join(base, tail))
        if os.path.isfile(path) and path.startswith(REPO + os.sep):
            return os.path.relpath(path, REPO)
    return None


@dataclass
class ScriptInfo:
    text: str  # the whole script
    code: str  # without comments
    runs: List[str]  # repository scripts it runs or sources
    targets: List[Tuple[str, str]]  # (kind, program) its top-level "$@" goes to (kind "opaque": not ours)
    consumes: bool  # reads positional arguments itself ($1, shift) before passing on the rest


@lru_cache(maxsize=None)
def script_info(script: str) -> ScriptInfo:
    path = os.path.join(REPO, script)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    lines = _code_lines(path)
    code = "\n".join(c for _, c in lines)
    runs, targets, consumes = [], [], False
    for top, line in lines:
        try:
            words = shlex.split(line)
        except ValueError:
            words = line.split()
        runs += [r for r in (resolve_script(w, script) for w in words) if r and r.endswith(".sh") and r != script]
        if not top:
            continue
        consumes = consumes or bool(re.search(r"\bshift\b|\$\{?1\b", line))
        if "$@" in words or "${@}" in words:
            targets.append(forward_target(words[:words.index("$@" if "$@" in words else "${@}")], script))
    return ScriptInfo(text, code, sorted(set(runs)), targets, consumes)


def forward_target(words: List[str], script: str) -> Tuple[str, str]:
    """What receives a script's ``"$@"``, from the words before it on its line."""
    if "-m" in words and words.index("-m") + 1 < len(words):
        module = words[words.index("-m") + 1]
        return ("module", module) if module.startswith("fairseq_pe") else ("opaque", f"python -m {module}")
    for w in words:
        if re.fullmatch(r"fairseq-pe-[\w-]+", w):
            return "tool", w
        if re.fullmatch(r"fairseq-[\w-]+", w):
            return "fairseq", w
        resolved = resolve_script(w, script)
        if resolved:
            return ("script" if resolved.endswith(".sh") else "python"), resolved
    return "opaque", " ".join(words)


def script_closure(script: str) -> List[str]:
    """The script and every repository script it runs or sources, recursively."""
    seen, todo = [], [script]
    while todo:
        s = todo.pop()
        if s not in seen:
            seen.append(s)
            todo += script_info(s).runs
    return seen


def final_targets(script: str, seen=()) -> List[Tuple[str, str, bool]]:
    """(kind, program, whole command line passed on) where the script's arguments end up,
    following scripts that pass them to other scripts."""
    info = script_info(script)
    found = []
    for kind, program in info.targets:
        if kind == "script" and program not in seen:
            found += [(k, p, whole and not info.consumes)
                      for k, p, whole in final_targets(program, seen + (script,))]
        else:
            found.append((kind, program, not info.consumes))
    return found


def reads_variable(script: str, name: str) -> bool:
    pattern = re.compile(r"\$\{?!?" + re.escape(name) + r"(?![\w])")
    return any(pattern.search(script_info(s).code) for s in script_closure(script))


def check_script(cmd: Command, readings: List[List[str]]) -> List[str]:
    script = cmd.program
    prefix = f"{cmd.where}: {script}"
    path = os.path.join(REPO, script)
    if not os.path.isfile(path):
        return [f"{prefix}: no such script"]
    problems = []
    if cmd.direct and not os.access(path, os.X_OK):
        problems.append(f"{prefix}: not executable, but the doc runs it directly (without bash)")
    for name in list(cmd.env) + [n for n in cmd.comment_env if n not in cmd.env]:
        if not reads_variable(script, name):
            problems.append(f"{prefix}: environment variable {name} is not read by {script} "
                            "(nor by the scripts it runs or sources)")
    targets = final_targets(script)
    checkable = [(k, p, whole) for k, p, whole in targets if k in ("tool", "module", "python", "fairseq")]
    for args in readings:
        where = prefix + (f" [reading: {' '.join(args)}]" if len(readings) > 1 else "")
        if not checkable:  # the script's own flags: named in its usage or handled in its code
            text = script_info(script).text
            problems += [f"{where}: unknown flag {f} (not in the script, which passes its arguments to no "
                         "parser that this test knows)"
                         for f in flags_of(args) if not re.search(r"(?<![\w-])" + re.escape(f) + r"(?![\w-])", text)]
        for kind, program, whole in checkable:
            passed = args if whole else args[next((i for i, a in enumerate(args) if a.startswith("-")), len(args)):]
            passed = passed + env_flags(tool_name(kind, program), cmd.env)
            if kind == "fairseq":
                problems += check_fairseq(Command(cmd.doc, cmd.line, program, kind, passed, elided=True),
                                          passed, f"{where} -> {program}")
            else:
                problems += check_parsed(kind, program, passed, cmd.elided or not whole,
                                         f"{where} -> {tool_name(kind, program)}")
        if "DRY_RUN" in script_info(script).text:
            problems += dry_run_script(cmd, args, where)
    return problems


def env_flags(tool: str, env: Dict[str, str]) -> List[str]:
    flags = []
    for name, flag in ENV_AS_FLAGS.get(tool, {}).items():
        if name in env:
            flags += [flag] + env[name].split()
    return flags


def dry_run_script(cmd: Command, args: List[str], where: str) -> List[str]:
    """A script that has DRY_RUN=1 (print the commands only) runs so, with the doc's environment, in
    an empty folder that must stay empty."""
    cwd = tempfile.mkdtemp(prefix="doc-dry-run-")
    try:
        env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", cwd), **cmd.env, "DRY_RUN": "1"}
        proc = subprocess.run(["bash", os.path.join(REPO, cmd.program), *args], cwd=cwd, env=env,
                              capture_output=True, text=True, timeout=120)
        problems = []
        if proc.returncode != 0:
            problems.append(f"{where}: DRY_RUN=1 fails (exit {proc.returncode}): "
                            f"{_last_line(proc.stderr, proc.returncode)}")
        if os.listdir(cwd):
            problems.append(f"{where}: DRY_RUN=1 wrote {sorted(os.listdir(cwd))}")
        return problems
    finally:
        shutil.rmtree(cwd, ignore_errors=True)


def check_launcher(cmd: Command) -> List[str]:
    if not cmd.launcher:
        return []
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    error = dry_parse(parser, cmd.launcher + [cmd.program], lenient=False)
    return report(f"{cmd.where}: torchrun", unknown_flags(parser, cmd.launcher), error)


def check(cmd: Command) -> List[str]:
    """Everything wrong with one command of the docs, as ``doc:line: program: what`` lines; for a
    command in the prose (often a fragment: ``fairseq-generate --score-reference``), only what is
    wrong whatever the elided words: a program, script or flag that does not exist."""
    problems = _check(cmd)
    if cmd.inline:
        problems = [p for p in problems if re.search(r": unknown flag |: no such |: unknown program|is not the plugin"
                                                     r" folder|: does not exist", p)]
    return problems


def _check(cmd: Command) -> List[str]:
    prefix = f"{cmd.where}: {cmd.program}"
    if cmd.kind == "unreadable":
        return [f"{cmd.where}: cannot read the command {cmd.program!r}: {cmd.args[0]}"]
    if cmd.kind == "foreign":
        return [] if cmd.program in FOREIGN else [
            f"{prefix}: unknown program (not a fairseq-pe tool, fairseq or a repository script); "
            "if it is not ours, add it to FOREIGN in tests/doc_commands.py"]
    try:
        readings = variants(cmd.args)
    except ValueError as exc:
        return [f"{prefix}: cannot read the arguments: {exc}"]
    problems = check_launcher(cmd)
    if cmd.kind == "script":
        return problems + check_script(cmd, readings)
    if cmd.kind == "tool" and cmd.program not in entry_points():
        return problems + [f"{prefix}: no such console script in setup.py"]
    if cmd.kind == "python" and not os.path.isfile(os.path.join(REPO, cmd.program)):
        return problems + [f"{prefix}: no such script"]
    for args in readings:
        where = prefix + (f" [reading: {' '.join(args)}]" if len(readings) > 1 else "")
        if cmd.kind == "fairseq":
            problems += check_fairseq(cmd, args, where)
        else:
            problems += check_user_dir_only(args, where) + check_parsed(cmd.kind, cmd.program, args, cmd.elided, where)
    return problems


def check_user_dir_only(args: List[str], prefix: str) -> List[str]:
    problems: List[str] = []
    check_user_dir(args, problems, prefix)
    return problems
